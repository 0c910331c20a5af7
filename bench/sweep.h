/* SPDX-License-Identifier: Apache-2.0 */
/*
 * sweep.h - the benchmark sweeps of flashattn bench --sweep: the FlashAttention-2 paper's (16k tokens, hidden
 * 2048, seqlen 512..16k, head_dim 64/128/256) and a CPU-sized one, the shape of each row and the paper's FLOP
 * count. The CLI runs them (cli/bench.c).
 */
#ifndef FLASHATTN_BENCH_SWEEP_H
#define FLASHATTN_BENCH_SWEEP_H

#include "flashattn.h"

/* A sweep: every (head_dim, causal, seqlen) with batch = tokens / seqlen and heads = hidden / head_dim, as in
 * the FlashAttention-2 paper's benchmark (section 4.1), so that every row does the same number of token rows. */
typedef struct sweep_spec {
    const char *name;
    int tokens, hidden;
    int seqlens[6], nseq;
    int dims[3], ndims;
    fa_dtype dtype; /* unless --dtype */
    const char *about;
} sweep_spec;

/* The sweep of that name, or NULL; the names, for messages ("paper, cpu"). */
const sweep_spec *sweep_find(const char *name);
const char *sweep_names(void);

/* A row's batch and heads (at least 1 each) for its head dim and sequence length. */
void sweep_shape(const sweep_spec *s, int head_dim, int seqlen, int *batch, int *heads);

/* FLOPs of one run by the paper's formula: 4 * batch * seqlen_q * seqlen_k * head_dim * heads, halved under a
 * causal mask, times 3.5 with the backward (the forward plus 2.5 for the backward). */
double sweep_flops(int batch, int heads, int seqlen_q, int seqlen_k, int head_dim, int causal, int backward);

#endif /* FLASHATTN_BENCH_SWEEP_H */
