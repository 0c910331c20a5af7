/* SPDX-License-Identifier: Apache-2.0 */
/*
 * hopper.cuh - inline-PTX wrappers for the Hopper (sm_90a) features the FA3 forward uses: mbarriers, TMA
 * (cp.async.bulk.tensor) loads and stores, wgmma fences and shared-memory matrix descriptors, setmaxnreg and
 * named barriers. The bodies exist only in the sm_90a device pass; elsewhere the functions are empty so that
 * the sm_80 pass of the same translation unit still compiles (nothing calls them there).
 */
#ifndef FLASHATTN_CUDA_HOPPER_CUH
#define FLASHATTN_CUDA_HOPPER_CUH

#include <stdint.h>

#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define FA_SM90A 1
#else
#define FA_SM90A 0
#endif

#define HP_DEV static __device__ __forceinline__

HP_DEV uint32_t hp_smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* ---- mbarriers ---- */

HP_DEV void hp_mbar_init(uint32_t bar, uint32_t count) {
#if FA_SM90A
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
#endif
}

/* Makes barrier initialisation visible to the other threads and to the async proxy (TMA). */
HP_DEV void hp_fence_barrier_init() {
#if FA_SM90A
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}

/* One arrival that also announces `bytes` of TMA transactions the current phase must receive. */
HP_DEV void hp_mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
#if FA_SM90A
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
#endif
}

/* Release arrival: the caller's earlier shared-memory reads are ordered before whoever waits on the phase. */
HP_DEV void hp_mbar_arrive(uint32_t bar) {
#if FA_SM90A
    asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
#endif
}

HP_DEV void hp_mbar_arrive_cnt(uint32_t bar, uint32_t count) {
#if FA_SM90A
    asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(count) : "memory");
#endif
}

/* Waits until the phase with the given parity has completed. */
HP_DEV void hp_mbar_wait(uint32_t bar, uint32_t parity) {
#if FA_SM90A
    uint32_t done;
    do {
        asm volatile("{\n.reg .pred p;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2, 10000000;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done)
                     : "r"(bar), "r"(parity)
                     : "memory");
    } while (!done);
#endif
}

/* ---- TMA ---- */

HP_DEV void hp_prefetch_tensor_map(const void *map) {
#if FA_SM90A
    asm volatile("prefetch.tensormap [%0];" ::"l"((uint64_t)map) : "memory");
#endif
}

/* Loads the box at coordinates (c0..c4) of a 5-D tensor map into shared memory; completes on `bar`. */
HP_DEV void hp_tma_load_5d(uint32_t dst, const void *map, uint32_t bar, int c0, int c1, int c2, int c3, int c4) {
#if FA_SM90A
    asm volatile("cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
                 " [%0], [%1, {%2, %3, %4, %5, %6}], [%7];" ::"r"(dst),
                 "l"((uint64_t)map), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar)
                 : "memory");
#endif
}

/* Stores a shared-memory box to coordinates (c0..c4); elements outside the tensor are not written. */
HP_DEV void hp_tma_store_5d(const void *map, uint32_t src, int c0, int c1, int c2, int c3, int c4) {
#if FA_SM90A
    asm volatile("cp.async.bulk.tensor.5d.global.shared::cta.tile.bulk_group [%0, {%2, %3, %4, %5, %6}], [%1];" ::"l"(
                     (uint64_t)map),
                 "r"(src), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
                 : "memory");
#endif
}

HP_DEV void hp_tma_store_commit() {
#if FA_SM90A
    asm volatile("cp.async.bulk.commit_group;" ::: "memory");
#endif
}

/* Waits until every committed store has finished reading its shared-memory source. */
HP_DEV void hp_tma_store_wait_read() {
#if FA_SM90A
    asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");
#endif
}

/* Orders this thread's ordinary shared-memory writes before later async-proxy (TMA, wgmma) accesses. */
HP_DEV void hp_fence_proxy_async() {
#if FA_SM90A
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
}

/* ---- wgmma ---- */

HP_DEV void hp_wgmma_fence() {
#if FA_SM90A
    asm volatile("wgmma.fence.sync.aligned;" ::: "memory");
#endif
}

HP_DEV void hp_wgmma_commit() {
#if FA_SM90A
    asm volatile("wgmma.commit_group.sync.aligned;" ::: "memory");
#endif
}

/* Waits until at most N committed wgmma groups of this warpgroup are still in flight. */
template <int N>
HP_DEV void hp_wgmma_wait() {
#if FA_SM90A
    asm volatile("wgmma.wait_group.sync.aligned %0;" ::"n"(N) : "memory");
#endif
}

/* Keeps the compiler from moving accesses of wgmma operand registers across this point. */
HP_DEV void hp_fence_reg(float &x) {
    asm volatile("" : "+f"(x)::"memory");
}
HP_DEV void hp_fence_reg(uint32_t &x) {
    asm volatile("" : "+r"(x)::"memory");
}

/* Shared-memory matrix descriptor of a 128B-swizzled operand (layout type 1 in bits 62-63). Offsets are in
 * bytes; the tile must start on a 1024-byte boundary so that the base-offset field stays 0. */
HP_DEV uint64_t hp_desc_sw128(uint32_t smem_addr, uint32_t lead_byte_offset, uint32_t stride_byte_offset) {
    return (uint64_t)((smem_addr & 0x3FFFFu) >> 4) | ((uint64_t)((lead_byte_offset >> 4) & 0x3FFFu) << 16) |
           ((uint64_t)((stride_byte_offset >> 4) & 0x3FFFu) << 32) | (1ull << 62);
}

/* desc moved on by off16 16-byte units inside its start-address field, with a 32-bit add on the low word: the
 * 64-bit add would be carried into the high word with IADD3 + IMAD.X for every wgmma. */
HP_DEV uint64_t hp_desc_add(uint64_t desc, uint32_t off16) {
    return (desc & 0xFFFFFFFF00000000ull) | (uint32_t)((uint32_t)desc + off16);
}

/* ---- registers, barriers ---- */

/* setmaxnreg moves registers within the CTA's own pool, which holds what the launch gave it: the per-thread
 * count of a kernel with `threads` threads and one CTA per SM (65536 / threads, down to a multiple of 8). A split
 * whose warpgroups ask for more in all makes setmaxnreg.inc wait forever. */
__host__ __device__ constexpr int hp_launch_regs(int threads) {
    return 65536 / threads / 8 * 8;
}
__host__ __device__ constexpr bool hp_reg_split_fits(int producer, int consumer, int consumers) {
    return producer + consumers * consumer <= (consumers + 1) * hp_launch_regs(128 * (consumers + 1)) &&
           producer % 8 == 0 && consumer % 8 == 0 && producer >= 24 && consumer <= 256;
}

template <int R>
HP_DEV void hp_setmaxnreg_inc() {
#if FA_SM90A
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R));
#endif
}

template <int R>
HP_DEV void hp_setmaxnreg_dec() {
#if FA_SM90A
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R));
#endif
}

/* Named barriers (id 0 is __syncthreads); count is the number of threads, a multiple of 32. */
HP_DEV void hp_bar_sync(int id, int count) {
    asm volatile("bar.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}

/* The same for warps that reach it from different code (barrier.sync without .aligned: bar.sync requires every
 * warp of the barrier to execute the same instruction). */
HP_DEV void hp_bar_sync_unaligned(int id, int count) {
    asm volatile("barrier.sync %0, %1;" ::"r"(id), "r"(count) : "memory");
}

HP_DEV void hp_bar_arrive(int id, int count) {
    asm volatile("bar.arrive %0, %1;" ::"r"(id), "r"(count) : "memory");
}

HP_DEV float hp_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

/* tanh through exp2: about 1e-7 absolute error, where tanh.approx.f32 has 2^-11 relative error (too coarse for
 * a softcap of 30 or more, whose scores it scales). */
HP_DEV float hp_tanh(float x) {
    const float t = hp_exp2(x * 2.8853900817779268f); /* e^(2x) */
    return 1.0f - __fdividef(2.0f, t + 1.0f);
}

#endif /* FLASHATTN_CUDA_HOPPER_CUH */
