/* SPDX-License-Identifier: Apache-2.0 */
/*
 * backend.cu - the CUDA backends' entry points (internal.h): devices and pointers, the checks every CUDA call
 * makes, kernel-family selection (FA3 on compute capability 9.0 when it takes the problem, else FA2),
 * workspace handling, and the naive ("standard attention") backend's entry points.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels.h"

#define FA_STR2(...) #__VA_ARGS__
#define FA_STR(...)  FA_STR2(__VA_ARGS__)

extern "C" fa_status fa_cuda_status(cudaError_t err, const char *what) {
    if (err == cudaSuccess) return FA_OK;
    cudaGetLastError(); /* clear a non-sticky error so that later calls start clean */
    return fa_fail(err == cudaErrorMemoryAllocation ? FA_ERR_OUT_OF_MEMORY : FA_ERR_DEVICE, "%s: %s (%s)", what,
                   cudaGetErrorString(err), cudaGetErrorName(err));
}

/* ---------------------------------------------------------------------------------------------------------
 * Devices and pointers
 * ------------------------------------------------------------------------------------------------------- */

/* The count cannot change within a process (CUDA_VISIBLE_DEVICES is read once, at initialisation), so a
 * successful answer is kept: every call asks for it. */
extern "C" int fa_cuda_device_count(void) {
    static int known = -1;
    int n = __atomic_load_n(&known, __ATOMIC_RELAXED);
    if (n >= 0) return n;
    if (cudaGetDeviceCount(&n) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    __atomic_store_n(&known, n, __ATOMIC_RELAXED);
    return n;
}

/* Why no device is usable. The CUDA runtime is linked statically and opens the driver (libcuda.so.1) itself,
 * so a machine without the driver reaches this point too, with cudaGetDeviceCount failing. */
static fa_status no_device(void) {
    int n = 0, driver = 0;
    cudaError_t err = cudaGetDeviceCount(&n);
    cudaGetLastError();
    if (cudaDriverGetVersion(&driver) != cudaSuccess) driver = 0; /* 0 also means: no driver installed */
    cudaGetLastError();
    if (driver == 0)
        return fa_fail(FA_ERR_NO_DEVICE, "no CUDA driver: libcuda.so.1 could not be loaded (the NVIDIA driver is "
                                         "not installed); the cpu and reference backends do not need it");
    if (err == cudaErrorInsufficientDriver)
        return fa_fail(FA_ERR_NO_DEVICE,
                       "the CUDA driver supports CUDA %d.%d but this library's runtime is CUDA %d.%d: "
                       "update the NVIDIA driver",
                       driver / 1000, driver % 1000 / 10, CUDART_VERSION / 1000, CUDART_VERSION % 1000 / 10);
    if (err != cudaSuccess)
        return fa_fail(FA_ERR_NO_DEVICE, "no usable CUDA device: %s (%s)", cudaGetErrorString(err),
                       cudaGetErrorName(err));
    return fa_fail(FA_ERR_NO_DEVICE, "no CUDA device is present");
}

extern "C" fa_status fa_cuda_device_info(int32_t ordinal, fa_device_info *info) {
    const int n = fa_cuda_device_count();
    if (n == 0) return no_device();
    if (ordinal < 0 || ordinal >= n)
        return fa_fail(FA_ERR_NO_DEVICE, "device %d does not exist (%d device%s present)", ordinal, n,
                       n == 1 ? "" : "s");
    cudaDeviceProp prop;
    fa_status st = fa_cuda_status(cudaGetDeviceProperties(&prop, ordinal), "cudaGetDeviceProperties");
    if (st != FA_OK) return st;
    memset(info, 0, sizeof *info);
    snprintf(info->name, sizeof info->name, "%s", prop.name);
    info->ordinal = ordinal;
    info->cc_major = prop.major;
    info->cc_minor = prop.minor;
    info->sm_count = prop.multiProcessorCount;
    info->memory_bytes = (int64_t)prop.totalGlobalMem;
    return FA_OK;
}

extern "C" int fa_cuda_is_device_pointer(const void *ptr) {
    cudaPointerAttributes attr;
    if (!ptr || cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
        cudaGetLastError();
        return 0;
    }
    return attr.type == cudaMemoryTypeDevice || attr.type == cudaMemoryTypeManaged;
}

/* A tuning build (FA_TUNING: the developer knobs of fa3_fwd.cu and decode.cu) says so, since its timings may not be the
 * defaults'. */
#ifdef FA_TUNING
#define FA_TUNING_INFO " tuning=1"
#else
#define FA_TUNING_INFO ""
#endif

extern "C" const char *fa_cuda_build_info(void) {
#ifdef FA_CUDA_ARCHS /* the build's gencode list, e.g. "80 90a" */
    return "cuda=" FA_STR(__CUDACC_VER_MAJOR__) "." FA_STR(__CUDACC_VER_MINOR__) " archs=" FA_CUDA_ARCHS FA_TUNING_INFO;
#else /* the virtual architectures this file was compiled for, e.g. 800,900 */
    return "cuda=" FA_STR(__CUDACC_VER_MAJOR__) "." FA_STR(__CUDACC_VER_MINOR__) " archs=" FA_STR(__CUDA_ARCH_LIST__)
        FA_TUNING_INFO;
#endif
}

/* A device's attributes, read once per device and process: every call needs them, and the driver's answers
 * do not change. Two threads that both miss compute the same values. */
static fa_status device_attributes(int ordinal, fa_cuda_device *dev) {
    enum { CACHED = 64 };
    static fa_cuda_device cache[CACHED];
    static int ready[CACHED];
    if (ordinal < CACHED && __atomic_load_n(&ready[ordinal], __ATOMIC_ACQUIRE)) {
        *dev = cache[ordinal];
        return FA_OK;
    }
    int smem = 0, smem_sm = 0, smem_reserved = 0;
    fa_status st;
    if ((st = fa_cuda_status(cudaDeviceGetAttribute(&dev->cc_major, cudaDevAttrComputeCapabilityMajor, ordinal),
                             "cudaDeviceGetAttribute")) ||
        (st = fa_cuda_status(cudaDeviceGetAttribute(&dev->cc_minor, cudaDevAttrComputeCapabilityMinor, ordinal),
                             "cudaDeviceGetAttribute")) ||
        (st = fa_cuda_status(cudaDeviceGetAttribute(&dev->sm_count, cudaDevAttrMultiProcessorCount, ordinal),
                             "cudaDeviceGetAttribute")) ||
        (st = fa_cuda_status(cudaDeviceGetAttribute(&smem, cudaDevAttrMaxSharedMemoryPerBlockOptin, ordinal),
                             "cudaDeviceGetAttribute")) ||
        (st = fa_cuda_status(cudaDeviceGetAttribute(&smem_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, ordinal),
                             "cudaDeviceGetAttribute")) ||
        (st = fa_cuda_status(cudaDeviceGetAttribute(&smem_reserved, cudaDevAttrReservedSharedMemoryPerBlock, ordinal),
                             "cudaDeviceGetAttribute")))
        return st;
    dev->ordinal = ordinal;
    dev->smem_optin = (size_t)smem;
    dev->smem_per_sm = (size_t)smem_sm;
    dev->smem_reserved = (size_t)smem_reserved;
    if (ordinal < CACHED) {
        cache[ordinal] = *dev;
        __atomic_store_n(&ready[ordinal], 1, __ATOMIC_RELEASE);
    }
    return FA_OK;
}

/* The device a call runs on: exec.device, or the calling thread's current device for -1. */
static fa_status device_get(const fa_exec *x, fa_cuda_device *dev) {
    int ordinal = x->device;
    if (ordinal < 0) {
        fa_status st = fa_cuda_status(cudaGetDevice(&ordinal), "cudaGetDevice");
        if (st != FA_OK) return st;
    } else {
        const int n = fa_cuda_device_count();
        if (ordinal >= n)
            return fa_fail(FA_ERR_NO_DEVICE, "exec.device (%d) does not exist (%d device%s present)", ordinal, n,
                           n == 1 ? "" : "s");
    }
    return device_attributes(ordinal, dev);
}

/* Makes dev the current device for the duration of a call; *prev is what to restore (-1: nothing). */
static fa_status device_enter(const fa_cuda_device *dev, int *prev) {
    *prev = -1;
    int cur = 0;
    fa_status st = fa_cuda_status(cudaGetDevice(&cur), "cudaGetDevice");
    if (st != FA_OK || cur == dev->ordinal) return st;
    if ((st = fa_cuda_status(cudaSetDevice(dev->ordinal), "cudaSetDevice")) == FA_OK) *prev = cur;
    return st;
}

static void device_leave(int prev) {
    if (prev >= 0) cudaSetDevice(prev);
}

/* A pointer every CUDA backend dereferences on the device: device (or managed) memory of the call's device. */
static fa_status check_device_ptr(const void *ptr, const char *name, const fa_cuda_device *dev) {
    cudaPointerAttributes attr;
    if (cudaPointerGetAttributes(&attr, ptr) != cudaSuccess) {
        cudaGetLastError();
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s is not device memory", name);
    }
    if (attr.type != cudaMemoryTypeDevice && attr.type != cudaMemoryTypeManaged)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s is not device memory", name);
    if (attr.type == cudaMemoryTypeDevice && attr.device != dev->ordinal)
        return fa_fail(FA_ERR_INVALID_ARGUMENT, "%s is memory of device %d, but the call runs on device %d", name,
                       attr.device, dev->ordinal);
    return FA_OK;
}

/* The tensors, lse, cu_seqlens and alibi_slopes a call reads or writes, all device memory. */
static fa_status check_pointers(const fa_params *p, int backward, const fa_cuda_device *dev) {
    struct {
        const void *ptr;
        const char *name;
    } ptrs[] = {
        { p->q.data, "q.data" },
        { p->k.data, "k.data" },
        { p->v.data, "v.data" },
        { p->o.data, "o.data" },
        { p->lse, "lse" },
        { p->cu_seqlens_q, "cu_seqlens_q" },
        { p->cu_seqlens_k, "cu_seqlens_k" },
        { p->alibi_slopes, "alibi_slopes" },
        { p->q_descale, "q_descale" },
        { p->k_descale, "k_descale" },
        { p->v_descale, "v_descale" },
        { backward ? p->dout.data : NULL, "dout.data" },
        { backward ? p->dq.data : NULL, "dq.data" },
        { backward ? p->dk.data : NULL, "dk.data" },
        { backward ? p->dv.data : NULL, "dv.data" },
    };
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++) {
        if (!ptrs[i].ptr) continue; /* optional (lse in the forward, varlen, ALiBi) or not used */
        fa_status st = check_device_ptr(ptrs[i].ptr, ptrs[i].name, dev);
        if (st != FA_OK) return st;
    }
    return FA_OK;
}

/* What the FA2/FA3 kernels need of every call: 16-bit data, a compiled head dim, 16-byte vector access. */
static fa_status check_cuda_rules(const fa_params *p, int backward) {
    if (p->dtype == FA_F32)
        return fa_fail(FA_ERR_UNSUPPORTED, "dtype f32 is not supported by the CUDA backend (use f16 or bf16, or the "
                                           "naive backend)");
    switch (p->head_dim) {
#define HDIM_CASE(D) case D:
        FA_HDIMS(HDIM_CASE)
#undef HDIM_CASE
        break;
    default:
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "head_dim (%d) is not supported by the CUDA backend (compiled:" FA_HDIMS_STR ")", p->head_dim);
    }
    const int varlen = fa_is_varlen(p);
    struct {
        const fa_tensor *t;
        const char *name;
    } ts[] = { { &p->q, "q" },       { &p->k, "k" },   { &p->v, "v" },   { &p->o, "o" },
               { &p->dout, "dout" }, { &p->dq, "dq" }, { &p->dk, "dk" }, { &p->dv, "dv" } };
    const size_t n = backward ? 8 : 4;
    for (size_t i = 0; i < n; i++) {
        const fa_tensor *t = ts[i].t;
        if ((uintptr_t)t->data % 16)
            return fa_fail(FA_ERR_UNSUPPORTED,
                           "%s.data (%p) is not 16-byte aligned (the CUDA kernels load 16-byte "
                           "vectors)",
                           ts[i].name, t->data);
        const int64_t strides[3] = { t->stride_seq, t->stride_head, varlen ? 0 : t->stride_batch };
        const char *names[3] = { "stride_seq", "stride_head", "stride_batch" };
        for (int s = 0; s < 3; s++)
            if (strides[s] % 8)
                return fa_fail(FA_ERR_UNSUPPORTED,
                               "%s.%s (%lld) is not a multiple of 8 elements (the CUDA kernels "
                               "load 16-byte vectors)",
                               ts[i].name, names[s], (long long)strides[s]);
    }
    return FA_OK;
}

/* ---------------------------------------------------------------------------------------------------------
 * Kernel selection and workspace
 * ------------------------------------------------------------------------------------------------------- */

/* FLASHATTN_KERNEL, read at the first call (NULL when unset or empty): the environment of a process is set
 * before it starts calling, and a getenv per call is measurable host time. */
static const char *kernel_env(void) {
    static const char *value;
    static int read;
    if (!__atomic_load_n(&read, __ATOMIC_ACQUIRE)) {
        const char *env = getenv("FLASHATTN_KERNEL");
        value = env && *env ? env : NULL;
        __atomic_store_n(&read, 1, __ATOMIC_RELEASE);
    }
    return value;
}

/* The family exec.kernel asks for, FLASHATTN_KERNEL=fa2|fa3 standing in for AUTO. */
static fa_status kernel_choice(const fa_exec *x, fa_kernel *k) {
    *k = x->kernel;
    if (*k == FA_KERNEL_AUTO) {
        const char *env = kernel_env();
        if (env) {
            if (!strcmp(env, "fa2"))
                *k = FA_KERNEL_FA2;
            else if (!strcmp(env, "fa3"))
                *k = FA_KERNEL_FA3;
            else
                return fa_fail(FA_ERR_INVALID_ARGUMENT, "FLASHATTN_KERNEL=%s is not fa2 or fa3", env);
        }
    }
    return FA_OK;
}

/* FA3 when asked for, or under AUTO on compute capability 9.0 when it takes the problem; FA2 otherwise. *f is
 * the family chosen, also when it declines the problem. */
static fa_status select_fwd(const fa_params *p, const fa_exec *x, const fa_cuda_device *dev,
                            const fa_kernel_family **f) {
    fa_kernel k;
    *f = &fa2_fwd_family;
    fa_status st = kernel_choice(x, &k);
    if (st != FA_OK) return st;
    const int hopper = dev->cc_major == 9 && dev->cc_minor == 0;
    if (p->dtype == FA_E4M3) { /* FA3 alone has an e4m3 kernel: its refusal is the answer */
        *f = &fa3_fwd_family;
        if (k == FA_KERNEL_FA2)
            return fa_fail(FA_ERR_UNSUPPORTED, "dtype FA_E4M3: the FA2 kernel has no e4m3 path (the FA3 kernel has)");
        if (!hopper)
            return fa_fail(FA_ERR_UNSUPPORTED,
                           "dtype FA_E4M3 needs the FA3 kernel, compute capability 9.0 (device %d is %d.%d)",
                           dev->ordinal, dev->cc_major, dev->cc_minor);
        return fa3_fwd_family.supported(p, dev);
    }
    if (k == FA_KERNEL_FA3) {
        *f = &fa3_fwd_family;
        if (!hopper)
            return fa_fail(FA_ERR_UNSUPPORTED, "the FA3 kernel needs compute capability 9.0 (device %d is %d.%d)",
                           dev->ordinal, dev->cc_major, dev->cc_minor);
        return fa3_fwd_family.supported(p, dev);
    }
    if (k == FA_KERNEL_AUTO && hopper) {
        if (fa3_fwd_family.supported(p, dev) == FA_OK) {
            *f = &fa3_fwd_family;
            return FA_OK;
        }
        fa_clear_error(); /* FA3 declined: FA2 runs, and a successful call leaves no message */
    }
    return fa2_fwd_family.supported(p, dev);
}

/* The FA3 backward where it takes the problem (unless FA2 is asked for), else FA2: a backward that FA3 cannot
 * run falls back also when FA3 is asked for, so that a model's forward kernel choice holds for all its
 * problems. */
static fa_status select_bwd(const fa_params *p, const fa_exec *x, const fa_cuda_device *dev,
                            const fa_kernel_family **f) {
    fa_kernel k;
    *f = &fa2_bwd_family;
    fa_status st = kernel_choice(x, &k);
    if (st != FA_OK) return st;
    if (k != FA_KERNEL_FA2 && fa3_bwd_family.supported(p, dev) == FA_OK) {
        *f = &fa3_bwd_family;
        return FA_OK;
    }
    fa_clear_error();
    return fa2_bwd_family.supported(p, dev);
}

static fa_status select_family(const fa_params *p, const fa_exec *x, const fa_cuda_device *dev, int backward,
                               const fa_kernel_family **f) {
    return backward ? select_bwd(p, x, dev, f) : select_fwd(p, x, dev, f);
}

/* The device a plan is made for: exec's, or, where none can be used, a description of an H100 / H200 (132 SMs,
 * compute capability 9.0) with no device behind it (*virtual_device = 1). */
static void plan_device(const fa_exec *x, fa_cuda_device *dev, int *virtual_device) {
    *virtual_device = 0;
    if (device_get(x, dev) == FA_OK) return;
    fa_clear_error();
    memset(dev, 0, sizeof *dev);
    dev->ordinal = -1;
    dev->cc_major = 9;
    dev->cc_minor = 0;
    dev->sm_count = 132;
    dev->smem_optin = 232448;
    dev->smem_per_sm = 233472;
    dev->smem_reserved = 1024;
    *virtual_device = 1;
}

/* The family a call of p would run and its choices, in words (flashattn info --plan), on plan_device's device.
 * Pointers are not looked at. */
extern "C" fa_status fa_cuda_plan(const fa_params *p, const fa_exec *x, int backward, char *buf, size_t size,
                                  int *virtual_device) {
    fa_cuda_device dev;
    plan_device(x, &dev, virtual_device);
    const fa_kernel_family *f;
    fa_status st = select_family(p, x, &dev, backward, &f);
    if (st != FA_OK) return st;
    const int n = snprintf(buf, size, "%s", f->name);
    if (f->describe && n >= 0 && (size_t)n + 2 < size) {
        snprintf(buf + n, size - (size_t)n, ": ");
        f->describe(p, &dev, buf + n + 2, size - (size_t)n - 2);
    }
    return FA_OK;
}

/* The same for a decode call (p resolved as fa_fwd_kvcache resolves it): the split count and the grid. */
extern "C" fa_status fa_cuda_plan_kvcache(const fa_params *p, const fa_kvcache *kv, const fa_exec *x, char *buf,
                                          size_t size, int *virtual_device) {
    fa_cuda_device dev;
    plan_device(x, &dev, virtual_device);
    fa_status st = decode_supported(p, kv, &dev);
    if (st != FA_OK) return st;
    const int n = snprintf(buf, size, "decode: ");
    decode_describe(p, kv, &dev, buf + n, size - (size_t)n);
    return FA_OK;
}

/* A caller's workspace need not be aligned: the sizes the caller is told include this much slack, and the
 * kernels get the workspace from its first 256-byte boundary on (the alignment cudaMalloc gives: enough for the
 * 64-bit tile-counter tag, vector accesses and cuBLAS). */
#define SCRATCH_ALIGN 256

static size_t scratch_size(size_t need) {
    return need > 0 ? need + SCRATCH_ALIGN : 0;
}

/* Scratch for one call: the caller's (checked against need plus the slack), or cudaMallocAsync'd on the
 * stream. */
typedef struct scratch {
    void *ptr;
    int owned;
} scratch;

static fa_status scratch_get(const fa_exec *x, size_t need, cudaStream_t stream, scratch *s) {
    s->ptr = x->workspace;
    s->owned = 0;
    if (x->workspace) {
        if (x->workspace_bytes < scratch_size(need))
            return fa_fail(FA_ERR_WORKSPACE_TOO_SMALL, "workspace_bytes (%zu) < required (%zu)", x->workspace_bytes,
                           scratch_size(need));
        s->ptr = (void *)(((uintptr_t)x->workspace + SCRATCH_ALIGN - 1) & ~(uintptr_t)(SCRATCH_ALIGN - 1));
        return FA_OK;
    }
    if (need == 0) return FA_OK;
    fa_status st = fa_cuda_status(cudaMallocAsync(&s->ptr, need, stream), "cudaMallocAsync (workspace)");
    if (st == FA_OK)
        s->owned = 1;
    else
        s->ptr = NULL;
    return st;
}

static fa_status scratch_put(scratch *s, cudaStream_t stream, fa_status st) {
    if (!s->owned) return st;
    fa_status st2 = fa_cuda_status(cudaFreeAsync(s->ptr, stream), "cudaFreeAsync (workspace)");
    return st != FA_OK ? st : st2;
}

/* Runs a family that takes the problem on dev: the workspace (the caller's or allocated on the stream), the
 * launch, the workspace back, with dev the current device meanwhile. */
static fa_status family_run(const fa_kernel_family *f, const fa_params *p, const fa_exec *x,
                            const fa_cuda_device *dev) {
    int prev;
    fa_status st = device_enter(dev, &prev);
    if (st != FA_OK) return st;
    cudaStream_t stream = (cudaStream_t)x->stream;
    scratch ws;
    st = scratch_get(x, f->workspace_size(p, dev), stream, &ws);
    if (st == FA_OK) {
        st = f->run(p, dev, ws.ptr, stream);
        st = scratch_put(&ws, stream, st);
    }
    device_leave(prev);
    return st;
}

/* ---------------------------------------------------------------------------------------------------------
 * Device-side checks (exec.check = 1)
 * ------------------------------------------------------------------------------------------------------- */

/* The first fault of one cu_seqlens array, in the order the host backends check (flashattn.c): kind 1 [0] is
 * not 0, 2 the sums decrease at sequence b, 3 sequence b is longer than the max, 4 [batch] exceeds the total;
 * 0 none. lo, hi: the array's values at b and b + 1. */
typedef struct seqlens_fault {
    int32_t kind, b, lo, hi;
} seqlens_fault;

/* Block 0 checks cu_seqlens_q, block 1 cu_seqlens_k; the first fault by sequence, then kind. */
static __global__ void __launch_bounds__(256)
    check_seqlens_kernel(const int32_t *cu_q, const int32_t *cu_k, int batch, int max_q, int max_k, int64_t total_q,
                         int64_t total_k, seqlens_fault *out) {
    __shared__ unsigned long long first;
    const int32_t *cu = blockIdx.x ? cu_k : cu_q;
    const int64_t max_len = blockIdx.x ? max_k : max_q, total = blockIdx.x ? total_k : total_q;
    if (threadIdx.x == 0) first = ~0ull;
    __syncthreads();
    for (int b = threadIdx.x; b < batch; b += blockDim.x) {
        const int64_t lo = cu[b], hi = cu[b + 1];
        int kind = 0;
        if (b == 0 && lo != 0)
            kind = 1;
        else if (hi < lo)
            kind = 2;
        else if (hi - lo > max_len)
            kind = 3;
        else if (b == batch - 1 && hi > total)
            kind = 4;
        if (kind) atomicMin(&first, (unsigned long long)b << 3 | (unsigned)kind);
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        seqlens_fault f = { 0, 0, 0, 0 };
        if (first != ~0ull) {
            f.kind = (int32_t)(first & 7), f.b = (int32_t)(first >> 3);
            f.lo = cu[f.b], f.hi = cu[f.b + 1];
        }
        out[blockIdx.x] = f;
    }
}

/* exec.check = 1 waits for what it reads on the device: refused on a stream being captured into a CUDA graph. */
static fa_status refuse_capture(cudaStream_t stream) {
    cudaStreamCaptureStatus capture;
    fa_status st = fa_cuda_status(cudaStreamIsCapturing(stream, &capture), "cudaStreamIsCapturing");
    if (st == FA_OK && capture != cudaStreamCaptureStatusNone)
        st = fa_fail(FA_ERR_INVALID_ARGUMENT, "exec.check = 1 waits for its device-side checks and cannot run while "
                                              "the stream is captured into a CUDA graph");
    return st;
}

/* exec.check = 1 on a device backend: the varlen prefix sums, which the kernels otherwise trust, checked by a
 * pre-pass on the stream during validation (fa_check, fa_workspace_size and every call), before anything is
 * written. The call waits for the answer, so a stream being captured into a CUDA graph is refused. The
 * messages are the host backends', marked "(device check)". */
static fa_status check_device_seqlens(const fa_params *p, const fa_exec *x, const fa_cuda_device *dev) {
    if (!x->check || !fa_is_varlen(p)) return FA_OK;
    cudaStream_t stream = (cudaStream_t)x->stream;
    int prev;
    fa_status st = device_enter(dev, &prev);
    if (st != FA_OK) return st;
    if ((st = refuse_capture(stream)) != FA_OK) goto done;
    {
        seqlens_fault *d_faults = NULL, faults[2];
        st = fa_cuda_status(cudaMallocAsync((void **)&d_faults, sizeof faults, stream), "cudaMallocAsync");
        if (st != FA_OK) goto done;
        check_seqlens_kernel<<<2, 256, 0, stream>>>(p->cu_seqlens_q, p->cu_seqlens_k, p->batch, p->seqlen_q,
                                                    p->seqlen_k, p->total_q, p->total_k, d_faults);
        st = fa_cuda_status(cudaGetLastError(), "cu_seqlens check launch");
        if (st == FA_OK)
            st = fa_cuda_status(cudaMemcpyAsync(faults, d_faults, sizeof faults, cudaMemcpyDeviceToHost, stream),
                                "cu_seqlens check copy");
        const fa_status st_free = fa_cuda_status(cudaFreeAsync(d_faults, stream), "cudaFreeAsync");
        if (st == FA_OK) st = st_free;
        if (st == FA_OK) st = fa_cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize (cu_seqlens check)");
        for (int i = 0; i < 2 && st == FA_OK; i++) {
            const seqlens_fault f = faults[i];
            const char *name = i ? "cu_seqlens_k" : "cu_seqlens_q";
            const int32_t max = i ? p->seqlen_k : p->seqlen_q;
            const int64_t tot = i ? p->total_k : p->total_q;
            if (f.kind == 1)
                st = fa_fail(FA_ERR_INVALID_ARGUMENT, "%s[0] (%d) is not 0 (device check)", name, f.lo);
            else if (f.kind == 2)
                st = fa_fail(FA_ERR_INVALID_ARGUMENT, "%s decreases at index %d (%d -> %d) (device check)", name,
                             f.b + 1, f.lo, f.hi);
            else if (f.kind == 3)
                st = fa_fail(FA_ERR_INVALID_ARGUMENT,
                             "%s: sequence %d has length %lld > the max length %d (device "
                             "check)",
                             name, f.b, (long long)f.hi - f.lo, max);
            else if (f.kind == 4)
                st = fa_fail(FA_ERR_INVALID_ARGUMENT,
                             "%s[batch] (%d) exceeds the total token count (%lld) (device "
                             "check)",
                             name, f.hi, (long long)tot);
        }
    }
done:
    device_leave(prev);
    return st;
}

/* ---------------------------------------------------------------------------------------------------------
 * CUDA backend
 * ------------------------------------------------------------------------------------------------------- */

extern "C" fa_status fa_cuda_check(const fa_params *p, const fa_exec *x, int backward) {
    fa_cuda_device dev;
    const fa_kernel_family *f;
    fa_status st;
    if ((st = check_cuda_rules(p, backward)) || (st = device_get(x, &dev)) ||
        (st = check_pointers(p, backward, &dev)) || (st = select_family(p, x, &dev, backward, &f)))
        return st;
    return check_device_seqlens(p, x, &dev);
}

extern "C" fa_status fa_cuda_workspace_size(const fa_params *p, const fa_exec *x, int backward, size_t *bytes) {
    fa_cuda_device dev;
    const fa_kernel_family *f;
    fa_status st = device_get(x, &dev);
    if (st == FA_OK && (st = select_family(p, x, &dev, backward, &f)) == FA_OK)
        *bytes = scratch_size(f->workspace_size(p, &dev));
    return st;
}

static fa_status cuda_run(const fa_params *p, const fa_exec *x, int backward) {
    fa_cuda_device dev;
    const fa_kernel_family *f;
    fa_status st;
    if ((st = device_get(x, &dev)) || (st = select_family(p, x, &dev, backward, &f))) return st;
    return family_run(f, p, x, &dev);
}

extern "C" fa_status fa_cuda_fwd(const fa_params *p, const fa_exec *x) {
    return cuda_run(p, x, 0);
}

extern "C" fa_status fa_cuda_bwd(const fa_params *p, const fa_exec *x) {
    return cuda_run(p, x, 1);
}

/* ---------------------------------------------------------------------------------------------------------
 * CUDA backend: decoding with a KV cache (decode.cu)
 * ------------------------------------------------------------------------------------------------------- */

/* Everything a decode call dereferences on the device: the forward's pointers, the cache, its int32 arrays and
 * the rotary tables. */
static fa_status check_kvcache_pointers(const fa_params *p, const fa_kvcache *kv, const fa_cuda_device *dev) {
    fa_status st = check_pointers(p, 0, dev);
    if (st != FA_OK) return st;
    struct {
        const void *ptr;
        const char *name;
    } ptrs[] = {
        { kv->k_cache.data, "k_cache.data" },       { kv->v_cache.data, "v_cache.data" },
        { kv->block_table, "block_table" },         { kv->cache_seqlens, "cache_seqlens" },
        { kv->cache_batch_idx, "cache_batch_idx" }, { kv->cache_leftpad, "cache_leftpad" },
        { kv->rotary_cos, "rotary_cos" },           { kv->rotary_sin, "rotary_sin" },
    };
    for (size_t i = 0; i < sizeof ptrs / sizeof ptrs[0]; i++)
        if (ptrs[i].ptr && (st = check_device_ptr(ptrs[i].ptr, ptrs[i].name, dev)) != FA_OK) return st;
    return FA_OK;
}

extern "C" fa_status fa_cuda_check_kvcache(const fa_params *p, const fa_kvcache *kv, const fa_exec *x) {
    fa_cuda_device dev;
    fa_status st;
    if ((st = device_get(x, &dev)) || (st = decode_supported(p, kv, &dev))) return st;
    return check_kvcache_pointers(p, kv, &dev);
}

/* exec.check = 1 for a decode call: the int32 arrays the kernels trust (cache_seqlens, cache_batch_idx,
 * cache_leftpad, block_table), copied to the host after the work queued on the stream, so that they are checked
 * as the host backends check theirs. *h is kv with those arrays in *buf (free() it). */
extern "C" fa_status fa_cuda_kvcache_arrays_to_host(const fa_params *p, const fa_kvcache *kv, const fa_exec *x,
                                                    fa_kvcache *h, int32_t **buf) {
    *h = *kv;
    *buf = NULL;
    const int64_t ld = kv->block_table_stride ? kv->block_table_stride : kv->max_pages;
    const int64_t n_bt = kv->block_table ? (int64_t)(p->batch - 1) * ld + kv->max_pages : 0;
    const int32_t *src[4] = { kv->cache_seqlens, kv->cache_batch_idx, kv->cache_leftpad, kv->block_table };
    const int64_t count[4] = { p->batch, p->batch, p->batch, n_bt };
    int64_t total = 0;
    for (int i = 0; i < 4; i++) total += src[i] ? count[i] : 0;
    if (total == 0) return FA_OK;
    if ((uint64_t)total > SIZE_MAX / sizeof(int32_t) || !(*buf = (int32_t *)malloc((size_t)total * sizeof(int32_t))))
        return fa_fail(FA_ERR_OUT_OF_MEMORY, "cannot allocate %lld bytes to check the decode call's int32 arrays",
                       (long long)total * 4);
    fa_cuda_device dev;
    int prev = -1;
    cudaStream_t stream = (cudaStream_t)x->stream;
    fa_status st = device_get(x, &dev);
    if (st == FA_OK) st = device_enter(&dev, &prev);
    if (st == FA_OK) st = refuse_capture(stream);
    int32_t *dst[4] = { NULL, NULL, NULL, NULL };
    int64_t at = 0;
    for (int i = 0; i < 4 && st == FA_OK; i++) {
        if (!src[i]) continue;
        dst[i] = *buf + at;
        at += count[i];
        st = fa_cuda_status(
            cudaMemcpyAsync(dst[i], src[i], (size_t)count[i] * sizeof(int32_t), cudaMemcpyDeviceToHost, stream),
            "copying the decode call's int32 arrays (exec.check)");
    }
    if (st == FA_OK) st = fa_cuda_status(cudaStreamSynchronize(stream), "cudaStreamSynchronize (exec.check)");
    device_leave(prev);
    if (st != FA_OK) {
        free(*buf);
        *buf = NULL;
        return st;
    }
    h->cache_seqlens = dst[0], h->cache_batch_idx = dst[1], h->cache_leftpad = dst[2], h->block_table = dst[3];
    return FA_OK;
}

extern "C" fa_status fa_cuda_workspace_size_kvcache(const fa_params *p, const fa_kvcache *kv, const fa_exec *x,
                                                    size_t *bytes) {
    fa_cuda_device dev;
    fa_status st = device_get(x, &dev);
    if (st == FA_OK && (st = decode_supported(p, kv, &dev)) == FA_OK)
        *bytes = scratch_size(decode_workspace_size(p, kv, &dev));
    return st;
}

extern "C" fa_status fa_cuda_fwd_kvcache(const fa_params *p, const fa_kvcache *kv, const fa_exec *x) {
    fa_cuda_device dev;
    fa_status st;
    int prev;
    if ((st = device_get(x, &dev)) || (st = decode_supported(p, kv, &dev)) || (st = device_enter(&dev, &prev)))
        return st;
    cudaStream_t stream = (cudaStream_t)x->stream;
    scratch ws;
    st = scratch_get(x, decode_workspace_size(p, kv, &dev), stream, &ws);
    if (st == FA_OK) st = scratch_put(&ws, stream, decode_run(p, kv, &dev, ws.ptr, stream));
    device_leave(prev);
    return st;
}

/* ---------------------------------------------------------------------------------------------------------
 * Naive backend (naive.cu; left out by make FA_NAIVE=0)
 * ------------------------------------------------------------------------------------------------------- */

#ifdef FA_WITH_NAIVE

static const fa_kernel_family *naive_family(int backward) {
    return backward ? &naive_bwd_family : &naive_fwd_family;
}

extern "C" fa_status fa_naive_check(const fa_params *p, const fa_exec *x, int backward) {
    fa_cuda_device dev;
    fa_status st;
    if ((st = device_get(x, &dev)) || (st = check_pointers(p, backward, &dev)) ||
        (st = naive_family(backward)->supported(p, &dev)))
        return st;
    return check_device_seqlens(p, x, &dev);
}

extern "C" fa_status fa_naive_workspace_size(const fa_params *p, const fa_exec *x, int backward, size_t *bytes) {
    fa_cuda_device dev;
    fa_status st = device_get(x, &dev);
    if (st == FA_OK && (st = naive_family(backward)->supported(p, &dev)) == FA_OK)
        *bytes = scratch_size(naive_family(backward)->workspace_size(p, &dev));
    return st;
}

static fa_status naive_run(const fa_params *p, const fa_exec *x, int backward) {
    fa_cuda_device dev;
    fa_status st;
    if ((st = device_get(x, &dev)) || (st = naive_family(backward)->supported(p, &dev))) return st;
    return family_run(naive_family(backward), p, x, &dev);
}

extern "C" fa_status fa_naive_fwd(const fa_params *p, const fa_exec *x) {
    return naive_run(p, x, 0);
}

extern "C" fa_status fa_naive_bwd(const fa_params *p, const fa_exec *x) {
    return naive_run(p, x, 1);
}
#endif
