/* SPDX-License-Identifier: Apache-2.0 */
/*
 * internal.h - what the backends share: error reporting, the mask rule, sequence geometry, host dtype
 * conversion, and the internal entry point of each backend. Not installed.
 *
 * Every backend entry point receives params that fa_check has validated and resolved:
 * softmax_scale != 0, and window_right == 0 when causal.
 */
#ifndef FLASHATTN_INTERNAL_H
#define FLASHATTN_INTERNAL_H

#include "flashattn.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Records a printf-style detail for fa_last_error() and returns status. */
fa_status fa_fail(fa_status status, const char *fmt, ...)
#ifdef __GNUC__
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Clears the detail message (a call that succeeds leaves it empty). */
void fa_clear_error(void);

static inline int fa_is_varlen(const fa_params *p) {
    return p->cu_seqlens_q != NULL;
}

/* Bottom-right aligned mask rule (see flashattn.h); window_right is already 0 for causal. */
static inline int fa_key_visible(int64_t i, int64_t j, int64_t len_q, int64_t len_k, int32_t window_left,
                                 int32_t window_right) {
    int64_t diag = i + len_k - len_q;
    return (window_left < 0 || j >= diag - window_left) && (window_right < 0 || j <= diag + window_right);
}

/* ALiBi distance term |i + len_k - len_q - j|. */
static inline int64_t fa_alibi_distance(int64_t i, int64_t j, int64_t len_q, int64_t len_k) {
    int64_t d = i + len_k - len_q - j;
    return d < 0 ? -d : d;
}

/* The visible key range [*lo, *hi) of query row i (empty when *lo >= *hi). */
static inline void fa_key_range(int64_t i, int64_t len_q, int64_t len_k, int32_t window_left, int32_t window_right,
                                int64_t *lo, int64_t *hi) {
    int64_t diag = i + len_k - len_q;
    int64_t a = window_left < 0 ? 0 : diag - window_left;
    int64_t b = window_right < 0 ? len_k : diag + window_right + 1;
    *lo = a < 0 ? 0 : a;
    *hi = b > len_k ? len_k : b;
}

/* One sequence of a (possibly varlen) batch, on the host. `row0` is the offset (in elements) of its first
 * token's row for a tensor, so element (row r, head h, dim c) is at row0 + r * stride_seq + h * stride_head + c.
 */
typedef struct fa_seq {
    int64_t len_q, len_k;
    int64_t tok_q, tok_k; /* index of the first token in the packed layout (varlen); 0 for dense */
} fa_seq;

static inline fa_seq fa_seq_get(const fa_params *p, int64_t b) {
    fa_seq s;
    if (fa_is_varlen(p)) {
        s.tok_q = p->cu_seqlens_q[b];
        s.tok_k = p->cu_seqlens_k[b];
        s.len_q = p->cu_seqlens_q[b + 1] - s.tok_q;
        s.len_k = p->cu_seqlens_k[b + 1] - s.tok_k;
    } else {
        s.tok_q = s.tok_k = 0;
        s.len_q = p->seqlen_q;
        s.len_k = p->seqlen_k;
    }
    return s;
}

/* Sequence b with token indices into a packed (tokens, heads, head_dim) copy of the batch: b * seqlen + r when
 * dense, the cu_seqlens offsets when varlen. */
static inline fa_seq fa_seq_packed(const fa_params *p, int64_t b) {
    fa_seq s = fa_seq_get(p, b);
    if (!fa_is_varlen(p)) {
        s.tok_q = b * p->seqlen_q;
        s.tok_k = b * p->seqlen_k;
    }
    return s;
}

/* Element offset of (sequence b whose first token is tok, row r, head h) in tensor t. */
static inline int64_t fa_offset(const fa_params *p, const fa_tensor *t, int64_t b, int64_t tok, int64_t r, int64_t h) {
    int64_t base = fa_is_varlen(p) ? tok * t->stride_seq : b * t->stride_batch;
    return base + r * t->stride_seq + h * t->stride_head;
}

/* Index into lse of (b, h, row r): (batch, heads_q, seqlen_q) dense, (heads_q, total_q) varlen. */
static inline int64_t fa_lse_index(const fa_params *p, int64_t b, int64_t tok_q, int64_t r, int64_t h) {
    if (fa_is_varlen(p)) return h * p->total_q + tok_q + r;
    return (b * p->heads_q + h) * p->seqlen_q + r;
}

static inline float fa_alibi_slope(const fa_params *p, int64_t b, int64_t h) {
    return p->alibi_slopes ? p->alibi_slopes[b * p->alibi_batch_stride + h] : 0.0f;
}

static inline size_t fa_dtype_size(fa_dtype t) {
    return t == FA_F32 ? 4 : t == FA_E4M3 ? 1 : 2;
}

/* The dtype of o: out_dtype for e4m3 inputs, else the inputs' dtype. */
static inline fa_dtype fa_out_dtype(const fa_params *p) {
    return p->dtype == FA_E4M3 ? p->out_dtype : p->dtype;
}

/* Descale blocks per (batch entry, head) of q (which = 'q') or of k and v ('k' or 'v'). */
static inline int64_t fa_descale_blocks(const fa_params *p, int which) {
    const int64_t block = which == 'q' ? p->descale_block_q : p->descale_block_k;
    const int64_t len = which == 'q' ? p->seqlen_q : p->seqlen_k;
    return block > 0 ? (len + block - 1) / block : 1;
}

/* The descale of row r (of its sequence) of head h of batch entry b: which = 'q', 'k' or 'v' (1 without one). */
static inline float fa_descale(const fa_params *p, int which, int64_t b, int64_t h, int64_t r) {
    const float *d = which == 'q' ? p->q_descale : which == 'k' ? p->k_descale : p->v_descale;
    if (!d) return 1.0f;
    const int64_t block = which == 'q' ? p->descale_block_q : p->descale_block_k;
    const int64_t heads = which == 'q' ? p->heads_q : p->heads_kv;
    return d[(b * heads + h) * fa_descale_blocks(p, which) + (block > 0 ? r / block : 0)];
}

/* ---- host conversions between fp32 and the 16-bit formats (round to nearest even) ---- */

static inline float fa_bits_to_f32(uint32_t u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline uint32_t fa_f32_to_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    return u;
}

static inline float fa_bf16_to_f32(uint16_t h) {
    return fa_bits_to_f32((uint32_t)h << 16);
}
static inline uint16_t fa_f32_to_bf16(float f) {
    uint32_t u = fa_f32_to_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40); /* quiet NaN */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}

static inline float fa_f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu;
    uint32_t man = h & 0x3ffu;
    if (exp == 0x1f) return fa_bits_to_f32(sign | 0x7f800000u | (man << 13));
    if (exp == 0) {
        if (man == 0) return fa_bits_to_f32(sign);
        float f = (float)man * (1.0f / 16777216.0f); /* subnormal: man * 2^-24 */
        return sign ? -f : f;
    }
    return fa_bits_to_f32(sign | ((exp + 112u) << 23) | (man << 13));
}
static inline uint16_t fa_f32_to_f16(float f) {
    uint32_t u = fa_f32_to_bits(f);
    uint16_t sign = (uint16_t)((u >> 16) & 0x8000u);
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u) return (uint16_t)(sign | 0x7e00u);
    if (a >= 0x477ff000u) return (uint16_t)(sign | 0x7c00u); /* rounds to >= 65520: infinity */
    if (a < 0x38800000u) {                                   /* below the smallest normal half: subnormal */
        float r = fa_bits_to_f32(a) * 16777216.0f;           /* exact scaling to units of 2^-24 */
        return (uint16_t)(sign | (uint16_t)nearbyintf(r));
    }
    uint32_t e = (a >> 23) - 112u, m = a & 0x7fffffu;
    uint32_t h = (e << 10) | (m >> 13);
    uint32_t rem = m & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) h++;
    return (uint16_t)(sign | h);
}

/* float8 e4m3 (OCP e4m3fn): value of a byte, and the byte nearest a float (ties to even), finite values
 * beyond the largest (448) saturated to it, as CUDA's satfinite conversion; NaN to NaN (0x7f). */
static inline float fa_e4m3_to_f32(uint8_t x) {
    const uint32_t e = (x >> 3) & 15u, m = x & 7u, sign = (uint32_t)(x & 0x80u) << 24;
    if (e == 15 && m == 7) return fa_bits_to_f32(sign | 0x7fc00000u);
    if (e == 0) {
        const float f = (float)m * 0x1p-9f;
        return sign ? -f : f;
    }
    return fa_bits_to_f32(sign | ((e + 120u) << 23) | (m << 20));
}
static inline uint8_t fa_f32_to_e4m3(float f) {
    const uint32_t u = fa_f32_to_bits(f), a = u & 0x7fffffffu;
    const uint8_t sign = (uint8_t)((u >> 24) & 0x80u);
    if (a > 0x7f800000u) return (uint8_t)(sign | 0x7f);
    if (a >= 0x43e80000u) return (uint8_t)(sign | 0x7e); /* >= 464, the midpoint past 448: saturated */
    if (a < 0x3c800000u)                                 /* below 2^-6: multiples of 2^-9 (8 of them is 2^-6) */
        return (uint8_t)(sign | (uint8_t)nearbyintf(fa_bits_to_f32(a) * 512.0f));
    const uint32_t r = a + 0x7ffffu + ((a >> 20) & 1u); /* round the mantissa to 3 bits */
    return (uint8_t)(sign | (((r >> 23) - 120u) << 3) | ((r >> 20) & 7u));
}

/* Element idx of a tensor of the given dtype, as fp32 / stored from fp32. */
static inline float fa_load(const void *base, fa_dtype t, int64_t idx) {
    switch (t) {
    case FA_F16: return fa_f16_to_f32(((const uint16_t *)base)[idx]);
    case FA_BF16: return fa_bf16_to_f32(((const uint16_t *)base)[idx]);
    case FA_E4M3: return fa_e4m3_to_f32(((const uint8_t *)base)[idx]);
    default: return ((const float *)base)[idx];
    }
}
static inline void fa_store(void *base, fa_dtype t, int64_t idx, float x) {
    switch (t) {
    case FA_F16: ((uint16_t *)base)[idx] = fa_f32_to_f16(x); break;
    case FA_BF16: ((uint16_t *)base)[idx] = fa_f32_to_bf16(x); break;
    case FA_E4M3: ((uint8_t *)base)[idx] = fa_f32_to_e4m3(x); break;
    default: ((float *)base)[idx] = x; break;
    }
}

/* ---- backends (each called with validated, resolved params and a non-NULL exec) ---- */

/* fp64 oracle, host memory. Allocates its own scratch; FA_ERR_OUT_OF_MEMORY if that fails. */
fa_status fa_reference_fwd(const fa_params *p);
fa_status fa_reference_bwd(const fa_params *p);

/* The reference's fp64 core on contiguous packed arrays, for tests (finite differences) and the CLI.
 * Layouts: q/o/dout/dq (tokens_q, heads_q, head_dim), k/v/dk/dv (tokens_k, heads_kv, head_dim), where
 * tokens = batch * seqlen (dense) or total (varlen), and lse as in fa_params. Only the sizes and options of
 * p are read. dq/dk/dv are overwritten. FA_ERR_OUT_OF_MEMORY, with the outputs incomplete, when the row
 * scratch cannot be allocated. */
fa_status fa_reference_fwd_f64(const fa_params *p, const double *q, const double *k, const double *v, double *o,
                               double *lse);
fa_status fa_reference_bwd_f64(const fa_params *p, const double *q, const double *k, const double *v,
                               const double *dout, double *dq, double *dk, double *dv);

/* FlashAttention-2 on the CPU. ws may be NULL (the backend allocates). */
size_t fa_cpu_workspace_size(const fa_params *p, int num_threads, int backward);
fa_status fa_cpu_fwd(const fa_params *p, const fa_exec *x);
fa_status fa_cpu_bwd(const fa_params *p, const fa_exec *x);
/* The CPU kernels' instruction-set level in use ("avx512", "avx2", "portable"; chosen at the first call where
 * the build holds several, see src/cpu/cpu_dispatch.c), and how it was chosen, in words. */
const char *fa_cpu_simd(void);
const char *fa_cpu_simd_choice(void);

/* The naive backend comes with CUDA unless the build leaves it out (make FA_NAIVE=0 passes -DFA_NO_NAIVE). */
#if defined(FA_WITH_CUDA) && !defined(FA_NO_NAIVE)
#define FA_WITH_NAIVE 1
#endif

#ifdef FA_WITH_CUDA
/* CUDA (FA2 / FA3 kernels) and the naive cuBLAS baseline; all in src/cuda. */
int fa_cuda_device_count(void);
fa_status fa_cuda_device_info(int32_t ordinal, fa_device_info *info);
int fa_cuda_is_device_pointer(const void *ptr);
const char *fa_cuda_build_info(void);
/* The naive backend's cuBLAS, opened with dlopen on first use: FA_OK, or FA_ERR_NOT_COMPILED saying why not. */
fa_status fa_naive_cublas_load(void);

fa_status fa_cuda_check(const fa_params *p, const fa_exec *x, int backward);
/* The kernel family a CUDA call of p would run and its choices (tiles, schedule, order, grid), in words; on a
 * 132-SM compute capability 9.0 description where no device is usable (*virtual_device = 1). */
fa_status fa_cuda_plan(const fa_params *p, const fa_exec *x, int backward, char *buf, size_t size, int *virtual_device);
fa_status fa_cuda_plan_kvcache(const fa_params *p, const fa_kvcache *kv, const fa_exec *x, char *buf, size_t size,
                               int *virtual_device);
fa_status fa_cuda_workspace_size(const fa_params *p, const fa_exec *x, int backward, size_t *bytes);
fa_status fa_cuda_fwd(const fa_params *p, const fa_exec *x);
fa_status fa_cuda_bwd(const fa_params *p, const fa_exec *x);

/* fa_fwd_kvcache on the CUDA backend (params validated and resolved by prepare_kvcache; the int32 arrays are
 * device memory, not read on the host). */
fa_status fa_cuda_check_kvcache(const fa_params *p, const fa_kvcache *kv, const fa_exec *x);
/* exec.check = 1: the decode call's int32 arrays copied to the host (waiting for the stream; refused while it is
 * captured into a CUDA graph); *h is kv pointing at them, in *buf, which the caller frees. */
fa_status fa_cuda_kvcache_arrays_to_host(const fa_params *p, const fa_kvcache *kv, const fa_exec *x, fa_kvcache *h,
                                         int32_t **buf);
fa_status fa_cuda_workspace_size_kvcache(const fa_params *p, const fa_kvcache *kv, const fa_exec *x, size_t *bytes);
fa_status fa_cuda_fwd_kvcache(const fa_params *p, const fa_kvcache *kv, const fa_exec *x);

fa_status fa_naive_check(const fa_params *p, const fa_exec *x, int backward);
fa_status fa_naive_workspace_size(const fa_params *p, const fa_exec *x, int backward, size_t *bytes);
fa_status fa_naive_fwd(const fa_params *p, const fa_exec *x);
fa_status fa_naive_bwd(const fa_params *p, const fa_exec *x);
#endif

/* ---- decoding with a KV cache: geometry of a validated call (see fa_fwd_kvcache in flashattn.h) ---- */

static inline int64_t fa_kv_capacity(const fa_kvcache *kv) {
    return kv->block_table ? (int64_t)kv->max_pages * kv->page_size : kv->seqlen_cache;
}

/* Tokens already in the cache for sequence b (L), and its first attended row (P). */
static inline int64_t fa_kv_seqlen(const fa_kvcache *kv, int64_t b) {
    return kv->cache_seqlens ? kv->cache_seqlens[b] : fa_kv_capacity(kv);
}
static inline int64_t fa_kv_leftpad(const fa_kvcache *kv, int64_t b) {
    return kv->cache_leftpad ? kv->cache_leftpad[b] : 0;
}

/* Element offset of cache row r (absolute, leftpad included) of sequence b, kv head h, in t (k or v cache). */
static inline int64_t fa_kv_offset(const fa_kvcache *kv, const fa_tensor *t, int64_t b, int64_t r, int64_t h) {
    if (kv->block_table) {
        const int64_t ld = kv->block_table_stride ? kv->block_table_stride : kv->max_pages;
        const int64_t page = kv->block_table[b * ld + r / kv->page_size];
        return page * t->stride_batch + (r % kv->page_size) * t->stride_seq + h * t->stride_head;
    }
    const int64_t seq = kv->cache_batch_idx ? kv->cache_batch_idx[b] : b;
    return seq * t->stride_batch + r * t->stride_seq + h * t->stride_head;
}

/* Rotary position of query row i of sequence b: L + i under a mask (causal or a window; p is resolved, so
 * causal has set window_right = 0), L for every row without one. */
static inline int64_t fa_kv_q_position(const fa_params *p, const fa_kvcache *kv, int64_t b, int64_t i) {
    const int local = p->window_left >= 0 || p->window_right >= 0;
    return fa_kv_seqlen(kv, b) + (local ? i : 0);
}

/* Rotary pair t of a row (x0 at index a, x1 at index c). */
static inline void fa_rotary_pair(const fa_kvcache *kv, int64_t t, int64_t *a, int64_t *c) {
    if (kv->rotary_interleaved) {
        *a = 2 * t;
        *c = 2 * t + 1;
    } else {
        *a = t;
        *c = t + kv->rotary_dim / 2;
    }
}

/* x rounded to the nearest value of dtype t (the rotated q and new keys are values of the dtype, as in
 * flash-attn's kernels, which store them in the element type before the products). */
static inline float fa_round_dtype(fa_dtype t, float x) {
    switch (t) {
    case FA_F16: return fa_f16_to_f32(fa_f32_to_f16(x));
    case FA_BF16: return fa_bf16_to_f32(fa_f32_to_bf16(x));
    case FA_E4M3: return fa_e4m3_to_f32(fa_f32_to_e4m3(x));
    default: return x;
    }
}

/* fp64 reference and CPU backend of fa_fwd_kvcache (validated, resolved params; nothing written before
 * every allocation has succeeded). */
fa_status fa_reference_fwd_kvcache(const fa_params *p, const fa_kvcache *kv);
size_t fa_cpu_kvcache_workspace_size(const fa_params *p, const fa_kvcache *kv, int num_threads);
fa_status fa_cpu_fwd_kvcache(const fa_params *p, const fa_kvcache *kv, const fa_exec *x);

#ifdef __cplusplus
}
#endif

#endif /* FLASHATTN_INTERNAL_H */
