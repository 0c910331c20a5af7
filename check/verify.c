/* SPDX-License-Identifier: Apache-2.0 */
/*
 * verify.c - problems, runs and checks shared by the flashattn CLI, the tests and the fuzzer (see verify.h);
 * built as $(BUILD)/libflashattn_check.a.
 *
 * Layout of this file: random numbers; tensor geometry (which elements of an allocation belong to the
 * problem); building a problem; the device mirror (only with FA_WITH_CUDA); running; poison checks; the naive
 * same-dtype implementation and the fp64 reference; the tolerance rule; full and sampled comparison; timing.
 *
 * "Packed" arrays below use the reference's layout: (tokens, heads, head_dim) with token b * seqlen + r for a
 * dense batch and cu_seqlens[b] + r for a varlen one, so that the flat row index token * heads + h is the
 * same for the strided tensors, the reference and the naive implementation.
 */
#include "verify.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "internal.h"

#ifdef FA_WITH_CUDA
#include <cuda_runtime.h>
#endif

#ifdef _OPENMP
#define VF_PARALLEL_FOR _Pragma("omp parallel for schedule(dynamic, 1)")
#else
#define VF_PARALLEL_FOR
#endif

const char *const vf_output_names[VF_NUM_OUTPUTS] = { "O", "LSE", "dQ", "dK", "dV" };

/* ---------------------------------------------------------------------------------------------------------
 * Random numbers
 * ------------------------------------------------------------------------------------------------------- */

static uint64_t splitmix64(uint64_t *x) {
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

void vf_rng_seed(vf_rng *r, uint64_t seed) {
    for (int i = 0; i < 4; i++) r->s[i] = splitmix64(&seed);
}

static inline uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

uint64_t vf_rng_next(vf_rng *r) {
    uint64_t *s = r->s, result = rotl(s[1] * 5, 7) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

double vf_rng_uniform(vf_rng *r) {
    return (double)(vf_rng_next(r) >> 11) * 0x1.0p-53;
}

double vf_rng_normal(vf_rng *r) {
    double u1 = 1.0 - vf_rng_uniform(r), u2 = vf_rng_uniform(r);
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

int64_t vf_rng_range(vf_rng *r, int64_t lo, int64_t hi) {
    if (hi <= lo) return lo;
    return lo + (int64_t)(vf_rng_next(r) % (uint64_t)(hi - lo + 1));
}

/* A stream for one purpose of one problem: tensors and blocks of rows get independent streams. */
static uint64_t stream_seed(uint64_t seed, uint64_t a, uint64_t b) {
    uint64_t x = seed ^ (a * 0xd1b54a32d192ed03ull) ^ (b * 0x8cb92ba72f3d8dd7ull);
    splitmix64(&x);
    return splitmix64(&x);
}

/* ---------------------------------------------------------------------------------------------------------
 * Configuration
 * ------------------------------------------------------------------------------------------------------- */

void vf_config_init(vf_config *c) {
    memset(c, 0, sizeof *c);
    c->dtype = FA_F32;
    c->batch = 1;
    c->seqlen_q = 1;
    c->seqlen_k = 1;
    c->heads_q = 1;
    c->heads_kv = 1;
    c->head_dim = 64;
    c->window_left = -1;
    c->window_right = -1;
    c->q_amplitude = 1.0;
    c->pad_value = NAN;
    c->seed = 1;
    c->out_dtype = FA_BF16;
}

static const char *dtype_name(fa_dtype t) {
    return t == FA_F16 ? "f16" : t == FA_BF16 ? "bf16" : t == FA_E4M3 ? "e4m3" : "f32";
}

void vf_config_describe(const vf_config *c, char *buf, size_t size) {
    static const char *const layouts[] = { "", " bhsd", " padded", " mixed", " unaligned" };
    int n = snprintf(buf, size, "b=%d h=%d/%d s=%d/%d d=%d %s", c->batch, c->heads_q, c->heads_kv, c->seqlen_q,
                     c->seqlen_k, c->head_dim, dtype_name(c->dtype));
#define VF_APPEND(...)                                                                         \
    do {                                                                                       \
        if (n >= 0 && (size_t)n < size) n += snprintf(buf + n, size - (size_t)n, __VA_ARGS__); \
    } while (0)
    if (c->dtype == FA_E4M3) {
        VF_APPEND("->%s", dtype_name(c->out_dtype));
        if (c->no_descale)
            VF_APPEND(" no-descale");
        else if (c->descale_block > 0)
            VF_APPEND(" descale/%d", c->descale_block);
    }
    if (c->causal) VF_APPEND(" causal");
    if (c->window_left >= 0 || c->window_right >= 0) VF_APPEND(" win=%d,%d", c->window_left, c->window_right);
    if (c->softcap > 0) VF_APPEND(" cap=%g", (double)c->softcap);
    if (c->alibi) VF_APPEND(" alibi%s", c->alibi == VF_ALIBI_BATCH_HEADS ? "(b,h)" : "");
    if (c->scale != 0) VF_APPEND(" scale=%g", (double)c->scale);
    if (c->q_amplitude != 1.0) VF_APPEND(" qamp=%g", c->q_amplitude);
    if (c->k_ramp != 0.0) VF_APPEND(" kramp=%g", c->k_ramp);
    if (c->varlen) VF_APPEND(" varlen%s", c->edge_lengths ? "+edges" : "");
    if (c->layout > 0 && c->layout <= 4) VF_APPEND("%s", layouts[c->layout]);
    if (c->uniform) VF_APPEND(" uniform");
    if (c->deterministic) VF_APPEND(" det");
    if (c->workspace) VF_APPEND(c->workspace == 2 ? " ws+4" : " ws");
#undef VF_APPEND
}

/* ---------------------------------------------------------------------------------------------------------
 * Tensor geometry
 * ------------------------------------------------------------------------------------------------------- */

/* Rows of a tensor are (token, head) pairs, numbered token * heads + h in packed order. */
static int64_t valid_rows(const vf_problem *pr, const vf_tensor *t) {
    if (pr->cfg.varlen) return (int64_t)(t->query ? pr->cu_q : pr->cu_k)[pr->cfg.batch] * t->heads;
    return (int64_t)pr->cfg.batch * t->tokens * t->heads;
}

/* All rows the allocation holds, tail rows past the last sequence of a varlen batch included. */
static int64_t all_rows(const vf_problem *pr, const vf_tensor *t) {
    return pr->cfg.varlen ? t->tokens * t->heads : valid_rows(pr, t);
}

static int64_t row_offset(const vf_problem *pr, const vf_tensor *t, int64_t row) {
    const int64_t h = row % t->heads, tok = row / t->heads;
    if (pr->cfg.varlen) return tok * t->view.stride_seq + h * t->view.stride_head;
    return (tok / t->tokens) * t->view.stride_batch + (tok % t->tokens) * t->view.stride_seq + h * t->view.stride_head;
}

/* Per element of the allocation: 0 outside the problem, 1 part of it, 2 a tail row (varlen). */
static unsigned char *element_classes(const vf_problem *pr, const vf_tensor *t) {
    unsigned char *cls = calloc((size_t)t->elems + 1, 1);
    if (!cls) return NULL;
    const int64_t d = pr->cfg.head_dim, nvalid = valid_rows(pr, t), nall = all_rows(pr, t);
    for (int64_t row = 0; row < nall; row++) memset(cls + row_offset(pr, t, row), row < nvalid ? 1 : 2, (size_t)d);
    return cls;
}

static int64_t lse_valid_entry(const vf_problem *pr, int64_t x) {
    if (!pr->cfg.varlen) return 1;
    return (x % pr->p.total_q) < pr->cu_q[pr->cfg.batch] ? 1 : 2;
}

/* Strides for one layout; returns the allocation size in elements. */
static int64_t layout_strides(vf_layout layout, int varlen, int64_t batch, int64_t tokens, int64_t heads, int64_t d,
                              fa_tensor *v) {
    int64_t gap_head = 0, gap_row = 0, gap_batch = 0;
    if (layout == VF_LAYOUT_PADDED) gap_head = 8, gap_row = 16, gap_batch = 24;
    if (layout == VF_LAYOUT_UNALIGNED) gap_head = 1, gap_row = 3, gap_batch = 5;
    if (layout == VF_LAYOUT_BHSD) {
        v->stride_seq = d;
        v->stride_head = tokens * d;
        v->stride_batch = heads * tokens * d;
    } else {
        v->stride_head = d + gap_head;
        v->stride_seq = heads * v->stride_head + gap_row;
        v->stride_batch = tokens * v->stride_seq + gap_batch;
    }
    if (varlen) {
        v->stride_batch = 0;
        batch = 1;
    }
    if (tokens == 0) return 8;
    return (batch - 1) * v->stride_batch + (tokens - 1) * v->stride_seq + (heads - 1) * v->stride_head + d + 8;
}

/* ---------------------------------------------------------------------------------------------------------
 * Values: poison, padding, random fill
 * ------------------------------------------------------------------------------------------------------- */

/* Quiet NaNs with a payload no arithmetic produces, so "still holds the poison" means "never written". */
#define POISON_F32  0x7fe5a5a5u
#define POISON_F16  0x7ea5u
#define POISON_BF16 0x7fe5u
#define POISON_E4M3 0x7fu /* e4m3's only NaN: no output is e4m3, inputs are only filled */

static void fill_bits(void *base, fa_dtype t, int64_t n, float value, int poison) {
    if (t == FA_E4M3) {
        memset(base, poison ? POISON_E4M3 : fa_f32_to_e4m3(value), (size_t)n);
    } else if (t == FA_F32) {
        uint32_t bits = poison ? POISON_F32 : fa_f32_to_bits(value), *p = base;
        for (int64_t i = 0; i < n; i++) p[i] = bits;
    } else {
        uint16_t bits = poison ? (t == FA_F16 ? POISON_F16 : POISON_BF16)
                               : (t == FA_F16 ? fa_f32_to_f16(value) : fa_f32_to_bf16(value));
        uint16_t *p = base;
        for (int64_t i = 0; i < n; i++) p[i] = bits;
    }
}

static int is_poison(const void *base, fa_dtype t, int64_t i) {
    if (t == FA_E4M3) return ((const uint8_t *)base)[i] == POISON_E4M3;
    if (t == FA_F32) return ((const uint32_t *)base)[i] == POISON_F32;
    return ((const uint16_t *)base)[i] == (t == FA_F16 ? POISON_F16 : POISON_BF16);
}

static size_t tensor_bytes(const vf_problem *pr, const vf_tensor *t) {
    return (size_t)t->elems * fa_dtype_size(t->dtype);
}

#define FILL_BLOCK_ROWS 64

/* Where key token `tok` (a row of the packed tensor for varlen) sits in its sequence, as a fraction in [0, 1). */
static double key_position(const vf_problem *pr, int64_t tok) {
    if (!pr->cfg.varlen) return (double)(tok % pr->cfg.seqlen_k) / pr->cfg.seqlen_k;
    int b = 0;
    while (b + 1 < pr->cfg.batch && pr->cu_k[b + 1] <= tok) b++;
    const int64_t len = pr->cu_k[b + 1] - pr->cu_k[b];
    return len > 0 ? (double)(tok - pr->cu_k[b]) / (double)len : 0.0;
}

/* The batch entry and row in it of packed row `row` (token * heads + head) of t. */
static void row_place(const vf_problem *pr, const vf_tensor *t, int64_t row, int64_t *b, int64_t *r, int64_t *h) {
    const int64_t tok = row / t->heads;
    *h = row % t->heads;
    if (!pr->cfg.varlen) {
        *b = tok / t->tokens;
        *r = tok % t->tokens;
        return;
    }
    const int32_t *cu = t->query ? pr->cu_q : pr->cu_k;
    int64_t lo = 0;
    while (lo + 1 < pr->cfg.batch && cu[lo + 1] <= tok) lo++;
    *b = lo;
    *r = tok - cu[lo];
}

/* The descale of row r of head h of batch entry b of t (1 unless t is an e4m3 q, k or v), from the header's
 * layout, independently of the library's indexing. */
static double descale_of(const vf_problem *pr, const vf_tensor *t, int64_t b, int64_t h, int64_t r) {
    if (t->dtype != FA_E4M3 || !t->which) return 1.0;
    const float *d = t->which == 'q' ? pr->p.q_descale : t->which == 'k' ? pr->p.k_descale : pr->p.v_descale;
    if (!d) return 1.0;
    const int64_t block = pr->cfg.descale_block, len = t->query ? pr->p.seqlen_q : pr->p.seqlen_k;
    const int64_t blocks = block > 0 ? (len + block - 1) / block : 1;
    return d[(b * t->heads + h) * blocks + (block > 0 ? r / block : 0)];
}

/* The descale of packed row `row` of t. */
static double row_descale(const vf_problem *pr, const vf_tensor *t, int64_t row) {
    if (t->dtype != FA_E4M3 || !t->which) return 1.0;
    int64_t b, r, h;
    row_place(pr, t, row, &b, &r, &h);
    return descale_of(pr, t, b, h, r);
}

/* Random values in every row of the problem; `amplitude` scales them (and, for keys, k_ramp along the sequence).
 * e4m3 tensors store value / descale, rounded. */
static void fill_random(vf_problem *pr, vf_tensor *t, uint64_t stream, double amplitude) {
    const int64_t nrows = valid_rows(pr, t), d = pr->cfg.head_dim,
                  nblocks = (nrows + FILL_BLOCK_ROWS - 1) / FILL_BLOCK_ROWS;
    const int uniform = pr->cfg.uniform;
    VF_PARALLEL_FOR
    for (int64_t blk = 0; blk < nblocks; blk++) {
        vf_rng rng;
        vf_rng_seed(&rng, stream_seed(pr->cfg.seed, stream, (uint64_t)blk));
        const int64_t end =
            blk * FILL_BLOCK_ROWS + FILL_BLOCK_ROWS < nrows ? blk * FILL_BLOCK_ROWS + FILL_BLOCK_ROWS : nrows;
        for (int64_t row = blk * FILL_BLOCK_ROWS; row < end; row++) {
            const int64_t off = row_offset(pr, t, row);
            const double inv_descale = 1.0 / row_descale(pr, t, row);
            double amp = amplitude * inv_descale;
            if (!t->query && pr->cfg.k_ramp != 0.0) amp *= 1.0 + pr->cfg.k_ramp * key_position(pr, row / t->heads);
            for (int64_t c = 0; c < d; c += 2) {
                double a, b;
                if (uniform) {
                    a = 2.0 * vf_rng_uniform(&rng) - 1.0;
                    b = 2.0 * vf_rng_uniform(&rng) - 1.0;
                } else { /* Box-Muller, both values */
                    double r = sqrt(-2.0 * log(1.0 - vf_rng_uniform(&rng))),
                           th = 6.283185307179586 * vf_rng_uniform(&rng);
                    a = r * cos(th);
                    b = r * sin(th);
                }
                fa_store(t->host, t->dtype, off + c, (float)(amp * a));
                if (c + 1 < d) fa_store(t->host, t->dtype, off + c + 1, (float)(amp * b));
            }
        }
    }
}

static void set_padding(vf_problem *pr, vf_tensor *t, float value) {
    unsigned char *cls = element_classes(pr, t);
    if (!cls) return;
    const fa_dtype dt = t->dtype;
    for (int64_t i = 0; i < t->elems; i++)
        if (cls[i] != 1) fill_bits((char *)t->host + (size_t)i * fa_dtype_size(dt), dt, 1, value, 0);
    free(cls);
}

void vf_set_padding(vf_problem *pr, float value) {
    vf_tensor *in[4] = { &pr->q, &pr->k, &pr->v, &pr->dout };
    for (int i = 0; i < 4; i++) set_padding(pr, in[i], value);
}

void vf_poison_outputs(vf_problem *pr, int backward) {
    if (!backward) {
        fill_bits(pr->o.host, pr->o.dtype, pr->o.elems, 0, 1);
        fill_bits(pr->lse, FA_F32, pr->lse_elems, 0, 1);
    } else {
        fill_bits(pr->dq.host, pr->dq.dtype, pr->dq.elems, 0, 1);
        fill_bits(pr->dk.host, pr->dk.dtype, pr->dk.elems, 0, 1);
        fill_bits(pr->dv.host, pr->dv.dtype, pr->dv.elems, 0, 1);
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * Building a problem
 * ------------------------------------------------------------------------------------------------------- */

static void make_lengths(const vf_config *c, int32_t *cu_q, int32_t *cu_k) {
    vf_rng rng;
    vf_rng_seed(&rng, stream_seed(c->seed, 101, 0));
    const int32_t sq = c->seqlen_q, sk = c->seqlen_k;
    const int32_t edge_q[5] = { 0, sq, 1, sq, 1 }, edge_k[5] = { sk, 0, sk, 1, 1 };
    cu_q[0] = cu_k[0] = 0;
    for (int32_t b = 0; b < c->batch; b++) {
        int32_t lq = (int32_t)vf_rng_range(&rng, 0, sq), lk = (int32_t)vf_rng_range(&rng, 0, sk);
        if (c->edge_lengths && b < 5 && b < c->batch - 1) lq = edge_q[b], lk = edge_k[b];
        if (c->lens_q) lq = c->lens_q[b];
        if (c->lens_k) lk = c->lens_k[b];
        cu_q[b + 1] = cu_q[b] + lq;
        cu_k[b + 1] = cu_k[b] + lk;
    }
}

static fa_status alloc_tensor(vf_problem *pr, vf_tensor *t, int query, int which, fa_dtype dtype, vf_layout layout) {
    const vf_config *c = &pr->cfg;
    t->query = query;
    t->which = which;
    t->dtype = dtype;
    t->heads = query ? c->heads_q : c->heads_kv;
    t->tokens = c->varlen ? (query ? pr->p.total_q : pr->p.total_k) : (query ? c->seqlen_q : c->seqlen_k);
    t->elems = layout_strides(layout, c->varlen, c->batch, t->tokens, t->heads, c->head_dim, &t->view);
    t->host = malloc(tensor_bytes(pr, t));
    t->view.data = t->host;
    return t->host ? FA_OK : FA_ERR_OUT_OF_MEMORY;
}

static void fill_slopes(vf_problem *pr) {
    const vf_config *c = &pr->cfg;
    vf_rng rng;
    vf_rng_seed(&rng, stream_seed(c->seed, 102, 0));
    for (int64_t x = 0; x < pr->slope_count; x++) {
        int64_t h = x % c->heads_q;
        /* the usual geometric slopes 2^(-8 (h + 1) / heads), jittered per batch entry in the (b, h) form */
        double s = pow(2.0, -8.0 * (double)(h + 1) / c->heads_q);
        if (c->alibi == VF_ALIBI_BATCH_HEADS) s *= 0.5 + vf_rng_uniform(&rng);
        pr->slopes[x] = (float)s;
    }
}

/* Descales of an e4m3 problem: per (batch entry, head, block) a random factor in [0.75, 1.25] x amplitude / 32,
 * so that N(0, amplitude) values divided by it use e4m3's range and stay below 448 (|x| < 10 sigma). */
static fa_status make_descales(vf_problem *pr) {
    const vf_config *c = &pr->cfg;
    fa_params *p = &pr->p;
    const float **slot[3] = { &p->q_descale, &p->k_descale, &p->v_descale };
    for (int t = 0; t < 3; t++) {
        const int64_t len = t == 0 ? p->seqlen_q : p->seqlen_k, heads = t == 0 ? c->heads_q : c->heads_kv;
        const int64_t blocks = c->descale_block > 0 ? (len + c->descale_block - 1) / c->descale_block : 1;
        const int64_t n = (int64_t)c->batch * heads * blocks;
        pr->descale[t] = malloc(sizeof(float) * (size_t)(n + 1));
        pr->descale_count[t] = n;
        if (!pr->descale[t]) return FA_ERR_OUT_OF_MEMORY;
        vf_rng rng;
        vf_rng_seed(&rng, stream_seed(c->seed, 104 + (uint64_t)t, 0));
        const double amp = t == 0 ? c->q_amplitude : 1.0;
        /* per block of rows: 2^[-2, 2), so that a block's descale applied to another block shows */
        for (int64_t i = 0; i < n; i++)
            pr->descale[t][i] = (float)(amp / 32.0 *
                                        (c->descale_block > 0 ? exp2(4.0 * vf_rng_uniform(&rng) - 2.0)
                                                              : 0.75 + 0.5 * vf_rng_uniform(&rng)));
        *slot[t] = pr->descale[t];
    }
    return FA_OK;
}

fa_status vf_problem_create(vf_problem *pr, const vf_config *cfg) {
    memset(pr, 0, sizeof *pr);
    pr->cfg = *cfg;
    const vf_config *c = &pr->cfg;
    if (c->batch < 1 || c->heads_q < 1 || c->heads_kv < 1 || c->head_dim < 1 || c->seqlen_q < 0 || c->seqlen_k < 0 ||
        c->extra_tokens < 0) {
        snprintf(pr->error, sizeof pr->error, "sizes must be positive");
        return FA_ERR_INVALID_ARGUMENT;
    }
    /* 8 tensors with padding: refuse sizes whose byte counts could not even be represented */
    const double bytes = 8.0 *
                         ((double)c->batch * c->seqlen_q * c->heads_q + (double)c->batch * c->seqlen_k * c->heads_kv +
                          2.0 * c->extra_tokens * c->heads_q) *
                         (c->head_dim + 24) * (double)fa_dtype_size(c->dtype);
    if (bytes > 0x1p46) {
        snprintf(pr->error, sizeof pr->error, "the problem needs %.0f GiB of host memory", bytes / 0x1p30);
        return FA_ERR_OUT_OF_MEMORY;
    }
    fa_params *p = &pr->p;
    fa_params_init(p, c->dtype, c->batch, c->seqlen_q, c->seqlen_k, c->heads_q, c->heads_kv, c->head_dim);
    p->softmax_scale = c->scale;
    p->causal = c->causal;
    p->window_left = c->window_left;
    p->window_right = c->window_right;
    p->softcap = c->softcap;
    p->deterministic = c->deterministic;

    if (c->varlen) {
        pr->cu_q = malloc(sizeof(int32_t) * (size_t)(c->batch + 1));
        pr->cu_k = malloc(sizeof(int32_t) * (size_t)(c->batch + 1));
        if (!pr->cu_q || !pr->cu_k) goto oom;
        make_lengths(c, pr->cu_q, pr->cu_k);
        int32_t mq = 0, mk = 0;
        for (int32_t b = 0; b < c->batch; b++) {
            int32_t lq = pr->cu_q[b + 1] - pr->cu_q[b], lk = pr->cu_k[b + 1] - pr->cu_k[b];
            mq = lq > mq ? lq : mq;
            mk = lk > mk ? lk : mk;
        }
        /* seqlen_q/k are upper bounds in a varlen batch: keep the configured ones unless a length exceeds them */
        p->seqlen_q = c->seqlen_q > mq ? c->seqlen_q : mq;
        p->seqlen_k = c->seqlen_k > mk ? c->seqlen_k : mk;
        p->cu_seqlens_q = pr->cu_q;
        p->cu_seqlens_k = pr->cu_k;
        p->total_q = pr->cu_q[c->batch] + c->extra_tokens;
        p->total_k = pr->cu_k[c->batch] + c->extra_tokens;
    }

    vf_rng layout_rng;
    vf_rng_seed(&layout_rng, stream_seed(c->seed, 103, 0));
    vf_tensor *tensors[8] = { &pr->q, &pr->k, &pr->v, &pr->o, &pr->dout, &pr->dq, &pr->dk, &pr->dv };
    const int query[8] = { 1, 0, 0, 1, 1, 1, 0, 0 }, which[8] = { 'q', 'k', 'v', 0, 0, 0, 0, 0 };
    const int fp8 = c->dtype == FA_E4M3;
    for (int i = 0; i < 8; i++) {
        vf_layout layout = c->layout == VF_LAYOUT_MIXED ? (vf_layout)vf_rng_range(&layout_rng, 0, 2) : c->layout;
        const fa_dtype dt = fp8 && i >= 3 ? c->out_dtype : c->dtype; /* no FP8 backward: its tensors as o */
        if (alloc_tensor(pr, tensors[i], query[i], which[i], dt, layout) != FA_OK) goto oom;
    }
    if (fp8) {
        p->out_dtype = c->out_dtype;
        p->descale_block_q = p->descale_block_k = c->descale_block;
        if (!c->no_descale && make_descales(pr) != FA_OK) goto oom;
    }
    pr->lse_elems = c->varlen ? (int64_t)c->heads_q * p->total_q : (int64_t)c->batch * c->heads_q * c->seqlen_q;
    pr->lse = malloc(sizeof(float) * (size_t)(pr->lse_elems + 1));
    if (!pr->lse) goto oom;

    if (c->alibi != VF_ALIBI_OFF) {
        pr->slope_count = c->alibi == VF_ALIBI_BATCH_HEADS ? (int64_t)c->batch * c->heads_q : c->heads_q;
        pr->slopes = malloc(sizeof(float) * (size_t)pr->slope_count);
        if (!pr->slopes) goto oom;
        fill_slopes(pr);
        p->alibi_slopes = pr->slopes;
        p->alibi_batch_stride = c->alibi == VF_ALIBI_BATCH_HEADS ? c->heads_q : 0;
    }

    p->q = pr->q.view;
    p->k = pr->k.view;
    p->v = pr->v.view;
    p->o = pr->o.view;
    p->dout = pr->dout.view;
    p->dq = pr->dq.view;
    p->dk = pr->dk.view;
    p->dv = pr->dv.view;
    p->lse = pr->lse;

    vf_tensor *inputs[4] = { &pr->q, &pr->k, &pr->v, &pr->dout };
    for (int i = 0; i < 4; i++) {
        fill_bits(inputs[i]->host, inputs[i]->dtype, inputs[i]->elems, c->pad_value, 0);
        fill_random(pr, inputs[i], (uint64_t)i + 1, i == 0 ? c->q_amplitude : 1.0);
    }
    vf_poison_outputs(pr, 0);
    vf_poison_outputs(pr, 1);
    return FA_OK;

oom:
    vf_problem_destroy(pr);
    snprintf(pr->error, sizeof pr->error, "out of host memory");
    return FA_ERR_OUT_OF_MEMORY;
}

static void expected_free(vf_expected *e);

static void device_free(vf_problem *pr);

void vf_problem_destroy(vf_problem *pr) {
    device_free(pr);
    vf_tensor *tensors[8] = { &pr->q, &pr->k, &pr->v, &pr->o, &pr->dout, &pr->dq, &pr->dk, &pr->dv };
    for (int i = 0; i < 8; i++) free(tensors[i]->host);
    free(pr->lse);
    free(pr->cu_q);
    free(pr->cu_k);
    free(pr->slopes);
    for (int i = 0; i < 3; i++) free(pr->descale[i]);
    expected_free(pr->expect);
    char error[sizeof pr->error];
    memcpy(error, pr->error, sizeof error);
    memset(pr, 0, sizeof *pr);
    memcpy(pr->error, error, sizeof error);
}

/* ---------------------------------------------------------------------------------------------------------
 * Device mirror
 * ------------------------------------------------------------------------------------------------------- */

int vf_backend_on_device(fa_backend b) {
    return b == FA_BACKEND_CUDA || b == FA_BACKEND_NAIVE;
}

#ifdef FA_WITH_CUDA

static fa_status cuda_result(vf_problem *pr, cudaError_t e, const char *what) {
    if (e == cudaSuccess) return FA_OK;
    snprintf(pr->error, sizeof pr->error, "%s: %s", what, cudaGetErrorString(e));
    cudaGetLastError(); /* clear a sticky-free error so the next call starts clean */
    return e == cudaErrorMemoryAllocation ? FA_ERR_OUT_OF_MEMORY : FA_ERR_DEVICE;
}

static void device_free(vf_problem *pr) {
    if (!pr->on_device) return;
    vf_tensor *tensors[8] = { &pr->q, &pr->k, &pr->v, &pr->o, &pr->dout, &pr->dq, &pr->dk, &pr->dv };
    for (int i = 0; i < 8; i++) cudaFree(tensors[i]->dev), tensors[i]->dev = NULL;
    cudaFree(pr->d_lse);
    cudaFree(pr->d_cu_q);
    cudaFree(pr->d_cu_k);
    cudaFree(pr->d_slopes);
    pr->d_lse = NULL, pr->d_cu_q = pr->d_cu_k = NULL, pr->d_slopes = NULL;
    for (int t = 0; t < 3; t++) cudaFree(pr->d_descale[t]), pr->d_descale[t] = NULL;
    pr->on_device = 0;
}

static fa_status make_mirror(vf_problem *pr) {
    vf_tensor *tensors[8] = { &pr->q, &pr->k, &pr->v, &pr->o, &pr->dout, &pr->dq, &pr->dk, &pr->dv };
    fa_status st = FA_OK;
    pr->on_device = 1;
    for (int i = 0; i < 8 && st == FA_OK; i++)
        st = cuda_result(pr, cudaMalloc(&tensors[i]->dev, tensor_bytes(pr, tensors[i])), "cudaMalloc");
    if (st == FA_OK)
        st =
            cuda_result(pr, cudaMalloc((void **)&pr->d_lse, sizeof(float) * (size_t)(pr->lse_elems + 1)), "cudaMalloc");
    const size_t cu_bytes = sizeof(int32_t) * (size_t)(pr->cfg.batch + 1);
    if (st == FA_OK && pr->cu_q) {
        st = cuda_result(pr, cudaMalloc((void **)&pr->d_cu_q, cu_bytes), "cudaMalloc");
        if (st == FA_OK) st = cuda_result(pr, cudaMalloc((void **)&pr->d_cu_k, cu_bytes), "cudaMalloc");
        if (st == FA_OK)
            st = cuda_result(pr, cudaMemcpy(pr->d_cu_q, pr->cu_q, cu_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
        if (st == FA_OK)
            st = cuda_result(pr, cudaMemcpy(pr->d_cu_k, pr->cu_k, cu_bytes, cudaMemcpyHostToDevice), "cudaMemcpy");
    }
    if (st == FA_OK && pr->slopes) {
        const size_t sb = sizeof(float) * (size_t)pr->slope_count;
        st = cuda_result(pr, cudaMalloc((void **)&pr->d_slopes, sb), "cudaMalloc");
        if (st == FA_OK)
            st = cuda_result(pr, cudaMemcpy(pr->d_slopes, pr->slopes, sb, cudaMemcpyHostToDevice), "cudaMemcpy");
    }
    for (int t = 0; t < 3 && st == FA_OK; t++) {
        if (!pr->descale[t]) continue;
        const size_t db = sizeof(float) * (size_t)pr->descale_count[t];
        st = cuda_result(pr, cudaMalloc((void **)&pr->d_descale[t], db), "cudaMalloc");
        if (st == FA_OK)
            st =
                cuda_result(pr, cudaMemcpy(pr->d_descale[t], pr->descale[t], db, cudaMemcpyHostToDevice), "cudaMemcpy");
    }
    if (st != FA_OK) {
        device_free(pr);
        return st;
    }
    fa_params *d = &pr->dp;
    *d = pr->p;
    d->q.data = pr->q.dev, d->k.data = pr->k.dev, d->v.data = pr->v.dev, d->o.data = pr->o.dev;
    d->dout.data = pr->dout.dev, d->dq.data = pr->dq.dev, d->dk.data = pr->dk.dev, d->dv.data = pr->dv.dev;
    d->lse = pr->d_lse;
    d->cu_seqlens_q = pr->d_cu_q;
    d->cu_seqlens_k = pr->d_cu_k;
    d->alibi_slopes = pr->d_slopes;
    d->q_descale = pr->d_descale[0], d->k_descale = pr->d_descale[1], d->v_descale = pr->d_descale[2];
    return FA_OK;
}

static fa_status copy_tensor(vf_problem *pr, vf_tensor *t, int to_device) {
    const size_t n = tensor_bytes(pr, t);
    if (to_device)
        return cuda_result(pr, cudaMemcpy(t->dev, t->host, n, cudaMemcpyHostToDevice), "cudaMemcpy to device");
    return cuda_result(pr, cudaMemcpy(t->host, t->dev, n, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}

static fa_status copy_lse(vf_problem *pr, int to_device) {
    const size_t n = sizeof(float) * (size_t)pr->lse_elems;
    if (to_device)
        return cuda_result(pr, cudaMemcpy(pr->d_lse, pr->lse, n, cudaMemcpyHostToDevice), "cudaMemcpy to device");
    return cuda_result(pr, cudaMemcpy(pr->lse, pr->d_lse, n, cudaMemcpyDeviceToHost), "cudaMemcpy to host");
}

/* Copies the inputs of a pass and its (poisoned) outputs to the device. */
static fa_status upload(vf_problem *pr, int backward) {
    fa_status st = FA_OK;
    vf_tensor *fwd[4] = { &pr->q, &pr->k, &pr->v, &pr->o },
              *bwd[7] = { &pr->q, &pr->k, &pr->v, &pr->o, &pr->dout, &pr->dq, &pr->dk };
    if (!backward) {
        for (int i = 0; i < 4 && st == FA_OK; i++) st = copy_tensor(pr, fwd[i], 1);
    } else {
        for (int i = 0; i < 7 && st == FA_OK; i++) st = copy_tensor(pr, bwd[i], 1);
        if (st == FA_OK) st = copy_tensor(pr, &pr->dv, 1);
    }
    if (st == FA_OK) st = copy_lse(pr, 1);
    return st;
}

static fa_status download(vf_problem *pr, int backward) {
    fa_status st = cuda_result(pr, cudaDeviceSynchronize(), "cudaDeviceSynchronize");
    if (st != FA_OK) return st;
    if (!backward) {
        st = copy_tensor(pr, &pr->o, 0);
        if (st == FA_OK) st = copy_lse(pr, 0);
    } else {
        st = copy_tensor(pr, &pr->dq, 0);
        if (st == FA_OK) st = copy_tensor(pr, &pr->dk, 0);
        if (st == FA_OK) st = copy_tensor(pr, &pr->dv, 0);
    }
    return st;
}

#else /* no CUDA: device backends get the host params and the library reports that it cannot run them */

static void device_free(vf_problem *pr) {
    (void)pr;
}

#endif

const fa_params *vf_params_for(vf_problem *pr, fa_backend b) {
#ifdef FA_WITH_CUDA
    if (vf_backend_on_device(b) && fa_device_count() > 0) {
        if (!pr->on_device && make_mirror(pr) != FA_OK) return NULL;
        return &pr->dp;
    }
#endif
    (void)b;
    return &pr->p;
}

#ifdef FA_WITH_CUDA
/* A device copy of n bytes of host memory (NULL for NULL or 0 bytes); *ok cleared on failure. */
static void *kv_to_device(const void *host, size_t n, int *ok) {
    void *d = NULL;
    if (!host || !n || !*ok) return NULL;
    if (cudaMalloc(&d, n) != cudaSuccess || cudaMemcpy(d, host, n, cudaMemcpyHostToDevice) != cudaSuccess) {
        cudaGetLastError();
        *ok = 0;
    }
    return d;
}
#endif

fa_status vf_run_kvcache(const fa_params *p, const fa_kvcache *kv, const fa_exec *exec, const vf_kvcache_bytes *n,
                         char *why, size_t size) {
    return vf_run_kvcache_timed(p, kv, exec, n, why, size, NULL);
}

fa_status vf_run_kvcache_timed(const fa_params *p, const fa_kvcache *kv, const fa_exec *exec, const vf_kvcache_bytes *n,
                               char *why, size_t size, double ms[2]) {
    why[0] = '\0';
    if (ms) ms[0] = ms[1] = -1;
#ifdef FA_WITH_CUDA
    if (exec && vf_backend_on_device(exec->backend) && fa_device_count() > 0) {
        int ok = 1;
        fa_params dp = *p;
        fa_kvcache dk = *kv;
        dp.q.data = kv_to_device(p->q.data, n->q, &ok), dp.o.data = kv_to_device(p->o.data, n->o, &ok);
        dp.lse = kv_to_device(p->lse, n->lse, &ok);
        dp.k.data = kv_to_device(p->k.data, n->k, &ok), dp.v.data = kv_to_device(p->v.data, n->v, &ok);
        dp.alibi_slopes = kv_to_device(p->alibi_slopes, n->alibi, &ok);
        dk.k_cache.data = kv_to_device(kv->k_cache.data, n->k_cache, &ok);
        dk.v_cache.data = kv_to_device(kv->v_cache.data, n->v_cache, &ok);
        dk.rotary_cos = kv_to_device(kv->rotary_cos, n->rotary, &ok);
        dk.rotary_sin = kv_to_device(kv->rotary_sin, n->rotary, &ok);
        dk.cache_seqlens = kv_to_device(kv->cache_seqlens, n->seqlens, &ok);
        dk.cache_batch_idx = kv_to_device(kv->cache_batch_idx, n->batch_idx, &ok);
        dk.cache_leftpad = kv_to_device(kv->cache_leftpad, n->leftpad, &ok);
        dk.block_table = kv_to_device(kv->block_table, n->block_table, &ok);
        fa_status st = FA_ERR_DEVICE;
        if (!ok) {
            snprintf(why, size, "copying the inputs to the device failed");
        } else if ((st = fa_fwd_kvcache(&dp, &dk, exec)) == FA_OK) {
            cudaError_t e = cudaDeviceSynchronize();
            if (e == cudaSuccess) e = cudaMemcpy(p->o.data, dp.o.data, n->o, cudaMemcpyDeviceToHost);
            if (e == cudaSuccess && p->lse) e = cudaMemcpy(p->lse, dp.lse, n->lse, cudaMemcpyDeviceToHost);
            if (e == cudaSuccess) e = cudaMemcpy(kv->k_cache.data, dk.k_cache.data, n->k_cache, cudaMemcpyDeviceToHost);
            if (e == cudaSuccess) e = cudaMemcpy(kv->v_cache.data, dk.v_cache.data, n->v_cache, cudaMemcpyDeviceToHost);
            if (e != cudaSuccess) {
                snprintf(why, size, "the call or the copy back failed: %s", cudaGetErrorString(e));
                cudaGetLastError();
                st = FA_ERR_DEVICE;
            }
        }
        for (int with = 0; ms && st == FA_OK && with < 2; with++) {
            fa_exec xc = *exec;
            xc.check = with;
            fa_status s2 = fa_fwd_kvcache(&dp, &dk, &xc); /* warm-up */
            const double t0 = vf_seconds();
            for (int i = 0; i < 50 && s2 == FA_OK; i++) s2 = fa_fwd_kvcache(&dp, &dk, &xc);
            if (s2 == FA_OK && cudaDeviceSynchronize() == cudaSuccess) ms[with] = (vf_seconds() - t0) * 1e3 / 50;
        }
        const void *ptrs[] = { dp.q.data,        dp.o.data,          dp.lse,           dp.k.data,     dp.v.data,
                               dp.alibi_slopes,  dk.k_cache.data,    dk.v_cache.data,  dk.rotary_cos, dk.rotary_sin,
                               dk.cache_seqlens, dk.cache_batch_idx, dk.cache_leftpad, dk.block_table };
        for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) cudaFree((void *)ptrs[i]);
        return st;
    }
#endif
    (void)n;
    return fa_fwd_kvcache(p, kv, exec);
}

static int uses_device(const vf_problem *pr, fa_backend b) {
    return vf_backend_on_device(b) && pr->on_device;
}

/* Workspace of fa_workspace_size() bytes in the backend's memory space (NULL and 0 bytes when none); with
 * cfg.workspace 2 it starts 4 bytes past an aligned address. */
static fa_status workspace_alloc(vf_problem *pr, const fa_params *p, fa_exec *x, int backward) {
    size_t bytes = 0;
    fa_status st = fa_workspace_size(p, x, backward, &bytes);
    if (st != FA_OK) return st;
    x->workspace = NULL;
    x->workspace_bytes = 0;
    pr->ws_base = NULL;
    if (bytes == 0) return FA_OK;
    const size_t skew = pr->cfg.workspace == 2 ? 4 : 0, alloc = (bytes + skew + 63) / 64 * 64;
#ifdef FA_WITH_CUDA
    if (uses_device(pr, x->backend)) {
        st = cuda_result(pr, cudaMalloc(&pr->ws_base, alloc), "cudaMalloc workspace");
        if (st != FA_OK) {
            pr->ws_base = NULL;
            return st;
        }
        /* Scratch may hold anything: a pattern that reads as a large count, so a kernel that trusted it fails */
        if ((st = cuda_result(pr, cudaMemset(pr->ws_base, 0x7f, alloc), "cudaMemset workspace")) != FA_OK) {
            cudaFree(pr->ws_base);
            pr->ws_base = NULL;
            return st;
        }
        x->workspace = (char *)pr->ws_base + skew;
        x->workspace_bytes = bytes;
        return FA_OK;
    }
#endif
    pr->ws_base = aligned_alloc(64, alloc);
    if (!pr->ws_base) return FA_ERR_OUT_OF_MEMORY;
    memset(pr->ws_base, 0x7f, alloc);
    x->workspace = (char *)pr->ws_base + skew;
    x->workspace_bytes = bytes;
    return FA_OK;
}

static void workspace_free(vf_problem *pr, fa_exec *x) {
    x->workspace = NULL;
#ifdef FA_WITH_CUDA
    if (uses_device(pr, x->backend)) {
        cudaFree(pr->ws_base);
        pr->ws_base = NULL;
        return;
    }
#endif
    free(pr->ws_base);
    pr->ws_base = NULL;
}

/* ---------------------------------------------------------------------------------------------------------
 * Running
 * ------------------------------------------------------------------------------------------------------- */

static fa_exec exec_or_default(const fa_exec *exec) {
    fa_exec x;
    if (exec) return *exec;
    memset(&x, 0, sizeof x);
    x.device = -1;
    return x;
}

fa_status vf_run(vf_problem *pr, const fa_exec *exec, int backward) {
    fa_exec x = exec_or_default(exec);
    vf_poison_outputs(pr, backward);
    const fa_params *p = vf_params_for(pr, x.backend);
    if (!p) return FA_ERR_DEVICE;
    fa_status st = FA_OK;
#ifdef FA_WITH_CUDA
    if (uses_device(pr, x.backend) && (st = upload(pr, backward)) != FA_OK) return st;
#endif
    int own_workspace = pr->cfg.workspace && !x.workspace;
    if (own_workspace && (st = workspace_alloc(pr, p, &x, backward)) != FA_OK) return st;
    fa_status run = backward ? fa_bwd(p, &x) : fa_fwd(p, &x);
#ifdef FA_WITH_CUDA
    if (uses_device(pr, x.backend)) st = download(pr, backward);
#endif
    if (own_workspace) workspace_free(pr, &x);
    return run != FA_OK ? run : st;
}

/* ---------------------------------------------------------------------------------------------------------
 * Poison checks and saved outputs
 * ------------------------------------------------------------------------------------------------------- */

static void check_tensor_written(const vf_problem *pr, const vf_tensor *t, int64_t *unwritten, int64_t *over) {
    unsigned char *cls = element_classes(pr, t);
    if (!cls) return;
    for (int64_t i = 0; i < t->elems; i++) {
        int poison = is_poison(t->host, t->dtype, i);
        if (cls[i] == 1 && poison) (*unwritten)++;
        if (cls[i] == 0 && !poison) (*over)++;
    }
    free(cls);
}

void vf_check_written(const vf_problem *pr, int backward, int64_t *unwritten, int64_t *overwritten) {
    *unwritten = *overwritten = 0;
    if (!backward) {
        check_tensor_written(pr, &pr->o, unwritten, overwritten);
        for (int64_t x = 0; x < pr->lse_elems; x++)
            if (lse_valid_entry(pr, x) == 1 && is_poison(pr->lse, FA_F32, x)) (*unwritten)++;
    } else {
        check_tensor_written(pr, &pr->dq, unwritten, overwritten);
        check_tensor_written(pr, &pr->dk, unwritten, overwritten);
        check_tensor_written(pr, &pr->dv, unwritten, overwritten);
    }
}

static size_t tensor_valid_bytes(const vf_problem *pr, const vf_tensor *t) {
    return (size_t)(valid_rows(pr, t) * pr->cfg.head_dim) * fa_dtype_size(t->dtype);
}

static unsigned char *save_tensor(const vf_problem *pr, const vf_tensor *t, unsigned char *buf) {
    const size_t es = fa_dtype_size(t->dtype), row_bytes = (size_t)pr->cfg.head_dim * es;
    const int64_t n = valid_rows(pr, t);
    for (int64_t row = 0; row < n; row++, buf += row_bytes)
        memcpy(buf, (const char *)t->host + (size_t)row_offset(pr, t, row) * es, row_bytes);
    return buf;
}

size_t vf_outputs_bytes(const vf_problem *pr, int backward) {
    if (!backward) return tensor_valid_bytes(pr, &pr->o) + sizeof(float) * (size_t)pr->lse_elems;
    return tensor_valid_bytes(pr, &pr->dq) + tensor_valid_bytes(pr, &pr->dk) + tensor_valid_bytes(pr, &pr->dv);
}

void vf_outputs_save(const vf_problem *pr, int backward, unsigned char *buf) {
    if (!backward) {
        buf = save_tensor(pr, &pr->o, buf);
        /* only valid LSE entries: tail entries of a varlen batch may legitimately hold anything */
        for (int64_t x = 0; x < pr->lse_elems; x++, buf += sizeof(float))
            if (lse_valid_entry(pr, x) == 1)
                memcpy(buf, pr->lse + x, sizeof(float));
            else
                memset(buf, 0, sizeof(float));
    } else {
        buf = save_tensor(pr, &pr->dq, buf);
        buf = save_tensor(pr, &pr->dk, buf);
        save_tensor(pr, &pr->dv, buf);
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * Reference and naive results
 * ------------------------------------------------------------------------------------------------------- */

struct vf_expected {
    int have_fwd, have_bwd;
    fa_params rp;                            /* resolved host params: scale set, window_right = 0 when causal */
    double *o, *lse, *dq, *dk, *dv;          /* fp64 reference, packed */
    float *n_o, *n_lse, *n_dq, *n_dk, *n_dv; /* naive same-dtype implementation, packed */
    float *m_o, *m_dq, *m_dk, *m_dv;         /* magnitude: sum of |terms| of each element (tolerance floor) */
};

static void expected_free(vf_expected *e) {
    if (!e) return;
    free(e->o), free(e->lse), free(e->dq), free(e->dk), free(e->dv);
    free(e->n_o), free(e->n_lse), free(e->n_dq), free(e->n_dk), free(e->n_dv);
    free(e->m_o), free(e->m_dq), free(e->m_dk), free(e->m_dv);
    free(e);
}

/* The params a backend receives after validation (see flashattn.c): scale resolved, causal => right = 0. */
static fa_params resolved_params(const vf_problem *pr) {
    fa_params r = pr->p;
    if (r.softmax_scale == 0.0f) r.softmax_scale = 1.0f / sqrtf((float)r.head_dim);
    if (r.causal) r.window_right = 0;
    return r;
}

static int64_t packed_tokens(const vf_problem *pr, int query) {
    if (pr->cfg.varlen) return query ? pr->p.total_q : pr->p.total_k;
    return (int64_t)pr->cfg.batch * (query ? pr->cfg.seqlen_q : pr->cfg.seqlen_k);
}

static size_t packed_elems(const vf_problem *pr, const vf_tensor *t) {
    return (size_t)(packed_tokens(pr, t->query) * t->heads * pr->cfg.head_dim) + 1;
}

/* The valid rows of a strided tensor into a packed array (other rows zero). */
static void gather_f64(const vf_problem *pr, const vf_tensor *t, double *out) {
    const int64_t d = pr->cfg.head_dim, n = valid_rows(pr, t);
    memset(out, 0, packed_elems(pr, t) * sizeof(double));
    for (int64_t row = 0; row < n; row++) {
        const int64_t off = row_offset(pr, t, row);
        const double ds = row_descale(pr, t, row);
        for (int64_t c = 0; c < d; c++) out[row * d + c] = fa_load(t->host, t->dtype, off + c) * ds;
    }
}

static void gather_f32(const vf_problem *pr, const vf_tensor *t, float *out) {
    const int64_t d = pr->cfg.head_dim, n = valid_rows(pr, t);
    memset(out, 0, packed_elems(pr, t) * sizeof(float));
    for (int64_t row = 0; row < n; row++) {
        const int64_t off = row_offset(pr, t, row);
        const float ds = (float)row_descale(pr, t, row);
        for (int64_t c = 0; c < d; c++) out[row * d + c] = fa_load(t->host, t->dtype, off + c) * ds;
    }
}

/*
 * The fp64 reference (fa_reference_fwd_f64 / fa_reference_bwd_f64), split into independent problems of one
 * sequence and one kv head with its group of query heads, run in parallel: the reference itself is serial.
 * Each unit is copied into small packed arrays, run as a dense batch of one, and copied back.
 */
static void reference_unit(const fa_params *rp, int backward, int64_t b, int64_t hkv, const double *q, const double *k,
                           const double *v, const double *dout, double *o, double *lse, double *dq, double *dk,
                           double *dv) {
    const fa_seq s = fa_seq_packed(rp, b), sl = fa_seq_get(rp, b);
    const int64_t d = rp->head_dim, group = rp->heads_q / rp->heads_kv, nq = s.len_q * group * d, nk = s.len_k * d;
    fa_params u = *rp;
    u.batch = 1, u.seqlen_q = (int32_t)s.len_q, u.seqlen_k = (int32_t)s.len_k, u.heads_q = (int32_t)group;
    u.heads_kv = 1, u.cu_seqlens_q = u.cu_seqlens_k = NULL, u.total_q = u.total_k = 0;
    if (rp->alibi_slopes) u.alibi_slopes = rp->alibi_slopes + b * rp->alibi_batch_stride + hkv * group;
    u.alibi_batch_stride = 0;
    double *buf = malloc(sizeof(double) * (size_t)(4 * nq + 4 * nk + s.len_q * group + 1));
    if (!buf) return;
    double *uq = buf, *udo = uq + nq, *uo = udo + nq, *udq = uo + nq, *uk = udq + nq, *uv = uk + nk, *udk = uv + nk,
           *udv = udk + nk, *ulse = udv + nk;
    for (int64_t r = 0; r < s.len_q; r++)
        for (int64_t g = 0; g < group; g++) {
            const int64_t from = ((s.tok_q + r) * rp->heads_q + hkv * group + g) * d, to = (r * group + g) * d;
            memcpy(uq + to, q + from, sizeof(double) * (size_t)d);
            if (backward) memcpy(udo + to, dout + from, sizeof(double) * (size_t)d);
        }
    for (int64_t r = 0; r < s.len_k; r++) {
        const int64_t from = ((s.tok_k + r) * rp->heads_kv + hkv) * d;
        memcpy(uk + r * d, k + from, sizeof(double) * (size_t)d);
        memcpy(uv + r * d, v + from, sizeof(double) * (size_t)d);
    }
    if (!backward) {
        fa_reference_fwd_f64(&u, uq, uk, uv, uo, ulse);
        for (int64_t r = 0; r < s.len_q; r++)
            for (int64_t g = 0; g < group; g++) {
                const int64_t h = hkv * group + g;
                memcpy(o + ((s.tok_q + r) * rp->heads_q + h) * d, uo + (r * group + g) * d, sizeof(double) * (size_t)d);
                lse[fa_lse_index(rp, b, sl.tok_q, r, h)] = ulse[g * s.len_q + r];
            }
    } else {
        fa_reference_bwd_f64(&u, uq, uk, uv, udo, udq, udk, udv);
        for (int64_t r = 0; r < s.len_q; r++)
            for (int64_t g = 0; g < group; g++)
                memcpy(dq + ((s.tok_q + r) * rp->heads_q + hkv * group + g) * d, udq + (r * group + g) * d,
                       sizeof(double) * (size_t)d);
        for (int64_t r = 0; r < s.len_k; r++) {
            memcpy(dk + ((s.tok_k + r) * rp->heads_kv + hkv) * d, udk + r * d, sizeof(double) * (size_t)d);
            memcpy(dv + ((s.tok_k + r) * rp->heads_kv + hkv) * d, udv + r * d, sizeof(double) * (size_t)d);
        }
    }
    free(buf);
}

static void reference_run(const fa_params *rp, int backward, const double *q, const double *k, const double *v,
                          const double *dout, double *o, double *lse, double *dq, double *dk, double *dv) {
    const int64_t units = (int64_t)rp->batch * rp->heads_kv;
    VF_PARALLEL_FOR
    for (int64_t x = 0; x < units; x++)
        reference_unit(rp, backward, x / rp->heads_kv, x % rp->heads_kv, q, k, v, dout, o, lse, dq, dk, dv);
}

static inline float round_to(fa_dtype t, float x) {
    return fa_round_dtype(t, x);
}

/*
 * The naive same-dtype implementation: standard attention as a GPU framework computes it in f16/bf16.
 * S = scale * Q K^T in fp32 from the dtype's inputs, softcap and masks in fp32, P = softmax(S) computed in
 * fp32 and stored in the dtype, O = P V accumulated in fp32 and rounded, LSE in fp32. Backward: dP = dO V^T
 * rounded to the dtype, D_i = sum_j P_ij dP_ij in fp32, dS = P (dP - D) (times the softcap derivative)
 * rounded to the dtype, dQ = scale dS K and per query head dK = scale dS^T Q, dV = P^T dO accumulated in fp32
 * and rounded; for GQA the per-head dK/dV are summed in fp32 and rounded again. In f32 every rounding is the
 * identity and this is plain fp32 standard attention.
 * Alongside, each output element's magnitude: the sum of the absolute values of the terms it sums
 * (sum_j P_ij |V_jc| for O; scale sum_j P_ij (|dP_ij| + |D_i|) |K_jc| for dQ, and so on), the scale of the
 * rounding errors any summation order makes, used for the tolerance floor.
 */
static float naive_probs(const fa_params *rp, const float *q, const float *k, const fa_seq *s, int64_t b, int64_t h,
                         int64_t i, float *prob, float *tv) {
    const fa_dtype dt = rp->dtype;
    const int64_t d = rp->head_dim, hkv = h / (rp->heads_q / rp->heads_kv);
    const float *qi = q + ((s->tok_q + i) * rp->heads_q + h) * d;
    const float cap = rp->softcap, slope = fa_alibi_slope(rp, b, h);
    float max = -INFINITY;
    for (int64_t j = 0; j < s->len_k; j++) {
        const float *kj = k + ((s->tok_k + j) * rp->heads_kv + hkv) * d;
        float acc = 0.0f;
        for (int64_t c = 0; c < d; c++) acc += qi[c] * kj[c];
        float x = rp->softmax_scale * acc;
        if (cap > 0) {
            tv[j] = tanhf(x / cap);
            x = cap * tv[j];
        }
        if (!fa_key_visible(i, j, s->len_q, s->len_k, rp->window_left, rp->window_right)) {
            prob[j] = -INFINITY;
            continue;
        }
        x -= slope * (float)fa_alibi_distance(i, j, s->len_q, s->len_k);
        prob[j] = x;
        max = x > max ? x : max;
    }
    if (max == -INFINITY) {
        for (int64_t j = 0; j < s->len_k; j++) prob[j] = 0.0f;
        return -INFINITY;
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < s->len_k; j++) {
        prob[j] = expf(prob[j] - max);
        sum += prob[j];
    }
    for (int64_t j = 0; j < s->len_k; j++) prob[j] = round_to(dt, prob[j] / sum);
    return max + logf(sum);
}

static int64_t max_len_k(const fa_params *p) {
    int64_t m = 0;
    for (int64_t b = 0; b < p->batch; b++) {
        fa_seq s = fa_seq_get(p, b);
        m = s.len_k > m ? s.len_k : m;
    }
    return m;
}

static void naive_fwd(const fa_params *rp, const float *q, const float *k, const float *v, float *o, float *lse,
                      float *mag) {
    const int64_t d = rp->head_dim, lk = max_len_k(rp) + 1;
    for (int64_t b = 0; b < rp->batch; b++) {
        const fa_seq s = fa_seq_packed(rp, b), sl = fa_seq_get(rp, b);
        VF_PARALLEL_FOR
        for (int64_t h = 0; h < rp->heads_q; h++) {
            float *prob = malloc(sizeof(float) * (size_t)(2 * lk + 2 * d)), *tv = prob + lk, *acc = tv + lk;
            float *macc = acc + d;
            if (!prob) continue;
            const int64_t hkv = h / (rp->heads_q / rp->heads_kv);
            for (int64_t i = 0; i < s.len_q; i++) {
                float l = naive_probs(rp, q, k, &s, b, h, i, prob, tv);
                for (int64_t c = 0; c < d; c++) acc[c] = macc[c] = 0.0f;
                for (int64_t j = 0; j < s.len_k; j++) {
                    if (prob[j] == 0.0f) continue;
                    const float *vj = v + ((s.tok_k + j) * rp->heads_kv + hkv) * d;
                    for (int64_t c = 0; c < d; c++) acc[c] += prob[j] * vj[c], macc[c] += prob[j] * fabsf(vj[c]);
                }
                const int64_t row = ((s.tok_q + i) * rp->heads_q + h) * d;
                for (int64_t c = 0; c < d; c++) o[row + c] = round_to(fa_out_dtype(rp), acc[c]), mag[row + c] = macc[c];
                lse[fa_lse_index(rp, b, sl.tok_q, i, h)] = l;
            }
            free(prob);
        }
    }
}

static void naive_bwd(const fa_params *rp, const float *q, const float *k, const float *v, const float *dout, float *dq,
                      float *dk, float *dv, float *mdq, float *mdk, float *mdv) {
    const fa_dtype dt = rp->dtype;
    const int64_t d = rp->head_dim, lk = max_len_k(rp) + 1, group = rp->heads_q / rp->heads_kv;
    /* per query head dK/dV (and their magnitudes) of one sequence, fp32, before the group sum */
    const size_t hn = (size_t)(rp->heads_q * lk * d);
    float *hk = calloc(hn, sizeof(float)), *hv = calloc(hn, sizeof(float));
    float *mk = calloc(hn, sizeof(float)), *mv = calloc(hn, sizeof(float));
    if (!hk || !hv || !mk || !mv) {
        free(hk), free(hv), free(mk), free(mv);
        return;
    }
    for (int64_t b = 0; b < rp->batch; b++) {
        const fa_seq s = fa_seq_packed(rp, b);
        memset(hk, 0, sizeof(float) * hn);
        memset(hv, 0, sizeof(float) * hn);
        memset(mk, 0, sizeof(float) * hn);
        memset(mv, 0, sizeof(float) * hn);
        VF_PARALLEL_FOR
        for (int64_t h = 0; h < rp->heads_q; h++) {
            float *prob = malloc(sizeof(float) * (size_t)(3 * lk + 2 * d)), *tv = prob + lk, *dp = tv + lk;
            float *acc = dp + lk, *macc = acc + d;
            if (!prob) continue;
            const int64_t hkv = h / group;
            float *hkh = hk + h * lk * d, *hvh = hv + h * lk * d, *mkh = mk + h * lk * d, *mvh = mv + h * lk * d;
            for (int64_t i = 0; i < s.len_q; i++) {
                const int64_t qrow = ((s.tok_q + i) * rp->heads_q + h) * d;
                float l = naive_probs(rp, q, k, &s, b, h, i, prob, tv);
                if (l == -INFINITY) {
                    for (int64_t c = 0; c < d; c++) dq[qrow + c] = mdq[qrow + c] = 0.0f;
                    continue;
                }
                const float *doi = dout + qrow, *qi = q + qrow;
                float D = 0.0f;
                for (int64_t j = 0; j < s.len_k; j++) {
                    const float *vj = v + ((s.tok_k + j) * rp->heads_kv + hkv) * d;
                    float x = 0.0f;
                    for (int64_t c = 0; c < d; c++) x += doi[c] * vj[c];
                    dp[j] = round_to(dt, x);
                    D += prob[j] * dp[j];
                }
                for (int64_t c = 0; c < d; c++) acc[c] = macc[c] = 0.0f;
                for (int64_t j = 0; j < s.len_k; j++) {
                    if (prob[j] == 0.0f) continue;
                    const float capd = rp->softcap > 0 ? 1.0f - tv[j] * tv[j] : 1.0f;
                    const float ds = rp->softmax_scale * round_to(dt, prob[j] * (dp[j] - D) * capd);
                    const float w = rp->softmax_scale * prob[j] * (fabsf(dp[j]) + fabsf(D)) * capd;
                    const float *kj = k + ((s.tok_k + j) * rp->heads_kv + hkv) * d;
                    for (int64_t c = 0; c < d; c++) {
                        acc[c] += ds * kj[c];
                        macc[c] += w * fabsf(kj[c]);
                        hkh[j * d + c] += ds * qi[c];
                        hvh[j * d + c] += prob[j] * doi[c];
                        mkh[j * d + c] += w * fabsf(qi[c]);
                        mvh[j * d + c] += prob[j] * fabsf(doi[c]);
                    }
                }
                for (int64_t c = 0; c < d; c++) dq[qrow + c] = round_to(dt, acc[c]), mdq[qrow + c] = macc[c];
            }
            free(prob);
        }
        for (int64_t hkv = 0; hkv < rp->heads_kv; hkv++)
            for (int64_t j = 0; j < s.len_k; j++)
                for (int64_t c = 0; c < d; c++) {
                    float sk = 0.0f, sv = 0.0f, msk = 0.0f, msv = 0.0f;
                    for (int64_t g = 0; g < group; g++) {
                        const int64_t y = ((hkv * group + g) * lk + j) * d + c;
                        sk += round_to(dt, hk[y]);
                        sv += round_to(dt, hv[y]);
                        msk += mk[y];
                        msv += mv[y];
                    }
                    const int64_t x = ((s.tok_k + j) * rp->heads_kv + hkv) * d + c;
                    dk[x] = group > 1 ? round_to(dt, sk) : sk;
                    dv[x] = group > 1 ? round_to(dt, sv) : sv;
                    mdk[x] = msk;
                    mdv[x] = msv;
                }
    }
    free(hk), free(hv), free(mk), free(mv);
}

/* Computes (once) the fp64 reference and the naive results of the forward, and of the backward if asked. */
static fa_status expected(vf_problem *pr, int backward) {
    if (!pr->expect) {
        pr->expect = calloc(1, sizeof(vf_expected));
        if (!pr->expect) return FA_ERR_OUT_OF_MEMORY;
        pr->expect->rp = resolved_params(pr);
    }
    vf_expected *e = pr->expect;
    if (e->have_fwd && (!backward || e->have_bwd)) return FA_OK;
    const fa_params *rp = &e->rp;
    const size_t nq = packed_elems(pr, &pr->q), nk = packed_elems(pr, &pr->k), nl = (size_t)pr->lse_elems + 1;
    fa_status st = FA_OK;

    double *q = malloc(nq * sizeof(double)), *k = malloc(nk * sizeof(double)), *v = malloc(nk * sizeof(double));
    float *qf = malloc(nq * sizeof(float)), *kf = malloc(nk * sizeof(float)), *vf = malloc(nk * sizeof(float));
    double *dout = NULL;
    float *doutf = NULL;
    if (!q || !k || !v || !qf || !kf || !vf) goto oom;
    gather_f64(pr, &pr->q, q), gather_f64(pr, &pr->k, k), gather_f64(pr, &pr->v, v);
    gather_f32(pr, &pr->q, qf), gather_f32(pr, &pr->k, kf), gather_f32(pr, &pr->v, vf);

    if (!e->have_fwd) {
        e->o = calloc(nq, sizeof(double)), e->lse = calloc(nl, sizeof(double));
        e->n_o = calloc(nq, sizeof(float)), e->n_lse = calloc(nl, sizeof(float)), e->m_o = calloc(nq, sizeof(float));
        if (!e->o || !e->lse || !e->n_o || !e->n_lse || !e->m_o) goto oom;
        reference_run(rp, 0, q, k, v, NULL, e->o, e->lse, NULL, NULL, NULL);
        naive_fwd(rp, qf, kf, vf, e->n_o, e->n_lse, e->m_o);
        e->have_fwd = 1;
    }
    if (backward && !e->have_bwd) {
        dout = malloc(nq * sizeof(double)), doutf = malloc(nq * sizeof(float));
        e->dq = calloc(nq, sizeof(double)), e->dk = calloc(nk, sizeof(double)), e->dv = calloc(nk, sizeof(double));
        e->n_dq = calloc(nq, sizeof(float)), e->n_dk = calloc(nk, sizeof(float)), e->n_dv = calloc(nk, sizeof(float));
        e->m_dq = calloc(nq, sizeof(float)), e->m_dk = calloc(nk, sizeof(float)), e->m_dv = calloc(nk, sizeof(float));
        if (!dout || !doutf || !e->dq || !e->dk || !e->dv || !e->n_dq || !e->n_dk || !e->n_dv || !e->m_dq || !e->m_dk ||
            !e->m_dv)
            goto oom;
        gather_f64(pr, &pr->dout, dout), gather_f32(pr, &pr->dout, doutf);
        reference_run(rp, 1, q, k, v, dout, NULL, NULL, e->dq, e->dk, e->dv);
        naive_bwd(rp, qf, kf, vf, doutf, e->n_dq, e->n_dk, e->n_dv, e->m_dq, e->m_dk, e->m_dv);
        e->have_bwd = 1;
    }
    goto done;
oom:
    st = FA_ERR_OUT_OF_MEMORY;
    snprintf(pr->error, sizeof pr->error, "out of host memory for the reference");
done:
    free(q), free(k), free(v), free(qf), free(kf), free(vf), free(dout), free(doutf);
    return st;
}

/* ---------------------------------------------------------------------------------------------------------
 * The tolerance rule
 * ------------------------------------------------------------------------------------------------------- */

/*
 * THE TOLERANCE RULE (flash-attn's): an output X (O, LSE, dQ, dK or dV) of a backend passes when
 *
 *     max |X - X_ref|  <=  2 * max |X_naive - X_ref|  +  floor
 *
 * X_ref is the fp64 reference computed from the same inputs (the inputs are values of the dtype, so the
 * reference sees exactly what the backend sees). X_naive is standard attention in the same dtype (see
 * naive_probs above): its error is the noise of computing attention in that dtype at all, and a correct
 * backend stays within twice it.
 *
 * The floor matters only where the naive error happens to be ~0, or where FlashAttention's algorithm is
 * inherently less exact than the naive one:
 *
 *     floor = (e + 2^-23 * L) * max_elements(sum of |terms| of the element)
 *     L     = max|LSE| + scale * max_i |Q_i| * max_j |K_j|        (Euclidean norms of the rows)
 *
 * e is the dtype's unit roundoff for the 16-bit types and e4m3, 2^-8 for bf16, 2^-11 for f16 and 2^-4 for e4m3
 * inputs (whose P is rounded to e4m3 in the naive computation, as an FP8 kernel does): FlashAttention rounds the
 * unnormalised probabilities exp(S - m) to the dtype before P V, the naive implementation the normalised ones, so
 * each term's rounding error (up to e relative) differs between the two; on a problem of a few keys the naive
 * roundings can all happen to be near exact (bf16 2 x 2: naive 3.9e-4, FlashAttention 1.6e-3 from one P rounded
 * by 2^-9), and the 2x naive term then says nothing. f32: 16 units, 2^-20 (room for a vectorised exp). The sum of
 * |terms| (sum_j P_ij |V_jc| for O, scale sum_j P_ij (|dP_ij| + |D_i|) |K_jc| for dQ, ...) is what rounding errors
 * scale with in any summation order, also when the terms cancel: with one visible key per row dQ and dK are exactly 0,
 * the naive implementation gets D_i = P_ij dP_ij exactly, while FlashAttention computes D_i = rowsum(dO * O) from a
 * rounded O. 2^-23 L is two fp32 roundings of the logits (L bounds |LSE| and every score's terms): the
 * relative error of P = exp(S - LSE) when the backward recomputes S and rebuilds P from the forward's fp32
 * LSE, or when the forward folds the scale into exp2. Negligible for ordinary logits, dominant for logits
 * near 1e4, where the naive implementation, which keeps P, is more exact than any FlashAttention.
 * LSE itself is fp32 in every dtype but computed with fast exp2/log2 on GPUs: floor = 2^-18 max(1, L). With e4m3
 * inputs add 2^-13 L: Hopper's FP8 tensor cores keep about 14 bits of the sum they accumulate (dev/fp8/parts_test),
 * so each score S = scale Q K^T, whose terms L bounds, is that much less exact than the naive fp32 sum, and the
 * LSE, a smooth max of the scores, moves by at most the largest score error.
 */
double vf_tolerance(fa_dtype dtype, vf_output which, double naive_err, double magnitude, double logit_scale,
                    double *floor) {
    double f;
    if (which == VF_LSE) {
        f = 0x1p-18 * (logit_scale > 1.0 ? logit_scale : 1.0) + (dtype == FA_E4M3 ? 0x1p-13 * logit_scale : 0.0);
    } else {
        const double e = dtype == FA_E4M3 ? 0x1p-4 : dtype == FA_BF16 ? 0x1p-8 : dtype == FA_F16 ? 0x1p-11 : 0x1p-20;
        f = (e + 0x1p-23 * logit_scale) * magnitude;
    }
    if (floor) *floor = f;
    return 2.0 * naive_err + f;
}

static double elem_err(double out, double ref) {
    if (isnan(out) || isnan(ref)) return INFINITY;
    if (isinf(out) || isinf(ref)) return out == ref ? 0.0 : INFINITY;
    return fabs(out - ref);
}

typedef struct err_acc {
    double max_abs, naive, max_ref, magnitude;
    int64_t checked;
} err_acc;

static void acc_add(err_acc *a, double out, double naive, double ref, double magnitude) {
    double e = elem_err(out, ref), n = elem_err(naive, ref);
    if (!(e <= a->max_abs)) a->max_abs = e; /* NaN-safe: a NaN error becomes the max */
    if (!(n <= a->naive)) a->naive = n;
    if (isfinite(ref) && fabs(ref) > a->max_ref) a->max_ref = fabs(ref);
    if (magnitude > a->magnitude) a->magnitude = magnitude;
    a->checked++;
}

static void acc_merge(err_acc *a, const err_acc *b) {
    if (!(b->max_abs <= a->max_abs)) a->max_abs = b->max_abs;
    if (!(b->naive <= a->naive)) a->naive = b->naive;
    if (b->max_ref > a->max_ref) a->max_ref = b->max_ref;
    if (b->magnitude > a->magnitude) a->magnitude = b->magnitude;
    a->checked += b->checked;
}

/* logit_scale: L of the rule. */
static void finish(vf_report *rep, vf_output which, fa_dtype dt, const err_acc *a, double logit_scale) {
    vf_error *e = &rep->err[which];
    e->max_abs = a->max_abs;
    e->naive = a->naive;
    e->max_ref = a->max_ref;
    e->magnitude = which == VF_LSE ? a->max_ref : a->magnitude;
    e->checked = a->checked;
    e->tol = vf_tolerance(dt, which, a->naive, e->magnitude, logit_scale, &e->floor);
    e->rel = a->max_ref > 0 ? a->max_abs / a->max_ref : (a->max_abs > 0 ? INFINITY : 0.0);
    e->ok = a->max_abs <= e->tol;
    rep->have[which] = 1;
    if (!e->ok) rep->ok = 0;
}

static void compare_tensor(const vf_problem *pr, const vf_tensor *t, const double *ref, const float *naive,
                           const float *mag, err_acc *a) {
    const int64_t d = pr->cfg.head_dim, n = valid_rows(pr, t);
    for (int64_t row = 0; row < n; row++) {
        const int64_t off = row_offset(pr, t, row);
        for (int64_t c = 0; c < d; c++)
            acc_add(a, fa_load(t->host, t->dtype, off + c), naive[row * d + c], ref[row * d + c], mag[row * d + c]);
    }
}

/* scale * max_i |Q_i| * max_j |K_j| over the rows of the problem: bounds every score's sum of |terms|. */
static double score_magnitude(const vf_problem *pr) {
    const vf_tensor *t[2] = { &pr->q, &pr->k };
    double m[2] = { 0.0, 0.0 };
    const int64_t d = pr->cfg.head_dim;
    for (int i = 0; i < 2; i++) {
        const int64_t n = valid_rows(pr, t[i]);
        for (int64_t row = 0; row < n; row++) {
            const int64_t off = row_offset(pr, t[i], row);
            const double ds = row_descale(pr, t[i], row);
            double s = 0.0;
            for (int64_t c = 0; c < d; c++) {
                const double x = fa_load(t[i]->host, t[i]->dtype, off + c) * ds;
                s += x * x;
            }
            m[i] = s > m[i] ? s : m[i];
        }
    }
    return resolved_params(pr).softmax_scale * sqrt(m[0]) * sqrt(m[1]);
}

fa_status vf_rmse_o(vf_problem *pr, vf_problem *ref, double *rmse) {
    fa_status st = expected(ref, 0);
    if (st != FA_OK) return st;
    const int64_t d = pr->cfg.head_dim, n = valid_rows(pr, &pr->o);
    double sum = 0.0;
    int64_t count = 0;
    for (int64_t row = 0; row < n; row++) {
        const int64_t off = row_offset(pr, &pr->o, row);
        for (int64_t c = 0; c < d; c++) {
            const double want = ref->expect->o[row * d + c];
            if (!isfinite(want)) continue;
            const double e = fa_load(pr->o.host, pr->o.dtype, off + c) - want;
            sum += e * e, count++;
        }
    }
    *rmse = count ? sqrt(sum / (double)count) : 0.0;
    return FA_OK;
}

fa_status vf_compare(vf_problem *pr, int backward, vf_report *rep) {
    memset(rep, 0, sizeof *rep);
    rep->ok = 1;
    fa_status st = expected(pr, backward);
    if (st != FA_OK) return st;
    const vf_expected *e = pr->expect;
    err_acc a = { 0 };
    for (int64_t x = 0; x < pr->lse_elems; x++)
        if (lse_valid_entry(pr, x) == 1) acc_add(&a, pr->lse[x], e->n_lse[x], e->lse[x], 0.0);
    const double logit_scale = a.max_ref + score_magnitude(pr);
    finish(rep, VF_LSE, pr->cfg.dtype, &a, logit_scale);
    memset(&a, 0, sizeof a);
    compare_tensor(pr, &pr->o, e->o, e->n_o, e->m_o, &a);
    finish(rep, VF_O, pr->cfg.dtype, &a, logit_scale);
    if (backward) {
        const vf_tensor *t[3] = { &pr->dq, &pr->dk, &pr->dv };
        const double *r[3] = { e->dq, e->dk, e->dv };
        const float *n[3] = { e->n_dq, e->n_dk, e->n_dv }, *m[3] = { e->m_dq, e->m_dk, e->m_dv };
        for (int i = 0; i < 3; i++) {
            memset(&a, 0, sizeof a);
            compare_tensor(pr, t[i], r[i], n[i], m[i], &a);
            finish(rep, (vf_output)(VF_DQ + i), pr->cfg.dtype, &a, logit_scale);
        }
    }
    return FA_OK;
}

/* ---------------------------------------------------------------------------------------------------------
 * Sampled comparison: exact rows computed straight from the strided tensors
 * ------------------------------------------------------------------------------------------------------- */

typedef struct row_ctx {
    const vf_problem *pr;
    const fa_params *rp;
    int64_t b, h, i; /* query row i of (b, h), or key row i of (b, kv head h) */
    fa_seq s;        /* tok_q/tok_k in the strided tensors' numbering */
} row_ctx;

static double load(const vf_problem *pr, const vf_tensor *t, int64_t b, int64_t tok, int64_t r, int64_t h, int64_t c) {
    const double ds = descale_of(pr, t, b, h, r);
    return fa_load(t->host, t->dtype, fa_offset(&pr->p, &t->view, b, tok, r, h) + c) * ds;
}

/* Scores of query row i against every key of its sequence, fp64 (naive = 0) or fp32 (naive = 1); masked
 * entries are -inf; tv gets tanh(x / cap) for the softcap derivative. Returns the max. */
static double row_scores(const row_ctx *x, int64_t h, int64_t i, int naive, const double *qrow, double *sc,
                         double *tv) {
    const vf_problem *pr = x->pr;
    const fa_params *rp = x->rp;
    const int64_t d = rp->head_dim, hkv = h / (rp->heads_q / rp->heads_kv);
    const double slope = fa_alibi_slope(rp, x->b, h);
    double max = -INFINITY;
    for (int64_t j = 0; j < x->s.len_k; j++) {
        double v;
        if (naive) {
            float acc = 0.0f;
            for (int64_t c = 0; c < d; c++)
                acc += (float)qrow[c] * (float)load(pr, &pr->k, x->b, x->s.tok_k, j, hkv, c);
            float f = rp->softmax_scale * acc;
            if (rp->softcap > 0) {
                float t = tanhf(f / rp->softcap);
                tv[j] = t;
                f = rp->softcap * t;
            }
            f -= (float)slope * (float)fa_alibi_distance(i, j, x->s.len_q, x->s.len_k);
            v = f;
        } else {
            double acc = 0.0;
            for (int64_t c = 0; c < d; c++) acc += qrow[c] * load(pr, &pr->k, x->b, x->s.tok_k, j, hkv, c);
            v = (double)rp->softmax_scale * acc;
            if (rp->softcap > 0) {
                tv[j] = tanh(v / rp->softcap);
                v = rp->softcap * tv[j];
            }
            v -= slope * (double)fa_alibi_distance(i, j, x->s.len_q, x->s.len_k);
        }
        if (!fa_key_visible(i, j, x->s.len_q, x->s.len_k, rp->window_left, rp->window_right)) v = -INFINITY;
        sc[j] = v;
        if (v > max) max = v;
    }
    return max;
}

typedef struct row_errs {
    err_acc e[VF_NUM_OUTPUTS];
    double max_lse; /* largest finite |LSE| the row used */
} row_errs;

/* One sampled query row: O, LSE and (backward) dQ, exact and naive. */
static void check_query_row(const row_ctx *x, int backward, double *buf, row_errs *out) {
    const vf_problem *pr = x->pr;
    const fa_params *rp = x->rp;
    const fa_dtype dt = rp->dtype;
    const int64_t d = rp->head_dim, n = x->s.len_k, b = x->b, h = x->h, i = x->i;
    const int64_t hkv = h / (rp->heads_q / rp->heads_kv), tq = x->s.tok_q, tk = x->s.tok_k;
    double *qrow = buf, *o = qrow + d, *no = o + d, *dorow = no + d, *dq = dorow + d, *ndq = dq + d, *mo = ndq + d;
    double *mdq = mo + d, *p = mdq + d, *tv = p + n, *np = tv + n, *ntv = np + n, *dp = ntv + n, *ndp = dp + n;

    for (int64_t c = 0; c < d; c++) qrow[c] = load(pr, &pr->q, b, tq, i, h, c);
    const double max = row_scores(x, h, i, 0, qrow, p, tv), nmax = row_scores(x, h, i, 1, qrow, np, ntv);
    double lse = -INFINITY, nlse = -INFINITY;
    if (max > -INFINITY) {
        double sum = 0.0;
        for (int64_t j = 0; j < n; j++) sum += (p[j] = exp(p[j] - max));
        for (int64_t j = 0; j < n; j++) p[j] /= sum;
        lse = max + log(sum);
    } else {
        for (int64_t j = 0; j < n; j++) p[j] = 0.0;
    }
    if (nmax > -INFINITY) {
        float sum = 0.0f;
        for (int64_t j = 0; j < n; j++) sum += (float)(np[j] = expf((float)np[j] - (float)nmax));
        for (int64_t j = 0; j < n; j++) np[j] = round_to(dt, (float)np[j] / sum);
        nlse = (float)nmax + logf(sum);
    } else {
        for (int64_t j = 0; j < n; j++) np[j] = 0.0;
    }

    for (int64_t c = 0; c < d; c++) o[c] = no[c] = mo[c] = 0.0;
    for (int64_t j = 0; j < n; j++) {
        if (p[j] == 0.0 && np[j] == 0.0) continue;
        for (int64_t c = 0; c < d; c++) {
            const double vjc = load(pr, &pr->v, b, tk, j, hkv, c);
            o[c] += p[j] * vjc;
            mo[c] += p[j] * fabs(vjc);
            no[c] = (float)no[c] + (float)np[j] * (float)vjc;
        }
    }
    for (int64_t c = 0; c < d; c++)
        acc_add(&out->e[VF_O], load(pr, &pr->o, b, tq, i, h, c), round_to(fa_out_dtype(rp), (float)no[c]), o[c], mo[c]);
    acc_add(&out->e[VF_LSE], pr->lse[fa_lse_index(&pr->p, b, tq, i, h)], nlse, lse, 0.0);
    if (isfinite(lse) && fabs(lse) > out->max_lse) out->max_lse = fabs(lse);
    if (!backward) return;

    /* dP_ij = dO_i . V_j; D_i = sum_j P_ij dP_ij (naive: dP rounded, sums in fp32) */
    double D = 0.0;
    float nD = 0.0f;
    for (int64_t c = 0; c < d; c++) dorow[c] = load(pr, &pr->dout, b, tq, i, h, c), dq[c] = ndq[c] = mdq[c] = 0.0;
    for (int64_t j = 0; j < n; j++) {
        double e = 0.0;
        float ne = 0.0f;
        for (int64_t c = 0; c < d; c++) {
            const double vjc = load(pr, &pr->v, b, tk, j, hkv, c);
            e += dorow[c] * vjc;
            ne += (float)dorow[c] * (float)vjc;
        }
        dp[j] = e;
        ndp[j] = round_to(dt, ne);
        D += p[j] * dp[j];
        nD += (float)np[j] * (float)ndp[j];
    }
    for (int64_t j = 0; j < n; j++) {
        if (p[j] == 0.0 && np[j] == 0.0) continue;
        const double capd = rp->softcap > 0 ? 1.0 - tv[j] * tv[j] : 1.0;
        const double ds = rp->softmax_scale * p[j] * (dp[j] - D) * capd;
        const double w = rp->softmax_scale * p[j] * (fabs(dp[j]) + fabs(D)) * capd;
        float nds = (float)np[j] * ((float)ndp[j] - nD);
        if (rp->softcap > 0) nds *= 1.0f - (float)ntv[j] * (float)ntv[j];
        nds = rp->softmax_scale * round_to(dt, nds);
        for (int64_t c = 0; c < d; c++) {
            const double kjc = load(pr, &pr->k, b, tk, j, hkv, c);
            dq[c] += ds * kjc;
            mdq[c] += w * fabs(kjc);
            ndq[c] = (float)ndq[c] + nds * (float)kjc;
        }
    }
    for (int64_t c = 0; c < d; c++)
        acc_add(&out->e[VF_DQ], load(pr, &pr->dq, b, tq, i, h, c), round_to(dt, (float)ndq[c]), dq[c], mdq[c]);
}

/* One sampled key row j (= x->i) of kv head x->h: dK and dV, using the backend's O and LSE. */
static void check_key_row(const row_ctx *x, double *buf, row_errs *out) {
    const vf_problem *pr = x->pr;
    const fa_params *rp = x->rp;
    const fa_dtype dt = rp->dtype;
    const int64_t d = rp->head_dim, b = x->b, hkv = x->h, j = x->i, group = rp->heads_q / rp->heads_kv;
    double *kj = buf, *vj = kj + d, *dk = vj + d, *dv = dk + d, *ndk = dv + d, *ndv = ndk + d, *hdk = ndv + d,
           *hdv = hdk + d, *mdk = hdv + d, *mdv = mdk + d;
    for (int64_t c = 0; c < d; c++) {
        kj[c] = load(pr, &pr->k, b, x->s.tok_k, j, hkv, c);
        vj[c] = load(pr, &pr->v, b, x->s.tok_k, j, hkv, c);
        dk[c] = dv[c] = ndk[c] = ndv[c] = mdk[c] = mdv[c] = 0.0;
    }
    for (int64_t g = 0; g < group; g++) {
        const int64_t h = hkv * group + g;
        const double slope = fa_alibi_slope(rp, b, h);
        for (int64_t c = 0; c < d; c++) hdk[c] = hdv[c] = 0.0;
        for (int64_t i = 0; i < x->s.len_q; i++) {
            if (!fa_key_visible(i, j, x->s.len_q, x->s.len_k, rp->window_left, rp->window_right)) continue;
            const float l = pr->lse[fa_lse_index(&pr->p, b, x->s.tok_q, i, h)];
            if (!(l > -INFINITY)) continue;
            if (isfinite(l) && fabs(l) > out->max_lse) out->max_lse = fabs(l);
            double acc = 0.0, dpv = 0.0, D = 0.0;
            float nacc = 0.0f, ndpv = 0.0f, nD = 0.0f;
            for (int64_t c = 0; c < d; c++) {
                double qc = load(pr, &pr->q, b, x->s.tok_q, i, h, c), doc = load(pr, &pr->dout, b, x->s.tok_q, i, h, c);
                double oc = load(pr, &pr->o, b, x->s.tok_q, i, h, c);
                acc += qc * kj[c], nacc += (float)qc * (float)kj[c];
                dpv += doc * vj[c], ndpv += (float)doc * (float)vj[c];
                D += doc * oc, nD += (float)doc * (float)oc;
            }
            double s = rp->softmax_scale * acc, t = 0.0;
            float ns = rp->softmax_scale * nacc, nt = 0.0f;
            if (rp->softcap > 0) {
                t = tanh(s / rp->softcap), s = rp->softcap * t;
                nt = tanhf(ns / rp->softcap), ns = rp->softcap * nt;
            }
            const double dist = (double)fa_alibi_distance(i, j, x->s.len_q, x->s.len_k);
            s -= slope * dist;
            ns -= (float)slope * (float)dist;
            const double P = exp(s - (double)l), capd = rp->softcap > 0 ? 1.0 - t * t : 1.0;
            const float nP = round_to(dt, expf(ns - l));
            const double ds = P * (dpv - D) * capd * rp->softmax_scale;
            const double w = P * (fabs(dpv) + fabs(D)) * capd * rp->softmax_scale;
            float nds = nP * (round_to(dt, ndpv) - nD);
            if (rp->softcap > 0) nds *= 1.0f - nt * nt;
            nds = rp->softmax_scale * round_to(dt, nds);
            for (int64_t c = 0; c < d; c++) {
                double qc = load(pr, &pr->q, b, x->s.tok_q, i, h, c), doc = load(pr, &pr->dout, b, x->s.tok_q, i, h, c);
                dk[c] += ds * qc;
                dv[c] += P * doc;
                mdk[c] += w * fabs(qc);
                mdv[c] += P * fabs(doc);
                hdk[c] = (float)hdk[c] + nds * (float)qc;
                hdv[c] = (float)hdv[c] + nP * (float)doc;
            }
        }
        for (int64_t c = 0; c < d; c++) {
            ndk[c] = (float)ndk[c] + round_to(dt, (float)hdk[c]);
            ndv[c] = (float)ndv[c] + round_to(dt, (float)hdv[c]);
        }
    }
    for (int64_t c = 0; c < d; c++) {
        acc_add(&out->e[VF_DK], load(pr, &pr->dk, b, x->s.tok_k, j, hkv, c), round_to(dt, (float)ndk[c]), dk[c],
                mdk[c]);
        acc_add(&out->e[VF_DV], load(pr, &pr->dv, b, x->s.tok_k, j, hkv, c), round_to(dt, (float)ndv[c]), dv[c],
                mdv[c]);
    }
}

/* Picks up to n distinct rows out of `total` (all when n >= total), always including the first and last. */
static int64_t sample_rows(vf_rng *rng, int64_t total, int64_t n, int64_t *out) {
    if (total <= 0) return 0;
    if (n >= total) {
        for (int64_t r = 0; r < total; r++) out[r] = r;
        return total;
    }
    int64_t m = 0;
    out[m++] = 0;
    if (n > 1) out[m++] = total - 1;
    while (m < n) {
        int64_t r = vf_rng_range(rng, 1, total - 2), dup = 0;
        for (int64_t t = 0; t < m && !dup; t++) dup = out[t] == r;
        if (!dup) out[m++] = r;
    }
    return m;
}

/* Maps a flat row index over (b, token, head) - dense or varlen - to (b, row, head). */
static row_ctx locate(const vf_problem *pr, const fa_params *rp, int query, int64_t flat) {
    row_ctx x;
    x.pr = pr;
    x.rp = rp;
    const int64_t heads = query ? rp->heads_q : rp->heads_kv, tok = flat / heads;
    x.h = flat % heads;
    if (!pr->cfg.varlen) {
        const int64_t len = query ? rp->seqlen_q : rp->seqlen_k;
        x.b = tok / len;
        x.i = tok % len;
    } else {
        const int32_t *cu = query ? pr->cu_q : pr->cu_k;
        int64_t b = 0;
        while (cu[b + 1] <= tok) b++;
        x.b = b;
        x.i = tok - cu[b];
    }
    x.s = fa_seq_get(&pr->p, x.b);
    return x;
}

fa_status vf_compare_sampled(vf_problem *pr, int backward, int64_t rows, vf_report *rep) {
    memset(rep, 0, sizeof *rep);
    rep->ok = 1;
    const fa_params rp = resolved_params(pr);
    const int64_t d = rp.head_dim;
    const int64_t nq = valid_rows(pr, &pr->q), nk = valid_rows(pr, &pr->k);
    const int64_t maxlk = max_len_k(&rp) + 1;
    if (rows > (nq > nk ? nq : nk)) rows = nq > nk ? nq : nk;
    if (rows < 1) rows = 1;
    int64_t *qs = malloc(sizeof(int64_t) * (size_t)(rows + 2)), *ks = malloc(sizeof(int64_t) * (size_t)(rows + 2));
    row_errs *qe = calloc((size_t)rows + 2, sizeof(row_errs)), *ke = calloc((size_t)rows + 2, sizeof(row_errs));
    if (!qs || !ks || !qe || !ke) {
        free(qs), free(ks), free(qe), free(ke);
        return FA_ERR_OUT_OF_MEMORY;
    }
    vf_rng rng;
    vf_rng_seed(&rng, stream_seed(pr->cfg.seed, 104, 0));
    const int64_t mq = sample_rows(&rng, nq, rows, qs), mk = backward ? sample_rows(&rng, nk, rows, ks) : 0;
    int oom = 0;
    VF_PARALLEL_FOR
    for (int64_t r = 0; r < mq + mk; r++) {
        double *buf = malloc(sizeof(double) * (size_t)(10 * d + 6 * maxlk)); /* check_*_row's arrays */
        if (!buf) {
            oom = 1;
            continue;
        }
        if (r < mq) {
            row_ctx x = locate(pr, &rp, 1, qs[r]);
            check_query_row(&x, backward, buf, &qe[r]);
        } else {
            row_ctx x = locate(pr, &rp, 0, ks[r - mq]);
            check_key_row(&x, buf, &ke[r - mq]);
        }
        free(buf);
    }
    double max_lse = 0.0;
    for (int64_t r = 0; r < mq; r++) max_lse = qe[r].max_lse > max_lse ? qe[r].max_lse : max_lse;
    for (int64_t r = 0; r < mk; r++) max_lse = ke[r].max_lse > max_lse ? ke[r].max_lse : max_lse;
    const double logit_scale = max_lse + score_magnitude(pr);
    for (int w = 0; w < VF_NUM_OUTPUTS; w++) {
        if (w >= VF_DQ && !backward) break;
        err_acc a = { 0 };
        for (int64_t r = 0; r < mq; r++) acc_merge(&a, &qe[r].e[w]);
        for (int64_t r = 0; r < mk; r++) acc_merge(&a, &ke[r].e[w]);
        finish(rep, (vf_output)w, rp.dtype, &a, logit_scale);
    }
    rep->rows_q = mq;
    rep->rows_k = mk;
    free(qs), free(ks), free(qe), free(ke);
    return oom ? FA_ERR_OUT_OF_MEMORY : FA_OK;
}

/* ---------------------------------------------------------------------------------------------------------
 * Reports
 * ------------------------------------------------------------------------------------------------------- */

void vf_report_print(FILE *f, const vf_report *rep, const char *indent) {
    for (int w = 0; w < VF_NUM_OUTPUTS; w++) {
        if (!rep->have[w]) continue;
        const vf_error *e = &rep->err[w];
        fprintf(f, "%s%-4s max err %.2e  naive %.2e  tol %.2e  rel %.2e  %s\n", indent ? indent : "",
                vf_output_names[w], e->max_abs, e->naive, e->tol, e->rel, e->ok ? "ok" : "FAIL");
    }
}

char *vf_report_brief(const vf_report *rep, char *buf, size_t size) {
    size_t n = 0;
    buf[0] = '\0';
    for (int w = 0; w < VF_NUM_OUTPUTS && n < size; w++) {
        if (!rep->have[w]) continue;
        const vf_error *e = &rep->err[w];
        int k = snprintf(buf + n, size - n, "%s%s %.1e/%.1e%s", n ? " " : "", vf_output_names[w], e->max_abs, e->tol,
                         e->ok ? "" : "!");
        if (k < 0) break;
        n += (size_t)k;
    }
    return buf;
}

/* ---------------------------------------------------------------------------------------------------------
 * Timing
 * ------------------------------------------------------------------------------------------------------- */

double vf_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

double vf_flops(const vf_problem *pr, int backward) {
    double f = fa_flops_fwd(&pr->p, pr->cu_q, pr->cu_k);
    return backward ? 2.5 * f : f;
}

static int cmp_double(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* Times one call: CUDA events on the call's stream, after flushing L2 with a memset, for the device
 * backends; the monotonic clock otherwise. */
typedef struct call_timer {
    int dev;
    double t0;
#ifdef FA_WITH_CUDA
    void *flush;
    size_t flush_bytes;
    cudaEvent_t ev0, ev1;
    cudaStream_t stream;
#endif
} call_timer;

static void timer_init(call_timer *t, int dev, void *stream) {
    memset(t, 0, sizeof *t);
    t->dev = dev;
#ifdef FA_WITH_CUDA
    if (!dev) return;
    int device = 0, l2 = 0;
    t->stream = (cudaStream_t)stream;
    cudaGetDevice(&device);
    cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device);
    t->flush_bytes = (size_t)(l2 > 0 ? l2 : 64 << 20) * 2;
    if (cudaMalloc(&t->flush, t->flush_bytes) != cudaSuccess) t->flush = NULL, cudaGetLastError();
    cudaEventCreate(&t->ev0);
    cudaEventCreate(&t->ev1);
#else
    (void)stream;
#endif
}

static void timer_start(call_timer *t, int round) {
#ifdef FA_WITH_CUDA
    if (t->dev) {
        if (t->flush) cudaMemsetAsync(t->flush, round & 0xff, t->flush_bytes, t->stream);
        cudaEventRecord(t->ev0, t->stream);
        return;
    }
#endif
    (void)round;
    t->t0 = vf_seconds();
}

static fa_status timer_stop(vf_problem *pr, call_timer *t, double *ms) {
#ifdef FA_WITH_CUDA
    if (t->dev) {
        float f = 0;
        cudaEventRecord(t->ev1, t->stream);
        fa_status st = cuda_result(pr, cudaEventSynchronize(t->ev1), "the timed call");
        cudaEventElapsedTime(&f, t->ev0, t->ev1);
        *ms = f;
        return st;
    }
#endif
    (void)pr;
    *ms = 1e3 * (vf_seconds() - t->t0);
    return FA_OK;
}

static void timer_free(call_timer *t) {
#ifdef FA_WITH_CUDA
    if (!t->dev) return;
    cudaFree(t->flush);
    cudaEventDestroy(t->ev0);
    cudaEventDestroy(t->ev1);
#else
    (void)t;
#endif
}

fa_status vf_time(vf_problem *pr, const fa_exec *exec, int backward, int warmup, int repeats, double *median_ms) {
    fa_exec x = exec_or_default(exec);
    *median_ms = NAN;
    if (repeats < 1) repeats = 1;
    /* the backward reads the forward's o and lse: produce them on this backend first */
    fa_status st = backward ? vf_run(pr, &x, 0) : FA_OK;
    if (st != FA_OK) return st;
    const fa_params *p = vf_params_for(pr, x.backend);
    if (!p) return FA_ERR_DEVICE;
    const int dev = uses_device(pr, x.backend);
#ifdef FA_WITH_CUDA
    if (dev && (st = upload(pr, backward)) != FA_OK) return st;
#endif
    const int own_workspace = !x.workspace;
    if (own_workspace && (st = workspace_alloc(pr, p, &x, backward)) != FA_OK) return st;
    double *ms = malloc(sizeof(double) * (size_t)repeats);
    if (!ms) {
        if (own_workspace) workspace_free(pr, &x);
        return FA_ERR_OUT_OF_MEMORY;
    }
    call_timer timer;
    timer_init(&timer, dev, x.stream);
    for (int r = 0; r < warmup + repeats && st == FA_OK; r++) {
        double t = 0;
        timer_start(&timer, r);
        st = backward ? fa_bwd(p, &x) : fa_fwd(p, &x);
        fa_status done = timer_stop(pr, &timer, &t);
        if (st == FA_OK) st = done;
        if (r >= warmup) ms[r - warmup] = t;
    }
    timer_free(&timer);
    if (st == FA_OK) {
        qsort(ms, (size_t)repeats, sizeof(double), cmp_double);
        *median_ms = repeats % 2 ? ms[repeats / 2] : 0.5 * (ms[repeats / 2 - 1] + ms[repeats / 2]);
    }
    free(ms);
    if (own_workspace) workspace_free(pr, &x);
    return st;
}
