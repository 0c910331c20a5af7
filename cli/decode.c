/* SPDX-License-Identifier: Apache-2.0 */
/*
 * decode.c - `flashattn check --decode`: decoding with a KV cache (fa_fwd_kvcache) checked against the fp64
 * reference.
 *
 * The cache holds --seqlen-k rows per sequence (contiguous, or paged through a shuffled block table with
 * --page-size), each sequence a random number of tokens already in it; --new tokens are appended (keys
 * rotated with --rotary-dim) and --seqlen-q query rows attend. The check builds the equivalent varlen problem
 * itself (its own walk over the cache, its own rotation) and compares O and LSE with that problem's fp64
 * reference under the tolerance rule of verify.c; the cache after the call must hold the appended rows and be
 * unchanged elsewhere. tests/test_kvcache.c does the same over a fixed set of cases.
 *
 * `flashattn bench --decode`: the median time of one decode step with every sequence attending --seqlen-k keys
 * (8 x 8k of GQA 32/8, d128 by default), as the K and V bytes read per second, next to the bandwidth of a
 * device-to-device copy of the K cache (bytes read + written) timed in the same run, interleaved with the calls.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cli.h"
#include "internal.h" /* fa_load, fa_store, fa_round_dtype: the library's own dtype conversions */

#ifdef FA_WITH_CUDA
#include <cuda_runtime.h>
#endif

typedef struct decode_call {
    fa_params p;
    fa_kvcache kv;
    size_t es, cache_elems, q_elems, new_elems;
    int32_t page, cap, max_pages, interleaved, rotary_dim;
    void *q, *o, *knew, *vnew, *k0, *v0, *kc, *vc, *cos, *sin;
    float *lse;
    int32_t *seqlens, *leftpad, *table;
} decode_call;

static void decode_free(decode_call *d) {
    free(d->q), free(d->o), free(d->knew), free(d->vnew), free(d->k0), free(d->v0), free(d->kc), free(d->vc);
    free(d->cos), free(d->sin), free(d->lse), free(d->seqlens), free(d->leftpad), free(d->table);
}

static void fill(vf_rng *r, void *buf, fa_dtype dt, size_t n) {
    for (size_t i = 0; i < n; i++) fa_store(buf, dt, (int64_t)i, (float)vf_rng_normal(r));
}

/* The inputs; 0 when an allocation fails. */
static int decode_make(decode_call *d, const cli_options *o, const float *slopes) {
    memset(d, 0, sizeof *d);
    vf_rng r;
    vf_rng_seed(&r, o->seed);
    const int32_t B = o->batch, hq = o->heads, hkv = o->heads_kv, hd = o->head_dim, sq = o->seqlen_q;
    const int32_t n_new = o->seqlen_new;
    d->es = o->dtype == FA_F32 ? 4 : 2;
    d->page = o->page_size, d->cap = o->seqlen_k, d->rotary_dim = o->rotary_dim, d->interleaved = !o->rotary_halves;
    fa_params_init(&d->p, o->dtype, B, sq, n_new, hq, hkv, hd);
    d->p.causal = o->causal > 0, d->p.window_left = o->window_left, d->p.window_right = o->window_right;
    d->p.softcap = o->softcap, d->p.softmax_scale = o->scale, d->p.alibi_slopes = slopes;
    d->q_elems = (size_t)B * sq * hq * hd, d->new_elems = (size_t)B * n_new * hkv * hd;
    d->q = malloc(d->es * d->q_elems), d->o = malloc(d->es * d->q_elems);
    d->lse = malloc(sizeof(float) * B * hq * sq);
    d->knew = malloc(d->es * d->new_elems + 1), d->vnew = malloc(d->es * d->new_elems + 1);
    const int32_t rows = d->page ? (d->max_pages = (d->cap + d->page - 1) / d->page) * B + 3 : B;
    const int32_t row_len = d->page ? d->page : d->cap;
    d->cache_elems = (size_t)rows * row_len * hkv * hd;
    d->k0 = malloc(d->es * d->cache_elems), d->v0 = malloc(d->es * d->cache_elems);
    d->kc = malloc(d->es * d->cache_elems), d->vc = malloc(d->es * d->cache_elems);
    d->seqlens = malloc(sizeof(int32_t) * B), d->leftpad = malloc(sizeof(int32_t) * B);
    if (d->page) d->table = malloc(sizeof(int32_t) * rows);
    if (!d->q || !d->o || !d->lse || !d->knew || !d->vnew || !d->k0 || !d->v0 || !d->kc || !d->vc || !d->seqlens ||
        !d->leftpad || (d->page && !d->table))
        return 0;
    fill(&r, d->q, o->dtype, d->q_elems);
    fill(&r, d->knew, o->dtype, d->new_elems);
    fill(&r, d->vnew, o->dtype, d->new_elems);
    fill(&r, d->k0, o->dtype, d->cache_elems);
    fill(&r, d->v0, o->dtype, d->cache_elems);
    memcpy(d->kc, d->k0, d->es * d->cache_elems);
    memcpy(d->vc, d->v0, d->es * d->cache_elems);
    d->p.q = fa_tensor_contiguous(d->q, sq, hq, hd);
    d->p.o = fa_tensor_contiguous(d->o, sq, hq, hd);
    d->p.lse = d->lse;
    if (n_new) {
        d->p.k = fa_tensor_contiguous(d->knew, n_new, hkv, hd);
        d->p.v = fa_tensor_contiguous(d->vnew, n_new, hkv, hd);
    }
    fa_kvcache_init(&d->kv, d->page ? 0 : B, d->page ? 0 : d->cap);
    d->kv.k_cache = fa_tensor_contiguous(d->kc, row_len, hkv, hd);
    d->kv.v_cache = fa_tensor_contiguous(d->vc, row_len, hkv, hd);
    if (d->page) {
        for (int32_t i = 0; i < rows; i++) d->table[i] = i;
        for (int32_t i = rows - 1; i > 0; i--) { /* distinct pages in a random order */
            int32_t j = (int32_t)vf_rng_range(&r, 0, i), t = d->table[i];
            d->table[i] = d->table[j], d->table[j] = t;
        }
        d->kv.block_table = d->table, d->kv.max_pages = d->max_pages, d->kv.num_pages = rows;
        d->kv.page_size = d->page;
    }
    const int32_t room = (d->page ? d->max_pages * d->page : d->cap) - n_new;
    for (int32_t b = 0; b < B; b++) {
        d->seqlens[b] = room < 0 ? 0 : b == 0 ? room : (int32_t)vf_rng_range(&r, 0, room);
        d->leftpad[b] = o->leftpad ? (int32_t)vf_rng_range(&r, 0, d->seqlens[b]) : 0;
    }
    d->kv.cache_seqlens = d->seqlens;
    if (o->leftpad) d->kv.cache_leftpad = d->leftpad;
    if (d->rotary_dim > 0) {
        const int32_t half = d->rotary_dim / 2, ro = (d->page ? d->max_pages * d->page : d->cap) + sq;
        d->cos = malloc(d->es * ro * half + 1), d->sin = malloc(d->es * ro * half + 1);
        if (!d->cos || !d->sin) return 0;
        for (int32_t pos = 0; pos < ro; pos++)
            for (int32_t t = 0; t < half; t++) {
                double theta = pos * pow(10000.0, -2.0 * t / d->rotary_dim);
                fa_store(d->cos, o->dtype, (int64_t)pos * half + t, (float)cos(theta));
                fa_store(d->sin, o->dtype, (int64_t)pos * half + t, (float)sin(theta));
            }
        d->kv.rotary_cos = d->cos, d->kv.rotary_sin = d->sin, d->kv.rotary_seqlen = ro;
        d->kv.rotary_dim = d->rotary_dim, d->kv.rotary_interleaved = d->interleaved;
    }
    return 1;
}

/* This check's own rotation of a row (fp32, each result rounded to the dtype, as fa_fwd_kvcache documents). */
static void rotate(const decode_call *d, int64_t pos, float *x) {
    const int half = d->rotary_dim / 2;
    const fa_dtype dt = d->p.dtype;
    for (int t = 0; t < half; t++) {
        int a = d->interleaved ? 2 * t : t, c = d->interleaved ? 2 * t + 1 : t + half;
        float cs = fa_load(d->cos, dt, pos * half + t), sn = fa_load(d->sin, dt, pos * half + t);
        float x0 = x[a], x1 = x[c];
        x[a] = fa_round_dtype(dt, x0 * cs - x1 * sn);
        x[c] = fa_round_dtype(dt, x0 * sn + x1 * cs);
    }
}

/* Element index of cache row r of sequence b, kv head h. */
static int64_t cache_index(const decode_call *d, int b, int64_t r, int h) {
    const int64_t hkv = d->p.heads_kv, hd = d->p.head_dim;
    if (d->page) return (((int64_t)d->table[b * d->max_pages + r / d->page] * d->page + r % d->page) * hkv + h) * hd;
    return (((int64_t)b * d->cap + r) * hkv + h) * hd;
}

int cli_check_decode(cli_options *o, fa_backend b) {
    if (o->page_size < 0 || o->seqlen_new < 0) return EXIT_USAGE;
    char desc[256];
    cli_describe(o, desc, sizeof desc);
    printf("flashattn check --decode: %s backend\n  problem: %s (seqlen_k: the cache's rows per sequence), ",
           cli_backend_name(b), desc);
    if (o->page_size)
        printf("paged (page size %d)", o->page_size);
    else
        printf("contiguous cache");
    printf(", %d new token(s)", o->seqlen_new);
    if (o->rotary_dim) printf(", rotary_dim %d %s", o->rotary_dim, o->rotary_halves ? "(halves)" : "(interleaved)");
    printf("%s, seed %llu\n", o->leftpad ? ", leftpad" : "", (unsigned long long)o->seed);
    fflush(stdout);

    /* the equivalent varlen problem (its slopes are the ones the call uses) */
    vf_config c;
    cli_config(o, &c);
    c.varlen = 1, c.edge_lengths = 0, c.extra_tokens = 0, c.layout = VF_LAYOUT_BSHD;
    int32_t *lens_q = malloc(sizeof(int32_t) * o->batch), *lens_k = malloc(sizeof(int32_t) * o->batch);
    decode_call d;
    vf_problem pr;
    int code = EXIT_OK, have_pr = 0;
    if (!lens_q || !lens_k) {
        fprintf(stderr, "flashattn: out of memory\n");
        code = EXIT_RUNTIME;
        goto out_lens;
    }
    for (int32_t i = 0; i < o->batch; i++) lens_q[i] = o->seqlen_q, lens_k[i] = 0;
    c.lens_q = lens_q, c.lens_k = lens_k;
    if (!decode_make(&d, o, NULL)) {
        fprintf(stderr, "flashattn: out of memory for the cache\n");
        code = EXIT_RUNTIME;
        goto out;
    }
    fa_exec x = cli_exec(o, b);
    /* (a device backend sees the device copies only: vf_run_kvcache makes them, and its call checks them) */
    fa_status st = vf_backend_on_device(b) ? FA_OK : fa_check_kvcache(&d.p, &d.kv, &x);
    if (st != FA_OK) {
        code = cli_report_status(st, "fa_fwd_kvcache refuses the problem", fa_last_error());
        goto out;
    }
    for (int32_t i = 0; i < o->batch; i++) lens_k[i] = d.seqlens[i] + o->seqlen_new - d.leftpad[i];
    c.seqlen_k = 1; /* at least 1 for the problem's checks; the longest attended range otherwise */
    for (int32_t i = 0; i < o->batch; i++)
        if (lens_k[i] > c.seqlen_k) c.seqlen_k = lens_k[i];
    if ((st = vf_problem_create(&pr, &c)) != FA_OK) {
        code = cli_report_status(st, "cannot build the reference problem", pr.error);
        goto out;
    }
    have_pr = 1;
    d.p.alibi_slopes = pr.p.alibi_slopes, d.p.alibi_batch_stride = pr.p.alibi_batch_stride;

    const int64_t hd = o->head_dim;
    float row[256];
    for (int32_t bb = 0; bb < o->batch; bb++) {
        const int local = (o->causal > 0) || o->window_left >= 0 || o->window_right >= 0;
        for (int32_t i = 0; i < o->seqlen_q; i++)
            for (int32_t h = 0; h < o->heads; h++) {
                for (int64_t e = 0; e < hd; e++)
                    row[e] = fa_load(d.q, o->dtype, (((int64_t)bb * o->seqlen_q + i) * o->heads + h) * hd + e);
                if (d.rotary_dim > 0) rotate(&d, d.seqlens[bb] + (local ? i : 0), row);
                const int64_t at = (pr.cu_q[bb] + i) * pr.q.view.stride_seq + h * pr.q.view.stride_head;
                for (int64_t e = 0; e < hd; e++) fa_store(pr.q.view.data, o->dtype, at + e, row[e]);
            }
        for (int64_t r = d.leftpad[bb]; r < d.seqlens[bb] + o->seqlen_new; r++)
            for (int32_t h = 0; h < o->heads_kv; h++) {
                const int64_t tok = pr.cu_k[bb] + r - d.leftpad[bb];
                const int64_t ak = tok * pr.k.view.stride_seq + h * pr.k.view.stride_head;
                const int64_t av = tok * pr.v.view.stride_seq + h * pr.v.view.stride_head;
                const int64_t j = r - d.seqlens[bb], src = (((int64_t)bb * o->seqlen_new + j) * o->heads_kv + h) * hd;
                for (int64_t e = 0; e < hd; e++)
                    row[e] = j < 0 ? fa_load(d.k0, o->dtype, cache_index(&d, bb, r, h) + e)
                                   : fa_load(d.knew, o->dtype, src + e);
                if (j >= 0 && d.rotary_dim > 0) rotate(&d, r, row);
                for (int64_t e = 0; e < hd; e++) {
                    fa_store(pr.k.view.data, o->dtype, ak + e, row[e]);
                    fa_store(pr.v.view.data, o->dtype, av + e,
                             j < 0 ? fa_load(d.v0, o->dtype, cache_index(&d, bb, r, h) + e)
                                   : fa_load(d.vnew, o->dtype, src + e));
                }
            }
    }

    memset(d.o, 0xff, d.es * d.q_elems); /* NaN: an element left unwritten fails the comparison */
    memset(d.lse, 0xff, sizeof(float) * o->batch * o->heads * o->seqlen_q);
    vf_kvcache_bytes bytes;
    memset(&bytes, 0, sizeof bytes);
    bytes.q = bytes.o = d.es * d.q_elems, bytes.lse = sizeof(float) * o->batch * o->heads * o->seqlen_q;
    bytes.k = bytes.v = d.es * d.new_elems, bytes.k_cache = bytes.v_cache = d.es * d.cache_elems;
    if (d.rotary_dim > 0)
        bytes.rotary = d.es * (size_t)((d.page ? d.max_pages * d.page : d.cap) + o->seqlen_q) * (d.rotary_dim / 2);
    bytes.alibi = d.p.alibi_slopes ? sizeof(float) * (size_t)pr.slope_count : 0;
    bytes.seqlens = bytes.leftpad = sizeof(int32_t) * o->batch;
    if (d.page) bytes.block_table = sizeof(int32_t) * ((size_t)d.max_pages * o->batch + 3);
    char why[256];
    double t0 = vf_seconds(), check_ms[2];
    st = vf_run_kvcache_timed(&d.p, &d.kv, &x, &bytes, why, sizeof why, x.check ? check_ms : NULL);
    if (st != FA_OK) {
        code = cli_report_status(st, "the backend failed", why[0] ? why : fa_last_error());
        goto out;
    }
    printf("  fa_fwd_kvcache: %.3f ms%s\n", 1e3 * (vf_seconds() - t0),
           vf_backend_on_device(b) ? " (with the copies to and from the device)" : "");
    if (x.check && check_ms[0] >= 0 && check_ms[1] >= 0)
        printf("  device check of the cache arrays (exec.check = 1): +%.3f ms per call (%.3f ms with, %.3f "
               "without)\n",
               check_ms[1] - check_ms[0], check_ms[1], check_ms[0]);
    for (int32_t bb = 0; bb < o->batch; bb++)
        for (int32_t i = 0; i < o->seqlen_q; i++)
            for (int32_t h = 0; h < o->heads; h++) {
                const int64_t at = (pr.cu_q[bb] + i) * pr.o.view.stride_seq + h * pr.o.view.stride_head;
                const int64_t src = (((int64_t)bb * o->seqlen_q + i) * o->heads + h) * hd;
                for (int64_t e = 0; e < hd; e++)
                    fa_store(pr.o.view.data, o->dtype, at + e, fa_load(d.o, o->dtype, src + e));
                pr.lse[(int64_t)h * pr.p.total_q + pr.cu_q[bb] + i] =
                    d.lse[((int64_t)bb * o->heads + h) * o->seqlen_q + i];
            }
    /* the cache: appended rows as this check's (V exactly, K within a rounding of the rotation), the rest
     * unchanged */
    const double u = o->dtype == FA_BF16 ? 0x1p-8 : o->dtype == FA_F16 ? 0x1p-11 : 0x1p-24;
    int64_t bad_rows = 0, changed = 0;
    unsigned char *touched = calloc(d.cache_elems, 1);
    for (int32_t bb = 0; touched && bb < o->batch; bb++)
        for (int32_t j = 0; j < o->seqlen_new; j++)
            for (int32_t h = 0; h < o->heads_kv; h++) {
                const int64_t r = d.seqlens[bb] + j, at = cache_index(&d, bb, r, h);
                const int64_t src = (((int64_t)bb * o->seqlen_new + j) * o->heads_kv + h) * hd;
                int bad = 0;
                for (int64_t e = 0; e < hd; e++) row[e] = fa_load(d.knew, o->dtype, src + e);
                if (d.rotary_dim > 0) rotate(&d, r, row);
                for (int64_t e = 0; e < hd; e++) {
                    touched[at + e] = 1;
                    double k = fa_load(d.kc, o->dtype, at + e);
                    bad |= fabs(k - row[e]) > 2 * u * fabs(row[e]) + 0x1p-21 ||
                           fa_load(d.vc, o->dtype, at + e) != fa_load(d.vnew, o->dtype, src + e);
                }
                bad_rows += bad;
            }
    for (size_t i = 0; touched && i < d.cache_elems; i++)
        changed += !touched[i] && (memcmp((char *)d.kc + i * d.es, (char *)d.k0 + i * d.es, d.es) ||
                                   memcmp((char *)d.vc + i * d.es, (char *)d.v0 + i * d.es, d.es));
    free(touched);
    vf_report rep;
    if ((st = vf_compare(&pr, 0, &rep)) != FA_OK) {
        code = cli_report_status(st, "cannot compute the reference", pr.error);
        goto out;
    }
    printf("  against the fp64 reference of the gathered problem; tolerance = 2 x naive %s error + floor:\n",
           cli_dtype_name(o->dtype));
    vf_report_print(stdout, &rep, "    ");
    printf("  cache: %lld appended row(s) wrong, %lld other element(s) changed\n", (long long)bad_rows,
           (long long)changed);
    const int ok = rep.ok && bad_rows == 0 && changed == 0;
    printf("check: %s O %.2e %s %.2e LSE %.2e %s %.2e%s\n", ok ? "PASS" : "FAIL", rep.err[VF_O].max_abs,
           rep.err[VF_O].ok ? "<=" : ">", rep.err[VF_O].tol, rep.err[VF_LSE].max_abs, rep.err[VF_LSE].ok ? "<=" : ">",
           rep.err[VF_LSE].tol, bad_rows || changed ? " (cache wrong)" : "");
    code = ok ? EXIT_OK : EXIT_NUMERICAL;
out:
    if (have_pr) vf_problem_destroy(&pr);
    decode_free(&d);
out_lens:
    free(lens_q), free(lens_k);
    return code;
}

/* ---------------------------------------------------------------------------------------------------------
 * bench --decode
 * ------------------------------------------------------------------------------------------------------- */

/* The arrays of a timed decode call, in the backend's memory space: every sequence holds seqlen_k - new tokens
 * (the call attends seqlen_k keys); a paged cache maps sequence b's pages to b * max_pages + j. */
typedef struct decode_bench {
    int gpu;
    size_t q_bytes, lse_bytes, new_bytes, cache_bytes, table_bytes, flush_bytes;
    void *q, *o, *knew, *vnew, *kc, *vc, *copy_dst, *flush;
    float *lse;
    int32_t *seqlens, *table;
} decode_bench;

static void *bench_alloc(const decode_bench *d, size_t n) {
    if (n == 0) n = 16;
#ifdef FA_WITH_CUDA
    if (d->gpu) {
        void *p = NULL;
        if (cudaMalloc(&p, n) != cudaSuccess) {
            cudaGetLastError();
            return NULL;
        }
        return p;
    }
#endif
    return malloc(n);
}

static void bench_free(const decode_bench *d, void *p) {
#ifdef FA_WITH_CUDA
    if (d->gpu) {
        cudaFree(p);
        return;
    }
#endif
    free(p);
}

/* Copies n host bytes to dst in the backend's memory (0 on failure). */
static int bench_upload(const decode_bench *d, void *dst, const void *src, size_t n) {
#ifdef FA_WITH_CUDA
    if (d->gpu) return cudaMemcpy(dst, src, n, cudaMemcpyHostToDevice) == cudaSuccess;
#endif
    memcpy(dst, src, n);
    return 1;
}

/* Median of n values (sorts them). */
static double median(double *v, int n) {
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double t = v[j];
            v[j] = v[j - 1], v[j - 1] = t;
        }
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/* Milliseconds of one call of the decode step (copy = 0) or of the copy of the K cache (copy = 1): on a GPU
 * CUDA events around it, after a write of twice the L2 size that evicts the cache; on the CPU the wall clock. */
static fa_status bench_once(decode_bench *d, const fa_params *p, const fa_kvcache *kv, const fa_exec *x, int copy,
                            double *ms) {
#ifdef FA_WITH_CUDA
    if (d->gpu) {
        cudaEvent_t e0, e1;
        cudaEventCreate(&e0), cudaEventCreate(&e1);
        if (d->flush) cudaMemsetAsync(d->flush, 0, d->flush_bytes, (cudaStream_t)x->stream);
        cudaEventRecord(e0, (cudaStream_t)x->stream);
        fa_status st = FA_OK;
        if (copy)
            cudaMemcpyAsync(d->copy_dst, d->kc, d->cache_bytes, cudaMemcpyDeviceToDevice, (cudaStream_t)x->stream);
        else
            st = fa_fwd_kvcache(p, kv, x);
        cudaEventRecord(e1, (cudaStream_t)x->stream);
        float f = 0.0f;
        if (cudaEventSynchronize(e1) != cudaSuccess || cudaEventElapsedTime(&f, e0, e1) != cudaSuccess) {
            cudaGetLastError();
            if (st == FA_OK) st = FA_ERR_DEVICE;
        }
        cudaEventDestroy(e0), cudaEventDestroy(e1);
        *ms = f;
        return st;
    }
#endif
    double t0 = vf_seconds();
    fa_status st = FA_OK;
    if (copy)
        memcpy(d->copy_dst, d->kc, d->cache_bytes);
    else
        st = fa_fwd_kvcache(p, kv, x);
    *ms = 1e3 * (vf_seconds() - t0);
    return st;
}

int cli_bench_decode(cli_options *o) {
    if (o->nbackends > 1) {
        fprintf(stderr, "flashattn: bench --decode takes one backend\n");
        return EXIT_USAGE;
    }
    if (o->sweep || o->plot || o->peers || o->csv || o->json || o->varlen || o->bwd || o->rotary_dim || o->leftpad) {
        fprintf(stderr, "flashattn: bench --decode times one decode step: --sweep, --plot, --peers, --csv, --json, "
                        "--varlen, --bwd, --rotary-dim and --leftpad do not apply\n");
        return EXIT_USAGE;
    }
    const fa_backend b = o->nbackends ? o->backends[0] : cli_auto_backend();
    decode_bench d;
    memset(&d, 0, sizeof d);
    d.gpu = vf_backend_on_device(b);
#ifndef FA_WITH_CUDA
    if (d.gpu) {
        fprintf(stderr, "flashattn: bench --decode: the %s backend was not built into this library\n",
                cli_backend_name(b));
        return EXIT_UNSUPPORTED;
    }
#endif
    if (d.gpu && fa_device_count() == 0) {
        fprintf(stderr, "flashattn: bench --decode: no CUDA device is present\n");
        return EXIT_UNSUPPORTED;
    }
    /* the 8 x 8k shape of GQA 32/8, d128 by default; --seqlen-k is the attended length of every sequence */
    if (o->seqlen_k < 0) o->seqlen_k = d.gpu ? 8192 : 2048;
    if (o->heads < 0 && o->heads_kv < 0) o->heads = 32, o->heads_kv = 8;
    cli_set_defaults(o, d.gpu, d.gpu ? 8 : 2, 32, 1, 128, 0);
    const int warmup = o->warmup >= 0 ? o->warmup : d.gpu ? 3 : 1;
    const int repeats = o->repeats > 0 ? o->repeats : d.gpu ? 20 : 5;
    const int32_t B = o->batch, hq = o->heads, hkv = o->heads_kv, hd = o->head_dim, sq = o->seqlen_q;
    const int32_t n_new = o->seqlen_new, len = o->seqlen_k, page = o->page_size;
    if (n_new > len) {
        fprintf(stderr, "flashattn: bench --decode: --new (%d) exceeds --seqlen-k (%d)\n", n_new, len);
        return EXIT_USAGE;
    }
    const size_t es = o->dtype == FA_F32 ? 4 : 2;
    const int32_t max_pages = page ? (len + page - 1) / page : 0, rows = page ? page : len;
    d.q_bytes = es * B * sq * hq * hd, d.lse_bytes = sizeof(float) * B * hq * sq,
    d.new_bytes = es * B * n_new * hkv * hd;
    d.cache_bytes = es * (size_t)(page ? B * max_pages : B) * rows * hkv * hd;
    d.table_bytes = sizeof(int32_t) * (size_t)B * max_pages;
    d.q = bench_alloc(&d, d.q_bytes), d.o = bench_alloc(&d, d.q_bytes), d.lse = bench_alloc(&d, d.lse_bytes);
    d.knew = bench_alloc(&d, d.new_bytes), d.vnew = bench_alloc(&d, d.new_bytes);
    d.kc = bench_alloc(&d, d.cache_bytes), d.vc = bench_alloc(&d, d.cache_bytes);
    d.copy_dst = bench_alloc(&d, d.cache_bytes);
    d.seqlens = bench_alloc(&d, sizeof(int32_t) * B), d.table = bench_alloc(&d, d.table_bytes);
    int code = EXIT_OK;
    int32_t *host_i = malloc(sizeof(int32_t) * ((size_t)B + (size_t)B * max_pages + 1));
    uint16_t *host_v = malloc(d.q_bytes + d.new_bytes + 16);
    if (!d.q || !d.o || !d.lse || !d.knew || !d.vnew || !d.kc || !d.vc || !d.copy_dst || !d.seqlens || !d.table ||
        !host_i || !host_v) {
        fprintf(stderr, "flashattn: bench --decode: out of %s memory\n", d.gpu ? "device" : "host");
        code = EXIT_RUNTIME;
        goto out;
    }
#ifdef FA_WITH_CUDA
    if (d.gpu) {
        int dev = 0, l2 = 0;
        cudaGetDevice(&dev);
        cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev);
        d.flush_bytes = 2 * (size_t)l2;
        if (d.flush_bytes && cudaMalloc(&d.flush, d.flush_bytes) != cudaSuccess) d.flush = NULL, cudaGetLastError();
        /* 0x3c in every byte: a small finite value in f16 and bf16 */
        cudaMemset(d.kc, 0x3c, d.cache_bytes), cudaMemset(d.vc, 0x3c, d.cache_bytes);
    } else
#endif
    {
        memset(d.kc, 0x3c, d.cache_bytes), memset(d.vc, 0x3c, d.cache_bytes);
    }
    {
        vf_rng r;
        vf_rng_seed(&r, o->seed);
        const size_t nv = (d.q_bytes + d.new_bytes) / es;
        for (size_t i = 0; i < nv; i++) fa_store(host_v, o->dtype, (int64_t)i, (float)vf_rng_normal(&r));
        for (int32_t i = 0; i < B; i++) host_i[i] = len - n_new;
        for (int64_t i = 0; i < (int64_t)B * max_pages; i++) host_i[B + i] = (int32_t)i;
        if (!bench_upload(&d, d.q, host_v, d.q_bytes) ||
            (d.new_bytes && (!bench_upload(&d, d.knew, (char *)host_v + d.q_bytes, d.new_bytes) ||
                             !bench_upload(&d, d.vnew, (char *)host_v + d.q_bytes, d.new_bytes))) ||
            !bench_upload(&d, d.seqlens, host_i, sizeof(int32_t) * B) ||
            (d.table_bytes && !bench_upload(&d, d.table, host_i + B, d.table_bytes))) {
            fprintf(stderr, "flashattn: bench --decode: copying the inputs failed\n");
            code = EXIT_RUNTIME;
            goto out;
        }
    }
    fa_params p;
    fa_params_init(&p, o->dtype, B, sq, n_new, hq, hkv, hd);
    p.causal = o->causal > 0, p.window_left = o->window_left, p.window_right = o->window_right;
    p.softcap = o->softcap, p.softmax_scale = o->scale;
    p.q = fa_tensor_contiguous(d.q, sq, hq, hd), p.o = fa_tensor_contiguous(d.o, sq, hq, hd), p.lse = d.lse;
    if (n_new) p.k = fa_tensor_contiguous(d.knew, n_new, hkv, hd), p.v = fa_tensor_contiguous(d.vnew, n_new, hkv, hd);
    fa_kvcache kv;
    fa_kvcache_init(&kv, page ? 0 : B, page ? 0 : len);
    kv.k_cache = fa_tensor_contiguous(d.kc, rows, hkv, hd), kv.v_cache = fa_tensor_contiguous(d.vc, rows, hkv, hd);
    kv.cache_seqlens = d.seqlens;
    if (page) kv.block_table = d.table, kv.max_pages = max_pages, kv.num_pages = B * max_pages, kv.page_size = page;
    fa_exec x = cli_exec(o, b);
    fa_status st = fa_check_kvcache(&p, &kv, &x);
    size_t ws_bytes = 0;
    if (st == FA_OK) st = fa_workspace_size_kvcache(&p, &kv, &x, &ws_bytes);
    void *ws = NULL;
    if (st == FA_OK && ws_bytes && !(ws = bench_alloc(&d, ws_bytes))) st = FA_ERR_OUT_OF_MEMORY;
    x.workspace = ws, x.workspace_bytes = ws ? ws_bytes : 0;
    char desc[256], dev[300];
    cli_describe(o, desc, sizeof desc);
    cli_device_name(b, o, dev, sizeof dev);
    printf("flashattn bench --decode: %s backend (%s)\n  problem: %s, every sequence attends %d cached keys, %d new "
           "token(s), %s\n",
           cli_backend_name(b), dev, desc, len, n_new, page ? "paged" : "contiguous cache");
    if (page) printf("  page size %d\n", page);
    double *t = malloc(sizeof(double) * (size_t)repeats * 2);
    for (int i = 0; st == FA_OK && t && i < warmup + repeats; i++) {
        double ms_call = 0.0, ms_copy = 0.0;
        st = bench_once(&d, &p, &kv, &x, 0, &ms_call);
        if (st == FA_OK) st = bench_once(&d, &p, &kv, &x, 1, &ms_copy);
        if (i >= warmup) t[i - warmup] = ms_call, t[repeats + i - warmup] = ms_copy;
    }
    if (st != FA_OK || !t) {
        code = cli_report_status(t ? st : FA_ERR_OUT_OF_MEMORY, "bench --decode", fa_last_error());
    } else {
        /* interleaved with the calls, the copy reads and writes the K cache's bytes */
        const double ms = median(t, repeats), ms_copy = median(t + repeats, repeats);
        const double kv_bytes = 2.0 * es * (double)B * len * hkv * hd;
        const double bw = kv_bytes / ms / 1e9, copy_bw = 2.0 * d.cache_bytes / ms_copy / 1e9; /* TB/s */
        const double unit = d.gpu ? 1.0 : 1e-3;
        const char *un = d.gpu ? "TB/s" : "GB/s";
        printf("  fa_fwd_kvcache: %.4f ms (median of %d), K+V read %.1f MB: %.3f %s\n", ms, repeats, kv_bytes / 1e6,
               bw / unit, un);
        printf("  copy of %.1f MB (read + write): %.4f ms, %.3f %s\n", d.cache_bytes / 1e6, ms_copy, copy_bw / unit,
               un);
        printf("bench --decode: %.3f %s = %.1f%% of the copy bandwidth (%.3f %s)\n", bw / unit, un,
               100.0 * bw / copy_bw, copy_bw / unit, un);
    }
    free(t);
    bench_free(&d, ws);
out:
    bench_free(&d, d.q), bench_free(&d, d.o), bench_free(&d, d.lse), bench_free(&d, d.knew), bench_free(&d, d.vnew);
    bench_free(&d, d.kc), bench_free(&d, d.vc), bench_free(&d, d.copy_dst), bench_free(&d, d.seqlens);
    bench_free(&d, d.table);
#ifdef FA_WITH_CUDA
    if (d.flush) cudaFree(d.flush);
#endif
    free(host_i), free(host_v);
    return code;
}
