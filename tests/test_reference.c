/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_reference.c - the oracle and the checking machinery themselves.
 *
 *   fd        the reference backward (fa_reference_bwd_f64) against central finite differences of the
 *             reference forward, every element of dQ, dK, dV, over causal, windows, softcap, ALiBi, GQA and
 *             varlen problems (fp64 throughout).
 *   semantics what flashattn.h promises, checked from outside: the bottom-right mask pictures, rows that see
 *             no key, seqlen_k = 1, the natural-log LSE, ALiBi's bias, GQA = expanded heads, softcap off at
 *             large caps, the default scale, the reference backend = the fp64 core rounded.
 *   verify    the checking code used by test_backends and the CLI: it must catch a wrong value, a NaN, an
 *             unwritten element and a write outside the outputs, and its sampled mode must agree with the
 *             full comparison.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check/verify.h"
#include "harness.h"
#include "internal.h"

/* ---------------------------------------------------------------------------------------------------------
 * Packed fp64 problems for the reference core
 * ------------------------------------------------------------------------------------------------------- */

typedef struct dproblem {
    fa_params p;    /* resolved: scale set, host cu_seqlens and slopes */
    int64_t tq, tk; /* packed tokens */
    double *q, *k, *v, *dout, *o, *lse, *dq, *dk, *dv;
    int32_t cu_q[16], cu_k[16];
    float slopes[64];
} dproblem;

typedef struct dconfig {
    int32_t batch, sq, sk, hq, hkv, d;
    int32_t causal, wl, wr;
    float scale, softcap;
    int alibi;                      /* 0, 1 per head, 2 per (batch, head) */
    const int32_t *lens_q, *lens_k; /* varlen when set */
    int32_t extra;
} dconfig;

static dconfig dconf(int b, int sq, int sk, int hq, int hkv, int d) {
    dconfig c = { b, sq, sk, hq, hkv, d, 0, -1, -1, 0.0f, 0.0f, 0, NULL, NULL, 0 };
    return c;
}

static void dproblem_free(dproblem *x) {
    free(x->q), free(x->k), free(x->v), free(x->dout), free(x->o), free(x->lse), free(x->dq), free(x->dk), free(x->dv);
}

static int dproblem_make(dproblem *x, const dconfig *c, uint64_t seed) {
    memset(x, 0, sizeof *x);
    fa_params *p = &x->p;
    fa_params_init(p, FA_F32, c->batch, c->sq, c->sk, c->hq, c->hkv, c->d);
    p->softmax_scale = c->scale != 0 ? c->scale : (float)(1.0 / sqrt((double)c->d));
    p->causal = c->causal;
    p->window_left = c->wl;
    p->window_right = c->causal ? 0 : c->wr;
    p->softcap = c->softcap;
    x->tq = (int64_t)c->batch * c->sq;
    x->tk = (int64_t)c->batch * c->sk;
    if (c->lens_q) {
        x->cu_q[0] = x->cu_k[0] = 0;
        for (int b = 0; b < c->batch; b++) {
            x->cu_q[b + 1] = x->cu_q[b] + c->lens_q[b];
            x->cu_k[b + 1] = x->cu_k[b] + c->lens_k[b];
        }
        p->cu_seqlens_q = x->cu_q;
        p->cu_seqlens_k = x->cu_k;
        p->total_q = x->tq = x->cu_q[c->batch] + c->extra;
        p->total_k = x->tk = x->cu_k[c->batch] + c->extra;
    }
    vf_rng rng;
    vf_rng_seed(&rng, seed);
    if (c->alibi) {
        const int n = c->alibi == 2 ? c->batch * c->hq : c->hq;
        for (int i = 0; i < n; i++) x->slopes[i] = (float)(0.05 + 0.5 * vf_rng_uniform(&rng));
        p->alibi_slopes = x->slopes;
        p->alibi_batch_stride = c->alibi == 2 ? c->hq : 0;
    }
    const size_t nq = (size_t)(x->tq * c->hq * c->d) + 1, nk = (size_t)(x->tk * c->hkv * c->d) + 1;
    const size_t nl = (size_t)(c->lens_q ? c->hq * x->tq : c->batch * c->hq * c->sq) + 1;
    x->q = calloc(nq, 8), x->k = calloc(nk, 8), x->v = calloc(nk, 8), x->dout = calloc(nq, 8), x->o = calloc(nq, 8);
    x->lse = calloc(nl, 8), x->dq = calloc(nq, 8), x->dk = calloc(nk, 8), x->dv = calloc(nk, 8);
    if (!x->q || !x->k || !x->v || !x->dout || !x->o || !x->lse || !x->dq || !x->dk || !x->dv) return -1;
    for (size_t i = 0; i + 1 < nq; i++) x->q[i] = vf_rng_normal(&rng), x->dout[i] = vf_rng_normal(&rng);
    for (size_t i = 0; i + 1 < nk; i++) x->k[i] = vf_rng_normal(&rng), x->v[i] = vf_rng_normal(&rng);
    return 0;
}

/* sum(dout * O) over the valid rows: the loss whose gradient the backward computes */
static double loss(dproblem *x) {
    const int64_t nq = x->tq * x->p.heads_q * x->p.head_dim;
    memset(x->o, 0, sizeof(double) * (size_t)nq);
    fa_reference_fwd_f64(&x->p, x->q, x->k, x->v, x->o, x->lse);
    double l = 0.0;
    for (int64_t i = 0; i < nq; i++) l += x->dout[i] * x->o[i];
    return l;
}

/* ---------------------------------------------------------------------------------------------------------
 * Finite differences
 * ------------------------------------------------------------------------------------------------------- */

static void finite_differences(const char *name, dconfig c) {
    char full[128];
    snprintf(full, sizeof full, "fd %s", name);
    if (!th_selected(full)) return;
    dproblem x;
    if (dproblem_make(&x, &c, 7 + (uint64_t)c.sq * 31 + (uint64_t)c.hq)) {
        th_fail("%s: out of memory", full);
        dproblem_free(&x);
        return;
    }
    fa_reference_bwd_f64(&x.p, x.q, x.k, x.v, x.dout, x.dq, x.dk, x.dv);
    const double h = 1e-5;
    double *in[3] = { x.q, x.k, x.v }, *grad[3] = { x.dq, x.dk, x.dv };
    const int64_t n[3] = { x.tq * c.hq * c.d, x.tk * c.hkv * c.d, x.tk * c.hkv * c.d };
    double worst = 0.0, gmax = 0.0;
    int64_t checked = 0;
    for (int t = 0; t < 3; t++)
        for (int64_t i = 0; i < n[t]; i++) {
            const double keep = in[t][i];
            in[t][i] = keep + h;
            const double lp = loss(&x);
            in[t][i] = keep - h;
            const double lm = loss(&x);
            in[t][i] = keep;
            const double fd = (lp - lm) / (2 * h), err = fabs(fd - grad[t][i]);
            worst = err > worst ? err : worst;
            gmax = fabs(grad[t][i]) > gmax ? fabs(grad[t][i]) : gmax;
            checked++;
        }
    /* central differences: truncation ~h^2 |f'''|, cancellation ~1e-16 |L| / h; both far below 1e-6 here */
    const double tol = 1e-6 * (1.0 + gmax);
    th_check(worst <= tol && gmax > 0, "%-44s %lld gradient elements, max |fd - bwd| %.1e (tol %.1e, max |grad| %.2f)",
             full, (long long)checked, worst, tol, gmax);
    dproblem_free(&x);
}

static void fd_tests(void) {
    const int32_t lq[4] = { 3, 0, 1, 4 }, lk[4] = { 5, 2, 0, 1 };
    dconfig c = dconf(2, 5, 7, 4, 2, 8);
    finite_differences("dense gqa2", c);
    c.causal = 1;
    finite_differences("causal q<k", c);
    c = dconf(2, 7, 5, 2, 2, 8), c.causal = 1;
    finite_differences("causal q>k (empty rows)", c);
    c = dconf(1, 6, 6, 2, 1, 8), c.wl = 2, c.wr = 1;
    finite_differences("window 2,1", c);
    c = dconf(1, 4, 9, 2, 2, 8), c.wl = 1, c.wr = -1;
    finite_differences("window 1,-1 q<k", c);
    c = dconf(2, 5, 6, 2, 1, 16), c.softcap = 1.5f, c.scale = 0.9f;
    finite_differences("softcap", c);
    c = dconf(2, 6, 6, 4, 2, 8), c.alibi = 1, c.causal = 1;
    finite_differences("alibi causal", c);
    c = dconf(2, 4, 7, 4, 4, 8), c.alibi = 2;
    finite_differences("alibi (b,h) q<k", c);
    c = dconf(1, 5, 5, 8, 1, 8);
    finite_differences("gqa8", c);
    c = dconf(4, 4, 5, 2, 1, 8), c.lens_q = lq, c.lens_k = lk, c.extra = 2, c.causal = 1;
    finite_differences("varlen causal (empty sequences)", c);
    c = dconf(4, 4, 5, 4, 2, 8), c.lens_q = lq, c.lens_k = lk, c.alibi = 2, c.softcap = 2.0f, c.wl = 1, c.wr = 2;
    finite_differences("varlen window softcap alibi gqa", c);
}

/* ---------------------------------------------------------------------------------------------------------
 * Semantics
 * ------------------------------------------------------------------------------------------------------- */

/* With V_j = e_j (one-hot over head_dim >= seqlen_k) O_i[j] is P_ij: compares the visible set with a picture
 * ("x" visible, "." masked, one string per query row). */
static void mask_picture(const char *name, int sq, int sk, int causal, int wl, int wr, const char *const *rows) {
    char full[128];
    snprintf(full, sizeof full, "semantics mask %s", name);
    if (!th_selected(full)) return;
    dconfig c = dconf(1, sq, sk, 1, 1, 8);
    dproblem x;
    c.causal = causal, c.wl = wl, c.wr = wr;
    if (dproblem_make(&x, &c, 3)) return;
    memset(x.v, 0, sizeof(double) * (size_t)(sk * 8));
    for (int j = 0; j < sk; j++) x.v[j * 8 + j] = 1.0;
    fa_reference_fwd_f64(&x.p, x.q, x.k, x.v, x.o, x.lse);
    int ok = 1;
    for (int i = 0; i < sq; i++) {
        int empty = 1;
        for (int j = 0; j < sk; j++) {
            const int visible = x.o[i * 8 + j] > 0;
            ok &= visible == (rows[i][j] == 'x');
            empty &= !visible;
        }
        if (empty) ok &= x.lse[i] == -INFINITY;
    }
    th_check(ok, "%-44s %dx%d%s window %d,%d", full, sq, sk, causal ? " causal" : "", wl, wr);
    dproblem_free(&x);
}

static void semantics(void) {
    /* the pictures of flashattn.h, and windows around the bottom-right diagonal */
    const char *const causal_3x5[] = { "xxx..", "xxxx.", "xxxxx" };
    const char *const causal_5x3[] = { "...", "...", "x..", "xx.", "xxx" };
    const char *const band_4x4[] = { "xx..", "xxx.", ".xxx", "..xx" };
    const char *const left2_3x5[] = { "xxx..", ".xxx.", "..xxx" };
    const char *const right1_3x5[] = { "xxxx.", "xxxxx", "xxxxx" };
    const char *const band_4x6[] = { ".xx...", "..xx..", "...xx.", "....xx" };
    mask_picture("causal 3x5", 3, 5, 1, -1, -1, causal_3x5);
    mask_picture("causal 5x3", 5, 3, 1, -1, -1, causal_5x3);
    mask_picture("window 1,1", 4, 4, 0, 1, 1, band_4x4);
    mask_picture("window 2,0 3x5", 3, 5, 0, 2, 0, left2_3x5);
    mask_picture("window -1,1 3x5", 3, 5, 0, -1, 1, right1_3x5);
    mask_picture("causal + window 1,5 4x6", 4, 6, 1, 1, 5, band_4x6); /* causal overrides the right bound */

    dproblem x;
    dconfig c;
    if (th_selected("semantics seqlen_k=1")) {
        c = dconf(2, 3, 1, 2, 1, 16);
        dproblem_make(&x, &c, 5);
        fa_reference_fwd_f64(&x.p, x.q, x.k, x.v, x.o, x.lse);
        double err = 0.0, lerr = 0.0;
        for (int b = 0; b < 2; b++)
            for (int i = 0; i < 3; i++)
                for (int h = 0; h < 2; h++) {
                    const double *o = x.o + ((b * 3 + i) * 2 + h) * 16, *v = x.v + b * 16,
                                 *q = x.q + ((b * 3 + i) * 2 + h) * 16;
                    double s = 0.0;
                    for (int d = 0; d < 16; d++) err = fmax(err, fabs(o[d] - v[d])), s += q[d] * x.k[b * 16 + d];
                    lerr = fmax(lerr, fabs(x.lse[(b * 2 + h) * 3 + i] - x.p.softmax_scale * s));
                }
        th_check(err < 1e-15 && lerr < 1e-12, "semantics seqlen_k=1: O = V (err %.1e), LSE = the one score (err %.1e)",
                 err, lerr);
        dproblem_free(&x);
    }
    if (th_selected("semantics natural log")) {
        c = dconf(1, 4, 10, 1, 1, 8);
        dproblem_make(&x, &c, 6);
        memset(x.q, 0, sizeof(double) * 32);
        fa_reference_fwd_f64(&x.p, x.q, x.k, x.v, x.o, x.lse);
        double err = 0.0;
        for (int i = 0; i < 4; i++) {
            err = fmax(err, fabs(x.lse[i] - log(10.0)));
            for (int d = 0; d < 8; d++) {
                double mean = 0.0;
                for (int j = 0; j < 10; j++) mean += x.v[j * 8 + d] / 10;
                err = fmax(err, fabs(x.o[i * 8 + d] - mean));
            }
        }
        th_check(err < 1e-14, "semantics natural log: q = 0 gives LSE = ln(seqlen_k) and O = mean(V) (err %.1e)", err);
        dproblem_free(&x);
    }
    if (th_selected("semantics alibi")) {
        /* q = 0: scores are -slope * |i + sk - sq - j| alone */
        c = dconf(1, 3, 6, 2, 1, 8);
        c.alibi = 1;
        dproblem_make(&x, &c, 8);
        memset(x.q, 0, sizeof(double) * 3 * 2 * 8);
        fa_reference_fwd_f64(&x.p, x.q, x.k, x.v, x.o, x.lse);
        double err = 0.0;
        for (int h = 0; h < 2; h++)
            for (int i = 0; i < 3; i++) {
                double w[6], sum = 0.0;
                for (int j = 0; j < 6; j++) sum += (w[j] = exp(-x.slopes[h] * fabs((double)(i + 6 - 3 - j))));
                for (int d = 0; d < 8; d++) {
                    double o = 0.0;
                    for (int j = 0; j < 6; j++) o += w[j] / sum * x.v[j * 8 + d];
                    err = fmax(err, fabs(x.o[(i * 2 + h) * 8 + d] - o));
                }
                err = fmax(err, fabs(x.lse[h * 3 + i] - log(sum)));
            }
        th_check(err < 1e-13, "semantics alibi: bias -slope * |i + sk - sq - j| (err %.1e)", err);
        dproblem_free(&x);
    }
    if (th_selected("semantics gqa")) {
        /* heads 4 over 2 kv heads = heads 4 over the kv heads repeated; dK/dV of a kv head = the group's sum */
        dproblem g, e;
        c = dconf(2, 5, 6, 4, 2, 8);
        dproblem_make(&g, &c, 9);
        c.hkv = 4;
        dproblem_make(&e, &c, 9);
        memcpy(e.q, g.q, sizeof(double) * 2 * 5 * 4 * 8);
        memcpy(e.dout, g.dout, sizeof(double) * 2 * 5 * 4 * 8);
        for (int t = 0; t < 12; t++)
            for (int h = 0; h < 4; h++)
                for (int d = 0; d < 8; d++) {
                    e.k[(t * 4 + h) * 8 + d] = g.k[(t * 2 + h / 2) * 8 + d];
                    e.v[(t * 4 + h) * 8 + d] = g.v[(t * 2 + h / 2) * 8 + d];
                }
        fa_reference_fwd_f64(&g.p, g.q, g.k, g.v, g.o, g.lse);
        fa_reference_fwd_f64(&e.p, e.q, e.k, e.v, e.o, e.lse);
        fa_reference_bwd_f64(&g.p, g.q, g.k, g.v, g.dout, g.dq, g.dk, g.dv);
        fa_reference_bwd_f64(&e.p, e.q, e.k, e.v, e.dout, e.dq, e.dk, e.dv);
        double err = 0.0;
        for (int i = 0; i < 2 * 5 * 4 * 8; i++) err = fmax(err, fmax(fabs(g.o[i] - e.o[i]), fabs(g.dq[i] - e.dq[i])));
        for (int t = 0; t < 12; t++)
            for (int hk = 0; hk < 2; hk++)
                for (int d = 0; d < 8; d++) {
                    const int a = (t * 4 + 2 * hk) * 8 + d, b = a + 8;
                    err = fmax(err, fabs(g.dk[(t * 2 + hk) * 8 + d] - (e.dk[a] + e.dk[b])));
                    err = fmax(err, fabs(g.dv[(t * 2 + hk) * 8 + d] - (e.dv[a] + e.dv[b])));
                }
        th_check(err < 1e-13, "semantics gqa: = expanded kv heads, dK/dV summed over the group (err %.1e)", err);
        dproblem_free(&g), dproblem_free(&e);
    }
    if (th_selected("semantics softcap")) {
        dproblem a, b;
        c = dconf(1, 6, 6, 2, 2, 8);
        dproblem_make(&a, &c, 10);
        c.softcap = 1e6f;
        dproblem_make(&b, &c, 10);
        fa_reference_fwd_f64(&a.p, a.q, a.k, a.v, a.o, a.lse);
        fa_reference_fwd_f64(&b.p, b.q, b.k, b.v, b.o, b.lse);
        double err = 0.0;
        for (int i = 0; i < 6 * 2 * 8; i++) err = fmax(err, fabs(a.o[i] - b.o[i]));
        th_check(err < 1e-9, "semantics softcap: a cap of 1e6 changes nothing (err %.1e)", err);
        dproblem_free(&a), dproblem_free(&b);
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * The reference backend through the public API, and the checking code
 * ------------------------------------------------------------------------------------------------------- */

static fa_exec reference_exec(void) {
    fa_exec x;
    memset(&x, 0, sizeof x);
    x.backend = FA_BACKEND_REFERENCE;
    x.device = -1;
    return x;
}

static vf_config vconf(fa_dtype dt, int b, int hq, int hkv, int sq, int sk, int d) {
    vf_config c;
    vf_config_init(&c);
    c.dtype = dt, c.batch = b, c.heads_q = hq, c.heads_kv = hkv, c.seqlen_q = sq, c.seqlen_k = sk, c.head_dim = d;
    return c;
}

/* The reference backend (strided f32, default scale, varlen, padded layout) = the fp64 core rounded once. */
static void reference_backend(void) {
    if (!th_selected("semantics reference backend")) return;
    vf_config c = vconf(FA_F32, 5, 4, 2, 30, 40, 64);
    c.varlen = 1, c.edge_lengths = 1, c.extra_tokens = 3, c.layout = VF_LAYOUT_PADDED, c.causal = 1;
    c.alibi = VF_ALIBI_BATCH_HEADS;
    vf_problem pr;
    if (vf_problem_create(&pr, &c) != FA_OK) return;
    fa_exec x = reference_exec();
    fa_status st = vf_run(&pr, &x, 0);
    if (st == FA_OK) st = vf_run(&pr, &x, 1);
    vf_report rep;
    int64_t unwritten = 0, over = 0, u2 = 0, o2 = 0;
    vf_check_written(&pr, 0, &unwritten, &over);
    vf_check_written(&pr, 1, &u2, &o2);
    int ok = st == FA_OK && vf_compare(&pr, 1, &rep) == FA_OK && !unwritten && !over && !u2 && !o2;
    for (int w = 0; ok && w < VF_NUM_OUTPUTS; w++)
        ok = rep.err[w].max_abs <= 0x1p-24 * rep.err[w].max_ref * (w == VF_LSE ? 2 : 1) + 1e-300;
    th_check(ok,
             "semantics reference backend: strided f32 varlen with the default scale = fp64 core rounded to f32 (%s)",
             st == FA_OK ? "ran" : fa_last_error());
    vf_problem_destroy(&pr);
}

/* Builds a problem, runs the reference backend (fwd + bwd) and returns it; 0 on success. */
static int reference_problem(vf_problem *pr, vf_config c) {
    if (vf_problem_create(pr, &c) != FA_OK) return -1;
    fa_exec x = reference_exec();
    if (vf_run(pr, &x, 0) != FA_OK || vf_run(pr, &x, 1) != FA_OK) {
        vf_problem_destroy(pr);
        return -1;
    }
    return 0;
}

static float *f32_at(vf_tensor *t, int64_t i) {
    return (float *)t->host + i;
}

/* The comparison must fail on each kind of wrong output. */
static void harness_detects(void) {
    if (!th_selected("verify detects")) return;
    vf_config c = vconf(FA_F32, 2, 4, 2, 33, 45, 32);
    vf_problem pr;
    c.layout = VF_LAYOUT_PADDED;
    if (reference_problem(&pr, c)) {
        th_fail("verify detects: cannot run the reference backend: %s", fa_last_error());
        return;
    }
    vf_report rep;
    vf_compare(&pr, 1, &rep);
    th_check(rep.ok, "verify detects: the correct outputs pass");
    const double tol_o = rep.err[VF_O].tol, tol_dk = rep.err[VF_DK].tol;

    /* O off by 3 x its tolerance in one element (row 7, head 1, dim 5) */
    const int64_t at = 7 * pr.o.view.stride_seq + 1 * pr.o.view.stride_head + 5;
    float keep = *f32_at(&pr.o, at);
    *f32_at(&pr.o, at) = keep + (float)(3 * tol_o);
    vf_compare(&pr, 1, &rep);
    th_check(!rep.ok && !rep.err[VF_O].ok, "verify detects: one element of O off by 3x the tolerance");
    *f32_at(&pr.o, at) = NAN;
    vf_compare(&pr, 1, &rep);
    th_check(!rep.err[VF_O].ok && isinf(rep.err[VF_O].max_abs), "verify detects: a NaN in O (max err %g)",
             rep.err[VF_O].max_abs);
    *f32_at(&pr.o, at) = keep;

    /* LSE: +inf instead of a finite value, and a finite value where -inf belongs is covered by elem_err */
    const float lkeep = pr.lse[3];
    pr.lse[3] = INFINITY;
    vf_compare(&pr, 1, &rep);
    th_check(!rep.err[VF_LSE].ok, "verify detects: LSE = +inf where it is finite");
    pr.lse[3] = lkeep;

    /* dK off by 3x its tolerance in the last element of the last kv head */
    const int64_t dk_at = (int64_t)(pr.cfg.batch - 1) * pr.dk.view.stride_batch +
                          (pr.cfg.seqlen_k - 1) * pr.dk.view.stride_seq +
                          (pr.cfg.heads_kv - 1) * pr.dk.view.stride_head + pr.cfg.head_dim - 1;
    float dkeep = *f32_at(&pr.dk, dk_at);
    *f32_at(&pr.dk, dk_at) = dkeep - (float)(3 * tol_dk);
    vf_compare(&pr, 1, &rep);
    th_check(!rep.err[VF_DK].ok && rep.err[VF_DQ].ok, "verify detects: one element of dK off by 3x the tolerance");
    vf_compare_sampled(&pr, 1, 1000000, &rep);
    th_check(!rep.err[VF_DK].ok, "verify detects: the same in sampled mode (all rows)");
    *f32_at(&pr.dk, dk_at) = dkeep;

    /* an element left unwritten, and a write into the gap after a head */
    const size_t n = (size_t)pr.dv.elems * sizeof(float);
    unsigned char *dv = malloc(n);
    int64_t unwritten, over;
    memcpy(dv, pr.dv.host, n);
    vf_poison_outputs(&pr, 1);
    vf_check_written(&pr, 1, &unwritten, &over);
    const int64_t all_poison = unwritten;
    memcpy(pr.dv.host, dv, n);
    vf_check_written(&pr, 1, &unwritten, &over);
    th_check(all_poison > 0 &&
                 unwritten == all_poison - (int64_t)pr.cfg.batch * pr.cfg.seqlen_k * pr.cfg.heads_kv * pr.cfg.head_dim,
             "verify detects: poisoned outputs count as unwritten (%lld)", (long long)all_poison);
    fa_exec x = reference_exec();
    vf_run(&pr, &x, 1);
    *f32_at(&pr.dv, 2 * pr.dv.view.stride_seq + pr.cfg.head_dim + 1) = 0.0f; /* in the gap after head 0 */
    vf_check_written(&pr, 1, &unwritten, &over);
    th_check(unwritten == 0 && over == 1, "verify detects: a write between heads (%lld overwritten)", (long long)over);
    memcpy(pr.dv.host, dv, n);
    vf_poison_outputs(&pr, 0);
    vf_check_written(&pr, 0, &unwritten, &over);
    th_check(unwritten == (int64_t)pr.cfg.batch * pr.cfg.seqlen_q * pr.cfg.heads_q * (pr.cfg.head_dim + 1) && over == 0,
             "verify detects: every O and LSE element unwritten after poisoning (%lld)", (long long)unwritten);
    free(dv);
    vf_problem_destroy(&pr);
}

/* Sampled mode with every row sampled agrees with the full comparison. */
static void sampled_agrees(void) {
    if (!th_selected("verify sampled")) return;
    vf_config cs[3];
    cs[0] = vconf(FA_F32, 2, 4, 2, 40, 57, 32);
    cs[0].causal = 1;
    cs[1] = vconf(FA_F32, 6, 4, 1, 30, 25, 64);
    cs[1].varlen = 1, cs[1].edge_lengths = 1, cs[1].extra_tokens = 2, cs[1].alibi = VF_ALIBI_BATCH_HEADS;
    cs[1].softcap = 2.0f, cs[1].window_left = 7, cs[1].window_right = 3, cs[1].layout = VF_LAYOUT_MIXED;
    cs[2] = vconf(FA_BF16, 2, 2, 2, 50, 50, 64);
    const char *names[3] = { "causal gqa", "varlen softcap alibi window mixed layout", "bf16" };
    for (int i = 0; i < 3; i++) {
        vf_problem pr;
        if (reference_problem(&pr, cs[i])) {
            th_fail("verify sampled %s: cannot run the reference backend", names[i]);
            continue;
        }
        vf_report full, part;
        vf_compare(&pr, 1, &full);
        vf_compare_sampled(&pr, 1, 1000000, &part);
        /* the sampled dK/dV reference uses the backend's O and LSE (rounded), the full one exact values: the
         * difference is of the order of that rounding */
        double worst = 0.0;
        int ok = full.ok && part.ok;
        for (int w = 0; w < VF_NUM_OUTPUTS; w++) {
            const double diff = fabs(full.err[w].max_abs - part.err[w].max_abs);
            const double allow = w >= VF_DK ? full.err[w].tol : 1e-12 * (1 + full.err[w].max_ref);
            ok &= diff <= allow && part.err[w].checked == full.err[w].checked;
            worst = fmax(worst, diff / (full.err[w].tol + 1e-300));
        }
        th_check(ok, "verify sampled %-40s all rows: same elements, errors agree (worst difference %.2f tolerances)",
                 names[i], worst);
        vf_problem_destroy(&pr);
    }
}

/* The naive same-dtype implementation has the error its dtype implies. */
static void naive_noise(void) {
    if (!th_selected("verify naive")) return;
    const fa_dtype dts[3] = { FA_F32, FA_F16, FA_BF16 };
    const double lo[3] = { 1e-9, 1e-5, 1e-4 }, hi[3] = { 1e-5, 5e-3, 4e-2 };
    const char *names[3] = { "f32", "f16", "bf16" };
    for (int i = 0; i < 3; i++) {
        vf_config c = vconf(dts[i], 2, 4, 2, 64, 80, 64);
        vf_problem pr;
        if (reference_problem(&pr, c)) continue;
        vf_report rep;
        vf_compare(&pr, 1, &rep);
        int ok = 1;
        for (int w = 0; w < VF_NUM_OUTPUTS; w++) {
            if (w == VF_LSE) continue; /* fp32 in every dtype */
            const double rel = rep.err[w].naive / rep.err[w].max_ref;
            ok &= rel >= lo[i] && rel <= hi[i];
        }
        th_check(ok,
                 "verify naive %-5s relative error of the naive implementation in [%.0e, %.0e]: O %.1e dQ %.1e dK %.1e "
                 "dV %.1e",
                 names[i], lo[i], hi[i], rep.err[VF_O].naive / rep.err[VF_O].max_ref,
                 rep.err[VF_DQ].naive / rep.err[VF_DQ].max_ref, rep.err[VF_DK].naive / rep.err[VF_DK].max_ref,
                 rep.err[VF_DV].naive / rep.err[VF_DV].max_ref);
        vf_problem_destroy(&pr);
    }
}

/* The e4m3 conversions against e4m3's definition: every byte's value, every value back to its byte, ties
 * between neighbours to the even byte, saturation at 448, NaN. */
static void e4m3_codec(void) {
    if (!th_selected("e4m3 codec")) return;
    int bad_decode = 0, bad_encode = 0, bad_tie = 0;
    for (int x = 0; x < 256; x++) {
        const int e = (x >> 3) & 15, m = x & 7;
        double want = e == 15 && m == 7 ? NAN : e == 0 ? ldexp(m, -9) : ldexp(8 + m, e - 10);
        if (x & 0x80) want = -want;
        const float got = fa_e4m3_to_f32((uint8_t)x);
        if (isnan(want) ? !isnan(got) : (double)got != want || !signbit(got) != !signbit(want)) bad_decode++;
        if (!isnan(want) && fa_f32_to_e4m3(got) != x) bad_encode++;
        /* the midpoint to the next larger magnitude (the largest, 448, has none) rounds to the even byte */
        if (!isnan(want) && (x & 0x7f) < 0x7e) {
            const float next = fa_e4m3_to_f32((uint8_t)(x + 1)), mid = (got + next) / 2;
            const int even = (x & 1) ? x + 1 : x;
            if (fa_f32_to_e4m3(mid) != even || fa_f32_to_e4m3(nextafterf(mid, 0)) != x ||
                fa_f32_to_e4m3(nextafterf(mid, 2 * next)) != x + 1)
                bad_tie++;
        }
    }
    th_check(bad_decode == 0 && bad_encode == 0 && bad_tie == 0,
             "e4m3 codec: 256 bytes decoded (%d wrong), re-encoded (%d wrong), 252 ties to even (%d wrong)", bad_decode,
             bad_encode, bad_tie);
    const uint8_t sat[4] = { fa_f32_to_e4m3(463.9f), fa_f32_to_e4m3(464.0f), fa_f32_to_e4m3(1e30f),
                             fa_f32_to_e4m3(-INFINITY) };
    th_check(sat[0] == 0x7e && sat[1] == 0x7e && sat[2] == 0x7e && sat[3] == 0xfe &&
                 (fa_f32_to_e4m3(NAN) & 0x7f) == 0x7f && fa_e4m3_to_f32(0x7e) == 448.0f &&
                 fa_e4m3_to_f32(0x01) == 0x1p-9f && fa_f32_to_e4m3(0x1p-10f) == 0 &&
                 fa_f32_to_e4m3(0x1.000002p-10f) == 1,
             "e4m3 codec: saturation at +-448 (463.9, 464, 1e30, -inf -> %02x %02x %02x %02x), NaN, the smallest "
             "subnormal and the ties around it",
             sat[0], sat[1], sat[2], sat[3]);
}

int main(int argc, char **argv) {
    th_init(argc, argv, NULL);
    e4m3_codec();
    fd_tests();
    semantics();
    reference_backend();
    harness_detects();
    sampled_agrees();
    naive_noise();
    return th_finish();
}
