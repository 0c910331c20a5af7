/* SPDX-License-Identifier: Apache-2.0 */
/*
 * flashattn.h - exact attention (FlashAttention-2 / FlashAttention-3) as a C library.
 *
 * This is the only public header. It is C11, needs no CUDA headers, and is enough to use the library.
 *
 * What it computes (one query head h, one batch entry b):
 *
 *     S[i][j] = softmax_scale * dot(Q[i], K[j])            i < seqlen_q, j < seqlen_k
 *     S[i][j] = softcap * tanh(S[i][j] / softcap)          if softcap > 0
 *     S[i][j] = -inf                                       if key j is masked for query i (causal, window)
 *     S[i][j] -= slope[h] * |i + seqlen_k - seqlen_q - j|  if alibi_slopes != NULL
 *     LSE[i]  = log(sum_j exp(S[i][j]))                    natural log, fp32
 *     O[i]    = sum_j exp(S[i][j] - LSE[i]) * V[j]
 *
 * Masks are aligned bottom-right (as flash-attn >= 2.1, FA3, FlashInfer): query i "sits" at key position
 * i + seqlen_k - seqlen_q. With d = i + seqlen_k - seqlen_q, key j is visible when
 *
 *     (window_left  < 0 || j >= d - window_left) && (window_right < 0 || j <= d + window_right)
 *
 * and causal = 1 is window_right = 0 (it overrides window_right). For seqlen_q = 3, seqlen_k = 5, causal:
 *
 *         keys 0 1 2 3 4
 *     q0       x x x . .
 *     q1       x x x x .
 *     q2       x x x x x
 *
 * For seqlen_q = 5, seqlen_k = 3, causal, rows q0 and q1 see no key at all.
 *
 * A row that sees no key (fully masked, or seqlen_k = 0 in a varlen batch) gets O = 0, LSE = -inf and zero
 * gradients. (flash-attn 2.x writes LSE = +inf there; FA3, cuDNN and FlashInfer write -inf, as we do.)
 * Whether a row is empty is decided by the mask alone, never by the values.
 *
 * Non-finite values (every backend; where the device backends differ, it says so):
 *   - a NaN among a row's visible scores (from a NaN in Q or K, or NaN * 0 in Q.K) makes its O and LSE NaN;
 *   - a +Inf visible score makes its O and LSE NaN (IEEE softmax: Inf - Inf); a -Inf score is a key of
 *     weight 0, and a row whose visible scores are all -Inf is NaN (not empty);
 *   - scores are fp32 on the CPU and device backends and fp64 on the reference: where Q.K overflows fp32 the
 *     row is NaN, the reference's is right; such a row is never reported empty;
 *   - a NaN or Inf anywhere in a V row makes the whole O row NaN of every query that sees that key (its LSE
 *     stays as computed from the scores); rows that do not see the key are not affected. The device backends
 *     (CUDA, naive) multiply P by V as it is: the O columns where that V row is non-finite become NaN or +-Inf
 *     for the queries that see the key, and may become NaN for other queries of the same (batch, head) (a
 *     masked key's weight 0 times NaN or Inf in a tile product); empty rows stay O = 0;
 *   - softmax_scale and softcap must be finite (FA_ERR_INVALID_ARGUMENT otherwise), and so must ALiBi
 *     slopes on the host backends, which read them during validation (the device backends do not read them
 *     there: a non-finite slope makes the rows of its head NaN);
 *   - backward: the rows whose O, LSE or dO is NaN get NaN in dQ, and the keys they see NaN in dK and dV;
 *     the NaN may spread to more gradients of the same (batch, kv head) (a NaN times the zero weight of a
 *     masked key inside a block product), never to other batch entries or kv heads.
 *
 * GQA / MQA: query head h reads key/value head h / (heads_q / heads_kv); the backward sums dK and dV over
 * the query heads of a group.
 *
 * Tensors are (batch, seqlen, heads, head_dim) with arbitrary element strides for the first three
 * dimensions; head_dim is contiguous. In a varlen batch (cu_seqlens_q/k set) Q/K/V/O are packed
 * (total_tokens, heads, head_dim): row r of sequence b is token cu_seqlens[b] + r, and stride_batch is unused.
 *
 * Memory spaces: the CPU and reference backends take host pointers; the CUDA and naive backends take device
 * pointers for every array, cu_seqlens and alibi_slopes included. The library never frees what it is given.
 *
 * Memory checks (every backend, from the pointers' values): each pointer must be aligned to its elements (4
 * bytes for f32, lse, alibi_slopes and cu_seqlens, 2 for f16/bf16); a view whose last byte lies more than
 * INT64_MAX bytes past its start is refused; an output may share no byte with another output or with an
 * input, where an array's bytes are the whole range from its first to its last element (lse: the rows x
 * heads_q floats), so views interleaved in one buffer count as overlapping. Inputs may share memory (q, k
 * and v in one buffer, or even the same pointer).
 *
 * Errors: every call returns an fa_status. On failure nothing has been written to any output, and
 * fa_last_error() holds a message naming the offending field and value (per thread).
 *
 * Thread safety: calls are reentrant; concurrent calls on distinct outputs are safe.
 */
#ifndef FLASHATTN_H
#define FLASHATTN_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(_WIN32)
#define FA_API __declspec(dllexport)
#elif defined(__GNUC__)
#define FA_API __attribute__((visibility("default")))
#else
#define FA_API
#endif

#define FA_VERSION_MAJOR 0
#define FA_VERSION_MINOR 2
#define FA_VERSION_PATCH 0
#define FA_VERSION_NUMBER (FA_VERSION_MAJOR * 10000 + FA_VERSION_MINOR * 100 + FA_VERSION_PATCH)

/* ---------------------------------------------------------------------------------------------------------
 * Status codes
 * ------------------------------------------------------------------------------------------------------- */

typedef enum fa_status {
    FA_OK                      = 0,
    FA_ERR_INVALID_ARGUMENT    = 1, /* NULL pointer, bad size or stride, heads_q % heads_kv != 0, ... */
    FA_ERR_UNSUPPORTED         = 2, /* valid, but this backend does not implement it (head_dim, dtype, ...) */
    FA_ERR_NOT_COMPILED        = 3, /* the backend was not built into this library */
    FA_ERR_NO_DEVICE           = 4, /* the CUDA backend was asked for but no usable GPU is present */
    FA_ERR_WORKSPACE_TOO_SMALL = 5, /* workspace_bytes < fa_workspace_size() */
    FA_ERR_OUT_OF_MEMORY       = 6, /* host or device allocation failed */
    FA_ERR_DEVICE              = 7, /* a CUDA call or kernel launch failed */
    FA_ERR_INTERNAL            = 8  /* a bug in the library; please report it with fa_last_error() */
} fa_status;

/* Short static description of a status ("invalid argument"); never NULL, also for unknown values. */
FA_API const char *fa_strerror(fa_status status);

/* The enumerator's name ("FA_ERR_INVALID_ARGUMENT"); never NULL. */
FA_API const char *fa_status_name(fa_status status);

/* Detail of this thread's last failed call, e.g. "heads_q (12) is not a multiple of heads_kv (5)".
 * Empty string after a successful call. The pointer is valid until this thread's next library call. */
FA_API const char *fa_last_error(void);

/* ---------------------------------------------------------------------------------------------------------
 * Types
 * ------------------------------------------------------------------------------------------------------- */

typedef enum fa_dtype {
    FA_F32  = 0, /* float */
    FA_F16  = 1, /* IEEE half, stored as uint16_t */
    FA_BF16 = 2, /* bfloat16, stored as uint16_t */
    /* float8 e4m3 (OCP "e4m3fn": sign, 4 exponent bits of bias 7, 3 mantissa bits; no infinities, NaN =
     * 0x7f / 0xff; largest finite 448, smallest subnormal 2^-9), stored as uint8_t. Inputs of the forward
     * only: q, k and v are e4m3 with the fa_params descales, o is out_dtype (see fa_params). */
    FA_E4M3 = 3
} fa_dtype;

typedef enum fa_backend {
    FA_BACKEND_AUTO      = 0, /* CUDA if built, a GPU is present and q is device memory; else CPU */
    FA_BACKEND_CPU       = 1, /* FlashAttention-2 on the CPU (OpenMP, SIMD); host pointers */
    FA_BACKEND_CUDA      = 2, /* FlashAttention-2 kernels (sm_80+), FlashAttention-3 kernels on sm_90 */
    FA_BACKEND_REFERENCE = 3, /* fp64, materialises S and P; host pointers; slow, O(N^2) memory: the oracle */
    FA_BACKEND_NAIVE     = 4  /* "standard attention" on the GPU: S and P in device memory, cuBLAS GEMMs */
} fa_backend;

/* Which CUDA kernel family runs (FA_BACKEND_CUDA only). AUTO picks FA3 on compute capability 9.0 for the
 * shapes it supports and FA2 otherwise; the environment variable FLASHATTN_KERNEL=fa2|fa3 overrides AUTO. FA3
 * fails a forward it cannot run; a backward it cannot run (head dims other than 64, 128 and 256, softcap together
 * with ALiBi, tensors whose rows are not 16-byte aligned) runs FA2. FA2 runs FA2 in both directions. */
typedef enum fa_kernel {
    FA_KERNEL_AUTO = 0,
    FA_KERNEL_FA2  = 2,
    FA_KERNEL_FA3  = 3
} fa_kernel;

/* A view of a (batch, seqlen, heads, head_dim) tensor. Strides are in elements; head_dim is contiguous. */
typedef struct fa_tensor {
    void   *data;
    int64_t stride_batch; /* unused in a varlen batch */
    int64_t stride_seq;
    int64_t stride_head;
} fa_tensor;

/* The attention problem: sizes, options and data. Fill it with fa_params_init(), then set the tensors and
 * any options. The forward reads q, k, v and writes o and lse; the backward reads q, k, v, o, lse, dout and
 * writes dq, dk, dv. */
typedef struct fa_params {
    fa_dtype dtype;  /* of q, k, v, o, dout, dq, dk, dv (FA_E4M3: of q, k, v; o is out_dtype) */
    int32_t batch;
    int32_t seqlen_q; /* dense: the length; varlen: an upper bound on every sequence's length */
    int32_t seqlen_k;
    int32_t heads_q;
    int32_t heads_kv; /* heads_q must be a multiple of heads_kv */
    int32_t head_dim;

    /* Varlen: both NULL (dense) or both set, each batch + 1 int32 prefix sums starting at 0. total_q and
     * total_k are the number of token rows the packed tensors hold (>= cu_seqlens[batch]). The host backends
     * check the prefix sums against seqlen_q/k and total_q/k. The CUDA and naive backends read them in device
     * memory and, unless exec.check = 1, trust them (checking needs a synchronisation): the kernels index Q, K,
     * V, O, LSE and the gradients with them and size their grids by seqlen_q/k, so a prefix sum that breaks
     * these bounds reads and writes out of bounds. */
    const int32_t *cu_seqlens_q;
    const int32_t *cu_seqlens_k;
    int64_t total_q;
    int64_t total_k;

    float   softmax_scale; /* 0 means 1 / sqrt(head_dim) */
    int32_t causal;        /* 1: bottom-right causal mask (forces window_right = 0) */
    int32_t window_left;   /* sliding window, inclusive; -1 = unbounded */
    int32_t window_right;
    float   softcap;       /* > 0: S = softcap * tanh(S / softcap) before masks and ALiBi; 0 = off */

    /* ALiBi slopes, fp32: (heads_q) with alibi_batch_stride = 0, or (batch, heads_q) with stride heads_q.
     * Finite: the host backends refuse a NaN or Inf slope (FA_ERR_INVALID_ARGUMENT). */
    const float *alibi_slopes;
    int64_t alibi_batch_stride;

    /* Backward: 1 = bit-identical dq/dk/dv run to run (no order-dependent atomics), possibly slower. */
    int32_t deterministic;

    fa_tensor q, k, v, o;
    /* Row logsumexp, fp32, contiguous: (batch, heads_q, seqlen_q) dense, (heads_q, total_q) varlen.
     * The forward may take NULL (not written); the backward needs it. */
    float *lse;

    fa_tensor dout, dq, dk, dv; /* backward only */

    /* FP8 forward (dtype FA_E4M3; the backward, the KV-cache call and the naive backend refuse it). o is
     * out_dtype, FA_BF16 (fa_params_init's) or FA_F16; out_dtype is not read for the other dtypes.
     * Element x of q row r (of its sequence), head h, batch entry b stands for the value
     *     e4m3(x) * q_descale[(b * heads_q + h) * blocks_q + r / descale_block_q]
     * and likewise k and v with heads_kv, blocks_k and descale_block_k. A descale block is that many rows of
     * a sequence; 0 means one block, the whole sequence, so a descale per (batch entry, head): flash-attn's
     * (batch, heads) descales. blocks_q = ceil(seqlen_q / descale_block_q) (1 when 0), blocks_k likewise with
     * seqlen_k; in a varlen batch seqlen_q/k bound every sequence. fp32, contiguous; NULL means 1. The host
     * backends refuse a NaN, Inf or negative descale (the CUDA backend does not read them during validation).
     * The CUDA kernel takes descale_block_q in multiples of 64 and descale_block_k in multiples of 128 (or 0).
     * For the other dtypes the descales must be NULL. */
    fa_dtype out_dtype;
    const float *q_descale, *k_descale, *v_descale;
    int32_t descale_block_q, descale_block_k;
} fa_params;

/* Where and how a call runs. NULL in place of an fa_exec means all defaults (zero-initialised). */
typedef struct fa_exec {
    fa_backend backend;
    fa_kernel  kernel;
    int32_t    device;      /* CUDA device ordinal; -1 = the calling thread's current device */
    /* CPU threads; 0 = OpenMP's default. Capped at omp_get_thread_limit(), at 256 (or the processor count
     * if larger) and at the call's number of tasks (blocks of query rows or keys times heads). */
    int32_t    num_threads;
    void      *stream;      /* cudaStream_t; NULL = the legacy default stream */
    /* Scratch memory in the backend's memory space, at least fa_workspace_size() bytes, at any alignment (the
     * size includes the slack to align it), holding anything. NULL: the library allocates and frees it within
     * the call (with cudaMallocAsync on the stream for CUDA). */
    void  *workspace;
    size_t workspace_bytes;
    /* 1: the device backends (CUDA, naive) check what they otherwise trust in device memory: the varlen
     * cu_seqlens_q/k (start at 0, non-decreasing, each length <= seqlen_q/k, the last <= total_q/k), by a
     * pre-pass kernel on the stream during validation (fa_check, fa_workspace_size, fa_fwd, fa_bwd); and a
     * decode call's cache_seqlens, cache_batch_idx, cache_leftpad and block_table, copied back and checked as
     * the host backends check theirs (fa_fwd_kvcache and its check and workspace calls). A bad value is
     * FA_ERR_INVALID_ARGUMENT naming the array and index, with nothing written. The call waits for the
     * check's answer (a stream synchronisation), so it is slower and not CUDA-graph-safe: a stream being
     * captured is refused (FA_ERR_INVALID_ARGUMENT). 0 (the default): trusted, nothing waits. The host backends
     * always check (their arrays are host memory) and ignore it. The CLI sets it; the Python binding does with
     * FLASHATTN_DEBUG=1. */
    int32_t check;
} fa_exec;

/* ---------------------------------------------------------------------------------------------------------
 * Calls
 * ------------------------------------------------------------------------------------------------------- */

/* Zeroes *p and sets sizes and defaults: scale 0 (1/sqrt(head_dim)), no mask, windows -1, softcap 0,
 * dense, out_dtype FA_BF16, no descales. Tensors are left NULL. Returns FA_ERR_INVALID_ARGUMENT only for p == NULL. */
FA_API fa_status fa_params_init(fa_params *p, fa_dtype dtype, int32_t batch, int32_t seqlen_q, int32_t seqlen_k,
                                int32_t heads_q, int32_t heads_kv, int32_t head_dim);

/* A view of contiguous (batch, seqlen, heads, head_dim) memory, or (total, heads, head_dim) for varlen. */
FA_API fa_tensor fa_tensor_contiguous(void *data, int64_t seqlen, int32_t heads, int32_t head_dim);

/* Checks p against exec's backend without running anything: FA_OK, or the status the call would return
 * (invalid argument, unsupported, not compiled, no device) with fa_last_error() saying why.
 * backward = 0 checks the forward, 1 the backward. Pointers are checked for NULL, alignment and overlap (see
 * "Memory checks" above); the host backends also read cu_seqlens and alibi_slopes, and with exec.check = 1 the
 * device backends read cu_seqlens on the device (see fa_exec.check); nothing else is read. */
FA_API fa_status fa_check(const fa_params *p, const fa_exec *exec, int backward);

/* Bytes of workspace the forward (backward = 0) or backward (1) needs for p on exec's backend. */
FA_API fa_status fa_workspace_size(const fa_params *p, const fa_exec *exec, int backward, size_t *bytes);

/* Forward: writes o and (if not NULL) lse. Asynchronous on the CUDA stream for the CUDA backends. */
FA_API fa_status fa_fwd(const fa_params *p, const fa_exec *exec);

/* Backward by recomputation (Algorithm 2 of FlashAttention-2): reads q, k, v, o, lse, dout; writes dq, dk,
 * dv. lse must be the forward's. Asynchronous on the CUDA stream for the CUDA backends. */
FA_API fa_status fa_bwd(const fa_params *p, const fa_exec *exec);

/* ---------------------------------------------------------------------------------------------------------
 * Introspection
 * ------------------------------------------------------------------------------------------------------- */

/* FA_VERSION_NUMBER of the library that is linked; compare with the header's. */
FA_API int fa_version_number(void);

/* sizeof(fa_params) and sizeof(fa_exec) as compiled into the library (for bindings to check their mirror). */
FA_API size_t fa_params_sizeof(void);
FA_API size_t fa_exec_sizeof(void);

/* One line: version, backends built, CUDA version and architectures, OpenMP, SIMD width. Static string. */
FA_API const char *fa_build_info(void);

/* 1 if the backend was built into this library (AUTO, CPU and REFERENCE always are). */
FA_API int fa_backend_built(fa_backend backend);

typedef struct fa_device_info {
    char    name[256];
    int32_t ordinal;
    int32_t cc_major, cc_minor; /* compute capability */
    int32_t sm_count;
    int64_t memory_bytes;
} fa_device_info;

/* Number of CUDA devices usable by the library (0 if CUDA is not built or none is present; never fails). */
FA_API int fa_device_count(void);

/* Fills *info for device `ordinal`. FA_ERR_NO_DEVICE / FA_ERR_NOT_COMPILED when there is none. */
FA_API fa_status fa_device_get_info(int32_t ordinal, fa_device_info *info);

/* FLOPs of the forward by the FlashAttention-2 paper's formula (section 4.1), the one its benchmarks and
 * the peers' use: 4 * seqlen_q * seqlen_k * head_dim * heads_q per batch entry, halved when causal; windows
 * are not discounted. The backward counts 2.5x this. For a varlen batch pass the host copies of
 * cu_seqlens_q/k (the per-sequence lengths are summed); for a dense batch pass NULL. */
FA_API double fa_flops_fwd(const fa_params *p, const int32_t *host_cu_seqlens_q, const int32_t *host_cu_seqlens_k);

/* ---------------------------------------------------------------------------------------------------------
 * Decoding with a KV cache (flash-attn's flash_attn_with_kvcache)
 *
 * fa_fwd_kvcache attends q to the keys and values held in a cache, after optionally appending new tokens
 * to it in place. The fa_params describe q, o, lse, the sizes and the score options as for fa_fwd:
 *   - q, o: (batch, seqlen_q, heads_q, head_dim); lse (batch, heads_q, seqlen_q) or NULL;
 *   - k, v: the new tokens, (batch, seqlen_k, heads_kv, head_dim), so seqlen_k is seqlen_new; both NULL and
 *     seqlen_k = 0 when nothing is appended;
 *   - softmax_scale, causal, window_left/right, softcap, alibi_slopes as for fa_fwd; cu_seqlens must be
 *     NULL (every sequence has seqlen_q query rows).
 * Every tensor (q, o, the new tokens, the cache, rotary_cos/sin) has p->dtype.
 *
 * For sequence b, with L = cache_seqlens[b] (tokens already in the cache), P = cache_leftpad[b] and
 * N = seqlen_new:
 *   1. the new rows k[b, j], v[b, j] are written into the cache at rows L + j (through the page table when
 *      paged), k rotated first when rotary_cos is set;
 *   2. the attended keys are cache rows P .. L + N - 1 (seqlen_k of the formula at the top is L + N - P), so
 *      causal masks, windows and ALiBi are aligned bottom-right on that range: query i sits at key
 *      position i + (L + N - P) - seqlen_q.
 * Rotary embedding (rotary_cos != NULL): with c = cos[pos][t], s = sin[pos][t] for t < rotary_dim / 2,
 * the pair (x0, x1) = (x[2t], x[2t + 1]) when interleaved, (x[t], x[t + rotary_dim / 2]) otherwise, becomes
 * (x0 c - x1 s, x0 s + x1 c); dimensions from rotary_dim on are unchanged. The new key j is at position
 * L + j; query row i at L + i when causal or a window is set, else every query row at L (flash-attn's rule:
 * without a mask all of q is one position). Positions are absolute cache rows (the left padding counts).
 * The rotated new keys are what the cache receives, rounded to dtype, and the rotated q is rounded to dtype
 * too (as flash-attn's kernels do); the rotation runs in fp32 on the CPU backend, fp64 on the reference.
 *
 * Validation (FA_ERR_INVALID_ARGUMENT, naming the field): L + N <= the capacity (seqlen_cache, or
 * max_pages * page_size when paged), 0 <= P <= L, cache_batch_idx in [0, batch_cache), the block_table
 * entries of every page the call reads or writes in [0, num_pages), no cache row appended to by two
 * sequences (through cache_batch_idx or shared pages; all appends happen before any sequence attends),
 * rotary positions < rotary_seqlen, rotary_dim a multiple of 16 in [16, head_dim] (flash-attn's rule),
 * rotary only with new tokens (as flash-attn), cache_batch_idx only without a block_table (as flash-attn),
 * num_splits >= 0, no output (o, lse, the cache when appending) overlapping another array; on the host
 * backends the attended rows of the batch, and batch * seqlen_q * heads_q / heads_kv, within int32. On any
 * error nothing is written, the cache included.
 *
 * Backends: CPU and reference read the int32 arrays (cache_seqlens, cache_batch_idx, cache_leftpad,
 * block_table) from host memory during validation. The CUDA backend (f16/bf16, its compiled head dims, 16-byte
 * aligned tensors with strides in multiples of 8 elements) takes every array in device memory and trusts the
 * int32 arrays without reading them (checking would need a synchronising copy): the caller must keep them
 * within the bounds above; the host checks only what it can see (sizes, pointers, rotary_dim, num_splits).
 * Its call has no host synchronisation and no host read of device data, and allocates only when
 * exec.workspace is NULL, so it can be captured in a CUDA graph; the split count depends on the sizes and
 * the cache's capacity alone, so a graph stays valid as cache_seqlens change. The naive backend returns
 * FA_ERR_UNSUPPORTED.
 * ------------------------------------------------------------------------------------------------------- */

typedef struct fa_kvcache {
    /* The cache, dtype p->dtype, head_dim contiguous, written in place when new tokens are given:
     *   contiguous (block_table == NULL): (batch_cache, seqlen_cache, heads_kv, head_dim); stride_batch steps
     *     one cache sequence;
     *   paged (block_table != NULL): (num_pages, page_size, heads_kv, head_dim); stride_batch steps one page. */
    fa_tensor k_cache, v_cache;
    int32_t   batch_cache;  /* contiguous: sequences the cache holds (any number >= 1) */
    int32_t   seqlen_cache; /* contiguous: rows per sequence (the capacity) */

    /* Paged: block_table is (batch, max_pages) int32 with rows block_table_stride apart (0 means max_pages);
     * row r of sequence b is row r % page_size of page block_table[b][r / page_size]. Any page_size >= 1. */
    const int32_t *block_table;
    int64_t        block_table_stride;
    int32_t        max_pages;
    int32_t        num_pages;
    int32_t        page_size;

    /* Per sequence, int32 (batch) each, or NULL: tokens already in the cache (NULL: the whole capacity),
     * which cache sequence it uses (NULL: sequence b uses cache sequence b; contiguous cache only), the first
     * attended row (NULL: 0). */
    const int32_t *cache_seqlens;
    const int32_t *cache_batch_idx;
    const int32_t *cache_leftpad;

    /* Rotary embedding: both NULL (none) or both (rotary_seqlen, rotary_dim / 2) contiguous, dtype p->dtype. */
    const void *rotary_cos;
    const void *rotary_sin;
    int32_t     rotary_seqlen;
    int32_t     rotary_dim;
    int32_t     rotary_interleaved; /* 1: pairs (2t, 2t + 1) (flash-attn's default); 0: halves (t, t + dim/2) */

    /* Splits of the key range for a device kernel; 0 = its heuristic (none when the batch and heads already
     * fill the GPU). The CUDA backend takes an explicit count up to one split per key tile of the capacity (64
     * cache rows, 128 at head dim 64) and 128; the host backends ignore it. */
    int32_t num_splits;
} fa_kvcache;

/* Zeroes *kv and sets the contiguous cache's geometry; the caller sets k_cache, v_cache and the options.
 * FA_ERR_INVALID_ARGUMENT only for kv == NULL. */
FA_API fa_status fa_kvcache_init(fa_kvcache *kv, int32_t batch_cache, int32_t seqlen_cache);

/* Checks a decode call without running it (nothing is written): FA_OK or the status fa_fwd_kvcache would
 * return, with fa_last_error() saying why. The host backends read the int32 arrays. */
FA_API fa_status fa_check_kvcache(const fa_params *p, const fa_kvcache *kv, const fa_exec *exec);

/* Bytes of workspace fa_fwd_kvcache needs on exec's backend (the host backends read the int32 arrays). */
FA_API fa_status fa_workspace_size_kvcache(const fa_params *p, const fa_kvcache *kv, const fa_exec *exec,
                                           size_t *bytes);

/* Appends p's k, v (if set) to the cache and writes o and (if not NULL) lse. See above. */
FA_API fa_status fa_fwd_kvcache(const fa_params *p, const fa_kvcache *kv, const fa_exec *exec);

/* sizeof(fa_kvcache) as compiled into the library (for bindings to check their mirror). */
FA_API size_t fa_kvcache_sizeof(void);

/* ---------------------------------------------------------------------------------------------------------
 * FP8 helpers (host memory): preparing e4m3 inputs for fa_fwd
 * ------------------------------------------------------------------------------------------------------- */

/* A (batch, seqlen, heads, head_dim) tensor x of dtype FA_F32, FA_F16 or FA_BF16, or a packed varlen one
 * (cu_seqlens: batch + 1 prefix sums, seqlen >= every length, stride_batch unused; NULL = dense). */
typedef struct fa_rows {
    fa_tensor x;
    fa_dtype dtype;
    int32_t batch, seqlen, heads, head_dim;
    const int32_t *cu_seqlens;
} fa_rows;

/* Block quantization: for each (batch entry, head, block of `block` rows of the sequence; 0 = the whole
 * sequence), descale = max |x| / 448 (1 where the block is all zeros), and dst = e4m3(x / descale) (round to
 * nearest even; a NaN stays NaN). dst has src's sizes and its own strides (uint8_t elements, dtype ignored);
 * descale is (batch, heads, blocks) fp32, blocks = ceil(seqlen / block) (1 for 0): fa_params' q/k/v_descale
 * layout for descale_block = block; the blocks past a varlen sequence's end get 1. e4m3 has no infinity: a
 * NaN or Inf in x is refused (FA_ERR_INVALID_ARGUMENT naming its row), as is any bad field; then nothing is
 * written. */
FA_API fa_status fa_quantize_e4m3(const fa_rows *src, int32_t block, fa_tensor dst, float *descale);

/* Incoherent processing: every row x (head_dim elements) of the tensor becomes x D H / sqrt(n) in place, D a
 * diagonal of random signs drawn from `seed` (the same for every row), H the Walsh-Hadamard matrix of order n
 * applied to each n-element chunk of the row, n the largest power of two dividing head_dim (head_dim itself
 * for 64, 128 and 256). The transform is orthogonal: rotating q and k with one seed leaves every score q.k
 * unchanged (up to rounding to the dtype) while spreading outlier features over the row before quantization.
 * Sign j is - when the top bit of splitmix64(seed + j) is set (splitmix64: z = x + 0x9e3779b97f4a7c15, then
 * z = (z ^ z >> 30) * 0xbf58476d1ce4e5b9, z = (z ^ z >> 27) * 0x94d049bb133111eb, z ^ z >> 31). */
FA_API fa_status fa_hadamard_rotate(const fa_rows *x, uint64_t seed);

#ifdef __cplusplus
}
#endif

#endif /* FLASHATTN_H */
