/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fp8.c - host helpers that prepare e4m3 inputs for fa_fwd: block quantization (fa_quantize_e4m3) and the
 * random orthogonal rotation of incoherent processing (fa_hadamard_rotate). Both walk the rows of an fa_rows
 * tensor; the arithmetic is fp32, as a GPU implementation of the same steps would do it.
 */
#include <math.h>
#include <stdlib.h>

#include "internal.h"

static fa_status check_rows(const fa_rows *t, const char *name) {
    if (!t) return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s is NULL", name);
    if (t->dtype != FA_F32 && t->dtype != FA_F16 && t->dtype != FA_BF16)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s.dtype (%d) is not FA_F32, FA_F16 or FA_BF16", name, (int)t->dtype);
    if (t->batch < 1) return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s.batch (%d) must be >= 1", name, t->batch);
    if (t->seqlen < (t->cu_seqlens ? 0 : 1))
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s.seqlen (%d) must be >= %d", name, t->seqlen, t->cu_seqlens ? 0 : 1);
    if (t->heads < 1) return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s.heads (%d) must be >= 1", name, t->heads);
    if (t->head_dim < 1 || t->head_dim % 8 || t->head_dim > 256)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s.head_dim (%d) is not a multiple of 8 in [8, 256]", name,
                       t->head_dim);
    if (!t->x.data) return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s.x.data is NULL", name);
    if (t->x.stride_seq < 0 || t->x.stride_head < 0 || (!t->cu_seqlens && t->x.stride_batch < 0))
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s.x has a negative stride", name);
    if (t->cu_seqlens) {
        if (t->cu_seqlens[0] != 0)
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s.cu_seqlens[0] (%d) is not 0", name, t->cu_seqlens[0]);
        for (int32_t b = 0; b < t->batch; b++) {
            const int64_t len = (int64_t)t->cu_seqlens[b + 1] - t->cu_seqlens[b];
            if (len < 0 || len > t->seqlen)
                return fa_fail(FA_ERR_INVALID_ARGUMENT,
                               "%s.cu_seqlens[%d] - cu_seqlens[%d] (%lld) is not in [0, seqlen %d]", name, b + 1, b,
                               (long long)len, t->seqlen);
        }
    }
    return FA_OK;
}

static int64_t seq_len(const fa_rows *t, int64_t b) {
    return t->cu_seqlens ? (int64_t)t->cu_seqlens[b + 1] - t->cu_seqlens[b] : t->seqlen;
}

/* Element offset of row r of sequence b, head h, in a view with t's geometry. */
static int64_t row_offset(const fa_rows *t, const fa_tensor *view, int64_t b, int64_t r, int64_t h) {
    const int64_t base = t->cu_seqlens ? (int64_t)t->cu_seqlens[b] * view->stride_seq : b * view->stride_batch;
    return base + r * view->stride_seq + h * view->stride_head;
}

fa_status fa_quantize_e4m3(const fa_rows *src, int32_t block, fa_tensor dst, float *descale) {
    fa_clear_error();
    fa_status st = check_rows(src, "src");
    if (st != FA_OK) return st;
    if (block < 0) return fa_fail(FA_ERR_INVALID_ARGUMENT, "block (%d) is negative", block);
    if (!dst.data) return fa_fail(FA_ERR_INVALID_ARGUMENT, "dst.data is NULL");
    if (dst.stride_seq < 0 || dst.stride_head < 0 || (!src->cu_seqlens && dst.stride_batch < 0))
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "dst has a negative stride");
    if (dst.data == src->x.data) return fa_fail(FA_ERR_INVALID_ARGUMENT, "dst.data is src.x.data (not in place)");
    if (!descale) return fa_fail(FA_ERR_INVALID_ARGUMENT, "descale is NULL");
    const int64_t d = src->head_dim, blocks = block > 0 ? ((int64_t)src->seqlen + block - 1) / block : 1;
    const int64_t span = block > 0 ? block : src->seqlen;

    /* e4m3 has no infinity: refuse a non-finite value before anything is written */
    for (int64_t b = 0; b < src->batch; b++)
        for (int64_t r = 0; r < seq_len(src, b); r++)
            for (int64_t h = 0; h < src->heads; h++) {
                const int64_t off = row_offset(src, &src->x, b, r, h);
                for (int64_t c = 0; c < d; c++)
                    if (!isfinite(fa_load(src->x.data, src->dtype, off + c)))
                        return fa_fail(FA_ERR_INVALID_ARGUMENT,
                                       "src.x holds a NaN or Inf (batch entry %lld, row %lld, head %lld): e4m3 "
                                       "has no infinity",
                                       (long long)b, (long long)r, (long long)h);
            }

    uint8_t *out = dst.data;
    for (int64_t b = 0; b < src->batch; b++) {
        const int64_t len = seq_len(src, b);
        for (int64_t h = 0; h < src->heads; h++)
            for (int64_t k = 0; k < blocks; k++) {
                const int64_t r0 = k * span, r1 = r0 + span < len ? r0 + span : len;
                float amax = 0.0f;
                for (int64_t r = r0; r < r1; r++) {
                    const int64_t off = row_offset(src, &src->x, b, r, h);
                    for (int64_t c = 0; c < d; c++)
                        amax = fmaxf(amax, fabsf(fa_load(src->x.data, src->dtype, off + c)));
                }
                const float ds = amax > 0.0f ? amax / 448.0f : 1.0f, inv = 1.0f / ds;
                descale[(b * src->heads + h) * blocks + k] = ds;
                for (int64_t r = r0; r < r1; r++) {
                    const int64_t in = row_offset(src, &src->x, b, r, h), o = row_offset(src, &dst, b, r, h);
                    for (int64_t c = 0; c < d; c++)
                        out[o + c] = fa_f32_to_e4m3(fa_load(src->x.data, src->dtype, in + c) * inv);
                }
            }
    }
    return FA_OK;
}

static uint64_t splitmix64(uint64_t x) {
    uint64_t z = x + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

fa_status fa_hadamard_rotate(const fa_rows *x, uint64_t seed) {
    fa_clear_error();
    fa_status st = check_rows(x, "x");
    if (st != FA_OK) return st;
    const int64_t d = x->head_dim;
    int64_t n = 1;
    while (d % (2 * n) == 0) n *= 2; /* the largest power of two dividing head_dim */
    float sign[256], row[256];
    for (int64_t j = 0; j < d; j++) sign[j] = splitmix64(seed + (uint64_t)j) >> 63 ? -1.0f : 1.0f;
    const float norm = 1.0f / sqrtf((float)n);
    for (int64_t b = 0; b < x->batch; b++)
        for (int64_t r = 0; r < seq_len(x, b); r++)
            for (int64_t h = 0; h < x->heads; h++) {
                const int64_t off = row_offset(x, &x->x, b, r, h);
                for (int64_t c = 0; c < d; c++) row[c] = fa_load(x->x.data, x->dtype, off + c) * sign[c];
                for (int64_t c0 = 0; c0 < d; c0 += n) /* in-place fast Walsh-Hadamard transform per chunk */
                    for (int64_t len = 1; len < n; len *= 2)
                        for (int64_t i = c0; i < c0 + n; i += 2 * len)
                            for (int64_t j = i; j < i + len; j++) {
                                const float a = row[j], c = row[j + len];
                                row[j] = a + c;
                                row[j + len] = a - c;
                            }
                for (int64_t c = 0; c < d; c++) fa_store(x->x.data, x->dtype, off + c, row[c] * norm);
            }
    return FA_OK;
}
