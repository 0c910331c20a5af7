/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fuzz_attention.c - libFuzzer harness for the host side: validation, the CPU backend and the fp64
 * reference. Built with clang -fsanitize=fuzzer,address,undefined (make fuzz), without OpenMP so that an
 * input is one deterministic, single-threaded run.
 *
 * An input is read as a small problem (sizes, dtype, masks, softcap, ALiBi, varlen, memory layout, seed),
 * built by check/verify.c with NaN in every element outside it, then:
 *
 *   1. the CPU forward (and, when the input asks, backward): every output element written and nothing
 *      outside the outputs, and O and LSE within the tolerance rule of check/verify.c against the fp64
 *      reference;
 *   2. one change to a copy of the params, also read from the input, then the call on the CPU or the
 *      reference backend. Changes the library must refuse (strides whose extent overflows, negative strides,
 *      misaligned pointers, an output overlapping another array, non-finite scale, softcap or ALiBi slopes,
 *      broken cu_seqlens, bad sizes, bad e4m3 descales or output dtype, descales with another dtype) must
 *      fail with every output byte untouched; changes that stay inside
 *      the allocations (fewer rows, heads or batch entries, any thread count, any window) must succeed.
 *
 * A violated expectation aborts with a message; the sanitizers report memory and undefined-behaviour errors.
 * To replay an input: build/fuzz/fuzz_attention FILE (FUZZ_DEBUG=1 also prints the change it made).
 */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check/verify.h"

typedef struct bytes {
    const uint8_t *p;
    size_t n;
} bytes;

/* The next byte, or 0 past the end (short inputs are small, default problems). */
static unsigned next(bytes *b) {
    if (!b->n) return 0;
    b->n--;
    return *b->p++;
}
static uint32_t next32(bytes *b) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++) v = v << 8 | next(b);
    return v;
}

static void fail(const char *what, const vf_config *c, const char *detail) {
    char desc[256];
    vf_config_describe(c, desc, sizeof desc);
    fprintf(stderr, "fuzz_attention: %s [%s]: %s\n", what, desc, detail ? detail : "");
    abort();
}

static vf_config decode_config(bytes *b) {
    vf_config c;
    vf_config_init(&c);
    static const int dims[6] = { 8, 16, 24, 32, 64, 136 };
    c.dtype = (fa_dtype)(next(b) % 4);
    c.batch = 1 + next(b) % 3;
    c.heads_kv = 1 + next(b) % 2;
    c.heads_q = c.heads_kv * (1 + next(b) % 3);
    c.head_dim = dims[next(b) % 6];
    c.seqlen_q = 1 + next(b) % 48;
    c.seqlen_k = 1 + next(b) % 48;
    unsigned opt = next(b);
    c.causal = opt & 1;
    if (opt & 2) c.window_left = (int)(next(b) % 24) - 1;
    if (opt & 4) c.window_right = (int)(next(b) % 24) - 1;
    if (opt & 8) c.softcap = 1.0f + (float)(next(b) % 40);
    if (opt & 16) c.alibi = (vf_alibi)(1 + next(b) % 2);
    if (opt & 32) c.varlen = 1, c.edge_lengths = next(b) & 1, c.extra_tokens = (int32_t)(next(b) % 4);
    if (opt & 64) c.scale = 0.05f + (float)(next(b) % 32) / 16.0f;
    c.deterministic = (opt >> 7) & 1;
    c.layout = (vf_layout)(next(b) % 5);
    c.uniform = next(b) & 1;
    c.q_amplitude = 1.0 + (next(b) % 4);
    c.workspace = (int)(next(b) % 3);
    c.seed = next32(b);
    if (c.dtype == FA_E4M3) { /* descales per (batch, head) or per block of rows, or none; bf16 or f16 out */
        static const int32_t blocks[4] = { 0, 1, 5, 16 };
        const unsigned f = next(b);
        c.descale_block = blocks[f % 4];
        c.no_descale = (f >> 2) & 1;
        c.out_dtype = (f >> 3) & 1 ? FA_F16 : FA_BF16;
    }
    return c;
}

/* Bytes per element of a problem's tensor (e4m3 inputs have an output of another dtype). */
static size_t elem_size(const vf_tensor *t) {
    return t->dtype == FA_F32 ? 4 : t->dtype == FA_E4M3 ? 1 : 2;
}

/* ---- step 1: the CPU backend against the reference ---- */

static void check_cpu(vf_problem *pr, int backward) {
    fa_exec x;
    memset(&x, 0, sizeof x);
    x.backend = FA_BACKEND_CPU;
    x.device = -1;
    for (int pass = 0; pass <= backward; pass++) {
        fa_status st = vf_run(pr, &x, pass);
        if (st != FA_OK) fail(pass ? "CPU backward refused a valid problem" : "CPU forward refused a valid problem",
                              &pr->cfg, fa_last_error());
        int64_t unwritten = 0, overwritten = 0;
        vf_check_written(pr, pass, &unwritten, &overwritten);
        if (unwritten || overwritten) fail("outputs not written exactly", &pr->cfg, pass ? "backward" : "forward");
    }
    /* The numbers compared are the forward's (O, LSE); the backward is held to writing exactly its outputs.
     * On problems of one to four keys the tolerance rule's 2 x naive + floor is below the CPU backward's dQ
     * and dK errors (f32 1 x 2: 3.2e-8 for 2.9e-8; f16 2 x 2: 1.1e-4 for 9.6e-5), an open question for the
     * rule (docs/worklog.md); tests/test_backends compares the gradients on its larger shapes. */
    vf_report rep;
    if (vf_compare(pr, 0, &rep) != FA_OK) return; /* the reference did not fit: nothing to compare */
    if (!rep.ok) {
        char buf[512];
        fail("CPU result outside the tolerance", &pr->cfg, vf_report_brief(&rep, buf, sizeof buf));
    }
}

/* ---- step 2: one change to the params ---- */

typedef struct snapshot {
    void *ptr[6];
    size_t size[6];
    unsigned char *copy[6];
} snapshot;

static void snapshot_take(const vf_problem *pr, snapshot *s) {
    const vf_tensor *t[5] = { &pr->o, &pr->dq, &pr->dk, &pr->dv, &pr->dout };
    for (int i = 0; i < 5; i++) s->ptr[i] = t[i]->host, s->size[i] = (size_t)t[i]->elems * elem_size(t[i]);
    s->ptr[5] = pr->lse, s->size[5] = sizeof(float) * (size_t)pr->lse_elems;
    for (int i = 0; i < 6; i++) {
        s->copy[i] = malloc(s->size[i] + 1);
        if (!s->copy[i]) abort();
        memcpy(s->copy[i], s->ptr[i], s->size[i]);
    }
}

static int snapshot_same(snapshot *s) {
    int same = 1;
    for (int i = 0; i < 6; i++) {
        same &= !memcmp(s->copy[i], s->ptr[i], s->size[i]);
        free(s->copy[i]);
    }
    return same;
}

enum { MUST_FAIL = 0, MUST_PASS = 1, EITHER = 2 };

static int varlen(const fa_params *p) {
    return p->cu_seqlens_q != NULL;
}

/* Rows of view i (0 only for a varlen batch without tokens on that side). */
static int64_t view_rows(const fa_params *p, unsigned i) {
    const int keys = i % 8 == 1 || i % 8 == 2 || i % 8 >= 6;
    return varlen(p) ? (keys ? p->total_k : p->total_q) : 1;
}

static fa_tensor *view(fa_params *p, unsigned i) {
    fa_tensor *v[8] = { &p->q, &p->k, &p->v, &p->o, &p->dout, &p->dq, &p->dk, &p->dv };
    return v[i % 8];
}

/* Applies change `kind` to p (and *x); returns what the call must do. Arrays the change writes into are
 * copies in `scratch` (the problem's own stay intact for later inputs). */
static int mutate(bytes *b, vf_problem *pr, fa_params *p, fa_exec *x, int backward, unsigned kind, float *slopes,
                  int32_t *cu) {
    static const int64_t big[4] = { INT64_MAX, INT64_MAX / 2, INT64_MAX / 3, INT64_MAX / 8 };
    const unsigned which = next(b);
    fa_tensor *t = view(p, which);
    const vf_tensor *allocs[8] = { &pr->q, &pr->k, &pr->v, &pr->o, &pr->dout, &pr->dq, &pr->dk, &pr->dv };
    const size_t es = elem_size(allocs[which % 8]);
    const int used = which % 8 < 4 || backward; /* dout, dq, dk, dv are not read by the forward */
    const int out = backward ? which % 8 >= 5 : which % 8 == 3;
    switch (kind % 13) {
    case 0: { /* a stride whose extent overflows int64 (in elements or in bytes) */
        int64_t s = big[next(b) % 4] / (1 + next(b) % 4);
        unsigned f = next(b) % 3;
        if (f == 0 && !varlen(p) && p->batch > 1) t->stride_batch = s;
        else if (f == 1) t->stride_head = s;
        else t->stride_seq = s;
        /* heads or rows of extent 1 multiply the stride by 0; an unused tensor is not checked */
        int64_t rows = varlen(p) ? (which % 8 == 1 || which % 8 == 2 || which % 8 >= 6 ? p->total_k : p->total_q)
                                       : (which % 8 == 1 || which % 8 == 2 || which % 8 >= 6 ? p->seqlen_k : p->seqlen_q);
        int64_t heads = which % 8 == 1 || which % 8 == 2 || which % 8 >= 6 ? p->heads_kv : p->heads_q;
        int64_t ext = f == 0 && !varlen(p) && p->batch > 1 ? p->batch : f == 1 ? heads : rows;
        /* refused for sure only when this term alone passes INT64_MAX bytes; otherwise the view would just
         * run past the allocation (the caller's error, not the library's): no call */
        if (!used || view_rows(p, which) == 0 || (__int128)s * (ext - 1) * (int64_t)es <= INT64_MAX)
            return -1;
        return MUST_FAIL;
    }
    case 1: { /* a negative stride */
        int64_t s = -1 - (int64_t)(next(b) % 1000);
        unsigned f = next(b) % 3;
        if (f == 0) {
            if (varlen(p)) return EITHER; /* unused in a varlen batch */
            t->stride_batch = s;
        } else if (f == 1) {
            t->stride_head = s;
        } else {
            t->stride_seq = s;
        }
        return used ? MUST_FAIL : EITHER;
    }
    case 2: { /* a pointer off its element alignment */
        if (es == 1) return -1; /* bytes: every address is aligned */
        t->data = (char *)t->data + 1 + next(b) % (es - 1);
        return used ? MUST_FAIL : EITHER;
    }
    case 3: { /* an output on another array, no smaller than the output's own */
        const unsigned from = next(b);
        fa_tensor *src = view(p, from);
        const vf_tensor *alloc[8] = { &pr->q, &pr->k, &pr->v, &pr->o, &pr->dout, &pr->dq, &pr->dk, &pr->dv };
        if (!out) return EITHER;
        if (src == t || alloc[from % 8]->elems < alloc[which % 8]->elems) return -1;
        if (!backward && from % 8 >= 4) return EITHER; /* not an array of the forward */
        t->data = src->data;
        return view_rows(p, which) > 0 && view_rows(p, from) > 0 ? MUST_FAIL : EITHER; /* no rows: no bytes */
    }
    case 4: { /* lse inside an output or an input; an array of no rows overlaps nothing */
        const int have_q = !varlen(p) || p->total_q > 0;
        if (backward) {
            p->dq.data = p->lse; /* at the start: an offset past a short lse would only run off its allocation */
            return have_q ? MUST_FAIL : EITHER;
        }
        const unsigned i = next(b) % 4, off = 0; /* past the start it might land past the view, in its padding */
        const vf_tensor *alloc[4] = { &pr->q, &pr->k, &pr->v, &pr->o };
        if ((size_t)alloc[i]->elems * elem_size(alloc[i]) < sizeof(float) * (size_t)(pr->lse_elems + off)) return -1;
        p->lse = (float *)view(p, i)->data + off;
        const int have_rows = i == 0 || i == 3 ? have_q : !varlen(p) || p->total_k > 0;
        return have_q && have_rows ? MUST_FAIL : EITHER;
    }
    case 5: { /* any thread count, and exec.check 0 or 1 (the host backends ignore it) from the same word's top
               * bit (test_device_check covers the refused values) */
        const uint32_t w = next32(b);
        x->num_threads = (int32_t)(w & 0x7fffffff);
        x->check = (int32_t)(w >> 31);
        return MUST_PASS;
    }
    case 6: { /* fewer rows, heads or batch entries: a valid problem inside the same memory */
        unsigned f = next(b) % 3;
        if (varlen(p)) return EITHER; /* cu_seqlens bound the lengths instead */
        if (f == 0) p->seqlen_q = 1 + (int32_t)(next(b) % (unsigned)p->seqlen_q);
        if (f == 1) p->seqlen_k = 1 + (int32_t)(next(b) % (unsigned)p->seqlen_k);
        if (f == 2) p->batch = 1 + (int32_t)(next(b) % (unsigned)p->batch);
        /* lse of the backward is indexed by the new sizes: the forward's values are stale, still finite */
        return MUST_PASS;
    }
    case 7: { /* any window */
        p->window_left = (int32_t)next32(b), p->window_right = (int32_t)next32(b);
        if (p->causal) p->window_right = 0;
        return p->window_left >= -1 && p->window_right >= -1 ? MUST_PASS : MUST_FAIL;
    }
    case 8: { /* a scale or softcap from raw bits */
        uint32_t u = next32(b);
        float f;
        memcpy(&f, &u, 4);
        if (next(b) & 1) {
            p->softmax_scale = f;
            return isfinite(f) ? EITHER : MUST_FAIL;
        }
        p->softcap = f;
        return isfinite(f) && f >= 0 ? EITHER : MUST_FAIL;
    }
    case 9: { /* a non-finite ALiBi slope (the host backends read them) */
        if (!p->alibi_slopes) return EITHER;
        memcpy(slopes, p->alibi_slopes, sizeof(float) * (size_t)pr->slope_count);
        static const float bad[3] = { NAN, INFINITY, -INFINITY };
        slopes[next(b) % (unsigned)pr->slope_count] = bad[next(b) % 3];
        int reached = 1; /* a slope of a batch entry past the last one is not read */
        if (p->alibi_batch_stride) {
            reached = 0;
            for (int64_t i = 0; i < pr->slope_count; i++) reached |= !isfinite(slopes[i]) && i / p->alibi_batch_stride < p->batch && i % p->alibi_batch_stride < p->heads_q;
        }
        p->alibi_slopes = slopes;
        return reached ? MUST_FAIL : EITHER;
    }
    case 10: { /* broken cu_seqlens */
        if (!varlen(p)) return EITHER;
        memcpy(cu, p->cu_seqlens_q, sizeof(int32_t) * (size_t)(p->batch + 1));
        unsigned i = next(b) % (unsigned)(p->batch + 1);
        cu[i] = (int32_t)next32(b);
        p->cu_seqlens_q = cu;
        /* still valid if it is: starts at 0, non-decreasing, lengths within seqlen_q, last within total_q */
        int ok = cu[0] == 0 && cu[p->batch] <= p->total_q;
        for (int32_t k = 0; k < p->batch && ok; k++)
            ok = cu[k + 1] >= cu[k] && (int64_t)cu[k + 1] - cu[k] <= p->seqlen_q;
        return ok ? EITHER : MUST_FAIL;
    }
    case 11: { /* the FP8 fields: descales with another dtype, a bad descale, out_dtype or descale block */
        static float descales[1024]; /* more than 3 batch entries x 6 heads x 48 blocks */
        if (p->dtype != FA_E4M3) {
            p->k_descale = descales;
            return MUST_FAIL;
        }
        const unsigned f = next(b) % 3;
        if (f == 0) {
            p->out_dtype = (fa_dtype)(int32_t)next32(b);
            return p->out_dtype == FA_BF16 || p->out_dtype == FA_F16 ? MUST_PASS : MUST_FAIL;
        }
        if (f == 1) {
            p->descale_block_k = -1 - (int32_t)(next(b) % 100);
            return MUST_FAIL;
        }
        const float **d = next(b) & 1 ? &p->v_descale : &p->q_descale;
        if (!*d) return EITHER;
        const int q = d == &p->q_descale;
        const int64_t block = q ? p->descale_block_q : p->descale_block_k, len = q ? p->seqlen_q : p->seqlen_k;
        const int64_t n = (int64_t)p->batch * (q ? p->heads_q : p->heads_kv) * (block ? (len + block - 1) / block : 1);
        memcpy(descales, *d, sizeof(float) * (size_t)n);
        static const float bad[3] = { NAN, INFINITY, -1.0f };
        descales[next(b) % (unsigned)n] = bad[next(b) % 3];
        *d = descales;
        return MUST_FAIL;
    }
    default: { /* sizes from raw bits: refused unless they shrink the problem */
        int32_t v = (int32_t)next32(b);
        unsigned f = next(b) % 4;
        int32_t *field = f == 0 ? &p->head_dim : f == 1 ? &p->heads_q : f == 2 ? &p->heads_kv : &p->batch;
        int32_t old = *field;
        *field = v;
        if (v >= 1 && v <= old) return EITHER; /* smaller: may well be valid, and stays in bounds */
        if (f == 0 && (v < 1 || v % 8 || v > 256)) return MUST_FAIL;
        if (f != 0 && v < 1) return MUST_FAIL;
        *field = old; /* larger and valid: would run past the allocations (the caller's error) */
        return EITHER;
    }
    }
}

static void check_change(bytes *b, vf_problem *pr, int backward) {
    fa_params p = pr->p;
    fa_exec x;
    memset(&x, 0, sizeof x);
    x.device = -1;
    x.backend = next(b) & 1 ? FA_BACKEND_REFERENCE : FA_BACKEND_CPU;
    float *slopes = malloc(sizeof(float) * (size_t)(pr->slope_count + 1));
    int32_t *cu = malloc(sizeof(int32_t) * (size_t)(pr->cfg.batch + 1));
    if (!slopes || !cu) abort();
    const unsigned kind = next(b);
    const int want = mutate(b, pr, &p, &x, backward, kind, slopes, cu);
    if (getenv("FUZZ_DEBUG")) fprintf(stderr, "change %u -> %d\n", kind % 13, want);
    if (want < 0) {
        free(slopes);
        free(cu);
        return;
    }
    snapshot s;
    if (!backward) vf_poison_outputs(pr, 0);
    vf_poison_outputs(pr, 1);
    snapshot_take(pr, &s);
    fa_status st = backward ? fa_bwd(&p, &x) : fa_fwd(&p, &x);
    const int same = snapshot_same(&s);
    char detail[640];
    snprintf(detail, sizeof detail, "change %u on %s %s: %s \"%s\"", kind % 13,
             x.backend == FA_BACKEND_CPU ? "cpu" : "reference", backward ? "bwd" : "fwd", fa_status_name(st),
             fa_last_error());
    if (st != FA_OK && !same) fail("a failed call wrote to an output", &pr->cfg, detail);
    if (st != FA_OK && !*fa_last_error()) fail("a failed call left no message", &pr->cfg, detail);
    if (want == MUST_FAIL && st == FA_OK) fail("a call that must be refused ran", &pr->cfg, detail);
    if (want == MUST_PASS && st != FA_OK) fail("a valid call was refused", &pr->cfg, detail);
    free(slopes);
    free(cu);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    bytes b = { data, size };
    const vf_config c = decode_config(&b);
    const unsigned mode = next(&b);
    vf_problem pr;
    if (vf_problem_create(&pr, &c) != FA_OK) return 0;
    const int backward = (mode & 1) && c.dtype != FA_E4M3; /* e4m3 is an input of the forward only */
    check_cpu(&pr, backward);
    check_change(&b, &pr, backward);
    vf_problem_destroy(&pr);
    return 0;
}
