/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_kvcache.c - decoding with a KV cache (fa_fwd_kvcache) on the CPU, reference and CUDA backends.
 *
 * Each case fills a cache (contiguous, with or without cache_batch_idx, or paged through a shuffled block
 * table), new tokens, q and the per-sequence lengths, and runs the call on a copy of the cache per backend.
 * The test then builds, by its own walk over the cache, the equivalent varlen problem: sequence b's keys are
 * its cache rows leftpad .. cache_seqlens + seqlen_new - 1 with the new tokens appended (the keys rotated by
 * the test's own fp32 rotation, rounded to the dtype), and q rotated the same way. O and LSE of each backend
 * are compared with the fp64 reference of that problem under the tolerance rule of check/verify.c; the cache
 * after the call must hold the appended rows (V exactly, K within a rounding of the rotation) and be
 * unchanged everywhere else. The 16-bit cases also run on the CUDA backend where a GPU is present (every array
 * mirrored to the device). Then the invalid arguments: each returns FA_ERR_INVALID_ARGUMENT naming its
 * field and writes nothing, the cache included.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check/verify.h"
#include "../src/internal.h"
#include "harness.h"

typedef struct kv_case {
    const char *tag;
    fa_dtype dt;
    int batch, hq, hkv, d, sq, n_new, cap;
    int page;       /* page size; 0 = contiguous cache */
    int rotary_dim; /* 0 = none */
    int interleaved;
    int causal, wl, wr;
    float softcap;
    int alibi, leftpad, batch_idx, no_seqlens;
    int splits; /* kv.num_splits (the CUDA backend's split count; 0 = its heuristic) */
} kv_case;

/* Everything of one call: inputs, the pristine cache, the params. */
typedef struct kv_setup {
    kv_case c;
    fa_params p;
    fa_kvcache kv;
    size_t es, cache_elems;
    void *q, *knew, *vnew, *o, *cos, *sin, *k0, *v0; /* k0, v0: the cache before the call */
    void *kc, *vc;                                   /* the cache the call writes */
    float *lse;
    int32_t *seqlens, *leftpad, *batch_idx, *table;
    int32_t cache_rows, max_pages, num_pages;
} kv_setup;

static void fill(vf_rng *r, void *buf, fa_dtype dt, size_t n) {
    for (size_t i = 0; i < n; i++) fa_store(buf, dt, (int64_t)i, (float)vf_rng_normal(r));
}

static void shuffle(vf_rng *r, int32_t *a, int n) {
    for (int i = n - 1; i > 0; i--) {
        int j = (int)vf_rng_range(r, 0, i);
        int32_t t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

static void setup_free(kv_setup *s) {
    free(s->q), free(s->knew), free(s->vnew), free(s->o), free(s->cos), free(s->sin), free(s->k0), free(s->v0);
    free(s->kc), free(s->vc), free(s->lse), free(s->seqlens), free(s->leftpad), free(s->batch_idx), free(s->table);
    memset(s, 0, sizeof *s);
}

static void setup_make(kv_setup *s, const kv_case *c, uint64_t seed, const float *slopes) {
    memset(s, 0, sizeof *s);
    s->c = *c;
    vf_rng r;
    vf_rng_seed(&r, seed);
    const int B = c->batch, d = c->d;
    s->es = fa_dtype_size(c->dt);
    fa_params_init(&s->p, c->dt, B, c->sq, c->n_new, c->hq, c->hkv, d);
    s->p.causal = c->causal, s->p.window_left = c->wl, s->p.window_right = c->wr, s->p.softcap = c->softcap;
    if (c->alibi) s->p.alibi_slopes = slopes;
    s->q = malloc(s->es * B * c->sq * c->hq * d);
    s->o = malloc(s->es * B * c->sq * c->hq * d);
    s->lse = malloc(sizeof(float) * B * c->hq * c->sq);
    fill(&r, s->q, c->dt, (size_t)B * c->sq * c->hq * d);
    s->p.q = fa_tensor_contiguous(s->q, c->sq, c->hq, d);
    s->p.o = fa_tensor_contiguous(s->o, c->sq, c->hq, d);
    s->p.lse = s->lse;
    if (c->n_new) {
        s->knew = malloc(s->es * B * c->n_new * c->hkv * d);
        s->vnew = malloc(s->es * B * c->n_new * c->hkv * d);
        fill(&r, s->knew, c->dt, (size_t)B * c->n_new * c->hkv * d);
        fill(&r, s->vnew, c->dt, (size_t)B * c->n_new * c->hkv * d);
        s->p.k = fa_tensor_contiguous(s->knew, c->n_new, c->hkv, d);
        s->p.v = fa_tensor_contiguous(s->vnew, c->n_new, c->hkv, d);
    }
    /* the cache: contiguous (2 spare sequences when cache_batch_idx picks rows) or paged (3 spare pages) */
    if (c->page) {
        s->max_pages = (c->cap + c->page - 1) / c->page;
        s->num_pages = B * s->max_pages + 3;
        s->cache_rows = s->num_pages;
        s->table = malloc(sizeof(int32_t) * (B * s->max_pages + 3));
        for (int i = 0; i < B * s->max_pages + 3; i++) s->table[i] = i;
        shuffle(&r, s->table, B * s->max_pages + 3); /* distinct pages in a random order */
    } else {
        s->cache_rows = B + (c->batch_idx ? 2 : 0);
    }
    const int row_len = c->page ? c->page : c->cap;
    s->cache_elems = (size_t)s->cache_rows * row_len * c->hkv * d;
    s->k0 = malloc(s->es * s->cache_elems), s->v0 = malloc(s->es * s->cache_elems);
    s->kc = malloc(s->es * s->cache_elems), s->vc = malloc(s->es * s->cache_elems);
    fill(&r, s->k0, c->dt, s->cache_elems);
    fill(&r, s->v0, c->dt, s->cache_elems);
    memcpy(s->kc, s->k0, s->es * s->cache_elems);
    memcpy(s->vc, s->v0, s->es * s->cache_elems);
    fa_kvcache_init(&s->kv, c->page ? 0 : s->cache_rows, c->page ? 0 : c->cap);
    s->kv.k_cache = fa_tensor_contiguous(s->kc, row_len, c->hkv, d);
    s->kv.v_cache = fa_tensor_contiguous(s->vc, row_len, c->hkv, d);
    if (c->page) {
        s->kv.block_table = s->table;
        s->kv.max_pages = s->max_pages;
        s->kv.num_pages = s->num_pages;
        s->kv.page_size = c->page;
    }
    /* lengths: the first sequence full, the second empty, the others random */
    s->seqlens = malloc(sizeof(int32_t) * B);
    s->leftpad = malloc(sizeof(int32_t) * B);
    for (int b = 0; b < B; b++) {
        s->seqlens[b] = b == 0 ? c->cap - c->n_new : b == 1 ? 0 : (int32_t)vf_rng_range(&r, 0, c->cap - c->n_new);
        if (c->no_seqlens) s->seqlens[b] = c->cap;
        s->leftpad[b] = c->leftpad ? (int32_t)vf_rng_range(&r, 0, s->seqlens[b]) : 0;
    }
    s->kv.num_splits = c->splits;
    if (!c->no_seqlens) s->kv.cache_seqlens = s->seqlens;
    if (c->leftpad) s->kv.cache_leftpad = s->leftpad;
    if (c->batch_idx) {
        s->batch_idx = malloc(sizeof(int32_t) * s->cache_rows);
        for (int i = 0; i < s->cache_rows; i++) s->batch_idx[i] = i;
        shuffle(&r, s->batch_idx, s->cache_rows);
        s->kv.cache_batch_idx = s->batch_idx;
    }
    if (c->rotary_dim) {
        const int half = c->rotary_dim / 2, ro = c->cap + c->sq;
        s->cos = malloc(s->es * ro * half), s->sin = malloc(s->es * ro * half);
        for (int pos = 0; pos < ro; pos++)
            for (int t = 0; t < half; t++) {
                double theta = pos * pow(10000.0, -2.0 * t / c->rotary_dim);
                fa_store(s->cos, c->dt, pos * half + t, (float)cos(theta));
                fa_store(s->sin, c->dt, pos * half + t, (float)sin(theta));
            }
        s->kv.rotary_cos = s->cos, s->kv.rotary_sin = s->sin;
        s->kv.rotary_seqlen = ro, s->kv.rotary_dim = c->rotary_dim, s->kv.rotary_interleaved = c->interleaved;
    }
}

/* The test's own rotation of a row (fp32 arithmetic, each result rounded to the dtype). */
static void rotate(const kv_setup *s, int64_t pos, float *x) {
    const int half = s->c.rotary_dim / 2;
    for (int t = 0; t < half; t++) {
        int a = s->c.interleaved ? 2 * t : t, b = s->c.interleaved ? 2 * t + 1 : t + half;
        float cs = fa_load(s->cos, s->c.dt, pos * half + t), sn = fa_load(s->sin, s->c.dt, pos * half + t);
        float x0 = x[a], x1 = x[b];
        x[a] = fa_round_dtype(s->c.dt, x0 * cs - x1 * sn);
        x[b] = fa_round_dtype(s->c.dt, x0 * sn + x1 * cs);
    }
}

/* Element index of cache row r of sequence b, kv head h (the test's own walk of the geometry). */
static int64_t cache_index(const kv_setup *s, int b, int64_t r, int h) {
    const int d = s->c.d;
    if (s->c.page) {
        int64_t page = s->table[b * s->max_pages + r / s->c.page];
        return ((page * s->c.page + r % s->c.page) * s->c.hkv + h) * d;
    }
    int64_t seq = s->batch_idx ? s->batch_idx[b] : b;
    return ((seq * s->c.cap + r) * s->c.hkv + h) * d;
}

/* The cache after a call: the appended rows hold the new tokens (V exactly, K as the test's rotation up to
 * one rounding in the dtype plus fp32 noise: the reference rotates in fp64), everything else is unchanged. */
static int check_cache(const kv_setup *s, const void *kc, const void *vc, char *why, size_t size) {
    const int d = s->c.d;
    const double u = s->c.dt == FA_BF16 ? 0x1p-8 : s->c.dt == FA_F16 ? 0x1p-11 : 0x1p-24;
    unsigned char *touched = calloc(s->cache_elems, 1);
    float row[256];
    int ok = 1;
    for (int b = 0; b < s->c.batch && ok; b++)
        for (int j = 0; j < s->c.n_new && ok; j++)
            for (int h = 0; h < s->c.hkv && ok; h++) {
                const int64_t r = s->seqlens[b] + j, at = cache_index(s, b, r, h);
                const int64_t src = ((int64_t)(b * s->c.n_new + j) * s->c.hkv + h) * d;
                for (int x = 0; x < d; x++) row[x] = fa_load(s->knew, s->c.dt, src + x);
                if (s->c.rotary_dim) rotate(s, r, row);
                for (int x = 0; x < d && ok; x++) {
                    touched[at + x] = 1;
                    double kd = fa_load(kc, s->c.dt, at + x), vd = fa_load(vc, s->c.dt, at + x);
                    if (fabs(kd - row[x]) > 2 * u * fabs(row[x]) + 0x1p-21 ||
                        vd != fa_load(s->vnew, s->c.dt, src + x)) {
                        snprintf(why, size, "appended row b=%d j=%d h=%d dim %d: k %g (want %g), v %g", b, j, h, x, kd,
                                 (double)row[x], vd);
                        ok = 0;
                    }
                }
            }
    for (size_t i = 0; i < s->cache_elems && ok; i++)
        if (!touched[i] && (memcmp((const char *)kc + i * s->es, (const char *)s->k0 + i * s->es, s->es) ||
                            memcmp((const char *)vc + i * s->es, (const char *)s->v0 + i * s->es, s->es))) {
            snprintf(why, size, "cache element %zu changed but is not an appended row", i);
            ok = 0;
        }
    free(touched);
    return ok;
}

/* The byte sizes of the call's arrays (vf_run_kvcache mirrors them on a device backend). */
static vf_kvcache_bytes setup_bytes(const kv_setup *s) {
    const kv_case *c = &s->c;
    const size_t B = (size_t)c->batch;
    vf_kvcache_bytes n;
    memset(&n, 0, sizeof n);
    n.q = n.o = s->es * B * c->sq * c->hq * c->d;
    n.lse = sizeof(float) * B * c->hq * c->sq;
    n.k = n.v = s->es * B * c->n_new * c->hkv * c->d;
    n.k_cache = n.v_cache = s->es * s->cache_elems;
    n.rotary = c->rotary_dim ? s->es * (size_t)(c->cap + c->sq) * (c->rotary_dim / 2) : 0;
    n.alibi = sizeof(float) * c->hq;
    n.seqlens = n.leftpad = sizeof(int32_t) * B;
    n.batch_idx = sizeof(int32_t) * s->cache_rows;
    n.block_table = sizeof(int32_t) * (B * s->max_pages + 3);
    return n;
}

/* The CUDA backend runs the 16-bit cases where a GPU is present. */
static int cuda_runs(const kv_case *c) {
#ifdef FA_WITH_CUDA
    return c->dt != FA_F32 && fa_device_count() > 0;
#else
    (void)c;
    return 0;
#endif
}

/* Whether this build compiled the CUDA kernels for head dim d (fa_build_info's "hdims=32,64,..."): a build
 * for a subset (make FA_HDIMS=...) reports the others unsupported. */
static int cuda_hdim_built(int d) {
    const char *list = strstr(fa_build_info(), "hdims=");
    char want[16];
    snprintf(want, sizeof want, "%d", d);
    for (const char *at = list ? list + 6 : NULL; at && *at && *at != ' ';) {
        const size_t n = strcspn(at, ", ");
        if (n == strlen(want) && !strncmp(at, want, n)) return 1;
        at += n;
        if (*at == ',') at++;
    }
    return 0;
}

static void run_case(const kv_case *c, uint64_t seed) {
    char name[200];
    snprintf(name, sizeof name, "kvcache %s %s b=%d h=%d/%d d=%d sq=%d new=%d cap=%d page=%d rot=%d%s%s%s%s", c->tag,
             c->dt == FA_F32   ? "f32"
             : c->dt == FA_F16 ? "f16"
                               : "bf16",
             c->batch, c->hq, c->hkv, c->d, c->sq, c->n_new, c->cap, c->page, c->rotary_dim,
             c->rotary_dim ? (c->interleaved ? "i" : "h") : "", c->causal ? " causal" : "",
             c->leftpad ? " leftpad" : "", c->batch_idx ? " batch_idx" : "");
    if (c->splits) snprintf(name + strlen(name), sizeof name - strlen(name), " splits=%d", c->splits);
    if (!th_selected(name)) return;

    /* the equivalent varlen problem, filled by the test */
    kv_setup s;
    int32_t *lens_q = malloc(sizeof(int32_t) * c->batch), *lens_k = malloc(sizeof(int32_t) * c->batch);
    vf_config vc;
    vf_config_init(&vc);
    vc.dtype = c->dt, vc.batch = c->batch, vc.heads_q = c->hq, vc.heads_kv = c->hkv, vc.head_dim = c->d;
    vc.seqlen_q = c->sq, vc.seqlen_k = c->cap, vc.causal = c->causal, vc.window_left = c->wl;
    vc.window_right = c->wr, vc.softcap = c->softcap, vc.alibi = c->alibi ? VF_ALIBI_HEADS : VF_ALIBI_OFF;
    vc.varlen = 1, vc.seed = seed;
    vf_problem pr;
    /* lengths come from the setup, which needs the slopes: make the setup with the problem's slopes after a
     * first problem fixes them (the slopes depend on heads only) */
    for (int b = 0; b < c->batch; b++) lens_q[b] = c->sq, lens_k[b] = 1;
    vc.lens_q = lens_q, vc.lens_k = lens_k;
    if (vf_problem_create(&pr, &vc) != FA_OK) {
        th_fail("%s: cannot create the problem", name);
        free(lens_q), free(lens_k);
        return;
    }
    float *slopes = NULL;
    if (c->alibi) {
        slopes = malloc(sizeof(float) * c->hq);
        memcpy(slopes, pr.slopes, sizeof(float) * c->hq);
    }
    vf_problem_destroy(&pr);
    setup_make(&s, c, seed, slopes);
    for (int b = 0; b < c->batch; b++) lens_k[b] = s.seqlens[b] + c->n_new - s.leftpad[b];
    if (vf_problem_create(&pr, &vc) != FA_OK) {
        th_fail("%s: cannot create the problem", name);
        goto out;
    }
    {
        const int d = c->d;
        float row[256];
        for (int b = 0; b < c->batch; b++) {
            for (int i = 0; i < c->sq; i++)
                for (int h = 0; h < c->hq; h++) {
                    for (int x = 0; x < d; x++)
                        row[x] = fa_load(s.q, c->dt, ((int64_t)(b * c->sq + i) * c->hq + h) * d + x);
                    const int local = c->causal || c->wl >= 0 || c->wr >= 0;
                    if (c->rotary_dim) rotate(&s, s.seqlens[b] + (local ? i : 0), row);
                    const int64_t at = (pr.cu_q[b] + i) * pr.q.view.stride_seq + h * pr.q.view.stride_head;
                    for (int x = 0; x < d; x++) fa_store(pr.q.view.data, c->dt, at + x, row[x]);
                }
            for (int64_t r = s.leftpad[b]; r < s.seqlens[b] + c->n_new; r++)
                for (int h = 0; h < c->hkv; h++) {
                    const int64_t at =
                        (pr.cu_k[b] + r - s.leftpad[b]) * pr.k.view.stride_seq + h * pr.k.view.stride_head;
                    const int64_t av =
                        (pr.cu_k[b] + r - s.leftpad[b]) * pr.v.view.stride_seq + h * pr.v.view.stride_head;
                    if (r < s.seqlens[b]) {
                        const int64_t ci = cache_index(&s, b, r, h);
                        for (int x = 0; x < d; x++) {
                            fa_store(pr.k.view.data, c->dt, at + x, fa_load(s.k0, c->dt, ci + x));
                            fa_store(pr.v.view.data, c->dt, av + x, fa_load(s.v0, c->dt, ci + x));
                        }
                    } else {
                        const int64_t src = ((int64_t)(b * c->n_new + r - s.seqlens[b]) * c->hkv + h) * d;
                        for (int x = 0; x < d; x++) row[x] = fa_load(s.knew, c->dt, src + x);
                        if (c->rotary_dim) rotate(&s, r, row);
                        for (int x = 0; x < d; x++) {
                            fa_store(pr.k.view.data, c->dt, at + x, row[x]);
                            fa_store(pr.v.view.data, c->dt, av + x, fa_load(s.vnew, c->dt, src + x));
                        }
                    }
                }
        }
    }
    const fa_backend backends[3] = { FA_BACKEND_CPU, FA_BACKEND_REFERENCE, FA_BACKEND_CUDA };
    const int nb = cuda_runs(c) ? 3 : 2;
    for (int bi = 0; bi < nb; bi++) {
        fa_exec x;
        memset(&x, 0, sizeof x);
        x.backend = backends[bi];
        x.num_threads = 2;
        x.device = -1;
        memcpy(s.kc, s.k0, s.es * s.cache_elems);
        memcpy(s.vc, s.v0, s.es * s.cache_elems);
        memset(s.o, 0xff, s.es * c->batch * c->sq * c->hq * c->d); /* NaN: an unwritten element fails */
        memset(s.lse, 0xff, sizeof(float) * c->batch * c->hq * c->sq);
        char why[200] = "";
        fa_status st;
        const char *bn = bi == 0 ? "cpu" : bi == 1 ? "reference" : "cuda";
        const vf_kvcache_bytes bytes = setup_bytes(&s);
        st = vf_run_kvcache(&s.p, &s.kv, &x, &bytes, why, sizeof why);
        if (st == FA_ERR_UNSUPPORTED && backends[bi] == FA_BACKEND_CUDA && !cuda_hdim_built(c->d)) {
            th_unsupported("%s %s: %s", name, bn, fa_last_error());
            continue;
        }
        if (st != FA_OK) {
            th_fail("%s %s: %s: %s %s", name, bn, fa_status_name(st), fa_last_error(), why);
            continue;
        }
        int cache_ok = c->n_new == 0
                           ? !memcmp(s.kc, s.k0, s.es * s.cache_elems) && !memcmp(s.vc, s.v0, s.es * s.cache_elems)
                           : check_cache(&s, s.kc, s.vc, why, sizeof why);
        /* O and LSE into the problem's layout: packed rows b * sq + i, lse (heads_q, total_q) */
        for (int b = 0; b < c->batch; b++)
            for (int i = 0; i < c->sq; i++)
                for (int h = 0; h < c->hq; h++) {
                    const int64_t at = (pr.cu_q[b] + i) * pr.o.view.stride_seq + h * pr.o.view.stride_head;
                    const int64_t src = ((int64_t)(b * c->sq + i) * c->hq + h) * c->d;
                    for (int xx = 0; xx < c->d; xx++)
                        fa_store(pr.o.view.data, c->dt, at + xx, fa_load(s.o, c->dt, src + xx));
                    pr.lse[(int64_t)h * pr.p.total_q + pr.cu_q[b] + i] = s.lse[((int64_t)b * c->hq + h) * c->sq + i];
                }
        vf_report rep;
        if (vf_compare(&pr, 0, &rep) != FA_OK) {
            th_fail("%s %s: the reference comparison ran out of memory", name, bn);
            continue;
        }
        char brief[160];
        th_check(rep.ok && cache_ok, "%s %s: %s%s%s", name, bn, vf_report_brief(&rep, brief, sizeof brief),
                 cache_ok ? "" : "  cache: ", why);
    }
    vf_problem_destroy(&pr);
out:
    setup_free(&s);
    free(slopes), free(lens_q), free(lens_k);
}

static void numeric_cases(void) {
    /* tag, dtype, batch, hq, hkv, d, sq, new, cap, page, rotary, interleaved, causal, wl, wr, softcap, alibi,
     * leftpad, batch_idx, no_seqlens, splits */
    const kv_case cases[] = {
        { "decode", FA_F32, 3, 4, 4, 64, 1, 0, 40, 0, 0, 1, 0, -1, -1, 0, 0, 0, 0, 0, 0 },
        { "decode-gqa", FA_F32, 4, 8, 2, 64, 1, 1, 70, 0, 0, 1, 0, -1, -1, 0, 0, 0, 0, 0, 0 },
        { "whole-cache", FA_F32, 2, 4, 2, 32, 1, 0, 33, 0, 0, 1, 0, -1, -1, 0, 0, 0, 0, 1, 0 },
        { "batch-idx", FA_F32, 3, 4, 1, 64, 2, 3, 50, 0, 0, 1, 1, -1, -1, 0, 0, 0, 1, 0, 0 },
        { "leftpad", FA_F32, 4, 4, 2, 64, 3, 2, 60, 0, 0, 1, 1, -1, -1, 0, 0, 1, 0, 0, 0 },
        { "paged", FA_F32, 3, 4, 2, 64, 1, 1, 50, 1, 0, 1, 0, -1, -1, 0, 0, 0, 0, 0, 0 },
        { "paged", FA_F32, 3, 4, 2, 64, 4, 5, 100, 16, 0, 1, 1, -1, -1, 0, 0, 1, 0, 0, 0 },
        { "paged", FA_BF16, 3, 8, 2, 128, 1, 1, 200, 64, 0, 1, 0, -1, -1, 0, 0, 0, 0, 0, 0 },
        { "rotary", FA_F32, 3, 4, 2, 64, 1, 1, 40, 0, 32, 1, 0, -1, -1, 0, 0, 0, 0, 0, 0 },
        { "rotary", FA_F32, 3, 4, 2, 64, 4, 4, 40, 0, 64, 0, 1, -1, -1, 0, 0, 0, 0, 0, 0 },
        { "rotary-paged", FA_F16, 3, 4, 4, 64, 3, 3, 48, 16, 32, 0, 1, -1, -1, 0, 0, 1, 0, 0, 0 },
        { "rotary-paged", FA_BF16, 2, 6, 2, 128, 2, 2, 90, 16, 64, 1, 0, -1, -1, 0, 0, 0, 0, 0, 0 },
        { "causal-sq>new", FA_F32, 3, 4, 2, 64, 6, 2, 30, 0, 32, 1, 1, -1, -1, 0, 0, 0, 0, 0, 0 },
        { "window-softcap-alibi", FA_F32, 3, 4, 2, 64, 2, 2, 80, 16, 0, 1, 0, 10, 0, 5.0f, 1, 1, 0, 0, 0 },
        { "window-rotary", FA_F16, 2, 4, 2, 32, 3, 3, 40, 0, 16, 1, 0, 7, 2, 0, 0, 0, 1, 0, 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], th_opt.seed * 7919u + i);
}

/* The 16-bit cases the CUDA backend runs (where a GPU is present; the CPU and reference backends run them
 * everywhere): GQA 4:1 and 8:1, MQA, contiguous and paged (page sizes 1, 16, 64), cache_batch_idx, leftpad,
 * append with and without rotary (both forms), seqlen_q 1 and 4 (causal), windows, softcap, ALiBi, head dims
 * 64, 128 and 256, explicit split counts 1, 3, 40, 60 and 100 and the heuristic's (0); sequence 1 of every case starts
 * empty (attending 0 keys without new tokens, 1 with one). */
static void gpu_cases(void) {
    /* tag, dtype, batch, hq, hkv, d, sq, new, cap, page, rotary, interleaved, causal, wl, wr, softcap, alibi,
     * leftpad, batch_idx, no_seqlens, splits */
    const kv_case cases[] = {
        { "gpu-gqa", FA_BF16, 4, 32, 8, 128, 1, 0, 300, 0, 0, 1, 0, -1, -1, 0, 0, 0, 0, 0, 0 },
        { "gpu-gqa", FA_BF16, 4, 32, 8, 128, 1, 0, 300, 0, 0, 1, 0, -1, -1, 0, 0, 0, 0, 0, 1 },
        { "gpu-gqa", FA_BF16, 4, 32, 8, 128, 1, 0, 300, 0, 0, 1, 0, -1, -1, 0, 0, 0, 0, 0, 3 },
        { "gpu-gqa8", FA_F16, 3, 16, 2, 128, 1, 1, 1000, 0, 0, 1, 0, -1, -1, 0, 0, 0, 0, 0, 0 },
        { "gpu-paged1", FA_F16, 3, 8, 2, 64, 1, 1, 100, 1, 0, 1, 0, -1, -1, 0, 0, 0, 0, 0, 3 },
        { "gpu-paged16", FA_BF16, 3, 16, 2, 128, 4, 4, 260, 16, 0, 1, 1, -1, -1, 0, 0, 0, 0, 0, 0 },
        { "gpu-paged64", FA_BF16, 3, 8, 2, 256, 1, 1, 300, 64, 0, 1, 0, -1, -1, 0, 0, 0, 0, 0, 3 },
        { "gpu-mqa-batch-idx", FA_F16, 3, 8, 1, 64, 1, 1, 90, 0, 0, 1, 0, -1, -1, 0, 0, 0, 1, 0, 0 },
        { "gpu-leftpad", FA_BF16, 4, 8, 1, 128, 4, 2, 150, 0, 0, 1, 1, -1, -1, 0, 0, 1, 0, 0, 3 },
        { "gpu-rotary", FA_BF16, 3, 32, 8, 128, 1, 1, 200, 16, 64, 1, 0, -1, -1, 0, 0, 0, 0, 0, 0 },
        { "gpu-rotary", FA_F16, 3, 8, 2, 128, 4, 4, 120, 0, 128, 0, 1, -1, -1, 0, 0, 0, 0, 0, 3 },
        { "gpu-rotary", FA_BF16, 2, 4, 2, 64, 1, 1, 70, 0, 32, 0, 0, -1, -1, 0, 0, 1, 1, 0, 1 },
        { "gpu-window-softcap-alibi", FA_BF16, 3, 8, 2, 64, 2, 2, 160, 16, 0, 1, 0, 20, 0, 5.0f, 1, 1, 0, 0, 3 },
        { "gpu-window", FA_F16, 2, 8, 4, 128, 3, 3, 200, 0, 16, 1, 0, 30, 2, 0, 0, 0, 0, 0, 0 },
        { "gpu-mqa-rows", FA_BF16, 2, 32, 1, 64, 4, 1, 80, 0, 0, 1, 1, -1, -1, 0, 0, 0, 0, 0, 0 },
        { "gpu-whole-cache", FA_F16, 2, 8, 2, 128, 1, 0, 70, 0, 0, 1, 0, -1, -1, 0, 0, 0, 0, 1, 3 },
        { "gpu-d256", FA_BF16, 2, 16, 2, 256, 1, 1, 130, 0, 0, 1, 0, -1, -1, 0, 0, 0, 0, 0, 0 },
        { "gpu-long", FA_BF16, 2, 8, 2, 128, 1, 1, 5000, 64, 0, 1, 0, -1, -1, 0, 0, 0, 0, 0, 0 },
        /* tiles of 64 keys inside a page and across pages (a leftpad shifts them), pages of a power of two
         * and not; head dims whose rows the copy threads do not divide evenly (96, 192) */
        { "gpu-paged96-leftpad", FA_F16, 3, 6, 2, 192, 1, 2, 500, 96, 0, 1, 0, -1, -1, 0, 0, 1, 0, 0, 3 },
        { "gpu-paged128-leftpad", FA_BF16, 3, 8, 2, 96, 2, 2, 400, 128, 0, 1, 1, -1, -1, 0, 0, 1, 0, 0, 0 },
        { "gpu-d192", FA_F16, 2, 12, 4, 192, 1, 0, 333, 0, 0, 1, 0, -1, -1, 0, 0, 0, 0, 0, 3 },
        { "gpu-d96", FA_BF16, 2, 8, 8, 96, 1, 1, 333, 0, 0, 1, 0, -1, -1, 0, 0, 1, 0, 0, 0 },
        /* head dim 64's tiles of 128 keys: across pages of 16 (a leftpad shifts them), split, causal rows */
        { "gpu-d64-paged16-leftpad", FA_BF16, 3, 8, 2, 64, 1, 1, 700, 16, 0, 1, 0, -1, -1, 0, 0, 1, 0, 0, 3 },
        { "gpu-d64-long", FA_F16, 2, 16, 2, 64, 2, 1, 3000, 0, 32, 1, 1, -1, -1, 0, 0, 0, 0, 0, 0 },
        /* many splits: the combine takes a row's columns in slices (4 at d128 with 100 splits; 2 of 24 float4
         * columns at d192 and of 12 at d96, where threads of a block are left over) */
        { "gpu-mqa-splits100", FA_BF16, 2, 32, 1, 128, 1, 1, 7000, 0, 0, 1, 0, -1, -1, 0, 0, 0, 0, 0, 100 },
        { "gpu-d192-splits40", FA_F16, 2, 12, 4, 192, 1, 0, 3000, 0, 0, 1, 0, -1, -1, 0, 0, 1, 0, 0, 40 },
        { "gpu-d96-splits60", FA_BF16, 2, 8, 2, 96, 2, 1, 4000, 0, 0, 1, 1, -1, -1, 0, 0, 0, 0, 0, 60 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], th_opt.seed * 104729u + i);
    /* The rings that d = 128 (two tiles) and d = 64 (three, 98 KB with Q) take on the parts with 99 KB of shared
     * memory per block, on this GPU (FLASHATTN_SMEM_LIMIT caps the limit the kernel selection assumes). */
    if (!cuda_runs(&cases[0])) return;
    const kv_case limited[] = {
        { "gpu-99KB", FA_BF16, 4, 32, 8, 128, 1, 1, 300, 0, 0, 1, 0, -1, -1, 0, 0, 0, 0, 0, 0 },
        { "gpu-99KB", FA_F16, 3, 16, 2, 128, 4, 4, 260, 16, 32, 1, 1, -1, -1, 0, 0, 1, 0, 0, 3 },
        { "gpu-99KB", FA_BF16, 3, 8, 2, 64, 1, 1, 600, 0, 0, 1, 0, -1, -1, 0, 0, 0, 0, 0, 3 },
    };
    setenv("FLASHATTN_SMEM_LIMIT", "101376", 1);
    for (size_t i = 0; i < sizeof limited / sizeof limited[0]; i++) run_case(&limited[i], th_opt.seed * 7u + i);
    unsetenv("FLASHATTN_SMEM_LIMIT");
}

/* ---- invalid arguments: status, the field in the message, nothing written (o, lse, the cache) ---- */

typedef void (*kv_mutate)(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x);

static void expect_kv_error(const char *label, const kv_case *c, kv_mutate mutate, fa_status want, const char *field) {
    char name[160];
    snprintf(name, sizeof name, "kvcache invalid %s", label);
    if (!th_selected(name)) return;
    kv_setup s;
    setup_make(&s, c, 1234, NULL);
    fa_params p = s.p;
    fa_kvcache kv = s.kv;
    fa_exec x;
    memset(&x, 0, sizeof x);
    x.backend = FA_BACKEND_CPU;
    mutate(&s, &p, &kv, &x);
    const size_t on = s.es * c->batch * c->sq * c->hq * c->d, ln = sizeof(float) * c->batch * c->hq * c->sq;
    memset(s.o, 0x5a, on);
    memset(s.lse, 0x5a, ln);
    unsigned char *o0 = malloc(on), *l0 = malloc(ln);
    memcpy(o0, s.o, on), memcpy(l0, s.lse, ln);
    fa_status st = fa_fwd_kvcache(&p, &kv, &x);
    char msg[512];
    snprintf(msg, sizeof msg, "%s", fa_last_error());
    fa_status chk = fa_check_kvcache(&p, &kv, &x);
    int untouched = !memcmp(o0, s.o, on) && !memcmp(l0, s.lse, ln) && !memcmp(s.kc, s.k0, s.es * s.cache_elems) &&
                    !memcmp(s.vc, s.v0, s.es * s.cache_elems);
    /* fa_check_kvcache does not see the workspace (as fa_check) */
    const fa_status want_chk = want == FA_ERR_WORKSPACE_TOO_SMALL ? FA_OK : want;
    th_check(st == want && chk == want_chk && strstr(msg, field) && untouched, "%s: %s (want %s), \"%s\"%s", name,
             fa_status_name(st), fa_status_name(want), msg, untouched ? "" : ", OUTPUTS WRITTEN");
    free(o0), free(l0);
    setup_free(&s);
}

static void m_table_high(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    s->table[1 * s->max_pages] = s->num_pages; /* sequence 1 is empty but appends into its first page */
}
static void m_table_negative(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    s->table[0] = -1;
}
static void m_table_shared(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    /* sequences 1 and 2 both empty: both append into row 0 of the same page */
    s->seqlens[2] = 0;
    s->table[2 * s->max_pages] = s->table[1 * s->max_pages];
}
static void m_seqlens_over(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    const int32_t cap = s->c.page ? s->max_pages * s->c.page : s->c.cap; /* paged: whole pages */
    s->seqlens[2] = cap - s->c.n_new + 1;
}
static void m_seqlens_negative(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    s->seqlens[0] = -1;
}
static void m_seqlens_null_append(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    kv->cache_seqlens = NULL;
}
static void m_leftpad(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    s->leftpad[0] = s->seqlens[0] + 1;
    kv->cache_leftpad = s->leftpad;
}
static void m_batch_idx_range(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    s->batch_idx[1] = s->cache_rows;
}
static void m_batch_idx_dup(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    s->seqlens[0] = s->seqlens[1] = 0;
    s->batch_idx[1] = s->batch_idx[0];
}
static void m_batch_idx_paged(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    static int32_t idx[8];
    kv->cache_batch_idx = idx;
}
static void m_rotary_dim_8(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    kv->rotary_dim = 8;
}
static void m_rotary_dim_big(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    kv->rotary_dim = s->c.d + 16;
}
static void m_rotary_short(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    kv->rotary_seqlen = s->c.cap - 1; /* sequence 0 is full: its last new key sits at cap - 1 */
}
static void m_rotary_one(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    kv->rotary_sin = NULL;
}
static void m_rotary_no_new(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    p->k.data = p->v.data = NULL;
    p->seqlen_k = 0;
}
static void m_page_size(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    kv->page_size = 0;
}
static void m_num_splits(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    kv->num_splits = -1;
}
static void m_v_null(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    p->v.data = NULL;
}
static void m_seqlen_k_without_new(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    p->k.data = p->v.data = NULL;
}
static void m_o_in_cache(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    p->o.data = (char *)kv->k_cache.data + 64;
}
static void m_q_in_cache(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    p->q.data = kv->v_cache.data; /* the cache is written (appending) while q is read */
}
static void m_varlen(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    static int32_t cu[8];
    p->cu_seqlens_q = p->cu_seqlens_k = cu;
}
static void m_cache_stride(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    kv->v_cache.stride_seq = s->c.d; /* rows of different heads overlap in a cache that is written */
}
static void m_workspace_small(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    static char ws[64];
    x->workspace = ws, x->workspace_bytes = sizeof ws;
}
static void m_e4m3(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    p->dtype = FA_E4M3;
}
static void m_max_pages(kv_setup *s, fa_params *p, fa_kvcache *kv, fa_exec *x) {
    kv->max_pages = 0;
}

static void invalid_cases(void) {
    /* tag, dtype, batch, hq, hkv, d, sq, new, cap, page, rotary, interleaved, causal, wl, wr, softcap, alibi,
     * leftpad, batch_idx, no_seqlens, splits */
    const kv_case paged = { "p", FA_F32, 3, 4, 2, 32, 2, 2, 40, 16, 16, 1, 1, -1, -1, 0, 0, 0, 0, 0, 0 };
    const kv_case dense = { "d", FA_F32, 3, 4, 2, 32, 2, 2, 40, 0, 16, 1, 1, -1, -1, 0, 0, 0, 1, 0, 0 };
    const fa_status E = FA_ERR_INVALID_ARGUMENT;
    expect_kv_error("dtype e4m3 (a forward input only)", &paged, m_e4m3, FA_ERR_UNSUPPORTED, "FA_E4M3");
    expect_kv_error("block_table >= num_pages", &paged, m_table_high, E, "block_table[1][0]");
    expect_kv_error("block_table negative", &paged, m_table_negative, E, "block_table[0][0]");
    expect_kv_error("block_table shared append slot", &paged, m_table_shared, E, "both append");
    expect_kv_error("cache_seqlens beyond capacity", &paged, m_seqlens_over, E, "cache_seqlens[2]");
    expect_kv_error("cache_seqlens beyond capacity (contiguous)", &dense, m_seqlens_over, E, "seqlen_cache");
    expect_kv_error("cache_seqlens negative", &dense, m_seqlens_negative, E, "cache_seqlens[0]");
    expect_kv_error("cache_seqlens NULL with new tokens", &dense, m_seqlens_null_append, E, "cache_seqlens is NULL");
    expect_kv_error("cache_leftpad beyond seqlens", &paged, m_leftpad, E, "cache_leftpad[0]");
    expect_kv_error("cache_batch_idx out of range", &dense, m_batch_idx_range, E, "cache_batch_idx[1]");
    expect_kv_error("cache_batch_idx repeated while appending", &dense, m_batch_idx_dup, E, "cache_batch_idx");
    expect_kv_error("cache_batch_idx with block_table", &paged, m_batch_idx_paged, E, "cache_batch_idx");
    expect_kv_error("rotary_dim 8", &dense, m_rotary_dim_8, E, "rotary_dim");
    expect_kv_error("rotary_dim > head_dim", &dense, m_rotary_dim_big, E, "rotary_dim");
    expect_kv_error("rotary_seqlen too short", &paged, m_rotary_short, E, "rotary_seqlen");
    expect_kv_error("rotary_sin missing", &dense, m_rotary_one, E, "rotary_sin");
    expect_kv_error("rotary without new tokens", &dense, m_rotary_no_new, E, "rotary_cos");
    expect_kv_error("page_size 0", &paged, m_page_size, E, "page_size");
    expect_kv_error("max_pages 0", &paged, m_max_pages, E, "max_pages");
    expect_kv_error("num_splits negative", &dense, m_num_splits, E, "num_splits");
    expect_kv_error("v missing", &dense, m_v_null, E, "v.data");
    expect_kv_error("seqlen_k without new tokens", &dense, m_seqlen_k_without_new, E, "seqlen_k");
    expect_kv_error("o inside the cache", &paged, m_o_in_cache, E, "overlap");
    expect_kv_error("q inside a written cache", &dense, m_q_in_cache, E, "overlap");
    expect_kv_error("cu_seqlens set", &dense, m_varlen, E, "cu_seqlens");
    expect_kv_error("cache rows overlapping", &dense, m_cache_stride, E, "v_cache.stride_");
    expect_kv_error("workspace too small", &paged, m_workspace_small, FA_ERR_WORKSPACE_TOO_SMALL, "workspace_bytes");
}

/* Cache rows a call does not attend (before leftpad, past cache_seqlens + seqlen_new, other sequences' rows
 * and unused pages) may hold anything, e.g. never-initialised memory: with NaN there instead of 0, o and lse
 * must be bit-identical. */
static void unattended_rows(const kv_case *c) {
    char name[160];
    snprintf(name, sizeof name, "kvcache unattended rows NaN vs 0 (%s)", c->tag);
    if (!th_selected(name)) return;
    kv_setup s;
    setup_make(&s, c, 4242, NULL);
    unsigned char *attended = calloc(s.cache_elems, 1);
    for (int b = 0; b < c->batch; b++)
        for (int64_t r = s.leftpad[b]; r < s.seqlens[b]; r++)
            for (int h = 0; h < c->hkv; h++) memset(attended + cache_index(&s, b, r, h), 1, (size_t)c->d);
    const size_t on = s.es * c->batch * c->sq * c->hq * c->d, ln = sizeof(float) * c->batch * c->hq * c->sq;
    const fa_backend backends[3] = { FA_BACKEND_CPU, FA_BACKEND_REFERENCE, FA_BACKEND_CUDA };
    const int nb = cuda_runs(c) && cuda_hdim_built(c->d) ? 3 : 2;
    const vf_kvcache_bytes bytes = setup_bytes(&s);
    unsigned char *out[3][2];
    int ok = 1, same = 1;
    char why[200] = "";
    for (int bi = 0; bi < nb; bi++) {
        for (int fill = 0; fill < 2; fill++) {
            for (size_t i = 0; i < s.cache_elems; i++) {
                const float x = attended[i] ? fa_load(s.k0, c->dt, (int64_t)i) : fill ? NAN : 0.0f;
                const float y = attended[i] ? fa_load(s.v0, c->dt, (int64_t)i) : fill ? NAN : 0.0f;
                fa_store(s.kc, c->dt, (int64_t)i, x), fa_store(s.vc, c->dt, (int64_t)i, y);
            }
            fa_exec x;
            memset(&x, 0, sizeof x);
            x.backend = backends[bi];
            x.device = -1;
            ok &= vf_run_kvcache(&s.p, &s.kv, &x, &bytes, why, sizeof why) == FA_OK;
            out[bi][fill] = malloc(on + ln);
            memcpy(out[bi][fill], s.o, on), memcpy(out[bi][fill] + on, s.lse, ln);
        }
        same &= !memcmp(out[bi][0], out[bi][1], on + ln);
    }
    int finite = 1;
    for (size_t i = 0; i < s.p.batch * (size_t)c->sq * c->hq * c->d; i++)
        finite &= isfinite(fa_load(s.o, c->dt, (int64_t)i));
    th_check(ok && finite && same, "%s: %s outputs bit-identical and finite%s%s", name,
             nb == 3 ? "cpu, reference and cuda" : "cpu and reference", why[0] ? ": " : "", why);
    for (int bi = 0; bi < nb; bi++) free(out[bi][0]), free(out[bi][1]);
    free(attended);
    setup_free(&s);
}

/* More attended rows than the host backends' int32 prefix sums hold: refused during validation, which reads
 * only the int32 arrays (the cache pointer is a placeholder that is never dereferenced). */
static void too_many_rows(void) {
    if (!th_selected("kvcache invalid attended rows beyond int32")) return;
    float q[2 * 4 * 32], o[2 * 4 * 32];
    int32_t seqlens[2] = { (1 << 30) + 10, (1 << 30) + 10 };
    fa_params p;
    fa_params_init(&p, FA_F32, 2, 1, 0, 4, 2, 32);
    p.q = fa_tensor_contiguous(q, 1, 4, 32), p.o = fa_tensor_contiguous(o, 1, 4, 32);
    fa_kvcache kv;
    fa_kvcache_init(&kv, 2, (1 << 30) + 16);
    void *placeholder = (void *)((uintptr_t)1 << 40);
    kv.k_cache = fa_tensor_contiguous(placeholder, kv.seqlen_cache, 2, 32);
    kv.v_cache = fa_tensor_contiguous(placeholder, kv.seqlen_cache, 2, 32);
    kv.cache_seqlens = seqlens;
    fa_exec x;
    memset(&x, 0, sizeof x);
    x.backend = FA_BACKEND_CPU;
    fa_status st = fa_check_kvcache(&p, &kv, &x);
    th_check(st == FA_ERR_INVALID_ARGUMENT && strstr(fa_last_error(), "int32"),
             "kvcache invalid attended rows beyond int32: %s \"%s\"", fa_status_name(st), fa_last_error());
}

/* The CUDA backend on an f32 call: unsupported by its decode kernels (or not built / no device here). */
static void device_backends(void) {
    const kv_case c = { "p", FA_F32, 2, 4, 2, 32, 1, 1, 40, 16, 0, 1, 0, -1, -1, 0, 0, 0, 0, 0, 0 };
    kv_setup s;
    setup_make(&s, &c, 99, NULL);
    fa_exec x;
    memset(&x, 0, sizeof x);
    x.backend = FA_BACKEND_CUDA;
    fa_status want = !fa_backend_built(FA_BACKEND_CUDA) ? FA_ERR_NOT_COMPILED
                     : fa_device_count() == 0           ? FA_ERR_NO_DEVICE
                                                        : FA_ERR_UNSUPPORTED;
    fa_status st = fa_fwd_kvcache(&s.p, &s.kv, &x);
    th_check(st == want && !memcmp(s.kc, s.k0, s.es * s.cache_elems), "kvcache cuda backend: %s (want %s) \"%s\"",
             fa_status_name(st), fa_status_name(want), fa_last_error());
    /* an explicit workspace of the size the library asks for runs */
    x.backend = FA_BACKEND_CPU;
    size_t n = 0;
    st = fa_workspace_size_kvcache(&s.p, &s.kv, &x, &n);
    void *ws = malloc(n + 1);
    x.workspace = (char *)ws + 1, x.workspace_bytes = n; /* unaligned on purpose */
    fa_status run = st == FA_OK ? fa_fwd_kvcache(&s.p, &s.kv, &x) : st;
    th_check(st == FA_OK && n > 0 && run == FA_OK, "kvcache explicit workspace (%zu bytes): %s \"%s\"", n,
             fa_status_name(run), fa_last_error());
    th_check(fa_kvcache_sizeof() == sizeof(fa_kvcache), "kvcache: fa_kvcache_sizeof matches the header");
    free(ws);
    setup_free(&s);
}

int main(int argc, char **argv) {
    th_init(argc, argv, NULL);
    numeric_cases();
    gpu_cases();
    /* tag, dtype, batch, hq, hkv, d, sq, new, cap, page, rotary, interleaved, causal, wl, wr, softcap, alibi,
     * leftpad, batch_idx, no_seqlens, splits */
    const kv_case paged = { "paged", FA_F32, 4, 4, 2, 32, 2, 2, 70, 16, 16, 1, 1, -1, -1, 0, 0, 1, 0, 0, 0 };
    const kv_case dense = { "contiguous", FA_BF16, 4, 4, 2, 32, 1, 1, 70, 0, 0, 1, 0, -1, -1, 0, 0, 1, 1, 0, 0 };
    unattended_rows(&paged);
    unattended_rows(&dense);
    invalid_cases();
    too_many_rows();
    device_backends();
    return th_finish();
}
