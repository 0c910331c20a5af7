/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fa3_fwd_hdim128.cu - FA3 forward instantiations for head dim 128: 128 x 128 tiles, two consumer warpgroups,
 * intra-warpgroup overlap + ping-pong, Q K^T with Q from registers. A build with FA_TUNING adds, for bf16, the
 * schedules that measure what each design step buys: Q from shared memory (full), and from there overlap only,
 * ping-pong only, neither (FLASHATTN_FA3_SCHEDULE).
 */
#include "cuda/fa3_fwd.cuh"

fa_status fa3_run_hdim128(const fa3_problem *pr, int bf16, int block_n, int schedule, cudaStream_t stream) {
    if (block_n != 128) return fa_fail(FA_ERR_INTERNAL, "fa3 forward: head dim 128 has no %d-key block", block_n);
    if (!bf16) return fa3_launch<128, 128, 2, false, true, true, true>(pr, stream);
#ifdef FA_TUNING
    switch (schedule) {
    case FA3_SCHEDULE_FULL: return fa3_launch<128, 128, 2, true, true, true>(pr, stream);
    case FA3_SCHEDULE_OVERLAP: return fa3_launch<128, 128, 2, true, true, false>(pr, stream);
    case FA3_SCHEDULE_PINGPONG: return fa3_launch<128, 128, 2, true, false, true>(pr, stream);
    case FA3_SCHEDULE_PLAIN: return fa3_launch<128, 128, 2, true, false, false>(pr, stream);
    default: break;
    }
#else
    (void)schedule;
#endif
    return fa3_launch<128, 128, 2, true, true, true, true>(pr, stream);
}
