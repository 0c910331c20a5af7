/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cpu_kvcache.c - decoding with a KV cache on the CPU (fa_fwd_kvcache).
 *
 * Three passes, each parallel over (batch, kv head): append the new tokens to the cache (the keys rotated
 * in fp32), gather the attended cache rows of every sequence into packed fp32 copies, and rotate q (rounded to
 * the dtype, as the new keys) into a packed fp32 copy. The attention itself is the CPU forward of cpu_fwd.c on that
 * varlen problem (dtype f32); its fp32 output is then converted into o and its lse transposed into the dense
 * (batch, heads_q, seqlen_q) layout. Where the mask and the scores do not depend on a query row's position or
 * head (no ALiBi, no left window, and one query row or no right bound), the query heads of a kv group become
 * rows of one head of that problem (GQA packing): the forward's tiles then hold group x seqlen_q rows instead
 * of seqlen_q (one, when decoding), which its blocks of query rows would otherwise mostly spend on padding.
 * Gathering costs a copy of the attended cache per call, which a decode kernel reading the pages in place
 * would not pay; it keeps the
 * forward's tiled kernels as they are. The workspace holds the copies and the forward's own workspace, so
 * nothing is allocated once the cache has been written.
 */
#include "cpu/cpu_internal.h"

#include <stdlib.h>

/* The workspace: packed copies and the inner forward's workspace. */
typedef struct kvc_layout {
    int32_t *cu_q, *cu_k; /* batch + 1 each */
    float *q, *k, *v, *o; /* packed (tokens, heads, head_dim) fp32 */
    float *lse;           /* (heads_q, batch * seqlen_q) */
    char *inner;          /* the forward's workspace */
    size_t inner_bytes;
} kvc_layout;

/* Query heads packed as rows of one head of the inner problem: the group size, or 1. Row r of a packed
 * sequence is query row r % seqlen_q of head r / seqlen_q of the group. Every row then sees the same keys with
 * the same scores: no ALiBi (its slope is per head and its distance per row), no left window, and no right
 * bound unless there is a single query row, which sees every key under causal = 1 or window_right >= 0. */
static int64_t kvc_pack(const fa_params *p) {
    const int position_free = p->window_left < 0 && (p->seqlen_q == 1 || p->window_right < 0);
    return !p->alibi_slopes && position_free ? p->heads_q / p->heads_kv : 1;
}

/* The varlen f32 problem the attention runs as (cu arrays filled by kvc_lengths). */
static fa_params kvc_problem(const fa_params *p, const kvc_layout *L, int64_t tk, int64_t max_k) {
    fa_params a = *p;
    const int64_t pack = kvc_pack(p), tq = (int64_t)p->batch * p->seqlen_q * pack;
    a.dtype = FA_F32;
    if (pack > 1) { /* see kvc_pack: every row sees every key, so the packed rows need no mask */
        a.heads_q = p->heads_kv;
        a.seqlen_q = (int32_t)(p->seqlen_q * pack);
        a.causal = 0;
        a.window_right = -1;
    }
    a.cu_seqlens_q = L->cu_q;
    a.cu_seqlens_k = L->cu_k;
    a.total_q = tq;
    a.total_k = tk;
    a.seqlen_k = (int32_t)max_k;
    a.q = fa_tensor_contiguous(L->q, 0, a.heads_q, p->head_dim);
    a.o = fa_tensor_contiguous(L->o, 0, a.heads_q, p->head_dim);
    a.k = fa_tensor_contiguous(L->k, 0, p->heads_kv, p->head_dim);
    a.v = fa_tensor_contiguous(L->v, 0, p->heads_kv, p->head_dim);
    a.lse = L->lse;
    return a;
}

/* cu_seqlens of the packed problem: sequence b attends cache rows P .. L + N - 1. */
static void kvc_lengths(const fa_params *p, const fa_kvcache *kv, int32_t *cu_q, int32_t *cu_k, int64_t *tk,
                        int64_t *max_k) {
    const int64_t rows = p->seqlen_q * kvc_pack(p);
    cu_q[0] = cu_k[0] = 0;
    *max_k = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        const int64_t len = fa_kv_seqlen(kv, b) + p->seqlen_k - fa_kv_leftpad(kv, b);
        cu_q[b + 1] = (int32_t)((b + 1) * rows);
        cu_k[b + 1] = (int32_t)(cu_k[b] + len);
        *max_k = fa_max64(*max_k, len);
    }
    *tk = cu_k[p->batch];
}

static size_t kvc_carve(const fa_params *p, int64_t tk, size_t inner, char *base, kvc_layout *L) {
    fa_arena a = { base, 0 };
    const int64_t tq = (int64_t)p->batch * p->seqlen_q, d = p->head_dim;
    L->cu_q = fa_arena_take(&a, sizeof(int32_t) * (size_t)(p->batch + 1));
    L->cu_k = fa_arena_take(&a, sizeof(int32_t) * (size_t)(p->batch + 1));
    L->q = fa_arena_take(&a, sizeof(float) * (size_t)(tq * p->heads_q * d));
    L->o = fa_arena_take(&a, sizeof(float) * (size_t)(tq * p->heads_q * d));
    L->k = fa_arena_take(&a, sizeof(float) * (size_t)(tk * p->heads_kv * d + 1));
    L->v = fa_arena_take(&a, sizeof(float) * (size_t)(tk * p->heads_kv * d + 1));
    L->lse = fa_arena_take(&a, sizeof(float) * (size_t)(tq * p->heads_q));
    L->inner = fa_arena_take(&a, inner);
    L->inner_bytes = inner;
    return a.used;
}

/* Workspace bytes and the inner forward's share; the lengths need a scratch copy of cu_seqlens here. */
static size_t kvc_sizes(const fa_params *p, const fa_kvcache *kv, int num_threads, size_t *inner, int64_t *tk) {
    int32_t *cu = malloc(sizeof(int32_t) * 2 * (size_t)(p->batch + 1));
    int64_t max_k;
    if (!cu) return SIZE_MAX;
    kvc_layout L = { cu, cu + p->batch + 1, NULL, NULL, NULL, NULL, NULL, NULL, 0 };
    kvc_lengths(p, kv, L.cu_q, L.cu_k, tk, &max_k);
    const fa_params a = kvc_problem(p, &L, *tk, max_k);
    *inner = fa_cpu_workspace_size(&a, num_threads, 0);
    free(cu);
    return kvc_carve(p, *tk, *inner, NULL, &L) + 64;
}

size_t fa_cpu_kvcache_workspace_size(const fa_params *p, const fa_kvcache *kv, int num_threads) {
    size_t inner;
    int64_t tk;
    return kvc_sizes(p, kv, num_threads, &inner, &tk);
}

/* Index of query row i of head h of sequence b in the inner problem's packed rows (kvc_pack): its token
 * (*tok, among batch x seqlen_q x pack) and head (*head, among heads_q / pack). */
static void kvc_row(const fa_params *p, int64_t pack, int64_t b, int64_t i, int64_t h, int64_t *tok, int64_t *head) {
    *tok = (b * pack + h % pack) * p->seqlen_q + i;
    *head = h / pack;
}

/* Rotates the first rotary_dim entries of row x (fp32) to position pos. */
static void rotate_f32(const fa_kvcache *kv, fa_dtype dt, int64_t pos, float *x) {
    const int64_t half = kv->rotary_dim / 2;
    for (int64_t t = 0; t < half; t++) {
        int64_t a, c;
        fa_rotary_pair(kv, t, &a, &c);
        const float cs = fa_load(kv->rotary_cos, dt, pos * half + t), sn = fa_load(kv->rotary_sin, dt, pos * half + t);
        const float x0 = x[a], x1 = x[c];
        x[a] = x0 * cs - x1 * sn;
        x[c] = x0 * sn + x1 * cs;
    }
}

fa_status fa_cpu_fwd_kvcache(const fa_params *p, const fa_kvcache *kv, const fa_exec *x) {
    size_t inner;
    int64_t tk;
    const size_t bytes = kvc_sizes(p, kv, x->num_threads, &inner, &tk);
    if (bytes == SIZE_MAX) return fa_fail(FA_ERR_OUT_OF_MEMORY, "cpu backend: out of host memory");
    fa_workspace ws;
    fa_status st = fa_workspace_acquire(x, bytes, &ws);
    if (st != FA_OK) return st;
    kvc_layout L;
    kvc_carve(p, tk, inner, ws.base, &L);
    int64_t max_k;
    kvc_lengths(p, kv, L.cu_q, L.cu_k, &tk, &max_k);
    const fa_params a = kvc_problem(p, &L, tk, max_k);

    const int64_t d = p->head_dim, hq = p->heads_q, hkv = p->heads_kv, group = hq / hkv, sq = p->seqlen_q;
    const int64_t pack = kvc_pack(p), hp = hq / pack; /* the inner problem's heads */
    const int64_t tasks = (int64_t)p->batch * hkv, tq = (int64_t)p->batch * sq * pack;
    const int threads = fa_cpu_threads(&a, x->num_threads, 0);
    (void)threads; /* read by the OpenMP pragma alone */
#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
    {
        float row[256];
        /* the appends first, all of them: a sequence may read (shared pages) what another appends */
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t t = 0; t < tasks; t++) {
            const int64_t b = t / hkv, h = t % hkv;
            for (int64_t j = 0; j < p->seqlen_k; j++) {
                const int64_t r = fa_kv_seqlen(kv, b) + j;
                fa_cpu_load_row(p->k.data, p->dtype, b * p->k.stride_batch + j * p->k.stride_seq + h * p->k.stride_head,
                                d, row);
                if (kv->rotary_cos) rotate_f32(kv, p->dtype, r, row);
                fa_cpu_store_row(kv->k_cache.data, p->dtype, fa_kv_offset(kv, &kv->k_cache, b, r, h), d, row, 1.0f);
                fa_cpu_load_row(p->v.data, p->dtype, b * p->v.stride_batch + j * p->v.stride_seq + h * p->v.stride_head,
                                d, row);
                fa_cpu_store_row(kv->v_cache.data, p->dtype, fa_kv_offset(kv, &kv->v_cache, b, r, h), d, row, 1.0f);
            }
        }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t t = 0; t < tasks; t++) {
            const int64_t b = t / hkv, h = t % hkv, pad = fa_kv_leftpad(kv, b), end = fa_kv_seqlen(kv, b) + p->seqlen_k;
            for (int64_t r = pad; r < end; r++) {
                const int64_t tok = L.cu_k[b] + r - pad;
                fa_cpu_load_row(kv->k_cache.data, p->dtype, fa_kv_offset(kv, &kv->k_cache, b, r, h), d,
                                L.k + (tok * hkv + h) * d);
                fa_cpu_load_row(kv->v_cache.data, p->dtype, fa_kv_offset(kv, &kv->v_cache, b, r, h), d,
                                L.v + (tok * hkv + h) * d);
            }
            for (int64_t i = 0; i < sq; i++)
                for (int64_t g = 0; g < group; g++) {
                    const int64_t hh = h * group + g;
                    int64_t tok, head;
                    kvc_row(p, pack, b, i, hh, &tok, &head);
                    float *dst = L.q + (tok * hp + head) * d;
                    fa_cpu_load_row(p->q.data, p->dtype,
                                    b * p->q.stride_batch + i * p->q.stride_seq + hh * p->q.stride_head, d, dst);
                    if (kv->rotary_cos) {
                        rotate_f32(kv, p->dtype, fa_kv_q_position(p, kv, b, i), dst);
                        for (int64_t c = 0; c < kv->rotary_dim; c++) dst[c] = fa_round_dtype(p->dtype, dst[c]);
                    }
                }
        }
    }

    fa_exec inner_x = *x;
    inner_x.workspace = L.inner;
    inner_x.workspace_bytes = L.inner_bytes;
    if ((st = fa_cpu_fwd(&a, &inner_x)) != FA_OK) {
        fa_workspace_release(&ws);
        return st;
    }

#ifdef _OPENMP
#pragma omp parallel for num_threads(threads) schedule(static)
#endif
    for (int64_t t = 0; t < (int64_t)p->batch * sq; t++) {
        const int64_t b = t / sq, i = t % sq;
        for (int64_t h = 0; h < hq; h++) {
            int64_t tok, head;
            kvc_row(p, pack, b, i, h, &tok, &head);
            fa_cpu_store_row(p->o.data, p->dtype, b * p->o.stride_batch + i * p->o.stride_seq + h * p->o.stride_head, d,
                             L.o + (tok * hp + head) * d, 1.0f);
            if (p->lse) p->lse[(b * hq + h) * sq + i] = L.lse[head * tq + tok];
        }
    }
    fa_workspace_release(&ws);
    return FA_OK;
}
