/* SPDX-License-Identifier: Apache-2.0 */
/*
 * naive.cu - "standard attention" (section 2.2 of the FlashAttention-2 paper) on the GPU, the baseline the
 * paper compares against: S = Q K^T by cuBLAS into device memory (fp32), a softmax kernel writes P (input
 * dtype) and LSE, and O = P V by cuBLAS. The backward recomputes S, and with dP = dO V^T a kernel forms
 * dS = P * (dP - D) (D = rowsum(dO * O)); then dV = P^T dO, dK = dS^T Q (fp32 sums over a GQA group) and
 * dQ = dS K, all cuBLAS. The host loops over batch entries, query heads of a group, and chunks of heads that
 * fit the workspace; its cost is what materialising S and P costs.
 *
 * All matrices are row-major; cuBLAS sees them as column-major transposes (a row-major m x n matrix with row
 * stride ld is the column-major n x m matrix with leading dimension ld).
 */
#include <cublas_v2.h> /* types and constants only: the functions are looked up at run time (cublas_load) */
#include <dlfcn.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

#include "common.cuh"
#include "kernels.h"

/* Workspace budget for the S/P matrices of one chunk of heads; at least one head always runs. */
#define NAIVE_CHUNK_BYTES ((size_t)2 << 30)
#define NAIVE_ALIGN       256

static size_t align_up(size_t x) {
    return (x + NAIVE_ALIGN - 1) / NAIVE_ALIGN * NAIVE_ALIGN;
}

/* ---------------------------------------------------------------------------------------------------------
 * cuBLAS plumbing
 * ------------------------------------------------------------------------------------------------------- */

/* cuBLAS is opened with dlopen when the naive backend is first checked or run, not linked: libflashattn.so
 * then has no link-time dependency on it, and the CPU backends load on machines without the CUDA toolkit.
 * The soname is the major version of the headers this file was compiled with (cuBLAS keeps its ABI within
 * a major version). */
#define NAIVE_STR2(x) #x
#define NAIVE_STR(x)  NAIVE_STR2(x)
#define CUBLAS_SONAME "libcublas.so." NAIVE_STR(CUBLAS_VER_MAJOR)

/* The cuBLAS functions this file calls, by their exported names (cublas_v2.h maps cublasCreate and
 * cublasSetStream to the _v2 symbols). */
static struct {
    cublasStatus_t (*create)(cublasHandle_t *);
    cublasStatus_t (*destroy)(cublasHandle_t);
    cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
    cublasStatus_t (*gemm_strided_batched)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int,
                                           const void *, const void *, cudaDataType, int, long long, const void *,
                                           cudaDataType, int, long long, const void *, void *, cudaDataType, int,
                                           long long, int, cublasComputeType_t, cublasGemmAlgo_t);
    const char *(*status_string)(cublasStatus_t);
    const char *(*status_name)(cublasStatus_t);
} cublas;
static pthread_once_t cublas_once = PTHREAD_ONCE_INIT;
static char cublas_error[512]; /* why loading failed; empty once loaded */

static void cublas_load_once(void) {
    void *h = dlopen(CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *why = dlerror();
        snprintf(cublas_error, sizeof cublas_error,
                 "%s could not be loaded (%s): the naive backend needs cuBLAS %d (the CUDA toolkit's lib64, or "
                 "the nvidia-cublas pip package) on the library search path, e.g. in LD_LIBRARY_PATH",
                 CUBLAS_SONAME, why ? why : "dlopen failed", CUBLAS_VER_MAJOR);
        return;
    }
    static const char *const names[] = { "cublasCreate_v2",       "cublasDestroy_v2",
                                         "cublasSetStream_v2",    "cublasGemmStridedBatchedEx",
                                         "cublasGetStatusString", "cublasGetStatusName" };
    void *fns[sizeof names / sizeof names[0]];
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        if (!(fns[i] = dlsym(h, names[i]))) {
            snprintf(cublas_error, sizeof cublas_error, "%s was loaded but has no symbol %s", CUBLAS_SONAME, names[i]);
            dlclose(h);
            return;
        }
    }
    /* POSIX guarantees that a dlsym result converts to a function pointer; memcpy says so to C++ too. */
    memcpy(&cublas.create, &fns[0], sizeof fns[0]);
    memcpy(&cublas.destroy, &fns[1], sizeof fns[1]);
    memcpy(&cublas.set_stream, &fns[2], sizeof fns[2]);
    memcpy(&cublas.gemm_strided_batched, &fns[3], sizeof fns[3]);
    memcpy(&cublas.status_string, &fns[4], sizeof fns[4]);
    memcpy(&cublas.status_name, &fns[5], sizeof fns[5]);
    /* h is never closed: the handles and function pointers refer into it for the life of the process */
}

extern "C" fa_status fa_naive_cublas_load(void) {
    pthread_once(&cublas_once, cublas_load_once);
    return cublas_error[0] ? fa_fail(FA_ERR_NOT_COMPILED, "naive backend: %s", cublas_error) : FA_OK;
}

static fa_status cublas_status(cublasStatus_t s, const char *what) {
    if (s == CUBLAS_STATUS_SUCCESS) return FA_OK;
    fa_status st = s == CUBLAS_STATUS_ALLOC_FAILED                                        ? FA_ERR_OUT_OF_MEMORY
                   : s == CUBLAS_STATUS_INVALID_VALUE || s == CUBLAS_STATUS_NOT_SUPPORTED ? FA_ERR_UNSUPPORTED
                                                                                          : FA_ERR_DEVICE;
    return fa_fail(st, "%s: %s (%s)", what, cublas.status_string(s), cublas.status_name(s));
}

/* One handle per thread and device (handles must not be shared by concurrent threads), created at the thread's
 * first naive call on the device and destroyed when the thread ends (at exit for the main thread, before the
 * CUDA runtime's own teardown), with cuBLAS's workspace. */
#define NAIVE_MAX_DEVICES 64
struct naive_handle_set {
    cublasHandle_t h[NAIVE_MAX_DEVICES];
    ~naive_handle_set() {
        for (int d = 0; d < NAIVE_MAX_DEVICES; d++)
            if (h[d] && cudaSetDevice(d) == cudaSuccess) cublas.destroy(h[d]);
    }
};
static thread_local naive_handle_set naive_handles;

static fa_status naive_handle(const fa_cuda_device *dev, cudaStream_t stream, cublasHandle_t *h) {
    if (dev->ordinal >= NAIVE_MAX_DEVICES)
        return fa_fail(FA_ERR_UNSUPPORTED, "device ordinal %d >= %d", dev->ordinal, NAIVE_MAX_DEVICES);
    cublasHandle_t *slot = &naive_handles.h[dev->ordinal];
    fa_status st;
    if (!*slot && (st = cublas_status(cublas.create(slot), "cublasCreate")) != FA_OK) {
        *slot = NULL;
        return st;
    }
    *h = *slot;
    return cublas_status(cublas.set_stream(*h, stream), "cublasSetStream");
}

static cudaDataType_t cuda_type(fa_dtype t) {
    return t == FA_F16 ? CUDA_R_16F : t == FA_BF16 ? CUDA_R_16BF : CUDA_R_32F;
}

/* C (m x n, column-major) = alpha op(A) op(B) + beta C for `batch` matrices at the given element strides; fp32
 * accumulation. */
static fa_status gemm(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int64_t m, int64_t n, int64_t k,
                      const void *A, cudaDataType_t at, int64_t lda, int64_t sa, const void *B, cudaDataType_t bt,
                      int64_t ldb, int64_t sb, float beta, void *C, cudaDataType_t ct, int64_t ldc, int64_t sc,
                      int64_t batch) {
    const float one = 1.0f;
    if (m > INT32_MAX || n > INT32_MAX || k > INT32_MAX || lda > INT32_MAX || ldb > INT32_MAX || ldc > INT32_MAX ||
        batch > INT32_MAX)
        return fa_fail(FA_ERR_UNSUPPORTED, "naive backend: a matrix size or stride exceeds cuBLAS's int range");
    return cublas_status(cublas.gemm_strided_batched(h, ta, tb, (int)m, (int)n, (int)k, &one, A, at, (int)lda, sa, B,
                                                     bt, (int)ldb, sb, &beta, C, ct, (int)ldc, sc, (int)batch,
                                                     CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                         "cublasGemmStridedBatchedEx");
}

/* ---------------------------------------------------------------------------------------------------------
 * Kernels
 * ------------------------------------------------------------------------------------------------------- */

/* The f32 instantiations use float directly. */
template <>
struct fa_elem<float> {
    static __device__ __forceinline__ float to_float(float x) {
        return x;
    }
    static __device__ __forceinline__ float from_float(float x) {
        return x;
    }
};

/* One chunk of S/P: heads (hk0 + j) * group + r for j < nheads, rows i < len_q, keys < len_k, of batch entry b. */
typedef struct naive_rows {
    int64_t len_q, len_k;
    int32_t nheads, group, r, hk0, b;
    int64_t tok_q; /* first token of the sequence (varlen) */
    /* options */
    float scale, softcap;
    int32_t window_left, window_right;
    const float *alibi;
    int64_t alibi_batch_stride;
    /* lse: dense (batch, heads_q, seqlen_q), varlen (heads_q, total_q) */
    float *lse;
    int varlen;
    int32_t heads_q, seqlen_q;
    int64_t total_q;
} naive_rows;

static __device__ __forceinline__ int64_t naive_lse_index(const naive_rows &a, int h, int64_t i) {
    return a.varlen ? h * a.total_q + a.tok_q + i : ((int64_t)a.b * a.heads_q + h) * a.seqlen_q + i;
}

/* Whether key j is visible to query i. */
static __device__ __forceinline__ bool naive_visible(const naive_rows &a, int64_t i, int64_t j) {
    const int64_t diag = i + a.len_k - a.len_q;
    return (a.window_left < 0 || j >= diag - a.window_left) && (a.window_right < 0 || j <= diag + a.window_right);
}

/* The score of key j for query i from the raw dot product x (-inf when masked); *dscale gets d score / d x. */
static __device__ __forceinline__ float naive_score(const naive_rows &a, float slope, int64_t i, int64_t j, float x,
                                                    float *dscale) {
    const int64_t diag = i + a.len_k - a.len_q;
    float s = x * a.scale;
    float ds = a.scale;
    if (a.softcap > 0.0f) {
        const float t = tanhf(s / a.softcap);
        s = a.softcap * t;
        ds *= 1.0f - t * t;
    }
    if (a.alibi) s -= slope * fabsf((float)(diag - j));
    if (dscale) *dscale = ds;
    return naive_visible(a, i, j) ? s : -INFINITY;
}

static __device__ __forceinline__ float naive_block_reduce(float x, bool is_max, float *red) {
    x = is_max ? fa_warp_max(x) : fa_warp_sum(x);
    const int w = threadIdx.x / 32, nw = blockDim.x / 32;
    __syncthreads(); /* red is reused between calls */
    if (threadIdx.x % 32 == 0) red[w] = x;
    __syncthreads();
    x = red[0];
    for (int i = 1; i < nw; i++) x = is_max ? fmaxf(x, red[i]) : x + red[i];
    return x;
}

/* One block per row of the chunk: P = softmax(score) in T, LSE. */
template <typename T>
__global__ void naive_softmax_fwd(const float *S, T *P, naive_rows a) {
    __shared__ float red[32];
    const int64_t row = blockIdx.x;
    const int j_h = (int)(row / a.len_q);
    const int64_t i = row % a.len_q;
    const int h = (a.hk0 + j_h) * a.group + a.r;
    const float slope = a.alibi ? a.alibi[a.b * a.alibi_batch_stride + h] : 0.0f;
    const float *s = S + row * a.len_k;
    T *p = P + row * a.len_k;

    /* A row is empty (P = 0, LSE = -inf) when the mask leaves it no key. Otherwise a NaN score, which fmaxf
     * leaves out of the max, still reaches the sum (exp(NaN - mx)), as does +inf (inf - inf); when every visible
     * score is -inf, mx is -inf and exp(-inf - mx) is NaN: such rows come out NaN, never empty. */
    const bool seen = fa_row_sees_key(i, a.len_q, a.len_k, a.window_left, a.window_right);
    float mx = -INFINITY;
    for (int64_t j = threadIdx.x; j < a.len_k; j += blockDim.x) mx = fmaxf(mx, naive_score(a, slope, i, j, s[j], NULL));
    mx = naive_block_reduce(mx, true, red);
    float sum = 0.0f;
    if (seen)
        for (int64_t j = threadIdx.x; j < a.len_k; j += blockDim.x) {
            const float sc = naive_score(a, slope, i, j, s[j], NULL);
            if (naive_visible(a, i, j)) sum += expf(sc - mx);
        }
    sum = naive_block_reduce(sum, false, red);
    const float inv = sum > 0.0f ? 1.0f / sum : NAN;
    for (int64_t j = threadIdx.x; j < a.len_k; j += blockDim.x)
        p[j] = fa_elem<T>::from_float(
            seen && naive_visible(a, i, j) ? expf(naive_score(a, slope, i, j, s[j], NULL) - mx) * inv : 0.0f);
    if (a.lse && threadIdx.x == 0)
        a.lse[naive_lse_index(a, h, i)] = !seen ? -INFINITY : sum > 0.0f ? mx + logf(sum) : NAN;
}

/* Element-wise backward of the chunk: P = exp(score - LSE), dS = P (dP - D) d score / d x. S and dP are fp32,
 * D is (heads_q, rows) at d_off + token. */
template <typename T>
__global__ void naive_softmax_bwd(const float *S, const float *dP, const float *D, int64_t d_stride, int64_t d_off,
                                  T *P, T *dS, naive_rows a) {
    const int64_t row = blockIdx.x;
    const int j_h = (int)(row / a.len_q);
    const int64_t i = row % a.len_q;
    const int h = (a.hk0 + j_h) * a.group + a.r;
    const float slope = a.alibi ? a.alibi[a.b * a.alibi_batch_stride + h] : 0.0f;
    const float lse = a.lse[naive_lse_index(a, h, i)];
    const float di = D[h * d_stride + d_off + i];
    for (int64_t j = threadIdx.x; j < a.len_k; j += blockDim.x) {
        const int64_t e = row * a.len_k + j;
        float ds;
        const float sc = naive_score(a, slope, i, j, S[e], &ds);
        /* masked keys and empty rows (LSE -inf) get P = dS = 0 exactly (0 times a NaN in dP or D would be NaN) */
        const bool on = lse != -INFINITY && naive_visible(a, i, j);
        const float pv = on ? expf(sc - lse) : 0.0f;
        P[e] = fa_elem<T>::from_float(pv);
        dS[e] = fa_elem<T>::from_float(on ? pv * (dP[e] - di) * ds : 0.0f);
    }
}

/* A (rows, heads, head_dim) view of a tensor for one sequence: element (r, h, c) at base + r*row + h*head + c. */
typedef struct naive_view {
    void *base;
    int64_t row, head;
} naive_view;

/* D[h][d_off + r] = sum_c dO[r, h, c] * O[r, h, c] for rows r < rows; one warp per (row, head). */
template <typename T>
__global__ void naive_dot_do_o(naive_view dout, naive_view o, int64_t rows, int heads, int head_dim, float *D,
                               int64_t d_stride, int64_t d_off) {
    const int64_t w = ((int64_t)blockIdx.x * blockDim.x + threadIdx.x) / 32;
    if (w >= rows * heads) return;
    const int64_t r = w / heads;
    const int h = (int)(w % heads);
    const T *a = (const T *)dout.base + r * dout.row + h * dout.head;
    const T *b = (const T *)o.base + r * o.row + h * o.head;
    float s = 0.0f;
    for (int c = threadIdx.x % 32; c < head_dim; c += 32) s += fa_elem<T>::to_float(a[c]) * fa_elem<T>::to_float(b[c]);
    s = fa_warp_sum(s);
    if (threadIdx.x % 32 == 0) D[h * d_stride + d_off + r] = s;
}

/* out[r, h, c] = 0 for rows r < rows (all heads); lse of those rows -inf when lse is set. */
template <typename T>
__global__ void naive_zero_rows(naive_view out, int64_t rows, int heads, int head_dim, naive_rows a, int set_lse) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * heads * head_dim) return;
    const int64_t r = idx / ((int64_t)heads * head_dim);
    const int h = (int)(idx / head_dim % heads);
    const int c = (int)(idx % head_dim);
    ((T *)out.base)[r * out.row + h * out.head + c] = fa_elem<T>::from_float(0.0f);
    if (set_lse && a.lse && c == 0) a.lse[naive_lse_index(a, h, r)] = -INFINITY;
}

/* out[r, h, c] = acc[(r * heads + h) * head_dim + c] in T. */
template <typename T>
__global__ void naive_convert(const float *acc, naive_view out, int64_t rows, int heads, int head_dim) {
    const int64_t idx = (int64_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= rows * heads * head_dim) return;
    const int64_t r = idx / ((int64_t)heads * head_dim);
    const int h = (int)(idx / head_dim % heads);
    const int c = (int)(idx % head_dim);
    ((T *)out.base)[r * out.row + h * out.head + c] = fa_elem<T>::from_float(acc[idx]);
}

/* ---------------------------------------------------------------------------------------------------------
 * Host side
 * ------------------------------------------------------------------------------------------------------- */

static size_t esize(fa_dtype t) {
    return t == FA_F32 ? 4 : 2;
}

/* KV heads per chunk so that the per-head matrices of bytes_per_elem fit NAIVE_CHUNK_BYTES. */
static int64_t chunk_heads(const fa_params *p, size_t bytes_per_elem) {
    const double per_head = (double)p->seqlen_q * (double)p->seqlen_k * (double)bytes_per_elem;
    int64_t n = per_head > 0 ? (int64_t)((double)NAIVE_CHUNK_BYTES / per_head) : p->heads_kv;
    if (n < 1) n = 1;
    if (n > p->heads_kv) n = p->heads_kv;
    return n;
}

extern "C" fa_status naive_supported(const fa_params *p, const fa_cuda_device *dev, int backward) {
    (void)dev;
    const fa_tensor *ts[] = { &p->q, &p->k, &p->v, &p->o, &p->dout, &p->dq, &p->dk, &p->dv };
    const char *nm[] = { "q", "k", "v", "o", "dout", "dq", "dk", "dv" };
    for (int i = 0; i < (backward ? 8 : 4); i++) {
        const size_t align = esize(p->dtype);
        if ((uintptr_t)ts[i]->data % align)
            return fa_fail(FA_ERR_UNSUPPORTED, "naive backend: %s.data is not aligned to its element size", nm[i]);
        if (ts[i]->stride_seq < p->head_dim)
            return fa_fail(FA_ERR_UNSUPPORTED,
                           "naive backend: %s.stride_seq (%lld) < head_dim (%d): cuBLAS needs row "
                           "strides of at least one row",
                           nm[i], (long long)ts[i]->stride_seq, p->head_dim);
    }
    return fa_naive_cublas_load(); /* every check, workspace query and run passes here before cuBLAS is called */
}

/* Layout of the workspace; every size a multiple of NAIVE_ALIGN. */
typedef struct naive_ws {
    int64_t nh;           /* kv heads per chunk */
    size_t s, dp, pm, ds; /* S fp32, dP fp32, P and dS (dtype), per chunk */
    size_t d, dk, dv;     /* backward: D fp32 (heads_q, rows_q); dK/dV fp32 accumulators */
    size_t total;
} naive_ws;

static naive_ws naive_layout(const fa_params *p, int backward) {
    naive_ws w;
    const size_t es = esize(p->dtype);
    const size_t elems = (size_t)p->seqlen_q * (size_t)p->seqlen_k;
    memset(&w, 0, sizeof w);
    w.nh = chunk_heads(p, backward ? 8 + 2 * es : 4 + es);
    w.s = align_up(w.nh * elems * 4);
    w.pm = align_up(w.nh * elems * es);
    if (backward) {
        const int64_t rows_q = fa_is_varlen(p) ? p->total_q : (int64_t)p->batch * p->seqlen_q;
        const int64_t rows_k = fa_is_varlen(p) ? p->total_k : (int64_t)p->batch * p->seqlen_k;
        w.dp = align_up(w.nh * elems * 4);
        w.ds = align_up(w.nh * elems * es);
        w.d = align_up((size_t)p->heads_q * rows_q * 4);
        w.dk = w.dv = align_up((size_t)rows_k * p->heads_kv * p->head_dim * 4);
    }
    w.total = w.s + w.dp + w.pm + w.ds + w.d + w.dk + w.dv;
    return w;
}

extern "C" size_t naive_workspace_size(const fa_params *p, const fa_cuda_device *dev, int backward) {
    (void)dev;
    return naive_layout(p, backward).total;
}

/* Host copies of cu_seqlens (varlen), or NULL for a dense batch. */
static fa_status host_seqlens(const fa_params *p, cudaStream_t stream, int32_t **cq, int32_t **ck) {
    *cq = *ck = NULL;
    if (!fa_is_varlen(p)) return FA_OK;
    const size_t n = (size_t)(p->batch + 1);
    *cq = (int32_t *)malloc(2 * n * sizeof(int32_t));
    if (!*cq) return fa_fail(FA_ERR_OUT_OF_MEMORY, "naive backend: host copy of cu_seqlens");
    *ck = *cq + n;
    fa_status st = FA_OK;
    if ((st = fa_cuda_status(cudaMemcpyAsync(*cq, p->cu_seqlens_q, n * 4, cudaMemcpyDeviceToHost, stream),
                             "cu_seqlens_q copy")) ||
        (st = fa_cuda_status(cudaMemcpyAsync(*ck, p->cu_seqlens_k, n * 4, cudaMemcpyDeviceToHost, stream),
                             "cu_seqlens_k copy")) ||
        (st = fa_cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize"))) {
        free(*cq);
        *cq = *ck = NULL;
    }
    return st;
}

static naive_rows rows_base(const fa_params *p) {
    naive_rows a;
    memset(&a, 0, sizeof a);
    a.group = p->heads_q / p->heads_kv;
    a.scale = p->softmax_scale, a.softcap = p->softcap;
    a.window_left = p->window_left, a.window_right = p->window_right;
    a.alibi = p->alibi_slopes, a.alibi_batch_stride = p->alibi_batch_stride;
    a.lse = p->lse, a.varlen = fa_is_varlen(p);
    a.heads_q = p->heads_q, a.seqlen_q = p->seqlen_q, a.total_q = p->total_q;
    return a;
}

static fa_seq seq_of(const fa_params *p, const int32_t *cq, const int32_t *ck, int64_t b) {
    fa_seq s;
    if (cq) {
        s.tok_q = cq[b], s.tok_k = ck[b];
        s.len_q = cq[b + 1] - s.tok_q, s.len_k = ck[b + 1] - s.tok_k;
    } else {
        s.tok_q = s.tok_k = 0;
        s.len_q = p->seqlen_q, s.len_k = p->seqlen_k;
    }
    return s;
}

/* Query rows of a sequence that the mask leaves no key: the first len_q - len_k - window_right of them, where
 * the window's right edge falls before key 0 (its left edge never passes the last key, which the last query
 * sits on). Their O (forward) and dQ (backward) are zeroed after the products, in which a masked key's 0 times
 * a NaN would reach them. */
static int64_t empty_rows(const fa_params *p, const fa_seq *s) {
    if (p->window_right < 0) return s->len_k > 0 ? 0 : s->len_q;
    const int64_t n = s->len_q - s->len_k - p->window_right;
    return n < 0 ? 0 : n > s->len_q ? s->len_q : n;
}

/* Pointer to (sequence b, row 0, head h) of a tensor. */
static char *at(const fa_params *p, const fa_tensor *t, int64_t b, int64_t tok, int64_t h) {
    return (char *)t->data + fa_offset(p, t, b, tok, 0, h) * (int64_t)esize(p->dtype);
}

template <typename T>
static fa_status naive_fwd_typed(const fa_params *p, const fa_cuda_device *dev, void *workspace, cudaStream_t stream) {
    cublasHandle_t h;
    fa_status st = naive_handle(dev, stream, &h);
    if (st != FA_OK) return st;
    const naive_ws w = naive_layout(p, 0);
    float *S = (float *)workspace;
    T *P = (T *)((char *)workspace + w.s);
    const int g = p->heads_q / p->heads_kv, d = p->head_dim;
    const cudaDataType_t dt = cuda_type(p->dtype);
    int32_t *cq, *ck;
    if ((st = host_seqlens(p, stream, &cq, &ck)) != FA_OK) return st;

    naive_rows a = rows_base(p);
    for (int64_t b = 0; b < p->batch && st == FA_OK; b++) {
        const fa_seq s = seq_of(p, cq, ck, b);
        a.b = (int32_t)b, a.len_q = s.len_q, a.len_k = s.len_k, a.tok_q = s.tok_q;
        if (s.len_q == 0) continue;
        if (s.len_k == 0) { /* no keys: O = 0, LSE = -inf */
            naive_view out = { at(p, &p->o, b, s.tok_q, 0), p->o.stride_seq, p->o.stride_head };
            const int64_t n = s.len_q * p->heads_q * d;
            naive_zero_rows<T><<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(out, s.len_q, p->heads_q, d, a, 1);
            st = fa_cuda_status(cudaGetLastError(), "naive zero-rows launch");
            continue;
        }
        const int64_t mat = s.len_q * s.len_k;
        for (int r = 0; r < g && st == FA_OK; r++)
            for (int64_t hk0 = 0; hk0 < p->heads_kv && st == FA_OK; hk0 += w.nh) {
                const int64_t nh = hk0 + w.nh <= p->heads_kv ? w.nh : p->heads_kv - hk0;
                const int64_t hq = hk0 * g + r; /* first query head of the chunk */
                /* S^T (len_k x len_q, col-major) = K (d x len_k)^T Q (d x len_q) */
                st = gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, s.len_k, s.len_q, d, at(p, &p->k, b, s.tok_k, hk0), dt,
                          p->k.stride_seq, p->k.stride_head, at(p, &p->q, b, s.tok_q, hq), dt, p->q.stride_seq,
                          g * p->q.stride_head, 0.0f, S, CUDA_R_32F, s.len_k, mat, nh);
                if (st != FA_OK) break;
                a.nheads = (int32_t)nh, a.r = r, a.hk0 = (int32_t)hk0;
                naive_softmax_fwd<T><<<(unsigned)(nh * s.len_q), 256, 0, stream>>>(S, P, a);
                if ((st = fa_cuda_status(cudaGetLastError(), "naive softmax launch")) != FA_OK) break;
                /* O^T (d x len_q) = V^T (d x len_k) P^T (len_k x len_q) */
                st = gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, d, s.len_q, s.len_k, at(p, &p->v, b, s.tok_k, hk0), dt,
                          p->v.stride_seq, p->v.stride_head, P, dt, s.len_k, mat, 0.0f, at(p, &p->o, b, s.tok_q, hq),
                          dt, p->o.stride_seq, g * p->o.stride_head, nh);
            }
        const int64_t ne = empty_rows(p, &s);
        if (st == FA_OK && ne > 0) {
            naive_view out = { at(p, &p->o, b, s.tok_q, 0), p->o.stride_seq, p->o.stride_head };
            const int64_t n = ne * p->heads_q * d;
            naive_zero_rows<T><<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(out, ne, p->heads_q, d, a, 1);
            st = fa_cuda_status(cudaGetLastError(), "naive zero-rows launch");
        }
    }
    free(cq);
    return st;
}

template <typename T>
static fa_status naive_bwd_typed(const fa_params *p, const fa_cuda_device *dev, void *workspace, cudaStream_t stream) {
    cublasHandle_t h;
    fa_status st = naive_handle(dev, stream, &h);
    if (st != FA_OK) return st;
    const naive_ws w = naive_layout(p, 1);
    char *ws = (char *)workspace;
    float *S = (float *)ws;
    float *dP = (float *)(ws += w.s);
    T *P = (T *)(ws += w.dp);
    T *dS = (T *)(ws += w.pm);
    float *D = (float *)(ws += w.ds);
    float *dK = (float *)(ws += w.d);
    float *dV = (float *)(ws += w.dk);
    const int g = p->heads_q / p->heads_kv, d = p->head_dim;
    const cudaDataType_t dt = cuda_type(p->dtype);
    const int varlen = fa_is_varlen(p);
    const int64_t rows_q = varlen ? p->total_q : (int64_t)p->batch * p->seqlen_q;
    const int64_t acc_row = (int64_t)p->heads_kv * d; /* dK/dV accumulators: (rows_k, heads_kv, d) */
    int32_t *cq, *ck;
    if ((st = fa_cuda_status(cudaMemsetAsync(dK, 0, 2 * w.dk, stream), "cudaMemsetAsync")) != FA_OK) return st;
    if ((st = host_seqlens(p, stream, &cq, &ck)) != FA_OK) return st;

    naive_rows a = rows_base(p);
    for (int64_t b = 0; b < p->batch && st == FA_OK; b++) {
        const fa_seq s = seq_of(p, cq, ck, b);
        const int64_t d_off = varlen ? s.tok_q : b * p->seqlen_q; /* D row of (b, token 0) */
        const int64_t k_off = varlen ? s.tok_k : b * p->seqlen_k; /* accumulator row of (b, key 0) */
        a.b = (int32_t)b, a.len_q = s.len_q, a.len_k = s.len_k, a.tok_q = s.tok_q;
        if (s.len_q == 0) continue;
        if (s.len_k == 0) { /* no keys: dQ = 0 */
            naive_view out = { at(p, &p->dq, b, s.tok_q, 0), p->dq.stride_seq, p->dq.stride_head };
            const int64_t n = s.len_q * p->heads_q * d;
            naive_zero_rows<T><<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(out, s.len_q, p->heads_q, d, a, 0);
            st = fa_cuda_status(cudaGetLastError(), "naive zero-rows launch");
            continue;
        }
        {
            naive_view vd = { at(p, &p->dout, b, s.tok_q, 0), p->dout.stride_seq, p->dout.stride_head };
            naive_view vo = { at(p, &p->o, b, s.tok_q, 0), p->o.stride_seq, p->o.stride_head };
            const int64_t nw = s.len_q * p->heads_q;
            naive_dot_do_o<T><<<(unsigned)((nw * 32 + 255) / 256), 256, 0, stream>>>(vd, vo, s.len_q, p->heads_q, d, D,
                                                                                     rows_q, d_off);
            if ((st = fa_cuda_status(cudaGetLastError(), "naive dot(dO, O) launch")) != FA_OK) break;
        }
        const int64_t mat = s.len_q * s.len_k;
        for (int r = 0; r < g && st == FA_OK; r++)
            for (int64_t hk0 = 0; hk0 < p->heads_kv && st == FA_OK; hk0 += w.nh) {
                const int64_t nh = hk0 + w.nh <= p->heads_kv ? w.nh : p->heads_kv - hk0;
                const int64_t hq = hk0 * g + r;
                char *q = at(p, &p->q, b, s.tok_q, hq), *k = at(p, &p->k, b, s.tok_k, hk0);
                char *v = at(p, &p->v, b, s.tok_k, hk0), *dout = at(p, &p->dout, b, s.tok_q, hq);
                float *dk = dK + k_off * acc_row + hk0 * d, *dv = dV + k_off * acc_row + hk0 * d;
                /* S^T = K^T-major product as in the forward; dP^T (len_k x len_q) = V (d x len_k)^T dO (d x len_q) */
                if ((st = gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, s.len_k, s.len_q, d, k, dt, p->k.stride_seq,
                               p->k.stride_head, q, dt, p->q.stride_seq, g * p->q.stride_head, 0.0f, S, CUDA_R_32F,
                               s.len_k, mat, nh)) ||
                    (st = gemm(h, CUBLAS_OP_T, CUBLAS_OP_N, s.len_k, s.len_q, d, v, dt, p->v.stride_seq,
                               p->v.stride_head, dout, dt, p->dout.stride_seq, g * p->dout.stride_head, 0.0f, dP,
                               CUDA_R_32F, s.len_k, mat, nh)))
                    break;
                a.nheads = (int32_t)nh, a.r = r, a.hk0 = (int32_t)hk0;
                naive_softmax_bwd<T><<<(unsigned)(nh * s.len_q), 256, 0, stream>>>(S, dP, D, rows_q, d_off, P, dS, a);
                if ((st = fa_cuda_status(cudaGetLastError(), "naive softmax backward launch")) != FA_OK) break;
                /* dV^T (d x len_k) += dO^T (d x len_q) P (len_q x len_k); dK^T += Q^T dS; dQ^T (d x len_q) = K^T dS^T
                 */
                if ((st = gemm(h, CUBLAS_OP_N, CUBLAS_OP_T, d, s.len_k, s.len_q, dout, dt, p->dout.stride_seq,
                               g * p->dout.stride_head, P, dt, s.len_k, mat, 1.0f, dv, CUDA_R_32F, acc_row, d, nh)) ||
                    (st = gemm(h, CUBLAS_OP_N, CUBLAS_OP_T, d, s.len_k, s.len_q, q, dt, p->q.stride_seq,
                               g * p->q.stride_head, dS, dt, s.len_k, mat, 1.0f, dk, CUDA_R_32F, acc_row, d, nh)) ||
                    (st = gemm(h, CUBLAS_OP_N, CUBLAS_OP_N, d, s.len_q, s.len_k, k, dt, p->k.stride_seq,
                               p->k.stride_head, dS, dt, s.len_k, mat, 0.0f, at(p, &p->dq, b, s.tok_q, hq), dt,
                               p->dq.stride_seq, g * p->dq.stride_head, nh)))
                    break;
            }
        const int64_t ne = empty_rows(p, &s);
        if (st == FA_OK && ne > 0) {
            naive_view out = { at(p, &p->dq, b, s.tok_q, 0), p->dq.stride_seq, p->dq.stride_head };
            const int64_t n = ne * p->heads_q * d;
            naive_zero_rows<T><<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(out, ne, p->heads_q, d, a, 0);
            st = fa_cuda_status(cudaGetLastError(), "naive zero-rows launch");
        }
    }
    /* dK, dV accumulators -> the outputs, over each sequence's rows */
    for (int64_t b = 0; b < p->batch && st == FA_OK; b++) {
        const fa_seq s = seq_of(p, cq, ck, b);
        const int64_t n0 = varlen ? s.tok_k : b * p->seqlen_k;
        const int64_t n = s.len_k * acc_row;
        if (n == 0) continue;
        naive_view vk = { at(p, &p->dk, b, s.tok_k, 0), p->dk.stride_seq, p->dk.stride_head };
        naive_view vv = { at(p, &p->dv, b, s.tok_k, 0), p->dv.stride_seq, p->dv.stride_head };
        naive_convert<T>
            <<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(dK + n0 * acc_row, vk, s.len_k, p->heads_kv, d);
        naive_convert<T>
            <<<(unsigned)((n + 255) / 256), 256, 0, stream>>>(dV + n0 * acc_row, vv, s.len_k, p->heads_kv, d);
        st = fa_cuda_status(cudaGetLastError(), "naive convert launch");
    }
    free(cq);
    return st;
}

extern "C" fa_status naive_fwd_run(const fa_params *p, const fa_cuda_device *dev, void *workspace,
                                   cudaStream_t stream) {
    switch (p->dtype) {
    case FA_F16: return naive_fwd_typed<__half>(p, dev, workspace, stream);
    case FA_BF16: return naive_fwd_typed<__nv_bfloat16>(p, dev, workspace, stream);
    default: return naive_fwd_typed<float>(p, dev, workspace, stream);
    }
}

extern "C" fa_status naive_bwd_run(const fa_params *p, const fa_cuda_device *dev, void *workspace,
                                   cudaStream_t stream) {
    switch (p->dtype) {
    case FA_F16: return naive_bwd_typed<__half>(p, dev, workspace, stream);
    case FA_BF16: return naive_bwd_typed<__nv_bfloat16>(p, dev, workspace, stream);
    default: return naive_bwd_typed<float>(p, dev, workspace, stream);
    }
}

static fa_status naive_fwd_supported(const fa_params *p, const fa_cuda_device *dev) {
    return naive_supported(p, dev, 0);
}

static fa_status naive_bwd_supported(const fa_params *p, const fa_cuda_device *dev) {
    return naive_supported(p, dev, 1);
}

static size_t naive_fwd_workspace_size(const fa_params *p, const fa_cuda_device *dev) {
    return naive_workspace_size(p, dev, 0);
}

static size_t naive_bwd_workspace_size(const fa_params *p, const fa_cuda_device *dev) {
    return naive_workspace_size(p, dev, 1);
}

const fa_kernel_family naive_fwd_family = { "naive forward", naive_fwd_supported, naive_fwd_workspace_size,
                                            naive_fwd_run, NULL };
const fa_kernel_family naive_bwd_family = { "naive backward", naive_bwd_supported, naive_bwd_workspace_size,
                                            naive_bwd_run, NULL };
