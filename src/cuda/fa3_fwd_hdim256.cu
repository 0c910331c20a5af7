/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fa3_fwd_hdim256.cu - FA3 forward instantiations for head dim 256: 128 x 80 tiles, two consumer warpgroups,
 * overlap + ping-pong (two stages of K and V plus Q fill 224 KB of shared memory; O is staged in the Q tiles).
 * Dense batches without softcap and left window edges run a kernel without them, which spills less and is
 * faster, most at short sequences and under a causal mask.
 */
#include "cuda/fa3_fwd.cuh"

fa_status fa3_run_hdim256(const fa3_problem *pr, int bf16, int block_n, int schedule, cudaStream_t stream) {
    (void)schedule;
    if (block_n != 80) return fa_fail(FA_ERR_INTERNAL, "fa3 forward: head dim 256 has no %d-key block", block_n);
    if (fa3_needs_general(&pr->args))
        return bf16 ? fa3_launch<256, 80, 2, true, true, true>(pr, stream)
                    : fa3_launch<256, 80, 2, false, true, true>(pr, stream);
    return bf16 ? fa3_launch<256, 80, 2, true, true, true, false, false>(pr, stream)
                : fa3_launch<256, 80, 2, false, true, true, false, false>(pr, stream);
}
