/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fa3_fp8_fwd_hdim128.cu - the e4m3 FA3 forward's instances for head dim 128 (fa3_fp8_fwd.cuh): O in bf16 or f16,
 * each with and without softcap, left window edges and varlen batches.
 */
#include "cuda/fa3_fp8_fwd.cuh"

fa_status fa3_fp8_run_hdim128(const fa3_problem *pr, int out_bf16, cudaStream_t stream) {
    return fa3_fp8_run<128>(pr, out_bf16, stream);
}
