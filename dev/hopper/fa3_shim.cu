/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fa3_shim.cu - a C entry point to the FA3 forward for dev/hopper/compare.py (ctypes), built into
 * libfa3dev.so by build.sh together with the FA3 sources; the rest of the library is not needed.
 */
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "cuda/fa3_fwd.cuh"

static char g_err[1024];
fa_status fa_fail(fa_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(g_err, sizeof g_err, fmt, ap);
    va_end(ap);
    return status;
}
fa_status fa_cuda_status(cudaError_t err, const char *what) {
    if (err == cudaSuccess) return FA_OK;
    return fa_fail(FA_ERR_DEVICE, "%s: %s", what, cudaGetErrorString(err));
}

extern "C" const char *fa3_dev_error(void) {
    return g_err;
}

/* Dense bf16 forward, scale 1/sqrt(d). layout 0: (batch, seqlen, heads, d); 1: (batch, heads, seqlen, d). */
extern "C" int fa3_dev_forward(void *q, void *k, void *v, void *o, float *lse, int batch, int seqlen, int heads,
                               int d, int causal, int layout, void *workspace, void *stream) {
    static fa_cuda_device dev;
    static int have_dev = 0;
    if (!have_dev) {
        cudaDeviceProp prop;
        if (cudaGetDeviceProperties(&prop, 0) != cudaSuccess) return -1;
        dev.cc_major = prop.major;
        dev.cc_minor = prop.minor;
        dev.sm_count = prop.multiProcessorCount;
        dev.smem_optin = prop.sharedMemPerBlockOptin;
        have_dev = 1;
    }
    fa_params p;
    memset(&p, 0, sizeof p);
    p.dtype = FA_BF16;
    p.batch = batch;
    p.seqlen_q = p.seqlen_k = seqlen;
    p.heads_q = p.heads_kv = heads;
    p.head_dim = d;
    p.softmax_scale = 1.0f / sqrtf((float)d);
    p.causal = causal;
    p.window_left = -1;
    p.window_right = causal ? 0 : -1;
    fa_tensor t;
    if (layout == 1) {
        t.stride_batch = (int64_t)heads * seqlen * d;
        t.stride_head = (int64_t)seqlen * d;
        t.stride_seq = d;
    } else {
        t.stride_batch = (int64_t)seqlen * heads * d;
        t.stride_seq = (int64_t)heads * d;
        t.stride_head = d;
    }
    p.q = p.k = p.v = p.o = t;
    p.q.data = q;
    p.k.data = k;
    p.v.data = v;
    p.o.data = o;
    p.lse = lse;
    return (int)fa3_fwd_run(&p, &dev, workspace, (cudaStream_t)stream);
}
