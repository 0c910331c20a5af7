/* SPDX-License-Identifier: Apache-2.0 */
/*
 * decode_hdim256.cu - the decode attention kernel for head dim 256 (f16 and bf16); see decode.cuh. One file per
 * head dim so that nvcc compiles them in parallel.
 */
#include "decode.cuh"

DECODE_DEFINE_HDIM(256)
