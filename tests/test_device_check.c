/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_device_check.c - fa_exec.check = 1 on the device backends: broken varlen prefix sums in device memory
 * (not starting at 0, decreasing, a sequence longer than seqlen_q/k, past total_q/k) are refused with
 * FA_ERR_INVALID_ARGUMENT naming the array, forward and backward, with every output byte untouched; valid
 * ones give the same bits as check = 0; a stream being captured into a CUDA graph is refused. The same for a
 * decode call (fa_fwd_kvcache) on the CUDA backend: a negative or too long cache_seqlens, a block_table entry
 * past num_pages and two sequences appending to one page slot are refused by name, the outputs and the cache
 * untouched. exec.check other than 0 or 1 is refused on every backend (the only case that runs without a GPU).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef FA_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "flashattn.h"
#include "harness.h"

enum { B = 3, H = 2, D = 64, MAXLEN = 80, TOTAL = 200 };
#define N ((size_t)TOTAL * H * D)

static void exec_value_refused(void) {
    static float q[4 * 64], o[4 * 64];
    fa_params p;
    fa_params_init(&p, FA_F32, 1, 4, 4, 1, 1, 64);
    p.q = p.k = p.v = fa_tensor_contiguous(q, 4, 1, 64);
    p.o = fa_tensor_contiguous(o, 4, 1, 64);
    fa_exec e = { FA_BACKEND_CPU, FA_KERNEL_AUTO, -1, 0, NULL, NULL, 0, 2 };
    const fa_status st = fa_fwd(&p, &e);
    th_check(st == FA_ERR_INVALID_ARGUMENT && strstr(fa_last_error(), "exec.check"), "exec.check = 2 refused: %s",
             fa_last_error());
}

#ifdef FA_WITH_CUDA
static const int32_t good_cu[B + 1] = { 0, 50, 120, 200 };

typedef struct target {
    const char *name;
    fa_backend backend;
    fa_kernel kernel;
} target;

static void *in[4], *out[4]; /* q k v dout; o dq dk dv (bf16, TOTAL x H x D) */
static float *lse;
static int32_t *cu_q, *cu_k;
#define BYTES (3 * N * 2) /* dq, dk, dv; o and lse take less */
static unsigned char host_a[BYTES], host_b[BYTES];

static void fill(void *dst, uint64_t seed) {
    static uint16_t h[N];
    for (size_t i = 0; i < N; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        const float f = (float)((seed >> 40) * (1.0 / (1 << 24))) * 2.0f - 1.0f;
        uint32_t u;
        memcpy(&u, &f, 4);
        h[i] = (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    }
    cudaMemcpy(dst, h, sizeof h, cudaMemcpyHostToDevice);
}

static fa_params params(int backward) {
    fa_params p;
    fa_params_init(&p, FA_BF16, B, MAXLEN, MAXLEN, H, H, D);
    p.cu_seqlens_q = cu_q, p.cu_seqlens_k = cu_k;
    p.total_q = p.total_k = TOTAL;
    p.causal = 1;
    p.q = fa_tensor_contiguous(in[0], TOTAL, H, D);
    p.k = fa_tensor_contiguous(in[1], TOTAL, H, D);
    p.v = fa_tensor_contiguous(in[2], TOTAL, H, D);
    p.o = fa_tensor_contiguous(out[0], TOTAL, H, D);
    p.lse = lse;
    if (backward) {
        p.dout = fa_tensor_contiguous(in[3], TOTAL, H, D);
        p.dq = fa_tensor_contiguous(out[1], TOTAL, H, D);
        p.dk = fa_tensor_contiguous(out[2], TOTAL, H, D);
        p.dv = fa_tensor_contiguous(out[3], TOTAL, H, D);
        p.deterministic = 1;
    }
    return p;
}

/* The outputs of the forward (o, lse) or of the backward (dq, dk, dv) as bytes. */
static void outputs(int backward, unsigned char *buf) {
    memset(buf, 0, BYTES);
    if (!backward) {
        cudaMemcpy(buf, out[0], N * 2, cudaMemcpyDeviceToHost);
        cudaMemcpy(buf + N * 2, lse, TOTAL * H * 4, cudaMemcpyDeviceToHost);
    } else {
        for (int i = 1; i < 4; i++) cudaMemcpy(buf + (i - 1) * N * 2, out[i], N * 2, cudaMemcpyDeviceToHost);
    }
}

static void poison(int backward) {
    if (!backward) {
        cudaMemset(out[0], 0x5a, N * 2);
        cudaMemset(lse, 0x5a, TOTAL * H * 4);
    } else {
        for (int i = 1; i < 4; i++) cudaMemset(out[i], 0x5a, N * 2);
    }
}

static void bad_prefix_sums(const target *t, int backward) {
    static const struct {
        int k; /* 0: cu_seqlens_q, 1: cu_seqlens_k */
        int32_t cu[B + 1];
        const char *says;
    } cases[] = {
        { 0, { 1, 50, 120, 200 }, "cu_seqlens_q[0] (1) is not 0" },
        { 1, { 0, 60, 40, 200 }, "cu_seqlens_k decreases at index 2 (60 -> 40)" },
        { 0, { 0, 100, 120, 200 }, "cu_seqlens_q: sequence 0 has length 100 > the max length 80" },
        { 1, { 0, 50, 130, 210 }, "cu_seqlens_k[batch] (210) exceeds the total token count (200)" },
        { 0, { 0, 50, 120, 200 }, NULL }, /* valid: runs */
    };
    fa_exec e = { t->backend, t->kernel, -1, 0, NULL, NULL, 0, 1 };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        cudaMemcpy(cu_q, good_cu, sizeof good_cu, cudaMemcpyHostToDevice);
        cudaMemcpy(cu_k, good_cu, sizeof good_cu, cudaMemcpyHostToDevice);
        cudaMemcpy(cases[c].k ? cu_k : cu_q, cases[c].cu, sizeof good_cu, cudaMemcpyHostToDevice);
        fa_params p = params(backward);
        if (backward) { /* the backward's o and lse from a valid forward */
            fa_exec e0 = e;
            cudaMemcpy(cu_q, good_cu, sizeof good_cu, cudaMemcpyHostToDevice);
            cudaMemcpy(cu_k, good_cu, sizeof good_cu, cudaMemcpyHostToDevice);
            fa_fwd(&p, &e0);
            cudaMemcpy(cases[c].k ? cu_k : cu_q, cases[c].cu, sizeof good_cu, cudaMemcpyHostToDevice);
        }
        poison(backward);
        outputs(backward, host_a);
        const fa_status st = backward ? fa_bwd(&p, &e) : fa_fwd(&p, &e);
        cudaDeviceSynchronize();
        outputs(backward, host_b);
        const int untouched = !memcmp(host_a, host_b, sizeof host_a);
        if (cases[c].says)
            th_check(st == FA_ERR_INVALID_ARGUMENT && strstr(fa_last_error(), cases[c].says) && untouched,
                     "%s %s check = 1 refuses %s, nothing written (%s: %s)", t->name, backward ? "bwd" : "fwd",
                     cases[c].says, fa_status_name(st), fa_last_error());
        else
            th_check(st == FA_OK && !untouched, "%s %s check = 1 runs valid prefix sums (%s %s)", t->name,
                     backward ? "bwd" : "fwd", fa_status_name(st), fa_last_error());
    }

    /* check = 1 on valid prefix sums: the same bits as check = 0 */
    fa_params p = params(backward);
    fa_exec e0 = { t->backend, t->kernel, -1, 0, NULL, NULL, 0, 0 };
    fa_status st0 = backward ? fa_bwd(&p, &e0) : fa_fwd(&p, &e0);
    cudaDeviceSynchronize();
    outputs(backward, host_a);
    poison(backward);
    fa_status st1 = backward ? fa_bwd(&p, &e) : fa_fwd(&p, &e);
    cudaDeviceSynchronize();
    outputs(backward, host_b);
    th_check(st0 == FA_OK && st1 == FA_OK && !memcmp(host_a, host_b, sizeof host_a),
             "%s %s check = 1 and check = 0 agree bit for bit", t->name, backward ? "bwd" : "fwd");
}

/* check = 1 waits for its answer: refused on a stream being captured (and the capture is left intact). */
static void graph_capture(const target *t) {
    cudaStream_t s;
    if (cudaStreamCreate(&s) != cudaSuccess) {
        th_fail("%s cudaStreamCreate", t->name);
        return;
    }
    cudaMemcpy(cu_q, good_cu, sizeof good_cu, cudaMemcpyHostToDevice);
    cudaMemcpy(cu_k, good_cu, sizeof good_cu, cudaMemcpyHostToDevice);
    fa_params p = params(0);
    fa_exec e = { t->backend, t->kernel, -1, 0, s, NULL, 0, 1 };
    cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
    const fa_status st = fa_fwd(&p, &e);
    cudaGraph_t g = NULL;
    const cudaError_t end = cudaStreamEndCapture(s, &g);
    if (g) cudaGraphDestroy(g);
    cudaStreamDestroy(s);
    th_check(st == FA_ERR_INVALID_ARGUMENT && strstr(fa_last_error(), "exec.check") && end == cudaSuccess,
             "%s check = 1 refused under graph capture: %s", t->name, fa_last_error());
}

/* ---- decode: a paged cache of KV_PAGES pages of 16 rows, 4 pages per sequence, one new token each ---- */
enum { KV_PAGES = 12, KV_PAGE = 16, KV_MAXP = 4 };
#define KV_CACHE_N ((size_t)KV_PAGES * KV_PAGE * H * D)
static void *kv_q, *kv_o, *kv_k, *kv_v, *kv_kc, *kv_vc;
static int32_t *kv_lens, *kv_table;
static const int32_t good_lens[B] = { 10, 30, 0 };
static const int32_t good_table[B * KV_MAXP] = { 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11 };
static unsigned char kv_host_a[(B * H * D + 2 * KV_CACHE_N) * 2], kv_host_b[sizeof kv_host_a];

static void kv_state(unsigned char *buf) {
    cudaMemcpy(buf, kv_o, (size_t)B * H * D * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(buf + (size_t)B * H * D * 2, kv_kc, KV_CACHE_N * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(buf + (size_t)B * H * D * 2 + KV_CACHE_N * 2, kv_vc, KV_CACHE_N * 2, cudaMemcpyDeviceToHost);
}

static void kv_reset(const int32_t *lens, const int32_t *table) {
    cudaMemset(kv_o, 0xff, (size_t)B * H * D * 2);
    cudaMemcpy(kv_kc, in[0], KV_CACHE_N * 2, cudaMemcpyDeviceToDevice);
    cudaMemcpy(kv_vc, in[1], KV_CACHE_N * 2, cudaMemcpyDeviceToDevice);
    cudaMemcpy(kv_lens, lens, sizeof good_lens, cudaMemcpyHostToDevice);
    cudaMemcpy(kv_table, table, sizeof good_table, cudaMemcpyHostToDevice);
}

static fa_status kv_call(int check, cudaStream_t stream) {
    fa_params p;
    fa_params_init(&p, FA_BF16, B, 1, 1, H, H, D);
    p.q = fa_tensor_contiguous(kv_q, 1, H, D);
    p.o = fa_tensor_contiguous(kv_o, 1, H, D);
    p.k = fa_tensor_contiguous(kv_k, 1, H, D);
    p.v = fa_tensor_contiguous(kv_v, 1, H, D);
    fa_kvcache kv;
    fa_kvcache_init(&kv, 0, 0);
    kv.k_cache = fa_tensor_contiguous(kv_kc, KV_PAGE, H, D);
    kv.v_cache = fa_tensor_contiguous(kv_vc, KV_PAGE, H, D);
    kv.block_table = kv_table;
    kv.max_pages = KV_MAXP;
    kv.num_pages = KV_PAGES;
    kv.page_size = KV_PAGE;
    kv.cache_seqlens = kv_lens;
    fa_exec e = { FA_BACKEND_CUDA, FA_KERNEL_AUTO, -1, 0, stream, NULL, 0, check };
    const fa_status st = fa_fwd_kvcache(&p, &kv, &e);
    if (!stream) cudaDeviceSynchronize(); /* a stream being captured is not waited on: that ends its capture */
    return st;
}

static void decode_arrays(void) {
    if (cudaMalloc(&kv_q, (size_t)B * H * D * 2) || cudaMalloc(&kv_o, (size_t)B * H * D * 2) ||
        cudaMalloc(&kv_k, (size_t)B * H * D * 2) || cudaMalloc(&kv_v, (size_t)B * H * D * 2) ||
        cudaMalloc(&kv_kc, KV_CACHE_N * 2) || cudaMalloc(&kv_vc, KV_CACHE_N * 2) ||
        cudaMalloc((void **)&kv_lens, sizeof good_lens) || cudaMalloc((void **)&kv_table, sizeof good_table)) {
        th_fail("cudaMalloc (decode)");
        return;
    }
    cudaMemcpy(kv_q, in[2], (size_t)B * H * D * 2, cudaMemcpyDeviceToDevice);
    cudaMemcpy(kv_k, in[3], (size_t)B * H * D * 2, cudaMemcpyDeviceToDevice);
    cudaMemcpy(kv_v, (char *)in[3] + (size_t)B * H * D * 2, (size_t)B * H * D * 2, cudaMemcpyDeviceToDevice);
    /* valid arrays: check = 1 and check = 0 write the same bits (outputs and the appended cache rows) */
    kv_reset(good_lens, good_table);
    const fa_status st0 = kv_call(0, NULL);
    kv_state(kv_host_a);
    kv_reset(good_lens, good_table);
    const fa_status st1 = kv_call(1, NULL);
    kv_state(kv_host_b);
    th_check(st0 == FA_OK && st1 == FA_OK && !memcmp(kv_host_a, kv_host_b, sizeof kv_host_a),
             "decode check = 1 and check = 0 agree bit for bit (%s)", fa_last_error());
    /* broken ones: refused by name, nothing written */
    static const struct {
        const char *what, *expect;
        int32_t lens[B], table_at, table_value;
    } cases[] = {
        { "a negative length", "cache_seqlens[1] (-1)", { 10, -1, 0 }, -1, 0 },
        { "a length that leaves no room for the new token", "cache_seqlens[2] (64)", { 10, 30, 64 }, -1, 0 },
        { "a page past num_pages", "block_table[1][1] (99)", { 10, 30, 0 }, 1 * KV_MAXP + 1, 99 },
        { "two sequences appending to one page row", "both append to page 0, row 10", { 10, 30, 10 }, 2 * KV_MAXP, 0 },
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        int32_t table[B * KV_MAXP];
        memcpy(table, good_table, sizeof table);
        if (cases[i].table_at >= 0) table[cases[i].table_at] = cases[i].table_value;
        kv_reset(cases[i].lens, table);
        kv_state(kv_host_a);
        const fa_status st = kv_call(1, NULL);
        kv_state(kv_host_b);
        th_check(st == FA_ERR_INVALID_ARGUMENT && strstr(fa_last_error(), cases[i].expect) &&
                     !memcmp(kv_host_a, kv_host_b, sizeof kv_host_a),
                 "decode check = 1 refuses %s, nothing written: %s", cases[i].what, fa_last_error());
    }
    /* refused on a stream being captured */
    cudaStream_t s;
    if (cudaStreamCreate(&s) != cudaSuccess) {
        th_fail("cudaStreamCreate (decode)");
        return;
    }
    kv_reset(good_lens, good_table);
    cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed);
    const fa_status st = kv_call(1, s);
    cudaGraph_t g = NULL;
    const cudaError_t end = cudaStreamEndCapture(s, &g);
    if (g) cudaGraphDestroy(g);
    cudaStreamDestroy(s);
    th_check(st == FA_ERR_INVALID_ARGUMENT && strstr(fa_last_error(), "exec.check") && end == cudaSuccess,
             "decode check = 1 refused under graph capture: %s", fa_last_error());
}

static void device_cases(void) {
    for (int i = 0; i < 4; i++) {
        if (cudaMalloc(&in[i], N * 2) != cudaSuccess || cudaMalloc(&out[i], N * 2) != cudaSuccess) {
            th_fail("cudaMalloc");
            return;
        }
        fill(in[i], 17 + i);
    }
    if (cudaMalloc((void **)&lse, TOTAL * H * 4) != cudaSuccess || cudaMalloc((void **)&cu_q, sizeof good_cu) ||
        cudaMalloc((void **)&cu_k, sizeof good_cu)) {
        th_fail("cudaMalloc");
        return;
    }
    fa_device_info info;
    const int hopper = fa_device_get_info(0, &info) == FA_OK && info.cc_major == 9 && info.cc_minor == 0;
    const target targets[3] = { { "cuda fa2", FA_BACKEND_CUDA, FA_KERNEL_FA2 },
                                { "cuda fa3", FA_BACKEND_CUDA, FA_KERNEL_FA3 },
                                { "naive", FA_BACKEND_NAIVE, FA_KERNEL_AUTO } };
    for (int i = 0; i < 3; i++) {
        const target *t = &targets[i];
        if (!fa_backend_built(t->backend)) {
            th_skip("%s: not built into this library", t->name);
            continue;
        }
        if (t->kernel == FA_KERNEL_FA3 && !hopper) {
            th_skip("%s: the FA3 kernel needs compute capability 9.0", t->name);
            continue;
        }
        if (th_selected("forward")) bad_prefix_sums(t, 0);
        if (th_selected("backward") && t->kernel != FA_KERNEL_FA3) bad_prefix_sums(t, 1);
        if (th_selected("graph")) graph_capture(t);
    }
    if (th_selected("decode")) decode_arrays();
}
#endif

int main(int argc, char **argv) {
    th_init(argc, argv, NULL);
    exec_value_refused();
#ifdef FA_WITH_CUDA
    if (fa_device_count() > 0)
        device_cases();
    else
        th_skip("device checks: skipped (no GPU)");
#else
    th_skip("device checks: skipped (built without CUDA)");
#endif
    return th_finish();
}
