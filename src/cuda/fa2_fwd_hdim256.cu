/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fa2_fwd_hdim256.cu - the FlashAttention-2 forward kernel for head dim 256 (f16 and bf16); tile sizes in the
 * table of fa2_fwd.cuh. One file per head dim so that nvcc compiles them in parallel.
 */
#include "fa2_fwd.cuh"

FA2_FWD_DEFINE_HDIM(256)
