/* SPDX-License-Identifier: Apache-2.0 */
/*
 * bwd_common.cuh - device helpers of the FA2 backward that common.cuh does not have: 4-byte cp.async (with zero
 * fill), waiting for every cp.async group, and 32-bit shared-memory loads and stores by address.
 */
#ifndef FLASHATTN_CUDA_BWD_COMMON_CUH
#define FLASHATTN_CUDA_BWD_COMMON_CUH

#include <limits.h>
#include <stdint.h>

#include "common.cuh"

/* 4-byte global -> shared copy; valid = 0 fills the destination with zeros and reads nothing. */
static __device__ __forceinline__ void bwd_cp_async4(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 4 : 0));
}

static __device__ __forceinline__ void bwd_st_shared_u32(uint32_t addr, uint32_t v) {
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(addr), "r"(v));
}
static __device__ __forceinline__ uint32_t bwd_ld_shared_u32(uint32_t addr) {
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
    return v;
}
static __device__ __forceinline__ uint4 bwd_ld_shared_u128(uint32_t addr) {
    uint4 v;
    asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
    return v;
}

#endif /* FLASHATTN_CUDA_BWD_COMMON_CUH */
