/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fa3_bwd_hdim256.cu - FA3 backward instantiations for head dim 256: 64 queries x 64 keys per step, the split-key
 * kernel (fa3_bwd_wide_kernel), f16 and bf16, with and without softcap.
 */
#include "cuda/fa3_bwd.cuh"

fa_status fa3_bwd_run_hdim256(const fa3_bwd_args *a, const CUtensorMap *maps, int bf16, cudaStream_t stream) {
    const bool softcap = a->b.softcap > 0.0f;
    if (bf16)
        return softcap ? fa3_bwd_wide_launch<256, true, true>(a, &maps[0], &maps[1], &maps[2], &maps[3], stream)
                       : fa3_bwd_wide_launch<256, true, false>(a, &maps[0], &maps[1], &maps[2], &maps[3], stream);
    return softcap ? fa3_bwd_wide_launch<256, false, true>(a, &maps[0], &maps[1], &maps[2], &maps[3], stream)
                   : fa3_bwd_wide_launch<256, false, false>(a, &maps[0], &maps[1], &maps[2], &maps[3], stream);
}
