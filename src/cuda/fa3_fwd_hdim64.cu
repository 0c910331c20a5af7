/*
 * fa3_fwd_hdim64.cu - FA3 forward instantiations for head dim 64, 128-key blocks: 192-row tiles with three
 * consumer warpgroups (overlap + ping-pong), or 128-row tiles with two (overlap only; short causal problems).
 */
#include "cuda/fa3_fwd.cuh"

fa_status fa3_run_hdim64(const fa3_problem *pr, int bf16, int block_m, int schedule, cudaStream_t stream) {
    (void)schedule;
    if (block_m == 128)
        return bf16 ? fa3_launch<64, 128, 2, 2, true, true, false>(pr, stream)
                    : fa3_launch<64, 128, 2, 2, false, true, false>(pr, stream);
    return bf16 ? fa3_launch<64, 128, 3, 2, true, true, true>(pr, stream)
                : fa3_launch<64, 128, 3, 2, false, true, true>(pr, stream);
}
