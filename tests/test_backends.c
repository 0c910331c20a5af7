/* SPDX-License-Identifier: Apache-2.0 */
/*
 * test_backends.c - every backend against the fp64 reference over a sweep of shapes and options.
 *
 * Suites: "cpu" (the CPU backend, and the reference backend itself on the small cases), and "gpu" (the CUDA
 * and naive backends, f16/bf16) when a GPU is present. Every case poisons the outputs before each run and
 * checks that every output element was written and nothing outside the tensors was; compares O and LSE (and
 * dQ, dK, dV for the backward) under the tolerance rule of check/verify.c; some cases also run the backward
 * twice in deterministic mode and compare the bits, or fill the padding with NaN and check that no output
 * changes. A case a backend reports as unsupported prints "UNSUP" unless the backend must support it: the
 * CPU backend must support everything, the CUDA backend everything of f16/bf16 with head dims
 * 32/64/96/128/192/256 and 16-byte aligned rows.
 *
 * One line per (case, backend): status, backend, passes, shape and options, error/tolerance per output; then
 * a summary per backend and the final "N passed, M failed".
 *
 * Options: -b cpu,reference,cuda,naive (the backends to run), -k SUBSTRING[,...] (matched against
 * "suite backend tag shape", e.g. -k "gpu cuda varlen"), --quick (skip the large cases, e.g. under
 * compute-sanitizer), --seed S (other random inputs), -v (every output's numbers on a failure).
 */
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "../check/verify.h"
#include "harness.h"

#ifdef FA_WITH_CUDA
#include <cuda_runtime.h>
#endif

/* snprintf that may truncate (names and messages only) */
static void format(char *buf, size_t size, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void format(char *buf, size_t size, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, size, fmt, ap);
    va_end(ap);
}

enum {
    MUST = 1,   /* the suite's main backend must support it */
    BWD = 2,    /* also the backward */
    DET = 4,    /* backward repeated in deterministic mode (20 runs on a GPU, 2 on the host): bit-identical */
    NANPAD = 8, /* padding 0 vs NaN: bit-identical outputs (deterministic mode) */
    BIG = 16,   /* skipped with --quick */
    SM90 = 32   /* MUST only where device 0 has compute capability 9.0 (the FA3 kernels' cases) */
};

/* Whether device 0 has compute capability 9.0. */
static int device_is_sm90(void) {
#ifdef FA_WITH_CUDA
    int major = 0, minor = 0;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return major == 9 && minor == 0;
#else
    return 0;
#endif
}

typedef struct test_case {
    char tag[48];
    vf_config cfg;
    int flags;
} test_case;

#define MAX_CASES 512
static test_case cases[MAX_CASES];
static int ncases;

static vf_config shape(fa_dtype dt, int b, int hq, int hkv, int sq, int sk, int d) {
    vf_config c;
    vf_config_init(&c);
    c.dtype = dt;
    c.batch = b;
    c.heads_q = hq;
    c.heads_kv = hkv;
    c.seqlen_q = sq;
    c.seqlen_k = sk;
    c.head_dim = d;
    return c;
}

static void add(const char *tag, vf_config c, int flags) {
    if (ncases >= MAX_CASES) {
        fprintf(stderr, "too many cases\n");
        exit(2);
    }
    test_case *t = &cases[ncases++];
    format(t->tag, sizeof t->tag, "%s", tag);
    c.seed = th_opt.seed * 1000003u + (uint64_t)ncases;
    t->cfg = c;
    t->flags = flags;
}

static vf_config with_causal(vf_config c) {
    c.causal = 1;
    return c;
}

/* 1: an explicit workspace; 2: one that starts 4 bytes past an aligned address */
static vf_config with_workspace(vf_config c, int how) {
    c.workspace = how;
    return c;
}

static vf_config with_window(vf_config c, int left, int right) {
    c.window_left = left;
    c.window_right = right;
    return c;
}

static vf_config with_layout(vf_config c, vf_layout l) {
    c.layout = l;
    return c;
}

static vf_config with_varlen(vf_config c, int extra) {
    c.varlen = 1;
    c.edge_lengths = 1;
    c.extra_tokens = extra;
    return c;
}

/* ---- the CPU suite: f32 mostly, every head dim that is a multiple of 8 ---- */

static void cpu_cases(void) {
    const int F = MUST | BWD;
    ncases = 0;
    add("basic", shape(FA_F32, 2, 4, 4, 128, 128, 64), F);
    add("basic", with_causal(shape(FA_F32, 2, 4, 4, 128, 128, 64)), F);
    /* odd sequence lengths, square */
    int odd[3] = { 1, 17, 127 };
    for (int i = 0; i < 3; i++) {
        add("odd", shape(FA_F32, 2, 2, 1, odd[i], odd[i], 64), F);
        add("odd", with_causal(shape(FA_F32, 2, 2, 1, odd[i], odd[i], 64)), F);
    }
    add("odd", shape(FA_F32, 1, 2, 2, 1000, 1000, 32), F | BIG);
    add("odd", with_causal(shape(FA_F32, 1, 2, 1, 1000, 1000, 32)), F | BIG);
    /* seqlen_q != seqlen_k both ways, causal rows that see no key when q > k */
    int qk[6][2] = { { 17, 127 }, { 127, 17 }, { 1, 239 }, { 239, 1 }, { 113, 203 }, { 203, 113 } };
    for (int i = 0; i < 6; i++) {
        add("q!=k", shape(FA_F32, 2, 2, 2, qk[i][0], qk[i][1], 32), F);
        add("q!=k", with_causal(shape(FA_F32, 2, 2, 2, qk[i][0], qk[i][1], 32)), F);
    }
    /* GQA ratios 1, 2, 8 */
    int hkv[3] = { 8, 4, 1 };
    for (int i = 0; i < 3; i++) {
        add("gqa", shape(FA_F32, 2, 8, hkv[i], 65, 97, 32), F);
        add("gqa", with_causal(shape(FA_F32, 1, 8, hkv[i], 97, 65, 32)), F);
    }
    /* sliding windows */
    int win[5][2] = { { 16, 0 }, { 8, 8 }, { -1, 4 }, { 32, -1 }, { 0, 0 } };
    for (int i = 0; i < 5; i++)
        add("window", with_window(shape(FA_F32, 2, 2, 1, 100, 100, 32), win[i][0], win[i][1]), F);
    add("window", with_window(shape(FA_F32, 2, 2, 2, 60, 90, 32), 5, 3), F);
    add("window", with_window(shape(FA_F32, 2, 2, 2, 90, 60, 32), 5, 3), F);
    add("window", with_window(with_causal(shape(FA_F32, 2, 4, 2, 77, 77, 64)), 10, -1), F);
    add("window", with_window(with_causal(shape(FA_F32, 1, 2, 1, 40, 70, 32)), 3, 7), F); /* causal overrides 7 */
    /* softcap */
    vf_config c = shape(FA_F32, 2, 4, 2, 70, 70, 64);
    c.softcap = 2.0f;
    c.scale = 0.5f;
    add("softcap", c, F);
    add("softcap", with_causal(c), F);
    /* ALiBi, slopes per head and per (batch, head) */
    c = shape(FA_F32, 2, 4, 2, 50, 80, 32);
    c.alibi = VF_ALIBI_HEADS;
    add("alibi", c, F);
    add("alibi", with_causal(c), F);
    c.alibi = VF_ALIBI_BATCH_HEADS;
    add("alibi", c, F);
    add("alibi", with_window(with_causal(c), 20, 0), F);
    /* varlen with empty and length-1 sequences, rows past the last sequence */
    add("varlen", with_varlen(shape(FA_F32, 7, 4, 2, 40, 60, 32), 3), F);
    add("varlen", with_varlen(with_causal(shape(FA_F32, 7, 4, 2, 60, 40, 32)), 0), F);
    add("varlen", with_varlen(with_window(shape(FA_F32, 6, 2, 1, 50, 50, 64), 7, 2), 2), F);
    c = with_varlen(shape(FA_F32, 6, 4, 4, 30, 30, 32), 1);
    c.alibi = VF_ALIBI_BATCH_HEADS;
    c.softcap = 3.0f;
    add("varlen", c, F);
    add("varlen", with_varlen(with_causal(shape(FA_BF16, 7, 4, 1, 33, 65, 64)), 4), F);
    add("varlen", with_layout(with_varlen(shape(FA_F16, 5, 2, 2, 40, 40, 32), 2), VF_LAYOUT_MIXED), F);
    /* every head dim the CPU supports */
    for (int d = 8; d <= 256; d += 8) {
        vf_config h = shape(FA_F32, 1, 2, 1, 33, 47, d);
        add("hdim", d % 16 ? with_causal(h) : h, F);
    }
    /* 16-bit dtypes */
    add("dtype", shape(FA_F16, 2, 4, 2, 77, 77, 64), F);
    add("dtype", with_causal(shape(FA_BF16, 2, 4, 2, 77, 77, 64)), F);
    add("dtype", with_causal(shape(FA_F16, 1, 2, 2, 100, 150, 128)), F);
    add("dtype", shape(FA_BF16, 1, 2, 1, 150, 100, 256), F);
    /* e4m3 inputs (forward only): descales per (batch, head) and per block of rows, none, f16 output, varlen */
    add("e4m3", shape(FA_E4M3, 2, 4, 2, 77, 77, 64), MUST);
    c = with_causal(shape(FA_E4M3, 2, 4, 1, 100, 130, 128));
    c.descale_block = 16;
    add("e4m3", c, MUST);
    c.out_dtype = FA_F16;
    c.descale_block = 0;
    c.no_descale = 1;
    add("e4m3", c, MUST);
    c = with_varlen(shape(FA_E4M3, 6, 4, 2, 50, 70, 32), 3);
    c.descale_block = 7;
    c.softcap = 3.0f;
    c.alibi = VF_ALIBI_HEADS;
    add("e4m3", with_layout(c, VF_LAYOUT_PADDED), MUST);
    c = with_window(shape(FA_E4M3, 1, 2, 2, 200, 200, 256), 20, 5);
    c.q_amplitude = 8.0;
    c.descale_block = 64;
    add("e4m3", c, MUST);
    /* strides */
    add("layout", with_layout(shape(FA_F32, 2, 4, 2, 37, 53, 64), VF_LAYOUT_BHSD), F);
    add("layout", with_layout(with_causal(shape(FA_F32, 2, 4, 2, 37, 53, 64)), VF_LAYOUT_PADDED), F);
    add("layout", with_layout(shape(FA_BF16, 2, 4, 4, 53, 37, 32), VF_LAYOUT_MIXED), F);
    add("layout", with_layout(shape(FA_F32, 2, 2, 1, 29, 31, 40), VF_LAYOUT_UNALIGNED), F);
    /* numerical stress: logits near +-1e4, tiny and huge scale */
    c = shape(FA_F32, 1, 2, 2, 64, 64, 64);
    c.q_amplitude = 1e4;
    add("stress", c, F);
    add("stress", with_causal(c), F);
    c.dtype = FA_BF16;
    add("stress", c, F);
    c = shape(FA_F32, 1, 2, 2, 64, 64, 64);
    c.scale = 1e-4f;
    add("stress", c, F);
    c.scale = 1e3f;
    add("stress", c, F);
    c.dtype = FA_F16;
    add("stress", with_causal(c), F);
    /* determinism, NaN in padding, explicit workspace */
    add("determinism", with_causal(shape(FA_F32, 2, 4, 2, 200, 200, 64)), F | DET);
    c = with_layout(with_varlen(shape(FA_F32, 5, 4, 2, 50, 70, 32), 5), VF_LAYOUT_PADDED);
    add("nan-padding", c, F | NANPAD);
    add("nan-padding", with_causal(with_layout(shape(FA_BF16, 2, 2, 2, 40, 40, 64), VF_LAYOUT_PADDED)), F | NANPAD);
    c = with_workspace(shape(FA_F32, 2, 4, 2, 64, 96, 64), 1);
    add("workspace", c, F);
    add("workspace", with_causal(c), F);
    add("workspace", with_workspace(with_causal(c), 2), F); /* a caller's workspace need not be aligned */
}

/* ---- the GPU suite: f16/bf16 over the CUDA head dims ---- */

static void gpu_cases(void) {
    const int F = MUST | BWD;
    ncases = 0;
    const int dims[6] = { 32, 64, 96, 128, 192, 256 };
    fa_dtype dtypes[2] = { FA_F16, FA_BF16 };
    for (int t = 0; t < 2; t++)
        for (int i = 0; i < 6; i++) {
            add("hdim", shape(dtypes[t], 2, 4, 2, 113, 203, dims[i]), F);
            add("hdim", with_causal(shape(dtypes[t], 2, 4, 2, 203, 203, dims[i])), F);
        }
    int odd[4] = { 1, 17, 127, 1000 };
    for (int i = 0; i < 4; i++) {
        add("odd", shape(FA_BF16, 2, 4, 4, odd[i], odd[i], 128), F | (odd[i] == 1000 ? BIG : 0));
        add("odd", with_causal(shape(FA_BF16, 2, 4, 4, odd[i], odd[i], 64)), F | (odd[i] == 1000 ? BIG : 0));
    }
    int qk[6][2] = { { 17, 127 }, { 127, 17 }, { 1, 239 }, { 239, 1 }, { 113, 203 }, { 203, 113 } };
    for (int i = 0; i < 6; i++) {
        add("q!=k", shape(FA_F16, 2, 4, 2, qk[i][0], qk[i][1], 64), F);
        add("q!=k", with_causal(shape(FA_BF16, 2, 4, 2, qk[i][0], qk[i][1], 128)), F);
    }
    int hkv[3] = { 8, 4, 1 };
    for (int i = 0; i < 3; i++) {
        add("gqa", shape(FA_BF16, 2, 8, hkv[i], 130, 257, 128), F);
        add("gqa", with_causal(shape(FA_F16, 2, 8, hkv[i], 257, 257, 64)), F);
    }
    /* causal backward grids of several key blocks over 35 (kv head, batch) pairs: on a 132-SM Hopper GPU the
     * FA3 backward launches them in chunks of 12, 12 and 11 pairs (d64, d128) or 7 (d256) */
    add("order", with_causal(shape(FA_BF16, 5, 7, 7, 1000, 1000, 128)), F | BIG);
    add("order", with_causal(shape(FA_F16, 5, 14, 7, 777, 1000, 64)), F | BIG);
    add("order", with_causal(shape(FA_BF16, 5, 7, 7, 1000, 1000, 256)), F | BIG);
    int win[4][2] = { { 64, 0 }, { 32, 32 }, { -1, 16 }, { 100, -1 } };
    for (int i = 0; i < 4; i++)
        add("window", with_window(shape(FA_BF16, 2, 4, 2, 300, 300, 128), win[i][0], win[i][1]), F);
    add("window", with_window(shape(FA_F16, 2, 4, 2, 200, 333, 64), 17, 5), F);
    add("window", with_window(with_causal(shape(FA_BF16, 2, 4, 2, 333, 200, 64)), 40, -1), F);
    vf_config c = shape(FA_BF16, 2, 4, 2, 150, 150, 128);
    c.softcap = 2.0f;
    c.scale = 0.5f;
    add("softcap", c, F);
    add("softcap", with_causal(c), F);
    c.dtype = FA_F16;
    add("softcap", c, F);
    c.head_dim = 256; /* which head dim 256 runs in a kernel of its own */
    add("softcap", with_causal(c), F);
    c.dtype = FA_BF16; /* (head dim 256's backward kernel: a window, a varlen batch, seqlen_q != seqlen_k) */
    add("softcap", with_window(c, 50, 20), F);
    c = with_varlen(shape(FA_BF16, 5, 4, 1, 130, 210, 256), 2);
    c.softcap = 5.0f;
    add("softcap", c, F | DET);
    c = shape(FA_BF16, 2, 4, 2, 150, 220, 64);
    c.alibi = VF_ALIBI_HEADS;
    add("alibi", c, F);
    add("alibi", with_causal(c), F);
    c.alibi = VF_ALIBI_BATCH_HEADS;
    add("alibi", with_causal(c), F);
    c.dtype = FA_F16;
    add("alibi", with_window(c, 30, 30), F);
    c = shape(FA_BF16, 2, 4, 2, 200, 333, 128); /* (the FA3 backward's head dims 128 and 256 too) */
    c.alibi = VF_ALIBI_BATCH_HEADS;
    add("alibi", with_causal(c), F);
    c = with_varlen(shape(FA_F16, 5, 8, 2, 150, 150, 128), 3);
    c.alibi = VF_ALIBI_HEADS;
    add("alibi", c, F | DET);
    c = shape(FA_BF16, 2, 4, 1, 180, 130, 256);
    c.alibi = VF_ALIBI_HEADS;
    add("alibi", with_window(c, 40, 10), F);
    add("varlen", with_varlen(shape(FA_BF16, 9, 4, 2, 200, 300, 128), 7), F);
    add("varlen", with_varlen(with_causal(shape(FA_BF16, 9, 4, 2, 300, 200, 64)), 0), F);
    add("varlen", with_varlen(with_causal(shape(FA_F16, 9, 8, 1, 150, 150, 96)), 3), F);
    add("varlen", with_varlen(with_window(shape(FA_BF16, 7, 4, 4, 180, 180, 256), 33, 9), 1), F);
    add("varlen", with_varlen(with_causal(shape(FA_F16, 5, 4, 2, 200, 200, 256)), 4), F);
    c = with_varlen(shape(FA_F16, 7, 4, 2, 120, 160, 192), 2);
    c.alibi = VF_ALIBI_BATCH_HEADS;
    c.softcap = 3.0f;
    add("varlen", c, F);
    /* several key and query blocks of the FA3 backward's tiles, GQA 8:1 with fewer queries than keys, and a
     * window on both sides with more queries than keys */
    add("blocks", with_causal(shape(FA_BF16, 1, 8, 1, 640, 1100, 64)), F);
    add("blocks", with_window(shape(FA_F16, 2, 4, 2, 1100, 640, 128), 100, 37), F);
    /* head dim 256 (64 x 64 steps, the keys split between the warpgroups for S, the head dim for dK, dV, dQ) */
    add("blocks", with_causal(shape(FA_BF16, 1, 8, 1, 300, 700, 256)), F);
    add("blocks", with_window(shape(FA_F16, 2, 4, 2, 700, 300, 256), 100, 37), F);
    add("determinism", with_causal(shape(FA_BF16, 3, 4, 2, 300, 300, 256)), F | DET);
    add("nan-padding", with_layout(with_varlen(shape(FA_BF16, 5, 4, 2, 150, 170, 256), 9), VF_LAYOUT_PADDED),
        F | NANPAD);
    add("layout", with_layout(shape(FA_BF16, 2, 4, 2, 137, 153, 128), VF_LAYOUT_BHSD), F);
    add("layout", with_layout(with_causal(shape(FA_F16, 2, 4, 2, 137, 153, 64)), VF_LAYOUT_PADDED), F);
    add("layout", with_layout(with_varlen(shape(FA_BF16, 5, 4, 2, 100, 100, 128), 3), VF_LAYOUT_MIXED), F);
    add("layout", with_layout(shape(FA_BF16, 2, 2, 1, 64, 64, 64), VF_LAYOUT_UNALIGNED), BWD); /* may be refused */
    c = shape(FA_BF16, 1, 4, 4, 256, 256, 128);
    c.q_amplitude = 1e4;
    add("stress", c, F);
    add("stress", with_causal(c), F);
    c.dtype = FA_F16;
    c.q_amplitude = 3e3;
    add("stress", c, F);
    c = shape(FA_BF16, 1, 4, 4, 256, 256, 64);
    c.scale = 1e-4f;
    add("stress", c, F);
    c.scale = 1e3f;
    add("stress", with_causal(c), F);
    /* a negative softmax scale over partial blocks, and one near 0 */
    c = with_causal(shape(FA_BF16, 2, 4, 2, 200, 333, 128));
    c.scale = -0.3f;
    add("stress", c, F);
    c = shape(FA_F16, 1, 4, 4, 130, 128, 64);
    c.scale = 1e-35f;
    add("stress", c, F);
    /* key blocks that see no query (their dK, dV zero), an odd count of key blocks under a causal mask */
    add("blocks", with_window(shape(FA_BF16, 2, 4, 2, 100, 900, 128), 50, 0), F);
    add("blocks", with_causal(shape(FA_F16, 1, 8, 2, 1000, 1000, 64)), F);
    add("determinism", with_causal(shape(FA_BF16, 4, 8, 2, 512, 512, 128)), F | DET | BIG);
    add("determinism", with_varlen(shape(FA_F16, 9, 8, 8, 300, 300, 64), 0), F | DET);
    add("nan-padding", with_layout(with_varlen(shape(FA_BF16, 5, 4, 2, 150, 170, 128), 9), VF_LAYOUT_PADDED),
        F | NANPAD);
    add("nan-padding", with_causal(with_layout(shape(FA_F16, 2, 4, 4, 100, 100, 64), VF_LAYOUT_PADDED)), F | NANPAD);
    c = with_causal(shape(FA_BF16, 2, 8, 8, 1024, 1024, 128));
    add("large", c, F | BIG);
    /* e4m3 inputs on the FA3 e4m3 kernel (compute capability 9.0: SM90 cases), head dims 64, 128 and 256 with
     * descales per (batch entry, head): GQA, several key blocks, causal with more keys than queries, f16 O
     * without descales, windows on both sides with a large q, softcap and varlen, MQA; poisoned outputs as
     * everywhere. Blocks of descales other than multiples of 64 (q) and 128 (k, v), head dims other than 64, 128
     * and 256, and rows that are not 16-byte multiples are refused (UNSUP). Head dim 64's rows are half of the
     * tiles' 128-byte rows (TMA fills the rest): its cases cover partial tiles at both ends, varlen, a window. */
    add("e4m3", shape(FA_E4M3, 2, 4, 2, 77, 77, 128), MUST | SM90);
    add("e4m3", shape(FA_E4M3, 1, 4, 4, 700, 900, 256), MUST | SM90);
    c = with_causal(shape(FA_E4M3, 2, 4, 1, 300, 530, 128));
    add("e4m3", c, MUST | SM90);
    c.out_dtype = FA_F16;
    c.no_descale = 1;
    add("e4m3", c, MUST | SM90);
    c = with_window(shape(FA_E4M3, 2, 2, 2, 400, 400, 256), 60, 5);
    c.q_amplitude = 8.0;
    add("e4m3", c, MUST | SM90);
    c = with_varlen(shape(FA_E4M3, 6, 4, 2, 250, 270, 128), 3);
    c.softcap = 3.0f;
    add("e4m3", c, MUST | SM90);
    add("e4m3", with_varlen(with_causal(shape(FA_E4M3, 5, 4, 1, 200, 300, 256)), 2), MUST | SM90);
    add("e4m3", with_causal(shape(FA_E4M3, 2, 8, 2, 1024, 1024, 128)), MUST | SM90 | BIG);
    /* per-block descales (q in multiples of 64 rows, k and v of 128): GQA causal, varlen d256, softcap + window */
    c = with_causal(shape(FA_E4M3, 2, 4, 1, 300, 530, 128));
    c.descale_block = 128;
    add("e4m3", c, MUST | SM90);
    c = with_varlen(shape(FA_E4M3, 4, 4, 2, 300, 400, 256), 2);
    c.descale_block = 256;
    add("e4m3", c, MUST | SM90);
    c = with_window(shape(FA_E4M3, 2, 2, 2, 600, 700, 128), 200, 30);
    c.softcap = 5.0f;
    c.descale_block = 384;
    add("e4m3", c, MUST | SM90);
    c = shape(FA_E4M3, 1, 2, 2, 64, 64, 128);
    c.descale_block = 16;
    add("e4m3", c, 0);
    add("e4m3", shape(FA_E4M3, 1, 2, 2, 64, 64, 96), 0);
    add("e4m3", with_layout(shape(FA_E4M3, 1, 2, 2, 64, 64, 128), VF_LAYOUT_PADDED), 0);
    add("e4m3", shape(FA_E4M3, 2, 4, 2, 77, 77, 64), MUST | SM90);
    add("e4m3", with_causal(shape(FA_E4M3, 2, 4, 1, 300, 530, 64)), MUST | SM90);
    c = with_varlen(shape(FA_E4M3, 6, 4, 2, 250, 270, 64), 3);
    c.softcap = 3.0f;
    add("e4m3", c, MUST | SM90);
    c = with_window(shape(FA_E4M3, 2, 2, 2, 400, 400, 64), 60, 5);
    c.descale_block = 128;
    add("e4m3", c, MUST | SM90);
    /* Head dim 64 above 256 queries under a causal mask: 192-row tiles aligned to the last 64-row group, so the
     * first tile starts before row 0 (its first warpgroups have no rows) and, where the length is not a multiple
     * of 64, the last warpgroup reaches past the end; varlen gives every sequence its own alignment. Without a
     * mask above 128 queries: 192-row tiles whose last one has a single warpgroup with rows. A warpgroup whose
     * keys end in the first half of its last 128-key block (every other one under a causal mask; 300 keys
     * without one) takes that block's P V over the first half only. */
    add("tiles", with_causal(shape(FA_BF16, 3, 4, 2, 1300, 1300, 64)), MUST | BIG);
    add("tiles", with_causal(shape(FA_F16, 2, 4, 1, 1500, 1100, 64)), MUST | BIG);
    add("tiles", with_varlen(with_causal(shape(FA_BF16, 9, 4, 2, 1400, 1400, 64)), 5), MUST | BIG);
    add("tiles", with_causal(shape(FA_BF16, 2, 4, 2, 300, 300, 64)), MUST);
    /* 3k + 1 groups of 64 rows (448, 1k): the first tile has one warpgroup with rows (the top 64, over key block
     * 0) beside two idle ones; also with large scores and with a key ramp, where that warpgroup's estimated max
     * misses and S is computed again. */
    add("tiles", with_causal(shape(FA_BF16, 2, 4, 2, 1024, 1024, 64)), MUST | BIG);
    add("tiles", with_causal(shape(FA_F16, 3, 4, 1, 448, 448, 64)), MUST | DET);
    c = with_causal(shape(FA_BF16, 2, 4, 2, 448, 448, 64));
    c.q_amplitude = 30.0;
    add("tiles", c, MUST);
    c.dtype = FA_F16;
    c.q_amplitude = 1.0;
    c.k_ramp = 40.0;
    add("tiles", c, MUST);
    add("tiles", shape(FA_F16, 2, 4, 4, 200, 200, 64), MUST);
    add("tiles", shape(FA_BF16, 2, 4, 2, 300, 300, 64), MUST);
    /* Those first tiles are claimed after all the others (3k + 1 groups, up to 1k queries): one head per batch,
     * more keys than queries (the first rows see 96 keys, one block, or 216, two), a right window edge without a
     * mask, softcap (the general kernel). */
    add("tiles", with_causal(shape(FA_BF16, 5, 1, 1, 448, 448, 64)), MUST);
    add("tiles", with_causal(shape(FA_F16, 3, 2, 1, 448, 480, 64)), MUST);
    add("tiles", with_causal(shape(FA_BF16, 2, 4, 2, 448, 600, 64)), MUST);
    add("tiles", with_window(shape(FA_F16, 2, 3, 3, 448, 448, 64), -1, 20), MUST);
    c = with_causal(shape(FA_BF16, 2, 4, 4, 448, 448, 64));
    c.softcap = 30.0f;
    add("tiles", c, MUST);
    /* Row maxima that grow block after block (keys scaled up along the sequence): the 192-row tiles' softmax
     * against the stale max fails there, and those blocks take the full softmax on S computed again; at 1000
     * some exponentials against the stale max overflow to inf. */
    c = shape(FA_BF16, 1, 4, 2, 700, 700, 64);
    c.k_ramp = 40.0;
    add("stale", c, MUST);
    add("stale", with_varlen(with_causal(c), 3), MUST);
    c.dtype = FA_F16;
    add("stale", with_causal(c), MUST);
    c.seqlen_q = 500;
    c.seqlen_k = 900;
    add("stale", with_window(c, 150, 20), MUST);
    c = shape(FA_BF16, 1, 4, 2, 700, 700, 64);
    c.k_ramp = 1000.0;
    add("stale", with_causal(c), MUST);
    /* with softcap a wide one (200), so that the capped scores still grow from block to block */
    c.k_ramp = 40.0;
    c.softcap = 200.0f;
    add("stale", c, MUST);
    /* Large scores (Q x 30): a tile's first block misses its row max among the columns it estimates the max
     * from, and its check fails too. */
    c = shape(FA_BF16, 1, 4, 2, 700, 700, 64);
    c.q_amplitude = 30.0;
    add("stale", c, MUST);
    c.dtype = FA_F16;
    add("stale", with_causal(c), MUST);
    /* A left window: rows whose first block shows them none of the columns the max is estimated from take the
     * full softmax on the S they have (softcap already applied: not twice). */
    c = with_window(shape(FA_F16, 2, 4, 4, 300, 300, 64), 40, -1);
    c.softcap = 20.0f;
    add("stale", c, MUST);
    /* and with softcap, which these tiles run in a kernel of their own */
    c = shape(FA_BF16, 2, 4, 2, 300, 300, 64);
    c.softcap = 5.0f;
    add("tiles", c, MUST);
    add("tiles", with_causal(c), MUST);
    add("workspace", with_workspace(shape(FA_BF16, 2, 4, 2, 256, 256, 128), 1), F);
    /* the dynamic tile order of the 192-row kernel */
    add("workspace", with_workspace(with_causal(shape(FA_BF16, 2, 4, 2, 700, 700, 64)), 1), F);
    /* More tiles than an H100 or H200 has SMs (132): the tiles past the first wave come from the tile counter in
     * the scratch, whose stale contents (a pattern, check/verify.c) must not decide which tiles run. 384 tiles,
     * each head's first one claimed last; 256 tiles. */
    add("workspace", with_workspace(with_causal(shape(FA_BF16, 8, 16, 4, 448, 448, 64)), 1), MUST | DET);
    add("workspace", with_workspace(shape(FA_F16, 2, 16, 8, 1024, 1024, 128), 1), MUST);
    /* a caller's workspace need not be aligned (the tile counter's tag is 64-bit; the backward's dQ is fp32) */
    add("workspace", with_workspace(with_causal(shape(FA_BF16, 4, 16, 4, 448, 448, 64)), 2), F);
    add("workspace", with_workspace(shape(FA_F16, 2, 4, 2, 256, 256, 128), 2), F);
    /* outside the CUDA scope: any answer but a wrong one is fine */
    add("f32", shape(FA_F32, 2, 4, 2, 100, 100, 64), BWD);
    add("hdim40", shape(FA_BF16, 2, 4, 2, 100, 100, 40), BWD);
}

/* ---- running one case on one backend ---- */

/* The CUDA backend with exec.kernel = FA2: on compute capability 9.0, where AUTO runs the FA3 kernels, it keeps
 * the FA2 ones tested too. */
#define CUDA_FA2 ((fa_backend)100)

static const char *backend_name(fa_backend b) {
    if (b == CUDA_FA2) return "cuda-fa2";
    switch (b) {
    case FA_BACKEND_CPU: return "cpu";
    case FA_BACKEND_CUDA: return "cuda";
    case FA_BACKEND_NAIVE: return "naive";
    case FA_BACKEND_REFERENCE: return "reference";
    default: return "auto";
    }
}

static int backend_selected(fa_backend b) {
    if (!th_opt.backends) return 1;
    const char *name = backend_name(b), *s = th_opt.backends;
    size_t n = strlen(name);
    while ((s = strstr(s, name))) {
        if ((s == th_opt.backends || s[-1] == ',') && (s[n] == ',' || s[n] == '\0')) return 1;
        s += n;
    }
    return 0;
}

static int unsupported_status(fa_status st) {
    return st == FA_ERR_UNSUPPORTED || st == FA_ERR_NOT_COMPILED || st == FA_ERR_NO_DEVICE;
}

/* Runs a pass and checks the poison; returns 0 on success, 1 unsupported, -1 failure (with *why). */
static int run_pass(vf_problem *pr, const fa_exec *x, int backward, char *why, size_t n) {
    fa_status st = vf_run(pr, x, backward);
    if (st != FA_OK) {
        format(why, n, "%s %s: %s%s%s", backward ? "bwd" : "fwd", fa_status_name(st), fa_last_error(),
               pr->error[0] ? " / " : "", pr->error);
        return unsupported_status(st) ? 1 : -1;
    }
    int64_t unwritten, overwritten;
    vf_check_written(pr, backward, &unwritten, &overwritten);
    if (unwritten || overwritten) {
        format(why, n, "%s: %lld output elements not written, %lld written outside the outputs",
               backward ? "bwd" : "fwd", (long long)unwritten, (long long)overwritten);
        return -1;
    }
    return 0;
}

/* Runs the passes `runs` times, each run's outputs compared with the first's; 1 if all are bit-identical. With
 * nan_padding the first run has zeros in the padding and the others NaN. */
static int rerun_identical(vf_problem *pr, const fa_exec *x, int backward, int nan_padding, int runs, char *why,
                           size_t n) {
    size_t bytes = vf_outputs_bytes(pr, backward);
    unsigned char *a = malloc(bytes + 1), *b = malloc(bytes + 1);
    int same = 0;
    if (!a || !b) {
        format(why, n, "out of memory");
        goto done;
    }
    if (nan_padding) vf_set_padding(pr, 0.0f);
    if (run_pass(pr, x, 0, why, n) || (backward && run_pass(pr, x, 1, why, n))) goto done;
    vf_outputs_save(pr, backward, a);
    if (nan_padding) vf_set_padding(pr, NAN);
    for (int k = 1; k < runs; k++) {
        if (run_pass(pr, x, 0, why, n) || (backward && run_pass(pr, x, 1, why, n))) goto done;
        vf_outputs_save(pr, backward, b);
        if (memcmp(a, b, bytes) != 0) {
            format(why, n,
                   nan_padding ? "NaN in the padding changed an output"
                               : "deterministic backward run %d of %d differs from the first",
                   k + 1, runs);
            goto done;
        }
    }
    same = 1;
done:
    free(a), free(b);
    return same;
}

typedef struct tally {
    int pass, fail, unsup;
} tally;

static void run_on(const test_case *t, vf_problem *pr, fa_backend backend, int must, tally *tl) {
    char desc[160], name[256], why[512] = "", errs[200] = "";
    vf_config_describe(&t->cfg, desc, sizeof desc);
    const int bwd = (t->flags & BWD) != 0;
    const char *pass = bwd ? "fwd+bwd" : "fwd";
    format(name, sizeof name, "%-9s %-7s %-12s %s", backend_name(backend), pass, t->tag, desc);
    fa_exec x;
    memset(&x, 0, sizeof x);
    x.backend = backend == CUDA_FA2 ? FA_BACKEND_CUDA : backend;
    x.kernel = backend == CUDA_FA2 ? FA_KERNEL_FA2 : FA_KERNEL_AUTO;
    x.device = -1;

    /* the forward alone first, so that a failing or missing backward still shows the forward's errors */
    vf_report rep;
    int r = run_pass(pr, &x, 0, why, sizeof why), ok = 0;
    if (r == 0) {
        if (vf_compare(pr, 0, &rep) != FA_OK) {
            format(why, sizeof why, "reference: %s", pr->error);
            r = -1;
        } else {
            vf_report_brief(&rep, errs, sizeof errs);
            ok = rep.ok;
        }
    }
    if (r == 0 && ok && bwd) {
        r = run_pass(pr, &x, 1, why, sizeof why);
        if (r == 0 && vf_compare(pr, 1, &rep) != FA_OK) {
            format(why, sizeof why, "reference: %s", pr->error);
            r = -1;
        } else if (r == 0) {
            vf_report_brief(&rep, errs, sizeof errs);
            ok = rep.ok;
        }
    }
    const char *sep = errs[0] && why[0] ? "  " : "";
    if (r == 1) {
        if (must) {
            th_fail("%s  %s%sunsupported but required: %s", name, errs, sep, why);
            tl->fail++;
        } else {
            th_unsupported("%s  %s%s%s", name, errs, sep, why);
            tl->unsup++;
        }
        return;
    }
    if (r == 0 && ok && (t->flags & DET))
        ok = rerun_identical(pr, &x, 1, 0, vf_backend_on_device(backend) ? 20 : 2, why, sizeof why);
    if (r == 0 && ok && (t->flags & NANPAD)) ok = rerun_identical(pr, &x, bwd, 1, 2, why, sizeof why);
    if (r == 0 && ok) {
        th_pass("%s  %s%s", name, errs, t->flags & DET ? " bitwise-det" : t->flags & NANPAD ? " nan-pad-ok" : "");
        tl->pass++;
    } else {
        th_fail("%s  %s%s%s", name, errs, errs[0] && why[0] ? "  " : "", why);
        tl->fail++;
        if (th_opt.verbose && r == 0) vf_report_print(stdout, &rep, "        ");
    }
}

/* Runs the current case list on `backends` (the first is the suite's main one: MUST applies to it). */
static void run_suite(const char *suite, const fa_backend *backends, int nb, tally *tl) {
    for (int i = 0; i < ncases; i++) {
        test_case *t = &cases[i];
        if (th_opt.quick && (t->flags & BIG)) continue;
        char desc[160], full[256];
        vf_config_describe(&t->cfg, desc, sizeof desc);
        if (t->flags & (DET | NANPAD)) t->cfg.deterministic = 1;
        vf_problem pr;
        int created = 0;
        for (int k = 0; k < nb; k++) {
            format(full, sizeof full, "%s %s %s %s", suite, backend_name(backends[k]), t->tag, desc);
            if (!backend_selected(backends[k]) || !th_selected(full)) continue;
            /* the reference backend only on cases small enough to be quick */
            double size = (double)t->cfg.batch * t->cfg.heads_q * t->cfg.seqlen_q * t->cfg.seqlen_k * t->cfg.head_dim;
            if (backends[k] == FA_BACKEND_REFERENCE && size > 4e6) continue;
            if (!created) {
                fa_status st = vf_problem_create(&pr, &t->cfg);
                if (st != FA_OK) {
                    th_fail("%s  cannot build the problem: %s", full, pr.error);
                    tl[k].fail++;
                    break;
                }
                created = 1;
            }
            const int must = k == 0 && (t->flags & MUST) && (!(t->flags & SM90) || device_is_sm90());
            run_on(t, &pr, backends[k], must, &tl[k]);
        }
        if (created) vf_problem_destroy(&pr);
    }
}

static void print_tally(const char *suite, const fa_backend *backends, int nb, const tally *tl) {
    for (int k = 0; k < nb; k++)
        if (tl[k].pass + tl[k].fail + tl[k].unsup)
            printf("summary %-4s %-9s %d passed, %d failed, %d unsupported\n", suite, backend_name(backends[k]),
                   tl[k].pass, tl[k].fail, tl[k].unsup);
}

int main(int argc, char **argv) {
    th_init(argc, argv, " [-b cpu,reference,cuda,naive]");
    printf("test_backends: seed %llu, %s\n", (unsigned long long)th_opt.seed, fa_build_info());
    printf("%-6s%-9s %-7s %-12s %s\n", "status", "backend", "passes", "case", "shape and options / error vs tolerance");

    fa_backend cpu[2] = { FA_BACKEND_CPU, FA_BACKEND_REFERENCE };
    tally tcpu[2] = { { 0, 0, 0 }, { 0, 0, 0 } };
    cpu_cases();
    run_suite("cpu", cpu, 2, tcpu);

    fa_backend gpu[3] = { FA_BACKEND_CUDA, FA_BACKEND_NAIVE, CUDA_FA2 };
    tally tgpu[3] = { { 0, 0, 0 }, { 0, 0, 0 }, { 0, 0, 0 } };
    int ngpu = 0;
    if (fa_device_count() > 0) {
        fa_device_info info;
        memset(&info, 0, sizeof info);
        if (fa_device_get_info(0, &info) == FA_OK)
            printf("gpu: %s (sm_%d%d, %d SMs)\n", info.name, info.cc_major, info.cc_minor, info.sm_count);
        const int hopper = info.cc_major == 9 && info.cc_minor == 0;
        ngpu = fa_backend_built(FA_BACKEND_NAIVE) ? 2 : 1;
        if (hopper) {
            if (ngpu == 1) gpu[1] = CUDA_FA2;
            ngpu++;
        }
        gpu_cases();
        run_suite("gpu", gpu, ngpu, tgpu);
    } else {
        th_skip("gpu suite (cuda, naive): skipped (no GPU)%s",
                fa_backend_built(FA_BACKEND_CUDA) ? "" : " - this library was built without CUDA");
    }
    print_tally("cpu", cpu, 2, tcpu);
    print_tally("gpu", gpu, ngpu, tgpu);
    return th_finish();
}
