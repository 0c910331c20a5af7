/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fa3_bwd_hdim256.cu - FA3 backward instantiations for head dim 256: 64 queries x 64 keys per step, the split-key
 * kernel (fa3_bwd_wide_kernel), f16 and bf16; plain, softcap or ALiBi scores.
 */
#include "cuda/fa3_bwd.cuh"

fa_status fa3_bwd_run_hdim256(const fa3_bwd_args *a, const CUtensorMap *maps, int bf16, cudaStream_t stream) {
    return fa3_bwd_dispatch<256, 64, true>(a, maps, bf16, stream);
}
