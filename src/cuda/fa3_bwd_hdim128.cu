/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fa3_bwd_hdim128.cu - FA3 backward instantiations for head dim 128: 64 query rows x 128 keys per step, f16 and
 * bf16, with and without softcap.
 */
#include "cuda/fa3_bwd.cuh"

fa_status fa3_bwd_run_hdim128(const fa3_bwd_args *a, const CUtensorMap *maps, int bf16, cudaStream_t stream) {
    const bool softcap = a->b.softcap > 0.0f;
    if (bf16)
        return softcap ? fa3_bwd_launch<128, 64, true, true>(a, &maps[0], &maps[1], &maps[2], &maps[3], stream)
                       : fa3_bwd_launch<128, 64, true, false>(a, &maps[0], &maps[1], &maps[2], &maps[3], stream);
    return softcap ? fa3_bwd_launch<128, 64, false, true>(a, &maps[0], &maps[1], &maps[2], &maps[3], stream)
                   : fa3_bwd_launch<128, 64, false, false>(a, &maps[0], &maps[1], &maps[2], &maps[3], stream);
}
