/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sweep.c - the benchmark sweeps (see sweep.h).
 */
#include "sweep.h"

#include <stddef.h>
#include <string.h>

static const sweep_spec sweep_specs[] = {
    { "paper",
      16384,
      2048,
      { 512, 1024, 2048, 4096, 8192, 16384 },
      6,
      { 64, 128, 256 },
      3,
      FA_BF16,
      "the FlashAttention-2 paper's benchmark" },
    /* Sized for a CPU: 2.0e12 FLOPs with the default 1 + 5 runs per pass, about a minute on 2 cores at
     * 40 GFLOP/s (8 s on two AVX-512 cores at 300-450 GFLOP/s); the rows' work grows with the seqlen. */
    { "cpu", 4096, 512, { 256, 512, 1024, 2048 }, 4, { 64, 128 }, 2, FA_F32, "a CPU-sized sweep" },
};

const sweep_spec *sweep_find(const char *name) {
    for (size_t i = 0; i < sizeof sweep_specs / sizeof sweep_specs[0]; i++)
        if (!strcmp(name, sweep_specs[i].name)) return &sweep_specs[i];
    return NULL;
}

const char *sweep_names(void) {
    return "paper, cpu";
}

void sweep_shape(const sweep_spec *s, int head_dim, int seqlen, int *batch, int *heads) {
    *heads = s->hidden / head_dim > 0 ? s->hidden / head_dim : 1;
    *batch = s->tokens / seqlen > 0 ? s->tokens / seqlen : 1;
}

double sweep_flops(int batch, int heads, int seqlen_q, int seqlen_k, int head_dim, int causal, int backward) {
    const double fwd = 4.0 * batch * seqlen_q * (double)seqlen_k * head_dim * heads / (causal ? 2 : 1);
    return fwd * (backward ? 3.5 : 1.0);
}
