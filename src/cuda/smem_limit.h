/* SPDX-License-Identifier: Apache-2.0 */
/*
 * smem_limit.h - the shared memory per block that the CUDA kernels' tile selection may assume on a device
 * (the FA2 forward and backward take the first row of their tile tables that fits).
 */
#ifndef FLASHATTN_CUDA_SMEM_LIMIT_H
#define FLASHATTN_CUDA_SMEM_LIMIT_H

#include <stdlib.h>

#include "kernels.h"

/* The device's opt-in shared memory per block, or less under FLASHATTN_SMEM_LIMIT=<bytes>: a testing knob that
 * makes the selection take the configurations of GPUs with less shared memory (A100: 166912 bytes; sm_86,
 * sm_89: 101376), so that they run and can be checked on a larger one. A value that is not a decimal number,
 * or not below the device's limit, is ignored. */
static inline size_t fa_cuda_smem_limit(const fa_cuda_device *dev) {
    const char *env = getenv("FLASHATTN_SMEM_LIMIT");
    if (env != NULL && *env != '\0') {
        char *end;
        const unsigned long long cap = strtoull(env, &end, 10);
        if (*end == '\0' && cap < dev->smem_optin) return (size_t)cap;
    }
    return dev->smem_optin;
}

/* Whether `blocks` blocks of `smem` bytes each fit in one SM's shared memory. Under FLASHATTN_SMEM_LIMIT the SM
 * is taken to hold the capped per-block limit plus one block's reservation, as on the GPUs it stands for
 * (A100: 166912 + 1024 of 167936). */
static inline int fa_cuda_smem_fits_sm(const fa_cuda_device *dev, size_t smem, int blocks) {
    size_t per_sm = dev->smem_per_sm;
    const size_t limit = fa_cuda_smem_limit(dev);
    if (limit < dev->smem_optin && limit + dev->smem_reserved < per_sm) per_sm = limit + dev->smem_reserved;
    return (size_t)blocks * (smem + dev->smem_reserved) <= per_sm;
}

#endif /* FLASHATTN_CUDA_SMEM_LIMIT_H */
