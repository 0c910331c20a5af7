/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_nonfinite.c - the non-finite rules of flashattn.h on the CPU and reference backends: a NaN or +Inf in
 * a row's visible scores, a non-finite value in a V row it sees, scores that overflow fp32, rows left empty
 * by the mask, NaN or Inf ALiBi slopes; forward and backward; in a varlen batch, a non-finite value in one
 * sequence leaves the other's gradients as they were. With a GPU, the same cases on the CUDA backend (the FA2
 * kernels, and the FA3 kernels on compute capability 9.0) and the naive backend, in bf16. The CPU backend runs
 * them in bf16 too (on a processor with the bf16 dot product, its bf16 products).
 *
 * Each case runs a clean problem and a copy with one value made non-finite, and checks every output row:
 * rows the value cannot reach must come out bit-identical to the clean run, the rows it reaches as the
 * header says (NaN O and LSE, NaN O only, or NaN gradients). Shapes span more than one CPU block of queries
 * and keys (200 > 192 query rows, > 96 keys) with a causal mask, so the rule holds across block edges and
 * under the mask. The device backends run the same values rounded to bf16 (their backward in deterministic
 * mode, so that runs compare bit for bit; the FA3 backward has none, and its dQ is compared within a rounding);
 * where flashattn.h lets them differ (a non-finite V value may
 * reach rows of the same head that do not see its key; their rows of the changed head that the value does not
 * reach may round differently, e.g. when a warp's softmax takes another path) the checks say so.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FA_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "flashattn.h"
#include "harness.h"

/* head_dim 64: one every device kernel family has */
enum { B = 2, H = 2, S = 200, D = 64 };
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

/* Where a case runs: a backend, and for the CUDA backend the kernel family. */
typedef struct target {
    const char *name;
    fa_backend backend;
    fa_kernel kernel;
    int device; /* device pointers, bf16 */
    int bf16;   /* host arrays rounded to bf16 */
} target;

static const target host_targets[3] = { { "cpu", FA_BACKEND_CPU, FA_KERNEL_AUTO, 0, 0 },
                                        { "cpu bf16", FA_BACKEND_CPU, FA_KERNEL_AUTO, 0, 1 },
                                        { "reference", FA_BACKEND_REFERENCE, FA_KERNEL_AUTO, 0, 0 } };
static const target device_targets[3] = { { "cuda fa2", FA_BACKEND_CUDA, FA_KERNEL_FA2, 1, 1 },
                                          { "cuda fa3", FA_BACKEND_CUDA, FA_KERNEL_FA3, 1, 1 },
                                          { "naive", FA_BACKEND_NAIVE, FA_KERNEL_AUTO, 1, 1 } };

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

static fa_exec exec_for(const target *t) {
    fa_exec e = { 0 };
    e.backend = t->backend;
    e.kernel = t->kernel;
    e.device = -1;
    return e;
}

static uint16_t to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if (isnan(f)) return (uint16_t)(0x7fc0 | ((u >> 16) & 0x8000));
    return (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
}
static float from_bf16(uint16_t h) {
    const uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* The host bf16 run: the arrays rounded to bf16 into host buffers, the outputs (poisoned with a large finite
 * value first) converted back. */
static uint16_t host_buf[8][NQ]; /* q k v dout, o dq dk dv */
static fa_status run_host_bf16(prob *x, const target *t, int backward) {
    const float *in[4] = { x->q, x->k, x->v, x->dout };
    float *out[4] = { x->o, x->dq, x->dk, x->dv };
    for (int i = 0; i < 4; i++)
        for (size_t j = 0; j < NQ; j++) host_buf[i][j] = to_bf16(in[i][j]);
    memset(host_buf[4], 0x7f, sizeof host_buf[0] * 4);
    fa_params p = x->p;
    p.dtype = FA_BF16;
    fa_tensor *views[8] = { &p.q, &p.k, &p.v, &p.dout, &p.o, &p.dq, &p.dk, &p.dv };
    for (int i = 0; i < 8; i++) views[i]->data = host_buf[i];
    fa_exec e = exec_for(t);
    fa_status st = fa_fwd(&p, &e);
    if (st == FA_OK && backward) st = fa_bwd(&p, &e);
    /* after a refused call only what was written (not the poison) reaches the float arrays, which the checks
     * compare with what they held */
    for (int i = 0; i < (backward ? 4 : 1); i++)
        for (size_t j = 0; j < NQ; j++)
            if (st == FA_OK || host_buf[4 + i][j] != 0x7f7f) out[i][j] = from_bf16(host_buf[4 + i][j]);
    return st;
}

#ifdef FA_WITH_CUDA
/* The device run: the host arrays rounded to bf16, copied in, the outputs copied back as floats. */

static uint16_t *dev_buf[8], host_bf16[NQ]; /* q k v dout, o dq dk dv */
static float *dev_lse, *dev_slopes;
static int32_t *dev_cu;

static int dev_copy(uint16_t *dst, const float *src) {
    for (size_t i = 0; i < NQ; i++) host_bf16[i] = to_bf16(src[i]);
    return cudaMemcpy(dst, host_bf16, sizeof host_bf16, cudaMemcpyHostToDevice) == cudaSuccess;
}
static int dev_fetch(float *dst, const uint16_t *src) {
    if (cudaMemcpy(host_bf16, src, sizeof host_bf16, cudaMemcpyDeviceToHost) != cudaSuccess) return 0;
    for (size_t i = 0; i < NQ; i++) dst[i] = from_bf16(host_bf16[i]);
    return 1;
}

static fa_status run_device(prob *x, const target *t, int backward) {
    if (!dev_buf[0]) {
        for (int i = 0; i < 8; i++)
            if (cudaMalloc((void **)&dev_buf[i], sizeof host_bf16) != cudaSuccess) return FA_ERR_OUT_OF_MEMORY;
        if (cudaMalloc((void **)&dev_lse, sizeof x->lse) != cudaSuccess ||
            cudaMalloc((void **)&dev_slopes, sizeof x->slopes) != cudaSuccess ||
            cudaMalloc((void **)&dev_cu, sizeof(int32_t) * (B + 1)) != cudaSuccess)
            return FA_ERR_OUT_OF_MEMORY;
    }
    const float *in[4] = { x->q, x->k, x->v, x->dout };
    for (int i = 0; i < 4; i++)
        if (!dev_copy(dev_buf[i], in[i])) return FA_ERR_DEVICE;
    /* poisoned with a large finite value: an unwritten element fails the checks for 0, NaN or the clean run */
    for (int i = 4; i < 8; i++) cudaMemset(dev_buf[i], 0x7f, sizeof host_bf16);
    cudaMemset(dev_lse, 0x7f, sizeof x->lse);
    fa_params p = x->p;
    p.dtype = FA_BF16;
    fa_tensor *views[8] = { &p.q, &p.k, &p.v, &p.dout, &p.o, &p.dq, &p.dk, &p.dv };
    for (int i = 0; i < 8; i++) views[i]->data = dev_buf[i];
    p.lse = dev_lse;
    p.deterministic = t->kernel != FA_KERNEL_FA3;
    if (p.cu_seqlens_q) { /* (one array for both in these cases) */
        if (cudaMemcpy(dev_cu, p.cu_seqlens_q, sizeof(int32_t) * (B + 1), cudaMemcpyHostToDevice) != cudaSuccess)
            return FA_ERR_DEVICE;
        p.cu_seqlens_q = p.cu_seqlens_k = dev_cu;
    }
    if (p.alibi_slopes) { /* (always x->slopes) */
        if (cudaMemcpy(dev_slopes, x->slopes, sizeof x->slopes, cudaMemcpyHostToDevice) != cudaSuccess)
            return FA_ERR_DEVICE;
        p.alibi_slopes = dev_slopes;
    }
    fa_exec e = exec_for(t);
    fa_status st = fa_fwd(&p, &e);
    if (st == FA_OK && backward) st = fa_bwd(&p, &e);
    if (st != FA_OK) return st;
    if (cudaDeviceSynchronize() != cudaSuccess || !dev_fetch(x->o, dev_buf[4]) ||
        cudaMemcpy(x->lse, dev_lse, sizeof x->lse, cudaMemcpyDeviceToHost) != cudaSuccess)
        return FA_ERR_DEVICE;
    if (backward && (!dev_fetch(x->dq, dev_buf[5]) || !dev_fetch(x->dk, dev_buf[6]) || !dev_fetch(x->dv, dev_buf[7])))
        return FA_ERR_DEVICE;
    return FA_OK;
}
#else
static fa_status run_device(prob *x, const target *t, int backward) {
    (void)x, (void)t, (void)backward;
    return FA_ERR_NOT_COMPILED;
}
#endif

static fa_status run(prob *x, const target *t, int backward) {
    if (t->device) return run_device(x, t, backward);
    if (t->bf16) return run_host_bf16(x, t, backward);
    fa_exec e = exec_for(t);
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

/* Close enough for a row of the changed head that the change does not reach, on a device backend: finite and
 * within rounding of the clean run (the NaN is what is looked for). */
/* A gradient against the clean run's: bit for bit, except dQ of a kernel that sums it in no fixed order (FA3's
 * atomics), which may round to a neighbouring bf16 value. */
static int match(const target *t, int is_dq, const float *a, const float *b, int n) {
    if (!(is_dq && t->kernel == FA_KERNEL_FA3)) return same(a, b, n);
    for (int i = 0; i < n; i++)
        if (!isfinite(a[i]) || !(fabsf(a[i] - b[i]) <= 0x1p-7f * (1.0f + fabsf(b[i])))) return 0;
    return 1;
}

static int near(const float *a, const float *b, int n, float tol) {
    for (int i = 0; i < n; i++)
        if (!isfinite(a[i]) || !(fabsf(a[i] - b[i]) <= tol)) return 0;
    return 1;
}

/* v_col >= 0: a non-finite value in column v_col of V; on a device backend the reached rows need only that
 * column non-finite, and the other rows of (b0, h0) are not checked (flashattn.h). */
static void check_forward_v(const char *name, const target *t, reach_fn reach, int lse_nan, int v_col) {
    int ok = 1, reached = 0;
    char why[160] = "";
    for (int b = 0; b < B && ok; b++)
        for (int h = 0; h < H && ok; h++)
            for (int r = 0; r < S && ok; r++) {
                const float *o = dirty.o + at(b, r, h), *oc = clean.o + at(b, r, h);
                const float l = dirty.lse[lse_at(b, r, h)], lc = clean.lse[lse_at(b, r, h)];
                const int lse_same = t->device ? fabsf(l - lc) <= 1e-2f : !memcmp(&l, &lc, 4);
                if (b == 0 && h == 0 && reach(r)) {
                    reached++;
                    const int o_ok = t->device && v_col >= 0 ? !isfinite(o[v_col]) : all_nan(o, D);
                    if (!o_ok || (lse_nan ? !isnan(l) : !lse_same))
                        ok = 0, snprintf(why, sizeof why, "row %d: O[0] %g, LSE %g", r, (double)o[0], (double)l);
                } else if (b == 0 && h == 0 && t->device) {
                    if (v_col < 0 && (!near(o, oc, D, 0.02f) || !lse_same))
                        ok = 0, snprintf(why, sizeof why, "unreached row b%d h%d r%d changed (O[0] %g, clean %g)", b, h,
                                         r, (double)o[0], (double)oc[0]);
                } else if (!same(o, oc, D) || memcmp(&l, &lc, 4)) {
                    ok = 0, snprintf(why, sizeof why, "unreached row b%d h%d r%d changed", b, h, r);
                }
            }
    th_check(ok && reached, "%s %s (%d rows reached) %s", t->name, name, reached, why);
}
static void check_forward(const char *name, const target *t, reach_fn reach, int lse_nan) {
    check_forward_v(name, t, reach, lse_nan, -1);
}

static void forward_cases(const target *t) {
    setup(&clean, 1);
    if (run(&clean, t, 0) != FA_OK) {
        th_fail("%s clean forward: %s", t->name, fa_last_error());
        return;
    }

    /* NaN in a key: every row that sees it has NaN O and LSE (the key is not dropped) */
    key_col = 150;
    setup(&dirty, 1);
    dirty.k[at(0, key_col, 0) + 3] = NAN;
    th_check(run(&dirty, t, 0) == FA_OK, "%s forward with a NaN key runs", t->name);
    check_forward("NaN key", t, sees_key, 1);

    /* +Inf scores: a key at +Inf in column 0 against queries whose column 0 is made positive gives +Inf
     * scores, which IEEE softmax turns into NaN (Inf - Inf); the row is not "empty" */
    setup(&dirty, 1);
    for (int r = 0; r < S; r++) dirty.q[at(0, r, 0)] = fabsf(dirty.q[at(0, r, 0)]) + 0.5f;
    memcpy(clean.q, dirty.q, sizeof clean.q);
    run(&clean, t, 0);
    dirty.k[at(0, key_col, 0)] = INFINITY;
    run(&dirty, t, 0);
    check_forward("+Inf key", t, sees_key, 1);

    /* fp32 overflow of Q.K: one query row whose every score is +Inf in fp32 must never come out empty
     * (O = 0, LSE = -inf): NaN on the CPU backend, the right answer in fp64 on the reference */
    setup(&clean, 1);
    run(&clean, t, 0);
    setup(&dirty, 1);
    key_col = 120;
    for (int c = 0; c < D; c++) dirty.q[at(0, key_col, 0) + c] = 1e30f;
    for (int j = 0; j <= key_col; j++)
        for (int c = 0; c < D; c++) dirty.k[at(0, j, 0) + c] = 1e30f;
    run(&dirty, t, 0);
    {
        const float *o = dirty.o + at(0, key_col, 0), l = dirty.lse[lse_at(0, key_col, 0)];
        int right = 1; /* all scores equal: O is the mean of V over the visible keys */
        for (int c = 0; c < D; c++) {
            double m = 0;
            for (int j = 0; j <= key_col; j++) m += dirty.v[at(0, j, 0) + c];
            right &= fabs(o[c] - m / (key_col + 1)) < 1e-4;
        }
        th_check(l != -INFINITY && (all_nan(o, D) ? isnan(l) || t->backend == FA_BACKEND_REFERENCE : right),
                 "%s overflowing Q.K: row NaN or right (O[0] %g, LSE %g)", t->name, (double)o[0], (double)l);
    }

    /* NaN and Inf in V: O of the rows that see the key is NaN (all of it), their LSE unchanged; other rows,
     * including those of the same CPU block that do not see it, unchanged */
    setup(&clean, 1);
    run(&clean, t, 0);
    key_col = 100;
    for (int inf = 0; inf < 2; inf++) {
        setup(&dirty, 1);
        dirty.v[at(0, key_col, 0) + 5] = inf ? -INFINITY : NAN;
        run(&dirty, t, 0);
        check_forward_v(inf ? "-Inf in V" : "NaN in V", t, sees_key, 0, 5);
    }

    /* NaN in a query row: that row only */
    key_col = 7;
    setup(&dirty, 1);
    dirty.q[at(0, key_col, 0)] = NAN;
    run(&dirty, t, 0);
    check_forward("NaN query", t, only_row, 1);

    /* the same under softcap (tanh of NaN is NaN) */
    setup(&clean, 1);
    clean.p.softcap = 5.0f;
    run(&clean, t, 0);
    setup(&dirty, 1);
    dirty.p.softcap = 5.0f;
    dirty.q[at(0, key_col, 0)] = NAN;
    run(&dirty, t, 0);
    check_forward("NaN query, softcap", t, only_row, 1);

    /* rows the mask leaves without a key are empty, NaN inputs or not: seqlen_k = S / 2 under the causal mask
     * leaves the first S / 2 query rows no key. Every query row of (b0, h0) is NaN and so is a value in V: its
     * visible rows are NaN, its empty rows still O = 0 and LSE = -inf (a masked key's weight 0 times NaN must not
     * reach them); the other heads' empty rows too, their visible rows finite. */
    setup(&dirty, 1);
    dirty.p.seqlen_k = S / 2;
    for (int r = 0; r < S; r++) dirty.q[at(0, r, 0) + 1] = NAN;
    dirty.v[at(0, 10, 0) + 4] = NAN;
    {
        const fa_status st = run(&dirty, t, 0);
        int ok = st == FA_OK, row = -1;
        for (int b = 0; b < B && ok; b++)
            for (int h = 0; h < H && ok; h++)
                for (int r = 0; r < S && ok; r++) {
                    const float *o = dirty.o + at(b, r, h), l = dirty.lse[lse_at(b, r, h)];
                    int zero = 1, finite = 1;
                    for (int c = 0; c < D; c++) zero &= o[c] == 0.0f, finite &= isfinite(o[c]);
                    if (r < S / 2)
                        ok = zero && l == -INFINITY;
                    else if (b == 0 && h == 0)
                        ok = all_nan(o, D) && isnan(l);
                    else
                        ok = finite && isfinite(l);
                    if (!ok) row = r;
                }
        th_check(ok, "%s masked rows empty, visible NaN rows NaN (%s%s, row %d)", t->name, fa_status_name(st),
                 st == FA_OK ? "" : fa_last_error(), row);
    }
}

/* NaN or Inf ALiBi slopes are refused before anything is written */
static void alibi_cases(const target *t) {
    const float bad[3] = { NAN, INFINITY, -INFINITY };
    for (int i = 0; i < 3; i++) {
        setup(&dirty, 0);
        dirty.slopes[0] = 0.5f;
        dirty.slopes[1] = bad[i];
        dirty.p.alibi_slopes = dirty.slopes;
        memset(dirty.o, 0x5a, sizeof dirty.o);
        memset(dirty.lse, 0x5a, sizeof dirty.lse);
        memcpy(clean.o, dirty.o, sizeof dirty.o);
        fa_status st = run(&dirty, t, 0);
        th_check(st == FA_ERR_INVALID_ARGUMENT && strstr(fa_last_error(), "alibi_slopes[1]") &&
                     same(dirty.o, clean.o, (int)NQ) && dirty.lse[0] == clean.o[0],
                 "%s ALiBi slope %g refused: %s", t->name, (double)bad[i], fa_last_error());
    }
}

/* The device backends do not read the slopes during validation: a NaN or Inf slope makes every row of its head
 * NaN (its diagonal key's score is NaN: Inf x 0, or NaN), O and LSE, and leaves the other head's bits alone */
static void alibi_device_cases(const target *t) {
    const float bad[3] = { NAN, INFINITY, -INFINITY };
    setup(&clean, 1);
    clean.slopes[0] = 0.5f;
    clean.slopes[1] = 0.25f;
    clean.p.alibi_slopes = clean.slopes;
    fa_status st = run(&clean, t, 0);
    if (st == FA_ERR_UNSUPPORTED) {
        th_unsupported("%s ALiBi: %s", t->name, fa_last_error());
        return;
    }
    for (int i = 0; i < 3 && st == FA_OK; i++) {
        setup(&dirty, 1);
        dirty.slopes[0] = 0.5f;
        dirty.slopes[1] = bad[i];
        dirty.p.alibi_slopes = dirty.slopes;
        const fa_status sd = run(&dirty, t, 0);
        int ok = sd == FA_OK, row = -1;
        for (int b = 0; b < B && ok; b++)
            for (int r = 0; r < S && ok; r++) {
                ok = all_nan(dirty.o + at(b, r, 1), D) && isnan(dirty.lse[lse_at(b, r, 1)]) &&
                     same(dirty.o + at(b, r, 0), clean.o + at(b, r, 0), D) &&
                     same(&dirty.lse[lse_at(b, r, 0)], &clean.lse[lse_at(b, r, 0)], 1);
                if (!ok) row = r;
            }
        th_check(ok, "%s ALiBi slope %g: its head's rows NaN, the other head unchanged (%s, row %d)", t->name,
                 (double)bad[i], fa_status_name(sd), row);
    }
    if (st != FA_OK) th_fail("%s ALiBi clean run: %s", t->name, fa_last_error());
}

/* Backward: a non-finite value in Q, K or V makes NaN the dQ rows of every query it reaches (the query row
 * itself; the rows that see the key) and, for a query row, the dK and dV of every key that row sees; the other
 * batch entry and the other kv head are unchanged (the CPU backend may spread the NaN further inside the same
 * (batch, kv head), through the zero weights of masked keys, so those rows are not checked). */
static void backward_cases(const target *t) {
    setup(&clean, 1);
    if (run(&clean, t, 1) != FA_OK) {
        th_fail("%s clean backward: %s", t->name, fa_last_error());
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
            run(&clean, t, 1);
        }
        target[at(0, r0, 0) + (c == 3 ? 0 : 2)] = c == 3 ? INFINITY : NAN;
        fa_status st = run(&dirty, t, 1);
        int ok = st == FA_OK;
        for (int r = r0; r < (c == 0 ? r0 + 1 : S) && ok; r++) ok = all_nan(dirty.dq + at(0, r, 0), D);
        for (int j = 0; c == 0 && j <= r0 && ok; j++)
            ok = all_nan(dirty.dk + at(0, j, 0), D) && all_nan(dirty.dv + at(0, j, 0), D);
        for (int r = 0; r < S && ok; r++) {
            const size_t o1 = at(1, r, 0), o2 = at(0, r, 1), o3 = at(1, r, 1);
            ok = match(t, 1, dirty.dq + o1, clean.dq + o1, D) && match(t, 1, dirty.dq + o2, clean.dq + o2, D) &&
                 same(dirty.dk + o3, clean.dk + o3, D) && same(dirty.dv + o2, clean.dv + o2, D) &&
                 same(dirty.dk + o1, clean.dk + o1, D) && !any_nan(dirty.dq + o3, D);
        }
        th_check(ok, "%s backward, %s: NaN dQ where it reaches, other batch entry and head unchanged", t->name,
                 site[c]);
    }

    /* rows the mask leaves no key keep dQ = 0 when a V value and a dO row are NaN (a masked key's weight 0 times
     * NaN in dP = dO V^T must not reach them) */
    setup(&dirty, 1);
    dirty.p.seqlen_k = S / 2;
    dirty.v[at(0, 10, 0) + 4] = NAN;
    for (int c = 0; c < D; c++) dirty.dout[at(0, S / 2 + 3, 0) + c] = NAN;
    {
        const fa_status st = run(&dirty, t, 1);
        int ok = st == FA_OK, row = -1;
        for (int b = 0; b < B && ok; b++)
            for (int h = 0; h < H && ok; h++)
                for (int r = 0; r < S / 2 && ok; r++)
                    for (int c = 0; c < D && ok; c++)
                        if (!(ok = dirty.dq[at(b, r, h) + c] == 0.0f)) row = r;
        th_check(ok, "%s backward, empty rows keep dQ = 0 beside NaN (%s, row %d)", t->name, fa_status_name(st), row);
    }
}

/* Varlen: sequences of L0 and B S - L0 tokens packed into the rows of the two batch entries, no mask. A NaN in
 * the second sequence's first row (of Q, K, V or dO) leaves every gradient of the first as in the clean run:
 * the GPU kernels' tiles reach past the first sequence's end into the second's rows. */
enum { L0 = 130 };
static int32_t cu_packed[B + 1] = { 0, L0, B *S };
static void setup_varlen(prob *x) {
    setup(x, 0);
    fa_params *p = &x->p;
    p->seqlen_q = p->seqlen_k = B * S - L0;
    p->cu_seqlens_q = p->cu_seqlens_k = cu_packed;
    p->total_q = p->total_k = B * S;
    float *arrays[8] = { x->q, x->k, x->v, x->o, x->dout, x->dq, x->dk, x->dv };
    fa_tensor *views[8] = { &p->q, &p->k, &p->v, &p->o, &p->dout, &p->dq, &p->dk, &p->dv };
    for (int i = 0; i < 8; i++) *views[i] = fa_tensor_contiguous(arrays[i], B * S, H, D);
}

static void varlen_cases(const target *t) {
    setup_varlen(&clean);
    if (run(&clean, t, 1) != FA_OK) {
        th_fail("%s clean varlen backward: %s", t->name, fa_last_error());
        return;
    }
    static const char *const site[4] = { "NaN query", "NaN key", "NaN in V", "NaN in dO" };
    for (int c = 0; c < 4; c++) {
        setup_varlen(&dirty);
        float *target = c == 0 ? dirty.q : c == 1 ? dirty.k : c == 2 ? dirty.v : dirty.dout;
        target[((size_t)L0 * H + 0) * D + 2] = NAN; /* token L0 = the second sequence's row 0, head 0 */
        const fa_status st = run(&dirty, t, 1);
        int ok = st == FA_OK, bad = -1, head = -1;
        const char *what = "";
        for (int r = 0; r < L0 && ok; r++)
            for (int h = 0; h < H && ok; h++) {
                const size_t o = ((size_t)r * H + h) * D;
                const size_t l = (size_t)h * B * S + r; /* varlen LSE: (heads, total) */
                what = !same(dirty.o + o, clean.o + o, D)            ? "O"
                       : !same(dirty.lse + l, clean.lse + l, 1)      ? "LSE"
                       : !match(t, 1, dirty.dq + o, clean.dq + o, D) ? "dQ"
                       : !same(dirty.dk + o, clean.dk + o, D)        ? "dK"
                       : !same(dirty.dv + o, clean.dv + o, D)        ? "dV"
                                                                     : "";
                if (!(ok = !*what)) bad = r, head = h;
            }
        th_check(
            ok,
            "%s varlen backward, %s in the second sequence: the first's gradients unchanged (%s; %s row %d head %d)",
            t->name, site[c], fa_status_name(st), what, bad, head);
    }
}

/* Whether a device target runs here: a GPU, the backend built, and for FA3 compute capability 9.0 (a skip line
 * otherwise). */
static int device_target_runs(const target *t) {
    fa_device_info info;
    if (!fa_backend_built(t->backend))
        th_skip("%s: skipped (not built into this library)", t->name);
    else if (fa_device_count() <= 0 || fa_device_get_info(0, &info) != FA_OK)
        th_skip("%s: skipped (no GPU)", t->name);
    else if (t->kernel == FA_KERNEL_FA3 && (info.cc_major != 9 || info.cc_minor != 0))
        th_skip("%s: skipped (the FA3 kernel needs compute capability 9.0)", t->name);
    else
        return 1;
    return 0;
}

static void run_target(const target *t) {
    if (th_selected("forward")) forward_cases(t);
    if (th_selected("alibi")) t->device ? alibi_device_cases(t) : alibi_cases(t);
    if (th_selected("backward")) backward_cases(t);
    if (th_selected("varlen")) varlen_cases(t);
}

int main(int argc, char **argv) {
    th_init(argc, argv, NULL);
    for (int i = 0; i < 3; i++) run_target(&host_targets[i]);
    for (int i = 0; i < 3; i++)
        if (device_target_runs(&device_targets[i])) run_target(&device_targets[i]);
    return th_finish();
}
