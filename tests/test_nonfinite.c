/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_nonfinite.c - the non-finite rules of flashattn.h on the CPU and reference backends: a NaN or +Inf in
 * a row's visible scores, a non-finite value in a V row it sees, scores that overflow fp32, rows left empty
 * by the mask, NaN or Inf ALiBi slopes; forward and backward.
 *
 * Each case runs a clean problem and a copy with one value made non-finite, and checks every output row:
 * rows the value cannot reach must come out bit-identical to the clean run, the rows it reaches as the
 * header says (NaN O and LSE, NaN O only, or NaN gradients). Shapes span more than one CPU block of queries
 * and keys (200 > 192 query rows, > 96 keys) with a causal mask, so the rule holds across block edges and
 * under the mask.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "harness.h"

enum { B = 2, H = 2, S = 200, D = 16 };
#define NQ ((size_t)B * S * H * D)
#define NL ((size_t)B * H * S)

typedef struct prob {
    float q[NQ], k[NQ], v[NQ], o[NQ], lse[NL], dout[NQ], dq[NQ], dk[NQ], dv[NQ];
    float slopes[H];
    fa_params p;
} prob;

static uint64_t rng = 88172645463325252ull;
static float frand(void) {
    rng ^= rng << 13, rng ^= rng >> 7, rng ^= rng << 17;
    return (float)((rng >> 40) * (1.0 / (1 << 24))) * 2.0f - 1.0f;
}

static void setup(prob *x, int causal) {
    rng = 88172645463325252ull;
    for (size_t i = 0; i < NQ; i++) x->q[i] = frand(), x->k[i] = frand(), x->v[i] = frand(), x->dout[i] = frand();
    fa_params_init(&x->p, FA_F32, B, S, S, H, H, D);
    x->p.causal = causal;
    x->p.q = fa_tensor_contiguous(x->q, S, H, D);
    x->p.k = fa_tensor_contiguous(x->k, S, H, D);
    x->p.v = fa_tensor_contiguous(x->v, S, H, D);
    x->p.o = fa_tensor_contiguous(x->o, S, H, D);
    x->p.dout = fa_tensor_contiguous(x->dout, S, H, D);
    x->p.dq = fa_tensor_contiguous(x->dq, S, H, D);
    x->p.dk = fa_tensor_contiguous(x->dk, S, H, D);
    x->p.dv = fa_tensor_contiguous(x->dv, S, H, D);
    x->p.lse = x->lse;
}

static size_t at(int b, int r, int h) {
    return (((size_t)b * S + r) * H + h) * D;
}
static size_t lse_at(int b, int r, int h) {
    return ((size_t)b * H + h) * S + r;
}

static fa_status run(prob *x, fa_backend be, int backward) {
    fa_exec e = { 0 };
    e.backend = be;
    e.device = -1;
    fa_status st = fa_fwd(&x->p, &e);
    if (st == FA_OK && backward) st = fa_bwd(&x->p, &e);
    return st;
}

static int all_nan(const float *a, int n) {
    for (int i = 0; i < n; i++)
        if (!isnan(a[i])) return 0;
    return 1;
}
static int any_nan(const float *a, int n) {
    for (int i = 0; i < n; i++)
        if (isnan(a[i])) return 1;
    return 0;
}
static int same(const float *a, const float *b, int n) {
    return !memcmp(a, b, sizeof(float) * (size_t)n);
}

static const char *bname(fa_backend be) {
    return be == FA_BACKEND_CPU ? "cpu" : "reference";
}

static prob clean, dirty;

/* What a changed query row (b0, h0, row `r0`) or key should do to the forward: `reach(r)` says whether row r of
 * (b0, h0) is reached; reached rows must have NaN O (and NaN LSE when lse_nan), every other row of every head
 * and batch entry equal the clean run's bits. */
typedef int (*reach_fn)(int r);
static int key_col;
static int sees_key(int r) { /* causal, square: row r sees keys 0..r */
    return r >= key_col;
}
static int only_row(int r) {
    return r == key_col;
}

static void check_forward(const char *name, fa_backend be, reach_fn reach, int lse_nan) {
    int ok = 1, reached = 0;
    char why[160] = "";
    for (int b = 0; b < B && ok; b++)
        for (int h = 0; h < H && ok; h++)
            for (int r = 0; r < S && ok; r++) {
                const float *o = dirty.o + at(b, r, h), *oc = clean.o + at(b, r, h);
                const float l = dirty.lse[lse_at(b, r, h)], lc = clean.lse[lse_at(b, r, h)];
                if (b == 0 && h == 0 && reach(r)) {
                    reached++;
                    if (!all_nan(o, D) || (lse_nan ? !isnan(l) : memcmp(&l, &lc, 4)))
                        ok = 0, snprintf(why, sizeof why, "row %d: O[0] %g, LSE %g", r, (double)o[0], (double)l);
                } else if (!same(o, oc, D) || memcmp(&l, &lc, 4)) {
                    ok = 0, snprintf(why, sizeof why, "unreached row b%d h%d r%d changed", b, h, r);
                }
            }
    th_check(ok && reached, "%s %s (%d rows reached) %s", bname(be), name, reached, why);
}

static void forward_cases(fa_backend be) {
    setup(&clean, 1);
    if (run(&clean, be, 0) != FA_OK) {
        th_fail("%s clean forward: %s", bname(be), fa_last_error());
        return;
    }

    /* NaN in a key: every row that sees it has NaN O and LSE (the key is not dropped) */
    key_col = 150;
    setup(&dirty, 1);
    dirty.k[at(0, key_col, 0) + 3] = NAN;
    th_check(run(&dirty, be, 0) == FA_OK, "%s forward with a NaN key runs", bname(be));
    check_forward("NaN key", be, sees_key, 1);

    /* +Inf scores: a key at +Inf in column 0 against queries whose column 0 is made positive gives +Inf
     * scores, which IEEE softmax turns into NaN (Inf - Inf); the row is not "empty" */
    setup(&dirty, 1);
    for (int r = 0; r < S; r++) dirty.q[at(0, r, 0)] = fabsf(dirty.q[at(0, r, 0)]) + 0.5f;
    memcpy(clean.q, dirty.q, sizeof clean.q);
    run(&clean, be, 0);
    dirty.k[at(0, key_col, 0)] = INFINITY;
    run(&dirty, be, 0);
    check_forward("+Inf key", be, sees_key, 1);

    /* fp32 overflow of Q.K: one query row whose every score is +Inf in fp32 must never come out empty
     * (O = 0, LSE = -inf): NaN on the CPU backend, the right answer in fp64 on the reference */
    setup(&clean, 1);
    run(&clean, be, 0);
    setup(&dirty, 1);
    key_col = 120;
    for (int c = 0; c < D; c++) dirty.q[at(0, key_col, 0) + c] = 1e30f;
    for (int j = 0; j <= key_col; j++)
        for (int c = 0; c < D; c++) dirty.k[at(0, j, 0) + c] = 1e30f;
    run(&dirty, be, 0);
    {
        const float *o = dirty.o + at(0, key_col, 0), l = dirty.lse[lse_at(0, key_col, 0)];
        int right = 1; /* all scores equal: O is the mean of V over the visible keys */
        for (int c = 0; c < D; c++) {
            double m = 0;
            for (int j = 0; j <= key_col; j++) m += dirty.v[at(0, j, 0) + c];
            right &= fabs(o[c] - m / (key_col + 1)) < 1e-4;
        }
        th_check(l != -INFINITY && (all_nan(o, D) ? isnan(l) || be == FA_BACKEND_REFERENCE : right),
                 "%s overflowing Q.K: row NaN or right (O[0] %g, LSE %g)", bname(be), (double)o[0], (double)l);
    }

    /* NaN and Inf in V: O of the rows that see the key is NaN (all of it), their LSE unchanged; other rows,
     * including those of the same CPU block that do not see it, unchanged */
    setup(&clean, 1);
    run(&clean, be, 0);
    key_col = 100;
    for (int inf = 0; inf < 2; inf++) {
        setup(&dirty, 1);
        dirty.v[at(0, key_col, 0) + 5] = inf ? -INFINITY : NAN;
        run(&dirty, be, 0);
        check_forward(inf ? "-Inf in V" : "NaN in V", be, sees_key, 0);
    }

    /* NaN in a query row: that row only */
    key_col = 7;
    setup(&dirty, 1);
    dirty.q[at(0, key_col, 0)] = NAN;
    run(&dirty, be, 0);
    check_forward("NaN query", be, only_row, 1);

    /* the same under softcap (tanh of NaN is NaN) */
    setup(&clean, 1);
    clean.p.softcap = 5.0f;
    run(&clean, be, 0);
    setup(&dirty, 1);
    dirty.p.softcap = 5.0f;
    dirty.q[at(0, key_col, 0)] = NAN;
    run(&dirty, be, 0);
    check_forward("NaN query, softcap", be, only_row, 1);

    /* rows the mask leaves without a key are empty, NaN inputs or not */
    {
        static float q[4 * 8], k[2 * 8], v[2 * 8], o[4 * 8], lse[4];
        fa_params p;
        fa_params_init(&p, FA_F32, 1, 4, 2, 1, 1, 8);
        p.causal = 1;
        for (int i = 0; i < 32; i++) q[i] = NAN;
        for (int i = 0; i < 16; i++) k[i] = v[i] = 1.0f;
        p.q = fa_tensor_contiguous(q, 4, 1, 8), p.k = fa_tensor_contiguous(k, 2, 1, 8);
        p.v = fa_tensor_contiguous(v, 2, 1, 8), p.o = fa_tensor_contiguous(o, 4, 1, 8), p.lse = lse;
        fa_exec e = { be, FA_KERNEL_AUTO, -1, 0, NULL, NULL, 0 };
        fa_status st = fa_fwd(&p, &e);
        int ok = st == FA_OK && lse[0] == -INFINITY && lse[1] == -INFINITY && o[0] == 0.0f && o[15] == 0.0f &&
                 isnan(lse[2]) && isnan(lse[3]) && all_nan(o + 16, 16);
        th_check(ok, "%s masked rows empty, visible NaN rows NaN", bname(be));
    }
}

/* NaN or Inf ALiBi slopes are refused before anything is written */
static void alibi_cases(fa_backend be) {
    const float bad[3] = { NAN, INFINITY, -INFINITY };
    for (int i = 0; i < 3; i++) {
        setup(&dirty, 0);
        dirty.slopes[0] = 0.5f;
        dirty.slopes[1] = bad[i];
        dirty.p.alibi_slopes = dirty.slopes;
        memset(dirty.o, 0x5a, sizeof dirty.o);
        memset(dirty.lse, 0x5a, sizeof dirty.lse);
        memcpy(clean.o, dirty.o, sizeof dirty.o);
        fa_status st = run(&dirty, be, 0);
        th_check(st == FA_ERR_INVALID_ARGUMENT && strstr(fa_last_error(), "alibi_slopes[1]") &&
                     same(dirty.o, clean.o, (int)NQ) && dirty.lse[0] == clean.o[0],
                 "%s ALiBi slope %g refused: %s", bname(be), (double)bad[i], fa_last_error());
    }
}

/* Backward: a non-finite value in Q, K or V makes NaN the dQ rows of every query it reaches (the query row
 * itself; the rows that see the key) and, for a query row, the dK and dV of every key that row sees; the other
 * batch entry and the other kv head are unchanged (the CPU backend may spread the NaN further inside the same
 * (batch, kv head), through the zero weights of masked keys, so those rows are not checked). */
static void backward_cases(fa_backend be) {
    setup(&clean, 1);
    if (run(&clean, be, 1) != FA_OK) {
        th_fail("%s clean backward: %s", bname(be), fa_last_error());
        return;
    }
    const int r0 = 150;
    /* +Inf last: it makes column 0 of the queries positive, in the clean run too */
    static const char *const site[4] = { "NaN query", "NaN key", "NaN in V", "+Inf key" };
    for (int c = 0; c < 4; c++) {
        setup(&dirty, 1);
        float *target = c == 0 ? dirty.q : c == 2 ? dirty.v : dirty.k;
        for (int r = 0; c == 3 && r < S; r++) dirty.q[at(0, r, 0)] = fabsf(dirty.q[at(0, r, 0)]) + 0.5f;
        if (c == 3) {
            memcpy(clean.q, dirty.q, sizeof clean.q);
            run(&clean, be, 1);
        }
        target[at(0, r0, 0) + (c == 3 ? 0 : 2)] = c == 3 ? INFINITY : NAN;
        fa_status st = run(&dirty, be, 1);
        int ok = st == FA_OK;
        for (int r = r0; r < (c == 0 ? r0 + 1 : S) && ok; r++) ok = all_nan(dirty.dq + at(0, r, 0), D);
        for (int j = 0; c == 0 && j <= r0 && ok; j++)
            ok = all_nan(dirty.dk + at(0, j, 0), D) && all_nan(dirty.dv + at(0, j, 0), D);
        for (int r = 0; r < S && ok; r++) {
            const size_t o1 = at(1, r, 0), o2 = at(0, r, 1), o3 = at(1, r, 1);
            ok = same(dirty.dq + o1, clean.dq + o1, D) && same(dirty.dq + o2, clean.dq + o2, D) &&
                 same(dirty.dk + o3, clean.dk + o3, D) && same(dirty.dv + o2, clean.dv + o2, D) &&
                 same(dirty.dk + o1, clean.dk + o1, D) && !any_nan(dirty.dq + o3, D);
        }
        th_check(ok, "%s backward, %s: NaN dQ where it reaches, other batch entry and head unchanged", bname(be),
                 site[c]);
    }
}

int main(int argc, char **argv) {
    th_init(argc, argv, NULL);
    const fa_backend backends[2] = { FA_BACKEND_CPU, FA_BACKEND_REFERENCE };
    for (int i = 0; i < 2; i++) {
        if (th_selected("forward")) forward_cases(backends[i]);
        if (th_selected("alibi")) alibi_cases(backends[i]);
        if (th_selected("backward")) backward_cases(backends[i]);
    }
    return th_finish();
}
