/* SPDX-License-Identifier: Apache-2.0 */
/*
 * attention.c - a standalone program using the installed library: causal attention with grouped-query heads
 * (8 query heads sharing 2 key/value heads) on the CPU backend, checked against a direct evaluation of
 * softmax(Q K^T / sqrt(d)) V in double precision. Prints one line and exits 0 when they agree.
 *
 *   cc -o attention attention.c $(pkg-config --cflags --libs flashattn) -Wl,-rpath,$(pkg-config --variable=libdir
 * flashattn)
 */
#include <flashattn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

enum { B = 1, S = 64, HQ = 8, HKV = 2, D = 32 };

/* Element (b, s, h, d) of a contiguous (batch, seqlen, heads, head_dim) array with `heads` heads. */
static size_t at(int b, int s, int h, int heads, int d) {
    return (((size_t)b * S + s) * heads + h) * D + d;
}

/* out[b, i, h] = sum_j softmax_j(q_i . k_j / sqrt(D), j <= i) v_j, in double: the definition, no tiling. */
static double naive_max_error(const float *q, const float *k, const float *v, const float *o) {
    double worst = 0.0, p[S];
    for (int b = 0; b < B; b++)
        for (int h = 0; h < HQ; h++) {
            const int hk = h / (HQ / HKV); /* the key/value head this query head reads */
            for (int i = 0; i < S; i++) {
                double max = -INFINITY, sum = 0.0;
                for (int j = 0; j <= i; j++) { /* causal: keys up to the query's own position */
                    double dot = 0.0;
                    for (int d = 0; d < D; d++) dot += (double)q[at(b, i, h, HQ, d)] * k[at(b, j, hk, HKV, d)];
                    p[j] = dot / sqrt((double)D);
                    if (p[j] > max) max = p[j];
                }
                for (int j = 0; j <= i; j++) sum += p[j] = exp(p[j] - max);
                for (int d = 0; d < D; d++) {
                    double acc = 0.0;
                    for (int j = 0; j <= i; j++) acc += p[j] / sum * v[at(b, j, hk, HKV, d)];
                    worst = fmax(worst, fabs(acc - o[at(b, i, h, HQ, d)]));
                }
            }
        }
    return worst;
}

int main(void) {
    const size_t nq = (size_t)B * S * HQ * D, nkv = (size_t)B * S * HKV * D;
    float *q = malloc(nq * sizeof *q), *o = malloc(nq * sizeof *o);
    float *k = malloc(nkv * sizeof *k), *v = malloc(nkv * sizeof *v);
    if (!q || !o || !k || !v) return 1;
    srand(1);
    for (size_t i = 0; i < nq; i++) q[i] = (float)rand() / RAND_MAX - 0.5f;
    for (size_t i = 0; i < nkv; i++) k[i] = (float)rand() / RAND_MAX - 0.5f, v[i] = (float)rand() / RAND_MAX - 0.5f;

    fa_params p;
    fa_params_init(&p, FA_F32, B, S, S, HQ, HKV, D); /* softmax scale 1/sqrt(D) by default */
    p.causal = 1;
    p.q = fa_tensor_contiguous(q, S, HQ, D);
    p.k = fa_tensor_contiguous(k, S, HKV, D);
    p.v = fa_tensor_contiguous(v, S, HKV, D);
    p.o = fa_tensor_contiguous(o, S, HQ, D);
    fa_exec exec = { .backend = FA_BACKEND_CPU }; /* lse stays NULL: the forward then does not write it */
    fa_status st = fa_fwd(&p, &exec);
    if (st != FA_OK) {
        fprintf(stderr, "fa_fwd: %s: %s\n", fa_strerror(st), fa_last_error());
        return 1;
    }

    /* fp32 inputs and accumulation: agreement to ~1e-6 is expected, 1e-4 leaves room for any summation order */
    const double err = naive_max_error(q, k, v, o);
    const int ok = err < 1e-4;
    const int version = fa_version_number();
    printf("flashattn %d.%d.%d: causal GQA attention (%d query heads, %d kv heads, seqlen %d, head_dim %d) on the "
           "CPU: max |error| vs the naive formula %.1e: %s\n",
           version / 10000, version / 100 % 100, version % 100, HQ, HKV, S, D, err, ok ? "ok" : "MISMATCH");
    free(q), free(k), free(v), free(o);
    return ok ? 0 : 1;
}
