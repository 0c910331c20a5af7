/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fa3_fp8_fwd.cuh - the FlashAttention-3 forward on e4m3 inputs (sm_90a), included by fa3_fp8_fwd_hdim*.cu.
 *
 * The 16-bit kernel's machinery (fa3_fwd.cuh) with e4m3 operands: the persistent grid and its tile order
 * (fa3_sched), the barriers (fa3_bar_layout), the producer thread's TMA loads (fa3_producer with EB = 1: 128-byte
 * boxes of uint8 rows, one swizzle slab per 128 head-dim columns), the mask, the online softmax and the
 * ping-pong turns are shared; what differs is here:
 *   - S = Q K^T by e4m3 wgmma with both operands in shared memory (k32 steps: 32 bytes, as a 16-bit k16 step);
 *   - P packed to e4m3 A registers (fa3_fp8_pack_p) for O += P V^T, whose B operand is K-major: warps 1-3 of
 *     the producer warpgroup transpose each V stage into a V^T stage (fa3_fp8_vt_writer; the keys in the order
 *     that the packed P needs, rows past the sequence as zeros), release the V stage at once (the next V block's
 *     load need not wait for the P V) and mark the V^T stage ready; the consumers release the V^T stage after
 *     their P V (V^T empty, barriers of this kernel's own after the shared layout's);
 *   - the descales of q and k of the tile's (batch, head) multiply the softmax scale (the max, the mask and the
 *     softcap see S in the units of the true scores times a constant), v's multiplies 1 / l;
 *   - O (bf16 or f16, out_dtype) is written from registers to global memory (the V^T stages take the shared
 *     memory that the 16-bit kernel gives O's tiles).
 * Head dims 64, 128 and 256; head dim 64 in the tiles of 128 (fa3_fp8_tile_d). Its exponentials, not its
 * products, set its pace: per 128-key block the SM's 16 exp2 a clock take twice the tensor cores' time (at 128 as
 * long, at 256 half), and a bf16 tile needs as many: at head dim 64 e4m3 is no faster than bf16 (0.8-0.9x).
 * Two consumer warpgroups of 64 rows, 128-key blocks, the intra-warpgroup overlap (Q K(i)^T and P(i - 1) V(i - 1)
 * issued together, the softmax of S(i) under the P V), ping-pong and Q from registers at head dim 128 only
 * (fa3_fp8_pingpong, fa3_fp8_qrs), every block in the general step (ring stages at run time). Per-block
 * descales (descale_block_q a multiple of 64, descale_block_k of 128) run in the GENERAL kernels
 * (fa3_fp8_scale).
 */
#ifndef FLASHATTN_CUDA_FA3_FP8_FWD_CUH
#define FLASHATTN_CUDA_FA3_FP8_FWD_CUH

#include "cuda/fa3_fp8.cuh"
#include "cuda/fa3_fwd.cuh"

enum { FA3_FP8_BN = 128, FA3_FP8_NWG = 2 };
/* Named barrier of the V^T writer's three warps, after the ping-pong ones */
#define FA3_FP8_BAR_ZERO (FA3_BAR_PINGPONG + FA3_FP8_NWG)

/* Q K^T with Q from registers: head dim 128 (16 more registers; at 256, 32 more do not fit beside O and S). */
#ifndef FA3_FP8_QRS
#define FA3_FP8_QRS 1
#endif
static __host__ __device__ constexpr bool fa3_fp8_qrs(int d) {
    return FA3_FP8_QRS && d == 128;
}
/* Ping-pong between the two consumer warpgroups: head dim 128 only (H200 16k: 742 against 723 TFLOP/s without;
 * at 256, 669 against 689 without; at 64, whose exponentials set the pace, 382-414 against 450-463).
 * FA3_FP8_PINGPONG=0 drops it everywhere, for measuring. */
#ifndef FA3_FP8_PINGPONG
#define FA3_FP8_PINGPONG 1
#endif
static __host__ __device__ constexpr bool fa3_fp8_pingpong(int d) {
    return FA3_FP8_PINGPONG && d == 128;
}

/* P at the row max is 2^FA3_FP8_P_LOG2, not 1, and the max moves once a row's grows past 2^(8 - FA3_FP8_P_LOG2):
 * P stays at most 2^8 (e4m3's largest value is 448) and its small values keep more of e4m3's normal exponents
 * (those below 2^-6 are subnormal, below 2^-10 zero). */
#ifndef FA3_FP8_P_LOG2
#define FA3_FP8_P_LOG2 4
#endif

/* FA3_FP8_VT_SKIP=1 leaves the V^T stages unwritten (wrong results): the transpose's cost, for measuring. */
#ifndef FA3_FP8_VT_SKIP
#define FA3_FP8_VT_SKIP 0
#endif
#if FA3_FP8_VT_SKIP && !defined(FA_TUNING)
#error "FA3_FP8_VT_SKIP gives wrong results: developer timing builds only (with FA_TUNING)"
#endif

template <int D>
struct fa3_fp8_cfg : fa3_cfg<fa3_fp8_tile_d(D), FA3_FP8_BN, FA3_FP8_NWG, 1> {
    typedef fa3_cfg<fa3_fp8_tile_d(D), FA3_FP8_BN, FA3_FP8_NWG, 1> Base;
    static constexpr int kVtStages = Base::kVtStages;
    /* V^T ready and V^T empty, per V^T stage, after the shared barrier area (8-byte aligned) */
    static constexpr int kOffVtReady = (Base::kOffBar + Base::kBarBytes + 7) / 8 * 8;
    static constexpr int kOffVtEmpty = kOffVtReady + 8 * kVtStages;
    static constexpr int kSmemBytes = kOffVtEmpty + 8 * kVtStages + 1024;
    static_assert(kSmemBytes <= 232448, "e4m3 tiles fit in shared memory");
    static_assert(D == 64 || D == 128 || D == 256, "e4m3 head dims");
};

/* Warps 1-3 of the producer warpgroup: every V block in ring order into its V^T stage (fa3_fp8_transpose_v_warp;
 * the V^T ring has stages of its own, kVtStages), once the consumers have released that stage's previous V^T;
 * then V empty (every writer thread, each after its own reads of V: what compute-sanitizer's racecheck follows;
 * one arrival per warp after __syncwarp read as a hazard between warps) and V^T ready (one arrival per warp). The rows
 * of a V block past its sequence are zeroed first (they hold the next sequence's values, NaN bytes among them, and a
 * zero P times NaN is NaN). The producer ends the ring with a V full phase whose valid count is -1. Each warp W
 * runs a loop of its own, so that its run of transpose tasks is fixed at compile time and nothing of the other
 * warps' runs is live across its loop (at head dim 256 the shared loop spilled). */
template <int D, int W>
static __device__ __forceinline__ void fa3_fp8_vt_writer_warp(uint32_t s_v, uint32_t s_vt, uint32_t bar_v_full,
                                                              uint32_t bar_v_empty, uint32_t bar_vt_ready,
                                                              uint32_t bar_vt_empty, uint32_t s_v_valid) {
    typedef fa3_fp8_cfg<D> C;
    typedef fa3_pipe<FA3_STAGES> P;
    typedef fa3_pipe<C::kVtStages> PT;
    for (int j = 0;; ++j) {
        const int st = P::stage(j), vst = PT::stage(j);
        hp_mbar_wait(bar_v_full + 8 * st, P::phase(j));
        int valid; /* every lane reads it (one broadcast): no shuffle */
        asm volatile("ld.shared.u32 %0, [%1];" : "=r"(valid) : "r"(s_v_valid + 4 * st) : "memory");
        if (valid < 0) break;
        const uint32_t v = s_v + st * C::kKVBytes;
        if (valid < FA3_FP8_BN) {
            const int t = threadIdx.x - 32;
            const int per_slab = (FA3_FP8_BN - valid) * 8; /* 16-byte chunks of the dead rows of one slab */
            for (int x = t; x < per_slab * (fa3_fp8_tile_d(D) / 128); x += 96) {
                const int slab = x / per_slab, rem = x - slab * per_slab;
                const uint32_t addr = v + slab * (FA3_FP8_BN * 128) + (valid + rem / 8) * 128 + (rem % 8) * 16;
                asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(addr), "r"(0) : "memory");
            }
            /* each writer warp runs code of its own (fa3_fp8_vt_writer), so the barrier is reached from three
             * places: the unaligned form */
            hp_bar_sync_unaligned(FA3_FP8_BAR_ZERO, 96);
        }
        hp_mbar_wait(bar_vt_empty + 8 * vst, PT::empty_phase(j));
        if (!FA3_FP8_VT_SKIP) fa3_fp8_transpose_v_warp<D, 3, W>(v, s_vt + vst * C::kKVBytes);
        hp_fence_proxy_async(); /* before wgmma (async proxy) reads what these stores wrote, and TMA refills V */
        hp_mbar_arrive(bar_v_empty + 8 * st);
        __syncwarp();
        if (threadIdx.x % 32 == 0) hp_mbar_arrive(bar_vt_ready + 8 * vst);
    }
}

template <int D>
static __device__ __forceinline__ void fa3_fp8_vt_writer(uint32_t s_v, uint32_t s_vt, uint32_t bar_v_full,
                                                         uint32_t bar_v_empty, uint32_t bar_vt_ready,
                                                         uint32_t bar_vt_empty, uint32_t s_v_valid) {
    const int w = threadIdx.x / 32 - 1;
    if (w == 0)
        fa3_fp8_vt_writer_warp<D, 0>(s_v, s_vt, bar_v_full, bar_v_empty, bar_vt_ready, bar_vt_empty, s_v_valid);
    else if (w == 1)
        fa3_fp8_vt_writer_warp<D, 1>(s_v, s_vt, bar_v_full, bar_v_empty, bar_vt_ready, bar_vt_empty, s_v_valid);
    else
        fa3_fp8_vt_writer_warp<D, 2>(s_v, s_vt, bar_v_full, bar_v_empty, bar_vt_ready, bar_vt_empty, s_v_valid);
}

#if FA_SM90A

/* The Q operand of S = Q K^T: the warpgroup's Q tile in shared memory, or (QRS) its A fragments in registers,
 * four e4m3 per register, four registers per 32 columns. */
template <int D, bool QRS>
struct fa3_fp8_qop {
    uint64_t desc;
    uint32_t frag[QRS ? D / 8 : 1];
};

/* Loads the A fragments of a [D / 128 slabs][64 rows][128 B] swizzled Q tile: for columns 32 kk.., the words
 * at (row, 4 quad), (row + 8, 4 quad), (row, 16 + 4 quad), (row + 8, 16 + 4 quad), row = 16 warp + lane / 4. */
template <int D>
static __device__ __forceinline__ void fa3_fp8_load_q_frag(uint32_t (&frag)[D / 8], uint32_t s_q, int warp, int lane) {
#pragma unroll
    for (int kk = 0; kk < D / 32; ++kk)
#pragma unroll
        for (int x = 0; x < 4; ++x) {
            const int r = 16 * warp + lane / 4 + 8 * (x & 1), col = 32 * kk + 16 * (x >> 1) + 4 * (lane % 4);
            uint32_t v;
            asm volatile("ld.shared.u32 %0, [%1];"
                         : "=r"(v)
                         : "r"(s_q + (col / 128) * (64 * 128) + fa3_sw128(r, col % 128))
                         : "memory");
            frag[4 * kk + x] = v;
        }
}

/* S = Q K^T for one key block: D / 32 e4m3 steps of 32 bytes along the head dim, K in shared memory
 * ([D / 128 slabs][rows][128 B]), Q there too or in registers (QRS). */
template <int D, bool QRS>
static __device__ __forceinline__ void fa3_fp8_issue_qk(float (&s)[FA3_FP8_BN / 2], const fa3_fp8_qop<D, QRS> &q,
                                                        uint64_t desc_k) {
    constexpr int BN = FA3_FP8_BN;
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) hp_fence_reg(s[i]);
    hp_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 32; ++kk) {
        const uint32_t off_q = ((kk / 4) * 64 * 128 + (kk % 4) * 32) >> 4;
        const uint32_t off_k = ((kk / 4) * BN * 128 + (kk % 4) * 32) >> 4;
        if constexpr (QRS)
            fa3_wgmma_rs_kmajor<BN, __nv_fp8_e4m3>(s, q.frag[4 * kk], q.frag[4 * kk + 1], q.frag[4 * kk + 2],
                                                   q.frag[4 * kk + 3], hp_desc_add(desc_k, off_k), kk > 0);
        else
            fa3_wgmma_ss<BN, __nv_fp8_e4m3>(s, hp_desc_add(q.desc, off_q), hp_desc_add(desc_k, off_k), kk > 0);
    }
    hp_wgmma_commit();
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) hp_fence_reg(s[i]);
}

/* O += P V^T for one key block: BN / 32 steps along the keys, P from registers, V^T ([D rows][128 B]) K-major. */
template <int D>
static __device__ __forceinline__ void fa3_fp8_issue_pv(float (&o)[D / 2], uint32_t (&p)[FA3_FP8_BN / 8],
                                                        uint64_t desc_vt) {
#pragma unroll
    for (int i = 0; i < D / 2; ++i) hp_fence_reg(o[i]);
#pragma unroll
    for (int i = 0; i < FA3_FP8_BN / 8; ++i) hp_fence_reg(p[i]);
    hp_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < FA3_FP8_BN / 32; ++kk)
        fa3_wgmma_rs_kmajor<D, __nv_fp8_e4m3>(o, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3],
                                              hp_desc_add(desc_vt, (kk * 32) >> 4), 1);
    hp_wgmma_commit();
}

template <int D>
static __device__ __forceinline__ void fa3_fp8_pv_done(float (&o)[D / 2], uint32_t (&p)[FA3_FP8_BN / 8]) {
#pragma unroll
    for (int i = 0; i < D / 2; ++i) hp_fence_reg(o[i]);
#pragma unroll
    for (int i = 0; i < FA3_FP8_BN / 8; ++i) hp_fence_reg(p[i]);
}

/* The softmax scale of a consumer warpgroup's tile: the descales of q and k for its (batch, head) folded in.
 * Without softcap they multiply scale_log2 (the max and the slack are kept in units of the raw e4m3 products);
 * with softcap they multiply the factor inside tanh, and scale_log2 stays. Per-block descales (GENERAL kernels;
 * blocks of q a multiple of the warpgroup's 64 rows, of k and v a multiple of the 128-key blocks): q's block is
 * the warpgroup's; k's varies by key block, so without softcap S is multiplied by k_mul times the block's descale
 * before the softmax, which then runs with scale_log2 = 1 (the max in units of the scores times log2 e); v's
 * varies too, so O is kept in units of the current block's v descale: where it changes, O is rescaled with the
 * moved max's factor (scaling P instead would push its small values into e4m3's subnormals). */
struct fa3_fp8_scale {
    float scale_log2, slack, softcap_pre, v;
    int64_t kv_blocks; /* per-block descales: index of this (batch, kv head)'s first k / v block */
    float k_mul;       /* what multiplies the block's k descale (S, or the factor inside tanh) */
};

template <int GENERAL>
static __device__ __forceinline__ fa3_fp8_scale fa3_fp8_scale_make(const fa3_args &a, const fa3_tile &g, int c) {
    const int hk = g.h / a.group, heads_kv = a.heads_q / a.group;
    const bool blocks = GENERAL && a.descale_block_k > 0;
    /* a warpgroup past its sequence's rows takes the last block (its rows are not stored) */
    const int qb = GENERAL && a.descale_block_q > 0
                       ? min((g.m0 + 64 * c - g.shift) / a.descale_block_q, a.descale_blocks_q - 1)
                       : 0;
    const int blocks_q = GENERAL ? a.descale_blocks_q : 1, blocks_k = GENERAL ? a.descale_blocks_k : 1;
    const int64_t ki = ((int64_t)g.b * heads_kv + hk) * blocks_k;
    const float dq = a.q_descale != nullptr ? a.q_descale[((int64_t)g.b * a.heads_q + g.h) * blocks_q + qb] : 1.0f;
    const float dk = a.k_descale != nullptr && !blocks ? a.k_descale[ki] : 1.0f;
    fa3_fp8_scale sc;
    sc.kv_blocks = ki;
    /* per-block v: the first block's, the units O starts in (fa3_fp8_scores moves them) */
    const int vb = blocks ? min(g.n_min / a.descale_kblocks, a.descale_blocks_k - 1) : 0;
    sc.v = a.v_descale != nullptr ? a.v_descale[ki + vb] : 1.0f;
    if (a.softcap_pre != 0.0f) {
        sc.softcap_pre = a.softcap_pre * dq * dk;
        sc.scale_log2 = a.scale_log2;
        sc.k_mul = sc.softcap_pre;
    } else {
        sc.softcap_pre = 0.0f;
        sc.k_mul = a.scale_log2 * dq;
        sc.scale_log2 = blocks && a.k_descale != nullptr ? 1.0f : a.scale_log2 * dq * dk;
    }
    sc.slack = a.max_slack == 0.0f ? 0.0f : (8.0f - FA3_FP8_P_LOG2) / sc.scale_log2;
    return sc;
}

/* Softcap, mask and online softmax of key block n (fa3_scores with the tile's scale; per-block descales applied:
 * v_units, the v descale O is in, moves to the block's, its ratio joining the factor O is rescaled by). */
template <int GENERAL>
static __device__ __forceinline__ bool
fa3_fp8_scores(float (&s)[FA3_FP8_BN / 2], float (&m)[2], float (&l)[2], float (&factor)[2], float &v_units,
               const fa3_args &a, const fa3_fp8_scale &sc, const fa3_mask_info &mi, int n, int row0, int quad) {
    constexpr int BN = FA3_FP8_BN;
    float softcap_pre = sc.softcap_pre, v_ratio = 1.0f;
    if (GENERAL && a.descale_block_k > 0) {
        const int64_t blk = sc.kv_blocks + n / a.descale_kblocks; /* key blocks per descale block */
        if (a.v_descale != nullptr) { /* an all-zero block (descale 0) adds nothing in any units */
            const float dv = a.v_descale[blk];
            if (dv > 0.0f && dv != v_units) v_ratio = v_units / dv, v_units = dv;
        }
        if (a.k_descale != nullptr) {
            const float mul = sc.k_mul * a.k_descale[blk];
            if (softcap_pre != 0.0f) {
                softcap_pre = mul;
            } else {
#pragma unroll
                for (int i = 0; i < BN / 2; ++i) s[i] *= mul;
            }
        }
    }
    if (GENERAL && softcap_pre != 0.0f) {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) s[i] = hp_tanh(s[i] * softcap_pre);
    }
    if (n < mi.n_lo || n >= mi.n_hi)
        fa3_mask<BN, false>(s, n * BN, row0, quad, mi.len_k, mi.off, GENERAL ? a.window_left : -1, a.window_right);
    bool move = fa3_softmax<BN, false>(s, m, l, factor, sc.scale_log2, sc.slack, FA3_FP8_P_LOG2);
    if (GENERAL && v_ratio != 1.0f) { /* after l took the factor: the ratio is O's alone */
        factor[0] *= v_ratio;
        factor[1] *= v_ratio;
        move = true;
    }
    fa3_pin_scores<BN>(s, factor, l);
    return move;
}

/* The K/V ring as the e4m3 consumers walk it: V^T stages beside K's, V ready from the V^T writer, V^T empty
 * back to it. */
struct fa3_fp8_ring {
    uint32_t s_k, s_vt;
    uint32_t k_full, k_empty, vt_ready, vt_empty;
};

/* A tile's key blocks, overlapped: block 0's Q K^T and softmax; then per block i its Q K^T and P(i - 1) V(i - 1)
 * in one turn, the softmax of S(i) while the P V runs; the last P V in a turn of its own (nb + 1 turns). */
template <int D, bool QRS, int GENERAL>
static __device__ __forceinline__ void
fa3_fp8_tile(int nb, int kv, const fa3_fp8_ring &r, const fa3_fp8_qop<D, QRS> &q, float (&s)[FA3_FP8_BN / 2],
             float (&o)[D / 2], uint32_t (&p)[FA3_FP8_BN / 8], float (&m)[2], float (&l)[2], float &v_units,
             const fa3_args &a, const fa3_fp8_scale &sc, const fa3_mask_info &mi, int n_min, int row0, int lane, int c,
             uint32_t q_empty) {
    constexpr int NWG = FA3_FP8_NWG, kKV = fa3_fp8_cfg<D>::kKVBytes;
    typedef fa3_pipe<FA3_STAGES> P;
    typedef fa3_pipe<fa3_fp8_cfg<D>::kVtStages> PT;
    const int quad = lane % 4;
    float factor[2];
    {
        const int st0 = P::stage(kv);
        hp_mbar_wait(r.k_full + 8 * st0, P::phase(kv));
        fa3_pp_sync<fa3_fp8_pingpong(D)>(c);
        fa3_fp8_issue_qk<D, QRS>(s, q, hp_desc_sw128(r.s_k + st0 * kKV, 16, 1024));
        fa3_pp_arrive<fa3_fp8_pingpong(D), NWG>(c, false);
        hp_wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < FA3_FP8_BN / 2; ++i) hp_fence_reg(s[i]);
        fa3_release(r.k_empty + 8 * st0, lane);
        fa3_fp8_scores<GENERAL>(s, m, l, factor, v_units, a, sc, mi, n_min, row0, quad);
        fa3_fp8_pack_p<FA3_FP8_BN>(s, p);
        if (nb > 1) hp_mbar_wait(r.k_full + 8 * P::stage(kv + 1), P::phase(kv + 1));
    }
#pragma unroll 1
    for (int i = 1; i < nb; ++i) {
        const int j = kv + i; /* K(i); V(i - 1) is use j - 1 */
        const int st = P::stage(j), sp = PT::stage(j - 1);
        fa3_pp_sync<fa3_fp8_pingpong(D)>(c);
        fa3_fp8_issue_qk<D, QRS>(s, q, hp_desc_sw128(r.s_k + st * kKV, 16, 1024));
        hp_mbar_wait(r.vt_ready + 8 * sp, PT::phase(j - 1));
        fa3_fp8_issue_pv<D>(o, p, hp_desc_sw128(r.s_vt + sp * kKV, 16, 1024));
        fa3_pp_arrive<fa3_fp8_pingpong(D), NWG>(c, false);
        hp_wgmma_wait<1>();
#pragma unroll
        for (int jj = 0; jj < FA3_FP8_BN / 2; ++jj) hp_fence_reg(s[jj]);
        fa3_release(r.k_empty + 8 * st, lane);
        const bool move = fa3_fp8_scores<GENERAL>(s, m, l, factor, v_units, a, sc, mi, n_min + i, row0, quad);
        if (i + 1 < nb) hp_mbar_wait(r.k_full + 8 * P::stage(j + 1), P::phase(j + 1));
        hp_wgmma_wait<0>();
        fa3_fp8_pv_done<D>(o, p);
        fa3_release(r.vt_empty + 8 * sp, lane);
        if (move) fa3_rescale<D>(o, factor);
        fa3_fp8_pack_p<FA3_FP8_BN>(s, p);
    }
    /* every Q K^T of the tile has completed: the next tile's Q may land (QRS: released once loaded) */
    if (!QRS) fa3_release(q_empty, lane);
    const int jl = kv + nb - 1, sl = PT::stage(jl);
    hp_mbar_wait(r.vt_ready + 8 * sl, PT::phase(jl));
    fa3_pp_sync<fa3_fp8_pingpong(D)>(c);
    fa3_fp8_issue_pv<D>(o, p, hp_desc_sw128(r.s_vt + sl * kKV, 16, 1024));
    fa3_pp_arrive<fa3_fp8_pingpong(D), NWG>(c, true);
    hp_wgmma_wait<0>();
    fa3_fp8_pv_done<D>(o, p);
    fa3_release(r.vt_empty + 8 * sl, lane);
}

#endif /* FA_SM90A */

extern __shared__ __align__(1024) uint8_t fa3_fp8_smem[];

/* TO: the type of O (__nv_bfloat16 or __half). GENERAL: softcap, left window edges and varlen batches. QRS:
 * Q K^T with Q from registers (fa3_fp8_qrs). */
template <int D, typename TO, int GENERAL, bool QRS>
__global__ void __launch_bounds__(128 * (FA3_FP8_NWG + 1), 1)
    fa3_fp8_fwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                       const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ fa3_args a) {
#if FA_SM90A
    typedef fa3_fp8_cfg<D> C;
    typedef typename C::Bars B;
    constexpr int BN = FA3_FP8_BN, NWG = FA3_FP8_NWG;
    uint8_t *smem = (uint8_t *)(((uintptr_t)fa3_fp8_smem + 1023) & ~(uintptr_t)1023);
    const uint32_t s_q = hp_smem_addr(smem), s_k = s_q + C::kOffK, s_v = s_q + C::kOffV, s_vt = s_q + C::kOffVt;
    const uint32_t bars = s_q + C::kOffBar;
    const uint32_t bar_q_full = bars + B::kQFull, bar_q_empty = bars + B::kQEmpty;
    const uint32_t bar_tile_full = bars + B::kTileFull, bar_tile_empty = bars + B::kTileEmpty;
    volatile int *tile_ids = (volatile int *)(smem + C::kOffBar + B::kTileIds);
    const bool varlen = GENERAL && a.cu_q != nullptr;

    const uint32_t bar_vt_ready = s_q + C::kOffVtReady, bar_vt_empty = s_q + C::kOffVtEmpty;
    if (threadIdx.x == 0) {
        B::init(bars, false, 1, 96); /* V empty: every V^T writer thread */
        for (int i = 0; i < C::kVtStages; ++i) {
            hp_mbar_init(bar_vt_ready + 8 * i, 3);
            hp_mbar_init(bar_vt_empty + 8 * i, 4 * NWG);
        }
        hp_fence_barrier_init();
    }
    __syncthreads();

    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        hp_setmaxnreg_dec<C::kRegsProducer>();
        if (threadIdx.x == 0)
            fa3_producer<fa3_fp8_tile_d(D), BN, NWG, GENERAL, 1>(a, tm_q, tm_k, tm_v, smem, varlen);
        else if (threadIdx.x >= 32)
            fa3_fp8_vt_writer<D>(s_v, s_vt, bars + B::kVFull, bars + B::kVEmpty, bar_vt_ready, bar_vt_empty,
                                 bars + B::kVValid);
    } else {
        hp_setmaxnreg_inc<C::kRegsConsumer>();
        const int c = wg - 1;
        const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
        fa3_fp8_qop<D, QRS> q;
        q.desc = hp_desc_sw128(s_q + c * C::kQBytes, 16, 1024);
        const fa3_fp8_ring r = { s_k, s_vt, bars + B::kKFull, bars + B::kKEmpty, bar_vt_ready, bar_vt_empty };
        int kv = 0, q_uses = 0;
        for (int k = 0;; ++k) {
            const int slot = fa3_pipe<2>::stage(k);
            hp_mbar_wait(bar_tile_full + 8 * slot, fa3_pipe<2>::phase(k));
            const int tile = __shfl_sync(0xffffffffu, lane == 0 ? tile_ids[slot] : 0, 0);
            fa3_release(bar_tile_empty + 8 * slot, lane);
            if (tile >= a.num_tiles) break;
            fa3_tile g;
            if (!fa3_sched::tile_get<C::kBlockM, BN, false, GENERAL, false>(a, tile, g)) continue;
            const int row0 = g.m0 + 64 * c + 16 * warp + lane / 4;
            const int nb = g.nblocks;
            const fa3_mask_info mi = fa3_mask_info_make<BN, GENERAL, false>(a, g, c);
            const fa3_fp8_scale sc = fa3_fp8_scale_make<GENERAL>(a, g, c);
            float v_units = sc.v; /* the v descale O is in */

            float o[D / 2];
#pragma unroll
            for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
            float m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.0f, 0.0f };
            if (nb > 0) {
                float s[BN / 2];
                uint32_t p[BN / 8];
#pragma unroll
                for (int i = 0; i < BN / 2; ++i) s[i] = 0.0f;
                fa3_pp_first_turn<fa3_fp8_pingpong(D), NWG>(c);
                hp_mbar_wait(bar_q_full + 8 * c, fa3_pipe<1>::phase(q_uses));
                if constexpr (QRS) {
                    fa3_fp8_load_q_frag<D>(q.frag, s_q + c * C::kQBytes, warp, lane);
                    __syncwarp();
                    fa3_release(bar_q_empty + 8 * c, lane); /* the next tile's Q may land now */
                }
                fa3_fp8_tile<D, QRS, GENERAL>(nb, kv, r, q, s, o, p, m, l, v_units, a, sc, mi, g.n_min, row0, lane, c,
                                              bar_q_empty + 8 * c);
                kv += nb;
                ++q_uses;
            }
            const int seq_row0 = row0 - g.shift;
            float inv[2], lse[2];
            fa3_finalize<D>(o, l, m, inv, lse, a, g, seq_row0, sc.scale_log2, v_units, FA3_FP8_P_LOG2);
            if (a.lse != nullptr && lane % 4 == 0) fa3_store_lse(a, g, lse, seq_row0, varlen);
            fa3_o_to_global<D, TO>(o, inv, a, g, seq_row0, lane % 4);
        }
    }
#endif /* FA_SM90A */
}

/* Launches the e4m3 kernel of head dim D on the persistent grid; out_bf16: O in bf16, else f16. */
template <int D, bool OUT_BF16, int GENERAL>
static fa_status fa3_fp8_launch(const fa3_problem *pr, cudaStream_t stream) {
    typedef fa3_fp8_cfg<D> C;
    void (*kernel)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const fa3_args) =
        fa3_fp8_fwd_kernel<D, typename fa3_elem<OUT_BF16>::type, GENERAL, fa3_fp8_qrs(D)>;
    cudaError_t err =
        cudaFuncSetAttribute((const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
    if (err != cudaSuccess) return fa_cuda_status(err, "fa3 e4m3 forward: setting the shared-memory size");
    kernel<<<pr->grid, C::kThreads, C::kSmemBytes, stream>>>(pr->tm_q, pr->tm_k, pr->tm_v, pr->args);
    err = cudaGetLastError();
    if (err != cudaSuccess) return fa_cuda_status(err, "fa3 e4m3 forward launch");
    return FA_OK;
}

template <int D>
static fa_status fa3_fp8_run(const fa3_problem *pr, int out_bf16, cudaStream_t stream) {
    const bool general = fa3_needs_general(&pr->args);
    if (out_bf16)
        return general ? fa3_fp8_launch<D, true, true>(pr, stream) : fa3_fp8_launch<D, true, false>(pr, stream);
    return general ? fa3_fp8_launch<D, false, true>(pr, stream) : fa3_fp8_launch<D, false, false>(pr, stream);
}

#endif /* FLASHATTN_CUDA_FA3_FP8_FWD_CUH */
