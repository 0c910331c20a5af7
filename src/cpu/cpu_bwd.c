/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cpu_bwd.c - FlashAttention-2 backward on the CPU (Algorithm 2 of the paper).
 *
 * A first pass computes D = rowsum(dO * O) from the given O and a copy of Q pre-multiplied by softmax_scale,
 * exactly as the forward scales it: the recomputed scores are then bit-identical to the forward's, so P is
 * consistent with the LSE the forward produced from them (a differently rounded recomputation would put
 * the whole score rounding error into P). Then a task is one (batch, kv head) and one chunk of its key
 * blocks (chunk c of C takes blocks c, c + C, ...). For each key block K_j, V_j it walks every query head of
 * the GQA group and every query block Q_i that can see the block:
 *
 *     S = (scale Q_i) K_j^T,  dP = dO_i V_j^T                (K_j^T, V_j^T packed once per key block)
 *     P = exp2((S - LSE_i) log2 e)                            P recomputed from the given LSE
 *     dS = P * (dP - D_i)  (* (1 - tanh^2) with softcap)
 *     dV_j += P^T dO_i,  dK_j += dS^T (scale Q_i)             in fp32 tiles, written once per key block
 *     dQ_i += dS K_j                                           into the chunk's own fp32 dQ buffer, times
 *                                                              scale when stored
 *
 * so dK and dV need no reduction and are summed over the GQA group inside one task. dQ gets contributions
 * from every chunk: each chunk has its own fp32 buffer, and a last pass adds the C buffers in chunk order and
 * converts. C depends only on the shape and the thread count, so the result is bit-identical run to run
 * (deterministic = 1 costs nothing here). Chunks are dispensed largest first, which keeps the threads
 * balanced under a causal mask too.
 *
 * bf16 calls at a level with the bf16 dot product (fa_cpu_bf16_products) run the five products on bf16
 * pairs: Q (unscaled; the scores are scaled in fp32, as the forward scales them, and dK at its store) and dO
 * as they are for S and dP, and as pairs of query rows for dK and dV; K_j^T, V_j^T as pairs along head_dim,
 * K_j as pairs of keys for dQ; P and dS, computed in fp32, rounded to bf16 (pairs of query rows for dV and dK,
 * rows for dQ). On AMX tiles dV and dK are accumulated transposed, dV^T += dO_i^T P and dK^T += Q_i^T dS, so
 * that P and dS serve as the B operand as they are (pairs of query rows) and dO_i^T, Q_i^T, transposed once per
 * query block, as A.
 */
#include "cpu/cpu_internal.h"

/* Row stride of the S/P and dP/dS tiles. */
#define BWD_LDS FA_TILE_LD(FA_BWD_BC)

typedef struct bwd_layout {
    int64_t *q_prefix, *k_prefix;
    float *delta;                   /* D: (heads_q, tokens_q) */
    float *lse;                     /* the LSE, +inf for rows that see no key (so P = 0): (heads_q, tokens_q) */
    float *q_scaled, *do_packed;    /* packed fp32 copies; Q times softmax_scale */
    float *q_pairs, *do_pairs;      /* bf16 products off AMX: Q and dO as pairs of rows (below) */
    uint32_t *qt_pairs, *dot_pairs; /* AMX: Q^T, dO^T per query block, (heads_q, query blocks, row width,
                                       FA_BWD_BR / 2) pairs of query rows, zero past the block's rows */
    float *dq_acc;                  /* (chunks, heads_q, query blocks, FA_BWD_BR, row width) */
    uint8_t *dq_touched;            /* (chunks, heads_q, query blocks) */
    char *scratch;
    size_t scratch_bytes;
    int64_t chunks, nqb_max; /* nqb_max: bound on the number of query blocks of the batch */
} bwd_layout;

typedef struct bwd_scratch {
    float *kt, *vt;   /* (FA_BWD_BC / FA_VL, head_dim, FA_VL): K_j^T and V_j^T in strips */
    float *k;         /* (FA_BWD_BC, row stride): K_j */
    float *dk, *dv;   /* (FA_BWD_BC, row stride) */
    float *s, *ds;    /* (FA_BWD_BR, BWD_LDS): S then P; dP then dS */
    float *q, *dout;  /* (FA_BWD_BR, row stride): zero-padded copies of a partial query block */
    uint32_t *dsp;    /* bf16 products: (FA_BWD_BR / 2, BWD_LDS) words, dS as pairs of query rows */
    float *dkt, *dvt; /* AMX: (row width, BWD_LDS): dK^T and dV^T */
} bwd_scratch;

static bwd_scratch bwd_scratch_carve(const fa_params *p, fa_arena *a) {
    const int64_t d = p->head_dim, ld = fa_cpu_row_stride(p);
    bwd_scratch s;
    s.kt = fa_arena_take(a, sizeof(float) * d * FA_BWD_BC);
    s.vt = fa_arena_take(a, sizeof(float) * d * FA_BWD_BC);
    s.k = fa_arena_take(a, sizeof(float) * FA_BWD_BC * ld);
    s.dk = fa_arena_take(a, sizeof(float) * FA_BWD_BC * ld);
    s.dv = fa_arena_take(a, sizeof(float) * FA_BWD_BC * ld);
    s.s = fa_arena_take(a, sizeof(float) * FA_BWD_BR * BWD_LDS);
    s.ds = fa_arena_take(a, sizeof(float) * FA_BWD_BR * BWD_LDS);
    s.q = fa_arena_take(a, sizeof(float) * FA_BWD_BR * fa_cpu_row_stride(p));
    s.dout = fa_arena_take(a, sizeof(float) * FA_BWD_BR * fa_cpu_row_stride(p));
    s.dsp = fa_arena_take(a, fa_cpu_bf16_products(p) ? sizeof(uint32_t) * FA_BWD_BR / 2 * BWD_LDS : 0);
    const int64_t t_floats = fa_cpu_amx_products(p) ? fa_cpu_row_width(p) * BWD_LDS : 0;
    s.dkt = fa_arena_take(a, sizeof(float) * t_floats);
    s.dvt = fa_arena_take(a, sizeof(float) * t_floats);
    return s;
}

/* Chunks of key blocks per (batch, kv head): enough tasks for about two per thread. */
static int64_t bwd_chunks(const fa_params *p, int threads) {
    int64_t most = 0;
    for (int64_t b = 0; b < p->batch; b++) most = fa_max64(most, fa_ceil_div(fa_seq_get(p, b).len_k, FA_BWD_BC));
    int64_t c = fa_ceil_div(2 * (int64_t)threads, (int64_t)p->batch * p->heads_kv);
    return fa_max64(1, fa_min64(c, most));
}

static size_t bwd_layout_carve(const fa_params *p, int threads, char *base, bwd_layout *L) {
    fa_arena a = { base, 0 };
    const int64_t w = fa_cpu_row_width(p), ld = fa_cpu_row_stride(p);
    const int64_t tq = fa_cpu_tokens(p, 0);
    L->chunks = bwd_chunks(p, threads);
    L->nqb_max = tq / FA_BWD_BR + p->batch;
    L->q_prefix = fa_arena_take(&a, sizeof(int64_t) * (p->batch + 1));
    L->k_prefix = fa_arena_take(&a, sizeof(int64_t) * (p->batch + 1));
    L->delta = fa_arena_take(&a, sizeof(float) * p->heads_q * tq);
    L->lse = fa_arena_take(&a, sizeof(float) * p->heads_q * tq);
    L->q_scaled = fa_arena_take(&a, sizeof(float) * p->heads_q * tq * ld);
    L->do_packed = fa_arena_take(&a, sizeof(float) * p->heads_q * tq * ld);
    const int64_t pairs = fa_cpu_bf16_products(p) && !fa_cpu_amx_products(p) ? p->heads_q * tq * ld : 0;
    L->q_pairs = fa_arena_take(&a, sizeof(float) * pairs);
    L->do_pairs = fa_arena_take(&a, sizeof(float) * pairs);
    const int64_t tpairs = fa_cpu_amx_products(p) ? p->heads_q * L->nqb_max * w * (FA_BWD_BR / 2) : 0;
    L->qt_pairs = fa_arena_take(&a, sizeof(uint32_t) * tpairs);
    L->dot_pairs = fa_arena_take(&a, sizeof(uint32_t) * tpairs);
    L->dq_acc = fa_arena_take(&a, sizeof(float) * L->chunks * p->heads_q * L->nqb_max * FA_BWD_BR * w);
    L->dq_touched = fa_arena_take(&a, (size_t)(L->chunks * p->heads_q * L->nqb_max));
    fa_arena scratch = { NULL, 0 };
    bwd_scratch_carve(p, &scratch);
    L->scratch_bytes = (scratch.used + 63) & ~(size_t)63;
    L->scratch = fa_arena_take(&a, L->scratch_bytes * threads);
    return a.used;
}

size_t fa_cpu_bwd_workspace(const fa_params *p, int threads) {
    bwd_layout L;
    return bwd_layout_carve(p, threads, NULL, &L);
}

typedef struct bwd_ctx {
    const fa_params *p;
    const bwd_layout *L;
    fa_tensor q, dout; /* views of the packed copies */
    fa_tensor q_pairs, do_pairs;
    int64_t group, nqb, tq;
} bwd_ctx;

/* Rows [i0, i0 + rows) of a packed query-side copy for the micro-kernel: in place when the block is whole,
 * else copied into tile with zero rows up to a multiple of FA_MR (the rows past the sequence may belong to
 * the next one). The row stride comes back through *ld. */
static const float *bwd_query_rows(const bwd_ctx *cx, const fa_tensor *t, float *tile, int64_t b, int64_t tok,
                                   int64_t i0, int64_t rows, int64_t h, int64_t *ld) {
    const fa_params *p = cx->p;
    const float *src = (const float *)t->data + fa_offset(p, t, b, tok, i0, h);
    const int64_t w = fa_cpu_row_width(p);
    *ld = t->stride_seq;
    if (rows == FA_BWD_BR) return src;
    for (int64_t r = 0; r < fa_round_up(rows, FA_MR); r++) {
        if (r < rows)
            memcpy(tile + r * *ld, src + r * *ld, sizeof(float) * w);
        else
            memset(tile + r * *ld, 0, sizeof(float) * w);
    }
    return tile;
}

/* P and dS of one (query block, key block) from S and dP, in place: s becomes P, ds (holding dP) becomes
 * dS. rows x ncols; keys at or past nk and rows at or past mrows get P = dS = 0. */
static void bwd_softmax_grad(const bwd_ctx *cx, bwd_scratch *sc, int64_t b, int64_t h, const fa_seq *s, int64_t i0,
                             int64_t mrows, int64_t rows, int64_t j0, int64_t nk, int64_t ncols, int full) {
    const fa_params *p = cx->p;
    const float cap = p->softcap, inv_cap = cap > 0.0f ? 1.0f / cap : 0.0f;
    const float slope = fa_alibi_slope(p, b, h);
    const fa_vf log2e = fa_vset1(FA_LOG2E);
    const fa_vf ninf = fa_vset1(-__builtin_inff());
    const fa_vi jbase = fa_viota() + (int32_t)j0;
    const fa_vf sv = fa_vset1(fa_cpu_bf16_products(p) ? p->softmax_scale : 1.0f); /* scores come unscaled */
    for (int64_t r = 0; r < rows; r++) {
        float *srow = sc->s + r * BWD_LDS, *dsrow = sc->ds + r * BWD_LDS;
        if (r >= mrows) {
            memset(srow, 0, sizeof(float) * ncols);
            memset(dsrow, 0, sizeof(float) * ncols);
            continue;
        }
        const int64_t ix = h * cx->tq + (fa_is_varlen(p) ? s->tok_q : b * p->seqlen_q) + i0 + r;
        const fa_vf lse = fa_vset1(cx->L->lse[ix]), dlt = fa_vset1(cx->L->delta[ix]);
        if (full && cap == 0.0f && slope == 0.0f) {
            for (int64_t c = 0; c < ncols; c += FA_VL) {
                fa_vf pr = fa_vexp2_nonpos((fa_vload(srow + c) * sv - lse) * log2e);
                fa_vstore(srow + c, pr);
                fa_vstore(dsrow + c, pr * (fa_vload(dsrow + c) - dlt));
            }
            continue;
        }
        int64_t lo, hi;
        fa_key_range(i0 + r, s->len_q, s->len_k, p->window_left, p->window_right, &lo, &hi);
        hi = fa_min64(hi, j0 + nk);
        const fa_vi lov = fa_viset1((int32_t)lo), hiv = fa_viset1((int32_t)hi);
        const float qpos = (float)(i0 + r + s->len_k - s->len_q);
        for (int64_t c = 0; c < ncols; c += FA_VL) {
            fa_vf x = fa_vload(srow + c) * sv, dcap = fa_vset1(1.0f);
            if (cap > 0.0f) { /* the forward's operations, in the same order */
                fa_vf t = fa_vtanh(x * inv_cap);
                x = t * cap;
                dcap = 1.0f - t * t;
            }
            fa_vi j = jbase + (int32_t)c;
            if (slope != 0.0f) x = x - slope * fa_vabs(qpos - __builtin_convertvector(j, fa_vf));
            x = fa_vselect((j >= lov) & (j < hiv), x, ninf);
            fa_vf pr = fa_vexp2_nonpos((x - lse) * log2e);
            fa_vstore(srow + c, pr);
            fa_vstore(dsrow + c, pr * (fa_vload(dsrow + c) - dlt) * dcap);
        }
    }
}

/* The five products of a (query block, key block); A and B as the micro-kernel reads them. */

/* S = Q K^T or dP = dO V^T: rows x ncols over head_dim; q rows at stride ldq, the panel in strips. */
FA_NOINLINE void bwd_scores(int64_t rows, int64_t ncols, int64_t d, const float *q, int64_t ldq, const float *panel,
                            float *out, fa_prefetch pf) {
    const fa_layout_a la = { ldq, 1, FA_MR * ldq };
    const fa_layout_b lb = { FA_VL, FA_VL * d };
    fa_gemm(rows, ncols, d, q, la, panel, lb, out, BWD_LDS, FA_UK_SET, NULL, pf);
}

/* dV (+)= P^T dO or dK (+)= dS^T Q: krows x w over the block's mrows query rows. */
FA_NOINLINE void bwd_key_grad(int64_t krows, int64_t w, int64_t mrows, const float *p, const float *rows, int64_t ld,
                              float *acc, int64_t ldacc, int first, fa_prefetch pf) {
    const fa_layout_a la = { 1, BWD_LDS, FA_MR };
    const fa_layout_b lb = { ld, FA_VL };
    if (first)
        fa_gemm(krows, w, mrows, p, la, rows, lb, acc, ldacc, FA_UK_SET, NULL, pf);
    else
        fa_gemm(krows, w, mrows, p, la, rows, lb, acc, ldacc, FA_UK_ADD, NULL, pf);
}

/* dQ (+)= dS K: rows x w over the block's nk keys. */
FA_NOINLINE void bwd_query_grad(int64_t rows, int64_t w, int64_t nk, const float *ds, const float *k, int64_t ldk,
                                float *dq, int first, fa_prefetch pf) {
    const fa_layout_a la = { BWD_LDS, 1, FA_MR * BWD_LDS };
    const fa_layout_b lb = { ldk, FA_VL };
    if (first)
        fa_gemm(rows, w, nk, ds, la, k, lb, dq, w, FA_UK_SET, NULL, pf);
    else
        fa_gemm(rows, w, nk, ds, la, k, lb, dq, w, FA_UK_ADD, NULL, pf);
}

#ifdef FA_CPU_BF16
/* The products on bf16 pairs (fa_gemm_bf16), with the fp32 versions' shapes; strides in words. */

/* S = Q K^T or dP = dO V^T: rows of head_dim / 2 pairs, the panel in strips of pairs. */
FA_NOINLINE void bwd_scores_bf16(int64_t rows, int64_t ncols, int64_t d, const uint32_t *q, int64_t ldq,
                                 const uint32_t *panel, float *out, fa_prefetch pf) {
    const fa_layout_a la = { ldq, 1, FA_MR * ldq };
    const fa_layout_b lb = { FA_VL, FA_VL * d / 2 };
    fa_gemm_bf16(rows, ncols, d / 2, q, la, panel, lb, out, BWD_LDS, FA_UK_SET, NULL, pf);
}

/* dV (+)= P^T dO or dK (+)= dS^T Q: P or dS as pairs of query rows (tile rows of BWD_LDS words), dO or Q as
 * pairs of rows at stride ld. */
FA_NOINLINE void bwd_key_grad_bf16(int64_t krows, int64_t w, int64_t mrows, const uint32_t *p, const uint32_t *rows,
                                   int64_t ld, float *acc, int64_t ldacc, int first, fa_prefetch pf) {
    const fa_layout_a la = { 1, BWD_LDS, FA_MR };
    const fa_layout_b lb = { ld, FA_VL };
    const int64_t kp = fa_ceil_div(mrows, 2);
    if (first)
        fa_gemm_bf16(krows, w, kp, p, la, rows, lb, acc, ldacc, FA_UK_SET, NULL, pf);
    else
        fa_gemm_bf16(krows, w, kp, p, la, rows, lb, acc, ldacc, FA_UK_ADD, NULL, pf);
}

/* dQ (+)= dS K: dS rows in bf16 (tile rows of BWD_LDS words), K as pairs of keys at stride ldk. */
FA_NOINLINE void bwd_query_grad_bf16(int64_t rows, int64_t w, int64_t nk, const uint32_t *ds, const uint32_t *k,
                                     int64_t ldk, float *dq, int first, fa_prefetch pf) {
    const fa_layout_a la = { BWD_LDS, 1, FA_MR * BWD_LDS };
    const fa_layout_b lb = { ldk, FA_VL };
    const int64_t kp = fa_ceil_div(nk, 2);
    if (first)
        fa_gemm_bf16(rows, w, kp, ds, la, k, lb, dq, w, FA_UK_SET, NULL, pf);
    else
        fa_gemm_bf16(rows, w, kp, ds, la, k, lb, dq, w, FA_UK_ADD, NULL, pf);
}

/* Rows of a tile (BWD_LDS floats each, n a multiple of FA_VL) rounded to bf16 in place, each at the start of
 * its own row: the 16-bit values of a vector land on floats already read. */
static void bwd_tile_to_bf16(float *t, int64_t rows, int64_t n) {
    for (int64_t r = 0; r < rows; r++) {
        float *row = t + r * BWD_LDS;
        for (int64_t c = 0; c < n; c += FA_VL)
            _mm256_storeu_si256((__m256i *)((uint16_t *)row + c), (__m256i)_mm512_cvtneps_pbh(fa_vload(row + c)));
    }
}

/* A bf16 row as a word: elements 2t and 2t + 1. */
static inline uint32_t bwd_pair(const uint16_t *row, int64_t t) {
    uint32_t w;
    memcpy(&w, row + 2 * t, sizeof w); /* one load, not two and a shift */
    return w;
}

/* bwd_pack_key_block for the bf16 products: the K_j^T, V_j^T panels in strips of pairs along head_dim, and K_j
 * as pairs of keys (pair t in row t of the K tile, every column up to the row width; zero past the sequence). */
static void bwd_pack_key_block_bf16(const bwd_ctx *cx, bwd_scratch *sc, int64_t b, const fa_seq *s, int64_t kvh,
                                    int64_t j0, int64_t nk) {
    const fa_params *p = cx->p;
    const int64_t d = p->head_dim, dp = d / 2, w = fa_cpu_row_width(p), ld = fa_cpu_row_stride(p);
    const uint16_t *k16 = p->k.data, *v16 = p->v.data;
    uint32_t *kt = (uint32_t *)sc->kt, *vt = (uint32_t *)sc->vt, *kp = (uint32_t *)sc->k;
    for (int64_t j = 0; j < FA_BWD_BC; j++) {
        const int64_t strip = j / FA_VL * FA_VL * dp + j % FA_VL;
        const uint16_t *krow = j < nk ? k16 + fa_offset(p, &p->k, b, s->tok_k, j0 + j, kvh) : NULL;
        const uint16_t *vrow = j < nk ? v16 + fa_offset(p, &p->v, b, s->tok_k, j0 + j, kvh) : NULL;
        for (int64_t c = 0; c < dp; c++) {
            kt[strip + c * FA_VL] = krow ? bwd_pair(krow, c) : 0u;
            vt[strip + c * FA_VL] = vrow ? bwd_pair(vrow, c) : 0u;
        }
    }
    /* pair rows past the keys zero up to a whole AMX tile of them (the dQ product reads 16 at a time) */
    for (int64_t t = fa_ceil_div(nk, 2); t < fa_round_up(fa_ceil_div(nk, 2), 16); t++)
        memset(kp + t * ld, 0, sizeof(uint32_t) * (size_t)w);
    for (int64_t t = 0; 2 * t < nk; t++) {
        const uint16_t *lo = k16 + fa_offset(p, &p->k, b, s->tok_k, j0 + 2 * t, kvh);
        const uint16_t *hi = 2 * t + 1 < nk ? k16 + fa_offset(p, &p->k, b, s->tok_k, j0 + 2 * t + 1, kvh) : NULL;
        uint32_t *dst = kp + t * ld;
        for (int64_t c = 0; c < d; c++) dst[c] = lo[c] | (hi ? (uint32_t)hi[c] << 16 : 0u);
        for (int64_t c = d; c < w; c++) dst[c] = 0;
    }
}
#endif

/* K_j (rows, for dQ) and the K_j^T, V_j^T panels, converted to fp32; panels zero past the sequence. */
static void bwd_pack_key_block(const bwd_ctx *cx, bwd_scratch *sc, int64_t b, const fa_seq *s, int64_t kvh, int64_t j0,
                               int64_t nk) {
    const fa_params *p = cx->p;
    const int64_t d = p->head_dim, w = fa_cpu_row_width(p), ld = fa_cpu_row_stride(p);
    float vrow[256];
    for (int64_t j = 0; j < FA_BWD_BC; j++) {
        const int64_t strip = j / FA_VL * FA_VL * d + j % FA_VL;
        if (j >= nk) {
            for (int64_t c = 0; c < d; c++) sc->kt[strip + c * FA_VL] = sc->vt[strip + c * FA_VL] = 0.0f;
            continue;
        }
        float *krow = sc->k + j * ld;
        fa_cpu_load_row(p->k.data, p->dtype, fa_offset(p, &p->k, b, s->tok_k, j0 + j, kvh), d, krow);
        fa_cpu_load_row(p->v.data, p->dtype, fa_offset(p, &p->v, b, s->tok_k, j0 + j, kvh), d, vrow);
        for (int64_t c = d; c < w; c++) krow[c] = 0.0f;
        for (int64_t c = 0; c < d; c++) {
            sc->kt[strip + c * FA_VL] = krow[c];
            sc->vt[strip + c * FA_VL] = vrow[c];
        }
    }
}

/* Key block jb of (b, kvh): every query head of the group, every query block that sees it. */
static void bwd_key_block(const bwd_ctx *cx, bwd_scratch *sc, int64_t chunk, int64_t b, int64_t kvh, int64_t jb) {
    const fa_params *p = cx->p;
    const bwd_layout *L = cx->L;
    const int64_t d = p->head_dim, w = fa_cpu_row_width(p), ld = fa_cpu_row_stride(p);
    const fa_seq s = fa_seq_get(p, b);
    const int64_t j0 = jb * FA_BWD_BC, nk = fa_min64(FA_BWD_BC, s.len_k - j0);
    const int64_t krows = fa_round_up(nk, FA_MR), ncols = fa_round_up(krows, FA_VL);
    const int64_t off = s.len_k - s.len_q;
    /* query rows whose visible range meets [j0, j0 + nk) */
    const int64_t ibeg = fa_max64(0, p->window_right < 0 ? 0 : j0 - off - p->window_right);
    const int64_t iend = fa_min64(s.len_q, p->window_left < 0 ? s.len_q : j0 + nk - off + p->window_left);
    int first = 1;

    const int bf16 = fa_cpu_bf16_products(p), amx = fa_cpu_amx_products(p) && ibeg < iend;
#ifdef FA_CPU_BF16
    if (ibeg < iend && bf16) bwd_pack_key_block_bf16(cx, sc, b, &s, kvh, j0, nk);
#endif
#ifdef FA_CPU_AMX
    if (amx) fa_amx_begin();
#else
    (void)amx;
#endif
    if (ibeg < iend && !bf16) bwd_pack_key_block(cx, sc, b, &s, kvh, j0, nk);
    for (int64_t h = kvh * cx->group; h < (kvh + 1) * cx->group && ibeg < iend; h++) {
        const int64_t ib_end = fa_ceil_div(iend, FA_BWD_BR);
        for (int64_t ib = ibeg / FA_BWD_BR; ib < ib_end; ib++) {
            const int64_t i0 = ib * FA_BWD_BR, mrows = fa_min64(FA_BWD_BR, s.len_q - i0),
                          rows = fa_round_up(mrows, FA_MR);
            int64_t lo_last, hi_last, lo_first, hi_first;
            fa_key_range(i0, s.len_q, s.len_k, p->window_left, p->window_right, &lo_first, &hi_first);
            fa_key_range(i0 + mrows - 1, s.len_q, s.len_k, p->window_left, p->window_right, &lo_last, &hi_last);
            const int full = lo_last <= j0 && hi_first >= j0 + nk && nk == ncols;
            int64_t ldq, ldo;
            const float *q = bwd_query_rows(cx, &cx->q, sc->q, b, s.tok_q, i0, mrows, h, &ldq);
            const float *dO = bwd_query_rows(cx, &cx->dout, sc->dout, b, s.tok_q, i0, mrows, h, &ldo);

            const int64_t qg = L->q_prefix[b] + ib;
            const int64_t slot = (chunk * p->heads_q + h) * L->nqb_max + qg;
            float *dq = L->dq_acc + slot * FA_BWD_BR * w;

            /* the next query block's rows of Q, dO and dQ, brought in while this one's products run */
            fa_prefetch pf_q = fa_prefetch_range(NULL, 0), pf_do = pf_q, pf_dq = pf_q;
            if (ib + 1 < ib_end) {
                const int64_t n_next = fa_min64(FA_BWD_BR, s.len_q - i0 - FA_BWD_BR);
                const int64_t bytes = (int64_t)sizeof(float) * n_next * ld;
                pf_q = fa_prefetch_range(
                    (const float *)cx->q.data + fa_offset(p, &cx->q, b, s.tok_q, i0 + FA_BWD_BR, h), bytes);
                pf_do = fa_prefetch_range(
                    (const float *)cx->dout.data + fa_offset(p, &cx->dout, b, s.tok_q, i0 + FA_BWD_BR, h), bytes);
                if (L->dq_touched[slot + 1])
                    pf_dq = fa_prefetch_range(dq + FA_BWD_BR * w, (int64_t)sizeof(float) * n_next * w);
            }

#ifdef FA_CPU_BF16
            if (bf16) {
                /* S and dP from the pairs, P and dS in fp32, then P and dS rounded to bf16 for the products: P as
                 * pairs of query rows in place, dS as such pairs in dsp and as rows in place */
#ifdef FA_CPU_AMX
                if (amx) { /* whole tiles of rows: the query tiles hold FA_BWD_BR rows, those past `rows` unused */
                    const int64_t r16 = fa_round_up(rows, 16);
                    fa_amx_gemm(r16, ncols, d / 2, (const uint32_t *)q, ldq, (const uint32_t *)sc->kt, FA_VL,
                                FA_VL * (d / 2), sc->s, BWD_LDS, 0);
                    fa_amx_gemm(r16, ncols, d / 2, (const uint32_t *)dO, ldo, (const uint32_t *)sc->vt, FA_VL,
                                FA_VL * (d / 2), sc->ds, BWD_LDS, 0);
                } else
#endif
                {
                    bwd_scores_bf16(rows, ncols, d, (const uint32_t *)q, ldq, (const uint32_t *)sc->kt, sc->s, pf_q);
                    bwd_scores_bf16(rows, ncols, d, (const uint32_t *)dO, ldo, (const uint32_t *)sc->vt, sc->ds, pf_do);
                }
                bwd_softmax_grad(cx, sc, b, h, &s, i0, mrows, rows, j0, nk, ncols, full);
                fa_rows_to_bf16_pairs(sc->s, BWD_LDS, mrows, ncols, (uint32_t *)sc->s);
                fa_rows_to_bf16_pairs(sc->ds, BWD_LDS, mrows, ncols, sc->dsp);
                bwd_tile_to_bf16(sc->ds, rows, ncols);
#ifdef FA_CPU_AMX
                if (amx) { /* dV^T += dO^T P, dK^T += Q^T dS; pair rows past the block zero to a whole tile */
                    const int64_t kp = fa_ceil_div(mrows, 2), kp16 = fa_round_up(kp, 16);
                    for (int64_t t = kp; t < kp16; t++) {
                        memset((uint32_t *)sc->s + t * BWD_LDS, 0, sizeof(uint32_t) * (size_t)ncols);
                        memset(sc->dsp + t * BWD_LDS, 0, sizeof(uint32_t) * (size_t)ncols);
                    }
                    const int64_t at = (h * L->nqb_max + qg) * w * (FA_BWD_BR / 2);
                    fa_amx_gemm(w, ncols, kp16, L->dot_pairs + at, FA_BWD_BR / 2, (const uint32_t *)sc->s, BWD_LDS,
                                FA_VL, sc->dvt, BWD_LDS, !first);
                    fa_amx_gemm(w, ncols, kp16, L->qt_pairs + at, FA_BWD_BR / 2, sc->dsp, BWD_LDS, FA_VL, sc->dkt,
                                BWD_LDS, !first);
                } else
#endif
                {
                    const uint32_t *qp =
                        (const uint32_t *)cx->q_pairs.data + fa_offset(p, &cx->q_pairs, b, s.tok_q, i0, h);
                    const uint32_t *dop =
                        (const uint32_t *)cx->do_pairs.data + fa_offset(p, &cx->do_pairs, b, s.tok_q, i0, h);
                    bwd_key_grad_bf16(krows, w, mrows, (const uint32_t *)sc->s, dop, ld, sc->dv, ld, first, pf_dq);
                    bwd_key_grad_bf16(krows, w, mrows, sc->dsp, qp, ld, sc->dk, ld, first, fa_prefetch_range(NULL, 0));
                }
                first = 0;
#ifdef FA_CPU_AMX
                if (amx) { /* dS rows as pairs of keys, zero from ncols on to a whole tile of pairs */
                    const int64_t r16 = fa_round_up(rows, 16), kp16 = fa_round_up(fa_ceil_div(nk, 2), 16);
                    for (int64_t r = 0; r < r16 && kp16 > ncols / 2; r++)
                        memset((uint32_t *)(sc->ds + r * BWD_LDS) + ncols / 2, 0,
                               sizeof(uint32_t) * (size_t)(kp16 - ncols / 2));
                    fa_amx_gemm(r16, w, kp16, (const uint32_t *)sc->ds, BWD_LDS, (const uint32_t *)sc->k, ld, FA_VL, dq,
                                w, L->dq_touched[slot]);
                } else
#endif
                    bwd_query_grad_bf16(rows, w, nk, (const uint32_t *)sc->ds, (const uint32_t *)sc->k, ld, dq,
                                        !L->dq_touched[slot], fa_prefetch_range(NULL, 0));
                L->dq_touched[slot] = 1;
                continue;
            }
#endif
            bwd_scores(rows, ncols, d, q, ldq, sc->kt, sc->s, pf_q);
            bwd_scores(rows, ncols, d, dO, ldo, sc->vt, sc->ds, pf_do);
            bwd_softmax_grad(cx, sc, b, h, &s, i0, mrows, rows, j0, nk, ncols, full);
            bwd_key_grad(krows, w, mrows, sc->s, dO, ldo, sc->dv, ld, first, pf_dq);
            bwd_key_grad(krows, w, mrows, sc->ds, q, ldq, sc->dk, ld, first, fa_prefetch_range(NULL, 0));
            first = 0;

            bwd_query_grad(rows, w, nk, sc->ds, sc->k, ld, dq, !L->dq_touched[slot], fa_prefetch_range(NULL, 0));
            L->dq_touched[slot] = 1;
        }
    }

#ifdef FA_CPU_AMX
    if (amx) {
        fa_amx_end();
        for (int64_t j = 0; j < nk && !first; j++) /* the transposed sums as rows */
            for (int64_t c = 0; c < d; c++) {
                sc->dk[j * ld + c] = sc->dkt[c * BWD_LDS + j];
                sc->dv[j * ld + c] = sc->dvt[c * BWD_LDS + j];
            }
    }
#endif
    const float dk_mul = bf16 ? p->softmax_scale : 1.0f; /* the bf16 products' dK is of the unscaled Q */
    for (int64_t j = 0; j < nk; j++) {
        const int64_t ko = fa_offset(p, &p->dk, b, s.tok_k, j0 + j, kvh);
        const int64_t vo = fa_offset(p, &p->dv, b, s.tok_k, j0 + j, kvh);
        if (first) {
            fa_cpu_store_zero_row(p->dk.data, p->dtype, ko, d);
            fa_cpu_store_zero_row(p->dv.data, p->dtype, vo, d);
        } else {
            fa_cpu_store_row(p->dk.data, p->dtype, ko, d, sc->dk + j * ld, dk_mul);
            fa_cpu_store_row(p->dv.data, p->dtype, vo, d, sc->dv + j * ld, 1.0f);
        }
    }
}

/* D and the LSE of rows [r0, r1) of sequence b, head h; the packed copies of their Q (times softmax_scale,
 * rounded as the forward rounds it) and dO rows. */
static void bwd_prepare_rows(const bwd_ctx *cx, int64_t b, const fa_seq *s, int64_t r0, int64_t r1, int64_t h) {
    const fa_params *p = cx->p;
    const int64_t d = p->head_dim;
    float orow[256];
    fa_cpu_pack_rows(p, &p->q, &cx->q, b, s->tok_q, r0, r1, h, p->softmax_scale, 'q');
    fa_cpu_pack_rows(p, &p->dout, &cx->dout, b, s->tok_q, r0, r1, h, 1.0f, 0);
    for (int64_t r = r0; r < r1; r++) {
        const float *drow = (const float *)cx->dout.data + fa_offset(p, &cx->dout, b, s->tok_q, r, h);
        fa_cpu_load_row(p->o.data, p->dtype, fa_offset(p, &p->o, b, s->tok_q, r, h), d, orow);
        /* the micro-kernel's order and rounding: where O equals a row of V (one visible key), D equals that
         * key's dP exactly and dS = P (dP - D) is exactly 0 */
        float acc = 0.0f;
        for (int64_t c = 0; c < d; c++) acc = fa_fmaf(drow[c], orow[c], acc);
        const int64_t ix = h * cx->tq + (fa_is_varlen(p) ? s->tok_q : b * p->seqlen_q) + r;
        const float lse = p->lse[fa_lse_index(p, b, s->tok_q, r, h)];
        cx->L->delta[ix] = acc;
        cx->L->lse[ix] = lse == -__builtin_inff() ? __builtin_inff() : lse;
    }
}

#ifdef FA_CPU_BF16
/* bwd_prepare_rows for the bf16 products: Q (unscaled) and dO rows copied as they are (pairs along head_dim),
 * and as pairs of rows of the query block that starts at r0 (pair t in row r0 + t of q_pairs and do_pairs,
 * every column up to the row width; on AMX transposed into the block's qt_pairs, dot_pairs instead). D in the order and
 * rounding of the dP product: where O equals a row of V, D equals that key's dP exactly (as in the fp32 path). */
static void bwd_prepare_rows_bf16(const bwd_ctx *cx, int64_t b, const fa_seq *s, int64_t r0, int64_t r1, int64_t h) {
    const fa_params *p = cx->p;
    const int64_t d = p->head_dim, w = fa_cpu_row_width(p);
    const uint16_t *q16 = p->q.data, *do16 = p->dout.data, *o16 = p->o.data;
    for (int64_t r = r0; r < r1; r++) {
        const uint16_t *qrow = q16 + fa_offset(p, &p->q, b, s->tok_q, r, h);
        const uint16_t *drow = do16 + fa_offset(p, &p->dout, b, s->tok_q, r, h);
        const uint16_t *orow = o16 + fa_offset(p, &p->o, b, s->tok_q, r, h);
        memcpy((float *)cx->q.data + fa_offset(p, &cx->q, b, s->tok_q, r, h), qrow, sizeof(uint16_t) * d);
        memcpy((float *)cx->dout.data + fa_offset(p, &cx->dout, b, s->tok_q, r, h), drow, sizeof(uint16_t) * d);
        __m128 acc = _mm_setzero_ps();
        for (int64_t t = 0; t < d / 2; t++)
            acc = _mm_dpbf16_ps(acc, (__m128bh)_mm_set1_epi32((int)bwd_pair(drow, t)),
                                (__m128bh)_mm_set1_epi32((int)bwd_pair(orow, t)));
        const int64_t ix = h * cx->tq + (fa_is_varlen(p) ? s->tok_q : b * p->seqlen_q) + r;
        const float lse = p->lse[fa_lse_index(p, b, s->tok_q, r, h)];
        cx->L->delta[ix] = _mm_cvtss_f32(acc);
        cx->L->lse[ix] = lse == -__builtin_inff() ? __builtin_inff() : lse;
    }
    /* pairs of query rows: as rows of q_pairs / do_pairs, or on AMX transposed (column c of the block as row c
     * of qt_pairs / dot_pairs, zero past the block's rows) */
    const int amx = fa_cpu_amx_products(p), np = FA_BWD_BR / 2;
    const fa_tensor *src[2] = { &p->q, &p->dout };
    const fa_tensor *dst[2] = { &cx->q_pairs, &cx->do_pairs };
    uint32_t *blk[2] = { NULL, NULL };
    if (amx) {
        const int64_t at = (h * cx->L->nqb_max + cx->L->q_prefix[b] + r0 / FA_BWD_BR) * w * np;
        blk[0] = cx->L->qt_pairs + at, blk[1] = cx->L->dot_pairs + at;
    }
    for (int x = 0; x < 2; x++) {
        const uint16_t *base = src[x]->data;
        if (amx) memset(blk[x], 0, sizeof(uint32_t) * (size_t)(w * np));
        for (int64_t t = 0; r0 + 2 * t < r1; t++) {
            const uint16_t *lo = base + fa_offset(p, src[x], b, s->tok_q, r0 + 2 * t, h);
            const uint16_t *hi =
                r0 + 2 * t + 1 < r1 ? base + fa_offset(p, src[x], b, s->tok_q, r0 + 2 * t + 1, h) : NULL;
            if (amx) {
                for (int64_t c = 0; c < d; c++) blk[x][c * np + t] = lo[c] | (hi ? (uint32_t)hi[c] << 16 : 0u);
                continue;
            }
            uint32_t *row = (uint32_t *)dst[x]->data + fa_offset(p, dst[x], b, s->tok_q, r0 + t, h);
            for (int64_t c = 0; c < d; c++) row[c] = lo[c] | (hi ? (uint32_t)hi[c] << 16 : 0u);
            for (int64_t c = d; c < w; c++) row[c] = 0;
        }
    }
}
#endif

/* dQ of one query block: the chunks' buffers added in chunk order, converted and stored. */
static void bwd_store_dq(const bwd_ctx *cx, int64_t h, int64_t qg) {
    const fa_params *p = cx->p;
    const bwd_layout *L = cx->L;
    const int64_t d = p->head_dim, w = fa_cpu_row_width(p);
    const int64_t b = fa_cpu_block_owner(L->q_prefix, p->batch, qg);
    const fa_seq s = fa_seq_get(p, b);
    const int64_t i0 = (qg - L->q_prefix[b]) * FA_BWD_BR, mrows = fa_min64(FA_BWD_BR, s.len_q - i0);
    int any = 0;
    float sum[256];
    for (int64_t c = 0; c < L->chunks; c++) any |= L->dq_touched[(c * p->heads_q + h) * L->nqb_max + qg];
    for (int64_t r = 0; r < mrows; r++) {
        const int64_t o = fa_offset(p, &p->dq, b, s.tok_q, i0 + r, h);
        /* a row the mask leaves no key has dQ = 0, also where its block's sums took a masked key's weight 0 times
         * a NaN (in V or dO) */
        int64_t lo, hi;
        fa_key_range(i0 + r, s.len_q, s.len_k, p->window_left, p->window_right, &lo, &hi);
        if (!any || lo >= hi) {
            fa_cpu_store_zero_row(p->dq.data, p->dtype, o, d);
            continue;
        }
        const int64_t dv = d / FA_VL * FA_VL; /* whole vectors, then the rest (head_dim is a multiple of 8) */
        for (int64_t c = 0; c < d; c++) sum[c] = 0.0f;
        for (int64_t k = 0; k < L->chunks; k++) {
            const int64_t slot = (k * p->heads_q + h) * L->nqb_max + qg;
            if (!L->dq_touched[slot]) continue;
            const float *src = L->dq_acc + (slot * FA_BWD_BR + r) * w;
            for (int64_t c = 0; c < dv; c += FA_VL) fa_vstore(sum + c, fa_vload(sum + c) + fa_vload(src + c));
            for (int64_t c = dv; c < d; c++) sum[c] += src[c];
        }
        fa_cpu_store_row(p->dq.data, p->dtype, o, d, sum, p->softmax_scale);
    }
}

fa_status fa_cpu_bwd(const fa_params *p, const fa_exec *x) {
    if (p->head_dim > 256 || p->head_dim % 8 != 0)
        return fa_fail(FA_ERR_UNSUPPORTED, "cpu backend: head_dim (%d) must be a multiple of 8 up to 256", p->head_dim);
    const int threads = fa_cpu_threads(p, x->num_threads, 1);
    bwd_layout L;
    fa_workspace ws;
    fa_status st = fa_workspace_acquire(x, bwd_layout_carve(p, threads, NULL, &L), &ws);
    if (st != FA_OK) return st;
    bwd_layout_carve(p, threads, ws.base, &L);
    fa_cpu_block_prefix(p, 0, FA_BWD_BR, L.q_prefix);
    fa_cpu_block_prefix(p, 1, FA_BWD_BC, L.k_prefix);

    bwd_ctx cx;
    cx.p = p;
    cx.L = &L;
    cx.group = p->heads_q / p->heads_kv;
    cx.nqb = L.q_prefix[p->batch];
    cx.tq = fa_cpu_tokens(p, 0);
    cx.q = fa_cpu_packed_view(p, L.q_scaled, 0);
    cx.dout = fa_cpu_packed_view(p, L.do_packed, 0);
    cx.q_pairs = fa_cpu_packed_view(p, L.q_pairs, 0);
    cx.do_pairs = fa_cpu_packed_view(p, L.do_pairs, 0);
    memset(L.dq_touched, 0, (size_t)(L.chunks * p->heads_q * L.nqb_max));

    const int64_t bh_kv = (int64_t)p->batch * p->heads_kv;
    const int64_t n_tasks = bh_kv * L.chunks;

#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
    {
        fa_arena a = { L.scratch + L.scratch_bytes * (size_t)fa_cpu_thread_id(), 0 };
        bwd_scratch sc = bwd_scratch_carve(p, &a);
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t t = 0; t < p->heads_q * cx.nqb; t++) {
            const int64_t h = t / cx.nqb, qg = t % cx.nqb, b = fa_cpu_block_owner(L.q_prefix, p->batch, qg);
            const fa_seq s = fa_seq_get(p, b);
            const int64_t i0 = (qg - L.q_prefix[b]) * FA_BWD_BR;
#ifdef FA_CPU_BF16
            if (fa_cpu_bf16_products(p)) {
                bwd_prepare_rows_bf16(&cx, b, &s, i0, fa_min64(s.len_q, i0 + FA_BWD_BR), h);
                continue;
            }
#endif
            bwd_prepare_rows(&cx, b, &s, i0, fa_min64(s.len_q, i0 + FA_BWD_BR), h);
        }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t t = 0; t < n_tasks; t++) {
            /* chunk-major: chunk c holds no fewer (and, under a causal mask, no cheaper) blocks than c + 1 */
            const int64_t chunk = t / bh_kv, b = (t % bh_kv) / p->heads_kv, kvh = t % p->heads_kv;
            const int64_t nkb = L.k_prefix[b + 1] - L.k_prefix[b];
            for (int64_t jb = chunk; jb < nkb; jb += L.chunks) bwd_key_block(&cx, &sc, chunk, b, kvh, jb);
        }
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t t = 0; t < p->heads_q * cx.nqb; t++) bwd_store_dq(&cx, t / cx.nqb, t % cx.nqb);
    }
    fa_workspace_release(&ws);
    return FA_OK;
}
