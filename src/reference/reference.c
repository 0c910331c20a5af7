/* SPDX-License-Identifier: Apache-2.0 */
/*
 * reference.c - the fp64 oracle: forward and backward of exactly the function flashattn.h defines,
 * computed row by row in double precision. Small and obviously right is the point; speed is not.
 *
 * Per query row i of (batch b, query head h): scores s_j for every key, softmax in fp64, O and LSE.
 * The backward uses the exact row quantities (P, dP, D_i = sum_j P_ij dP_ij) and chains through the
 * softcap (d/dx c*tanh(x/c) = 1 - tanh^2) and the scale. dK and dV of a kv head accumulate over every query
 * head of its group.
 */
#include <stdlib.h>

#include "internal.h"

/* Row r of head h of a packed (tokens, heads, head_dim) fp64 array. */
static inline const double *row_of(const double *base, int64_t token, int64_t heads, int64_t h, int64_t d) {
    return base + (token * heads + h) * d;
}

static double dot(const double *a, const double *b, int64_t n) {
    double s = 0.0;
    for (int64_t c = 0; c < n; c++) s += a[c] * b[c];
    return s;
}

/* Scores of one query row after scale, softcap, mask and ALiBi; masked entries are -inf. Writes the
 * pre-mask softcapped tanh value into `capped` (for the backward) when not NULL. Returns the row max (NaN
 * scores do not take part; softmax_row lets them through) and the number of visible keys in *visible. */
static double score_row(const fa_params *p, const fa_seq *s, int64_t b, int64_t h, int64_t i, const double *q,
                        const double *k, double *score, double *capped, int64_t *visible) {
    const int64_t d = p->head_dim, hkv = h / (p->heads_q / p->heads_kv);
    const double scale = p->softmax_scale, cap = p->softcap, slope = fa_alibi_slope(p, b, h);
    const double *qi = row_of(q, s->tok_q + i, p->heads_q, h, d);
    double max = -INFINITY;
    *visible = 0;
    for (int64_t j = 0; j < s->len_k; j++) {
        double x = scale * dot(qi, row_of(k, s->tok_k + j, p->heads_kv, hkv, d), d);
        if (cap > 0) {
            double t = tanh(x / cap);
            if (capped) capped[j] = t;
            x = cap * t;
        }
        if (!fa_key_visible(i, j, s->len_q, s->len_k, p->window_left, p->window_right)) {
            score[j] = -INFINITY;
            continue;
        }
        x -= slope * (double)fa_alibi_distance(i, j, s->len_q, s->len_k);
        score[j] = x;
        ++*visible;
        if (x > max) max = x;
    }
    return max;
}

/* Turns the scores of row i into probabilities in place: exactly 0 for masked keys, IEEE arithmetic for the
 * visible ones (a NaN or +inf score, or -inf everywhere, makes every probability and the result NaN).
 * Returns the logsumexp: -inf for a row that sees no key. */
static double softmax_row(const fa_params *p, const fa_seq *s, int64_t i, double *score, double max, int64_t visible) {
    const int64_t n = s->len_k;
    if (visible == 0) {
        for (int64_t j = 0; j < n; j++) score[j] = 0.0;
        return -INFINITY;
    }
    if (max == -INFINITY) max = NAN; /* every visible score is -inf: exp(-inf - -inf) */
    double sum = 0.0;
    for (int64_t j = 0; j < n; j++) {
        score[j] = fa_key_visible(i, j, s->len_q, n, p->window_left, p->window_right) ? exp(score[j] - max) : 0.0;
        sum += score[j];
    }
    for (int64_t j = 0; j < n; j++) score[j] /= sum;
    return max + log(sum);
}

static int finite_row(const double *x, int64_t n) {
    for (int64_t c = 0; c < n; c++)
        if (!isfinite(x[c])) return 0;
    return 1;
}

static int64_t tokens(const fa_params *p, int query) {
    if (fa_is_varlen(p)) return query ? p->total_q : p->total_k;
    return (int64_t)p->batch * (query ? p->seqlen_q : p->seqlen_k);
}

static int64_t max_len_k(const fa_params *p) {
    if (!fa_is_varlen(p)) return p->seqlen_k;
    int64_t m = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        fa_seq s = fa_seq_get(p, b);
        if (s.len_k > m) m = s.len_k;
    }
    return m;
}

/* The forward's rows with the caller's score buffer of max(1, max_len_k(p)) doubles: it cannot fail, so a
 * caller that has written something before (the decode call's cache) can allocate first. q, k, v are not
 * const: GCC would check at each call, and doubt, that every element of a malloc'ed input was written. */
static void fwd_f64_rows(const fa_params *p, double *q, double *k, double *v, double *o, double *lse, double *score) {
    const int64_t d = p->head_dim;
    for (int64_t b = 0; b < p->batch; b++) {
        fa_seq s = fa_seq_packed(p, b);
        for (int64_t h = 0; h < p->heads_q; h++) {
            const int64_t hkv = h / (p->heads_q / p->heads_kv);
            for (int64_t i = 0; i < s.len_q; i++) {
                int64_t visible;
                double max = score_row(p, &s, b, h, i, q, k, score, NULL, &visible);
                double l = softmax_row(p, &s, i, score, max, visible);
                double *oi = (double *)row_of(o, s.tok_q + i, p->heads_q, h, d);
                int bad_v = 0;
                for (int64_t c = 0; c < d; c++) oi[c] = 0.0;
                for (int64_t j = 0; j < s.len_k; j++) {
                    if (!fa_key_visible(i, j, s.len_q, s.len_k, p->window_left, p->window_right)) continue;
                    const double *vj = row_of(v, s.tok_k + j, p->heads_kv, hkv, d);
                    bad_v |= !finite_row(vj, d);
                    for (int64_t c = 0; c < d; c++) oi[c] += score[j] * vj[c];
                }
                if (bad_v) /* flashattn.h: a visible key with a non-finite V makes the whole row NaN */
                    for (int64_t c = 0; c < d; c++) oi[c] = NAN;
                if (lse) lse[fa_lse_index(p, b, s.tok_q, i, h)] = l;
            }
        }
    }
}

fa_status fa_reference_fwd_f64(const fa_params *p, const double *q, const double *k, const double *v, double *o,
                               double *lse) {
    const int64_t lk = max_len_k(p) > 0 ? max_len_k(p) : 1;
    double *score = malloc((size_t)lk * sizeof(double));
    if (!score) return fa_fail(FA_ERR_OUT_OF_MEMORY, "reference: out of host memory");
    fwd_f64_rows(p, (double *)q, (double *)k, (double *)v, o, lse, score);
    free(score);
    return FA_OK;
}

fa_status fa_reference_bwd_f64(const fa_params *p, const double *q, const double *k, const double *v,
                               const double *dout, double *dq, double *dk, double *dv) {
    const int64_t d = p->head_dim, lk = max_len_k(p) > 0 ? max_len_k(p) : 1;
    const int64_t nq = tokens(p, 1) * p->heads_q * d, nk = tokens(p, 0) * p->heads_kv * d;
    for (int64_t x = 0; x < nq; x++) dq[x] = 0.0;
    for (int64_t x = 0; x < nk; x++) dk[x] = dv[x] = 0.0;
    double *prob = malloc((size_t)lk * sizeof(double)), *capped = malloc((size_t)lk * sizeof(double));
    if (!prob || !capped) {
        free(prob);
        free(capped);
        return fa_fail(FA_ERR_OUT_OF_MEMORY, "reference: out of host memory");
    }
    for (int64_t b = 0; b < p->batch; b++) {
        fa_seq s = fa_seq_packed(p, b);
        for (int64_t h = 0; h < p->heads_q; h++) {
            const int64_t hkv = h / (p->heads_q / p->heads_kv);
            for (int64_t i = 0; i < s.len_q; i++) {
                int64_t visible;
                double max = score_row(p, &s, b, h, i, q, k, prob, capped, &visible);
                softmax_row(p, &s, i, prob, max, visible);
                if (visible == 0) continue; /* sees no key: zero gradients */
                const double *qi = row_of(q, s.tok_q + i, p->heads_q, h, d);
                const double *doi = row_of(dout, s.tok_q + i, p->heads_q, h, d);
                double *dqi = dq + (qi - q);
                /* D_i = sum_j P_ij dP_ij with dP_ij = dO_i . V_j  (equals rowsum(dO_i * O_i)) */
                double D = 0.0;
                for (int64_t j = 0; j < s.len_k; j++)
                    if (fa_key_visible(i, j, s.len_q, s.len_k, p->window_left, p->window_right))
                        D += prob[j] * dot(doi, row_of(v, s.tok_k + j, p->heads_kv, hkv, d), d);
                for (int64_t j = 0; j < s.len_k; j++) {
                    if (!fa_key_visible(i, j, s.len_q, s.len_k, p->window_left, p->window_right)) continue;
                    const int64_t off = (s.tok_k + j) * p->heads_kv * d + hkv * d;
                    double dp = dot(doi, v + off, d);
                    double ds = prob[j] * (dp - D);
                    if (p->softcap > 0) ds *= 1.0 - capped[j] * capped[j];
                    ds *= p->softmax_scale;
                    for (int64_t c = 0; c < d; c++) {
                        dv[off + c] += prob[j] * doi[c];
                        dqi[c] += ds * k[off + c];
                        dk[off + c] += ds * qi[c];
                    }
                }
            }
        }
    }
    free(prob);
    free(capped);
    return FA_OK;
}

/* ---- the FA_BACKEND_REFERENCE backend: strided low-precision tensors <-> packed fp64 ---- */

/* A tensor as packed fp64 rows; which ('q', 'k', 'v', or 0) names its descales for e4m3 inputs. */
static double *gather(const fa_params *p, const fa_tensor *t, int query, int which) {
    const int64_t heads = query ? p->heads_q : p->heads_kv, d = p->head_dim;
    double *out = malloc((size_t)(tokens(p, query) * heads * d + 1) * sizeof(double));
    if (!out) return NULL;
    for (int64_t b = 0; b < p->batch; b++) {
        fa_seq s = fa_seq_get(p, b), ps = fa_seq_packed(p, b);
        const int64_t len = query ? s.len_q : s.len_k, tok = query ? s.tok_q : s.tok_k;
        const int64_t tok0 = query ? ps.tok_q : ps.tok_k;
        for (int64_t r = 0; r < len; r++)
            for (int64_t h = 0; h < heads; h++) {
                int64_t src = fa_offset(p, t, b, tok, r, h);
                double *dst = out + ((tok0 + r) * heads + h) * d;
                const double scale = p->dtype == FA_E4M3 && which ? fa_descale(p, which, b, h, r) : 1.0;
                for (int64_t c = 0; c < d; c++) dst[c] = fa_load(t->data, p->dtype, src + c) * scale;
            }
    }
    return out;
}

static void scatter(const fa_params *p, const fa_tensor *t, int query, const double *src) {
    const int64_t heads = query ? p->heads_q : p->heads_kv, d = p->head_dim;
    const fa_dtype dt = t == &p->o ? fa_out_dtype(p) : p->dtype;
    for (int64_t b = 0; b < p->batch; b++) {
        fa_seq s = fa_seq_get(p, b), ps = fa_seq_packed(p, b);
        const int64_t len = query ? s.len_q : s.len_k, tok = query ? s.tok_q : s.tok_k;
        const int64_t tok0 = query ? ps.tok_q : ps.tok_k;
        for (int64_t r = 0; r < len; r++)
            for (int64_t h = 0; h < heads; h++) {
                int64_t dst = fa_offset(p, t, b, tok, r, h);
                const double *row = src + ((tok0 + r) * heads + h) * d;
                for (int64_t c = 0; c < d; c++) fa_store(t->data, dt, dst + c, (float)row[c]);
            }
    }
}

static size_t nbytes(int64_t tok, int64_t heads, int64_t d) {
    return (size_t)(tok * heads * d + 1) * sizeof(double);
}

fa_status fa_reference_fwd(const fa_params *p) {
    fa_status st = FA_OK;
    double *q = gather(p, &p->q, 1, 'q'), *k = gather(p, &p->k, 0, 'k'), *v = gather(p, &p->v, 0, 'v');
    double *o = malloc(nbytes(tokens(p, 1), p->heads_q, p->head_dim));
    double *lse = malloc(nbytes(tokens(p, 1), p->heads_q, 1));
    if (!q || !k || !v || !o || !lse) {
        st = fa_fail(FA_ERR_OUT_OF_MEMORY, "reference: out of host memory");
    } else {
        st = fa_reference_fwd_f64(p, q, k, v, o, lse);
    }
    if (st == FA_OK) {
        scatter(p, &p->o, 1, o);
        if (p->lse)
            for (int64_t b = 0; b < p->batch; b++) {
                fa_seq s = fa_seq_get(p, b);
                for (int64_t h = 0; h < p->heads_q; h++)
                    for (int64_t i = 0; i < s.len_q; i++) {
                        int64_t x = fa_lse_index(p, b, s.tok_q, i, h);
                        p->lse[x] = (float)lse[x];
                    }
            }
    }
    free(q), free(k), free(v), free(o), free(lse);
    return st;
}

fa_status fa_reference_bwd(const fa_params *p) {
    fa_status st = FA_OK;
    double *q = gather(p, &p->q, 1, 'q'), *k = gather(p, &p->k, 0, 'k'), *v = gather(p, &p->v, 0, 'v');
    double *dout = gather(p, &p->dout, 1, 0);
    double *dq = malloc(nbytes(tokens(p, 1), p->heads_q, p->head_dim));
    double *dk = malloc(nbytes(tokens(p, 0), p->heads_kv, p->head_dim));
    double *dv = malloc(nbytes(tokens(p, 0), p->heads_kv, p->head_dim));
    if (!q || !k || !v || !dout || !dq || !dk || !dv) {
        st = fa_fail(FA_ERR_OUT_OF_MEMORY, "reference: out of host memory");
    } else {
        st = fa_reference_bwd_f64(p, q, k, v, dout, dq, dk, dv);
    }
    if (st == FA_OK) {
        scatter(p, &p->dq, 1, dq);
        scatter(p, &p->dk, 0, dk);
        scatter(p, &p->dv, 0, dv);
    }
    free(q), free(k), free(v), free(dout), free(dq), free(dk), free(dv);
    return st;
}

/* ---- decoding with a KV cache: append (rotary on the new keys), gather the attended rows, attend ---- */

/* Rotates the first rotary_dim entries of row x (fp64) to position pos. */
static void rotate_f64(const fa_kvcache *kv, fa_dtype dt, int64_t pos, double *x) {
    const int64_t half = kv->rotary_dim / 2;
    for (int64_t t = 0; t < half; t++) {
        int64_t a, c;
        fa_rotary_pair(kv, t, &a, &c);
        const double cs = fa_load(kv->rotary_cos, dt, pos * half + t), sn = fa_load(kv->rotary_sin, dt, pos * half + t);
        const double x0 = x[a], x1 = x[c];
        x[a] = x0 * cs - x1 * sn;
        x[c] = x0 * sn + x1 * cs;
    }
}

fa_status fa_reference_fwd_kvcache(const fa_params *p, const fa_kvcache *kv) {
    const int64_t d = p->head_dim, hq = p->heads_q, hkv = p->heads_kv, sq = p->seqlen_q, n_new = p->seqlen_k;
    const int64_t tq = (int64_t)p->batch * sq;
    int64_t tk = 0, max_k = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        const int64_t len = fa_kv_seqlen(kv, b) + n_new - fa_kv_leftpad(kv, b);
        tk += len;
        if (len > max_k) max_k = len;
    }
    /* The attention runs as a varlen batch over the gathered rows: sequence b's keys are its cache rows
     * P .. L + N - 1, packed. Everything is allocated before the cache is written. */
    int32_t *cu_q = malloc(sizeof(int32_t) * (size_t)(p->batch + 1)),
            *cu_k = malloc(sizeof(int32_t) * (size_t)(p->batch + 1));
    double *q = malloc(nbytes(tq, hq, d)), *o = malloc(nbytes(tq, hq, d)), *lse = malloc(nbytes(tq, hq, 1));
    double *k = malloc(nbytes(tk, hkv, d)), *v = malloc(nbytes(tk, hkv, d)), *row = malloc(nbytes(1, 1, d));
    double *score = malloc(nbytes(max_k, 1, 1));
    fa_status st = FA_OK;
    if (!cu_q || !cu_k || !q || !o || !lse || !k || !v || !row || !score) {
        st = fa_fail(FA_ERR_OUT_OF_MEMORY, "reference: out of host memory");
        goto done;
    }
    /* 1. append: the new rows, k rotated in fp64, rounded once to the cache's dtype */
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t j = 0; j < n_new; j++) {
            const int64_t r = fa_kv_seqlen(kv, b) + j;
            for (int64_t h = 0; h < hkv; h++) {
                const int64_t src = b * p->k.stride_batch + j * p->k.stride_seq + h * p->k.stride_head;
                for (int64_t c = 0; c < d; c++) row[c] = fa_load(p->k.data, p->dtype, src + c);
                if (kv->rotary_cos) rotate_f64(kv, p->dtype, r, row);
                const int64_t dk = fa_kv_offset(kv, &kv->k_cache, b, r, h),
                              dv = fa_kv_offset(kv, &kv->v_cache, b, r, h);
                const int64_t sv = b * p->v.stride_batch + j * p->v.stride_seq + h * p->v.stride_head;
                for (int64_t c = 0; c < d; c++) {
                    fa_store(kv->k_cache.data, p->dtype, dk + c, (float)row[c]);
                    fa_store(kv->v_cache.data, p->dtype, dv + c, fa_load(p->v.data, p->dtype, sv + c));
                }
            }
        }
    /* 2. gather the attended rows and q (rotated at its positions and rounded to dtype, like the keys) */
    cu_q[0] = cu_k[0] = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        const int64_t pad = fa_kv_leftpad(kv, b), end = fa_kv_seqlen(kv, b) + n_new;
        cu_q[b + 1] = (int32_t)((b + 1) * sq);
        cu_k[b + 1] = (int32_t)(cu_k[b] + end - pad);
        for (int64_t r = pad; r < end; r++)
            for (int64_t h = 0; h < hkv; h++) {
                const int64_t ok = fa_kv_offset(kv, &kv->k_cache, b, r, h),
                              ov = fa_kv_offset(kv, &kv->v_cache, b, r, h);
                double *kd = k + ((cu_k[b] + r - pad) * hkv + h) * d, *vd = v + ((cu_k[b] + r - pad) * hkv + h) * d;
                for (int64_t c = 0; c < d; c++) {
                    kd[c] = fa_load(kv->k_cache.data, p->dtype, ok + c);
                    vd[c] = fa_load(kv->v_cache.data, p->dtype, ov + c);
                }
            }
        for (int64_t i = 0; i < sq; i++)
            for (int64_t h = 0; h < hq; h++) {
                double *qd = q + ((b * sq + i) * hq + h) * d;
                const int64_t src = b * p->q.stride_batch + i * p->q.stride_seq + h * p->q.stride_head;
                for (int64_t c = 0; c < d; c++) qd[c] = fa_load(p->q.data, p->dtype, src + c);
                if (kv->rotary_cos) {
                    rotate_f64(kv, p->dtype, fa_kv_q_position(p, kv, b, i), qd);
                    for (int64_t c = 0; c < kv->rotary_dim; c++) qd[c] = fa_round_dtype(p->dtype, (float)qd[c]);
                }
            }
    }
    /* 3. attention over the packed rows; lse comes back as (heads_q, total_q) */
    fa_params a = *p;
    a.cu_seqlens_q = cu_q;
    a.cu_seqlens_k = cu_k;
    a.total_q = tq;
    a.total_k = tk;
    a.seqlen_k = (int32_t)max_k;
    fwd_f64_rows(&a, q, k, v, o, lse, score);
    for (int64_t b = 0; b < p->batch; b++)
        for (int64_t i = 0; i < sq; i++)
            for (int64_t h = 0; h < hq; h++) {
                const int64_t dst = b * p->o.stride_batch + i * p->o.stride_seq + h * p->o.stride_head;
                const double *od = o + ((b * sq + i) * hq + h) * d;
                for (int64_t c = 0; c < d; c++) fa_store(p->o.data, p->dtype, dst + c, (float)od[c]);
                if (p->lse) p->lse[(b * hq + h) * sq + i] = (float)lse[h * tq + b * sq + i];
            }
done:
    free(cu_q), free(cu_k), free(q), free(o), free(lse), free(k), free(v), free(row), free(score);
    return st;
}
