/* SPDX-License-Identifier: Apache-2.0 */
/*
 * dev/bwd_check.c - bring-up driver for the FA2 CUDA backward kernels, called directly (past the library's
 * validation and dispatch): it computes O and LSE with the fp64 reference on the host, runs fa2_bwd_run on the
 * GPU and compares dQ, dK, dV with the fp64 reference backward; and it times the backward on the paper's sweep.
 * FLASHATTN_SMEM_LIMIT=<bytes> makes it run the tiles of GPUs with less shared memory (see fa2_bwd.cu).
 *
 *   bwd_check check [NAME]           the correctness cases (those whose name contains NAME); status 1 on failure
 *   bwd_check bench [det] [D...]     TFLOP/s of the paper sweep (bf16, 16k tokens, hidden 2048), seqlen >= 2k
 *   bwd_check one D CAUSAL SEQLEN [det]   a single run of one sweep point (for ncu)
 *
 * Build (from the repository root, after `make lib`), linking the static library for the kernels, the fp64
 * reference and the error reporting:
 *   cc -O2 -std=c11 -Iinclude -Isrc -I$CUDA/include dev/bwd_check.c build/libflashattn.a -fopenmp \
 *      -L$CUDA/lib64 -lcudart -lcublas -lstdc++ -lm -o bwd_check
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/kernels.h"

#define CHECK(x)                                                                                \
    do {                                                                                        \
        cudaError_t e_ = (x);                                                                   \
        if (e_ != cudaSuccess) {                                                                \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
            exit(2);                                                                            \
        }                                                                                       \
    } while (0)

static fa_cuda_device g_dev;

static void device_init(void) {
    struct cudaDeviceProp prop;
    CHECK(cudaGetDeviceProperties(&prop, 0));
    g_dev.ordinal = 0;
    g_dev.cc_major = prop.major;
    g_dev.cc_minor = prop.minor;
    g_dev.sm_count = prop.multiProcessorCount;
    g_dev.smem_optin = prop.sharedMemPerBlockOptin;
    printf("device: %s, cc %d.%d, %d SMs, %zu B smem opt-in\n", prop.name, prop.major, prop.minor,
           prop.multiProcessorCount, (size_t)prop.sharedMemPerBlockOptin);
    const char *limit = getenv("FLASHATTN_SMEM_LIMIT");
    if (limit) printf("FLASHATTN_SMEM_LIMIT=%s: tiles chosen as if the device allowed that much\n", limit);
}

/* ---- random data ---- */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;

static double urand(void) { /* uniform in [-1, 1) */
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) * (2.0 / 9007199254740992.0) - 1.0;
}

static double round16(fa_dtype t, double x) {
    return t == FA_BF16 ? fa_bf16_to_f32(fa_f32_to_bf16((float)x)) : fa_f16_to_f32(fa_f32_to_f16((float)x));
}
static uint16_t to16(fa_dtype t, double x) {
    return t == FA_BF16 ? fa_f32_to_bf16((float)x) : fa_f32_to_f16((float)x);
}
static double from16(fa_dtype t, uint16_t u) {
    return t == FA_BF16 ? fa_bf16_to_f32(u) : fa_f16_to_f32(u);
}

/* ---- one correctness case ---- */

typedef struct bwd_case {
    const char *name;
    fa_dtype dtype;
    int batch, sq, sk, hq, hkv, d;
    int causal, wl, wr;
    float softcap;
    int alibi;         /* 0 none, 1 (heads), 2 (batch, heads) */
    const int *lens_q; /* varlen: per-sequence lengths (batch of them), else NULL */
    const int *lens_k;
    int qkv_packed; /* q, k, v as views of one (tokens, 3, heads, d) buffer (hq == hkv) */
    int deterministic;
} bwd_case;

static double max_abs(const double *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fabs(x[i]) > m ? fabs(x[i]) : m;
    return m;
}

/* Returns 1 when the case passes. */
static int run_case(const bwd_case *c) {
    const int varlen = c->lens_q != NULL;
    int32_t cu_q[65] = { 0 }, cu_k[65] = { 0 };
    int sq = c->sq, sk = c->sk;
    if (varlen) {
        sq = sk = 0;
        for (int b = 0; b < c->batch; b++) {
            cu_q[b + 1] = cu_q[b] + c->lens_q[b];
            cu_k[b + 1] = cu_k[b] + c->lens_k[b];
            sq = c->lens_q[b] > sq ? c->lens_q[b] : sq;
            sk = c->lens_k[b] > sk ? c->lens_k[b] : sk;
        }
    }
    const int64_t tq = varlen ? cu_q[c->batch] + 3 : (int64_t)c->batch * sq; /* 3 spare rows past the last */
    const int64_t tk = varlen ? cu_k[c->batch] + 2 : (int64_t)c->batch * sk;
    const int d = c->d, hq = c->hq, hkv = c->hkv;
    const size_t nq = (size_t)tq * hq * d, nk = (size_t)tk * hkv * d;

    fa_params p;
    fa_params_init(&p, c->dtype, c->batch, sq, sk, hq, hkv, d);
    p.softmax_scale = 1.0f / sqrtf((float)d);
    p.causal = c->causal;
    p.window_left = c->wl;
    p.window_right = c->causal ? 0 : c->wr;
    p.softcap = c->softcap;
    p.deterministic = c->deterministic;
    p.total_q = tq;
    p.total_k = tk;
    float slopes[64 * 64];
    if (c->alibi) {
        for (int i = 0; i < c->batch * hq; i++) slopes[i] = 0.05f + 0.5f * (float)((i * 7) % 11) / 11.0f;
        p.alibi_slopes = slopes;
        p.alibi_batch_stride = c->alibi == 2 ? hq : 0;
    }
    if (varlen) p.cu_seqlens_q = cu_q, p.cu_seqlens_k = cu_k;

    /* packed fp64 copies of the 16-bit inputs for the reference */
    double *q = malloc(nq * 8), *o = malloc(nq * 8), *dout = malloc(nq * 8), *dq = malloc(nq * 8);
    double *k = malloc(nk * 8), *v = malloc(nk * 8), *dk = malloc(nk * 8), *dv = malloc(nk * 8);
    const size_t nlse = varlen ? (size_t)hq * tq : (size_t)c->batch * hq * sq;
    double *lse = malloc(nlse * 8);
    for (size_t i = 0; i < nq; i++) q[i] = round16(c->dtype, 1.7 * urand()), dout[i] = round16(c->dtype, urand());
    for (size_t i = 0; i < nk; i++) k[i] = round16(c->dtype, 1.7 * urand()), v[i] = round16(c->dtype, urand());
    for (size_t i = 0; i < nlse; i++) lse[i] = -INFINITY;
    fa_reference_fwd_f64(&p, q, k, v, o, lse);
    for (size_t i = 0; i < nq; i++) o[i] = round16(c->dtype, o[i]);
    fa_reference_bwd_f64(&p, q, k, v, dout, dq, dk, dv);

    /* device buffers: q/o/dout/dq are (tq, hq, d); k/v/dk/dv (tk, hkv, d); packed qkv uses one buffer */
    uint16_t *hbuf = malloc((nq > nk ? nq : nk) * 2 * 3);
    float *lsef = malloc(nlse * 4);
    for (size_t i = 0; i < nlse; i++) lsef[i] = (float)lse[i];
    void *d_q, *d_k, *d_v, *d_o, *d_do, *d_dq, *d_dk, *d_dv, *d_qkv = NULL;
    float *d_lse, *d_slopes = NULL;
    int32_t *d_cuq = NULL, *d_cuk = NULL;
    if (c->qkv_packed) {
        CHECK(cudaMalloc(&d_qkv, nq * 2 * 3));
        for (int64_t t = 0; t < tq; t++)
            for (int part = 0; part < 3; part++)
                for (int h = 0; h < hq; h++)
                    for (int x = 0; x < d; x++) {
                        const double *src = part == 0 ? q : part == 1 ? k : v;
                        hbuf[((t * 3 + part) * hq + h) * d + x] = to16(c->dtype, src[(t * hq + h) * d + x]);
                    }
        CHECK(cudaMemcpy(d_qkv, hbuf, nq * 2 * 3, cudaMemcpyHostToDevice));
        d_q = d_qkv, d_k = (uint16_t *)d_qkv + hq * d, d_v = (uint16_t *)d_qkv + 2 * hq * d;
    } else {
        CHECK(cudaMalloc(&d_q, nq * 2));
        CHECK(cudaMalloc(&d_k, nk * 2));
        CHECK(cudaMalloc(&d_v, nk * 2));
        for (size_t i = 0; i < nq; i++) hbuf[i] = to16(c->dtype, q[i]);
        CHECK(cudaMemcpy(d_q, hbuf, nq * 2, cudaMemcpyHostToDevice));
        for (size_t i = 0; i < nk; i++) hbuf[i] = to16(c->dtype, k[i]);
        CHECK(cudaMemcpy(d_k, hbuf, nk * 2, cudaMemcpyHostToDevice));
        for (size_t i = 0; i < nk; i++) hbuf[i] = to16(c->dtype, v[i]);
        CHECK(cudaMemcpy(d_v, hbuf, nk * 2, cudaMemcpyHostToDevice));
    }
    CHECK(cudaMalloc(&d_o, nq * 2));
    CHECK(cudaMalloc(&d_do, nq * 2));
    CHECK(cudaMalloc(&d_dq, nq * 2));
    CHECK(cudaMalloc(&d_dk, nk * 2));
    CHECK(cudaMalloc(&d_dv, nk * 2));
    CHECK(cudaMalloc((void **)&d_lse, nlse * 4));
    for (size_t i = 0; i < nq; i++) hbuf[i] = to16(c->dtype, o[i]);
    CHECK(cudaMemcpy(d_o, hbuf, nq * 2, cudaMemcpyHostToDevice));
    for (size_t i = 0; i < nq; i++) hbuf[i] = to16(c->dtype, dout[i]);
    CHECK(cudaMemcpy(d_do, hbuf, nq * 2, cudaMemcpyHostToDevice));
    CHECK(cudaMemcpy(d_lse, lsef, nlse * 4, cudaMemcpyHostToDevice));
    if (varlen) {
        CHECK(cudaMalloc((void **)&d_cuq, sizeof(cu_q)));
        CHECK(cudaMalloc((void **)&d_cuk, sizeof(cu_k)));
        CHECK(cudaMemcpy(d_cuq, cu_q, sizeof(cu_q), cudaMemcpyHostToDevice));
        CHECK(cudaMemcpy(d_cuk, cu_k, sizeof(cu_k), cudaMemcpyHostToDevice));
    }
    if (c->alibi) {
        CHECK(cudaMalloc((void **)&d_slopes, sizeof(slopes)));
        CHECK(cudaMemcpy(d_slopes, slopes, sizeof(slopes), cudaMemcpyHostToDevice));
    }

    fa_params g = p;
    const int64_t qs = c->qkv_packed ? 3 * hq * d : hq * d;
    g.q = (fa_tensor){ d_q, (int64_t)sq * qs, qs, d };
    g.k = (fa_tensor){ d_k, (int64_t)sk * (c->qkv_packed ? qs : hkv * d), c->qkv_packed ? qs : hkv * d, d };
    g.v = (fa_tensor){ d_v, g.k.stride_batch, g.k.stride_seq, d };
    g.o = (fa_tensor){ d_o, (int64_t)sq * hq * d, hq * d, d };
    g.dout = (fa_tensor){ d_do, (int64_t)sq * hq * d, hq * d, d };
    g.dq = (fa_tensor){ d_dq, (int64_t)sq * hq * d, hq * d, d };
    g.dk = (fa_tensor){ d_dk, (int64_t)sk * hkv * d, hkv * d, d };
    g.dv = (fa_tensor){ d_dv, (int64_t)sk * hkv * d, hkv * d, d };
    g.lse = d_lse;
    if (varlen) g.cu_seqlens_q = d_cuq, g.cu_seqlens_k = d_cuk;
    if (c->alibi) g.alibi_slopes = d_slopes;

    int ok = 1;
    fa_status st = fa2_bwd_supported(&g, &g_dev);
    if (st != FA_OK) {
        printf("%-34s unsupported: %s\n", c->name, fa_last_error());
        return 0;
    }
    void *ws = NULL;
    const size_t wsb = fa2_bwd_workspace_size(&g, &g_dev);
    CHECK(cudaMalloc(&ws, wsb > 0 ? wsb : 1));
    uint16_t *res[2][3];
    const size_t nres[3] = { nq, nk, nk };
    void *dres[3] = { d_dq, d_dk, d_dv };
    const int runs = c->deterministic ? 2 : 1;
    for (int run = 0; run < runs; run++) {
        for (int i = 0; i < 3; i++) CHECK(cudaMemset(dres[i], 0xff, nres[i] * 2)); /* NaN poison */
        st = fa2_bwd_run(&g, &g_dev, ws, 0);
        if (st != FA_OK) {
            printf("%-34s run failed: %s\n", c->name, fa_last_error());
            return 0;
        }
        CHECK(cudaDeviceSynchronize());
        for (int i = 0; i < 3; i++) {
            res[run][i] = malloc(nres[i] * 2);
            CHECK(cudaMemcpy(res[run][i], dres[i], nres[i] * 2, cudaMemcpyDeviceToHost));
        }
    }

    /* compare: rows past the sequences (varlen spare rows) must stay poisoned; all others match */
    const double eps = c->dtype == FA_BF16 ? 1.0 / 256 : 1.0 / 2048;
    const char *names[3] = { "dQ", "dK", "dV" };
    const double *refs[3] = { dq, dk, dv };
    char line[256];
    int n = snprintf(line, sizeof(line), "%-34s", c->name);
    for (int i = 0; i < 3; i++) {
        const int heads = i == 0 ? hq : hkv;
        const int64_t valid_tokens = varlen ? (i == 0 ? cu_q[c->batch] : cu_k[c->batch]) : (i == 0 ? tq : tk);
        double err = 0, mref = max_abs(refs[i], (size_t)valid_tokens * heads * d);
        int64_t bad_poison = 0, nan_count = 0;
        for (size_t e = 0; e < nres[i]; e++) {
            const int64_t tok = (int64_t)(e / ((size_t)heads * d));
            if (tok >= valid_tokens) {
                bad_poison += res[0][i][e] != 0xffff;
                continue;
            }
            const double x = from16(c->dtype, res[0][i][e]);
            if (x != x) {
                nan_count++;
                continue;
            }
            const double diff = fabs(x - refs[i][e]);
            err = diff > err ? diff : err;
        }
        const double tol = 8 * eps * mref + 1e-6;
        const int pass = err <= tol && nan_count == 0 && bad_poison == 0;
        ok &= pass;
        n += snprintf(line + n, sizeof(line) - (size_t)n, " %s %.1e/%.1e%s", names[i], err, tol,
                      pass ? ""
                           : (nan_count    ? "(NaN!)"
                              : bad_poison ? "(touched!)"
                                           : "!"));
        if (c->deterministic && memcmp(res[0][i], res[1][i], nres[i] * 2) != 0) {
            ok = 0;
            n += snprintf(line + n, sizeof(line) - (size_t)n, " (not bit-identical!)");
        }
    }
    printf("%s  %s\n", line, ok ? "ok" : "FAIL");

    for (int run = 0; run < runs; run++)
        for (int i = 0; i < 3; i++) free(res[run][i]);
    cudaFree(ws);
    if (c->qkv_packed)
        cudaFree(d_qkv);
    else
        cudaFree(d_q), cudaFree(d_k), cudaFree(d_v);
    cudaFree(d_o), cudaFree(d_do), cudaFree(d_dq), cudaFree(d_dk), cudaFree(d_dv), cudaFree(d_lse);
    cudaFree(d_cuq), cudaFree(d_cuk), cudaFree(d_slopes);
    free(q), free(o), free(dout), free(dq), free(k), free(v), free(dk), free(dv), free(lse), free(hbuf), free(lsef);
    return ok;
}

static int check_all(const char *filter) {
    static const int lq1[] = { 0, 1, 130, 77, 64 }, lk1[] = { 5, 0, 130, 200, 64 };
    static const int lq2[] = { 300, 17, 0 }, lk2[] = { 100, 17, 33 };
    const bwd_case cases[] = {
        { "d32 bf16", FA_BF16, 2, 200, 200, 4, 4, 32, 0, -1, -1, 0, 0, NULL, NULL, 0, 0 },
        { "d64 bf16", FA_BF16, 2, 200, 200, 4, 4, 64, 0, -1, -1, 0, 0, NULL, NULL, 0, 0 },
        { "d96 bf16", FA_BF16, 2, 200, 200, 4, 4, 96, 0, -1, -1, 0, 0, NULL, NULL, 0, 0 },
        { "d128 bf16", FA_BF16, 2, 200, 200, 4, 4, 128, 0, -1, -1, 0, 0, NULL, NULL, 0, 0 },
        { "d192 bf16", FA_BF16, 2, 200, 200, 4, 4, 192, 0, -1, -1, 0, 0, NULL, NULL, 0, 0 },
        { "d256 bf16", FA_BF16, 2, 200, 200, 4, 4, 256, 0, -1, -1, 0, 0, NULL, NULL, 0, 0 },
        { "d32 f16 causal", FA_F16, 2, 257, 257, 2, 2, 32, 1, -1, -1, 0, 0, NULL, NULL, 0, 0 },
        { "d64 f16 causal", FA_F16, 2, 257, 257, 2, 2, 64, 1, -1, -1, 0, 0, NULL, NULL, 0, 0 },
        { "d96 f16 causal", FA_F16, 1, 257, 257, 2, 2, 96, 1, -1, -1, 0, 0, NULL, NULL, 0, 0 },
        { "d128 f16 causal", FA_F16, 2, 257, 257, 2, 2, 128, 1, -1, -1, 0, 0, NULL, NULL, 0, 0 },
        { "d192 f16 causal", FA_F16, 1, 257, 257, 2, 2, 192, 1, -1, -1, 0, 0, NULL, NULL, 0, 0 },
        { "d256 f16 causal", FA_F16, 2, 257, 257, 2, 2, 256, 1, -1, -1, 0, 0, NULL, NULL, 0, 0 },
        { "d128 causal q<k", FA_BF16, 2, 100, 300, 2, 2, 128, 1, -1, -1, 0, 0, NULL, NULL, 0, 0 },
        { "d128 causal q>k (empty rows)", FA_BF16, 2, 300, 100, 2, 2, 128, 1, -1, -1, 0, 0, NULL, NULL, 0, 0 },
        { "d256 causal q>k", FA_BF16, 1, 300, 100, 2, 2, 256, 1, -1, -1, 0, 0, NULL, NULL, 0, 0 },
        { "d64 gqa 8/2 causal", FA_BF16, 2, 190, 190, 8, 2, 64, 1, -1, -1, 0, 0, NULL, NULL, 0, 0 },
        { "d128 mqa 6/1", FA_F16, 1, 150, 230, 6, 1, 128, 0, -1, -1, 0, 0, NULL, NULL, 0, 0 },
        { "d64 window 50/20", FA_BF16, 2, 300, 300, 2, 2, 64, 0, 50, 20, 0, 0, NULL, NULL, 0, 0 },
        { "d128 window 0/70 q<k", FA_BF16, 1, 200, 333, 2, 2, 128, 0, 0, 70, 0, 0, NULL, NULL, 0, 0 },
        { "d256 window 40/-1", FA_BF16, 1, 200, 200, 2, 2, 256, 0, 40, -1, 0, 0, NULL, NULL, 0, 0 },
        { "d128 softcap 2", FA_BF16, 2, 200, 200, 2, 2, 128, 0, -1, -1, 2.0f, 0, NULL, NULL, 0, 0 },
        { "d64 softcap 1 causal f16", FA_F16, 2, 200, 200, 2, 2, 64, 1, -1, -1, 1.0f, 0, NULL, NULL, 0, 0 },
        { "d192 softcap 2", FA_BF16, 1, 150, 150, 2, 2, 192, 0, -1, -1, 2.0f, 0, NULL, NULL, 0, 0 },
        { "d192 gqa 4/2 window 64/0", FA_BF16, 2, 260, 260, 4, 2, 192, 0, 64, 0, 0, 0, NULL, NULL, 0, 0 },
        { "d64 alibi (h)", FA_BF16, 2, 200, 200, 4, 4, 64, 0, -1, -1, 0, 1, NULL, NULL, 0, 0 },
        { "d128 alibi (b,h) causal", FA_F16, 2, 200, 260, 4, 2, 128, 1, -1, -1, 0, 2, NULL, NULL, 0, 0 },
        { "d256 alibi softcap", FA_BF16, 1, 130, 130, 2, 2, 256, 0, -1, -1, 3.0f, 1, NULL, NULL, 0, 0 },
        { "d64 varlen", FA_BF16, 5, 0, 0, 4, 2, 64, 0, -1, -1, 0, 0, lq1, lk1, 0, 0 },
        { "d128 varlen causal", FA_BF16, 5, 0, 0, 4, 4, 128, 1, -1, -1, 0, 0, lq1, lk1, 0, 0 },
        { "d256 varlen causal", FA_F16, 3, 0, 0, 2, 1, 256, 1, -1, -1, 0, 0, lq2, lk2, 0, 0 },
        { "d96 varlen window", FA_BF16, 3, 0, 0, 2, 2, 96, 0, 30, 5, 0, 0, lq2, lk2, 0, 0 },
        { "d128 packed qkv", FA_BF16, 2, 150, 150, 4, 4, 128, 1, -1, -1, 0, 0, NULL, NULL, 1, 0 },
        { "d64 deterministic", FA_BF16, 2, 700, 700, 4, 2, 64, 0, -1, -1, 0, 0, NULL, NULL, 0, 1 },
        { "d96 gqa 6/2 deterministic causal", FA_F16, 2, 333, 333, 6, 2, 96, 1, -1, -1, 0, 0, NULL, NULL, 0, 1 },
        { "d128 deterministic causal", FA_BF16, 2, 600, 600, 4, 4, 128, 1, -1, -1, 0, 0, NULL, NULL, 0, 1 },
        { "d256 deterministic varlen", FA_BF16, 5, 0, 0, 2, 2, 256, 1, -1, -1, 0, 0, lq1, lk1, 0, 1 },
    };
    int fails = 0, ran = 0;
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        if (filter && !strstr(cases[i].name, filter)) continue;
        fails += !run_case(&cases[i]);
        ran++;
    }
    printf("check: %d of %d cases failed\n", fails, ran);
    return fails != 0;
}

/* ---- timing ---- */

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return x < y ? -1 : x > y;
}

static void bench(int deterministic, const int *dims, int ndims, int only_causal, int only_seqlen, int reps) {
    const int seqlens[] = { 2048, 4096, 8192, 16384 };
    void *flush;
    CHECK(cudaMalloc(&flush, 256 << 20));
    printf("%-6s %-6s %-7s %10s %10s\n", "hdim", "causal", "seqlen", "ms", "TFLOP/s");
    for (int di = 0; di < ndims; di++)
        for (int causal = 0; causal < 2; causal++)
            for (int si = 0; si < 4; si++) {
                if ((only_causal >= 0 && causal != only_causal) || (only_seqlen > 0 && seqlens[si] != only_seqlen))
                    continue;
                const int d = dims[di], s = seqlens[si], batch = 16384 / s, heads = 2048 / d;
                const size_t n = (size_t)batch * s * heads * d;
                fa_params p;
                fa_params_init(&p, FA_BF16, batch, s, s, heads, heads, d);
                p.softmax_scale = 1.0f / sqrtf((float)d);
                p.causal = causal, p.window_right = causal ? 0 : -1;
                p.deterministic = deterministic;
                void *buf[8];
                for (int i = 0; i < 8; i++) CHECK(cudaMalloc(&buf[i], n * 2));
                uint16_t *h = malloc(n * 2);
                for (size_t i = 0; i < n; i++) h[i] = fa_f32_to_bf16((float)urand());
                for (int i = 0; i < 5; i++) CHECK(cudaMemcpy(buf[i], h, n * 2, cudaMemcpyHostToDevice));
                free(h);
                float *lse;
                const size_t nl = (size_t)batch * heads * s;
                CHECK(cudaMalloc((void **)&lse, nl * 4));
                float *hl = malloc(nl * 4);
                for (size_t i = 0; i < nl; i++) hl[i] = logf((float)s);
                CHECK(cudaMemcpy(lse, hl, nl * 4, cudaMemcpyHostToDevice));
                free(hl);
                fa_tensor *ts[8] = { &p.q, &p.k, &p.v, &p.o, &p.dout, &p.dq, &p.dk, &p.dv };
                for (int i = 0; i < 8; i++) *ts[i] = fa_tensor_contiguous(buf[i], s, heads, d);
                p.lse = lse;
                void *ws;
                CHECK(cudaMalloc(&ws, fa2_bwd_workspace_size(&p, &g_dev)));
                cudaEvent_t e0, e1;
                CHECK(cudaEventCreate(&e0));
                CHECK(cudaEventCreate(&e1));
                float ms[12];
                for (int r = reps < 12 ? 12 - reps : -2; r < 12; r++) {
                    CHECK(cudaMemsetAsync(flush, r & 0xff, 256 << 20, 0));
                    CHECK(cudaEventRecord(e0, 0));
                    if (fa2_bwd_run(&p, &g_dev, ws, 0) != FA_OK) {
                        printf("run failed: %s\n", fa_last_error());
                        exit(1);
                    }
                    CHECK(cudaEventRecord(e1, 0));
                    CHECK(cudaEventSynchronize(e1));
                    if (r >= 0) CHECK(cudaEventElapsedTime(&ms[r], e0, e1));
                }
                if (reps < 12) continue;
                qsort(ms, 12, sizeof(float), cmp_float);
                const double med = 0.5 * (ms[5] + ms[6]);
                const double flops = 2.5 * 4.0 * s * (double)s * d * heads * batch / (causal ? 2 : 1);
                printf("%-6d %-6s %-7d %10.3f %10.1f\n", d, causal ? "yes" : "no", s, med, flops / med * 1e-9);
                fflush(stdout);
                for (int i = 0; i < 8; i++) cudaFree(buf[i]);
                cudaFree(lse), cudaFree(ws);
                cudaEventDestroy(e0), cudaEventDestroy(e1);
            }
    cudaFree(flush);
}

int main(int argc, char **argv) {
    setvbuf(stdout, NULL, _IOLBF, 0);
    device_init();
    if (argc >= 2 && strcmp(argv[1], "check") == 0) return check_all(argc >= 3 ? argv[2] : NULL);
    if (argc >= 5 && strcmp(argv[1], "one") == 0) { /* one untimed run, for profilers: one D causal seqlen */
        const int d = atoi(argv[2]);
        bench(argc >= 6 && strcmp(argv[5], "det") == 0, &d, 1, atoi(argv[3]), atoi(argv[4]), 1);
        return 0;
    }
    if (argc >= 2 && strcmp(argv[1], "bench") == 0) {
        int dims[8], nd = 0;
        int det = 0;
        for (int i = 2; i < argc && nd < 8; i++) {
            if (strcmp(argv[i], "det") == 0)
                det = 1;
            else
                dims[nd++] = atoi(argv[i]);
        }
        if (nd == 0) dims[0] = 64, dims[1] = 128, dims[2] = 256, nd = 3;
        bench(det, dims, nd, -1, 0, 12);
        return 0;
    }
    fprintf(stderr, "usage: %s check [NAME] | bench [det] [D...] | one D CAUSAL SEQLEN [det]\n", argv[0]);
    return 2;
}
