/* SPDX-License-Identifier: Apache-2.0 */
/*
 * kernels.h - the host-side contract between the CUDA backend's entry points (backend.cu) and the kernel
 * families. Each family is one descriptor (fa_kernel_family): whether it can run a problem (setting fa_fail's
 * message when not), how much workspace it needs, and the launch on a stream. Params arrive validated and
 * resolved (see internal.h). A new family is one file defining its descriptor plus its row here (and, for a
 * forward, its place in backend.cu's select_fwd).
 */
#ifndef FLASHATTN_CUDA_KERNELS_H
#define FLASHATTN_CUDA_KERNELS_H

#include <cuda_runtime.h>

#include "cuda/hdims.h"
#include "internal.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Compute capability and SM count of the device a call runs on. */
typedef struct fa_cuda_device {
    int ordinal;
    int cc_major, cc_minor;
    int sm_count;
    size_t smem_optin;  /* max dynamic shared memory per block */
    size_t smem_per_sm; /* shared memory of an SM, for all its resident blocks (each also takes smem_reserved) */
    size_t smem_reserved;
} fa_cuda_device;

/* A kernel family. supported() answers FA_OK or a status with fa_fail's message; workspace_size() is the
 * device scratch run() needs (the backend adds alignment slack); run() launches on the stream. */
typedef struct fa_kernel_family {
    const char *name;
    fa_status (*supported)(const fa_params *p, const fa_cuda_device *dev);
    size_t (*workspace_size)(const fa_params *p, const fa_cuda_device *dev);
    fa_status (*run)(const fa_params *p, const fa_cuda_device *dev, void *workspace, cudaStream_t stream);
    /* The choices run() makes for p (tiles, schedule, tile order, grid), in words, into buf; NULL where the
     * family's name says all (flashattn info --plan). */
    void (*describe)(const fa_params *p, const fa_cuda_device *dev, char *buf, size_t size);
} fa_kernel_family;

extern const fa_kernel_family fa2_fwd_family;   /* fa2_fwd.cu */
extern const fa_kernel_family fa2_bwd_family;   /* fa2_bwd.cu */
extern const fa_kernel_family fa3_fwd_family;   /* fa3_fwd.cu */
extern const fa_kernel_family fa3_bwd_family;   /* fa3_bwd.cu */
extern const fa_kernel_family naive_fwd_family; /* naive.cu */
extern const fa_kernel_family naive_bwd_family; /* naive.cu */

/* The families' functions, also called directly by dev/ drivers. */

/* FlashAttention-2 forward (mma.sync, sm_80+): fa2_fwd.cu and its instantiations. */
fa_status fa2_fwd_supported(const fa_params *p, const fa_cuda_device *dev);
size_t fa2_fwd_workspace_size(const fa_params *p, const fa_cuda_device *dev);
fa_status fa2_fwd_run(const fa_params *p, const fa_cuda_device *dev, void *workspace, cudaStream_t stream);

/* FlashAttention-2 backward (mma.sync, sm_80+): preprocess D = rowsum(dO * O), main kernel over key blocks
 * with dQ accumulated in fp32, convert dQ (and dK/dV for GQA). fa2_bwd.cu and its instantiations. */
fa_status fa2_bwd_supported(const fa_params *p, const fa_cuda_device *dev);
size_t fa2_bwd_workspace_size(const fa_params *p, const fa_cuda_device *dev);
fa_status fa2_bwd_run(const fa_params *p, const fa_cuda_device *dev, void *workspace, cudaStream_t stream);

/* A device description with no device behind it (ordinal -1): what the library would choose on it. Where a
 * family's support check would ask the CUDA runtime, it answers from the build instead. */
static inline int fa_cuda_device_is_virtual(const fa_cuda_device *dev) {
    return dev->ordinal < 0;
}

/* FlashAttention-3 forward (TMA, wgmma, warp specialization; sm_90a only): fa3_fwd.cu. fa3_sm90a_available:
 * the device is compute capability 9.0 and the build holds sm_90a code for it. */
int fa3_sm90a_available(const fa_cuda_device *dev);
fa_status fa3_fwd_supported(const fa_params *p, const fa_cuda_device *dev);
size_t fa3_fwd_workspace_size(const fa_params *p, const fa_cuda_device *dev);
fa_status fa3_fwd_run(const fa_params *p, const fa_cuda_device *dev, void *workspace, cudaStream_t stream);
void fa3_fwd_describe(const fa_params *p, const fa_cuda_device *dev, char *buf, size_t size);

/* FlashAttention-3 backward (TMA, wgmma, warp specialization; sm_90a only; dense batches, head dims 64 and
 * 128): fa3_bwd.cu, with the FA2 backward's preprocess and convert kernels. */
fa_status fa3_bwd_supported(const fa_params *p, const fa_cuda_device *dev);
size_t fa3_bwd_workspace_size(const fa_params *p, const fa_cuda_device *dev);
fa_status fa3_bwd_run(const fa_params *p, const fa_cuda_device *dev, void *workspace, cudaStream_t stream);
void fa3_bwd_describe(const fa_params *p, const fa_cuda_device *dev, char *buf, size_t size);

/* Standard attention (S and P in device memory, cuBLAS): naive.cu. */
fa_status naive_supported(const fa_params *p, const fa_cuda_device *dev, int backward);
size_t naive_workspace_size(const fa_params *p, const fa_cuda_device *dev, int backward);
fa_status naive_fwd_run(const fa_params *p, const fa_cuda_device *dev, void *workspace, cudaStream_t stream);
fa_status naive_bwd_run(const fa_params *p, const fa_cuda_device *dev, void *workspace, cudaStream_t stream);

/* Decoding with a KV cache (fa_fwd_kvcache; sm_80+): append, split-KV attention, combine. decode.cu and its
 * instantiations. Not a fa_kernel_family: every entry point also takes the cache. */
fa_status decode_supported(const fa_params *p, const fa_kvcache *kv, const fa_cuda_device *dev);
size_t decode_workspace_size(const fa_params *p, const fa_kvcache *kv, const fa_cuda_device *dev);
void decode_describe(const fa_params *p, const fa_kvcache *kv, const fa_cuda_device *dev, char *buf, size_t size);
fa_status decode_run(const fa_params *p, const fa_kvcache *kv, const fa_cuda_device *dev, void *workspace,
                     cudaStream_t stream);

/* Turns a CUDA error into FA_ERR_DEVICE / FA_ERR_OUT_OF_MEMORY with "what: cudaGetErrorString" detail. */
fa_status fa_cuda_status(cudaError_t err, const char *what);

#ifdef __cplusplus
}
#endif

#endif /* FLASHATTN_CUDA_KERNELS_H */
