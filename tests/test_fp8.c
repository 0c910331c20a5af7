/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_fp8.c - the FP8 helpers: fa_quantize_e4m3 (descales, rounding, strides, varlen, refusals) and
 * fa_hadamard_rotate (the documented signs and transform, scores unchanged), then both in front of an e4m3
 * forward on the CPU backend: on inputs with outlier features the rotation lowers the error against the fp32
 * attention of the original inputs, as incoherent processing is meant to.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check/verify.h"
#include "harness.h"
#include "internal.h"

static float *random_rows(int64_t n, uint64_t seed, double outliers) {
    float *x = malloc(sizeof(float) * (size_t)n);
    if (!x) abort();
    vf_rng r;
    vf_rng_seed(&r, seed);
    for (int64_t i = 0; i < n; i++) {
        double v = vf_rng_normal(&r);
        if (outliers > 0 && vf_rng_uniform(&r) < outliers) v += 10.0 * vf_rng_normal(&r);
        x[i] = (float)v;
    }
    return x;
}

/* fa_rows of a contiguous (batch, seqlen, heads, head_dim) fp32 array */
static fa_rows rows_of(float *x, int b, int s, int h, int d) {
    fa_rows t;
    memset(&t, 0, sizeof t);
    t.x = fa_tensor_contiguous(x, s, h, d);
    t.dtype = FA_F32;
    t.batch = b, t.seqlen = s, t.heads = h, t.head_dim = d;
    return t;
}

static void quantize(void) {
    if (!th_selected("quantize")) return;
    /* bf16 source with padded strides (row stride 40 for head_dim 32, 2 heads), blocks of 5 rows */
    enum { B = 2, S = 13, H = 2, D = 32, LD = 40 };
    const int64_t n = (int64_t)B * S * H * LD;
    float *f = random_rows(n, 7, 0.0);
    uint16_t *x = malloc(sizeof(uint16_t) * (size_t)n);
    uint8_t *q = malloc((size_t)n);
    float descale[B * H * 3];
    for (int64_t i = 0; i < n; i++) x[i] = fa_f32_to_bf16(f[i] * (1.0f + (float)(i % 97)));
    memset(q, 0xee, (size_t)n);
    fa_rows src;
    memset(&src, 0, sizeof src);
    src.x.data = x, src.x.stride_head = LD, src.x.stride_seq = (int64_t)H * LD,
    src.x.stride_batch = (int64_t)S * H * LD;
    src.dtype = FA_BF16, src.batch = B, src.seqlen = S, src.heads = H, src.head_dim = D;
    fa_tensor dst = src.x;
    dst.data = q;
    fa_status st = fa_quantize_e4m3(&src, 5, dst, descale);
    int bad_scale = 0, bad_value = 0, touched_pad = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int k = 0; k < 3; k++) {
                float amax = 0;
                for (int r = 5 * k; r < 5 * k + 5 && r < S; r++)
                    for (int c = 0; c < D; c++)
                        amax = fmaxf(amax, fabsf(fa_bf16_to_f32(x[((b * S + r) * H + h) * LD + c])));
                const float ds = descale[(b * H + h) * 3 + k];
                bad_scale += ds != amax / 448.0f;
                for (int r = 5 * k; r < 5 * k + 5 && r < S; r++)
                    for (int c = 0; c < LD; c++) {
                        const int64_t i = ((b * S + r) * H + h) * LD + c;
                        if (c >= D) {
                            touched_pad += q[i] != 0xee;
                            continue;
                        }
                        const double v = fa_bf16_to_f32(x[i]), got = fa_e4m3_to_f32(q[i]) * (double)ds;
                        /* e4m3: 3 mantissa bits (half a unit: 2^-4 relative), subnormals in steps of 2^-9 */
                        bad_value += fabs(got - v) > fmax(0x1p-4 * fabs(v), 0x1p-10 * ds) * (1 + 1e-6);
                    }
            }
    th_check(st == FA_OK && !bad_scale && !bad_value && !touched_pad,
             "quantize: bf16, strided, blocks of 5 rows: descale = block max / 448 (%d wrong), values within half an "
             "e4m3 unit (%d wrong), padding untouched (%d written) (%s)",
             bad_scale, bad_value, touched_pad, fa_last_error());

    /* varlen: sequences of 0, 4 and 9 rows, seqlen 9, one descale per sequence and head */
    int32_t cu[4] = { 0, 0, 4, 13 };
    src.cu_seqlens = cu, src.batch = 3, src.seqlen = 9;
    float ds2[3 * H];
    for (int i = 0; i < 3 * H; i++) ds2[i] = -1;
    memset(q, 0xee, (size_t)n);
    st = fa_quantize_e4m3(&src, 0, dst, ds2);
    int ok = st == FA_OK && ds2[0] == 1.0f && ds2[1] == 1.0f && ds2[2] > 0 && ds2[5] > 0;
    ok &= q[(int64_t)13 * H * LD] == 0xee; /* past the last sequence: not written */
    th_check(ok, "quantize: varlen with an empty sequence (its descales 1), nothing past the last row (%s)",
             fa_last_error());

    /* refusals: nothing written */
    struct {
        const char *what, *field;
        int mutation;
    } bad[] = { { "NaN", "row 3", 0 },
                { "block -1", "block", 1 },
                { "src dtype e4m3", "src.dtype", 2 },
                { "head_dim 12", "head_dim", 3 },
                { "descale NULL", "descale", 4 },
                { "in place", "in place", 5 },
                { "cu_seqlens beyond seqlen", "cu_seqlens[3]", 6 } };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        fa_rows s2 = src;
        fa_tensor d2 = dst;
        int32_t cu2[4] = { 0, 0, 4, 13 };
        s2.cu_seqlens = cu2;
        int32_t blk = 0;
        float *dsp = ds2;
        uint16_t *nan_slot = &x[(int64_t)(4 + 3) * H * LD], saved = *nan_slot; /* row 3 of the third sequence */
        switch (bad[i].mutation) {
        case 0: *nan_slot = 0x7fc0; break;
        case 1: blk = -1; break;
        case 2: s2.dtype = FA_E4M3; break;
        case 3: s2.head_dim = 12; break;
        case 4: dsp = NULL; break;
        case 5: d2.data = x; break;
        case 6: cu2[3] = 14; break;
        }
        memset(q, 0xee, (size_t)n);
        for (int j = 0; j < 3 * H; j++) ds2[j] = -1;
        st = fa_quantize_e4m3(&s2, blk, d2, dsp);
        int untouched = 1;
        for (int64_t j = 0; j < n; j++) untouched &= q[j] == 0xee;
        for (int j = 0; j < 3 * H; j++) untouched &= ds2[j] == -1;
        th_check(st == FA_ERR_INVALID_ARGUMENT && strstr(fa_last_error(), bad[i].field) && untouched,
                 "quantize refuses %s: \"%s\"%s", bad[i].what, fa_last_error(), untouched ? "" : " - WRITTEN");
        *nan_slot = saved;
    }
    free(f), free(x), free(q);
}

static uint64_t splitmix(uint64_t x) {
    uint64_t z = x + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

static void rotate(void) {
    if (!th_selected("rotate")) return;
    /* the documented transform on unit rows: e_j -> sign_j H[j, :] / sqrt(n), H[j][c] = (-1)^popcount(j & c) */
    enum { D = 64 };
    float *e = calloc(D * D, sizeof(float));
    for (int j = 0; j < D; j++) e[j * D + j] = 1.0f;
    fa_rows t = rows_of(e, 1, D, 1, D);
    fa_status st = fa_hadamard_rotate(&t, 42);
    int wrong = 0;
    for (int j = 0; j < D; j++) {
        const float sign = splitmix(42 + (uint64_t)j) >> 63 ? -1.0f : 1.0f;
        for (int c = 0; c < D; c++) {
            const float want = sign * (__builtin_popcount(j & c) & 1 ? -1.0f : 1.0f) / 8.0f;
            wrong += fabsf(e[j * D + c] - want) > 1e-7f;
        }
    }
    th_check(st == FA_OK && !wrong, "rotate: unit rows of head_dim 64 become sign_j H[j] / 8 (%d wrong)", wrong);
    free(e);

    /* q.k unchanged (fp32, 1e-5 relative) with one seed for both, at head dims 128 (one chunk) and 96 (three
     * chunks of 32) */
    const int dims[2] = { 128, 96 };
    for (int i = 0; i < 2; i++) {
        const int d = dims[i], s = 16, h = 3;
        float *q = random_rows((int64_t)s * h * d, 1, 0.01), *k = random_rows((int64_t)s * h * d, 2, 0.01);
        float *q0 = malloc(sizeof(float) * (size_t)(s * h * d)), *k0 = malloc(sizeof(float) * (size_t)(s * h * d));
        memcpy(q0, q, sizeof(float) * (size_t)(s * h * d));
        memcpy(k0, k, sizeof(float) * (size_t)(s * h * d));
        fa_rows tq = rows_of(q, 1, s, h, d), tk = rows_of(k, 1, s, h, d);
        st = fa_hadamard_rotate(&tq, 9);
        if (st == FA_OK) st = fa_hadamard_rotate(&tk, 9);
        double worst = 0, changed = 0;
        for (int a = 0; a < s * h; a++)
            for (int b = 0; b < s * h; b++) {
                double before = 0, after = 0, mag = 0;
                for (int c = 0; c < d; c++) {
                    before += (double)q0[a * d + c] * k0[b * d + c];
                    after += (double)q[a * d + c] * k[b * d + c];
                    mag += fabs((double)q0[a * d + c] * k0[b * d + c]);
                }
                worst = fmax(worst, fabs(after - before) / mag);
            }
        for (int c = 0; c < s * h * d; c++) changed = fmax(changed, fabs(q[c] - q0[c]));
        th_check(st == FA_OK && worst < 1e-5 && changed > 0.1,
                 "rotate: head_dim %d: every q.k unchanged (worst %.1e of its sum of |terms|), the rows changed", d,
                 worst);
        free(q), free(k), free(q0), free(k0);
    }
}

/* RMSE of an e4m3 forward (per-block descales of 64 rows, rotation or not) against the fp32 attention of the
 * original inputs, on N(0, 1) inputs with 1% outliers of N(0, 100) added. */
static double fp8_rmse(int rotated, int s, int d) {
    const int64_t n = (int64_t)s * d;
    float *q = random_rows(n, 11, 0.01), *k = random_rows(n, 12, 0.01), *v = random_rows(n, 13, 0.01);
    float *o32 = malloc(sizeof(float) * (size_t)n);
    uint16_t *o8 = malloc(sizeof(uint16_t) * (size_t)n);
    uint8_t *q8 = malloc((size_t)n), *k8 = malloc((size_t)n), *v8 = malloc((size_t)n);
    const int blocks = (s + 63) / 64;
    float *ds = malloc(sizeof(float) * (size_t)(3 * blocks));
    fa_exec x;
    memset(&x, 0, sizeof x);
    x.backend = FA_BACKEND_CPU;
    fa_params p;
    fa_params_init(&p, FA_F32, 1, s, s, 1, 1, d);
    p.q = fa_tensor_contiguous(q, s, 1, d), p.k = fa_tensor_contiguous(k, s, 1, d);
    p.v = fa_tensor_contiguous(v, s, 1, d), p.o = fa_tensor_contiguous(o32, s, 1, d);
    fa_status st = fa_fwd(&p, &x);
    fa_rows tq = rows_of(q, 1, s, 1, d), tk = rows_of(k, 1, s, 1, d), tv = rows_of(v, 1, s, 1, d);
    if (rotated && st == FA_OK) st = fa_hadamard_rotate(&tq, 5);
    if (rotated && st == FA_OK) st = fa_hadamard_rotate(&tk, 5);
    if (st == FA_OK) st = fa_quantize_e4m3(&tq, 64, fa_tensor_contiguous(q8, s, 1, d), ds);
    if (st == FA_OK) st = fa_quantize_e4m3(&tk, 64, fa_tensor_contiguous(k8, s, 1, d), ds + blocks);
    if (st == FA_OK) st = fa_quantize_e4m3(&tv, 64, fa_tensor_contiguous(v8, s, 1, d), ds + 2 * blocks);
    fa_params_init(&p, FA_E4M3, 1, s, s, 1, 1, d);
    p.q = fa_tensor_contiguous(q8, s, 1, d), p.k = fa_tensor_contiguous(k8, s, 1, d);
    p.v = fa_tensor_contiguous(v8, s, 1, d), p.o = fa_tensor_contiguous(o8, s, 1, d);
    p.q_descale = ds, p.k_descale = ds + blocks, p.v_descale = ds + 2 * blocks;
    p.descale_block_q = p.descale_block_k = 64;
    if (st == FA_OK) st = fa_fwd(&p, &x);
    double sum = 0;
    for (int64_t i = 0; i < n; i++) {
        const double e = fa_bf16_to_f32(o8[i]) - o32[i];
        sum += e * e;
    }
    free(q), free(k), free(v), free(o32), free(o8), free(q8), free(k8), free(v8), free(ds);
    return st == FA_OK ? sqrt(sum / (double)n) : INFINITY;
}

static void incoherent(void) {
    if (!th_selected("incoherent")) return;
    const double plain = fp8_rmse(0, 1024, 128), rotated = fp8_rmse(1, 1024, 128);
    th_check(rotated < 0.8 * plain,
             "incoherent processing: e4m3 forward RMSE against fp32 attention, 1%% outliers, d128, 1k: %.2e with "
             "the rotation, %.2e without",
             rotated, plain);
}

int main(int argc, char **argv) {
    th_init(argc, argv, NULL);
    quantize();
    rotate();
    incoherent();
    return th_finish();
}
