/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fa3_fwd_hdim64.cu - FA3 forward instantiations for head dim 64: 192-row tiles with three consumer warpgroups
 * (overlap + ping-pong) and 128-key blocks, in a kernel for dense batches without softcap and left window edges
 * (it spills less and is faster under a causal mask and on short sequences) and one with them; or 128 x 128
 * tiles with two (overlap only, Q K^T with Q from registers; short problems). A build with FA_TUNING adds the
 * configurations to measure against: 96-key blocks (which do not spill at 160 registers; FLASHATTN_FA3_BLOCK_N)
 * and, for bf16, the 128 x 128 schedules with Q from shared memory (FLASHATTN_FA3_SCHEDULE = overlap) and that
 * with ping-pong (full).
 */
#include "cuda/fa3_fwd.cuh"

fa_status fa3_run_hdim64(const fa3_problem *pr, int bf16, int block_m, int block_n, int schedule, cudaStream_t stream) {
#ifndef FA_TUNING
    (void)schedule;
#endif
    if (block_m == 128) {
        if (block_n != 128) return fa_fail(FA_ERR_INTERNAL, "fa3 forward: head dim 64 has no 128 x %d tile", block_n);
        if (!bf16) return fa3_launch<64, 128, 2, false, true, false, true>(pr, stream);
#ifdef FA_TUNING
        switch (schedule) {
        case FA3_SCHEDULE_OVERLAP: return fa3_launch<64, 128, 2, true, true, false>(pr, stream);
        case FA3_SCHEDULE_FULL: return fa3_launch<64, 128, 2, true, true, true>(pr, stream);
        default: break;
        }
#endif
        return fa3_launch<64, 128, 2, true, true, false, true>(pr, stream);
    }
#ifdef FA_TUNING
    if (block_n == 96)
        return bf16 ? fa3_launch<64, 96, 3, true, true, true>(pr, stream)
                    : fa3_launch<64, 96, 3, false, true, true>(pr, stream);
#endif
    if (block_n != 128) return fa_fail(FA_ERR_INTERNAL, "fa3 forward: head dim 64 has no 192 x %d tile", block_n);
    if (fa3_needs_general(&pr->args))
        return bf16 ? fa3_launch<64, 128, 3, true, true, true>(pr, stream)
                    : fa3_launch<64, 128, 3, false, true, true>(pr, stream);
    return bf16 ? fa3_launch<64, 128, 3, true, true, true, false, false>(pr, stream)
                : fa3_launch<64, 128, 3, false, true, true, false, false>(pr, stream);
}
