/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cpu_fwd.c - FlashAttention-2 forward on the CPU (Algorithm 1 of the paper, tiled for caches).
 *
 * A task is one block of FA_FWD_BR query rows of one (batch, head); OpenMP threads take tasks dynamically, the
 * costliest (last row blocks, under a causal mask) first. A task keeps Q^T, the scores, the output
 * accumulator and the row statistics in its thread's scratch and walks the key blocks its rows can see:
 *
 *     S^T = K_j Q_i^T          scores transposed (keys x queries), so the softmax statistics of a query row
 *                              are one vector lane and need no horizontal reductions
 *     m_new = max(m, rowmax S), P = e^(S - m_new), l = l e^(m - m_new) + rowsum P
 *     O = diag(e^(m - m_new)) O + P V_j     the rescale is fused into the product's accumulator load
 *
 * and divides by l once at the end. Q is pre-multiplied by softmax_scale; scores stay in natural units
 * (a log2 e folded into the scale would add a systematic rounding to every score that the forward's LSE
 * carries into the backward) and e^x is computed as exp2(x log2 e). Both products run on the
 * register-blocked micro-kernel of cpu_simd.h; its A operand is read by broadcasts, so K_j enters as
 * micro-panels (FA_MR keys side by side for each of the head_dim steps, one contiguous stream; K is packed so
 * once per call, for every query block and head of the group) and P as the transposed score tile; its B
 * operand is Q^T, kept as one contiguous strip per vector of query columns, and the rows of V. Before the
 * tasks, a pass writes the K micro-panels and a packed fp32 copy of V (converted from f16/bf16, rows at a
 * cache-friendly stride). While a product runs, the next one's key-block data is prefetched, so the
 * stream of K and V blocks (more than L2 holds, per head) does not wait on memory.
 *
 * bf16 calls at a level with the bf16 dot product (fa_cpu_bf16_products) run both products on bf16 pairs
 * instead: the K panels and Q^T strips hold pairs along head_dim straight from the inputs (Q unscaled: the
 * softmax multiplies the scores by softmax_scale in fp32), V is packed as pairs of keys, and P, computed in
 * fp32 as above, is rounded to bf16 pairs of keys in a tile of its own (the P V product's operand) beside the
 * scores. After a row's first block its max mostly stays (FWD_STALE_LOG2), so P there takes one pass over the scores.
 */
#include "cpu/cpu_internal.h"

#include <math.h>

/* Row stride of the score tile. */
#define FWD_LDS FA_TILE_LD(FA_FWD_BR)

/* Workspace of a forward call. */
typedef struct fwd_layout {
    int64_t *q_prefix, *k_prefix; /* blocks per sequence, prefix sums (batch + 1 each) */
    float *kt;                    /* K panels: (heads_kv, key blocks, FA_FWD_BC / FA_MR, head_dim, FA_MR) */
    float *v_packed;              /* V as packed fp32 rows (bf16 products: pair rows, fwd_pack_keys_bf16) */
    uint8_t *v_bad;               /* (heads_kv, key tokens): the V row holds a non-finite value */
    uint8_t *kb_bad;              /* (heads_kv, key blocks): the block holds such a row */
#ifdef FA_CPU_AMX
    uint32_t *vt; /* AMX: V^T as pairs of keys, (heads_kv, key blocks, head_dim, FA_FWD_BC / 2) */
#endif
    char *scratch; /* per thread, scratch_bytes each */
    size_t scratch_bytes;
} fwd_layout;

/* One thread's tiles. */
typedef struct fwd_scratch {
    float *qt;        /* (FA_FWD_BR / FA_VL, head_dim, FA_VL): Q^T of the block, pre-scaled, in strips */
    float *st;        /* (FA_FWD_BC, FWD_LDS): scores, then probabilities, transposed */
    float *o;         /* (FA_FWD_BR, row stride): output accumulator */
    float *m, *l;     /* (FA_FWD_BR): running max and sum */
    float *alpha;     /* (FA_FWD_BR): rescale of the accumulator for the current key block */
    float *qpos;      /* (FA_FWD_BR): query position on the key axis, for ALiBi */
    int32_t *lo, *hi; /* (FA_FWD_BR): visible key range of each row */
#ifdef FA_CPU_BF16
    uint32_t *pt; /* bf16 products: (FA_FWD_BC / 2, FWD_LDS): P as bf16 pairs of keys, transposed */
#endif
#ifdef FA_CPU_AMX
    float *ot; /* AMX: (row width, FWD_LDS): the output accumulator transposed */
#endif
} fwd_scratch;

static fwd_scratch fwd_scratch_carve(const fa_params *p, fa_arena *a) {
    const int64_t d = p->head_dim;
    fwd_scratch s;
    s.qt = fa_arena_take(a, sizeof(float) * d * FA_FWD_BR);
    s.st = fa_arena_take(a, sizeof(float) * FA_FWD_BC * FWD_LDS);
    s.o = fa_arena_take(a, sizeof(float) * FA_FWD_BR * fa_cpu_row_stride(p));
    s.m = fa_arena_take(a, sizeof(float) * FA_FWD_BR);
    s.l = fa_arena_take(a, sizeof(float) * FA_FWD_BR);
    s.alpha = fa_arena_take(a, sizeof(float) * FA_FWD_BR);
    s.qpos = fa_arena_take(a, sizeof(float) * FA_FWD_BR);
    s.lo = fa_arena_take(a, sizeof(int32_t) * FA_FWD_BR);
    s.hi = fa_arena_take(a, sizeof(int32_t) * FA_FWD_BR);
#ifdef FA_CPU_BF16
    s.pt =
        fa_cpu_bf16_products(p) ? fa_arena_take(a, sizeof(uint32_t) * fa_round_up(FA_FWD_BC / 2, 16) * FWD_LDS) : NULL;
#endif
#ifdef FA_CPU_AMX
    s.ot = fa_arena_take(a, sizeof(float) * fa_cpu_row_width(p) * FWD_LDS);
#endif
    return s;
}

static size_t fwd_layout_carve(const fa_params *p, int threads, char *base, fwd_layout *L) {
    fa_arena a = { base, 0 };
    const int64_t nkb = fa_cpu_tokens(p, 1) / FA_FWD_BC + p->batch; /* >= the sum of per-sequence key blocks */
    L->q_prefix = fa_arena_take(&a, sizeof(int64_t) * (p->batch + 1));
    L->k_prefix = fa_arena_take(&a, sizeof(int64_t) * (p->batch + 1));
    L->kt = fa_arena_take(&a, sizeof(float) * p->heads_kv * nkb * p->head_dim * FA_FWD_BC);
    L->v_packed = fa_arena_take(&a, sizeof(float) * p->heads_kv * fa_cpu_tokens(p, 1) * fa_cpu_row_stride(p));
    L->v_bad = fa_arena_take(&a, (size_t)(p->heads_kv * fa_cpu_tokens(p, 1)));
    L->kb_bad = fa_arena_take(&a, (size_t)(p->heads_kv * nkb));
#ifdef FA_CPU_AMX
    L->vt = fa_arena_take(&a, sizeof(uint32_t) * p->heads_kv * nkb * p->head_dim * (FA_FWD_BC / 2));
#endif
    fa_arena scratch = { NULL, 0 };
    fwd_scratch_carve(p, &scratch);
    L->scratch_bytes = (scratch.used + 63) & ~(size_t)63;
    L->scratch = fa_arena_take(&a, L->scratch_bytes * threads);
    return a.used;
}

size_t fa_cpu_fwd_workspace(const fa_params *p, int threads) {
    fwd_layout L;
    return fwd_layout_carve(p, threads, NULL, &L);
}

/* What every task of a call shares. */
typedef struct fwd_ctx {
    const fa_params *p;
    const fwd_layout *L;
    fa_tensor v;   /* view of the packed copy of V */
    int64_t nkb;   /* key blocks in the batch */
    int64_t group; /* heads_q / heads_kv */
    int64_t tk;    /* key tokens of the batch */
} fwd_ctx;

/* Index of sequence b's first key among the batch's key tokens. */
static int64_t fwd_key_token(const fa_params *p, int64_t b, const fa_seq *s) {
    return fa_is_varlen(p) ? s->tok_k : b * p->seqlen_k;
}

/* Word c of a bf16 row: elements 2c (low half) and 2c + 1. */
static uint32_t fwd_bf16_pair(const uint16_t *row, int64_t c) {
    uint32_t w;
    memcpy(&w, row + 2 * c, sizeof w);
    return w;
}

/* Key block kg (numbered across the batch): its sequence, first key and key count. */
typedef struct fwd_key_block {
    int64_t b, j0, nk;
    fa_seq s;
} fwd_key_block;

static fwd_key_block fwd_key_block_get(const fwd_ctx *cx, int64_t kg) {
    fwd_key_block k;
    k.b = fa_cpu_block_owner(cx->L->k_prefix, cx->p->batch, kg);
    k.s = fa_seq_get(cx->p, k.b);
    k.j0 = (kg - cx->L->k_prefix[k.b]) * FA_FWD_BC;
    k.nk = fa_min64(FA_FWD_BC, k.s.len_k - k.j0);
    return k;
}

#ifdef FA_CPU_BF16
/* A bf16 row's non-finite values: exponent bits all ones, which adding 0x80 to the exponent field carries into
 * the sign bit; two values per 32-bit word (n is even), a vector of words at a time. */
static int fwd_bf16_row_bad(const uint16_t *row, int64_t n) {
    fa_vu acc = { 0 };
    int64_t c = 0;
    for (; c + FA_VL <= n / 2; c += FA_VL) {
        fa_vu w;
        memcpy(&w, row + 2 * c, sizeof w);
        acc |= (w & 0x7f807f80u) + 0x00800080u;
    }
    uint32_t any = 0;
    for (int l = 0; l < FA_VL; l++) any |= acc[l];
    for (; c < n / 2; c++) any |= (fwd_bf16_pair(row, c) & 0x7f807f80u) + 0x00800080u;
    return (any & 0x80008000u) != 0;
}

/* Flags the block's V rows that hold a non-finite value (v_bad) and the block itself (kb_bad); returns the
 * block's row flags. */
static const uint8_t *fwd_flag_bad_v_bf16(const fwd_ctx *cx, int64_t h, int64_t kg, const fwd_key_block *kb) {
    const fa_params *p = cx->p;
    const uint16_t *v16 = p->v.data;
    uint8_t any = 0, *v_bad = cx->L->v_bad + h * cx->tk + fwd_key_token(p, kb->b, &kb->s) + kb->j0;
    for (int64_t j = 0; j < kb->nk; j++) {
        v_bad[j] = (uint8_t)fwd_bf16_row_bad(v16 + fa_offset(p, &p->v, kb->b, kb->s.tok_k, kb->j0 + j, h), p->head_dim);
        any |= v_bad[j];
    }
    cx->L->kb_bad[h * cx->nkb + kg] = any;
    return v_bad;
}

/* fwd_pack_keys for the bf16 products: the K micro-panels hold pairs along head_dim (FA_MR keys side by side
 * for each pair, head_dim / 2 words per key) and V is packed as pairs of keys, pair row t of the block (keys
 * j0 + 2t and j0 + 2t + 1, zero past the sequence, every column up to the row width) in row j0 + t of the
 * packed view. */
static void fwd_pack_keys_bf16(const fwd_ctx *cx, int64_t h, int64_t kg) {
    const fa_params *p = cx->p;
    const int64_t d = p->head_dim, dp = d / 2, w = fa_cpu_row_width(p);
    const fwd_key_block kb = fwd_key_block_get(cx, kg);
    const int64_t b = kb.b, j0 = kb.j0, nk = kb.nk;
    const fa_seq s = kb.s;
    uint32_t *panel = (uint32_t *)(cx->L->kt + (h * cx->nkb + kg) * d * FA_FWD_BC);
    const uint16_t *k16 = p->k.data, *v16 = p->v.data;
    for (int64_t j = 0; j < FA_FWD_BC; j++) {
        uint32_t *dst = panel + j / FA_MR * FA_MR * dp + j % FA_MR;
        if (j < nk) {
            const uint16_t *row = k16 + fa_offset(p, &p->k, b, s.tok_k, j0 + j, h);
            for (int64_t c = 0; c < dp; c++) dst[c * FA_MR] = fwd_bf16_pair(row, c);
        } else {
            for (int64_t c = 0; c < dp; c++) dst[c * FA_MR] = 0;
        }
    }
    const uint8_t *v_bad = fwd_flag_bad_v_bf16(cx, h, kg, &kb);
    for (int64_t t = 0; 2 * t < nk; t++) {
        uint32_t *dst = (uint32_t *)cx->v.data + fa_offset(p, &cx->v, b, s.tok_k, j0 + t, h);
        const int lo_ok = !v_bad[2 * t], hi_ok = 2 * t + 1 < nk && !v_bad[2 * t + 1];
        const uint16_t *lo = v16 + fa_offset(p, &p->v, b, s.tok_k, j0 + 2 * t, h);
        const uint16_t *hi = hi_ok ? v16 + fa_offset(p, &p->v, b, s.tok_k, j0 + 2 * t + 1, h) : lo;
        for (int64_t c = 0; c < d; c++) dst[c] = (lo_ok ? lo[c] : 0u) | (hi_ok ? (uint32_t)hi[c] << 16 : 0u);
        for (int64_t c = d; c < w; c++) dst[c] = 0;
    }
}
#endif

#ifdef FA_CPU_AMX
/* fwd_pack_keys for AMX: K as row-major pairs along head_dim (FA_FWD_BC rows of head_dim / 2 words, zero past
 * the sequence), the A operand of S^T = K Q^T; V^T as pairs of keys (head_dim rows of FA_FWD_BC / 2 words, zero
 * past the sequence and for a row with a non-finite value), the A operand of O^T += V^T P^T. */
static void fwd_pack_keys_amx(const fwd_ctx *cx, int64_t h, int64_t kg) {
    const fa_params *p = cx->p;
    const int64_t d = p->head_dim, dp = d / 2, kp_max = FA_FWD_BC / 2;
    const fwd_key_block kb = fwd_key_block_get(cx, kg);
    const int64_t b = kb.b, j0 = kb.j0, nk = kb.nk;
    const fa_seq s = kb.s;
    uint32_t *panel = (uint32_t *)(cx->L->kt + (h * cx->nkb + kg) * d * FA_FWD_BC);
    const uint16_t *k16 = p->k.data, *v16 = p->v.data;
    for (int64_t j = 0; j < FA_FWD_BC; j++) {
        uint32_t *dst = panel + j * dp;
        if (j < nk)
            memcpy(dst, k16 + fa_offset(p, &p->k, b, s.tok_k, j0 + j, h), sizeof(uint32_t) * (size_t)dp);
        else
            memset(dst, 0, sizeof(uint32_t) * (size_t)dp);
    }
    const uint8_t *v_bad = fwd_flag_bad_v_bf16(cx, h, kg, &kb);
    uint32_t *vt = cx->L->vt + (h * cx->nkb + kg) * d * kp_max;
    for (int64_t t = 0; t < kp_max; t++) {
        const int lo_ok = 2 * t < nk && !v_bad[2 * t], hi_ok = 2 * t + 1 < nk && !v_bad[2 * t + 1];
        const uint16_t *lo = lo_ok ? v16 + fa_offset(p, &p->v, b, s.tok_k, j0 + 2 * t, h) : NULL;
        const uint16_t *hi = hi_ok ? v16 + fa_offset(p, &p->v, b, s.tok_k, j0 + 2 * t + 1, h) : NULL;
        for (int64_t c = 0; c < d; c++) vt[c * kp_max + t] = (lo ? lo[c] : 0u) | (hi ? (uint32_t)hi[c] << 16 : 0u);
    }
}
#endif

/* K panels of key block kg (numbered across the batch) of kv head h, zero past the sequence, and the packed
 * copy of the block's V rows. A V row with a non-finite value is packed as zeros and flagged: inside the P V
 * product its NaN or Inf would reach, through a zero weight, rows that do not see the key (0 * Inf is NaN);
 * the rows that do see it get O = NaN at the end (flashattn.h). */
static void fwd_pack_keys(const fwd_ctx *cx, int64_t h, int64_t kg) {
#ifdef FA_CPU_AMX
    if (fa_cpu_amx_products(cx->p)) {
        fwd_pack_keys_amx(cx, h, kg);
        return;
    }
#endif
#ifdef FA_CPU_BF16
    if (fa_cpu_bf16_products(cx->p)) {
        fwd_pack_keys_bf16(cx, h, kg);
        return;
    }
#endif
    const fa_params *p = cx->p;
    const int64_t d = p->head_dim;
    const fwd_key_block kb = fwd_key_block_get(cx, kg);
    const int64_t b = kb.b, j0 = kb.j0, nk = kb.nk;
    const fa_seq s = kb.s;
    float *panel = cx->L->kt + (h * cx->nkb + kg) * d * FA_FWD_BC;
    float row[256];
    for (int64_t j = 0; j < FA_FWD_BC; j++) {
        float *dst = panel + j / FA_MR * FA_MR * d + j % FA_MR;
        if (j < nk) {
            fa_cpu_load_row(p->k.data, p->dtype, fa_offset(p, &p->k, b, s.tok_k, j0 + j, h), d, row);
            const float kd = p->dtype == FA_E4M3 ? fa_descale(p, 'k', b, h, j0 + j) : 1.0f;
            for (int64_t c = 0; c < d; c++) dst[c * FA_MR] = row[c] * kd;
        } else {
            for (int64_t c = 0; c < d; c++) dst[c * FA_MR] = 0.0f;
        }
    }
    fa_cpu_pack_rows(p, &p->v, &cx->v, b, s.tok_k, j0, j0 + nk, h, 1.0f, 'v');
    uint8_t any = 0;
    for (int64_t j = 0; j < nk; j++) {
        float *vr = (float *)cx->v.data + fa_offset(p, &cx->v, b, s.tok_k, j0 + j, h);
        fa_vf z = fa_vset1(0.0f);
        for (int64_t c = 0; c < d; c += FA_VL) z += fa_vload(vr + c) * 0.0f; /* NaN iff a value is not finite */
        uint8_t bad = 0;
        for (int l = 0; l < FA_VL; l++) bad |= z[l] != z[l];
        if (bad) memset(vr, 0, sizeof(float) * (size_t)d);
        cx->L->v_bad[h * cx->tk + fwd_key_token(p, b, &s) + j0 + j] = bad;
        any |= bad;
    }
    cx->L->kb_bad[h * cx->nkb + kg] = any;
}

/* The running max m of a row moves only when the block's max passes it by more than 2^FWD_STALE_LOG2 in P:
 * against a kept m, P <= 2^8 (fp32 sums and bf16 P hold it with the same relative precision), and alpha = 1, so
 * the accumulator needs no rescale for most blocks after the first (the AMX path skips that pass over O^T). */
#define FWD_STALE_LOG2 8.0f

/* Probabilities of keys j and j + 1 (j even): as floats in rows j and j + 1 of the score tile's column col, or (pcol,
 * the bf16 products) as their bf16 pair in row j / 2 of the pair tile's column pcol. */
static inline void fwd_store_probs(float *col, uint32_t *pcol, int64_t j, fa_vf p0, fa_vf p1) {
#ifdef FA_CPU_BF16
    if (pcol) {
        *(fa_vu_u *)(pcol + j / 2 * FWD_LDS) = (fa_vu_u)fa_bf16_pairs(p0, p1);
        return;
    }
#else
    (void)pcol;
#endif
    fa_vstore(col + j * FWD_LDS, p0);
    fa_vstore(col + (j + 1) * FWD_LDS, p1);
}

/* P = 2^x: to the bf16 pairs of pcol at bf16's precision, else in fp32. */
static inline fa_vf fwd_exp2(const uint32_t *pcol, fa_vf x) {
#ifdef FA_CPU_BF16
    if (pcol) return fa_vexp2_nonpos_bf16(x);
#endif
    return fa_vexp2_nonpos(x);
}

#ifdef FA_CPU_BF16
/* P of one vector of query columns in one pass over the scores (the bf16 products, no score modification): against
 * the rows' kept max m, the block's own max checked on the way. Where no score passes m by more than
 * FWD_STALE_LOG2 (most blocks after a row's first) that is the result: m stays, alpha is 1, the sum grows by the
 * block's. Returns 0 where it is not, or where a row has no max yet; the scores are untouched (P went to pcol) and
 * fwd_softmax's two passes take the vector. The exponent is one multiply-add, scale log2 e and m log2 e folded. */
static int fwd_softmax_kept(fwd_scratch *sc, int64_t v, const float *col, uint32_t *pcol, int64_t nk, fa_vf m,
                            float scale) {
    if (fa_vi_any(m == fa_vset1(-__builtin_inff()))) return 0;
    const fa_vf c = fa_vset1(scale * FA_LOG2E), mc = m * -FA_LOG2E;
    fa_vf top0 = fa_vset1(-__builtin_inff()), top1 = top0, sum0 = fa_vset1(0.0f), sum1 = sum0;
    int64_t j = 0;
    for (; j + 2 <= nk; j += 2) {
        const fa_vf x0 = fa_vfma(fa_vload(col + j * FWD_LDS), c, mc),
                    x1 = fa_vfma(fa_vload(col + (j + 1) * FWD_LDS), c, mc);
        top0 = fa_vmax(top0, x0);
        top1 = fa_vmax(top1, x1);
        const fa_vf p0 = fa_vexp2_nonpos_bf16(x0), p1 = fa_vexp2_nonpos_bf16(x1);
        fwd_store_probs(NULL, pcol, j, p0, p1);
        sum0 += p0;
        sum1 += p1;
    }
    if (j < nk) {
        const fa_vf x0 = fa_vfma(fa_vload(col + j * FWD_LDS), c, mc);
        top0 = fa_vmax(top0, x0);
        const fa_vf p0 = fa_vexp2_nonpos_bf16(x0);
        fwd_store_probs(NULL, pcol, j, p0, fa_vset1(0.0f));
        sum0 += p0;
    }
    /* (a NaN score fails the test below too: its lane keeps m, and the NaN reaches the sum) */
    if (fa_vi_any(fa_vmax(top0, top1) > fa_vset1(FWD_STALE_LOG2))) return 0;
    fa_vstore(sc->l + v * FA_VL, fa_vload(sc->l + v * FA_VL) + (sum0 + sum1));
    fa_vstore(sc->alpha + v * FA_VL, fa_vset1(1.0f));
    return 1;
}
#endif

/*
 * Softmax of one key block, on the transposed scores st (nk keys x query vectors [v0, nv)): the scores times
 * scale (1 where Q came pre-scaled), the score modifications (softcap, ALiBi, mask), the running max (kept while
 * the block's stays within FWD_STALE_LOG2 of it), P = exp2((S - m) log2 e), the running sum (of the fp32 P), and
 * the rescale factors alpha of the accumulator. P replaces the scores as floats, or with pt (the bf16 products) goes
 * to pt as bf16 pairs of keys, pair t in row t, most vectors in one pass (fwd_softmax_kept). Returns whether some
 * row's max moved (an alpha is not 1).
 */
static int fwd_softmax(fwd_scratch *sc, int64_t v0, int64_t nv, int64_t j0, int64_t nk, int masked, float softcap,
                       float alibi_slope, float scale, uint32_t *pt) {
    const int transform = masked || softcap > 0.0f || alibi_slope != 0.0f;
    const float inv_cap = softcap > 0.0f ? 1.0f / softcap : 0.0f;
    const fa_vf log2e = fa_vset1(FA_LOG2E);
    const fa_vf ninf = fa_vset1(-__builtin_inff());
    const fa_vf sv = fa_vset1(scale);
    fa_vi moved = fa_viset1(0);
    for (int64_t v = v0; v < nv; v++) {
        float *col = sc->st + v * FA_VL;
        uint32_t *pcol = pt ? pt + v * FA_VL : NULL;
        fa_vf m_old = fa_vload(sc->m + v * FA_VL), mx = m_old;
#ifdef FA_CPU_BF16
        if (pcol && !transform && fwd_softmax_kept(sc, v, col, pcol, nk, m_old, scale)) continue;
#endif
        if (!transform) { /* four independent chains: one would wait on the max's latency at every key */
            fa_vf mx1 = mx, mx2 = mx, mx3 = mx;
            int64_t j = 0;
            for (; j + 4 <= nk; j += 4) {
                mx = fa_vmax(mx, fa_vload(col + j * FWD_LDS) * sv);
                mx1 = fa_vmax(mx1, fa_vload(col + (j + 1) * FWD_LDS) * sv);
                mx2 = fa_vmax(mx2, fa_vload(col + (j + 2) * FWD_LDS) * sv);
                mx3 = fa_vmax(mx3, fa_vload(col + (j + 3) * FWD_LDS) * sv);
            }
            for (; j < nk; j++) mx = fa_vmax(mx, fa_vload(col + j * FWD_LDS) * sv);
            mx = fa_vmax(fa_vmax(mx, mx1), fa_vmax(mx2, mx3));
        } else {
            const fa_vi lo = *(const fa_vi_u *)(sc->lo + v * FA_VL), hi = *(const fa_vi_u *)(sc->hi + v * FA_VL);
            const fa_vf qpos = fa_vload(sc->qpos + v * FA_VL);
            for (int64_t j = 0; j < nk; j++) {
                fa_vf x = fa_vload(col + j * FWD_LDS) * sv;
                if (softcap > 0.0f) x = fa_vtanh(x * inv_cap) * softcap;
                if (alibi_slope != 0.0f) x = x - alibi_slope * fa_vabs(qpos - (float)(j0 + j));
                if (masked) {
                    fa_vi jj = fa_viset1((int32_t)(j0 + j));
                    x = fa_vselect((jj >= lo) & (jj < hi), x, ninf);
                }
                fa_vstore(col + j * FWD_LDS, x);
                mx = fa_vmax(mx, x);
            }
        }
        /* m moves past a kept value by more than the stale bound, and from -inf to anything finite; -inf - -inf
         * and a NaN compare false (the row keeps its m; a NaN reaches the sum through P) */
        const fa_vi move = (mx - m_old) * log2e > fa_vset1(FWD_STALE_LOG2);
        moved |= move;
        mx = fa_vselect(move, mx, m_old);
        /* a row with nothing visible so far keeps m = -inf; subtracting 0 keeps its P at exactly 0 */
        fa_vf m_use = fa_vselect(mx == ninf, fa_vset1(0.0f), mx);
        fa_vf alpha = fa_vselect(move, fa_vexp2_nonpos((m_old - m_use) * log2e), fa_vset1(1.0f));
        const fa_vf ps = transform ? fa_vset1(1.0f) : sv; /* the transform loop has stored scaled scores */
        fa_vf sum0 = fa_vset1(0.0f), sum1 = fa_vset1(0.0f);
        int64_t j = 0;
        for (; j + 2 <= nk; j += 2) {
            fa_vf p0 = fwd_exp2(pcol, (fa_vload(col + j * FWD_LDS) * ps - m_use) * log2e);
            fa_vf p1 = fwd_exp2(pcol, (fa_vload(col + (j + 1) * FWD_LDS) * ps - m_use) * log2e);
            fwd_store_probs(col, pcol, j, p0, p1);
            sum0 += p0;
            sum1 += p1;
        }
        if (j < nk) {
            fa_vf p0 = fwd_exp2(pcol, (fa_vload(col + j * FWD_LDS) * ps - m_use) * log2e);
            fwd_store_probs(col, pcol, j, p0, fa_vset1(0.0f));
            sum0 += p0;
        }
        fa_vstore(sc->l + v * FA_VL, fa_vload(sc->l + v * FA_VL) * alpha + (sum0 + sum1));
        fa_vstore(sc->m + v * FA_VL, mx);
        fa_vstore(sc->alpha + v * FA_VL, alpha);
    }
    return fa_vi_any(moved);
}

/* S^T = K x Q^T: (keys rounded to FA_MR) x (ncols) over head_dim; qt starts at a strip. */
FA_NOINLINE void fwd_scores(const float *panel, const float *qt, float *st, int64_t m, int64_t ncols, int64_t d,
                            fa_prefetch pf) {
    const fa_layout_a la = { 1, FA_MR, FA_MR * d };
    const fa_layout_b lb = { FA_VL, FA_VL * d };
    fa_gemm(m, ncols, d, panel, la, qt, lb, st, FWD_LDS, FA_UK_SET, NULL, pf);
}

/* O = diag(alpha) O + P V: (rows) x (row width) over nk keys. */
FA_NOINLINE void fwd_pv(const float *st, const float *v, int64_t ldv, float *o, int64_t ldo, int64_t rows, int64_t w,
                        int64_t nk, const float *alpha, fa_prefetch pf) {
    const fa_layout_a la = { 1, FWD_LDS, FA_MR };
    const fa_layout_b lb = { ldv, FA_VL };
    fa_gemm(rows, w, nk, st, la, v, lb, o, ldo, FA_UK_SCALE_ADD, alpha, pf);
}

#ifdef FA_CPU_BF16
/* fwd_scores on bf16 pairs: K panels and Q^T strips of head_dim / 2 words per key and query. */
FA_NOINLINE void fwd_scores_bf16(const uint32_t *panel, const uint32_t *qt, float *st, int64_t m, int64_t ncols,
                                 int64_t d, fa_prefetch pf) {
    const fa_layout_a la = { 1, FA_MR, FA_MR * d / 2 };
    const fa_layout_b lb = { FA_VL, FA_VL * d / 2 };
    fa_gemm_bf16(m, ncols, d / 2, panel, la, qt, lb, st, FWD_LDS, FA_UK_SET, NULL, pf);
}

/* fwd_pv on bf16 pairs: P as pairs of keys (fwd_softmax's pairs on the transposed tile), V as pair rows at stride ldv
 * words. */
FA_NOINLINE void fwd_pv_bf16(const uint32_t *pt, const uint32_t *v, int64_t ldv, float *o, int64_t ldo, int64_t rows,
                             int64_t w, int64_t nk, const float *alpha, fa_prefetch pf) {
    const fa_layout_a la = { 1, FWD_LDS, FA_MR };
    const fa_layout_b lb = { ldv, FA_VL };
    fa_gemm_bf16(rows, w, fa_ceil_div(nk, 2), pt, la, v, lb, o, ldo, FA_UK_SCALE_ADD, alpha, pf);
}
#endif

/* Q^T of rows [i0, i0 + mrows) of sequence b, head h, in strips of ncols columns, zero past the valid rows:
 * pre-scaled fp32, or (bf16 products) unscaled bf16 pairs along head_dim. */
static void fwd_load_qt(const fa_params *p, fwd_scratch *sc, int64_t b, const fa_seq *s, int64_t h, int64_t i0,
                        int64_t mrows, int64_t ncols, int bf16) {
    const int64_t d = p->head_dim;
    if (bf16) {
        uint32_t *qt = (uint32_t *)sc->qt;
        const uint16_t *q16 = p->q.data;
        for (int64_t i = 0; i < ncols; i++) {
            uint32_t *dst = qt + i / FA_VL * FA_VL * (d / 2) + i % FA_VL;
            const uint16_t *row = i < mrows ? q16 + fa_offset(p, &p->q, b, s->tok_q, i0 + i, h) : NULL;
            for (int64_t c = 0; c < d / 2; c++) dst[c * FA_VL] = row ? fwd_bf16_pair(row, c) : 0u;
        }
        return;
    }
    float row[256];
    for (int64_t i = 0; i < ncols; i++) {
        float *dst = sc->qt + i / FA_VL * FA_VL * d + i % FA_VL;
        if (i < mrows) {
            fa_cpu_load_row(p->q.data, p->dtype, fa_offset(p, &p->q, b, s->tok_q, i0 + i, h), d, row);
            const float mul = p->softmax_scale * (p->dtype == FA_E4M3 ? fa_descale(p, 'q', b, h, i0 + i) : 1.0f);
            for (int64_t c = 0; c < d; c++) dst[c * FA_VL] = row[c] * mul;
        } else {
            for (int64_t c = 0; c < d; c++) dst[c * FA_VL] = 0.0f;
        }
    }
}

static void fwd_block(const fwd_ctx *cx, fwd_scratch *sc, int64_t b, int64_t h, int64_t ib) {
    const fa_params *p = cx->p;
    const int64_t d = p->head_dim, w = fa_cpu_row_width(p), ldo = fa_cpu_row_stride(p);
    const fa_seq s = fa_seq_get(p, b);
    const int64_t i0 = ib * FA_FWD_BR, mrows = fa_min64(FA_FWD_BR, s.len_q - i0);
    const int64_t kvh = h / cx->group;
    /* columns of S^T computed: whole vectors, and at least the rows the P V product covers */
    const int64_t rows = fa_round_up(mrows, FA_MR), ncols = fa_round_up(rows, FA_VL);

    /* visible key range of each row (empty rows: [0, 0)); the union over the valid rows is [jbeg, jend) */
    int64_t jbeg = INT64_MAX, jend = 0;
    for (int64_t i = 0; i < FA_FWD_BR; i++) {
        int64_t lo = 0, hi = 0;
        if (i < mrows) fa_key_range(i0 + i, s.len_q, s.len_k, p->window_left, p->window_right, &lo, &hi);
        if (lo < hi) {
            jbeg = fa_min64(jbeg, lo);
            jend = fa_max64(jend, hi);
        } else {
            lo = hi = 0;
        }
        sc->lo[i] = (int32_t)lo;
        sc->hi[i] = (int32_t)hi;
        sc->qpos[i] = (float)(i0 + i + s.len_k - s.len_q);
        sc->m[i] = -__builtin_inff();
        sc->l[i] = 0.0f;
    }

    uint8_t v_bad = 0; /* a key block of this task holds a V row with a non-finite value */
    const int bf16 = fa_cpu_bf16_products(p), amx = fa_cpu_amx_products(p);
    (void)amx; /* read only on the AMX level */
    if (jbeg < jend) {
        fwd_load_qt(p, sc, b, &s, h, i0, mrows, ncols, bf16);
        for (int64_t i = 0; i < rows; i++) memset(sc->o + i * ldo, 0, sizeof(float) * w);
#ifdef FA_CPU_AMX
        if (amx) {
            fa_amx_begin();
            memset(sc->ot, 0, sizeof(float) * (size_t)(w * FWD_LDS));
        }
#endif
        const float slope = fa_alibi_slope(p, b, h);
        const uint8_t *kb_bad = cx->L->kb_bad + kvh * cx->nkb + cx->L->k_prefix[b];
        const float *kt = cx->L->kt + (kvh * cx->nkb + cx->L->k_prefix[b]) * d * FA_FWD_BC;
        const int64_t kb_end = fa_ceil_div(jend, FA_FWD_BC);
        for (int64_t kb = jbeg / FA_FWD_BC; kb < kb_end; kb++) {
            const int64_t j0 = kb * FA_FWD_BC, nk = fa_min64(FA_FWD_BC, s.len_k - j0);
            v_bad |= kb_bad[kb];
            /* rows before qlo see nothing of this block (their statistics stay, alpha = 1): the block's work
             * starts at c0, the multiple of FA_QALIGN at or below qlo (under a causal mask, about half of a
             * diagonal block) */
            int64_t qlo = 0;
            while (qlo < mrows && sc->hi[qlo] <= j0) qlo++;
            const int64_t c0 = qlo / FA_QALIGN * FA_QALIGN;
            int full = 1; /* every row from c0 on sees the whole block: no mask */
            for (int64_t i = c0; i < mrows && full; i++) full = sc->lo[i] <= j0 && sc->hi[i] >= j0 + nk;
            const float *vrow = (const float *)cx->v.data + fa_offset(p, &cx->v, b, s.tok_k, j0, kvh);
            /* V of this block during the scores, K of the next block during P V */
            const int64_t v_rows = bf16 ? fa_ceil_div(nk, 2) : nk;
            const fa_prefetch pf_v = fa_prefetch_range(vrow, (int64_t)sizeof(float) * v_rows * cx->v.stride_seq);
            const fa_prefetch pf_k = fa_prefetch_range(kb + 1 < kb_end ? kt + (kb + 1) * d * FA_FWD_BC : NULL,
                                                       (int64_t)sizeof(float) * d * FA_FWD_BC);
#ifdef FA_CPU_AMX
            if (amx) {
                const int64_t kp = fa_ceil_div(nk, 2), kp16 = fa_round_up(kp, 16), nq = ncols - c0;
                /* S^T = K Q^T: K rows of the block, Q^T strips from c0 */
                fa_amx_gemm(fa_round_up(nk, 16), nq, d / 2, (const uint32_t *)(kt + kb * d * FA_FWD_BC), d / 2,
                            (const uint32_t *)sc->qt + c0 / FA_VL * FA_VL * (d / 2), FA_VL, FA_VL * (d / 2),
                            sc->st + c0, FWD_LDS, 0);
                const int moved = fwd_softmax(sc, c0 / FA_VL, ncols / FA_VL, j0, nk, !full, p->softcap, slope,
                                              p->softmax_scale, sc->pt);
                uint32_t *pt = sc->pt + c0;
                for (int64_t t = kp; t < kp16; t++) memset(pt + t * FWD_LDS, 0, sizeof(uint32_t) * (size_t)nq);
                /* O^T = O^T diag(alpha) + V^T P^T over the columns from c0 (alpha = 1 unless a max moved) */
                for (int64_t c = 0; moved && c < w; c++)
                    for (int64_t q = 0; q < nq; q += FA_VL) {
                        float *x = sc->ot + c * FWD_LDS + c0 + q;
                        fa_vstore(x, fa_vload(x) * fa_vload(sc->alpha + c0 + q));
                    }
                fa_amx_gemm(w, nq, kp16, cx->L->vt + (kvh * cx->nkb + cx->L->k_prefix[b] + kb) * d * (FA_FWD_BC / 2),
                            FA_FWD_BC / 2, pt, FWD_LDS, FA_VL, sc->ot + c0, FWD_LDS, 1);
                continue;
            }
#endif
#ifdef FA_CPU_BF16
            if (bf16) {
                fwd_scores_bf16((const uint32_t *)(kt + kb * d * FA_FWD_BC),
                                (const uint32_t *)sc->qt + c0 / FA_VL * FA_VL * (d / 2), sc->st + c0,
                                fa_round_up(nk, FA_MR), ncols - c0, d, pf_v);
                fwd_softmax(sc, c0 / FA_VL, ncols / FA_VL, j0, nk, !full, p->softcap, slope, p->softmax_scale, sc->pt);
                fwd_pv_bf16(sc->pt + c0, (const uint32_t *)vrow, cx->v.stride_seq, sc->o + c0 * ldo, ldo, rows - c0, w,
                            nk, sc->alpha + c0, pf_k);
                continue;
            }
#endif
            fwd_scores(kt + kb * d * FA_FWD_BC, sc->qt + c0 / FA_VL * FA_VL * d, sc->st + c0, fa_round_up(nk, FA_MR),
                       ncols - c0, d, pf_v);
            fwd_softmax(sc, c0 / FA_VL, ncols / FA_VL, j0, nk, !full, p->softcap, slope, 1.0f, NULL);
            fwd_pv(sc->st + c0, vrow, cx->v.stride_seq, sc->o + c0 * ldo, ldo, rows - c0, w, nk, sc->alpha + c0, pf_k);
        }
    }

#ifdef FA_CPU_AMX
    if (amx && jbeg < jend) { /* O from its transpose */
        fa_amx_end();
        for (int64_t i = 0; i < mrows; i++)
            for (int64_t c = 0; c < w; c++) sc->o[i * ldo + c] = sc->ot[c * FWD_LDS + i];
    }
#endif
    /* A row is empty when the mask leaves it no key, never because of its sum: l is NaN after a NaN or +Inf
     * score and 0 when every visible score is -Inf (fp32 overflow), and both rows are NaN. */
    const uint8_t *v_bad_row = cx->L->v_bad + kvh * cx->tk + fwd_key_token(p, b, &s);
    float nan_row[256];
    for (int64_t c = 0; c < d; c++) nan_row[c] = __builtin_nanf("");
    for (int64_t i = 0; i < mrows; i++) {
        const int64_t oo = fa_offset(p, &p->o, b, s.tok_q, i0 + i, h);
        const int empty = sc->lo[i] >= sc->hi[i];
        int nan = !empty && !(sc->l[i] > 0.0f);
        for (int64_t j = sc->lo[i]; v_bad && !nan && j < sc->hi[i]; j++) nan = v_bad_row[j];
        if (empty)
            fa_cpu_store_zero_row(p->o.data, fa_out_dtype(p), oo, d);
        else if (nan)
            fa_cpu_store_row(p->o.data, fa_out_dtype(p), oo, d, nan_row, 1.0f);
        else
            fa_cpu_store_row(p->o.data, fa_out_dtype(p), oo, d, sc->o + i * ldo, 1.0f / sc->l[i]);
        if (p->lse) {
            float lse = empty ? -__builtin_inff() : (float)((double)sc->m[i] + log((double)sc->l[i]));
            if (!empty && !(sc->l[i] > 0.0f)) lse = __builtin_nanf("");
            p->lse[fa_lse_index(p, b, s.tok_q, i0 + i, h)] = lse;
        }
    }
}

fa_status fa_cpu_fwd(const fa_params *p, const fa_exec *x) {
    if (p->head_dim > 256 || p->head_dim % 8 != 0)
        return fa_fail(FA_ERR_UNSUPPORTED, "cpu backend: head_dim (%d) must be a multiple of 8 up to 256", p->head_dim);
    const int threads = fa_cpu_threads(p, x->num_threads, 0);
    fwd_layout L;
    fa_workspace ws;
    fa_status st = fa_workspace_acquire(x, fwd_layout_carve(p, threads, NULL, &L), &ws);
    if (st != FA_OK) return st;
    fwd_layout_carve(p, threads, ws.base, &L);
    fa_cpu_block_prefix(p, 0, FA_FWD_BR, L.q_prefix);
    fa_cpu_block_prefix(p, 1, FA_FWD_BC, L.k_prefix);

    fwd_ctx cx;
    cx.p = p;
    cx.L = &L;
    cx.v = fa_cpu_packed_view(p, L.v_packed, 1);
    cx.nkb = L.k_prefix[p->batch];
    cx.group = p->heads_q / p->heads_kv;
    cx.tk = fa_cpu_tokens(p, 1);

    const int64_t n_pack = (int64_t)p->heads_kv * cx.nkb;
    const int64_t nqb = L.q_prefix[p->batch], heads = p->heads_q;
    const int64_t n_tasks = nqb * heads;
    const int dense = !fa_is_varlen(p);
    const int64_t per_level = (int64_t)p->batch * heads, levels = fa_ceil_div(p->seqlen_q, FA_FWD_BR);

#ifdef _OPENMP
#pragma omp parallel num_threads(threads)
#endif
    {
        fa_arena a = { L.scratch + L.scratch_bytes * (size_t)fa_cpu_thread_id(), 0 };
        fwd_scratch sc = fwd_scratch_carve(p, &a);
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t t = 0; t < n_pack; t++) fwd_pack_keys(&cx, t / cx.nkb, t % cx.nkb);
#ifdef _OPENMP
#pragma omp for schedule(dynamic, 1)
#endif
        for (int64_t t = 0; t < n_tasks; t++) {
            int64_t b, h, ib;
            if (dense) { /* the last row blocks (the costliest under a causal mask) of every sequence first */
                int64_t level = t / per_level, r = t % per_level;
                ib = levels - 1 - level;
                b = r / heads;
                h = r % heads;
            } else {
                int64_t g = nqb - 1 - t / heads;
                h = t % heads;
                b = fa_cpu_block_owner(L.q_prefix, p->batch, g);
                ib = g - L.q_prefix[b];
            }
            fwd_block(&cx, &sc, b, h, ib);
        }
    }
    fa_workspace_release(&ws);
    return FA_OK;
}
