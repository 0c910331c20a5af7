/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fa3_bwd_hdim128.cu - FA3 backward instantiations for head dim 128: 64 query rows x 128 keys per step, f16 and
 * bf16; plain, softcap or ALiBi scores.
 */
#include "cuda/fa3_bwd.cuh"

fa_status fa3_bwd_run_hdim128(const fa3_bwd_args *a, const CUtensorMap *maps, int bf16, cudaStream_t stream) {
    return fa3_bwd_dispatch<128, 64, false>(a, maps, bf16, stream);
}
