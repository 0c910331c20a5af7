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

/* Byte offset of (row, byte) in a tile of 128-byte rows with the 128-byte swizzle. */
static __host__ __device__ __forceinline__ uint32_t fa3_sw128(uint32_t row, uint32_t byte) {
    return row * 128 + ((((byte >> 4) ^ row) & 7) << 4) + (byte & 15);
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

/* V (BN = 128 keys x D bytes, [D / 128 slabs][128 rows][128 B]) into V^T ([D rows][128 B], keys at
 * fa3_fp8_key_pos), by warp W of NW. A lane moves 4 x 4-byte blocks: the four keys that land on four consecutive
 * V^T bytes (32c + 16h + 2q + {0, 1, 8, 9}, key group 8c + 4h + q) times four head-dim bytes n0..n0 + 3, read as
 * four words, transposed by byte permutes, written as four words. The lane's q is lane bits 0-1 and n0 / 4 mod 8
 * lane bits 2-4, and it writes its four rows from row n0 + (n0 / 8 mod 4) on (the words rotated to match): then
 * each of a warp's four reads and four writes hits 32 different banks (the swizzle XORs the 16-byte chunk with
 * the row). Every address is a per-lane base plus the task's offset, with one XOR for the swizzle. The caller
 * orders the reads after V's
 * arrival and the writes before wgmma's reads (fence.proxy.async and a barrier). */
template <int D, int NW, int W>
static __device__ __forceinline__ void fa3_fp8_transpose_v_warp(uint32_t s_v, uint32_t s_vt, int lane) {
    constexpr int kTasks = 8 * (D / 32); /* (c, h) x 32-column groups */
    const uint32_t q = lane & 3, cwl = lane >> 2, rot = (cwl >> 1) & 3;
    /* reads: row 32c + 16h + 2q + off, chunk (column chunk) ^ (row % 8) = x[off % 2] ^ (2 (n0 / 32 mod 4)) */
    const uint32_t ld = s_v + 256 * q + 4 * (cwl & 3);
    const uint32_t x0 = ((cwl >> 2) ^ (2 * q)) << 4, x1 = ((cwl >> 2) ^ (2 * q + 1)) << 4;
    /* writes: word e to row n0 + (e + rot) % 4 = 32 (task / 8) + r, chunk (2c + h) ^ (r % 8), byte 4q (the
     * bases are recomputed per word: kept for all four, they spilled at head dim 256's 24 producer registers) */
    const uint32_t st = s_vt + 4 * cwl * 128 + 4 * q, y = (cwl & 1) << 6;
#pragma unroll 1
    for (int task = W; task < kTasks; task += NW) {
        const int c = (task & 7) >> 1, h = task & 1, cg = task >> 3; /* cg: which 32 columns */
        const uint32_t cx = (cg & 3) << 5, a0 = ld + (x0 ^ cx), a1 = ld + (x1 ^ cx);
        const int off = (cg >> 2) * (128 * 128) + (32 * c + 16 * h) * 128;
        uint32_t w0, w1, w2, w3;
        asm volatile("ld.shared.b32 %0, [%1];" : "=r"(w0) : "r"(a0 + off));
        asm volatile("ld.shared.b32 %0, [%1];" : "=r"(w1) : "r"(a1 + off + 128));
        asm volatile("ld.shared.b32 %0, [%1];" : "=r"(w2) : "r"(a0 + off + 8 * 128));
        asm volatile("ld.shared.b32 %0, [%1];" : "=r"(w3) : "r"(a1 + off + 9 * 128));
        /* rotated by rot bytes, so that out[e] below is head-dim byte (e + rot) % 4 of the four keys */
        w0 = __funnelshift_r(w0, w0, 8 * rot);
        w1 = __funnelshift_r(w1, w1, 8 * rot);
        w2 = __funnelshift_r(w2, w2, 8 * rot);
        w3 = __funnelshift_r(w3, w3, 8 * rot);
        /* 4 x 4 byte transpose: out[e] holds byte e of w0, w1, w2, w3 */
        const uint32_t a_lo = __byte_perm(w0, w1, 0x5140), a_hi = __byte_perm(w0, w1, 0x7362);
        const uint32_t b_lo = __byte_perm(w2, w3, 0x5140), b_hi = __byte_perm(w2, w3, 0x7362);
        const uint32_t out[4] = { __byte_perm(a_lo, b_lo, 0x5410), __byte_perm(a_lo, b_lo, 0x7632),
                                  __byte_perm(a_hi, b_hi, 0x5410), __byte_perm(a_hi, b_hi, 0x7632) };
        const uint32_t px = (uint32_t)(2 * c + h) << 4;
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const uint32_t er = (e + rot) & 3;
            asm volatile("st.shared.b32 [%0], %1;" ::"r"(st + er * 128 + ((y | er << 4) ^ px) + cg * 32 * 128),
                         "r"(out[e])
                         : "memory");
        }
    }
}

/* The transpose by NW warps (thread t < 32 NW). */
template <int D, int NW = 4>
static __device__ __forceinline__ void fa3_fp8_transpose_v(uint32_t s_v, uint32_t s_vt, int t) {
    static_assert(D % 128 == 0 && NW >= 1 && NW <= 4, "e4m3 V tiles are whole 128-byte slabs; up to 4 warps");
    const int w = t / 32, lane = t % 32;
    if (w == 0) fa3_fp8_transpose_v_warp<D, NW, 0>(s_v, s_vt, lane);
    if constexpr (NW > 1)
        if (w == 1) fa3_fp8_transpose_v_warp<D, NW, 1>(s_v, s_vt, lane);
    if constexpr (NW > 2)
        if (w == 2) fa3_fp8_transpose_v_warp<D, NW, 2>(s_v, s_vt, lane);
    if constexpr (NW > 3)
        if (w == 3) fa3_fp8_transpose_v_warp<D, NW, 3>(s_v, s_vt, lane);
}

#endif /* FLASHATTN_CUDA_FA3_FP8_CUH */
