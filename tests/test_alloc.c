/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_alloc.c - allocation failures on the host backends. Linked with -Wl,--wrap=malloc, so every malloc of
 * the library (the static archive) goes through __wrap_malloc below, which can fail the N-th call. For the CPU
 * and reference backends, forward and backward, dense and varlen: count the calls of a good run, then fail
 * each of them in turn; every such run must return FA_ERR_OUT_OF_MEMORY with every output byte as poisoned
 * before the call, and the run after it must succeed again (nothing left half-freed). The same for the decode
 * call (fa_fwd_kvcache), whose outputs include the cache it appends to.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "flashattn.h"
#include "harness.h"

void *__real_malloc(size_t size);
void *__wrap_malloc(size_t size);

static int armed;    /* count the calls (and maybe fail one) only inside the library call under test */
static long calls;   /* mallocs seen while armed */
static long fail_at; /* 1-based call to fail; 0 = none */

void *__wrap_malloc(size_t size) {
    if (armed && ++calls == fail_at) return NULL;
    return __real_malloc(size);
}

enum { B = 2, SQ = 37, SK = 45, HQ = 4, HKV = 2, D = 24 };

typedef struct bufs {
    float q[B * SQ * HQ * D], k[B * SK * HKV * D], v[B * SK * HKV * D], dout[B * SQ * HQ * D];
    float o[B * SQ * HQ * D], lse[B * HQ * SQ], dq[B * SQ * HQ * D], dk[B * SK * HKV * D], dv[B * SK * HKV * D];
} bufs;

static bufs x, saved;
static int32_t cu_q[B + 1] = { 0, 20, 37 }, cu_k[B + 1] = { 0, 45, 45 };

static void problem(fa_params *p, int varlen) {
    for (size_t i = 0; i < sizeof x.q / 4; i++) x.q[i] = (float)((i * 7919) % 101) / 50.0f - 1.0f;
    for (size_t i = 0; i < sizeof x.k / 4; i++) x.k[i] = (float)((i * 104729) % 97) / 48.0f - 1.0f;
    for (size_t i = 0; i < sizeof x.v / 4; i++) x.v[i] = (float)((i * 31) % 89) / 44.0f - 1.0f;
    for (size_t i = 0; i < sizeof x.dout / 4; i++) x.dout[i] = (float)((i * 17) % 83) / 41.0f - 1.0f;
    fa_params_init(p, FA_F32, B, SQ, SK, HQ, HKV, D);
    p->causal = 1;
    int64_t rq = SQ, rk = SK;
    if (varlen) {
        p->cu_seqlens_q = cu_q, p->cu_seqlens_k = cu_k;
        p->total_q = cu_q[B], p->total_k = cu_k[B];
        rq = B * SQ, rk = B * SK; /* packed views over the same buffers */
    }
    p->q = fa_tensor_contiguous(x.q, rq, HQ, D), p->k = fa_tensor_contiguous(x.k, rk, HKV, D);
    p->v = fa_tensor_contiguous(x.v, rk, HKV, D), p->o = fa_tensor_contiguous(x.o, rq, HQ, D);
    p->dout = fa_tensor_contiguous(x.dout, rq, HQ, D), p->dq = fa_tensor_contiguous(x.dq, rq, HQ, D);
    p->dk = fa_tensor_contiguous(x.dk, rk, HKV, D), p->dv = fa_tensor_contiguous(x.dv, rk, HKV, D);
    p->lse = x.lse;
}

static fa_status call(const fa_params *p, fa_backend be, int backward, long fail) {
    fa_exec e = { be, FA_KERNEL_AUTO, -1, 0, NULL, NULL, 0, 0 };
    calls = 0, fail_at = fail, armed = 1;
    fa_status st = backward ? fa_bwd(p, &e) : fa_fwd(p, &e);
    armed = 0;
    return st;
}

/* The outputs of the call: o and lse (forward), dq, dk, dv (backward). */
static void poison(int backward) {
    if (backward) {
        memset(x.dq, 0xa5, sizeof x.dq), memset(x.dk, 0xa5, sizeof x.dk), memset(x.dv, 0xa5, sizeof x.dv);
    } else {
        memset(x.o, 0xa5, sizeof x.o), memset(x.lse, 0xa5, sizeof x.lse);
    }
    saved = x;
}

static void sweep(fa_backend be, int backward, int varlen) {
    const char *name = be == FA_BACKEND_CPU ? "cpu" : "reference";
    const char *what = backward ? "bwd" : "fwd";
    fa_params p;
    problem(&p, varlen);
    if (backward && call(&p, be, 0, 0) != FA_OK) { /* the forward's o and lse */
        th_fail("%s %s %s: forward failed: %s", name, what, varlen ? "varlen" : "dense", fa_last_error());
        return;
    }
    poison(backward);
    fa_status st = call(&p, be, backward, 0);
    const long n = calls;
    if (!th_check(st == FA_OK && n > 0, "%s %s %s: good run, %ld allocations", name, what, varlen ? "varlen" : "dense",
                  n))
        return;
    int bad = 0;
    for (long k = 1; k <= n; k++) {
        poison(backward);
        st = call(&p, be, backward, k);
        if (st != FA_ERR_OUT_OF_MEMORY || memcmp(&x, &saved, sizeof x) || !*fa_last_error()) {
            th_fail("%s %s %s: allocation %ld of %ld failed: status %s, outputs %s", name, what,
                    varlen ? "varlen" : "dense", k, n, fa_status_name(st),
                    memcmp(&x, &saved, sizeof x) ? "written" : "untouched");
            bad = 1;
        }
    }
    st = call(&p, be, backward, 0);
    if (!bad)
        th_check(st == FA_OK,
                 "%s %s %s: each of %ld allocations failed in turn: FA_ERR_OUT_OF_MEMORY, outputs "
                 "untouched; then a good run",
                 name, what, varlen ? "varlen" : "dense", n);
}

/* Decoding with a KV cache: a paged cache, two new tokens appended with rotary. The cache is an output too:
 * a failed allocation must leave it as it was. */
enum { KV_PAGES = 16, KV_PAGE = 8, KV_MAX_PAGES = 8, KV_NEW = 2, KV_SQ = 2, KV_ROT = 16, KV_RO = 70 };

typedef struct kv_bufs {
    float kc[KV_PAGES * KV_PAGE * HKV * D], vc[KV_PAGES * KV_PAGE * HKV * D];
    float o[B * KV_SQ * HQ * D], lse[B * HQ * KV_SQ];
} kv_bufs;

static kv_bufs kvx, kv_saved;
static float kq[B * KV_SQ * HQ * D], knew[B * KV_NEW * HKV * D], vnew[B * KV_NEW * HKV * D];
static float rcos[KV_RO * KV_ROT / 2], rsin[KV_RO * KV_ROT / 2];
static int32_t table[B * KV_MAX_PAGES], seqlens[B] = { 40, 0 };

static fa_status kv_call(const fa_params *p, const fa_kvcache *kv, fa_backend be, long fail) {
    fa_exec e = { be, FA_KERNEL_AUTO, -1, 0, NULL, NULL, 0, 0 };
    calls = 0, fail_at = fail, armed = 1;
    fa_status st = fa_fwd_kvcache(p, kv, &e);
    armed = 0;
    return st;
}

static void kv_sweep(fa_backend be) {
    const char *name = be == FA_BACKEND_CPU ? "cpu" : "reference";
    for (size_t i = 0; i < sizeof kq / 4; i++) kq[i] = (float)((i * 7919) % 101) / 50.0f - 1.0f;
    for (size_t i = 0; i < sizeof knew / 4; i++) knew[i] = (float)((i * 31) % 89) / 44.0f - 1.0f;
    for (size_t i = 0; i < sizeof vnew / 4; i++) vnew[i] = (float)((i * 17) % 83) / 41.0f - 1.0f;
    for (size_t i = 0; i < sizeof rcos / 4; i++) rcos[i] = (float)((i * 13) % 29) / 14.0f - 1.0f;
    for (size_t i = 0; i < sizeof rsin / 4; i++) rsin[i] = (float)((i * 11) % 23) / 11.0f - 1.0f;
    for (int i = 0; i < B * KV_MAX_PAGES; i++) table[i] = (i * 5) % KV_PAGES;
    fa_params p;
    fa_params_init(&p, FA_F32, B, KV_SQ, KV_NEW, HQ, HKV, D);
    p.causal = 1;
    p.q = fa_tensor_contiguous(kq, KV_SQ, HQ, D), p.o = fa_tensor_contiguous(kvx.o, KV_SQ, HQ, D);
    p.k = fa_tensor_contiguous(knew, KV_NEW, HKV, D), p.v = fa_tensor_contiguous(vnew, KV_NEW, HKV, D);
    p.lse = kvx.lse;
    fa_kvcache kv;
    fa_kvcache_init(&kv, 0, 0);
    kv.k_cache = fa_tensor_contiguous(kvx.kc, KV_PAGE, HKV, D),
    kv.v_cache = fa_tensor_contiguous(kvx.vc, KV_PAGE, HKV, D);
    kv.block_table = table, kv.max_pages = KV_MAX_PAGES, kv.num_pages = KV_PAGES, kv.page_size = KV_PAGE;
    kv.cache_seqlens = seqlens;
    kv.rotary_cos = rcos, kv.rotary_sin = rsin, kv.rotary_seqlen = KV_RO, kv.rotary_dim = KV_ROT;
    for (size_t i = 0; i < sizeof kvx.kc / 4; i++) kvx.kc[i] = (float)((i * 104729) % 97) / 48.0f - 1.0f;
    for (size_t i = 0; i < sizeof kvx.vc / 4; i++) kvx.vc[i] = (float)((i * 7) % 79) / 39.0f - 1.0f;
    memset(kvx.o, 0xa5, sizeof kvx.o), memset(kvx.lse, 0xa5, sizeof kvx.lse);
    kv_saved = kvx;
    fa_status st = kv_call(&p, &kv, be, 0);
    const long n = calls;
    if (!th_check(st == FA_OK && n > 0, "%s kvcache: good run, %ld allocations", name, n)) return;
    int bad = 0;
    for (long k = 1; k <= n; k++) {
        kvx = kv_saved;
        st = kv_call(&p, &kv, be, k);
        if (st != FA_ERR_OUT_OF_MEMORY || memcmp(&kvx, &kv_saved, sizeof kvx) || !*fa_last_error()) {
            th_fail("%s kvcache: allocation %ld of %ld failed: status %s, outputs or cache %s", name, k, n,
                    fa_status_name(st), memcmp(&kvx, &kv_saved, sizeof kvx) ? "written" : "untouched");
            bad = 1;
        }
    }
    kvx = kv_saved;
    st = kv_call(&p, &kv, be, 0);
    if (!bad)
        th_check(st == FA_OK && memcmp(&kvx, &kv_saved, sizeof kvx),
                 "%s kvcache: each of %ld allocations failed in turn: FA_ERR_OUT_OF_MEMORY, outputs and cache "
                 "untouched; then a good run (which writes them)",
                 name, n);
}

int main(int argc, char **argv) {
    th_init(argc, argv, NULL);
    const fa_backend be[2] = { FA_BACKEND_CPU, FA_BACKEND_REFERENCE };
    for (int i = 0; i < 2; i++)
        for (int backward = 0; backward < 2; backward++)
            for (int varlen = 0; varlen < 2; varlen++) sweep(be[i], backward, varlen);
    for (int i = 0; i < 2; i++) kv_sweep(be[i]);
    return th_finish();
}
