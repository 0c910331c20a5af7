/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_api.c - the C API's contract apart from the numbers: every invalid argument returns its status, names
 * the offending field in fa_last_error() and leaves every output untouched; status strings; version and
 * struct sizes; workspace size checks; backends that are not built or have no device; fa_flops_fwd; calls
 * from several threads at once.
 */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check/verify.h"
#include "harness.h"

/* ---- invalid arguments ---- */

/* A valid problem whose outputs hold the poison; a case mutates copies of its params and exec. */
static vf_problem base, base_varlen, base_fp8;

typedef struct snapshot {
    unsigned char *bytes[6];
    size_t size[6];
} snapshot;

static void output_buffers(vf_problem *pr, void **ptr, size_t *size) {
    const size_t es = pr->cfg.dtype == FA_F32 ? 4 : 2;
    vf_tensor *t[5] = { &pr->o, &pr->dq, &pr->dk, &pr->dv, &pr->dout };
    for (int i = 0; i < 5; i++) ptr[i] = t[i]->host, size[i] = (size_t)t[i]->elems * es;
    ptr[5] = pr->lse;
    size[5] = sizeof(float) * (size_t)pr->lse_elems;
}

static void snapshot_take(vf_problem *pr, snapshot *s) {
    void *ptr[6];
    output_buffers(pr, ptr, s->size);
    for (int i = 0; i < 6; i++) {
        s->bytes[i] = malloc(s->size[i] + 1);
        if (s->bytes[i]) memcpy(s->bytes[i], ptr[i], s->size[i]);
    }
}

static int snapshot_same(vf_problem *pr, snapshot *s) {
    void *ptr[6];
    size_t size[6];
    int same = 1;
    output_buffers(pr, ptr, size);
    for (int i = 0; i < 6; i++) {
        same = same && s->bytes[i] && !memcmp(s->bytes[i], ptr[i], size[i]);
        free(s->bytes[i]);
    }
    return same;
}

typedef void (*mutate_fn)(fa_params *p, fa_exec *x);

/* Runs the call on a mutated copy: the expected status, a message containing `field`, outputs untouched,
 * and fa_check agreeing. */
static void expect_error(const char *name, int varlen, int backward, mutate_fn mutate, fa_status want,
                         const char *field) {
    char full[160];
    snprintf(full, sizeof full, "invalid %s %s", backward ? "bwd" : "fwd", name);
    if (!th_selected(full)) return;
    vf_problem *pr = varlen == 2 ? &base_fp8 : varlen ? &base_varlen : &base;
    fa_params p = pr->p;
    fa_exec x;
    memset(&x, 0, sizeof x);
    x.backend = FA_BACKEND_CPU;
    x.device = -1;
    mutate(&p, &x);
    if (!backward) vf_poison_outputs(pr, 0); /* the backward cases need o and lse: see refresh_forward */
    snapshot s;
    snapshot_take(pr, &s);
    fa_status st = backward ? fa_bwd(&p, &x) : fa_fwd(&p, &x);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", fa_last_error());
    fa_status chk = fa_check(&p, &x, backward);
    const int same = snapshot_same(pr, &s);
    const int named = field == NULL || strstr(msg, field) != NULL;
    th_check(st == want && chk == want && named && same, "%-52s %s (want %s) \"%s\"%s%s%s", full, fa_status_name(st),
             fa_status_name(want), msg, chk == want ? "" : " fa_check differs", named ? "" : " - field not named",
             same ? "" : " - OUTPUT MODIFIED");
}

#define MUTATION(fn_name, body)                     \
    static void fn_name(fa_params *p, fa_exec *x) { \
        (void)p;                                    \
        (void)x;                                    \
        body;                                       \
    }

MUTATION(m_dtype, p->dtype = (fa_dtype)7)
MUTATION(m_batch0, p->batch = 0)
MUTATION(m_batch_neg, p->batch = -3)
MUTATION(m_seqlen_q0, p->seqlen_q = 0)
MUTATION(m_seqlen_k_neg, p->seqlen_k = -1)
MUTATION(m_heads_q0, p->heads_q = 0)
MUTATION(m_heads_kv0, p->heads_kv = 0)
MUTATION(m_heads_ratio, p->heads_q = 4; p->heads_kv = 3)
MUTATION(m_head_dim0, p->head_dim = 0)
MUTATION(m_head_dim12, p->head_dim = 12)
MUTATION(m_head_dim264, p->head_dim = 264)
MUTATION(m_q_null, p->q.data = NULL)
MUTATION(m_k_null, p->k.data = NULL)
MUTATION(m_v_null, p->v.data = NULL)
MUTATION(m_o_null, p->o.data = NULL)
MUTATION(m_q_stride, p->q.stride_seq = -1)
MUTATION(m_k_stride_head, p->k.stride_head = -5)
MUTATION(m_v_stride_batch, p->v.stride_batch = -1)
MUTATION(m_o_overlap, p->o.stride_seq = 1)
MUTATION(m_o_overlap_head, p->o.stride_head = 0)
MUTATION(m_scale_nan, p->softmax_scale = NAN)
MUTATION(m_scale_inf, p->softmax_scale = INFINITY)
MUTATION(m_causal2, p->causal = 2)
MUTATION(m_window_left, p->window_left = -2)
MUTATION(m_window_right, p->window_right = -7)
MUTATION(m_softcap_neg, p->softcap = -1.0f)
MUTATION(m_softcap_inf, p->softcap = INFINITY)
MUTATION(m_alibi_stride_neg, p->alibi_batch_stride = -1)
MUTATION(m_alibi_stride_small, p->alibi_batch_stride = 1)
MUTATION(m_deterministic, p->deterministic = 3)
MUTATION(m_threads, x->num_threads = -1)
MUTATION(m_threads_ok, x->num_threads = 1)
MUTATION(m_ws_zero, x->workspace = p->o.data; x->workspace_bytes = 0)
MUTATION(m_kernel, x->kernel = (fa_kernel)7)
MUTATION(m_backend, x->backend = (fa_backend)42)
MUTATION(m_cu_only_q, p->cu_seqlens_k = NULL)
MUTATION(m_lse_null, p->lse = NULL)
MUTATION(m_dout_null, p->dout.data = NULL)
MUTATION(m_dq_null, p->dq.data = NULL)
MUTATION(m_dk_null, p->dk.data = NULL)
MUTATION(m_dv_null, p->dv.data = NULL)
MUTATION(m_dk_overlap, p->dk.stride_head = 1)
MUTATION(m_total_q_neg, p->total_q = -1)
MUTATION(m_o_extent, p->o.stride_batch = INT64_MAX / 2)
MUTATION(m_q_extent, p->q.stride_seq = INT64_MAX / 8)
MUTATION(m_k_bytes, p->k.stride_head = INT64_MAX / 4) /* fits in elements, not in bytes */
MUTATION(m_dq_extent, p->dq.stride_batch = INT64_MAX / 2)
MUTATION(m_q_misaligned, p->q.data = (char *)p->q.data + 1)
MUTATION(m_v_misaligned, p->v.data = (char *)p->v.data + 2)
MUTATION(m_lse_misaligned, p->lse = (float *)((char *)p->lse + 1))
MUTATION(m_dv_misaligned, p->dv.data = (char *)p->dv.data + 3)
MUTATION(m_o_is_q, p->o = p->q)
MUTATION(m_o_in_v, p->o.data = p->v.data)
MUTATION(m_lse_in_o, p->lse = (float *)p->o.data + 3)
MUTATION(m_dq_is_dk, p->dk.data = p->dq.data)
MUTATION(m_dv_in_dout, p->dv.data = (float *)p->dout.data + 8)
MUTATION(m_dk_in_lse, p->dk.data = p->lse)
MUTATION(m_dq_is_o, p->dq = p->o)
MUTATION(m_total_k_neg, p->total_k = -4)

/* e4m3 inputs (base_fp8: descales per 4 rows) */
static float bad_descale[64];
MUTATION(m_descale_f32, p->k_descale = bad_descale)
MUTATION(m_out_dtype, p->out_dtype = FA_F32)
MUTATION(m_out_dtype_e4m3, p->out_dtype = FA_E4M3)
MUTATION(m_descale_block_neg, p->descale_block_k = -1)
/* the descales of base_fp8 (blocks of 4 rows): q's batch * heads_q * seqlen_q / 4, k's and v's likewise */
static size_t descale_bytes(const fa_params *p, int query) {
    const int64_t heads = query ? p->heads_q : p->heads_kv, len = query ? p->seqlen_q : p->seqlen_k;
    return sizeof(float) * (size_t)(p->batch * heads * ((len + p->descale_block_k - 1) / p->descale_block_k));
}
MUTATION(m_descale_nan, memcpy(bad_descale, p->v_descale, descale_bytes(p, 0)); bad_descale[5] = NAN;
         p->v_descale = bad_descale)
MUTATION(m_descale_neg, memcpy(bad_descale, p->q_descale, descale_bytes(p, 1)); bad_descale[0] = -1.0f;
         p->q_descale = bad_descale)
MUTATION(m_descale_misaligned, p->k_descale = (const float *)((const char *)p->k_descale + 2))
MUTATION(m_descale_in_o, p->q_descale = (const float *)p->o.data)
MUTATION(m_o_misaligned_fp8, p->o.data = (char *)p->o.data + 1)

/* varlen mutations that need to write cu_seqlens: work on a copy */
static int32_t cu_copy[16];
static void copy_cu(fa_params *p) {
    memcpy(cu_copy, p->cu_seqlens_q, sizeof(int32_t) * (size_t)(p->batch + 1));
    p->cu_seqlens_q = cu_copy;
}
MUTATION(m_cu_start, copy_cu(p); cu_copy[0] = 1)
MUTATION(m_cu_decreasing, copy_cu(p); cu_copy[2] = cu_copy[1] - 1)
MUTATION(m_cu_too_long, copy_cu(p); p->seqlen_q = 1; cu_copy[1] = cu_copy[0] + 2)
MUTATION(m_cu_total, p->total_q = p->cu_seqlens_q[p->batch] - 1)

/* The forward's o and lse, which the backward reads, after forward cases poisoned them. */
static void refresh_forward(void) {
    fa_exec x;
    memset(&x, 0, sizeof x);
    x.backend = FA_BACKEND_REFERENCE;
    if (vf_run(&base, &x, 0) != FA_OK || vf_run(&base_varlen, &x, 0) != FA_OK)
        th_fail("reference forward: %s", fa_last_error());
}

static void invalid_arguments(void) {
    const fa_status I = FA_ERR_INVALID_ARGUMENT, U = FA_ERR_UNSUPPORTED;
    struct {
        const char *name;
        mutate_fn fn;
        fa_status want;
        const char *field;
    } fwd[] = {
        { "dtype", m_dtype, I, "dtype" },
        { "batch 0", m_batch0, I, "batch" },
        { "batch -3", m_batch_neg, I, "batch" },
        { "seqlen_q 0 (dense)", m_seqlen_q0, I, "seqlen_q" },
        { "seqlen_k -1", m_seqlen_k_neg, I, "seqlen_k" },
        { "heads_q 0", m_heads_q0, I, "heads_q" },
        { "heads_kv 0", m_heads_kv0, I, "heads_kv" },
        { "heads_q 4 / heads_kv 3", m_heads_ratio, I, "heads_kv" },
        { "head_dim 0", m_head_dim0, I, "head_dim" },
        { "head_dim 12", m_head_dim12, U, "head_dim" },
        { "head_dim 264", m_head_dim264, U, "head_dim" },
        { "q NULL", m_q_null, I, "q" },
        { "k NULL", m_k_null, I, "k" },
        { "v NULL", m_v_null, I, "v" },
        { "o NULL", m_o_null, I, "o" },
        { "q.stride_seq -1", m_q_stride, I, "q.stride_seq" },
        { "k.stride_head -5", m_k_stride_head, I, "k.stride_head" },
        { "v.stride_batch -1", m_v_stride_batch, I, "v.stride_batch" },
        { "o rows overlap", m_o_overlap, I, "o.stride" },
        { "o heads overlap", m_o_overlap_head, I, "o.stride" },
        { "softmax_scale NaN", m_scale_nan, I, "softmax_scale" },
        { "softmax_scale inf", m_scale_inf, I, "softmax_scale" },
        { "causal 2", m_causal2, I, "causal" },
        { "window_left -2", m_window_left, I, "window_left" },
        { "window_right -7", m_window_right, I, "window_right" },
        { "softcap -1", m_softcap_neg, I, "softcap" },
        { "softcap inf", m_softcap_inf, I, "softcap" },
        { "alibi_batch_stride -1", m_alibi_stride_neg, I, "alibi_batch_stride" },
        { "alibi_batch_stride < heads_q", m_alibi_stride_small, I, "alibi_batch_stride" },
        { "deterministic 3", m_deterministic, I, "deterministic" },
        { "exec.num_threads -1", m_threads, I, "num_threads" },
        { "exec.workspace without bytes", m_ws_zero, I, "workspace" },
        { "exec.kernel 7", m_kernel, I, "kernel" },
        { "exec.backend 42", m_backend, I, "backend" },
        { "o.stride_batch INT64_MAX/2", m_o_extent, I, "o.stride_batch" },
        { "q.stride_seq INT64_MAX/8", m_q_extent, I, "q.stride_seq" },
        { "k.stride_head in bytes", m_k_bytes, I, "k.stride_head" },
        { "q misaligned", m_q_misaligned, I, "q.data" },
        { "v misaligned", m_v_misaligned, I, "v.data" },
        { "lse misaligned", m_lse_misaligned, I, "lse" },
        { "o is q", m_o_is_q, I, "q and o overlap" },
        { "o on v", m_o_in_v, I, "v and o overlap" },
        { "lse inside o", m_lse_in_o, I, "o and lse overlap" },
    };
    for (size_t i = 0; i < sizeof fwd / sizeof fwd[0]; i++)
        expect_error(fwd[i].name, 0, 0, fwd[i].fn, fwd[i].want, fwd[i].field);

    struct {
        const char *name;
        mutate_fn fn;
        const char *field;
    } bwd[] = {
        { "lse NULL", m_lse_null, "lse" },
        { "dout NULL", m_dout_null, "dout" },
        { "dq NULL", m_dq_null, "dq" },
        { "dk NULL", m_dk_null, "dk" },
        { "dv NULL", m_dv_null, "dv" },
        { "dk heads overlap", m_dk_overlap, "dk.stride" },
        { "heads_q 4 / heads_kv 3", m_heads_ratio, "heads" },
        { "causal 2", m_causal2, "causal" },
        { "dq.stride_batch INT64_MAX/2", m_dq_extent, "dq.stride_batch" },
        { "dv misaligned", m_dv_misaligned, "dv.data" },
        { "dk is dq", m_dq_is_dk, "dq and dk overlap" },
        { "dv inside dout", m_dv_in_dout, "dout and dv overlap" },
        { "dk on lse", m_dk_in_lse, "dk and lse overlap" },
        { "dq is o", m_dq_is_o, "o and dq overlap" },
    };

    struct {
        const char *name;
        mutate_fn fn;
        const char *field;
    } var[] = {
        { "cu_seqlens_k NULL only", m_cu_only_q, "cu_seqlens" },
        { "cu_seqlens_q[0] != 0", m_cu_start, "cu_seqlens_q" },
        { "cu_seqlens_q decreasing", m_cu_decreasing, "cu_seqlens_q" },
        { "sequence longer than seqlen_q", m_cu_too_long, "cu_seqlens_q" },
        { "cu_seqlens_q[batch] > total_q", m_cu_total, "cu_seqlens_q" },
        { "total_q -1", m_total_q_neg, "total_q" },
        { "total_k -4", m_total_k_neg, "total_k" },
    };
    char name[96];
    for (size_t i = 0; i < sizeof var / sizeof var[0]; i++) {
        snprintf(name, sizeof name, "varlen %s", var[i].name);
        expect_error(name, 1, 0, var[i].fn, I, var[i].field);
    }
    refresh_forward();
    for (size_t i = 0; i < sizeof bwd / sizeof bwd[0]; i++) expect_error(bwd[i].name, 0, 1, bwd[i].fn, I, bwd[i].field);
    for (size_t i = 0; i < sizeof var / sizeof var[0]; i++) {
        snprintf(name, sizeof name, "varlen %s", var[i].name);
        expect_error(name, 1, 1, var[i].fn, I, var[i].field);
    }

    struct {
        const char *name;
        mutate_fn fn;
        fa_status want;
        const char *field;
    } fp8[] = {
        { "e4m3 out_dtype f32", m_out_dtype, I, "out_dtype" },
        { "e4m3 out_dtype e4m3", m_out_dtype_e4m3, I, "out_dtype" },
        { "e4m3 descale_block_k -1", m_descale_block_neg, I, "descale_block_k" },
        { "e4m3 v_descale NaN", m_descale_nan, I, "v_descale[5]" },
        { "e4m3 q_descale negative", m_descale_neg, I, "q_descale[0]" },
        { "e4m3 k_descale misaligned", m_descale_misaligned, I, "k_descale" },
        { "e4m3 q_descale inside o", m_descale_in_o, I, "o and q_descale overlap" },
        { "e4m3 o misaligned (bf16)", m_o_misaligned_fp8, I, "o.data" },
    };
    for (size_t i = 0; i < sizeof fp8 / sizeof fp8[0]; i++)
        expect_error(fp8[i].name, 2, 0, fp8[i].fn, fp8[i].want, fp8[i].field);
    expect_error("e4m3 backward", 2, 1, m_threads_ok, U, "FA_E4M3");
    expect_error("k_descale with f32 inputs", 0, 0, m_descale_f32, I, "k_descale");

    if (th_selected("invalid NULL params")) {
        fa_exec x;
        memset(&x, 0, sizeof x);
        fa_status a = fa_fwd(NULL, &x), b = fa_bwd(NULL, NULL), c = fa_check(NULL, NULL, 0);
        th_check(a == FA_ERR_INVALID_ARGUMENT && b == a && c == a && strstr(fa_last_error(), "params"),
                 "invalid NULL params: fa_fwd/fa_bwd/fa_check -> %s \"%s\"", fa_status_name(a), fa_last_error());
    }
}

/* ---- accepted limits ---- */

/* Inputs may share memory; an output without elements may have any strides; any thread count is capped, not
 * fatal, and does not change the forward's bits. */
static void limits(void) {
    if (!th_selected("limits")) return;
    fa_exec x;
    memset(&x, 0, sizeof x);
    x.backend = FA_BACKEND_CPU;
    fa_params p = base.p;
    p.v = p.k;
    fa_status st = fa_fwd(&p, &x);
    th_check(st == FA_OK, "limits: v and k on the same memory (inputs) -> %s \"%s\"", fa_status_name(st),
             fa_last_error());

    /* a varlen batch of no query rows has no output element: any output stride is fine */
    static const int32_t no_rows[5] = { 0, 0, 0, 0, 0 };
    p = base_varlen.p;
    p.cu_seqlens_q = no_rows, p.total_q = 0;
    p.o.stride_seq = p.o.stride_head = 0;
    st = fa_fwd(&p, &x);
    th_check(st == FA_OK, "limits: varlen without query rows, output strides 0 -> %s \"%s\"", fa_status_name(st),
             fa_last_error());

    const size_t bytes = sizeof(float) * (size_t)base.o.elems;
    unsigned char *one = malloc(bytes), *many = malloc(bytes);
    x.num_threads = 1;
    st = fa_fwd(&base.p, &x);
    if (one) memcpy(one, base.o.host, bytes);
    const int32_t counts[3] = { 40000, 100000, INT32_MAX };
    for (int i = 0; i < 3; i++) {
        size_t ws_many = 0, ws_tasks = 0;
        x.num_threads = counts[i];
        fa_status a = fa_workspace_size(&base.p, &x, 1, &ws_many);
        x.num_threads = base.p.batch * base.p.heads_q; /* at least the backward's tasks of this problem */
        fa_status b = fa_workspace_size(&base.p, &x, 1, &ws_tasks);
        x.num_threads = counts[i];
        vf_poison_outputs(&base, 0);
        fa_status c = fa_fwd(&base.p, &x);
        if (many) memcpy(many, base.o.host, bytes);
        th_check(st == FA_OK && a == FA_OK && b == FA_OK && c == FA_OK && ws_many == ws_tasks && one && many &&
                     !memcmp(one, many, bytes),
                 "limits: num_threads %d capped: backward workspace %zu bytes (as for the task count: %zu), forward "
                 "%s, O as with 1 thread",
                 counts[i], ws_many, ws_tasks, fa_status_name(c));
    }
    free(one), free(many);
}

/* ---- workspace ---- */

static void workspace(void) {
    if (!th_selected("workspace")) return;
    for (int backward = 0; backward < 2; backward++) {
        fa_exec x;
        memset(&x, 0, sizeof x);
        x.backend = FA_BACKEND_CPU;
        size_t need = 0;
        fa_status st = fa_workspace_size(&base.p, &x, backward, &need);
        if (st != FA_OK) {
            th_check(st == FA_ERR_UNSUPPORTED, "workspace %s: fa_workspace_size -> %s \"%s\"", backward ? "bwd" : "fwd",
                     fa_status_name(st), fa_last_error());
            continue;
        }
        if (need == 0) {
            th_skip("workspace too small %s: the CPU backend needs no workspace for this problem",
                    backward ? "bwd" : "fwd");
            continue;
        }
        unsigned char *ws = malloc(need);
        x.workspace = ws;
        x.workspace_bytes = need - 1;
        snapshot s;
        snapshot_take(&base, &s);
        st = backward ? fa_bwd(&base.p, &x) : fa_fwd(&base.p, &x);
        const int same = snapshot_same(&base, &s);
        const int named = strstr(fa_last_error(), "workspace") != NULL;
        th_check(st == FA_ERR_WORKSPACE_TOO_SMALL && same && named,
                 "workspace too small %s: %zu of %zu bytes -> %s \"%s\"%s", backward ? "bwd" : "fwd", need - 1, need,
                 fa_status_name(st), fa_last_error(), same ? "" : " - OUTPUT MODIFIED");
        free(ws);
    }
    fa_exec x;
    memset(&x, 0, sizeof x);
    fa_status st = fa_workspace_size(&base.p, &x, 0, NULL);
    th_check(st == FA_ERR_INVALID_ARGUMENT && strstr(fa_last_error(), "bytes"), "workspace size into NULL -> %s \"%s\"",
             fa_status_name(st), fa_last_error());
}

/* ---- statuses, version, sizes, build ---- */

static void strings(void) {
    if (!th_selected("status strings")) return;
    const char *names[9] = { "FA_OK",
                             "FA_ERR_INVALID_ARGUMENT",
                             "FA_ERR_UNSUPPORTED",
                             "FA_ERR_NOT_COMPILED",
                             "FA_ERR_NO_DEVICE",
                             "FA_ERR_WORKSPACE_TOO_SMALL",
                             "FA_ERR_OUT_OF_MEMORY",
                             "FA_ERR_DEVICE",
                             "FA_ERR_INTERNAL" };
    for (int s = 0; s <= 8; s++) {
        const char *n = fa_status_name((fa_status)s), *e = fa_strerror((fa_status)s);
        int distinct = 1;
        for (int t = 0; t < s; t++) distinct = distinct && strcmp(e, fa_strerror((fa_status)t)) != 0;
        th_check(n && e && !strcmp(n, names[s]) && *e && distinct, "status strings %d: %s \"%s\"", s, n ? n : "(null)",
                 e ? e : "(null)");
    }
    const int unknown[3] = { 9, -1, 1000 };
    for (int i = 0; i < 3; i++) {
        const char *n = fa_status_name((fa_status)unknown[i]), *e = fa_strerror((fa_status)unknown[i]);
        th_check(n && e && *n && *e && strcmp(e, fa_strerror(FA_OK)), "status strings unknown %d: %s \"%s\"",
                 unknown[i], n ? n : "(null)", e ? e : "(null)");
    }
}

static void introspection(void) {
    if (th_selected("version")) {
        th_check(fa_version_number() == FA_VERSION_NUMBER, "version: library %d, header %d", fa_version_number(),
                 FA_VERSION_NUMBER);
        th_check(FA_VERSION_NUMBER == FA_VERSION_MAJOR * 10000 + FA_VERSION_MINOR * 100 + FA_VERSION_PATCH,
                 "version: FA_VERSION_NUMBER is major * 10000 + minor * 100 + patch");
    }
    if (th_selected("sizeof")) {
        th_check(fa_params_sizeof() == sizeof(fa_params), "sizeof fa_params: library %zu, header %zu",
                 fa_params_sizeof(), sizeof(fa_params));
        th_check(fa_exec_sizeof() == sizeof(fa_exec), "sizeof fa_exec: library %zu, header %zu", fa_exec_sizeof(),
                 sizeof(fa_exec));
    }
    if (th_selected("build info")) {
        const char *b = fa_build_info();
        th_check(b && strstr(b, "flashattn") != NULL, "build info: \"%s\"", b ? b : "(null)");
        th_check(fa_backend_built(FA_BACKEND_AUTO) && fa_backend_built(FA_BACKEND_CPU) &&
                     fa_backend_built(FA_BACKEND_REFERENCE) && !fa_backend_built((fa_backend)42),
                 "build info: auto, cpu and reference are always built, backend 42 is not");
        th_check(fa_backend_built(FA_BACKEND_CUDA) || !fa_backend_built(FA_BACKEND_NAIVE),
                 "build info: naive is built only with cuda (cuda %d, naive %d)", fa_backend_built(FA_BACKEND_CUDA),
                 fa_backend_built(FA_BACKEND_NAIVE));
        /* The CUDA kernels' head dims, ascending, where the Python binding reads them: "hdims=32,64,..." */
        const char *h = b ? strstr(b, " hdims=") : NULL;
        int ascending = h != NULL, prev = 0, n = 0;
        for (const char *c = h ? h + 7 : ""; ascending && *c >= '0' && *c <= '9'; n++) {
            char *end;
            const long d = strtol(c, &end, 10);
            ascending = d > prev && d % 8 == 0 && (*end == ',' || *end == ' ' || *end == '\0');
            prev = (int)d;
            c = *end == ',' ? end + 1 : end;
        }
        th_check(fa_backend_built(FA_BACKEND_CUDA) ? ascending && n > 0 : h == NULL,
                 "build info: hdims= lists the CUDA head dims, ascending (CUDA %s): \"%s\"",
                 fa_backend_built(FA_BACKEND_CUDA) ? "built" : "not built", b ? b : "(null)");
    }
    if (th_selected("params init")) {
        fa_params p;
        memset(&p, 0xab, sizeof p);
        fa_status st = fa_params_init(&p, FA_BF16, 2, 3, 5, 8, 2, 64);
        th_check(st == FA_OK && p.dtype == FA_BF16 && p.batch == 2 && p.seqlen_q == 3 && p.seqlen_k == 5 &&
                     p.heads_q == 8 && p.heads_kv == 2 && p.head_dim == 64 && p.softmax_scale == 0.0f &&
                     p.causal == 0 && p.window_left == -1 && p.window_right == -1 && p.softcap == 0.0f &&
                     p.alibi_slopes == NULL && p.cu_seqlens_q == NULL && p.cu_seqlens_k == NULL && p.q.data == NULL &&
                     p.lse == NULL && p.deterministic == 0,
                 "params init: sizes set, defaults (scale 0, windows -1, no mask, dense, NULL tensors)");
        th_check(fa_params_init(NULL, FA_F32, 1, 1, 1, 1, 1, 8) == FA_ERR_INVALID_ARGUMENT, "params init: NULL -> %s",
                 fa_status_name(FA_ERR_INVALID_ARGUMENT));
        float x[1];
        fa_tensor t = fa_tensor_contiguous(x, 7, 3, 16);
        th_check(t.data == x && t.stride_head == 16 && t.stride_seq == 48 && t.stride_batch == 7 * 48,
                 "params init: fa_tensor_contiguous strides (head 16, seq 48, batch 336)");
    }
    if (th_selected("last error")) {
        fa_exec x;
        memset(&x, 0, sizeof x);
        fa_params p = base.p;
        p.batch = 0;
        fa_check(&p, &x, 0);
        const int set = fa_last_error()[0] != '\0';
        fa_status st = fa_check(&base.p, &x, 0);
        th_check(set && st == FA_OK && fa_last_error()[0] == '\0',
                 "last error: set by a failure, empty after a successful call");
    }
}

/* ---- backends that are not built or have no device ---- */

static void unavailable_backends(void) {
    if (!th_selected("backend unavailable")) return;
    const fa_backend devs[2] = { FA_BACKEND_CUDA, FA_BACKEND_NAIVE };
    const char *names[2] = { "cuda", "naive" };
    for (int i = 0; i < 2; i++) {
        if (fa_device_count() > 0) {
            th_skip("backend unavailable %s: a GPU is present", names[i]);
            continue;
        }
        const fa_status want = fa_backend_built(devs[i]) ? FA_ERR_NO_DEVICE : FA_ERR_NOT_COMPILED;
        fa_exec x;
        memset(&x, 0, sizeof x);
        x.backend = devs[i];
        snapshot s;
        snapshot_take(&base, &s);
        fa_status st = fa_fwd(&base.p, &x);
        size_t ws = 0;
        fa_status wst = fa_workspace_size(&base.p, &x, 1, &ws);
        fa_status chk = fa_check(&base.p, &x, 1);
        const int same = snapshot_same(&base, &s);
        th_check(st == want && wst == want && chk == want && same,
                 "backend unavailable %s: fwd %s, workspace %s, check %s (want %s) \"%s\"", names[i],
                 fa_status_name(st), fa_status_name(wst), fa_status_name(chk), fa_status_name(want), fa_last_error());
    }
    fa_device_info info;
    if (fa_device_count() == 0) {
        fa_status st = fa_device_get_info(0, &info);
        th_check(st == FA_ERR_NO_DEVICE || st == FA_ERR_NOT_COMPILED,
                 "backend unavailable: device info of device 0 -> %s", fa_status_name(st));
    }
    th_check(fa_device_get_info(0, NULL) == FA_ERR_INVALID_ARGUMENT, "backend unavailable: device info into NULL");
    fa_status st = fa_device_get_info(1000, &info);
    th_check(st != FA_OK, "backend unavailable: device info of device 1000 -> %s", fa_status_name(st));
    /* AUTO with host pointers runs on the CPU */
    fa_exec x;
    memset(&x, 0, sizeof x);
    st = fa_check(&base.p, &x, 0);
    th_check(st == FA_OK, "backend unavailable: AUTO with host pointers -> %s", fa_status_name(st));
}

/* ---- FLOP count ---- */

static void flops(void) {
    if (!th_selected("flops")) return;
    fa_params p;
    fa_params_init(&p, FA_BF16, 2, 100, 300, 8, 2, 64);
    double want = 4.0 * 2 * 100 * 300 * 64 * 8, got = fa_flops_fwd(&p, NULL, NULL);
    th_check(got == want, "flops dense: %.0f (want %.0f)", got, want);
    p.causal = 1;
    got = fa_flops_fwd(&p, NULL, NULL);
    th_check(got == want / 2, "flops causal: %.0f (want %.0f)", got, want / 2);
    p.causal = 0;
    const int32_t cq[3] = { 0, 10, 40 }, ck[3] = { 0, 0, 50 };
    got = fa_flops_fwd(&p, cq, ck);
    want = 4.0 * (10 * 0 + 30 * 50) * 64 * 8;
    th_check(got == want, "flops varlen: %.0f (want %.0f)", got, want);
    th_check(fa_flops_fwd(NULL, NULL, NULL) == 0.0, "flops of NULL params is 0");
}

/* ---- calls from several threads at once ---- */

/* Each thread runs its own problem (forward, backward, then a call refused for a value only it uses) three
 * times on the CPU backend with two OpenMP threads of its own; every thread reads its error only once all of
 * them have failed their call (a barrier), so one shared message could not pass. The main thread compares
 * afterwards, since the harness's counters are not thread-safe. */
#define CONC_THREADS 8
static pthread_barrier_t conc_barrier;
typedef struct conc_task {
    int index;
    vf_problem pr;
    unsigned char *want[2], *got; /* the serial outputs (forward, backward); scratch */
    size_t bytes[2];
    int calls_ok, same, errors_own, errors_clear;
} conc_task;

static void *conc_run(void *arg) {
    conc_task *t = arg;
    fa_exec x;
    memset(&x, 0, sizeof x);
    x.backend = FA_BACKEND_CPU, x.num_threads = 2;
    char want[64];
    snprintf(want, sizeof want, "window_left (%d)", -2 - t->index);
    for (int round = 0; round < 3; round++) {
        for (int bwd = 0; bwd < 2; bwd++) {
            if (vf_run(&t->pr, &x, bwd) != FA_OK) continue;
            t->calls_ok++;
            t->errors_clear += fa_last_error()[0] == '\0';
            vf_outputs_save(&t->pr, bwd, t->got);
            t->same += !memcmp(t->got, t->want[bwd], t->bytes[bwd]);
        }
        fa_params p = *vf_params_for(&t->pr, FA_BACKEND_CPU);
        p.window_left = -2 - t->index;
        const fa_status st = fa_fwd(&p, &x);
        pthread_barrier_wait(&conc_barrier); /* every thread has failed its call */
        t->errors_own += st == FA_ERR_INVALID_ARGUMENT && strstr(fa_last_error(), want) != NULL;
        pthread_barrier_wait(&conc_barrier); /* every thread has read its error */
    }
    return NULL;
}

static void concurrent_calls(void) {
    conc_task tasks[CONC_THREADS];
    pthread_t threads[CONC_THREADS];
    fa_exec x;
    memset(&x, 0, sizeof x);
    x.backend = FA_BACKEND_CPU, x.num_threads = 2;
    int ready = 1;
    for (int i = 0; i < CONC_THREADS; i++) {
        conc_task *t = &tasks[i];
        memset(t, 0, sizeof *t);
        t->index = i;
        vf_config c;
        vf_config_init(&c);
        c.batch = 1 + i % 3, c.seqlen_q = 17 + 9 * i, c.seqlen_k = 40 + 5 * i, c.heads_q = 4, c.heads_kv = 1 + i % 2;
        c.head_dim = i % 2 ? 64 : 32, c.causal = i % 3 == 0, c.dtype = i % 4 == 3 ? FA_BF16 : FA_F32;
        c.seed = 1000 + (uint64_t)i;
        if (vf_problem_create(&t->pr, &c) != FA_OK) {
            ready = 0;
            continue;
        }
        for (int bwd = 0; bwd < 2; bwd++) {
            t->bytes[bwd] = vf_outputs_bytes(&t->pr, bwd);
            t->want[bwd] = malloc(t->bytes[bwd]);
            if (!t->want[bwd] || vf_run(&t->pr, &x, bwd) != FA_OK) {
                ready = 0;
                continue;
            }
            vf_outputs_save(&t->pr, bwd, t->want[bwd]);
        }
        t->got = malloc(t->bytes[0] > t->bytes[1] ? t->bytes[0] : t->bytes[1]);
        ready = ready && t->got;
    }
    int started = 0;
    if (ready && pthread_barrier_init(&conc_barrier, NULL, CONC_THREADS) == 0) {
        for (; started < CONC_THREADS; started++)
            if (pthread_create(&threads[started], NULL, conc_run, &tasks[started]) != 0) break;
        if (started < CONC_THREADS) { /* the started ones would wait at the barrier for ever */
            fprintf(stderr, "pthread_create failed after %d threads\n", started);
            exit(1);
        }
        for (int i = 0; i < started; i++) pthread_join(threads[i], NULL);
        pthread_barrier_destroy(&conc_barrier);
    }
    int calls = 0, same = 0, own = 0, clear = 0;
    for (int i = 0; i < CONC_THREADS; i++) {
        calls += tasks[i].calls_ok, same += tasks[i].same, own += tasks[i].errors_own, clear += tasks[i].errors_clear;
        free(tasks[i].want[0]), free(tasks[i].want[1]), free(tasks[i].got);
        vf_problem_destroy(&tasks[i].pr);
    }
    const int n = CONC_THREADS * 3;
    th_check(ready && started == CONC_THREADS && calls == 2 * n && same == 2 * n,
             "%d threads at once, %d forward + backward calls each: %d of %d succeeded, %d bit-identical to the "
             "serial run",
             started, 3, calls, 2 * n, same);
    th_check(own == n && clear == 2 * n,
             "each thread's fa_last_error is its own: %d of %d refused calls name the thread's own value, empty "
             "after %d of %d successful calls",
             own, n, clear, 2 * n);
}

int main(int argc, char **argv) {
    th_init(argc, argv, NULL);
    vf_config c;
    vf_config_init(&c);
    c.batch = 2, c.seqlen_q = 16, c.seqlen_k = 24, c.heads_q = 4, c.heads_kv = 2, c.head_dim = 32;
    vf_config v = c;
    v.batch = 4, v.varlen = 1, v.edge_lengths = 1, v.extra_tokens = 2;
    v.alibi = VF_ALIBI_HEADS;
    vf_config f = c;
    f.dtype = FA_E4M3, f.descale_block = 4;
    if (vf_problem_create(&base, &c) != FA_OK || vf_problem_create(&base_varlen, &v) != FA_OK ||
        vf_problem_create(&base_fp8, &f) != FA_OK) {
        printf("cannot allocate the test problems\n");
        return 1;
    }
    invalid_arguments();
    limits();
    workspace();
    strings();
    introspection();
    unavailable_backends();
    flops();
    concurrent_calls();
    vf_problem_destroy(&base);
    vf_problem_destroy(&base_varlen);
    vf_problem_destroy(&base_fp8);
    return th_finish();
}
