/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fa3_fp8.cuh - the parts an e4m3 FA3 forward adds to the 16-bit one (sm_90a): e4m3 wgmma takes both operands
 * K-major, so
 *   - V, loaded by TMA with the head dim contiguous (MN-major for O += P V), is transposed in shared memory into
 *     V^T tiles whose rows are head-dim columns and whose 128 bytes are the block's keys (fa3_fp8_transpose_v);
 *   - P leaves the S = Q K^T accumulator as the A operand of a k32 product, four e4m3 per register
 *     (fa3_fp8_pack_p). A thread's accumulator holds keys 8j + 2q + {0, 1} of a 32-key chunk (q = lane % 4,
 *     j = 0..3) and the A operand wants keys 4q..4q+3 and 16+4q..16+4q+3 of it. Rather than move values between
 *     lanes, each register takes the thread's own four keys {2q, 2q+1, 8+2q, 9+2q} (and {16+2q, .., 25+2q}),
 *     and V^T stores its keys in the order that makes those the keys the product multiplies them with: key
 *     32c + 8j + 2q + e at position 32c + 16 (j / 2) + 4q + 2 (j % 2) + e (fa3_fp8_key_pos). A sum over keys does
 *     not care about their order.
 * Tiles are 128 bytes wide with the 128-byte swizzle (the 16-byte chunk index XOR the row mod 8), as TMA
 * writes them and wgmma reads them: a [rows][128 B] slab per 128 head-dim bytes for V, one [D rows][BN = 128 B]
 * tile for V^T.
 */
#ifndef FLASHATTN_CUDA_FA3_FP8_CUH
#define FLASHATTN_CUDA_FA3_FP8_CUH

#include <cuda_fp8.h>
#include <stdint.h>

#include "cuda/common.cuh"

/* Byte offset of (row, byte) in a tile of 128-byte rows with the 128-byte swizzle. */
static __host__ __device__ __forceinline__ uint32_t fa3_sw128(uint32_t row, uint32_t byte) {
    return row * 128 + ((((byte >> 4) ^ row) & 7) << 4) + (byte & 15);
}

/* The head dim of the shared-memory tiles: at least one 128-byte slab per row, so that head dim 64 (64-byte rows)
 * takes the 128-byte swizzle and every part of the larger head dims (TMA boxes, descriptors, the V^T writer):
 * its tensor maps give 64 bytes of each row and TMA fills the box's other 64 with zeros, which Q K^T (two k32
 * steps) and the V^T writer (two column groups) never read. */
static __host__ __device__ constexpr int fa3_fp8_tile_d(int d) {
    return d < 128 ? 128 : d;
}

/* Position in V^T of key k of a block (see the file's comment). */
static __host__ __device__ __forceinline__ int fa3_fp8_key_pos(int k) {
    const int c = k >> 5, j = (k >> 3) & 3, q = (k >> 1) & 3, e = k & 1;
    return 32 * c + 16 * (j >> 1) + 4 * q + 2 * (j & 1) + e;
}

/* Four floats as e4m3 bytes, x0 in the lowest (cvt packs its first source into the upper byte). */
static __device__ __forceinline__ uint32_t fa3_fp8_pack4(float x0, float x1, float x2, float x3) {
    uint16_t lo = 0, hi = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890 /* the cvt to e4m3 */
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(lo) : "f"(x1), "f"(x0));
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(hi) : "f"(x3), "f"(x2));
#endif
    return (uint32_t)lo | (uint32_t)hi << 16;
}

/* P (the S accumulator of a 64 x BN block, already exponentiated) as the A operand of O += P V^T: for each
 * 32-key chunk c, registers 4c..4c+3 are a0..a3 of its k32 product. */
template <int BN>
static __device__ __forceinline__ void fa3_fp8_pack_p(const float (&s)[BN / 2], uint32_t (&p)[BN / 8]) {
#pragma unroll
    for (int c = 0; c < BN / 32; ++c) {
        const float *x = s + 16 * c;
        p[4 * c + 0] = fa3_fp8_pack4(x[0], x[1], x[4], x[5]);     /* row g: keys 2q, 2q+1, 8+2q, 9+2q */
        p[4 * c + 1] = fa3_fp8_pack4(x[2], x[3], x[6], x[7]);     /* row g + 8 */
        p[4 * c + 2] = fa3_fp8_pack4(x[8], x[9], x[12], x[13]);   /* row g: keys 16+2q, .., 25+2q */
        p[4 * c + 3] = fa3_fp8_pack4(x[10], x[11], x[14], x[15]); /* row g + 8 */
    }
}

/* V (BN = 128 keys x D bytes, [max(D / 128, 1) slabs][128 rows][128 B]: head dim 64 fills half of each row) into
 * V^T ([D rows][128 B], keys at fa3_fp8_key_pos) by NW warps, one 16-key x 32-byte block (key group g, head-dim
 * bytes 32 cg..) per task:
 *   - ldmatrix .trans of four 8 x 8 16-bit matrices (keys 16 g + 8 (i % 2) + 0..7, head-dim bytes
 *     32 cg + 16 (i / 2) + 0..15, matrix i = lane / 8): register i of lane (c = lane / 4, q = lane % 4) holds the
 *     16-bit pair of bytes n = 2c, 2c + 1 of keys 2q, 2q + 1 of its matrix;
 *   - byte permutes of registers 0, 1 (and 2, 3) pick bytes n = 2c (or 2c + 1) of keys 2q, 2q + 1, 8 + 2q,
 *     9 + 2q: the four V^T bytes 16 g + 4q..4q + 3 of row n;
 *   - stmatrix (no transpose) writes register i of lane c, q to bytes 4q.. of row c of matrix i: the 16 bytes at
 *     16 g of V^T row n. Lanes c >= 4 swap their even and odd rows, so that each matrix's eight rows have eight
 *     different n % 8 and hence, under the swizzle, eight different 16-byte chunks.
 * The eight rows of each loaded matrix are consecutive keys, so eight chunks too: no bank conflicts.
 * Addresses: a lane's row in task (g, cg) is its row in task (0, 0) with the 16-byte chunk index XOR a constant
 * (cg % 4 for ldmatrix, g for stmatrix), plus a constant. The XOR acts on address bits 4-6 only, which the
 * 128-byte aligned stage bases and the 128-byte rows leave to the chunk index; so each address is one register
 * plus an immediate once the task is known at compile time, and consecutive tasks share their registers. */

/* The tasks: t = (cg % 4) * 8 * D / 128 + g * D / 128 + cg / 4 (a column group's tasks together, so that the
 * ldmatrix XOR changes every 2 D / 32 tasks and the stmatrix one every D / 128), cut into NW runs of
 * consecutive tasks, run W for warp W. */
template <int D, int NW, int W>
struct fa3_fp8_vt_tasks {
    static constexpr int kSlabs = fa3_fp8_tile_d(D) / 128, kTasks = 8 * D / 32;
    static constexpr int kFirst = W * kTasks / NW, kCount = (W + 1) * kTasks / NW - kFirst;
    static __host__ __device__ constexpr int g(int k) {
        return ((kFirst + k) / kSlabs) % 8;
    }
    static __host__ __device__ constexpr int cg(int k) {
        return 4 * ((kFirst + k) % kSlabs) + (kFirst + k) / (8 * kSlabs);
    }
};

/* A lane's ldmatrix row in task (0, 0): key 8 (i % 2) + r (r = lane % 8, i = lane / 8), chunk (i / 2) ^ r. */
static __host__ __device__ __forceinline__ uint32_t fa3_fp8_vt_ld_lane(uint32_t lane) {
    const uint32_t i = lane >> 3, r = lane & 7;
    return (8 * (i & 1) + r) * 128 + (((i >> 1) ^ r) << 4);
}
/* ... in task (g, cg): (V stage + fa3_fp8_vt_ld_lane) ^ fa3_fp8_vt_ld_xor + fa3_fp8_vt_ld_off, key
 * 16 g + 8 (i % 2) + r, chunk (2 (cg % 4) + i / 2) ^ r of slab cg / 4. */
static __host__ __device__ __forceinline__ uint32_t fa3_fp8_vt_ld_xor(int cg) {
    return (cg & 3) << 5;
}
static __host__ __device__ __forceinline__ uint32_t fa3_fp8_vt_ld_off(int g, int cg) {
    return g * (16 * 128) + (cg >> 2) * (128 * 128);
}
/* A lane's stmatrix row in task (0, 0): V^T row n (see above), chunk n % 8. */
static __host__ __device__ __forceinline__ uint32_t fa3_fp8_vt_st_lane(uint32_t lane) {
    const uint32_t i = lane >> 3, r = lane & 7, n = 16 * (i >> 1) + 2 * r + ((i & 1) ^ (r >> 2));
    return n * 128 + ((n & 7) << 4);
}
/* ... in task (g, cg): (V^T stage + fa3_fp8_vt_st_lane) ^ fa3_fp8_vt_st_xor + fa3_fp8_vt_st_off, row 32 cg + n,
 * chunk g ^ (n % 8). */
static __host__ __device__ __forceinline__ uint32_t fa3_fp8_vt_st_xor(int g) {
    return g << 4;
}
static __host__ __device__ __forceinline__ uint32_t fa3_fp8_vt_st_off(int cg) {
    return cg * (32 * 128);
}
/* The byte-permute selector of a lane's stmatrix registers 0 and 2; registers 1 and 3 take it ^ 0x1111. */
static __host__ __device__ __forceinline__ uint32_t fa3_fp8_vt_sel(uint32_t lane) {
    return lane >= 16 ? 0x7531 : 0x6420;
}

/* x ^ d, opaque to the compiler: it would fold a chain of these back into the first x and keep every link alive
 * (registers that the 24-register producer at head dim 256 does not have; ptxas spilled). */
static __device__ __forceinline__ uint32_t fa3_fp8_vt_rexor(uint32_t x, uint32_t d) {
    if (d != 0) {
        x ^= d;
        asm volatile("" : "+r"(x));
    }
    return x;
}

/* Warp W's run of tasks, two in flight: task k + 1's ldmatrix is issued before task k's permutes and stmatrix
 * (no ldmatrix can pass an earlier stmatrix: the compiler does not know that they do not overlap). Live across
 * the run: the ldmatrix and stmatrix registers, each moved on by an XOR where the run changes column group or
 * key group, the two selectors and the data. The lane comes from %laneid here, so that the caller's loop over V
 * blocks does not hold the lane's constants (at head dim 256 it spilled them). The caller orders the reads after
 * V's arrival and the writes before wgmma's reads (fence.proxy.async and a barrier). */
template <int D, int NW, int W>
static __device__ __forceinline__ void fa3_fp8_transpose_v_warp(uint32_t s_v, uint32_t s_vt) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900 /* stmatrix */
    typedef fa3_fp8_vt_tasks<D, NW, W> T;
    constexpr int kDepth = 2;
    uint32_t lane;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    uint32_t ldx = (s_v + fa3_fp8_vt_ld_lane(lane)) ^ fa3_fp8_vt_ld_xor(T::cg(0));
    uint32_t stx = (s_vt + fa3_fp8_vt_st_lane(lane)) ^ fa3_fp8_vt_st_xor(T::g(0));
    const uint32_t sel_even = fa3_fp8_vt_sel(lane), sel_odd = sel_even ^ 0x1111;
    uint32_t v[kDepth][4];
#pragma unroll
    for (int k = -(kDepth - 1); k < T::kCount; ++k) {
        const int kn = k + kDepth - 1; /* the task loaded now; k is the one stored */
        if (kn < T::kCount) {
            if (kn > 0) ldx = fa3_fp8_vt_rexor(ldx, fa3_fp8_vt_ld_xor(T::cg(kn - 1)) ^ fa3_fp8_vt_ld_xor(T::cg(kn)));
            fa_ldmatrix_x4_trans(v[kn % kDepth], ldx + fa3_fp8_vt_ld_off(T::g(kn), T::cg(kn)));
        }
        if (k < 0) continue;
        if (k > 0) stx = fa3_fp8_vt_rexor(stx, fa3_fp8_vt_st_xor(T::g(k - 1)) ^ fa3_fp8_vt_st_xor(T::g(k)));
        const uint32_t *x = v[k % kDepth];
        fa_stmatrix_x4(stx + fa3_fp8_vt_st_off(T::cg(k)), __byte_perm(x[0], x[1], sel_even),
                       __byte_perm(x[0], x[1], sel_odd), __byte_perm(x[2], x[3], sel_even),
                       __byte_perm(x[2], x[3], sel_odd));
    }
#endif
}

/* The transpose by NW warps (thread t < 32 NW); s_v and s_vt 128-byte aligned (swizzled tiles: 1024). */
template <int D, int NW = 4>
static __device__ __forceinline__ void fa3_fp8_transpose_v(uint32_t s_v, uint32_t s_vt, int t) {
    static_assert((D == 64 || D % 128 == 0) && NW >= 1 && NW <= 4,
                  "e4m3 V tiles are 128-byte slabs (head dim 64: half of one); up to 4 warps");
    const int w = t / 32;
    if (w == 0) fa3_fp8_transpose_v_warp<D, NW, 0>(s_v, s_vt);
    if constexpr (NW > 1)
        if (w == 1) fa3_fp8_transpose_v_warp<D, NW, 1>(s_v, s_vt);
    if constexpr (NW > 2)
        if (w == 2) fa3_fp8_transpose_v_warp<D, NW, 2>(s_v, s_vt);
    if constexpr (NW > 3)
        if (w == 3) fa3_fp8_transpose_v_warp<D, NW, 3>(s_v, s_vt);
}

#endif /* FLASHATTN_CUDA_FA3_FP8_CUH */
