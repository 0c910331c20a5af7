/* SPDX-License-Identifier: Apache-2.0 */
/*
 * flashattn.c - the public entry points: argument validation (everything is checked before anything is
 * written), backend resolution and dispatch, error reporting, introspection.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "internal.h"
#ifdef FA_WITH_CUDA
#include "cuda/hdims.h"
#endif

/* ---------------------------------------------------------------------------------------------------------
 * Errors
 * ------------------------------------------------------------------------------------------------------- */

static _Thread_local char last_error[512];

fa_status fa_fail(fa_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

void fa_clear_error(void) {
    last_error[0] = '\0';
}

const char *fa_last_error(void) {
    return last_error;
}

const char *fa_strerror(fa_status status) {
    switch (status) {
    case FA_OK: return "success";
    case FA_ERR_INVALID_ARGUMENT: return "invalid argument";
    case FA_ERR_UNSUPPORTED: return "not supported by this backend";
    case FA_ERR_NOT_COMPILED: return "backend not compiled into this library";
    case FA_ERR_NO_DEVICE: return "no usable CUDA device";
    case FA_ERR_WORKSPACE_TOO_SMALL: return "workspace too small";
    case FA_ERR_OUT_OF_MEMORY: return "out of memory";
    case FA_ERR_DEVICE: return "CUDA error";
    case FA_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

const char *fa_status_name(fa_status status) {
    switch (status) {
    case FA_OK: return "FA_OK";
    case FA_ERR_INVALID_ARGUMENT: return "FA_ERR_INVALID_ARGUMENT";
    case FA_ERR_UNSUPPORTED: return "FA_ERR_UNSUPPORTED";
    case FA_ERR_NOT_COMPILED: return "FA_ERR_NOT_COMPILED";
    case FA_ERR_NO_DEVICE: return "FA_ERR_NO_DEVICE";
    case FA_ERR_WORKSPACE_TOO_SMALL: return "FA_ERR_WORKSPACE_TOO_SMALL";
    case FA_ERR_OUT_OF_MEMORY: return "FA_ERR_OUT_OF_MEMORY";
    case FA_ERR_DEVICE: return "FA_ERR_DEVICE";
    case FA_ERR_INTERNAL: return "FA_ERR_INTERNAL";
    }
    return "FA_ERR_UNKNOWN";
}

/* ---------------------------------------------------------------------------------------------------------
 * Construction and introspection
 * ------------------------------------------------------------------------------------------------------- */

fa_status fa_params_init(fa_params *p, fa_dtype dtype, int32_t batch, int32_t seqlen_q, int32_t seqlen_k,
                         int32_t heads_q, int32_t heads_kv, int32_t head_dim) {
    fa_clear_error();
    if (!p) return fa_fail(FA_ERR_INVALID_ARGUMENT, "params is NULL");
    memset(p, 0, sizeof *p);
    p->dtype = dtype;
    p->batch = batch;
    p->seqlen_q = seqlen_q;
    p->seqlen_k = seqlen_k;
    p->heads_q = heads_q;
    p->heads_kv = heads_kv;
    p->head_dim = head_dim;
    p->window_left = -1;
    p->window_right = -1;
    p->out_dtype = FA_BF16;
    return FA_OK;
}

fa_tensor fa_tensor_contiguous(void *data, int64_t seqlen, int32_t heads, int32_t head_dim) {
    fa_tensor t;
    t.data = data;
    t.stride_head = head_dim;
    t.stride_seq = (int64_t)heads * head_dim;
    t.stride_batch = seqlen * t.stride_seq;
    return t;
}

int fa_version_number(void) {
    return FA_VERSION_NUMBER;
}

size_t fa_params_sizeof(void) {
    return sizeof(fa_params);
}

size_t fa_exec_sizeof(void) {
    return sizeof(fa_exec);
}

#define FA_STR2(x) #x
#define FA_STR(x)  FA_STR2(x)

#ifdef FA_WITH_CUDA
/* The CUDA kernels' head dims (src/cuda/hdims.h) as ",32,64,...": reported without the first comma, read by the
 * Python binding's padding rule. */
#define HDIM_ITEM(D) "," #D
static const char cuda_hdims[] = FA_HDIMS(HDIM_ITEM);
#undef HDIM_ITEM
#endif

const char *fa_build_info(void) {
    static _Thread_local char info[512];
    snprintf(info, sizeof info, "flashattn %d.%d.%d backends=cpu,reference%s openmp=%s simd=%s%s%s%s%s",
             FA_VERSION_MAJOR, FA_VERSION_MINOR, FA_VERSION_PATCH,
#if defined(FA_WITH_NAIVE)
             ",cuda,naive",
#elif defined(FA_WITH_CUDA)
             ",cuda",
#else
             "",
#endif
#ifdef FA_WITH_OPENMP
             "yes",
#else
             "no",
#endif
             fa_cpu_simd(),
#ifdef FA_WITH_CUDA
             " ", fa_cuda_build_info(), " hdims=", cuda_hdims + 1
#else
             "", "", "", ""
#endif
    );
    return info;
}

int fa_backend_built(fa_backend backend) {
    switch (backend) {
    case FA_BACKEND_AUTO:
    case FA_BACKEND_CPU:
    case FA_BACKEND_REFERENCE: return 1;
    case FA_BACKEND_CUDA:
#ifdef FA_WITH_CUDA
        return 1;
#else
        return 0;
#endif
    case FA_BACKEND_NAIVE:
#ifdef FA_WITH_NAIVE
        return 1;
#else
        return 0;
#endif
    }
    return 0;
}

int fa_device_count(void) {
#ifdef FA_WITH_CUDA
    return fa_cuda_device_count();
#else
    return 0;
#endif
}

fa_status fa_device_get_info(int32_t ordinal, fa_device_info *info) {
    fa_clear_error();
    if (!info) return fa_fail(FA_ERR_INVALID_ARGUMENT, "info is NULL");
#ifdef FA_WITH_CUDA
    return fa_cuda_device_info(ordinal, info);
#else
    return fa_fail(FA_ERR_NOT_COMPILED, "this library was built without CUDA");
#endif
}

double fa_flops_fwd(const fa_params *p, const int32_t *host_cu_seqlens_q, const int32_t *host_cu_seqlens_k) {
    if (!p) return 0.0;
    double pairs = 0.0;
    for (int64_t b = 0; b < p->batch; b++) {
        double sq = host_cu_seqlens_q ? host_cu_seqlens_q[b + 1] - host_cu_seqlens_q[b] : p->seqlen_q;
        double sk = host_cu_seqlens_k ? host_cu_seqlens_k[b + 1] - host_cu_seqlens_k[b] : p->seqlen_k;
        pairs += sq * sk;
    }
    double flops = 4.0 * pairs * p->head_dim * p->heads_q;
    return p->causal ? flops / 2 : flops;
}

/* ---------------------------------------------------------------------------------------------------------
 * Validation
 * ------------------------------------------------------------------------------------------------------- */

/* An input view: data present, strides non-negative (0 broadcasts). */
static fa_status check_input(const fa_tensor *t, const char *name, int varlen) {
    if (!t->data) return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s.data is NULL", name);
    if (t->stride_seq < 0)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s.stride_seq (%lld) is negative", name, (long long)t->stride_seq);
    if (t->stride_head < 0)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s.stride_head (%lld) is negative", name, (long long)t->stride_head);
    if (!varlen && t->stride_batch < 0)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s.stride_batch (%lld) is negative", name, (long long)t->stride_batch);
    return FA_OK;
}

typedef struct out_dim {
    int64_t stride, extent;
    const char *field;
} out_dim;

/* An output view must not write one element twice: sorted by stride, each dimension must step over the
 * whole extent of the smaller ones. Extents of 1 impose nothing. */
static fa_status check_output(const fa_tensor *t, const char *name, int64_t batch, int64_t rows, int64_t heads,
                              int64_t head_dim, int varlen) {
    fa_status st = check_input(t, name, varlen);
    if (st != FA_OK) return st;
    out_dim dim[3] = { { t->stride_seq, rows, "stride_seq" },
                       { t->stride_head, heads, "stride_head" },
                       { varlen ? 0 : t->stride_batch, varlen ? 1 : batch, "stride_batch" } };
    for (int a = 0; a < 3; a++)
        for (int b = a + 1; b < 3; b++)
            if (dim[b].stride < dim[a].stride) {
                out_dim tmp = dim[a];
                dim[a] = dim[b];
                dim[b] = tmp;
            }
    if (rows == 0 || heads == 0 || batch == 0) return FA_OK; /* no element at all (a varlen batch of no rows) */
    int64_t span = head_dim; /* elements covered by the dimensions below the current one */
    for (int a = 0; a < 3; a++) {
        if (dim[a].extent <= 1) continue;
        if (dim[a].stride < span)
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s.%s (%lld) makes output elements overlap (needs >= %lld)", name,
                           dim[a].field, (long long)dim[a].stride, (long long)span);
        if (__builtin_mul_overflow(dim[a].stride, dim[a].extent, &span))
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s.%s (%lld) times %lld overflows int64", name, dim[a].field,
                           (long long)dim[a].stride, (long long)dim[a].extent);
    }
    return FA_OK;
}

/* The cu_seqlens of a varlen batch, when they are host memory and can be read. */
static fa_status check_cu_seqlens(const int32_t *cu, const char *name, int32_t batch, int32_t max_len, int64_t total) {
    if (cu[0] != 0) return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s[0] (%d) is not 0", name, cu[0]);
    for (int32_t b = 0; b < batch; b++) {
        int64_t len = (int64_t)cu[b + 1] - cu[b];
        if (len < 0)
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s decreases at index %d (%d -> %d)", name, b + 1, cu[b],
                           cu[b + 1]);
        if (len > max_len)
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s: sequence %d has length %lld > the max length %d", name, b,
                           (long long)len, max_len);
    }
    if (cu[batch] > total)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s[batch] (%d) exceeds the total token count (%lld)", name, cu[batch],
                       (long long)total);
    return FA_OK;
}

static int host_backend(fa_backend b) {
    return b == FA_BACKEND_CPU || b == FA_BACKEND_REFERENCE;
}

/* The bytes [lo, hi) an array can reach; lo == hi when it reaches none. */
typedef struct span {
    uintptr_t lo, hi;
    const char *name;
    int output;
} span;

/* The span of a (batch, rows, heads, head_dim) view: strides are non-negative (checked before), so the last
 * byte is at the sum of (extent - 1) * stride. Every product and sum is checked: an offset past INT64_MAX
 * bytes (or past the end of the address space) would wrap inside the backends' int64 index arithmetic. */
static fa_status tensor_span(const fa_tensor *t, const char *name, int64_t batch, int64_t rows, int64_t heads,
                             int64_t head_dim, int64_t elem, int varlen, int output, span *out) {
    out->name = name, out->output = output;
    out->lo = out->hi = (uintptr_t)t->data;
    if (!t->data || batch == 0 || rows == 0 || heads == 0) return FA_OK;
    const int64_t ext[4] = { varlen ? 1 : batch, rows, heads, head_dim };
    const int64_t stride[4] = { varlen ? 0 : t->stride_batch, t->stride_seq, t->stride_head, 1 };
    static const char *field[4] = { "stride_batch", "stride_seq", "stride_head", "head_dim" };
    int64_t last = 0, term, bytes, largest = -1;
    int big = 0; /* the dimension of the largest term: the one to name when the bytes overflow */
    for (int a = 0; a < 4; a++) {
        if (__builtin_mul_overflow(ext[a] - 1, stride[a], &term) || __builtin_add_overflow(last, term, &last))
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s.%s (%lld) times %lld overflows the tensor's int64 extent", name,
                           field[a], (long long)stride[a], (long long)(ext[a] - 1));
        if (term > largest) largest = term, big = a;
    }
    if (__builtin_add_overflow(last, 1, &last) || __builtin_mul_overflow(last, elem, &bytes) ||
        (uintptr_t)t->data + (uintptr_t)bytes < (uintptr_t)t->data)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s.%s (%lld) puts the tensor's last byte beyond the int64 range", name,
                       field[big], (long long)stride[big]);
    out->hi = (uintptr_t)t->data + (uintptr_t)bytes;
    return FA_OK;
}

/* The span of `count` elements (count <= 0: none; NULL data: none, reported elsewhere). */
static fa_status flat_span(const void *data, int64_t count, int64_t elem, const char *name, int output, span *out) {
    int64_t bytes;
    out->name = name, out->output = output;
    out->lo = out->hi = (uintptr_t)data;
    if (!data || count <= 0) return FA_OK;
    if (__builtin_mul_overflow(count, elem, &bytes) || (uintptr_t)data + (uintptr_t)bytes < (uintptr_t)data)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s: %lld elements overflow the int64 byte range", name,
                       (long long)count);
    out->hi = (uintptr_t)data + (uintptr_t)bytes;
    return FA_OK;
}

/* A pointer must be aligned to its elements (the backends read them as float, uint16_t and int32_t). */
static fa_status check_aligned(const void *ptr, size_t align, const char *name) {
    if ((uintptr_t)ptr % align)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s (%p) is not aligned to its %zu-byte elements", name, ptr, align);
    return FA_OK;
}

/* The FP8 fields: only with FA_E4M3 inputs, and only in a forward. */
static fa_status check_fp8(const fa_params *p, int backward) {
    if (p->dtype != FA_E4M3) {
        const char *set = p->q_descale ? "q_descale" : p->k_descale ? "k_descale" : p->v_descale ? "v_descale" : NULL;
        if (set) return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s is set but dtype is not FA_E4M3", set);
        return FA_OK;
    }
    if (backward)
        return fa_fail(FA_ERR_UNSUPPORTED, "dtype FA_E4M3: the backward takes FA_F32, FA_F16 or FA_BF16 (FP8 is "
                                           "forward only)");
    if (p->out_dtype != FA_BF16 && p->out_dtype != FA_F16)
        return fa_fail(FA_ERR_INVALID_ARGUMENT,
                       "out_dtype (%d) is not FA_BF16 or FA_F16 (the dtype of o for FA_E4M3 "
                       "inputs)",
                       (int)p->out_dtype);
    if (p->descale_block_q < 0)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "descale_block_q (%d) is negative", p->descale_block_q);
    if (p->descale_block_k < 0)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "descale_block_k (%d) is negative", p->descale_block_k);
    return FA_OK;
}

/* Descales of a problem's q (which = 'q') or k and v: batch * heads * blocks. */
static int64_t descale_count(const fa_params *p, int which) {
    return (int64_t)p->batch * (which == 'q' ? p->heads_q : p->heads_kv) * fa_descale_blocks(p, which);
}

/* The three descale arrays with their names and whose sizes ('q', or 'k' for k and v) they follow. */
typedef struct descale_view {
    const float *d;
    const char *name;
    int which;
} descale_view;
static void descale_views(const fa_params *p, descale_view v[3]) {
    v[0] = (descale_view){ p->q_descale, "q_descale", 'q' };
    v[1] = (descale_view){ p->k_descale, "k_descale", 'k' };
    v[2] = (descale_view){ p->v_descale, "v_descale", 'k' };
}

/* On the host backends, which read them here: every descale finite and >= 0. */
static fa_status check_descale_values(const fa_params *p) {
    descale_view all[3];
    descale_views(p, all);
    for (size_t t = 0; t < 3; t++) {
        if (!all[t].d) continue;
        const int64_t n = descale_count(p, all[t].which);
        for (int64_t i = 0; i < n; i++)
            if (!isfinite(all[t].d[i]) || all[t].d[i] < 0)
                return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s[%lld] (%g) is not finite and >= 0", all[t].name,
                               (long long)i, (double)all[t].d[i]);
    }
    return FA_OK;
}

/* Sizes, strides, alignment and overlap of every array of the call. An output may share no byte with another
 * output or with an input (the backends read inputs while writing outputs, in any order); inputs may share
 * memory with each other (q == k == v is fine). Spans are whole [first, last] byte ranges, so two views
 * interleaved in one buffer count as overlapping. */
static fa_status check_memory(const fa_params *p, int backward) {
    const int varlen = p->cu_seqlens_q != NULL;
    const int64_t es_in = (int64_t)fa_dtype_size(p->dtype), b = p->batch;
    const int64_t rows_q = varlen ? p->total_q : p->seqlen_q, rows_k = varlen ? p->total_k : p->seqlen_k;
    int64_t lse_n;
    if (__builtin_mul_overflow(varlen ? 1 : b, (int64_t)p->heads_q, &lse_n) ||
        __builtin_mul_overflow(lse_n, varlen ? p->total_q : p->seqlen_q, &lse_n))
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "lse: batch * heads_q * rows overflows int64");
    span sp[15];
    int n = 0;
    fa_status st;
    struct {
        const fa_tensor *t;
        const char *name;
        int64_t rows, heads;
        int output, used;
    } views[] = {
        { &p->q, "q", rows_q, p->heads_q, 0, 1 },
        { &p->k, "k", rows_k, p->heads_kv, 0, 1 },
        { &p->v, "v", rows_k, p->heads_kv, 0, 1 },
        { &p->o, "o", rows_q, p->heads_q, !backward, 1 },
        { &p->dout, "dout", rows_q, p->heads_q, 0, backward },
        { &p->dq, "dq", rows_q, p->heads_q, 1, backward },
        { &p->dk, "dk", rows_k, p->heads_kv, 1, backward },
        { &p->dv, "dv", rows_k, p->heads_kv, 1, backward },
    };
    for (size_t i = 0; i < sizeof views / sizeof views[0]; i++) {
        if (!views[i].used) continue;
        const int64_t es = views[i].t == &p->o ? (int64_t)fa_dtype_size(fa_out_dtype(p)) : es_in;
        if ((uintptr_t)views[i].t->data % (size_t)es) { /* the name is formatted only for the message */
            char what[16];
            snprintf(what, sizeof what, "%s.data", views[i].name);
            return check_aligned(views[i].t->data, (size_t)es, what);
        }
        if ((st = tensor_span(views[i].t, views[i].name, b, views[i].rows, views[i].heads, p->head_dim, es, varlen,
                              views[i].output, &sp[n++])))
            return st;
    }
    if (p->lse) {
        if ((st = check_aligned(p->lse, 4, "lse"))) return st;
        if ((st = flat_span(p->lse, lse_n, 4, "lse", !backward, &sp[n++]))) return st;
    }
    if (p->alibi_slopes) {
        if ((st = check_aligned(p->alibi_slopes, 4, "alibi_slopes"))) return st;
        int64_t count = 0; /* alibi_batch_stride is either 0 or in [heads_q, ...) */
        if (p->alibi_batch_stride && __builtin_mul_overflow(b - 1, p->alibi_batch_stride, &count))
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "alibi_batch_stride (%lld) times batch - 1 overflows int64",
                           (long long)p->alibi_batch_stride);
        if (__builtin_add_overflow(count, (int64_t)p->heads_q, &count))
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "alibi_slopes: the last slope's index overflows int64");
        if ((st = flat_span(p->alibi_slopes, count, 4, "alibi_slopes", 0, &sp[n++]))) return st;
    }
    descale_view descales[3];
    descale_views(p, descales);
    for (size_t i = 0; i < 3; i++) {
        if (!descales[i].d) continue;
        if ((st = check_aligned(descales[i].d, 4, descales[i].name)) ||
            (st = flat_span(descales[i].d, descale_count(p, descales[i].which), 4, descales[i].name, 0, &sp[n++])))
            return st;
    }
    if (varlen) {
        if ((st = check_aligned(p->cu_seqlens_q, 4, "cu_seqlens_q")) ||
            (st = check_aligned(p->cu_seqlens_k, 4, "cu_seqlens_k")))
            return st;
        if ((st = flat_span(p->cu_seqlens_q, b + 1, 4, "cu_seqlens_q", 0, &sp[n++])) ||
            (st = flat_span(p->cu_seqlens_k, b + 1, 4, "cu_seqlens_k", 0, &sp[n++])))
            return st;
    }
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if ((sp[i].output || sp[j].output) && sp[i].lo < sp[i].hi && sp[j].lo < sp[j].hi && sp[i].lo < sp[j].hi &&
                sp[j].lo < sp[i].hi)
                return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s and %s overlap in memory (%s is an output)", sp[i].name,
                               sp[j].name, sp[i].output ? sp[i].name : sp[j].name);
    return FA_OK;
}

/* Checks everything that does not depend on the backend, and the host-readable arrays of host backends.
 * Fills *r with the resolved copy that backends receive. */
static fa_status validate(const fa_params *p, fa_backend backend, int backward, fa_params *r) {
    if (!p) return fa_fail(FA_ERR_INVALID_ARGUMENT, "params is NULL");
    if (p->dtype != FA_F32 && p->dtype != FA_F16 && p->dtype != FA_BF16 && p->dtype != FA_E4M3)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "dtype (%d) is not FA_F32, FA_F16, FA_BF16 or FA_E4M3", (int)p->dtype);
    fa_status st;
    if ((st = check_fp8(p, backward))) return st;
    const int varlen = p->cu_seqlens_q != NULL;
    if ((p->cu_seqlens_q == NULL) != (p->cu_seqlens_k == NULL))
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "cu_seqlens_q and cu_seqlens_k must both be set or both be NULL");
    if (p->batch < 1) return fa_fail(FA_ERR_INVALID_ARGUMENT, "batch (%d) must be >= 1", p->batch);
    const int32_t min_len = varlen ? 0 : 1;
    if (p->seqlen_q < min_len)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "seqlen_q (%d) must be >= %d", p->seqlen_q, min_len);
    if (p->seqlen_k < min_len)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "seqlen_k (%d) must be >= %d", p->seqlen_k, min_len);
    if (p->heads_q < 1) return fa_fail(FA_ERR_INVALID_ARGUMENT, "heads_q (%d) must be >= 1", p->heads_q);
    if (p->heads_kv < 1) return fa_fail(FA_ERR_INVALID_ARGUMENT, "heads_kv (%d) must be >= 1", p->heads_kv);
    if (p->heads_q % p->heads_kv)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "heads_q (%d) is not a multiple of heads_kv (%d)", p->heads_q,
                       p->heads_kv);
    if (p->head_dim < 1) return fa_fail(FA_ERR_INVALID_ARGUMENT, "head_dim (%d) must be >= 1", p->head_dim);
    if (p->head_dim % 8 || p->head_dim > 256)
        return fa_fail(FA_ERR_UNSUPPORTED, "head_dim (%d) is not a multiple of 8 in [8, 256]", p->head_dim);
    if (varlen) {
        if (p->total_q < 0)
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "total_q (%lld) is negative", (long long)p->total_q);
        if (p->total_k < 0)
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "total_k (%lld) is negative", (long long)p->total_k);
        if (p->total_q > INT32_MAX || p->total_k > INT32_MAX)
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "total_q/total_k (%lld/%lld) exceed the int32 range of cu_seqlens",
                           (long long)p->total_q, (long long)p->total_k);
    }
    if (!isfinite(p->softmax_scale))
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "softmax_scale (%g) is not finite", (double)p->softmax_scale);
    if (p->causal != 0 && p->causal != 1)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "causal (%d) is not 0 or 1", p->causal);
    if (p->window_left < -1) return fa_fail(FA_ERR_INVALID_ARGUMENT, "window_left (%d) must be >= -1", p->window_left);
    if (p->window_right < -1)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "window_right (%d) must be >= -1", p->window_right);
    if (!isfinite(p->softcap) || p->softcap < 0)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "softcap (%g) must be finite and >= 0", (double)p->softcap);
    if (p->alibi_batch_stride < 0)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "alibi_batch_stride (%lld) is negative",
                       (long long)p->alibi_batch_stride);
    if (p->alibi_batch_stride > 0 && p->alibi_batch_stride < p->heads_q)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "alibi_batch_stride (%lld) is less than heads_q (%d)",
                       (long long)p->alibi_batch_stride, p->heads_q);
    if (p->deterministic != 0 && p->deterministic != 1)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "deterministic (%d) is not 0 or 1", p->deterministic);

    const int64_t rows_q = varlen ? p->total_q : p->seqlen_q, rows_k = varlen ? p->total_k : p->seqlen_k;
    if ((st = check_input(&p->q, "q", varlen)) || (st = check_input(&p->k, "k", varlen)) ||
        (st = check_input(&p->v, "v", varlen)))
        return st;
    if (!backward) {
        if ((st = check_output(&p->o, "o", p->batch, rows_q, p->heads_q, p->head_dim, varlen))) return st;
    } else {
        if ((st = check_input(&p->o, "o", varlen)) || (st = check_input(&p->dout, "dout", varlen))) return st;
        if (!p->lse) return fa_fail(FA_ERR_INVALID_ARGUMENT, "lse is NULL (the backward needs the forward's lse)");
        if ((st = check_output(&p->dq, "dq", p->batch, rows_q, p->heads_q, p->head_dim, varlen)) ||
            (st = check_output(&p->dk, "dk", p->batch, rows_k, p->heads_kv, p->head_dim, varlen)) ||
            (st = check_output(&p->dv, "dv", p->batch, rows_k, p->heads_kv, p->head_dim, varlen)))
            return st;
    }
    if ((st = check_memory(p, backward))) return st;
    if (varlen && host_backend(backend)) {
        if ((st = check_cu_seqlens(p->cu_seqlens_q, "cu_seqlens_q", p->batch, p->seqlen_q, p->total_q)) ||
            (st = check_cu_seqlens(p->cu_seqlens_k, "cu_seqlens_k", p->batch, p->seqlen_k, p->total_k)))
            return st;
    }

    if (p->alibi_slopes && host_backend(backend)) {
        const int64_t nb = p->alibi_batch_stride ? p->batch : 1;
        for (int64_t b = 0; b < nb; b++)
            for (int64_t h = 0; h < p->heads_q; h++) {
                float sl = p->alibi_slopes[b * p->alibi_batch_stride + h];
                if (!isfinite(sl))
                    return fa_fail(FA_ERR_INVALID_ARGUMENT, "alibi_slopes[%lld] (%g) is not finite",
                                   (long long)(b * p->alibi_batch_stride + h), (double)sl);
            }
    }

    if (p->dtype == FA_E4M3 && host_backend(backend) && (st = check_descale_values(p))) return st;

    *r = *p;
    if (r->softmax_scale == 0.0f) r->softmax_scale = 1.0f / sqrtf((float)p->head_dim);
    if (r->causal) r->window_right = 0;
    return FA_OK;
}

/* ---------------------------------------------------------------------------------------------------------
 * Dispatch
 * ------------------------------------------------------------------------------------------------------- */

/* Resolves AUTO and checks that the chosen backend exists. */
static fa_status resolve_exec(const fa_params *p, const fa_exec *exec, fa_exec *x) {
    if (exec) {
        *x = *exec;
    } else {
        memset(x, 0, sizeof *x);
        x->device = -1;
    }
    if (x->num_threads < 0)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "exec.num_threads (%d) is negative", x->num_threads);
    if (x->workspace && x->workspace_bytes == 0)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "exec.workspace is set but exec.workspace_bytes is 0");
    if (x->check != 0 && x->check != 1)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "exec.check (%d) is not 0 or 1", x->check);
    if (x->kernel != FA_KERNEL_AUTO && x->kernel != FA_KERNEL_FA2 && x->kernel != FA_KERNEL_FA3)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "exec.kernel (%d) is not AUTO, FA2 or FA3", (int)x->kernel);
    switch (x->backend) {
    case FA_BACKEND_AUTO:
#ifdef FA_WITH_CUDA
        x->backend = p && p->q.data && fa_cuda_device_count() > 0 && fa_cuda_is_device_pointer(p->q.data)
                         ? FA_BACKEND_CUDA
                         : FA_BACKEND_CPU;
#else
        x->backend = FA_BACKEND_CPU;
#endif
        return FA_OK;
    case FA_BACKEND_CPU:
    case FA_BACKEND_REFERENCE: return FA_OK;
    case FA_BACKEND_CUDA:
    case FA_BACKEND_NAIVE:
#ifdef FA_WITH_CUDA
#ifndef FA_WITH_NAIVE
        if (x->backend == FA_BACKEND_NAIVE)
            return fa_fail(FA_ERR_NOT_COMPILED, "the naive backend was not built into this library (FA_NAIVE=0)");
#endif
        if (fa_cuda_device_count() <= 0) return fa_fail(FA_ERR_NO_DEVICE, "no CUDA device is present");
        return FA_OK;
#else
        return fa_fail(FA_ERR_NOT_COMPILED, "the %s backend was not built into this library (built without nvcc)",
                       x->backend == FA_BACKEND_CUDA ? "cuda" : "naive");
#endif
    }
    return fa_fail(FA_ERR_INVALID_ARGUMENT, "exec.backend (%d) is not a known backend", (int)x->backend);
}

/* Validation shared by every call; on success *r and *x are what the backend runs with. */
static fa_status prepare(const fa_params *p, const fa_exec *exec, int backward, fa_params *r, fa_exec *x) {
    fa_clear_error();
    fa_status st = resolve_exec(p, exec, x);
    if (st != FA_OK) return st;
    if ((st = validate(p, x->backend, backward, r)) != FA_OK) return st;
    if (r->dtype == FA_E4M3 && x->backend == FA_BACKEND_NAIVE)
        return fa_fail(FA_ERR_UNSUPPORTED, "dtype FA_E4M3 runs on the cpu, reference and cuda backends; the naive "
                                           "backend has no e4m3 kernel");
#ifdef FA_WITH_CUDA
    if (x->backend == FA_BACKEND_CUDA) return fa_cuda_check(r, x, backward);
#endif
#ifdef FA_WITH_NAIVE
    if (x->backend == FA_BACKEND_NAIVE) return fa_naive_check(r, x, backward);
#endif
    return FA_OK;
}

fa_status fa_check(const fa_params *p, const fa_exec *exec, int backward) {
    fa_params r;
    fa_exec x;
    return prepare(p, exec, backward, &r, &x);
}

/* The workspace a prepared call needs (the sizes include any alignment slack a backend asks for). */
static fa_status workspace_need(const fa_params *r, const fa_exec *x, int backward, size_t *bytes) {
    switch (x->backend) {
    case FA_BACKEND_CPU: *bytes = fa_cpu_workspace_size(r, x->num_threads, backward); return FA_OK;
#ifdef FA_WITH_CUDA
    case FA_BACKEND_CUDA: return fa_cuda_workspace_size(r, x, backward, bytes);
#endif
#ifdef FA_WITH_NAIVE
    case FA_BACKEND_NAIVE: return fa_naive_workspace_size(r, x, backward, bytes);
#endif
    default: *bytes = 0; return FA_OK; /* the reference allocates its own fp64 copies */
    }
}

fa_status fa_workspace_size(const fa_params *p, const fa_exec *exec, int backward, size_t *bytes) {
    fa_params r;
    fa_exec x;
    if (!bytes) return fa_fail(FA_ERR_INVALID_ARGUMENT, "bytes is NULL");
    fa_status st = prepare(p, exec, backward, &r, &x);
    if (st != FA_OK) return st;
    return workspace_need(&r, &x, backward, bytes);
}

static fa_status run(const fa_params *p, const fa_exec *exec, int backward) {
    fa_params r;
    fa_exec x;
    fa_status st = prepare(p, exec, backward, &r, &x);
    if (st != FA_OK) return st;
    if (x.workspace) {
        size_t need = 0;
        if ((st = workspace_need(&r, &x, backward, &need)) != FA_OK) return st;
        if (x.workspace_bytes < need)
            return fa_fail(FA_ERR_WORKSPACE_TOO_SMALL, "workspace_bytes (%zu) < required (%zu)", x.workspace_bytes,
                           need);
    }
    switch (x.backend) {
    case FA_BACKEND_CPU: return backward ? fa_cpu_bwd(&r, &x) : fa_cpu_fwd(&r, &x);
    case FA_BACKEND_REFERENCE: return backward ? fa_reference_bwd(&r) : fa_reference_fwd(&r);
#ifdef FA_WITH_CUDA
    case FA_BACKEND_CUDA: return backward ? fa_cuda_bwd(&r, &x) : fa_cuda_fwd(&r, &x);
#endif
#ifdef FA_WITH_NAIVE
    case FA_BACKEND_NAIVE: return backward ? fa_naive_bwd(&r, &x) : fa_naive_fwd(&r, &x);
#endif
    default: return fa_fail(FA_ERR_INTERNAL, "unresolved backend %d", (int)x.backend);
    }
}

fa_status fa_fwd(const fa_params *p, const fa_exec *exec) {
    return run(p, exec, 0);
}

fa_status fa_bwd(const fa_params *p, const fa_exec *exec) {
    return run(p, exec, 1);
}

/* ---------------------------------------------------------------------------------------------------------
 * Decoding with a KV cache
 * ------------------------------------------------------------------------------------------------------- */

fa_status fa_kvcache_init(fa_kvcache *kv, int32_t batch_cache, int32_t seqlen_cache) {
    fa_clear_error();
    if (!kv) return fa_fail(FA_ERR_INVALID_ARGUMENT, "kvcache is NULL");
    memset(kv, 0, sizeof *kv);
    kv->batch_cache = batch_cache;
    kv->seqlen_cache = seqlen_cache;
    kv->rotary_interleaved = 1;
    return FA_OK;
}

size_t fa_kvcache_sizeof(void) {
    return sizeof(fa_kvcache);
}

/* A cache slot appended to, and the sequence that appends it. */
typedef struct kv_slot {
    int64_t slot, seq;
} kv_slot;

static int kv_slot_cmp(const void *a, const void *b) {
    const kv_slot *x = a, *y = b;
    if (x->slot != y->slot) return x->slot < y->slot ? -1 : 1;
    return x->seq < y->seq ? -1 : (x->seq > y->seq);
}

/* The per-sequence int32 arrays in host memory (r resolved, kv's geometry already checked): the host backends'
 * own, or a CUDA call's copied back under exec.check = 1 (host_limits = 0: the int32 limits of the host
 * backends' gather do not apply). Two sequences appending to the same cache slot would make the result depend
 * on the order of the writes, so every written slot is collected and sorted (batch x seqlen_new entries). */
static fa_status check_kvcache_arrays(const fa_params *r, const fa_kvcache *kv, int host_limits) {
    const int64_t cap = fa_kv_capacity(kv), n_new = r->seqlen_k, ps = kv->page_size;
    const int64_t ld = kv->block_table_stride ? kv->block_table_stride : kv->max_pages;
    const int paged = kv->block_table != NULL;
    for (int64_t b = 0; b < r->batch; b++) {
        const int64_t len = fa_kv_seqlen(kv, b), pad = fa_kv_leftpad(kv, b);
        if (!kv->cache_seqlens && n_new > 0)
            return fa_fail(FA_ERR_INVALID_ARGUMENT,
                           "cache_seqlens is NULL (every sequence fills the capacity, %lld rows), leaving no room "
                           "for the %lld new tokens (seqlen_k)",
                           (long long)cap, (long long)n_new);
        if (len < 0)
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "cache_seqlens[%lld] (%lld) is negative", (long long)b,
                           (long long)len);
        if (len + n_new > cap)
            return fa_fail(FA_ERR_INVALID_ARGUMENT,
                           "cache_seqlens[%lld] (%lld) + seqlen_k (%lld new tokens) exceeds the cache's capacity "
                           "(%lld = %s)",
                           (long long)b, (long long)len, (long long)n_new, (long long)cap,
                           paged ? "max_pages * page_size" : "seqlen_cache");
        if (pad < 0 || pad > len)
            return fa_fail(FA_ERR_INVALID_ARGUMENT,
                           "cache_leftpad[%lld] (%lld) is outside [0, cache_seqlens[%lld] = %lld]", (long long)b,
                           (long long)pad, (long long)b, (long long)len);
        if (kv->cache_batch_idx && (kv->cache_batch_idx[b] < 0 || kv->cache_batch_idx[b] >= kv->batch_cache))
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "cache_batch_idx[%lld] (%d) is outside [0, batch_cache = %d)",
                           (long long)b, kv->cache_batch_idx[b], kv->batch_cache);
        if (paged && pad < len + n_new)
            for (int64_t j = pad / ps; j <= (len + n_new - 1) / ps; j++) {
                const int32_t page = kv->block_table[b * ld + j];
                if (page < 0 || page >= kv->num_pages)
                    return fa_fail(FA_ERR_INVALID_ARGUMENT,
                                   "block_table[%lld][%lld] (%d) is outside [0, num_pages = %d)", (long long)b,
                                   (long long)j, page, kv->num_pages);
            }
        if (kv->rotary_cos) {
            const int64_t qpos = fa_kv_q_position(r, kv, b, r->seqlen_q - 1), kpos = len + n_new - 1;
            const int64_t last = qpos > kpos ? qpos : kpos;
            if (last >= kv->rotary_seqlen)
                return fa_fail(FA_ERR_INVALID_ARGUMENT,
                               "rotary_seqlen (%d) is too short: sequence %lld needs rotary position %lld",
                               kv->rotary_seqlen, (long long)b, (long long)last);
        }
    }
    /* The host backends attend the gathered rows as a varlen batch, whose prefix sums are int32. */
    int64_t total = 0;
    for (int64_t b = 0; host_limits && b < r->batch; b++) total += fa_kv_seqlen(kv, b) + n_new - fa_kv_leftpad(kv, b);
    if (total > INT32_MAX)
        return fa_fail(FA_ERR_INVALID_ARGUMENT,
                       "cache_seqlens: the batch attends %lld cache rows in all, beyond the int32 range the host "
                       "backends gather them in",
                       (long long)total);
    if (host_limits && (int64_t)r->batch * r->seqlen_q * (r->heads_q / r->heads_kv) > INT32_MAX)
        return fa_fail(FA_ERR_INVALID_ARGUMENT,
                       "batch (%d) * seqlen_q (%d) * heads_q / heads_kv (%d) exceeds the "
                       "int32 range of the host backends' query rows",
                       r->batch, r->seqlen_q, r->heads_q / r->heads_kv);
    if (n_new == 0) return FA_OK;
    int64_t count;
    if (__builtin_mul_overflow((int64_t)r->batch, n_new, &count) || (uint64_t)count > SIZE_MAX / sizeof(kv_slot))
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "batch * seqlen_k overflows the host's size range");
    kv_slot *slots = malloc((size_t)count * sizeof(kv_slot));
    if (!slots)
        return fa_fail(FA_ERR_OUT_OF_MEMORY, "cannot allocate %lld bytes to check the appended cache slots",
                       (long long)(count * (int64_t)sizeof(kv_slot)));
    for (int64_t b = 0, n = 0; b < r->batch; b++)
        for (int64_t j = 0; j < n_new; j++, n++) {
            const int64_t row = fa_kv_seqlen(kv, b) + j;
            slots[n].seq = b;
            slots[n].slot = paged ? (int64_t)kv->block_table[b * ld + row / ps] * ps + row % ps
                                  : (kv->cache_batch_idx ? kv->cache_batch_idx[b] : b) * cap + row;
        }
    qsort(slots, (size_t)count, sizeof(kv_slot), kv_slot_cmp);
    fa_status st = FA_OK;
    for (int64_t n = 1; n < count && st == FA_OK; n++)
        if (slots[n].slot == slots[n - 1].slot) {
            const int64_t unit = paged ? ps : cap;
            st = fa_fail(FA_ERR_INVALID_ARGUMENT, "%s: sequences %lld and %lld both append to %s %lld, row %lld",
                         paged ? "block_table" : "cache_batch_idx", (long long)slots[n - 1].seq,
                         (long long)slots[n].seq, paged ? "page" : "cache sequence", (long long)(slots[n].slot / unit),
                         (long long)(slots[n].slot % unit));
        }
    free(slots);
    return st;
}

/* Everything a decode call is checked for; on success *r (resolved params) and *x are what the backend
 * runs with. */
static fa_status prepare_kvcache(const fa_params *p, const fa_kvcache *kv, const fa_exec *exec, fa_params *r,
                                 fa_exec *x) {
    fa_clear_error();
    fa_status st = resolve_exec(p, exec, x);
    if (st != FA_OK) return st;
    if (!p) return fa_fail(FA_ERR_INVALID_ARGUMENT, "params is NULL");
    if (!kv) return fa_fail(FA_ERR_INVALID_ARGUMENT, "kvcache is NULL");
    if (p->dtype == FA_E4M3)
        return fa_fail(FA_ERR_UNSUPPORTED, "dtype FA_E4M3: a decode call (fa_fwd_kvcache) takes FA_F32, FA_F16 or "
                                           "FA_BF16");
    if (p->cu_seqlens_q || p->cu_seqlens_k)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "cu_seqlens_q/k must be NULL in a decode call (fa_fwd_kvcache)");
    if ((p->k.data == NULL) != (p->v.data == NULL))
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "k.data and v.data (the new tokens) must both be set or both be NULL");
    const int append = p->k.data != NULL;
    if (!append && p->seqlen_k != 0)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "seqlen_k (%d) must be 0 when there are no new tokens (k, v NULL)",
                       p->seqlen_k);
    /* validate() checks an fa_fwd problem. Without new tokens the key views stand in as one row of q: q has
     * at least one row and heads_q >= heads_kv heads, so the stand-in reads nothing outside q (an input). */
    fa_params pv = *p;
    if (!append) {
        pv.seqlen_k = 1;
        pv.k = pv.v = p->q;
    }
    if ((st = validate(&pv, x->backend, 0, r)) != FA_OK) return st;
    r->seqlen_k = p->seqlen_k;
    r->k = p->k;
    r->v = p->v;

    const int paged = kv->block_table != NULL;
    const int64_t es = (int64_t)fa_dtype_size(p->dtype);
    if (paged) {
        if (kv->page_size < 1) return fa_fail(FA_ERR_INVALID_ARGUMENT, "page_size (%d) must be >= 1", kv->page_size);
        if (kv->num_pages < 1) return fa_fail(FA_ERR_INVALID_ARGUMENT, "num_pages (%d) must be >= 1", kv->num_pages);
        if (kv->max_pages < 1) return fa_fail(FA_ERR_INVALID_ARGUMENT, "max_pages (%d) must be >= 1", kv->max_pages);
        if (kv->block_table_stride != 0 && kv->block_table_stride < kv->max_pages)
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "block_table_stride (%lld) must be 0 or >= max_pages (%d)",
                           (long long)kv->block_table_stride, kv->max_pages);
        if (kv->cache_batch_idx)
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "cache_batch_idx must be NULL with a block_table (paged cache)");
    } else {
        if (kv->batch_cache < 1)
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "batch_cache (%d) must be >= 1", kv->batch_cache);
        if (kv->seqlen_cache < 1)
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "seqlen_cache (%d) must be >= 1", kv->seqlen_cache);
    }
    const int64_t dim0 = paged ? kv->num_pages : kv->batch_cache, dim1 = paged ? kv->page_size : kv->seqlen_cache;
    if (append) {
        if ((st = check_output(&kv->k_cache, "k_cache", dim0, dim1, p->heads_kv, p->head_dim, 0)) ||
            (st = check_output(&kv->v_cache, "v_cache", dim0, dim1, p->heads_kv, p->head_dim, 0)))
            return st;
    } else if ((st = check_input(&kv->k_cache, "k_cache", 0)) || (st = check_input(&kv->v_cache, "v_cache", 0))) {
        return st;
    }
    if ((kv->rotary_cos == NULL) != (kv->rotary_sin == NULL))
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "rotary_cos and rotary_sin must both be set or both be NULL");
    if (kv->rotary_cos) {
        if (!append)
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "rotary_cos is set but there are no new tokens (k, v NULL): the "
                                                    "rotary embedding applies to q and the appended keys together");
        if (kv->rotary_dim < 16 || kv->rotary_dim % 16 || kv->rotary_dim > p->head_dim)
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "rotary_dim (%d) must be a multiple of 16 in [16, head_dim = %d]",
                           kv->rotary_dim, p->head_dim);
        if (kv->rotary_seqlen < 1)
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "rotary_seqlen (%d) must be >= 1", kv->rotary_seqlen);
        if (kv->rotary_interleaved != 0 && kv->rotary_interleaved != 1)
            return fa_fail(FA_ERR_INVALID_ARGUMENT, "rotary_interleaved (%d) is not 0 or 1", kv->rotary_interleaved);
    }
    if (kv->num_splits < 0) return fa_fail(FA_ERR_INVALID_ARGUMENT, "num_splits (%d) is negative", kv->num_splits);

    /* Alignment and overlap of every array of the call. The cache is an output when tokens are appended. */
    span sp[16];
    int n = 0;
    int64_t lse_n = (int64_t)p->batch * p->heads_q * p->seqlen_q, bt_n = 0, ro_n = 0;
    if ((st = check_aligned(kv->k_cache.data, (size_t)es, "k_cache.data")) ||
        (st = check_aligned(kv->v_cache.data, (size_t)es, "v_cache.data")) ||
        (st = check_aligned(kv->rotary_cos, (size_t)es, "rotary_cos")) ||
        (st = check_aligned(kv->rotary_sin, (size_t)es, "rotary_sin")) ||
        (st = check_aligned(kv->block_table, 4, "block_table")) ||
        (st = check_aligned(kv->cache_seqlens, 4, "cache_seqlens")) ||
        (st = check_aligned(kv->cache_batch_idx, 4, "cache_batch_idx")) ||
        (st = check_aligned(kv->cache_leftpad, 4, "cache_leftpad")))
        return st;
    if (paged && (__builtin_mul_overflow((int64_t)p->batch - 1,
                                         kv->block_table_stride ? kv->block_table_stride : kv->max_pages, &bt_n) ||
                  __builtin_add_overflow(bt_n, (int64_t)kv->max_pages, &bt_n)))
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "block_table: batch * block_table_stride overflows int64");
    if (kv->rotary_cos) ro_n = (int64_t)kv->rotary_seqlen * (kv->rotary_dim / 2);
    if ((st = tensor_span(&p->q, "q", p->batch, p->seqlen_q, p->heads_q, p->head_dim, es, 0, 0, &sp[n++])) ||
        (st = tensor_span(&p->o, "o", p->batch, p->seqlen_q, p->heads_q, p->head_dim, es, 0, 1, &sp[n++])) ||
        (st = tensor_span(&kv->k_cache, "k_cache", dim0, dim1, p->heads_kv, p->head_dim, es, 0, append, &sp[n++])) ||
        (st = tensor_span(&kv->v_cache, "v_cache", dim0, dim1, p->heads_kv, p->head_dim, es, 0, append, &sp[n++])) ||
        (st = flat_span(p->lse, lse_n, 4, "lse", 1, &sp[n++])) ||
        (st = flat_span(kv->block_table, bt_n, 4, "block_table", 0, &sp[n++])) ||
        (st = flat_span(kv->cache_seqlens, p->batch, 4, "cache_seqlens", 0, &sp[n++])) ||
        (st = flat_span(kv->cache_batch_idx, p->batch, 4, "cache_batch_idx", 0, &sp[n++])) ||
        (st = flat_span(kv->cache_leftpad, p->batch, 4, "cache_leftpad", 0, &sp[n++])) ||
        (st = flat_span(kv->rotary_cos, ro_n, es, "rotary_cos", 0, &sp[n++])) ||
        (st = flat_span(kv->rotary_sin, ro_n, es, "rotary_sin", 0, &sp[n++])))
        return st;
    if (append &&
        ((st = tensor_span(&p->k, "k", p->batch, p->seqlen_k, p->heads_kv, p->head_dim, es, 0, 0, &sp[n++])) ||
         (st = tensor_span(&p->v, "v", p->batch, p->seqlen_k, p->heads_kv, p->head_dim, es, 0, 0, &sp[n++]))))
        return st;
    if (p->alibi_slopes) {
        int64_t count = p->alibi_batch_stride ? (p->batch - 1) * p->alibi_batch_stride + p->heads_q : p->heads_q;
        if ((st = flat_span(p->alibi_slopes, count, 4, "alibi_slopes", 0, &sp[n++]))) return st;
    }
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if ((sp[i].output || sp[j].output) && sp[i].lo < sp[i].hi && sp[j].lo < sp[j].hi && sp[i].lo < sp[j].hi &&
                sp[j].lo < sp[i].hi)
                return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s and %s overlap in memory (%s is an output)", sp[i].name,
                               sp[j].name, sp[i].output ? sp[i].name : sp[j].name);

#ifdef FA_WITH_CUDA
    /* the device backend trusts the int32 arrays (reading them would need a synchronising copy), unless
     * exec.check = 1 asks for that copy */
    if (x->backend == FA_BACKEND_CUDA) {
        if ((st = fa_cuda_check_kvcache(r, kv, x)) != FA_OK || !x->check) return st;
        fa_kvcache h;
        int32_t *buf;
        if ((st = fa_cuda_kvcache_arrays_to_host(r, kv, x, &h, &buf)) != FA_OK) return st;
        st = check_kvcache_arrays(r, &h, 0);
        free(buf);
        return st;
    }
#endif
    if (!host_backend(x->backend))
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "the naive backend has no decode (KV cache) kernel: fa_fwd_kvcache runs on FA_BACKEND_CUDA, "
                       "FA_BACKEND_CPU and FA_BACKEND_REFERENCE");
    return check_kvcache_arrays(r, kv, 1);
}

fa_status fa_check_kvcache(const fa_params *p, const fa_kvcache *kv, const fa_exec *exec) {
    fa_params r;
    fa_exec x;
    return prepare_kvcache(p, kv, exec, &r, &x);
}

fa_status fa_workspace_size_kvcache(const fa_params *p, const fa_kvcache *kv, const fa_exec *exec, size_t *bytes) {
    fa_params r;
    fa_exec x;
    if (!bytes) return fa_fail(FA_ERR_INVALID_ARGUMENT, "bytes is NULL");
    fa_status st = prepare_kvcache(p, kv, exec, &r, &x);
    if (st != FA_OK) return st;
#ifdef FA_WITH_CUDA
    if (x.backend == FA_BACKEND_CUDA) return fa_cuda_workspace_size_kvcache(&r, kv, &x, bytes);
#endif
    *bytes = x.backend == FA_BACKEND_CPU ? fa_cpu_kvcache_workspace_size(&r, kv, x.num_threads) : 0;
    return FA_OK;
}

fa_status fa_fwd_kvcache(const fa_params *p, const fa_kvcache *kv, const fa_exec *exec) {
    fa_params r;
    fa_exec x;
    fa_status st = prepare_kvcache(p, kv, exec, &r, &x);
    if (st != FA_OK) return st;
    if (x.backend == FA_BACKEND_REFERENCE) return fa_reference_fwd_kvcache(&r, kv);
#ifdef FA_WITH_CUDA
    if (x.backend == FA_BACKEND_CUDA) return fa_cuda_fwd_kvcache(&r, kv, &x);
#endif
    if (x.workspace) {
        const size_t need = fa_cpu_kvcache_workspace_size(&r, kv, x.num_threads);
        if (x.workspace_bytes < need)
            return fa_fail(FA_ERR_WORKSPACE_TOO_SMALL, "workspace_bytes (%zu) < required (%zu)", x.workspace_bytes,
                           need);
    }
    return fa_cpu_fwd_kvcache(&r, kv, &x);
}
