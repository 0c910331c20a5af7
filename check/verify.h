/* SPDX-License-Identifier: Apache-2.0 */
/*
 * verify.h - building attention problems and checking a backend's answers: the check library
 * (libflashattn_check.a) that the flashattn CLI, the test programs and the fuzzer link.
 *
 * A problem is a set of host tensors for one shape and option set (dense or varlen, any layout), filled with
 * random numbers from a seed, with NaN in every element that is not part of the problem (stride gaps, rows
 * past the last sequence of a varlen batch). vf_run() runs the forward or backward on any backend, copying
 * to and from the GPU for the CUDA and naive backends, after poisoning every output with a NaN pattern;
 * vf_check_written() then finds outputs that were not written, or written where they should not be.
 *
 * vf_compare() measures each output (O, LSE, dQ, dK, dV) against the fp64 reference and applies the
 * tolerance rule (see vf_tolerance in verify.c): error <= 2 x the error of a naive implementation in the same
 * dtype + a small floor. vf_compare_sampled() does the same on a sample of rows, for problems too large for
 * a full reference.
 */
#ifndef FLASHATTN_CHECK_VERIFY_H
#define FLASHATTN_CHECK_VERIFY_H

#include <stdint.h>
#include <stdio.h>

#include "flashattn.h"

/* ---- random numbers: xoshiro256** seeded through splitmix64 ---- */

typedef struct vf_rng {
    uint64_t s[4];
} vf_rng;

void vf_rng_seed(vf_rng *r, uint64_t seed);
uint64_t vf_rng_next(vf_rng *r);
double vf_rng_uniform(vf_rng *r);                        /* [0, 1) */
double vf_rng_normal(vf_rng *r);                         /* N(0, 1) */
int64_t vf_rng_range(vf_rng *r, int64_t lo, int64_t hi); /* uniform in [lo, hi] */

/* ---- problem description ---- */

typedef enum vf_layout {
    VF_LAYOUT_BSHD = 0,     /* contiguous (batch, seqlen, heads, head_dim) */
    VF_LAYOUT_BHSD = 1,     /* heads outside seqlen: (batch, heads, seqlen, head_dim) memory order */
    VF_LAYOUT_PADDED = 2,   /* BSHD with gaps after each head, row and batch entry (multiples of 8) */
    VF_LAYOUT_MIXED = 3,    /* each tensor picks one of the three above at random */
    VF_LAYOUT_UNALIGNED = 4 /* gaps of odd sizes: rows not 16-byte aligned */
} vf_layout;

typedef enum vf_alibi {
    VF_ALIBI_OFF = 0,
    VF_ALIBI_HEADS = 1,      /* slopes (heads_q) */
    VF_ALIBI_BATCH_HEADS = 2 /* slopes (batch, heads_q) */
} vf_alibi;

typedef struct vf_config {
    fa_dtype dtype;
    int32_t batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim;
    float scale; /* 0: the library's default 1/sqrt(head_dim) */
    int32_t causal, window_left, window_right;
    float softcap;
    vf_alibi alibi;
    int32_t deterministic;

    /* FA_E4M3 inputs: o's dtype (default FA_BF16); q, k, v hold values / descale rounded to e4m3, with a
     * descale per (batch entry, head, descale_block rows; 0 = the whole sequence), chosen so the values use
     * e4m3's range (per-block descales spread over a factor of 16, so that one applied to the wrong block
     * shows); no_descale leaves the descales NULL (values rounded to e4m3 as they are). */
    fa_dtype out_dtype;
    int32_t descale_block;
    int no_descale;

    /* Varlen: random lengths in [0, seqlen] per sequence; with edge_lengths the first sequences get the
     * lengths (q, k) = (0, n), (n, 0), (1, n), (n, 1), (1, 1) while at least one random one remains.
     * lens_q / lens_k, when set, give the lengths explicitly (batch entries each). extra_tokens rows follow
     * the last sequence (padding of the packed tensors). */
    int varlen;
    int edge_lengths;
    const int32_t *lens_q, *lens_k;
    int32_t extra_tokens;

    vf_layout layout;
    int uniform;        /* inputs U(-1, 1) instead of N(0, 1) */
    double q_amplitude; /* q is multiplied by this (1 = none): logit stress */
    double k_ramp;      /* the key at position j of a sequence of n is multiplied by 1 + k_ramp * j / n (0 = none):
                           row maxima that grow along the keys, block after block */
    float pad_value;    /* what the elements outside the problem hold (default NaN) */
    int workspace;      /* vf_run passes an explicit workspace of fa_workspace_size() bytes; 2: at an address 4
                           bytes past an aligned one */
    uint64_t seed;
} vf_config;

/* Defaults: f32, 1 x 1 x 1 heads, seqlen 1, head_dim 64, no options, BSHD, N(0,1), NaN padding, seed 1. */
void vf_config_init(vf_config *c);

/* One line describing the shape and options ("b=2 h=8/2 s=17/127 d=64 bf16 causal varlen"). */
void vf_config_describe(const vf_config *c, char *buf, size_t size);

/* A tensor of the problem: the allocation (host, and device when mirrored) and its view. */
typedef struct vf_tensor {
    void *host;
    void *dev;
    int64_t elems;  /* allocation size in elements */
    int64_t tokens; /* dense: seqlen per batch entry; varlen: rows of the packed tensor */
    int32_t heads;
    int query;      /* 1 for q/o/dout/dq (heads_q, seqlen_q), 0 for k/v/dk/dv */
    fa_dtype dtype; /* of its elements: the problem's, o's out_dtype for FA_E4M3 inputs */
    int which;      /* 'q', 'k', 'v' (the descales that apply to e4m3 elements), 0 for the others */
    fa_tensor view; /* host view; data = host */
} vf_tensor;

typedef struct vf_expected vf_expected;

typedef struct vf_problem {
    vf_config cfg;
    fa_params p;  /* host pointers */
    fa_params dp; /* device pointers (valid when on_device) */
    int on_device;

    vf_tensor q, k, v, o, dout, dq, dk, dv;
    float *descale[3]; /* q, k, v descales of FA_E4M3 problems (NULL otherwise) */
    int64_t descale_count[3];
    float *d_descale[3]; /* their device copies (device backends) */
    float *lse, *d_lse;
    int64_t lse_elems;
    int32_t *cu_q, *cu_k, *d_cu_q, *d_cu_k; /* host / device, batch + 1 each (varlen only) */
    float *slopes, *d_slopes;
    int64_t slope_count;

    void *ws_base;       /* the allocation behind an explicit workspace */
    vf_expected *expect; /* cached reference and naive results */
    char error[256];
} vf_problem;

/* Allocates and fills a problem (host memory only; the device mirror is made on first use).
 * FA_ERR_OUT_OF_MEMORY, or FA_ERR_INVALID_ARGUMENT for sizes it cannot even allocate (non-positive
 * batch, heads or head_dim, negative lengths); the library judges everything else. */
fa_status vf_problem_create(vf_problem *pr, const vf_config *c);
void vf_problem_destroy(vf_problem *pr);

/* 1 for the backends that take device pointers (CUDA and naive). */
int vf_backend_on_device(fa_backend b);

/* The params a call on backend b must receive (host or device pointers); makes the device mirror when
 * needed and a GPU is present (NULL on failure, with pr->error set). Without a GPU the host params are
 * returned and the library reports why it cannot run there. */
const fa_params *vf_params_for(vf_problem *pr, fa_backend b);

/* Runs fa_fwd (backward = 0) or fa_bwd on exec's backend (AUTO counts as the host). Outputs are poisoned
 * first; inputs (and for the backward o and lse) are copied to the device when needed, outputs copied back.
 * Returns the library's status; FA_ERR_DEVICE for a failed copy (pr->error says which). */
fa_status vf_run(vf_problem *pr, const fa_exec *exec, int backward);

/* The byte size of each array of a decode call (fa_fwd_kvcache), for vf_run_kvcache; 0 for an array the call
 * does not have. rotary is the size of each of rotary_cos and rotary_sin. */
typedef struct vf_kvcache_bytes {
    size_t q, o, lse, k, v, k_cache, v_cache, rotary, alibi, seqlens, batch_idx, leftpad, block_table;
} vf_kvcache_bytes;

/* fa_fwd_kvcache on exec's backend with host arrays: run as given on the host backends; on a device backend
 * (where a GPU is present) every array is copied to the device, the call runs there, and o, lse and the two
 * caches are copied back over the host arrays. FA_ERR_DEVICE with why set when a copy fails; otherwise the
 * library's status (fa_last_error() says why). */
fa_status vf_run_kvcache(const fa_params *p, const fa_kvcache *kv, const fa_exec *exec, const vf_kvcache_bytes *n,
                         char *why, size_t size);

/* vf_run_kvcache, then on a device backend the cost of exec.check = 1: ms[1] and ms[0] get the time per call of
 * 50 calls in a row with and without it (the same arrays; the calls rewrite the same results), -1 elsewhere. */
fa_status vf_run_kvcache_timed(const fa_params *p, const fa_kvcache *kv, const fa_exec *exec, const vf_kvcache_bytes *n,
                               char *why, size_t size, double ms[2]);

/* Writes the poison pattern into the outputs of the forward (o, lse) or backward (dq, dk, dv), host only. */
void vf_poison_outputs(vf_problem *pr, int backward);

/* Fills the elements outside the problem of every input tensor (q, k, v, dout) with `value`, host only. */
void vf_set_padding(vf_problem *pr, float value);

/* Counts valid output elements that still hold the poison (unwritten) and elements outside the problem
 * that no longer hold it (overwritten). Rows past the last sequence of a varlen batch may be either. */
void vf_check_written(const vf_problem *pr, int backward, int64_t *unwritten, int64_t *overwritten);

/* The valid elements of the forward's outputs (o, lse) or the backward's (dq, dk, dv) as bytes, to compare
 * two runs bit for bit: vf_outputs_bytes says how large the buffer must be. */
size_t vf_outputs_bytes(const vf_problem *pr, int backward);
void vf_outputs_save(const vf_problem *pr, int backward, unsigned char *buf);

/* ---- comparison with the fp64 reference ---- */

typedef enum vf_output { VF_O = 0, VF_LSE, VF_DQ, VF_DK, VF_DV, VF_NUM_OUTPUTS } vf_output;

extern const char *const vf_output_names[VF_NUM_OUTPUTS]; /* "O", "LSE", "dQ", "dK", "dV" */

typedef struct vf_error {
    double max_abs;   /* max |backend - reference| over the compared elements (inf for NaN or a wrong inf) */
    double naive;     /* the same for the naive same-dtype implementation */
    double floor;     /* absolute floor of the tolerance */
    double tol;       /* 2 * naive + floor */
    double max_ref;   /* max |reference| over finite values */
    double magnitude; /* max over elements of the sum of |terms| (LSE: max |LSE|): the floor's scale */
    double rel;       /* max_abs / max_ref */
    int64_t checked;  /* elements compared */
    int ok;
} vf_error;

typedef struct vf_report {
    int have[VF_NUM_OUTPUTS];
    vf_error err[VF_NUM_OUTPUTS];
    int64_t rows_q, rows_k; /* sampled query / key rows (0 for a full comparison) */
    int ok;
} vf_report;

/* Compares the host outputs of the forward (O, LSE) or of both passes (backward = 1: also dQ, dK, dV)
 * with the fp64 reference of the whole problem; the reference and naive results are computed once per
 * problem and cached. FA_ERR_OUT_OF_MEMORY if they do not fit. */
fa_status vf_compare(vf_problem *pr, int backward, vf_report *rep);

/* Root mean square of pr's O (as the last run left it) minus the fp64 reference O of problem `ref`, which has
 * pr's geometry: pr itself, or a twin with other values (e.g. the unquantized inputs of an e4m3 problem). */
fa_status vf_rmse_o(vf_problem *pr, vf_problem *ref, double *rmse);

/* The same on up to `rows` sampled query rows (O, LSE, dQ) and `rows` sampled key rows (dK, dV), the
 * first and last rows of the problem always among them. The key-row gradients use the backend's own O and
 * LSE (the inputs of its backward; O and LSE are checked on the sampled rows), so the cost is
 * O(rows * seqlen * head_dim) instead of the full problem's. */
fa_status vf_compare_sampled(vf_problem *pr, int backward, int64_t rows, vf_report *rep);

/* Tolerance of one output: see the rule in verify.c. magnitude: max over elements of the sum of |terms|
 * (for LSE: max |LSE|); logit_scale: max |LSE| + scale * max |Q_i| * max |K_j|. */
double vf_tolerance(fa_dtype dtype, vf_output which, double naive_err, double magnitude, double logit_scale,
                    double *floor);

/* One line per compared output: "O    max err 1.2e-03  naive 9.1e-04  tol 2.3e-03  rel 1.1e-03  ok". */
void vf_report_print(FILE *f, const vf_report *rep, const char *indent);

/* Compact form for test tables: "O 1.2e-03/2.3e-03 LSE ..." (error / tolerance, "!" after a failure). */
char *vf_report_brief(const vf_report *rep, char *buf, size_t size);

/* ---- timing and FLOPs ---- */

/* fa_flops_fwd of the problem (host cu_seqlens for varlen); the backward counts 2.5x. */
double vf_flops(const vf_problem *pr, int backward);

/* Median milliseconds of `repeats` calls after `warmup` calls of the forward, or of the backward (after one
 * vf_run of the forward, for its o and lse). GPU: CUDA events around each call, with L2 flushed before it;
 * CPU: clock_gettime. The workspace is allocated once, outside the timing. Outputs are left as the last call
 * wrote them (on the device for the GPU backends). */
fa_status vf_time(vf_problem *pr, const fa_exec *exec, int backward, int warmup, int repeats, double *median_ms);

/* Seconds since an arbitrary start (CLOCK_MONOTONIC). */
double vf_seconds(void);

#endif /* FLASHATTN_CHECK_VERIFY_H */
