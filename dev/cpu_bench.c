/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cpu_bench.c - timing driver for the CPU backend: forward and backward GFLOP/s (the FlashAttention-2
 * paper's FLOP count: 4 * seqlen_q * seqlen_k * head_dim * heads per batch entry, halved when causal; the
 * backward counts 2.5x) on random fp32/f16/bf16 inputs, median of repeats after a warm-up.
 *
 *   cc -O2 -march=native -fopenmp -Iinclude -Isrc dev/cpu_bench.c build/libflashattn.a -lm -o cpu_bench
 *   ./cpu_bench [--threads N] [--batch B] [--heads H] [--heads-kv HK] [--seqlen N] [--head-dim D]
 *               [--dtype f32|f16|bf16] [--causal] [--reps R] [--no-bwd] [--no-workspace] [--math] [--peak]
 *
 * --math measures the SIMD exp2/exp/tanh against libm in double (max ulp) instead of timing.
 * --peak measures one core's multiply-add peak (independent register-only fma chains) in GFLOP/s, the
 * ceiling to compare the single-thread figures with.
 * --no-workspace lets the library allocate its workspace in every call (the default passes one).
 */
#define _POSIX_C_SOURCE 200809L
#include "flashattn.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cpu/cpu_simd.h"
#include "internal.h"

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + 1e-9 * (double)t.tv_nsec;
}

static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static float urand(void) { /* uniform in [-1, 1) */
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (float)((double)(rng_state >> 11) * (2.0 / 9007199254740992.0) - 1.0);
}

static void *random_tensor(fa_dtype t, size_t n) {
    void *p = malloc(n * fa_dtype_size(t));
    if (!p) {
        fprintf(stderr, "out of memory\n");
        exit(1);
    }
    for (size_t i = 0; i < n; i++) fa_store(p, t, (int64_t)i, urand());
    return p;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Median seconds of `reps` calls (after one warm-up); the fastest through *best. */
static double time_call(const fa_params *p, const fa_exec *x, int backward, int reps, double *best) {
    double t[64];
    if (reps > 64) reps = 64;
    for (int r = -1; r < reps; r++) {
        double t0 = now();
        fa_status st = backward ? fa_bwd(p, x) : fa_fwd(p, x);
        if (st != FA_OK) {
            fprintf(stderr, "%s failed: %s: %s\n", backward ? "fa_bwd" : "fa_fwd", fa_status_name(st), fa_last_error());
            exit(1);
        }
        if (r >= 0) t[r] = now() - t0;
    }
    qsort(t, (size_t)reps, sizeof t[0], cmp_double);
    *best = t[0];
    return t[reps / 2];
}

static double ulp_error(float got, double want) {
    float w = (float)want;
    double u = (double)nextafterf(fabsf(w), INFINITY) - (double)fabsf(w);
    return fabs((double)got - want) / u;
}

static int math_check(void) {
    double e2 = 0, e = 0, et = 0;
    for (double x = -126.0; x < 127.0; x += 0.000731) {
        float y = fa_vexp2(fa_vset1((float)x))[0];
        e2 = fmax(e2, ulp_error(y, exp2((double)(float)x)));
    }
    for (double x = -87.3; x < 88.3; x += 0.000511) {
        float y = fa_vexp(fa_vset1((float)x))[0];
        e = fmax(e, ulp_error(y, exp((double)(float)x)));
    }
    for (double x = -12.0; x < 12.0; x += 0.0000731) {
        if ((float)x == 0.0f) continue;
        float y = fa_vtanh(fa_vset1((float)x))[0];
        et = fmax(et, ulp_error(y, tanh((double)(float)x)));
    }
    printf("max error vs libm in double: exp2 %.2f ulp on [-126, 127), exp %.2f ulp on [-87.3, 88.3), "
           "tanh %.2f ulp on [-12, 12]\n",
           e2, e, et);
    return 0;
}

static int peak_check(void) {
    enum { CHAINS = 24 };
    fa_vf acc[CHAINS], x = fa_vset1(0.999999f), y = fa_vset1(1e-7f);
    for (int i = 0; i < CHAINS; i++) acc[i] = fa_vset1((float)i);
    const long iters = 20000000;
    double t = now();
    for (long k = 0; k < iters; k++) {
        FA_UNROLL(24)
        for (int i = 0; i < CHAINS; i++) acc[i] = fa_vfma(acc[i], x, y);
    }
    t = now() - t;
    float sum = 0.0f;
    for (int i = 0; i < CHAINS; i++) sum += acc[i][0];
    printf("one core's fma peak: %.1f GFLOP/s (%d-float vectors; checksum %g)\n",
           2.0 * FA_VL * CHAINS * (double)iters / t * 1e-9, FA_VL, (double)sum);
    return 0;
}

int main(int argc, char **argv) {
    int threads = 0, batch = 1, heads = 8, heads_kv = 0, seqlen = 2048, dim = 128, causal = 0, reps = 5;
    int bwd = 1, own_ws = 1;
    fa_dtype dtype = FA_F32;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        const char *next = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--threads") && next)
            threads = atoi(argv[++i]);
        else if (!strcmp(a, "--batch") && next)
            batch = atoi(argv[++i]);
        else if (!strcmp(a, "--heads") && next)
            heads = atoi(argv[++i]);
        else if (!strcmp(a, "--heads-kv") && next)
            heads_kv = atoi(argv[++i]);
        else if (!strcmp(a, "--seqlen") && next)
            seqlen = atoi(argv[++i]);
        else if (!strcmp(a, "--head-dim") && next)
            dim = atoi(argv[++i]);
        else if (!strcmp(a, "--reps") && next)
            reps = atoi(argv[++i]);
        else if (!strcmp(a, "--causal"))
            causal = 1;
        else if (!strcmp(a, "--no-bwd"))
            bwd = 0;
        else if (!strcmp(a, "--no-workspace"))
            own_ws = 0;
        else if (!strcmp(a, "--math"))
            return math_check();
        else if (!strcmp(a, "--peak"))
            return peak_check();
        else if (!strcmp(a, "--dtype") && next) {
            const char *t = argv[++i];
            dtype = !strcmp(t, "f16") ? FA_F16 : !strcmp(t, "bf16") ? FA_BF16 : FA_F32;
        } else {
            fprintf(stderr, "usage: see the top of dev/cpu_bench.c\n");
            return 2;
        }
    }
    if (heads_kv <= 0) heads_kv = heads;
    if (reps < 1) reps = 1;

    fa_params p;
    fa_params_init(&p, dtype, batch, seqlen, seqlen, heads, heads_kv, dim);
    p.causal = causal;
    size_t nq = (size_t)batch * seqlen * heads * dim, nk = (size_t)batch * seqlen * heads_kv * dim;
    p.q = fa_tensor_contiguous(random_tensor(dtype, nq), seqlen, heads, dim);
    p.k = fa_tensor_contiguous(random_tensor(dtype, nk), seqlen, heads_kv, dim);
    p.v = fa_tensor_contiguous(random_tensor(dtype, nk), seqlen, heads_kv, dim);
    p.o = fa_tensor_contiguous(random_tensor(dtype, nq), seqlen, heads, dim);
    p.dout = fa_tensor_contiguous(random_tensor(dtype, nq), seqlen, heads, dim);
    p.dq = fa_tensor_contiguous(random_tensor(dtype, nq), seqlen, heads, dim);
    p.dk = fa_tensor_contiguous(random_tensor(dtype, nk), seqlen, heads_kv, dim);
    p.dv = fa_tensor_contiguous(random_tensor(dtype, nk), seqlen, heads_kv, dim);
    p.lse = malloc(sizeof(float) * batch * heads * seqlen);

    fa_exec x;
    memset(&x, 0, sizeof x);
    x.backend = FA_BACKEND_CPU;
    x.num_threads = threads;
    size_t ws = 0, ws_b = 0;
    if (fa_workspace_size(&p, &x, 0, &ws) != FA_OK || fa_workspace_size(&p, &x, 1, &ws_b) != FA_OK) {
        fprintf(stderr, "fa_workspace_size: %s\n", fa_last_error());
        return 1;
    }
    if (ws_b > ws) ws = ws_b;
    if (own_ws) {
        x.workspace = malloc(ws);
        x.workspace_bytes = ws;
        if (!x.workspace) return 1;
        memset(x.workspace, 0, ws);
    }

    const double flops = fa_flops_fwd(&p, NULL, NULL);
    double tf_best = 0.0, tb_best = 0.0;
    const double tf = time_call(&p, &x, 0, reps, &tf_best);
    const double tb = bwd ? time_call(&p, &x, 1, reps, &tb_best) : 0.0;
    printf(
        "cpu %s b=%d h=%d/%d s=%d d=%d causal=%d threads=%d workspace=%.1fMB%s | fwd %.2f ms %.1f GFLOP/s (best %.1f)",
        dtype == FA_F32   ? "f32"
        : dtype == FA_F16 ? "f16"
                          : "bf16",
        batch, heads, heads_kv, seqlen, dim, causal, threads, (double)ws / 1e6, own_ws ? "" : "(per call)", tf * 1e3,
        flops / tf * 1e-9, flops / tf_best * 1e-9);
    if (bwd)
        printf(" | bwd %.2f ms %.1f GFLOP/s (best %.1f)", tb * 1e3, 2.5 * flops / tb * 1e-9,
               2.5 * flops / tb_best * 1e-9);
    printf("\n");
    return 0;
}
