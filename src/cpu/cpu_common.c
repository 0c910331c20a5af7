/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cpu_common.c - the CPU backend's shared pieces: threads, workspace, batch geometry, dtype conversion of
 * rows, and the workspace-size entry point.
 */
#include "cpu/cpu_internal.h"

#include <stdlib.h>

#ifdef _OPENMP
#include <omp.h>
#endif

#ifdef _OPENMP
/* Tasks of the call's widest parallel loop: forward, the K/V packing (kv heads x key blocks) or the query
 * blocks (heads x query blocks); backward, the dQ passes (heads x query blocks) or the key-block chunks
 * (batch x kv heads x the longest sequence's key blocks). */
static int64_t cpu_tasks(const fa_params *p, int backward) {
    const int64_t br = backward ? FA_BWD_BR : FA_FWD_BR, bc = backward ? FA_BWD_BC : FA_FWD_BC;
    int64_t qblocks = 0, kblocks = 0, most = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        const fa_seq s = fa_seq_get(p, b);
        qblocks += fa_ceil_div(s.len_q, br);
        kblocks += fa_ceil_div(s.len_k, bc);
        most = fa_max64(most, fa_ceil_div(s.len_k, bc));
    }
    const int64_t q = qblocks * p->heads_q;
    const int64_t k = backward ? (int64_t)p->batch * p->heads_kv * most : kblocks * p->heads_kv;
    return fa_max64(1, fa_max64(q, k));
}
#endif

int fa_cpu_threads(const fa_params *p, int requested, int backward) {
#ifdef _OPENMP
    int64_t n = requested > 0 ? requested : omp_get_max_threads();
    /* more threads than OpenMP allows, than the machine can reasonably run, or than the call has tasks
     * would only cost workspace (each thread has its scratch) and thread creation, which libgomp treats as
     * fatal when it fails */
    const int64_t sane = fa_max64(FA_CPU_MAX_THREADS, omp_get_num_procs());
    n = fa_min64(n, fa_min64(omp_get_thread_limit(), sane));
    return (int)fa_max64(1, fa_min64(n, cpu_tasks(p, backward)));
#else
    (void)p, (void)requested, (void)backward;
    return 1;
#endif
}

int fa_cpu_thread_id(void) {
#ifdef _OPENMP
    return omp_get_thread_num();
#else
    return 0;
#endif
}

fa_status fa_workspace_acquire(const fa_exec *x, size_t bytes, fa_workspace *ws) {
    char *mem = x->workspace;
    ws->owned = NULL;
    if (!mem) {
        ws->owned = malloc(bytes + 64);
        if (!ws->owned)
            return fa_fail(FA_ERR_OUT_OF_MEMORY, "cpu backend: cannot allocate %zu bytes of workspace", bytes + 64);
        mem = ws->owned;
    }
    ws->base = (char *)(((uintptr_t)mem + 63) & ~(uintptr_t)63);
    return FA_OK;
}

void fa_workspace_release(fa_workspace *ws) {
    free(ws->owned);
    ws->owned = NULL;
}

size_t fa_cpu_workspace_size(const fa_params *p, int num_threads, int backward) {
    int threads = fa_cpu_threads(p, num_threads, backward);
    /* + 64: a caller's workspace need not be aligned */
    return (backward ? fa_cpu_bwd_workspace(p, threads) : fa_cpu_fwd_workspace(p, threads)) + 64;
}

int64_t fa_cpu_tokens(const fa_params *p, int keys) {
    if (fa_is_varlen(p)) return keys ? p->cu_seqlens_k[p->batch] : p->cu_seqlens_q[p->batch];
    return (int64_t)p->batch * (keys ? p->seqlen_k : p->seqlen_q);
}

void fa_cpu_block_prefix(const fa_params *p, int keys, int64_t block, int64_t *prefix) {
    prefix[0] = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        fa_seq s = fa_seq_get(p, b);
        prefix[b + 1] = prefix[b] + fa_ceil_div(keys ? s.len_k : s.len_q, block);
    }
}

int64_t fa_cpu_block_owner(const int64_t *prefix, int64_t batch, int64_t g) {
    int64_t lo = 0, hi = batch - 1; /* the last b with prefix[b] <= g */
    while (lo < hi) {
        int64_t mid = (lo + hi + 1) / 2;
        if (prefix[mid] <= g)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

fa_tensor fa_cpu_packed_view(const fa_params *p, float *data, int keys) {
    const int64_t ld = fa_cpu_row_stride(p);
    fa_tensor t;
    t.data = data;
    t.stride_seq = ld;
    t.stride_batch = (keys ? p->seqlen_k : p->seqlen_q) * ld;
    t.stride_head = fa_cpu_tokens(p, keys) * ld;
    return t;
}

void fa_cpu_pack_rows(const fa_params *p, const fa_tensor *src, const fa_tensor *dst, int64_t b, int64_t tok,
                      int64_t r0, int64_t r1, int64_t h, float mul, int which) {
    const int64_t d = p->head_dim, w = fa_cpu_row_width(p);
    for (int64_t r = r0; r < r1; r++) {
        float *row = (float *)dst->data + fa_offset(p, dst, b, tok, r, h);
        fa_cpu_load_row(src->data, p->dtype, fa_offset(p, src, b, tok, r, h), d, row);
        for (int64_t c = d; c < w; c++) row[c] = 0.0f;
        const float m = p->dtype == FA_E4M3 ? mul * fa_descale(p, which, b, h, r) : mul;
        if (m != 1.0f)
            for (int64_t c = 0; c < w; c += FA_VL) fa_vstore(row + c, fa_vload(row + c) * m);
    }
}

typedef uint16_t fa_v8u16 __attribute__((vector_size(16), aligned(2), may_alias));
typedef uint32_t fa_v8u32 __attribute__((vector_size(32)));
typedef float fa_v8f __attribute__((vector_size(32)));
typedef float fa_v8f_u __attribute__((vector_size(32), aligned(4), may_alias));

void fa_cpu_load_row(const void *base, fa_dtype t, int64_t off, int64_t n, float *dst) {
    int64_t c = 0;
    switch (t) {
    case FA_F32: memcpy(dst, (const float *)base + off, (size_t)n * sizeof(float)); return;
    case FA_BF16: {
        const uint16_t *src = (const uint16_t *)base + off;
        for (; c + 8 <= n; c += 8) {
            fa_v8u32 u = __builtin_convertvector(*(const fa_v8u16 *)(src + c), fa_v8u32) << 16;
            *(fa_v8f_u *)(dst + c) = (fa_v8f)u;
        }
        for (; c < n; c++) dst[c] = fa_bf16_to_f32(src[c]);
        return;
    }
    case FA_F16: {
        const uint16_t *src = (const uint16_t *)base + off;
#if defined(__F16C__)
        for (; c + 8 <= n; c += 8)
            _mm256_storeu_ps(dst + c, _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)(src + c))));
#endif
        for (; c < n; c++) dst[c] = fa_f16_to_f32(src[c]);
        return;
    }
    case FA_E4M3: {
        const uint8_t *src = (const uint8_t *)base + off;
        for (; c < n; c++) dst[c] = fa_e4m3_to_f32(src[c]);
        return;
    }
    }
}

void fa_cpu_store_row(void *base, fa_dtype t, int64_t off, int64_t n, const float *src, float mul) {
    switch (t) {
    case FA_F32: {
        float *dst = (float *)base + off;
        int64_t c = 0;
        for (; c + FA_VL <= n; c += FA_VL) fa_vstore(dst + c, fa_vload(src + c) * mul);
        for (; c < n; c++) dst[c] = src[c] * mul;
        return;
    }
    case FA_BF16: { /* fa_f32_to_bf16, a vector at a time */
        uint16_t *dst = (uint16_t *)base + off;
        int64_t c = 0;
        for (; c + FA_VL <= n; c += FA_VL) {
            fa_vi u = (fa_vi)(fa_vload(src + c) * mul);
            fa_vi nan = (u & 0x7fffffff) > 0x7f800000;
            fa_vi r = (fa_vi)((fa_vu)(u + 0x7fff + ((u >> 16) & 1)) >> 16);
            r = (nan & (((fa_vi)((fa_vu)u >> 16)) | 0x40)) | (~nan & r);
            for (int l = 0; l < FA_VL; l++) dst[c + l] = (uint16_t)r[l];
        }
        for (; c < n; c++) dst[c] = fa_f32_to_bf16(src[c] * mul);
        return;
    }
    case FA_F16: {
        uint16_t *dst = (uint16_t *)base + off;
        for (int64_t c = 0; c < n; c++) dst[c] = fa_f32_to_f16(src[c] * mul);
        return;
    }
    case FA_E4M3: {
        uint8_t *dst = (uint8_t *)base + off;
        for (int64_t c = 0; c < n; c++) dst[c] = fa_f32_to_e4m3(src[c] * mul);
        return;
    }
    }
}

void fa_cpu_store_zero_row(void *base, fa_dtype t, int64_t off, int64_t n) {
    memset((char *)base + off * (int64_t)fa_dtype_size(t), 0, (size_t)n * fa_dtype_size(t));
}
