/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fa3_fp8_fwd_hdim64.cu - the e4m3 FA3 forward's instances for head dim 64 (fa3_fp8_fwd.cuh): O in bf16 or f16,
 * each with and without softcap, left window edges and varlen batches.
 */
#include "cuda/fa3_fp8_fwd.cuh"

fa_status fa3_fp8_run_hdim64(const fa3_problem *pr, int out_bf16, cudaStream_t stream) {
    return fa3_fp8_run<64>(pr, out_bf16, stream);
}
