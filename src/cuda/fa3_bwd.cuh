/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fa3_bwd.cuh - the FlashAttention-3 backward kernels for Hopper (sm_90a) and their launcher, included by the
 * per-head-dim instantiation files fa3_bwd_hdim*.cu: fa3_bwd_kernel (head dims 64, 128; described here) and
 * fa3_bwd_wide_kernel (head dim 256; described at its parts, below). Both take the producer below, and come in
 * twelve instances per head dim and dtype (fa3_bwd_dispatch): plain, softcap or ALiBi scores, deterministic mode and
 * varlen batches each on or off, so that the dense default kernel carries none of their code (in it, that code cost
 * causal problems 8-13%, and ALiBi's made ptxas spill).
 *
 * The preprocess is the FA2 backward's (fa2_bwd.cuh): it writes D = rowsum(dO * O) and LSE * log2(e) (+inf where a
 * row sees no key) and here also zeroes the fp32 dQ accumulator; fa3_bwd_convert_dq_kernel scales the accumulator,
 * in this kernel's order, into dQ. Between them one CTA per (key block of BN rows, kv head, batch; varlen: the
 * longest sequence's key blocks, the others' CTAs past their keys exit) keeps K and V in shared memory and dK, dV
 * in registers, and walks the query blocks of BM rows that see its keys, for every query head of its GQA group (the
 * launch order of these CTAs: fa3_bwd_cta_get):
 *   warpgroup 0  producer: thread 0 issues the TMA loads, K and V once, then Q and dO per step into a
 *                STAGES-deep ring (fa3_pipe); warp 1 copies the step's LSE * log2(e) and -D rows beside them
 *                (+inf and 0 past the sequence, so that those queries get P = 0 without a mask). In a varlen
 *                batch (tensor maps over the packed tokens) the loads land on barriers of their own and warp 1
 *                first zeroes the rows of the next sequence that a box reaches (fa3_bwd_zero_rows), so that
 *                no value of another sequence meets this one's products, then releases the stage.
 *   warpgroups 1, 2  consumers, 64 key rows each (the A operand of every product is the warpgroup's own rows):
 *                S^T = K Q^T and dP^T - D = V dO^T - D (wgmma, both operands K-major in shared memory; the
 *                accumulator of the second starts at -D);
 *                P^T = exp2(S^T scale log2(e) - LSE2), dS^T = P^T (dP^T - D) [(1 - tanh^2) with softcap];
 *                dV += P^T dO and dK += dS^T Q with P^T, dS^T from registers (dO, Q MN-major);
 *                dS^T to shared memory; one step later (when the other warpgroup has written its half too)
 *                dQ = dS K for 64 x 64 of that step's dQ (the rows of one warpgroup's queries when BM = 128,
 *                the columns of one 64-wide slab of the head dim when BM = 64), added to the fp32 accumulator
 *                with 16-byte reductions in fa3_bwd_dq_index's order. The second warpgroup starts half a step
 *                late, so that one's GEMMs overlap the other's softmax.
 * dK (times the softmax scale) and dV are stored after the last step, through a ring stage no step reads any more
 * (16-byte stores).
 * Deterministic mode: the key blocks that see a query block add its dQ one after another, last first, which is
 * the launch order (fa3_bwd_cta_get); producer warps 2 and 3 keep the turns of consumer warpgroups 1 and 2
 * (fa3_bwd_turn_keeper: acquire the count, let the warpgroup add, release), so neither the poll nor the
 * release's drain stalls a consumer.
 *
 * Shared-memory tiles are [D / 64 slabs][rows][64 elements] with the 128-byte swizzle (as TMA writes them),
 * each 1024-byte aligned; dS^T is [BM / 64 slabs][BN key rows][64 queries], double-buffered, with an mbarrier per
 * buffer for "both halves written" and one for "both dQ products done".
 *
 * Parts: fa3_bwd_layout / fa3_bwd_cfg / fa3_bwd_wide_cfg (tile shapes, shared-memory layout, barriers, register
 * split), fa3_bwd_cta and fa3_bwd_work (the CTA's key block, head and steps), fa3_bwd_blocks (the query blocks
 * that see a key block, and which need a mask), fa3_bwd_step (the head and query block of a step),
 * fa3_bwd_producer, fa3_bwd_turn_keeper (deterministic mode's order); for the consumers fa3_bwd_issue_sdp,
 * fa3_bwd_probs, fa3_bwd_dscores, fa3_bwd_issue_rs, fa3_bwd_store_ds, fa3_bwd_issue_dq, fa3_bwd_add_dq and
 * fa3_bwd_store_dkdv (fa3_bwd_wide_* for head dim 256).
 */
#ifndef FLASHATTN_CUDA_FA3_BWD_CUH
#define FLASHATTN_CUDA_FA3_BWD_CUH

#include <climits>

#include "cuda/fa2_bwd.cuh"
#include "cuda/fa3_fwd.cuh"

/* What the kernel reads besides the tensor maps: the FA2 backward's arguments (workspace pointers, shapes,
 * scales, window) and the key blocks per (kv head, batch). */
struct fa3_bwd_args {
    fa2_bwd_args b;
    int key_blocks;
    /* deterministic mode's launch order: key blocks last first across this many (kv head, batch) pairs at a
     * time (fa3_bwd_cta_get) */
    int chunk_heads;
    /* the default mode's launch order: the key blocks longest first (the first first, or with order_last_first
     * the last first) across chunks of order_pairs + 1 (the first order_wide chunks) or order_pairs pairs
     * (fa3_bwd_cta_get) */
    int order_pairs, order_wide, order_last_first;
    /* deterministic mode: per (batch, query head, query block), how many warpgroups have added their dQ part */
    int *dq_turns;
    int m_blocks; /* query blocks per (batch, head) in dq_turns: of the longest sequence */
};

/* Shared-memory layout, barriers and register split of a backward CTA: K and V of BN key rows, a STAGES-deep
 * ring of Q and dO tiles of BM rows with their row values, and two buffers of DS_BYTES each for what the
 * consumers exchange per step (dS^T; with split_keys, P and dS). */
template <int D, int BM, int BN, int STAGES, int DS_BYTES>
struct fa3_bwd_layout {
    static constexpr int kBN = BN;
    static constexpr int kStages = STAGES;
    static constexpr int kThreads = 384; /* producer + two consumer warpgroups */
    static constexpr int kKVBytes = BN * D * 2;
    static constexpr int kQBytes = BM * D * 2;
    static constexpr int kDSBytes = DS_BYTES;
    static constexpr int kOffK = 0;
    static constexpr int kOffV = kOffK + kKVBytes;
    static constexpr int kOffQ = kOffV + kKVBytes;
    static constexpr int kOffDO = kOffQ + kStages * kQBytes;
    static constexpr int kOffDS = kOffDO + kStages * kQBytes;
    static constexpr int kOffRows = kOffDS + 2 * kDSBytes; /* per stage: LSE2[BM], then -D[BM] */
    static constexpr int kOffBar = kOffRows + kStages * 2 * BM * 4;
    static constexpr int kBarKV = 0;                            /* K and V loaded */
    static constexpr int kBarFull = 8;                          /* per stage: Q, dO (TMA) and the rows */
    static constexpr int kBarEmpty = kBarFull + 8 * kStages;    /* per stage: every consumer thread is done */
    static constexpr int kBarDSReady = kBarEmpty + 8 * kStages; /* per exchange buffer: both halves written */
    static constexpr int kBarDSFree = kBarDSReady + 16;         /* per exchange buffer: both warpgroups read it */
    /* varlen: the TMA loads land here first; warp 1 zeroes the rows of the next sequence, then signals K V / full */
    static constexpr int kBarKVLanded = kBarDSFree + 16;
    static constexpr int kBarLanded = kBarKVLanded + 8;                          /* per stage */
    static constexpr int kSmemBytes = kOffBar + kBarLanded + 8 * kStages + 1024; /* + aligning the base */
    /* The producer needs few registers; 24 + 2 x 240 = 3 x 168. */
    static constexpr int kRegsProducer = 24;
    static constexpr int kRegsConsumer = 240;
    static_assert(hp_reg_split_fits(kRegsProducer, kRegsConsumer, 2), "register split");
    static_assert(kSmemBytes <= 232448, "shared memory");

    static __device__ __forceinline__ void init_barriers(uint32_t bars, bool varlen) {
        hp_mbar_init(bars + kBarKV, varlen ? 32 : 1); /* varlen: warp 1's lanes, else the TMA thread */
        hp_mbar_init(bars + kBarKVLanded, 1);
        for (int i = 0; i < kStages; ++i) {
            hp_mbar_init(bars + kBarFull + 8 * i, varlen ? 32 : 1 + 32); /* [the TMA thread,] warp 1's lanes */
            hp_mbar_init(bars + kBarEmpty + 8 * i, 256); /* every consumer thread (each read the rows) */
            hp_mbar_init(bars + kBarLanded + 8 * i, 1);
        }
        for (int i = 0; i < 2; ++i) {
            hp_mbar_init(bars + kBarDSReady + 8 * i, 256);
            hp_mbar_init(bars + kBarDSFree + 8 * i, 256);
        }
        hp_fence_barrier_init();
    }
};

/* Head dims 64 and 128: a consumer warpgroup owns 64 of the 128 keys (S^T, dP^T, dK, dV of its rows); dS^T
 * exchanged for dQ; the ring 3 deep, as the second warpgroup runs up to a step behind. */
template <int D, int BM>
struct fa3_bwd_cfg : fa3_bwd_layout<D, BM, 128, 3, 128 * BM * 2> {
    /* dQ = dS K per consumer warpgroup: 64 query rows x 64 columns. */
    static constexpr bool kDQByRows = BM == 128;
    /* the epilogue stages a warpgroup's dK in a Q tile and its dV in a dO tile (fa3_bwd_store_dkdv) */
    static_assert(fa3_bwd_layout<D, BM, 128, 3, 128 * BM * 2>::kQBytes >= 64 * D * 2, "staging");
    static_assert((BM == 128 && D == 64) || (BM == 64 && D == 128), "dQ splits into two 64 x 64 products");
};

/* Head dim 256 (fa3_bwd_wide_kernel): dK and dV of 128 keys would take a warpgroup 256 registers, so 64 queries x
 * 64 keys per step, S and dP split along the keys (32 per warpgroup), dK^T, dV^T and dQ along the head dim (128
 * per warpgroup); P and dS exchanged (one 64 x 64 tile each per buffer); a 2-deep ring (its 32 KB stages). */
template <int D>
struct fa3_bwd_wide_cfg : fa3_bwd_layout<D, 64, 64, 2, 2 * 64 * 64 * 2> {
    static constexpr int kPBytes = 64 * 64 * 2; /* P at the buffer's start, dS after it */
    static_assert(D == 256, "the head-dim split is two warpgroups x 128");
};

/* The query blocks [lo, hi) that see some key of a key block; the blocks outside [mask_lo, mask_hi) hold an
 * invisible pair or a key past the sequence and need a mask. Key n and query m see each other when dlo <= n - m - off
 * <= dhi (off = len_k - len_q: the bottom-right alignment). */
struct fa3_bwd_blocks {
    int lo, hi, mask_lo, mask_hi;
};

static __device__ __forceinline__ long long fa3_floor_div(long long x, int d) {
    return x >= 0 ? x / d : -((-x + d - 1) / d);
}

template <int BM, int BN>
static __device__ __forceinline__ fa3_bwd_blocks fa3_bwd_blocks_get(int n0, int len_q, int len_k, int wl, int wr) {
    const long long off = (long long)len_k - len_q, n_last = min(n0 + BN, len_k) - 1;
    /* queries [m_lo, m_hi) see some key of [n0, n_last] */
    long long m_lo = 0, m_hi = len_q;
    if (wr >= 0) m_lo = max(m_lo, n0 - off - wr);
    if (wl >= 0) m_hi = min(m_hi, n_last - off + wl + 1);
    fa3_bwd_blocks r;
    r.lo = (int)(m_lo / BM);
    r.hi = m_hi > m_lo ? (int)((m_hi + BM - 1) / BM) : r.lo;
    if (n0 + BN > len_k) { /* keys past the sequence: every block masks them */
        r.mask_lo = r.mask_hi = r.lo;
        return r;
    }
    /* block mb is mask-free when for its queries m0 .. m0 + BM - 1 (m0 = mb BM) and every key of the block
     * n0 - (m0 + BM - 1) - off >= -wl and n0 + BN - 1 - m0 - off <= wr */
    long long free_lo = r.lo, free_hi = r.hi;
    if (wr >= 0) free_lo = max(free_lo, -fa3_floor_div(-(n0 + BN - 1 - off - wr), BM));
    if (wl >= 0) free_hi = min(free_hi, fa3_floor_div(n0 - off + wl - BM + 1, BM) + 1);
    if (free_hi < free_lo) free_hi = free_lo;
    r.mask_lo = (int)free_lo;
    r.mask_hi = (int)free_hi;
    return r;
}

/* Step t of a CTA: query head group_head0 + t / nmb, query block lo + t % nmb. */
struct fa3_bwd_step {
    int hq, mb;
};
static __device__ __forceinline__ fa3_bwd_step fa3_bwd_step_get(int t, int nmb, int lo, int hq0) {
    fa3_bwd_step s;
    s.hq = hq0 + t / nmb;
    s.mb = lo + t % nmb;
    return s;
}

#if FA_SM90A

/* S^T = K Q^T and dP^T - D = V dO^T + (-D) for the warpgroup's 64 key rows, the dP^T accumulator set to the step's
 * -D beforehand (fa3_bwd_neg_dsum), so that D takes no registers of its own until dS: D / 16 wgmma steps each, one
 * commit group each (S^T first). (Set between the two products, ptxas waits for S^T before issuing dP^T.) */
template <int D, int BM, typename T>
static __device__ __forceinline__ void fa3_bwd_issue_sdp(float (&s)[BM / 2], float (&dp)[BM / 2], uint32_t s_k,
                                                         uint32_t s_v, uint32_t s_q, uint32_t s_do) {
    constexpr int kBN = fa3_bwd_cfg<D, BM>::kBN;
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) hp_fence_reg(s[i]), hp_fence_reg(dp[i]);
    hp_wgmma_fence();
    const uint64_t dk = hp_desc_sw128(s_k, 16, 1024), dq = hp_desc_sw128(s_q, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
        fa3_wgmma_ss<BM, T>(s, hp_desc_add(dk, ((kk / 4) * kBN * 128 + (kk % 4) * 32) >> 4),
                            hp_desc_add(dq, ((kk / 4) * BM * 128 + (kk % 4) * 32) >> 4), kk > 0);
    hp_wgmma_commit();
    const uint64_t dv = hp_desc_sw128(s_v, 16, 1024), ddo = hp_desc_sw128(s_do, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
        fa3_wgmma_ss<BM, T>(dp, hp_desc_add(dv, ((kk / 4) * kBN * 128 + (kk % 4) * 32) >> 4),
                            hp_desc_add(ddo, ((kk / 4) * BM * 128 + (kk % 4) * 32) >> 4), 1);
    hp_wgmma_commit();
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) hp_fence_reg(s[i]), hp_fence_reg(dp[i]);
}

/* Where a thread's accumulator elements sit: element i of an m64 x N fragment is (row0 + 8 ((i >> 1) & 1),
 * 8 (i >> 2) + col0 + (i & 1)). */
struct fa3_bwd_frag {
    int row0; /* 16 warp + lane / 4 */
    int col0; /* 2 (lane % 4) */
};

/* The thread's values of one row array of the stage (LSE2), at its query columns 8 c + col0, + 1. EARLY: all
 * loaded by fetch(), which the kernel issues ahead of the product they follow, so that their latency hides behind
 * the tensor cores; pinned there by asm volatile, and a generic load, not ld.shared, which waits in the queue that
 * also issues the wgmmas and starts the products later. Otherwise (softcap, whose dfac leaves no registers for
 * them) each is loaded where it is used. */
template <int BM, bool EARLY>
struct fa3_bwd_rowvals {
    float2 v[EARLY ? BM / 8 : 1];
    const float *row;
    int col0;

    __device__ __forceinline__ void fetch(const float *row_, const fa3_bwd_frag &f) {
        row = row_, col0 = f.col0;
        if constexpr (EARLY) {
#pragma unroll
            for (int c = 0; c < BM / 8; ++c)
                asm volatile("ld.v2.f32 {%0, %1}, [%2];"
                             : "=f"(v[c].x), "=f"(v[c].y)
                             : "l"(row + 8 * c + col0)
                             : "memory");
        }
    }
    __device__ __forceinline__ float2 operator[](int c) const {
        if constexpr (EARLY)
            return v[c];
        else
            return *reinterpret_cast<const float2 *>(row + 8 * c + col0);
    }
};

/* ALiBi's slope of batch entry b, query head hq, times log2(e). */
static __device__ __forceinline__ float fa3_bwd_alibi_slope_log2(const fa2_bwd_args &a, int b, int hq) {
    return a.alibi_slopes[b * a.alibi_batch_stride + hq] * FA_LOG2E;
}

/* P^T = exp2(S^T scale log2(e) - LSE2) in place (softcap: S^T -> softcap tanh(S^T scale / softcap), and
 * dfac = 1 - tanh^2 kept for dS). MASKED: pairs outside the window or keys past the sequence get P = 0. ALIBI:
 * the scores get -slope |key - query - off| (slope_log2 = slope log2(e)).
 * dist0 = key row0 - (query col0 + off). */
template <int BM, bool MASKED, bool SOFTCAP, bool ALIBI, class Rows>
static __device__ __forceinline__ void fa3_bwd_probs(float (&s)[BM / 2], float (&dfac)[SOFTCAP ? BM / 2 : 1],
                                                     const Rows &lse2, const fa3_bwd_frag &f, const fa2_bwd_args &a,
                                                     int dist0, int rows_left, float slope_log2) {
    const int dlo = a.window_left >= 0 ? -a.window_left : INT_MIN, dhi = a.window_right >= 0 ? a.window_right : INT_MAX;
    const float cap_log2 = a.softcap * FA_LOG2E;
#pragma unroll
    for (int c = 0; c < BM / 8; ++c) {
        const float2 l2 = lse2[c];
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int i = 4 * c + e;
            float x = s[i];
            if constexpr (SOFTCAP) {
                const float th = hp_tanh(x * a.softcap_arg);
                x = th * cap_log2;
                dfac[i] = 1.f - th * th;
            } else {
                x *= a.scale_log2;
            }
            const int dr = 8 * (e >> 1), dist = dist0 + dr - 8 * c - (e & 1);
            if constexpr (ALIBI) x -= slope_log2 * (float)abs(dist);
            float p = hp_exp2(x - ((e & 1) ? l2.y : l2.x));
            if constexpr (MASKED)
                if (!(dr < rows_left && dist >= dlo && dist <= dhi)) p = 0.f;
            s[i] = p;
        }
    }
}

/* The dP^T accumulator's start: -D at the thread's query columns 8 c + col0, + 1 (rows r and r + 8 share them),
 * from the stage's row of -D by generic loads (see fa3_bwd_rowvals). */
template <int BM>
static __device__ __forceinline__ void fa3_bwd_neg_dsum(float (&dp)[BM / 2], const float *neg_dsum,
                                                        const fa3_bwd_frag &f) {
#pragma unroll
    for (int c = 0; c < BM / 8; ++c) {
        asm volatile("ld.v2.f32 {%0, %1}, [%2];"
                     : "=f"(dp[4 * c]), "=f"(dp[4 * c + 1])
                     : "l"(neg_dsum + 8 * c + f.col0)
                     : "memory");
        dp[4 * c + 2] = dp[4 * c];
        dp[4 * c + 3] = dp[4 * c + 1];
    }
}

/* dS^T = P^T (dP^T - D) [dfac] in place of dP^T - D. */
template <int BM, bool SOFTCAP>
static __device__ __forceinline__ void fa3_bwd_dscores(float (&dp)[BM / 2], const float (&p)[BM / 2],
                                                       const float (&dfac)[SOFTCAP ? BM / 2 : 1]) {
#pragma unroll
    for (int i = 0; i < BM / 2; ++i) {
        float ds = p[i] * dp[i];
        if constexpr (SOFTCAP) ds *= dfac[i];
        dp[i] = ds;
    }
}

/* acc (64 key rows x D) += A B: dV += P^T dO or dK += dS^T Q; BM / 16 wgmma steps along the queries, A (P^T or
 * dS^T) from registers, B (dO or Q) MN-major; one commit group. */
template <int D, int BM, typename T>
static __device__ __forceinline__ void fa3_bwd_issue_rs(float (&acc)[D / 2], uint32_t (&a16)[BM / 4], uint32_t s_b) {
#pragma unroll
    for (int i = 0; i < D / 2; ++i) hp_fence_reg(acc[i]);
#pragma unroll
    for (int i = 0; i < BM / 4; ++i) hp_fence_reg(a16[i]);
    hp_wgmma_fence();
    const uint64_t db = hp_desc_sw128(s_b, BM * 128, 1024);
#pragma unroll
    for (int kk = 0; kk < BM / 16; ++kk)
        fa3_wgmma_rs<D, T>(acc, a16[4 * kk], a16[4 * kk + 1], a16[4 * kk + 2], a16[4 * kk + 3],
                           hp_desc_add(db, (kk * 2048) >> 4), 1);
    hp_wgmma_commit();
}

/* The warpgroup's dS^T rows (64 keys x BM queries, 16-bit pairs in A-fragment order) into the swizzled dS^T
 * tile at s_ds, key rows from row_base on. Pair i holds (row row0 + 8 (i & 1), columns 8 (i >> 1) + col0, + 1): an
 * 8 x 8 block per i in stmatrix's fragment order, so one stmatrix.x4 stores pairs 4q .. 4q + 3, its lane l giving
 * the address of row l % 8 of block l / 8 (rows + 8 (l / 8 & 1), columns 16 q + 8 (l / 16)). */
template <int BM, int BN>
static __device__ __forceinline__ void fa3_bwd_store_ds(const uint32_t (&ds)[BM / 4], uint32_t s_ds, int row_base,
                                                        int warp_in_wg, int lane) {
    const int r = row_base + 16 * warp_in_wg + (lane % 8) + 8 * ((lane / 8) & 1);
    const uint32_t row_addr = s_ds + r * 128;
#pragma unroll
    for (int q = 0; q < BM / 16; ++q) {
        const int chunk = 2 * q + lane / 16; /* 16-byte chunk of the 128-byte row: columns 8 chunk .. */
        const uint32_t addr = row_addr + (chunk / 8) * (BN * 128) + (((chunk % 8) ^ (r % 8)) << 4);
        fa_stmatrix_x4(addr, ds[4 * q], ds[4 * q + 1], ds[4 * q + 2], ds[4 * q + 3]);
    }
}

/* Named barrier that starts the second consumer warpgroup (id 0 is __syncthreads). */
#define FA3_BWD_BAR_START 1

/* Makes the warpgroup's dS^T stores visible to the other warpgroup's wgmma (the async proxy) and says so on the
 * buffer's ready barrier; the first warpgroup's first one also starts the second (FA3_BWD_BAR_START). */
static __device__ __forceinline__ void fa3_bwd_publish_ds(uint32_t bar_ready, bool start_second) {
    hp_fence_proxy_async();
    hp_mbar_arrive(bar_ready);
    if (start_second) hp_bar_arrive(FA3_BWD_BAR_START, 256);
}

/* dQ (64 x 64) = dS K over the BN keys: A = dS^T slab (MN-major), B = one 64-column slab of K (MN-major). */
template <int BN, typename T>
static __device__ __forceinline__ void fa3_bwd_issue_dq(float (&dq)[32], uint32_t s_ds_slab, uint32_t s_k_slab) {
#pragma unroll
    for (int i = 0; i < 32; ++i) hp_fence_reg(dq[i]);
    hp_wgmma_fence();
    const uint64_t da = hp_desc_sw128(s_ds_slab, BN * 128, 1024), db = hp_desc_sw128(s_k_slab, BN * 128, 1024);
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk)
        fa3_wgmma_ss_mn<64, T>(dq, hp_desc_add(da, (kk * 2048) >> 4), hp_desc_add(db, (kk * 2048) >> 4), kk > 0);
    hp_wgmma_commit();
}

/* dQ of step u: waits until both warpgroups have written that step's dS^T (buffer u % 2), then issues it. */
template <int BN, typename T>
static __device__ __forceinline__ void fa3_bwd_issue_dq_of(float (&dq)[32], uint32_t bar_ready, uint32_t s_ds,
                                                           int ds_bytes, uint32_t s_ds_part, uint32_t s_k_part, int u) {
    const int buf = fa3_pipe<2>::stage(u);
    hp_mbar_wait(bar_ready + 8 * buf, fa3_pipe<2>::phase(u));
    fa3_bwd_issue_dq<BN, T>(dq, s_ds + buf * ds_bytes + s_ds_part, s_k_part);
}

/* Adds dQ (rows row0.. of the accumulator (fa3_bwd_dq_row0), of which rows_left are the sequence's; columns
 * col_base..col_base + 63 of head hq) to the fp32 accumulator: each run of four accumulator registers (rows r, r + 8
 * at two adjacent columns) is adjacent there (fa3_bwd_dq_index), one 16-byte reduction, or 8 bytes where row r + 8
 * is past the sequence. */
template <int D>
static __device__ __forceinline__ void fa3_bwd_add_dq(const float (&dq)[32], float *dq_accum, int64_t row0,
                                                      int rows_left, int hq, int heads_q, int col_base,
                                                      const fa3_bwd_frag &f) {
    if (f.row0 >= rows_left) return;
    float *p = dq_accum + fa3_bwd_dq_index(row0 + f.row0, hq, col_base + f.col0, heads_q, D);
    if (f.row0 + 8 < rows_left) {
#pragma unroll
        for (int j = 0; j < 8; ++j)
            atomicAdd(reinterpret_cast<float4 *>(p + 128 * j),
                      make_float4(dq[4 * j], dq[4 * j + 1], dq[4 * j + 2], dq[4 * j + 3]));
    } else {
#pragma unroll
        for (int j = 0; j < 8; ++j)
            atomicAdd(reinterpret_cast<float2 *>(p + 128 * j), make_float2(dq[4 * j], dq[4 * j + 1]));
    }
}

/* Deterministic mode: the key blocks that see a query block add its dQ in descending order, which is the launch
 * order (the grid takes the key blocks last first, each across every (kv head, batch) before the next), so a CTA
 * only waits for CTAs started before it and the first in the order never waits. The count of (batch, head, query
 * block) goes up by one per consumer warpgroup when its adds are done; warpgroup c of the key block with turn k
 * waits for 2 k. The waiting and the release are a producer warp's (2 + c), so that neither the poll's round trip
 * nor the release's drain of the adds stalls the warpgroup: the warp acquires the count of step s, lets the
 * warpgroup add (named barrier FA3_BWD_BAR_GO + c), waits for its adds (FA3_BWD_BAR_DONE + c), then releases;
 * the barriers order the adds between the acquire and the release. */
#define FA3_BWD_BAR_GO   2
#define FA3_BWD_BAR_DONE 4

/* The last key block whose keys some query of block mb sees (its turn is 0). */
template <int BM, int BN>
static __device__ __forceinline__ int fa3_bwd_last_key_block(int mb, int len_q, int len_k, int wr) {
    const long long m_last = min(mb * BM + BM, len_q) - 1;
    long long n_hi = len_k - 1;
    if (wr >= 0) n_hi = min(n_hi, m_last + (len_k - len_q) + wr);
    return (int)(n_hi / BN);
}

/* The turn-keeping warp of consumer warpgroup c: one pass per step, in the consumers' order. */
template <int BM, int BN>
static __device__ __forceinline__ void fa3_bwd_turn_keeper(const fa3_bwd_args &args, const bwd_seq &sq, int b, int nb,
                                                           int nsteps, int nmb, int lo, int hq0, int c) {
    const fa2_bwd_args &a = args.b;
    int lane;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    for (int t = 0; t < nsteps; ++t) {
        const fa3_bwd_step st = fa3_bwd_step_get(t, nmb, lo, hq0);
        int *count = args.dq_turns + ((int64_t)b * a.heads_q + st.hq) * args.m_blocks + st.mb;
        if (lane == 0) {
            const int target = 2 * (fa3_bwd_last_key_block<BM, BN>(st.mb, sq.len_q, sq.len_k, a.window_right) - nb);
            for (;;) {
                int seen;
                asm volatile("ld.acquire.gpu.global.b32 %0, [%1];" : "=r"(seen) : "l"(count) : "memory");
                if (seen >= target) break;
                __nanosleep(64);
            }
        }
        __syncwarp();
        hp_bar_arrive(FA3_BWD_BAR_GO + c, 160);
        hp_bar_sync(FA3_BWD_BAR_DONE + c, 160);
        if (lane == 0) asm volatile("red.release.gpu.global.add.s32 [%0], 1;" ::"l"(count) : "memory");
    }
}

/* fa3_bwd_add_dq for the step of query block m0 / BM and head hq, in its turn in deterministic mode (DET). */
template <int D, bool DET>
static __device__ __forceinline__ void fa3_bwd_add_dq_ordered(const float (&dq)[32], const fa3_bwd_args &args,
                                                              const bwd_seq &sq, int b, int m0, int hq, int dq_row0,
                                                              int dq_col0, int c, const fa3_bwd_frag &f) {
    const fa2_bwd_args &a = args.b;
    if constexpr (DET) hp_bar_sync(FA3_BWD_BAR_GO + c, 160);
    fa3_bwd_add_dq<D>(dq, a.dq_accum, fa3_bwd_dq_row0(sq.tok_q, b) + m0 + dq_row0, sq.len_q - m0 - dq_row0, hq,
                      a.heads_q, dq_col0, f);
    if constexpr (DET) hp_bar_arrive(FA3_BWD_BAR_DONE + c, 160);
}

/* Named barrier of consumer warpgroup c's staged dK, dV (FA3_BWD_BAR_STAGED + c). */
#define FA3_BWD_BAR_STAGED 6

/* dK (times the softmax scale) and dV of the warpgroup's 64 key rows: from registers into the tiles at s_dk, s_dv
 * ([64][D], 16-byte chunks XORed with the row's low bits: conflict-free), then out in 16-byte stores, a row's
 * chunks by consecutive threads (the host asks for 16-byte aligned rows). Stored from registers, each instruction
 * writes 16 bytes of each of 8 rows, and at 512 tokens those stores, queued behind each other, held the consumers
 * about 5% of the kernel's time. */
template <int D, typename T>
static __device__ __forceinline__ void fa3_bwd_store_dkdv(const float (&dk)[D / 2], const float (&dv)[D / 2],
                                                          const fa2_bwd_args &a, int b, int hk, int64_t tok_k,
                                                          int row_base, int rows_left, const fa3_bwd_frag &f,
                                                          uint32_t s_dk, uint32_t s_dv, int c) {
    constexpr int kChunks = D / 8; /* 16-byte chunks per row */
    static_assert(kChunks >= 8, "the swizzle spreads 8 rows over 8 chunks");
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int r = f.row0 + 8 * h;
#pragma unroll
        for (int j = 0; j < kChunks; ++j) {
            const int i = 4 * j + 2 * h;
            const uint32_t off = r * (2 * D) + ((j ^ (r & 7)) << 4) + 2 * f.col0;
            bwd_st_shared_u32(s_dk + off, fa3_pack<T>(dk[i] * a.scale, dk[i + 1] * a.scale));
            bwd_st_shared_u32(s_dv + off, fa3_pack<T>(dv[i], dv[i + 1]));
        }
    }
    hp_bar_sync(FA3_BWD_BAR_STAGED + c, 128);
    T *gdk = (T *)a.dk.data + (int64_t)b * a.dk.stride_batch + (int64_t)hk * a.dk.stride_head;
    T *gdv = (T *)a.dv.data + (int64_t)b * a.dv.stride_batch + (int64_t)hk * a.dv.stride_head;
    const int tid = threadIdx.x % 128;
#pragma unroll
    for (int k = 0; k < 64 * kChunks / 128; ++k) {
        const int q = tid + 128 * k, r = q / kChunks, j = q % kChunks;
        if (row_base + r >= rows_left) break; /* (rows grow with k) */
        const uint32_t off = r * (2 * D) + ((j ^ (r & 7)) << 4);
        const int64_t row = tok_k + row_base + r;
        *reinterpret_cast<uint4 *>(gdk + row * a.dk.stride_seq + 8 * j) = bwd_ld_shared_u128(s_dk + off);
        *reinterpret_cast<uint4 *>(gdv + row * a.dv.stride_seq + 8 * j) = bwd_ld_shared_u128(s_dv + off);
    }
}

#endif /* FA_SM90A */

/* The CTA's key block and (kv head, batch), in an order that runs the (kv head, batch) pairs in chunks: the CTAs
 * running together are key blocks of a few pairs, which share each pair's Q, dO and dQ accumulator in L2.
 * Default mode: key blocks longest first across a chunk's pairs, so that the grid ends on short CTAs; the host
 * sizes the chunks and says which end is the longest (fa3_bwd_order). Deterministic mode: key blocks last first
 * (the order of the dQ adds, so a CTA waits only for CTAs launched before it) across args.chunk_heads pairs at a
 * time, so that the CTAs running together are a few key blocks of each of several heads, each a few steps behind
 * the one it waits for, rather than one head's key blocks, each a step behind the previous. */
struct fa3_bwd_cta {
    int nb, hk, b;
};
static __device__ __forceinline__ fa3_bwd_cta fa3_bwd_cta_get(const fa3_bwd_args &args) {
    const int n = args.key_blocks, heads = args.b.heads_kv, pairs = heads * args.b.batch;
    const int i = (int)blockIdx.x; /* (the grid is one dimension: fewer than 2^31 CTAs) */
    int nb, pair;
    if (!args.b.deterministic) {
        /* `wide` chunks of g + 1 pairs, then chunks of g: the CTA's chunk (its first pair, its width) and its
         * rank r in it */
        const int g = args.order_pairs, wide = args.order_wide, wide_ctas = wide * (g + 1) * n;
        int width, first, r;
        if (i < wide_ctas) {
            width = g + 1;
            const int chunk = i / (width * n);
            first = chunk * width;
            r = i - chunk * width * n;
        } else {
            width = g;
            const int j = i - wide_ctas, chunk = j / (width * n);
            first = wide * (g + 1) + chunk * width;
            r = j - chunk * width * n;
        }
        nb = args.order_last_first ? n - 1 - r / width : r / width;
        pair = first + r % width;
    } else {
        const int g = args.chunk_heads;
        const int chunk = i / (g * n), r = i - chunk * g * n;
        const int width = min(g, pairs - chunk * g); /* the last chunk may be narrower */
        nb = n - 1 - r / width;
        pair = chunk * g + r % width;
    }
    fa3_bwd_cta c;
    c.nb = nb;
    c.hk = pair % heads;
    c.b = pair / heads;
    return c;
}

/* Zeroes rows [from, rows) of a [D / 64 slabs][rows][64] tile, one warp: each row is one 128-byte line of its
 * slab, so the swizzle only permutes within what is zeroed. In a varlen batch the rows past a sequence that a TMA
 * box reaches belong to the next one, and a non-finite value there would reach this sequence's gradients
 * through the products' zero weights. */
template <int D>
static __device__ __forceinline__ void fa3_bwd_zero_rows(uint8_t *tile, int rows, int from) {
    /* the lane read here, not passed in: warp 1 runs on 24 registers, and a lane value held over its loop spills */
    int lane;
    asm volatile("mov.u32 %0, %%laneid;" : "=r"(lane));
    const int chunks = (rows - from) * 8; /* 16-byte chunks per slab */
#pragma unroll
    for (int sl = 0; sl < D / 64; ++sl)
        for (int i = lane; i < chunks; i += 32)
            *reinterpret_cast<uint4 *>(tile + sl * rows * 128 + from * 128 + i * 16) = make_uint4(0, 0, 0, 0);
}

/* What a CTA works on: its key block (keys n0..) of a (kv head, batch), the query blocks that see it, and its
 * nsteps steps (each query block for each query head of the group). */
struct fa3_bwd_work {
    fa3_bwd_cta cta;
    bwd_seq sq;
    fa3_bwd_blocks blk;
    int n0, nmb, nsteps, hq0;
    int bq, row_q, row_k; /* TMA coordinates: varlen rows are packed tokens of a batch extent 1 */
};
template <int BM, int BN, bool VARLEN>
static __device__ __forceinline__ fa3_bwd_work fa3_bwd_work_get(const fa3_bwd_args &args) {
    const fa2_bwd_args &a = args.b;
    fa3_bwd_work w;
    w.cta = fa3_bwd_cta_get(args);
    w.sq = bwd_seq_get(a, w.cta.b);
    w.n0 = w.cta.nb * BN;
    w.blk = fa3_bwd_blocks_get<BM, BN>(w.n0, w.sq.len_q, w.sq.len_k, a.window_left, a.window_right);
    /* (varlen: the grid covers the longest sequence; a key block past this one's keys has nothing to do) */
    w.nmb = w.blk.hi - w.blk.lo;
    w.nsteps = w.n0 < w.sq.len_k ? w.nmb * a.group : 0;
    w.hq0 = w.cta.hk * a.group;
    w.bq = VARLEN ? 0 : w.cta.b;
    w.row_q = VARLEN ? (int)w.sq.tok_q : 0;
    w.row_k = VARLEN ? (int)w.sq.tok_k : 0;
    return w;
}

#if FA_SM90A
/* The producer warpgroup (on C::kRegsProducer registers): thread 0 issues the TMA loads, K and V once, then Q and
 * dO per step into the ring; warp 1 writes each step's row values (and, in a varlen batch, first zeroes the rows
 * of the next sequence that a box reaches); in deterministic mode warps 2 and 3 keep the consumers' turns. */
template <class C, int D, int BM, bool DET, bool VARLEN>
static __device__ __forceinline__ void
fa3_bwd_producer(const CUtensorMap *tm_q, const CUtensorMap *tm_k, const CUtensorMap *tm_v, const CUtensorMap *tm_do,
                 const fa3_bwd_args &args, const fa3_bwd_work &w, uint8_t *smem, uint32_t base) {
    constexpr int BN = C::kBN, STAGES = C::kStages;
    const fa2_bwd_args &a = args.b;
    const uint32_t bars = base + C::kOffBar, s_q = base + C::kOffQ, s_do = base + C::kOffDO;
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (threadIdx.x == 0 && w.nsteps > 0) {
        hp_prefetch_tensor_map(tm_q);
        hp_prefetch_tensor_map(tm_do);
        const uint32_t bar_kv = bars + (VARLEN ? C::kBarKVLanded : C::kBarKV);
        const uint32_t bar_full = bars + (VARLEN ? C::kBarLanded : C::kBarFull);
        hp_mbar_arrive_expect_tx(bar_kv, 2 * C::kKVBytes);
        hp_tma_load_5d(base + C::kOffK, tm_k, bar_kv, 0, w.row_k + w.n0, 0, w.cta.hk, w.bq);
        hp_tma_load_5d(base + C::kOffV, tm_v, bar_kv, 0, w.row_k + w.n0, 0, w.cta.hk, w.bq);
        for (int t = 0; t < w.nsteps; ++t) {
            const fa3_bwd_step st = fa3_bwd_step_get(t, w.nmb, w.blk.lo, w.hq0);
            const int slot = fa3_pipe<STAGES>::stage(t);
            hp_mbar_wait(bars + C::kBarEmpty + 8 * slot, fa3_pipe<STAGES>::empty_phase(t));
            hp_mbar_arrive_expect_tx(bar_full + 8 * slot, 2 * C::kQBytes);
            hp_tma_load_5d(s_q + slot * C::kQBytes, tm_q, bar_full + 8 * slot, 0, w.row_q + st.mb * BM, 0, st.hq, w.bq);
            hp_tma_load_5d(s_do + slot * C::kQBytes, tm_do, bar_full + 8 * slot, 0, w.row_q + st.mb * BM, 0, st.hq,
                           w.bq);
        }
    } else if (warp == 1) {
        const bwd_seq &sq = w.sq;
        if (VARLEN && w.nsteps > 0) { /* K and V: the rows past the sequence zeroed, then released */
            hp_mbar_wait(bars + C::kBarKVLanded, 0);
            if (sq.len_k - w.n0 < BN) {
                fa3_bwd_zero_rows<D>(smem + C::kOffK, BN, sq.len_k - w.n0);
                fa3_bwd_zero_rows<D>(smem + C::kOffV, BN, sq.len_k - w.n0);
                hp_fence_proxy_async();
            }
            hp_mbar_arrive(bars + C::kBarKV);
        }
        float *rows = (float *)(smem + C::kOffRows);
        for (int t = 0; t < w.nsteps; ++t) {
            const fa3_bwd_step st = fa3_bwd_step_get(t, w.nmb, w.blk.lo, w.hq0);
            const int slot = fa3_pipe<STAGES>::stage(t);
            hp_mbar_wait(bars + C::kBarEmpty + 8 * slot, fa3_pipe<STAGES>::empty_phase(t));
            if constexpr (VARLEN) { /* Q and dO: likewise */
                hp_mbar_wait(bars + C::kBarLanded + 8 * slot, fa3_pipe<STAGES>::phase(t));
                if (sq.len_q - st.mb * BM < BM) {
                    fa3_bwd_zero_rows<D>(smem + C::kOffQ + slot * C::kQBytes, BM, sq.len_q - st.mb * BM);
                    fa3_bwd_zero_rows<D>(smem + C::kOffDO + slot * C::kQBytes, BM, sq.len_q - st.mb * BM);
                    hp_fence_proxy_async();
                }
            }
            /* Every load of the step before the first store: a store through this generic pointer may alias the
             * arrays, so a load after one waits for it, and the step's 2 x BM / 32 round trips to L2 or memory in a
             * row set the pace of short sequences (whose rows are rarely in L2). Rows past the sequence read the
             * sequence's first row (any valid address), then take +inf and 0. */
            const int64_t li0 = bwd_lse_index(a, w.cta.b, sq.tok_q, 0, st.hq); /* row m at li0 + m */
            float lse2v[BM / 32], neg_dsumv[BM / 32];
#pragma unroll
            for (int k = 0; k < BM / 32; ++k) {
                const int m = st.mb * BM + lane + 32 * k, row = m < sq.len_q ? m : 0;
                lse2v[k] = __ldg(a.lse2 + li0 + row);
                neg_dsumv[k] = -__ldg(a.dsum + li0 + row);
            }
            float *lse2 = rows + slot * 2 * BM, *neg_dsum = lse2 + BM;
#pragma unroll
            for (int k = 0; k < BM / 32; ++k) {
                const bool in = st.mb * BM + lane + 32 * k < sq.len_q;
                lse2[lane + 32 * k] = in ? lse2v[k] : INFINITY;
                neg_dsum[lane + 32 * k] = in ? neg_dsumv[k] : 0.f;
            }
            hp_mbar_arrive(bars + C::kBarFull + 8 * slot);
        }
    } else if (DET && warp >= 2) {
        fa3_bwd_turn_keeper<BM, BN>(args, w.sq, w.cta.b, w.cta.nb, w.nsteps, w.nmb, w.blk.lo, w.hq0, warp - 2);
    }
}
#endif /* FA_SM90A */

template <int D, int BM, typename T, bool SOFTCAP, bool ALIBI, bool DET, bool VARLEN>
__global__ void __launch_bounds__(384, 1)
    fa3_bwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                   const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                   const __grid_constant__ fa3_bwd_args args) {
#if FA_SM90A
    typedef fa3_bwd_cfg<D, BM> C;
    constexpr int BN = C::kBN, STAGES = C::kStages;
    const fa2_bwd_args &a = args.b;

    uint8_t *smem = (uint8_t *)(((uintptr_t)fa3_smem + 1023) & ~(uintptr_t)1023);
    const uint32_t base = hp_smem_addr(smem);
    const uint32_t s_k = base + C::kOffK, s_v = base + C::kOffV, s_q = base + C::kOffQ, s_do = base + C::kOffDO;
    const uint32_t s_ds = base + C::kOffDS, bars = base + C::kOffBar;
    float *rows = (float *)(smem + C::kOffRows);

    const fa3_bwd_work w = fa3_bwd_work_get<BM, BN, VARLEN>(args);
    const int hk = w.cta.hk, b = w.cta.b;
    const bwd_seq &sq = w.sq;
    const fa3_bwd_blocks &blk = w.blk;
    const int n0 = w.n0, nmb = w.nmb, nsteps = w.nsteps, hq0 = w.hq0;

    if (threadIdx.x == 0) C::init_barriers(bars, VARLEN);
    __syncthreads();

    const int wg = threadIdx.x / 128, lane = threadIdx.x % 32;
    if (wg == 0) {
        hp_setmaxnreg_dec<C::kRegsProducer>();
        fa3_bwd_producer<C, D, BM, DET, VARLEN>(&tm_q, &tm_k, &tm_v, &tm_do, args, w, smem, base);
        return;
    }

    hp_setmaxnreg_inc<C::kRegsConsumer>();
    const int c = wg - 1, warp_in_wg = (threadIdx.x % 128) / 32;
    fa3_bwd_frag f;
    f.row0 = 16 * warp_in_wg + lane / 4;
    f.col0 = 2 * (lane % 4);
    const int row_base = 64 * c;                    /* the warpgroup's key rows in the block */
    const int keys_left = sq.len_k - n0 - row_base; /* key rows of the warpgroup inside the sequence */
    const int off = sq.len_k - sq.len_q;

    float dv[D / 2], dk[D / 2];
#pragma unroll
    for (int i = 0; i < D / 2; ++i) dv[i] = 0.f, dk[i] = 0.f;

    if (nsteps > 0) hp_mbar_wait(bars + C::kBarKV, 0);
    const uint32_t s_k_rows = s_k + row_base * 128, s_v_rows = s_v + row_base * 128;
    /* dQ: this warpgroup's 64 x 64 part (C::kDQByRows: query rows 64 c.., else head-dim columns 64 c..) */
    const uint32_t s_ds_part = C::kDQByRows ? c * (BN * 128) : 0;
    const uint32_t s_k_part = s_k + (C::kDQByRows ? 0 : c * (BN * 128));
    const int dq_row0 = C::kDQByRows ? 64 * c : 0, dq_col0 = C::kDQByRows ? 0 : 64 * c;

    /* The second warpgroup starts once the first has its first dS^T: from then on one's GEMMs overlap the
     * other's softmax (their steps meet only where dQ reads both halves of dS^T, one step later). */
    if (c == 1 && nsteps > 0) hp_bar_sync(FA3_BWD_BAR_START, 256);
    int prev_m0 = 0, prev_hq = 0; /* the previous step's query block and head, for its dQ */
    for (int t = 0; t < nsteps; ++t) {
        const fa3_bwd_step st = fa3_bwd_step_get(t, nmb, blk.lo, hq0);
        const int slot = fa3_pipe<STAGES>::stage(t);
        const int m0 = st.mb * BM;
        hp_mbar_wait(bars + C::kBarFull + 8 * slot, fa3_pipe<STAGES>::phase(t));
        const uint32_t q_tile = s_q + slot * C::kQBytes, do_tile = s_do + slot * C::kQBytes;
        const float *lse2 = rows + slot * 2 * BM, *neg_dsum = lse2 + BM;
        fa3_bwd_rowvals<BM, !SOFTCAP> rowvals; /* LSE2, fetched before S^T's product */
        rowvals.fetch(lse2, f);
        const float slope_log2 = ALIBI ? fa3_bwd_alibi_slope_log2(a, b, st.hq) : 0.f;

        float s[BM / 2], dp[BM / 2];
        fa3_bwd_neg_dsum<BM>(dp, neg_dsum, f);
        fa3_bwd_issue_sdp<D, BM, T>(s, dp, s_k_rows, s_v_rows, q_tile, do_tile);

        float dfac[SOFTCAP ? BM / 2 : 1];
        hp_wgmma_wait<1>();
#pragma unroll
        for (int i = 0; i < BM / 2; ++i) hp_fence_reg(s[i]);
        const int dist0 = (n0 + row_base + f.row0) - (m0 + f.col0 + off);
        if (st.mb >= blk.mask_lo && st.mb < blk.mask_hi)
            fa3_bwd_probs<BM, false, SOFTCAP, ALIBI>(s, dfac, rowvals, f, a, dist0, keys_left - f.row0, slope_log2);
        else
            fa3_bwd_probs<BM, true, SOFTCAP, ALIBI>(s, dfac, rowvals, f, a, dist0, keys_left - f.row0, slope_log2);
        hp_wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < BM / 2; ++i) hp_fence_reg(dp[i]);
        fa3_bwd_dscores<BM, SOFTCAP>(dp, s, dfac);

        /* dS^T(t) into buffer t % 2 once both warpgroups' dQ products of step t - 2 have read it, before dV's
         * product is issued: issued earlier, dV's accumulators, P^T in both precisions and dP^T would be live at
         * once (ptxas issues it as soon as its operand exists). Published after dQ(t - 1) and dK(t) are issued,
         * so that the fence's wait for the stores runs beside them. */
        uint32_t p16[BM / 4], ds16[BM / 4];
        fa3_convert_p<BM, T>(s, p16);
        fa3_convert_p<BM, T>(dp, ds16);
        const int buf = fa3_pipe<2>::stage(t);
        hp_mbar_wait(bars + C::kBarDSFree + 8 * buf, fa3_pipe<2>::empty_phase(t));
        fa3_bwd_store_ds<BM, BN>(ds16, s_ds + buf * C::kDSBytes, row_base, warp_in_wg, lane);
        fa3_bwd_issue_rs<D, BM, T>(dv, p16, do_tile);

        /* dQ of the previous step (whose dS^T both warpgroups have written by now, or soon) between dV and dK, so
         * that its reductions run while dK's product is on the tensor cores. dK's issue stays in both branches: with
         * dq declared outside them (its product issued only when t > 0), ptxas serializes every wgmma and spills. */
        if (t > 0) {
            float dq[32];
            fa3_bwd_issue_dq_of<BN, T>(dq, bars + C::kBarDSReady, s_ds, C::kDSBytes, s_ds_part, s_k_part, t - 1);
            fa3_bwd_issue_rs<D, BM, T>(dk, ds16, q_tile);
            fa3_bwd_publish_ds(bars + C::kBarDSReady + 8 * buf, false);
            hp_wgmma_wait<1>(); /* dV and dQ done */
#pragma unroll
            for (int i = 0; i < 32; ++i) hp_fence_reg(dq[i]);
            hp_mbar_arrive(bars + C::kBarDSFree + 8 * fa3_pipe<2>::stage(t - 1));
            fa3_bwd_add_dq_ordered<D, DET>(dq, args, sq, b, prev_m0, prev_hq, dq_row0, dq_col0, c, f);
        } else {
            fa3_bwd_issue_rs<D, BM, T>(dk, ds16, q_tile);
            fa3_bwd_publish_ds(bars + C::kBarDSReady + 8 * buf, c == 0);
        }
        hp_wgmma_wait<0>(); /* dK done: Q and dO may be refilled */
#pragma unroll
        for (int i = 0; i < BM / 4; ++i) hp_fence_reg(p16[i]), hp_fence_reg(ds16[i]);
        hp_mbar_arrive(bars + C::kBarEmpty + 8 * slot);
        prev_m0 = m0;
        prev_hq = st.hq;
    }
    if (nsteps > 0) { /* the last step's dQ */
        float dq[32];
        fa3_bwd_issue_dq_of<BN, T>(dq, bars + C::kBarDSReady, s_ds, C::kDSBytes, s_ds_part, s_k_part, nsteps - 1);
        hp_wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 32; ++i) hp_fence_reg(dq[i]);
        fa3_bwd_add_dq_ordered<D, DET>(dq, args, sq, b, prev_m0, prev_hq, dq_row0, dq_col0, c, f);
    }
    const bool packed = a.cu_seqlens_q != nullptr; /* (varlen, read again: no register held over the loop) */
    /* staged in the ring stage of step nsteps - 3 + c: once either warpgroup is here, the other is past step
     * nsteps - 2 (its last dQ waited for both halves of the last dS^T) and no load is coming */
    const int stage = fa3_pipe<STAGES>::stage(nsteps + c);
    fa3_bwd_store_dkdv<D, T>(dk, dv, a, packed ? 0 : b, hk, packed ? sq.tok_k : 0, n0 + row_base, sq.len_k, f,
                             s_q + stage * C::kQBytes, s_do + stage * C::kQBytes, c);
#endif /* FA_SM90A */
}

#if FA_SM90A
/* ---- Head dim 256: the split-key kernel's consumer parts (fa3_bwd_wide_cfg) ----
 * Warpgroup c: S and dP for keys 32 c.. of the block (rows = the 64 queries), P and dS into the exchanged tiles
 * ([64 queries][64 keys], 128-byte swizzle); then dV^T and dK^T for head-dim rows 128 c.. (two m64 blocks, N =
 * the 64 keys, K = the queries: dO^T / Q^T and P / dS both MN-major) and dQ for head-dim columns 128 c.. (two
 * 64-column products, K = the keys: dS K-major, K MN-major). */

/* S = Q K_c^T and dP = dO V_c^T for the warpgroup's 32 keys: D / 16 wgmma steps each, one commit group each. */
template <int D, typename T>
static __device__ __forceinline__ void fa3_bwd_wide_issue_sdp(float (&s)[16], float (&dp)[16], uint32_t s_q,
                                                              uint32_t s_do, uint32_t s_k_half, uint32_t s_v_half) {
    constexpr int BM = 64, BN = 64;
#pragma unroll
    for (int i = 0; i < 16; ++i) hp_fence_reg(s[i]), hp_fence_reg(dp[i]);
    hp_wgmma_fence();
    const uint64_t dq = hp_desc_sw128(s_q, 16, 1024), dk = hp_desc_sw128(s_k_half, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
        fa3_wgmma_ss<32, T>(s, hp_desc_add(dq, ((kk / 4) * BM * 128 + (kk % 4) * 32) >> 4),
                            hp_desc_add(dk, ((kk / 4) * BN * 128 + (kk % 4) * 32) >> 4), kk > 0);
    hp_wgmma_commit();
    const uint64_t ddo = hp_desc_sw128(s_do, 16, 1024), dv = hp_desc_sw128(s_v_half, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
        fa3_wgmma_ss<32, T>(dp, hp_desc_add(ddo, ((kk / 4) * BM * 128 + (kk % 4) * 32) >> 4),
                            hp_desc_add(dv, ((kk / 4) * BN * 128 + (kk % 4) * 32) >> 4), kk > 0);
    hp_wgmma_commit();
#pragma unroll
    for (int i = 0; i < 16; ++i) hp_fence_reg(s[i]), hp_fence_reg(dp[i]);
}

/* P = exp2(S scale log2(e) - LSE2) in place (softcap: S -> softcap tanh(S scale / softcap), and dfac = 1 - tanh^2
 * kept for dS); element i is (query row0 + 8 ((i >> 1) & 1), key 8 (i >> 2) + col0 + (i & 1)). MASKED: pairs
 * outside the window or keys past the sequence get P = 0 (rows past the sequence have LSE2 = +inf).
 * dist0 = (key0 + col0) - (query row0 + off), key0 the warpgroup's first key. */
template <bool MASKED, bool SOFTCAP, bool ALIBI>
static __device__ __forceinline__ void
fa3_bwd_wide_probs(float (&s)[16], float (&dfac)[SOFTCAP ? 16 : 1], const float (&lse2)[2], const fa3_bwd_frag &f,
                   const fa2_bwd_args &a, int dist0, int keys_left, float slope_log2) {
    const int dlo = a.window_left >= 0 ? -a.window_left : INT_MIN, dhi = a.window_right >= 0 ? a.window_right : INT_MAX;
    const float cap_log2 = a.softcap * FA_LOG2E;
#pragma unroll
    for (int i = 0; i < 16; ++i) {
        const int h = (i >> 1) & 1, col = 8 * (i >> 2) + (i & 1);
        float x;
        if constexpr (SOFTCAP) {
            const float th = hp_tanh(s[i] * a.softcap_arg);
            x = th * cap_log2;
            dfac[i] = 1.f - th * th;
        } else {
            x = s[i] * a.scale_log2;
        }
        const int dist = dist0 + col - 8 * h;
        if constexpr (ALIBI) x -= slope_log2 * (float)abs(dist);
        float p = hp_exp2(x - lse2[h]);
        if constexpr (MASKED)
            if (!(f.col0 + col < keys_left && dist >= dlo && dist <= dhi)) p = 0.f;
        s[i] = p;
    }
}

/* The warpgroup's 16-bit pairs of a 64 x 32 fragment (pair i: elements 2i, 2i + 1) into the exchanged tile at
 * key columns col_base.. (one 64-column slab: row = query, 128-byte swizzle). */
static __device__ __forceinline__ void fa3_bwd_wide_store(const uint32_t (&v)[8], uint32_t tile, int col_base,
                                                          const fa3_bwd_frag &f) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
        const int r = f.row0 + 8 * (i & 1), col = col_base + 8 * (i >> 1) + f.col0;
        const uint32_t addr = tile + r * 128 + (((col / 8) ^ (r % 8)) << 4) + 2 * (col % 8);
        asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v[i]) : "memory");
    }
}

/* dV^T += dO^T P and dK^T += Q^T dS for head-dim rows 128 c + 64 mi (mi = 0, 1): A = a 64-column slab of dO / Q
 * (MN-major), B = P / dS (MN-major), K = the 64 queries; one commit group. */
template <typename T>
static __device__ __forceinline__ void fa3_bwd_wide_issue_dkdv(float (&dv)[2][32], float (&dk)[2][32], uint32_t s_q,
                                                               uint32_t s_do, uint32_t s_p, uint32_t s_ds, int c) {
    constexpr int BM = 64;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int i = 0; i < 32; ++i) hp_fence_reg(dv[mi][i]), hp_fence_reg(dk[mi][i]);
    hp_wgmma_fence();
    const uint64_t dp = hp_desc_sw128(s_p, BM * 128, 1024), dds = hp_desc_sw128(s_ds, BM * 128, 1024);
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) {
        const uint32_t slab = (2 * c + mi) * BM * 128;
        const uint64_t ddo = hp_desc_sw128(s_do + slab, BM * 128, 1024), dq = hp_desc_sw128(s_q + slab, BM * 128, 1024);
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk)
            fa3_wgmma_ss_mn<64, T>(dv[mi], hp_desc_add(ddo, (kk * 2048) >> 4), hp_desc_add(dp, (kk * 2048) >> 4), 1);
#pragma unroll
        for (int kk = 0; kk < BM / 16; ++kk)
            fa3_wgmma_ss_mn<64, T>(dk[mi], hp_desc_add(dq, (kk * 2048) >> 4), hp_desc_add(dds, (kk * 2048) >> 4), 1);
    }
    hp_wgmma_commit();
}

/* dQ for head-dim columns 128 c + 64 h (h = 0, 1) = dS K: A = dS (K-major), B = a 64-column slab of K (MN-major),
 * K = the 64 keys; one commit group. */
template <typename T>
static __device__ __forceinline__ void fa3_bwd_wide_issue_dq(float (&dq)[2][32], uint32_t s_ds, uint32_t s_k, int c) {
    constexpr int BN = 64;
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
        for (int i = 0; i < 32; ++i) hp_fence_reg(dq[h][i]);
    hp_wgmma_fence();
    const uint64_t dds = hp_desc_sw128(s_ds, 16, 1024);
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const uint64_t dk = hp_desc_sw128(s_k + (2 * c + h) * BN * 128, BN * 128, 1024);
#pragma unroll
        for (int kk = 0; kk < BN / 16; ++kk)
            fa3_wgmma_ss_kmn<64, T>(dq[h], hp_desc_add(dds, (kk * 32) >> 4), hp_desc_add(dk, (kk * 2048) >> 4), kk > 0);
    }
    hp_wgmma_commit();
}

/* dK (times the softmax scale) and dV from the transposed accumulators (element i of block mi is head-dim row
 * 128 c + 64 mi + row0 + 8 ((i >> 1) & 1), key 8 (i >> 2) + col0 + (i & 1)): transposed back by stmatrix.trans into
 * the tiles at s_dk, s_dv ([64 keys][128 head-dim columns of the warpgroup], 16-byte chunks XORed with the key's low
 * bits), then out in 16-byte stores, a key's chunks by consecutive threads; keys past the sequence not stored.
 * (From registers they were 2-byte stores, 256 per thread.) */
template <typename T>
static __device__ __forceinline__ void
fa3_bwd_wide_store_dkdv(const float (&dk)[2][32], const float (&dv)[2][32], const fa2_bwd_args &a, int b, int hk,
                        int64_t tok_k, int keys_left, int c, const fa3_bwd_frag &f, uint32_t s_dk, uint32_t s_dv) {
    const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32;
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int q = 0; q < 4; ++q) { /* keys 16 q .. 16 q + 15: matrices (key block, head-dim half) */
            const int m = lane / 8, key = 16 * q + 8 * (m >> 1) + lane % 8;
            const int chunk = 8 * mi + 2 * warp + (m & 1); /* of the warpgroup's 16 16-byte chunks per key */
            const uint32_t off = key * 256 + ((chunk ^ (key & 7)) << 4);
            const int i0 = 8 * q; /* key block 2 q: elements i0 .. i0 + 3; block 2 q + 1: i0 + 4 .. */
            fa_stmatrix_x4_trans(s_dk + off, fa3_pack<T>(dk[mi][i0] * a.scale, dk[mi][i0 + 1] * a.scale),
                                 fa3_pack<T>(dk[mi][i0 + 2] * a.scale, dk[mi][i0 + 3] * a.scale),
                                 fa3_pack<T>(dk[mi][i0 + 4] * a.scale, dk[mi][i0 + 5] * a.scale),
                                 fa3_pack<T>(dk[mi][i0 + 6] * a.scale, dk[mi][i0 + 7] * a.scale));
            fa_stmatrix_x4_trans(
                s_dv + off, fa3_pack<T>(dv[mi][i0], dv[mi][i0 + 1]), fa3_pack<T>(dv[mi][i0 + 2], dv[mi][i0 + 3]),
                fa3_pack<T>(dv[mi][i0 + 4], dv[mi][i0 + 5]), fa3_pack<T>(dv[mi][i0 + 6], dv[mi][i0 + 7]));
        }
    hp_bar_sync(FA3_BWD_BAR_STAGED + c, 128);
    T *gdk = (T *)a.dk.data + (int64_t)b * a.dk.stride_batch + tok_k * a.dk.stride_seq +
             (int64_t)hk * a.dk.stride_head + 128 * c;
    T *gdv = (T *)a.dv.data + (int64_t)b * a.dv.stride_batch + tok_k * a.dv.stride_seq +
             (int64_t)hk * a.dv.stride_head + 128 * c;
    const int tid = threadIdx.x % 128;
#pragma unroll
    for (int k = 0; k < 8; ++k) {
        const int key = 8 * k + tid / 16, chunk = tid % 16;
        if (key >= keys_left) break; /* (keys grow with k) */
        const uint32_t off = key * 256 + ((chunk ^ (key & 7)) << 4);
        *reinterpret_cast<uint4 *>(gdk + key * a.dk.stride_seq + 8 * chunk) = bwd_ld_shared_u128(s_dk + off);
        *reinterpret_cast<uint4 *>(gdv + key * a.dv.stride_seq + 8 * chunk) = bwd_ld_shared_u128(s_dv + off);
    }
}

#endif /* FA_SM90A */

/* The backward kernel for head dim 256 (fa3_bwd_wide_cfg): the same producer; each step both consumer
 * warpgroups compute their halves of S and dP, exchange P and dS (double-buffered tiles, an mbarrier pair per
 * buffer), then their halves of dQ, dV^T and dK^T. */
template <int D, typename T, bool SOFTCAP, bool ALIBI, bool DET, bool VARLEN>
__global__ void __launch_bounds__(384, 1)
    fa3_bwd_wide_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                        const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                        const __grid_constant__ fa3_bwd_args args) {
#if FA_SM90A
    typedef fa3_bwd_wide_cfg<D> C;
    constexpr int BM = 64, BN = C::kBN, STAGES = C::kStages;
    const fa2_bwd_args &a = args.b;

    uint8_t *smem = (uint8_t *)(((uintptr_t)fa3_smem + 1023) & ~(uintptr_t)1023);
    const uint32_t base = hp_smem_addr(smem);
    const uint32_t s_k = base + C::kOffK, s_v = base + C::kOffV, s_q = base + C::kOffQ, s_do = base + C::kOffDO;
    const uint32_t s_x = base + C::kOffDS, bars = base + C::kOffBar;
    const float *rows = (const float *)(smem + C::kOffRows);

    const fa3_bwd_work w = fa3_bwd_work_get<BM, BN, VARLEN>(args);
    if (threadIdx.x == 0) C::init_barriers(bars, VARLEN);
    __syncthreads();

    const int wg = threadIdx.x / 128, lane = threadIdx.x % 32;
    if (wg == 0) {
        hp_setmaxnreg_dec<C::kRegsProducer>();
        fa3_bwd_producer<C, D, BM, DET, VARLEN>(&tm_q, &tm_k, &tm_v, &tm_do, args, w, smem, base);
        return;
    }

    hp_setmaxnreg_inc<C::kRegsConsumer>();
    const int c = wg - 1;
    fa3_bwd_frag f;
    f.row0 = 16 * ((threadIdx.x % 128) / 32) + lane / 4;
    f.col0 = 2 * (lane % 4);
    const bwd_seq &sq = w.sq;
    const int keys_left = sq.len_k - w.n0 - 32 * c; /* the warpgroup's S columns inside the sequence */
    const int off = sq.len_k - sq.len_q;

    float dv[2][32], dk[2][32];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi)
#pragma unroll
        for (int i = 0; i < 32; ++i) dv[mi][i] = 0.f, dk[mi][i] = 0.f;

    if (w.nsteps > 0) hp_mbar_wait(bars + C::kBarKV, 0);
    for (int t = 0; t < w.nsteps; ++t) {
        const fa3_bwd_step st = fa3_bwd_step_get(t, w.nmb, w.blk.lo, w.hq0);
        const int slot = fa3_pipe<STAGES>::stage(t), m0 = st.mb * BM;
        hp_mbar_wait(bars + C::kBarFull + 8 * slot, fa3_pipe<STAGES>::phase(t));
        const uint32_t q_tile = s_q + slot * C::kQBytes, do_tile = s_do + slot * C::kQBytes;
        const float *lse2_row = rows + slot * 2 * BM, *neg_dsum_row = lse2_row + BM;

        float s[16], dp[16];
        fa3_bwd_wide_issue_sdp<D, T>(s, dp, q_tile, do_tile, s_k + 32 * c * 128, s_v + 32 * c * 128);
        const float lse2[2] = { lse2_row[f.row0], lse2_row[f.row0 + 8] };
        const float neg_dsum[2] = { neg_dsum_row[f.row0], neg_dsum_row[f.row0 + 8] };
        const float slope_log2 = ALIBI ? fa3_bwd_alibi_slope_log2(a, w.cta.b, st.hq) : 0.f;
        float dfac[SOFTCAP ? 16 : 1];
        hp_wgmma_wait<1>();
#pragma unroll
        for (int i = 0; i < 16; ++i) hp_fence_reg(s[i]);
        const int dist0 = (w.n0 + 32 * c + f.col0) - (m0 + f.row0 + off);
        if (st.mb >= w.blk.mask_lo && st.mb < w.blk.mask_hi)
            fa3_bwd_wide_probs<false, SOFTCAP, ALIBI>(s, dfac, lse2, f, a, dist0, keys_left, slope_log2);
        else
            fa3_bwd_wide_probs<true, SOFTCAP, ALIBI>(s, dfac, lse2, f, a, dist0, keys_left, slope_log2);
        hp_wgmma_wait<0>();
#pragma unroll
        for (int i = 0; i < 16; ++i) {
            hp_fence_reg(dp[i]);
            float ds = s[i] * (dp[i] + neg_dsum[(i >> 1) & 1]);
            if constexpr (SOFTCAP) ds *= dfac[i];
            dp[i] = ds;
        }
        uint32_t p16[8], ds16[8];
#pragma unroll
        for (int i = 0; i < 8; ++i)
            p16[i] = fa3_pack<T>(s[2 * i], s[2 * i + 1]), ds16[i] = fa3_pack<T>(dp[2 * i], dp[2 * i + 1]);

        /* P and dS into buffer t % 2 once both warpgroups are done with step t - 2's */
        const int buf = fa3_pipe<2>::stage(t);
        const uint32_t s_p = s_x + buf * C::kDSBytes, s_ds = s_p + C::kPBytes;
        hp_mbar_wait(bars + C::kBarDSFree + 8 * buf, fa3_pipe<2>::empty_phase(t));
        fa3_bwd_wide_store(p16, s_p, 32 * c, f);
        fa3_bwd_wide_store(ds16, s_ds, 32 * c, f);
        hp_fence_proxy_async();
        hp_mbar_arrive(bars + C::kBarDSReady + 8 * buf);
        hp_mbar_wait(bars + C::kBarDSReady + 8 * buf, fa3_pipe<2>::phase(t));

        /* dQ first, so that its reductions run while dV^T and dK^T are on the tensor cores */
        float dq[2][32];
        fa3_bwd_wide_issue_dq<T>(dq, s_ds, s_k, c);
        fa3_bwd_wide_issue_dkdv<T>(dv, dk, q_tile, do_tile, s_p, s_ds, c);
        hp_wgmma_wait<1>();
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int i = 0; i < 32; ++i) hp_fence_reg(dq[h][i]);
        if constexpr (DET) hp_bar_sync(FA3_BWD_BAR_GO + c, 160);
#pragma unroll
        for (int h = 0; h < 2; ++h)
            fa3_bwd_add_dq<D>(dq[h], a.dq_accum, fa3_bwd_dq_row0(sq.tok_q, w.cta.b) + m0, sq.len_q - m0, st.hq,
                              a.heads_q, 128 * c + 64 * h, f);
        if constexpr (DET) hp_bar_arrive(FA3_BWD_BAR_DONE + c, 160);
        hp_wgmma_wait<0>();
        hp_mbar_arrive(bars + C::kBarEmpty + 8 * slot);
        hp_mbar_arrive(bars + C::kBarDSFree + 8 * buf);
    }
    const bool packed = a.cu_seqlens_q != nullptr;
    /* staged in the ring stage of step nsteps - 2 (the warpgroups move in step: both are past it) */
    const int stage = fa3_pipe<STAGES>::stage(w.nsteps), half = c * (64 * 128 * 2);
    fa3_bwd_wide_store_dkdv<T>(dk, dv, a, packed ? 0 : w.cta.b, w.cta.hk, (packed ? sq.tok_k : 0) + w.n0,
                               sq.len_k - w.n0, c, f, s_q + stage * C::kQBytes + half,
                               s_do + stage * C::kQBytes + half);
#endif /* FA_SM90A */
}

/* dQ = scale * dQaccum in the FA3 order (fa3_bwd_dq_index). Grid (ceil(Sq / 64), Hq, B), 256 threads; a thread's
 * unit is 64 contiguous bytes of the accumulator, rows r and r + 8 of a 16-row block at 8 columns, which it writes
 * as 16 bytes of each row; consecutive threads read consecutive units. (The FA2 convert's 8-byte reads of one
 * row took half of each 16-byte run and ran at half the memory's rate: 108 us at d128 with 16k tokens x 16 heads,
 * H200, ncu, a sixth of the backward's time at 512 tokens.) */
template <typename T, int D>
__global__ void __launch_bounds__(256) fa3_bwd_convert_dq_kernel(const fa2_bwd_args a) {
    const int h = blockIdx.y, b = blockIdx.z;
    const bwd_seq s = bwd_seq_get(a, b);
    const int m0 = blockIdx.x * 64;
    const int64_t row0 = fa3_bwd_dq_row0(s.tok_q, b) + m0;
#pragma unroll
    for (int k = 0; k < 4 * D / 256; ++k) {
        /* unit u of the CTA's 64 rows: 16-row block u / D, then column group g, row pair p (the order's layout) */
        const int u = (int)threadIdx.x + 256 * k, blk = u / D, g = (u % D) / 8, p = u % 8;
        const int r = m0 + 16 * blk + p; /* rows r and r + 8 of the sequence */
        if (r >= s.len_q) continue;
        const float4 *src = reinterpret_cast<const float4 *>(
            a.dq_accum + fa3_bwd_dq_index(row0 + 16 * blk + p, h, 8 * g, a.heads_q, D));
        float lo[8], hi[8]; /* rows r, r + 8: columns 8 g .. 8 g + 7 */
#pragma unroll
        for (int t = 0; t < 4; ++t) {
            const float4 x = src[t]; /* (r, 2t), (r, 2t + 1), (r + 8, 2t), (r + 8, 2t + 1) */
            lo[2 * t] = x.x, lo[2 * t + 1] = x.y, hi[2 * t] = x.z, hi[2 * t + 1] = x.w;
        }
        bwd_store_dq8<T>(a, s, b, r, h, 8 * g, lo);
        if (r + 8 < s.len_q) bwd_store_dq8<T>(a, s, b, r + 8, h, 8 * g, hi);
    }
}

/* Launches the preprocess (which also zeroes dQaccum), a backward kernel (its shared memory: smem_bytes) and the
 * convert for one head dim. */
template <int D, typename T>
static fa_status fa3_bwd_launch_kernel(void (*kernel)(const CUtensorMap, const CUtensorMap, const CUtensorMap,
                                                      const CUtensorMap, const fa3_bwd_args),
                                       int smem_bytes, const fa3_bwd_args *a, const CUtensorMap *tm_q,
                                       const CUtensorMap *tm_k, const CUtensorMap *tm_v, const CUtensorMap *tm_do,
                                       cudaStream_t stream) {
    const dim3 rows_grid((a->b.seqlen_q + 63) / 64, a->b.heads_q, a->b.batch);
    if (a->b.seqlen_q > 0) {
        fa2_bwd_preprocess_kernel<T, D, true><<<rows_grid, 256, 0, stream>>>(a->b);
        fa_status st = fa_cuda_status(cudaGetLastError(), "fa3 backward preprocess launch");
        if (st != FA_OK) return st;
    }
    if (a->key_blocks > 0) {
        cudaError_t err =
            cudaFuncSetAttribute((const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_bytes);
        if (err != cudaSuccess) return fa_cuda_status(err, "fa3 backward: setting the shared-memory size");
        const unsigned grid = (unsigned)a->key_blocks * (unsigned)(a->b.heads_kv * a->b.batch);
        kernel<<<grid, 384, smem_bytes, stream>>>(*tm_q, *tm_k, *tm_v, *tm_do, *a);
        fa_status st = fa_cuda_status(cudaGetLastError(), "fa3 backward launch");
        if (st != FA_OK) return st;
    }
    if (a->b.seqlen_q > 0) {
        fa3_bwd_convert_dq_kernel<T, D><<<rows_grid, 256, 0, stream>>>(a->b);
        return fa_cuda_status(cudaGetLastError(), "fa3 backward convert launch");
    }
    return FA_OK;
}

/* Deterministic mode is its own instance: its turn keeping, kept live in the default kernel's consumers, cost
 * causal problems 8-13% (H200, d128 8k / 16k, Llama GQA 8k); so are softcap and ALiBi (ALiBi as a branch in the
 * default kernel made ptxas spill 44 B at head dim 64). */
template <int D, int BM, bool BF16, bool SOFTCAP, bool ALIBI>
static fa_status fa3_bwd_launch(const fa3_bwd_args *a, const CUtensorMap *tm_q, const CUtensorMap *tm_k,
                                const CUtensorMap *tm_v, const CUtensorMap *tm_do, cudaStream_t stream) {
    typedef typename fa3_elem<BF16>::type T;
    const bool det = a->b.deterministic, varlen = a->b.cu_seqlens_q != nullptr;
    void (*kernel)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const CUtensorMap, const fa3_bwd_args) =
        det ? (varlen ? fa3_bwd_kernel<D, BM, T, SOFTCAP, ALIBI, true, true>
                      : fa3_bwd_kernel<D, BM, T, SOFTCAP, ALIBI, true, false>)
            : (varlen ? fa3_bwd_kernel<D, BM, T, SOFTCAP, ALIBI, false, true>
                      : fa3_bwd_kernel<D, BM, T, SOFTCAP, ALIBI, false, false>);
    return fa3_bwd_launch_kernel<D, T>(kernel, fa3_bwd_cfg<D, BM>::kSmemBytes, a, tm_q, tm_k, tm_v, tm_do, stream);
}

template <int D, bool BF16, bool SOFTCAP, bool ALIBI>
static fa_status fa3_bwd_wide_launch(const fa3_bwd_args *a, const CUtensorMap *tm_q, const CUtensorMap *tm_k,
                                     const CUtensorMap *tm_v, const CUtensorMap *tm_do, cudaStream_t stream) {
    typedef typename fa3_elem<BF16>::type T;
    const bool det = a->b.deterministic, varlen = a->b.cu_seqlens_q != nullptr;
    void (*kernel)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const CUtensorMap, const fa3_bwd_args) =
        det ? (varlen ? fa3_bwd_wide_kernel<D, T, SOFTCAP, ALIBI, true, true>
                      : fa3_bwd_wide_kernel<D, T, SOFTCAP, ALIBI, true, false>)
            : (varlen ? fa3_bwd_wide_kernel<D, T, SOFTCAP, ALIBI, false, true>
                      : fa3_bwd_wide_kernel<D, T, SOFTCAP, ALIBI, false, false>);
    return fa3_bwd_launch_kernel<D, T>(kernel, fa3_bwd_wide_cfg<D>::kSmemBytes, a, tm_q, tm_k, tm_v, tm_do, stream);
}

/* One head dim's instances by dtype and score modifier (softcap or ALiBi; both together run the FA2 backward:
 * fa3_bwd.cu). WIDE: fa3_bwd_wide_kernel, else fa3_bwd_kernel with BM-row query blocks. */
template <int D, int BM, bool WIDE, bool BF16>
static fa_status fa3_bwd_dispatch_mod(const fa3_bwd_args *a, const CUtensorMap *m, cudaStream_t stream) {
    const bool softcap = a->b.softcap > 0.0f, alibi = a->b.alibi_slopes != nullptr;
    if constexpr (WIDE) {
        if (softcap) return fa3_bwd_wide_launch<D, BF16, true, false>(a, &m[0], &m[1], &m[2], &m[3], stream);
        if (alibi) return fa3_bwd_wide_launch<D, BF16, false, true>(a, &m[0], &m[1], &m[2], &m[3], stream);
        return fa3_bwd_wide_launch<D, BF16, false, false>(a, &m[0], &m[1], &m[2], &m[3], stream);
    } else {
        if (softcap) return fa3_bwd_launch<D, BM, BF16, true, false>(a, &m[0], &m[1], &m[2], &m[3], stream);
        if (alibi) return fa3_bwd_launch<D, BM, BF16, false, true>(a, &m[0], &m[1], &m[2], &m[3], stream);
        return fa3_bwd_launch<D, BM, BF16, false, false>(a, &m[0], &m[1], &m[2], &m[3], stream);
    }
}
template <int D, int BM, bool WIDE>
static fa_status fa3_bwd_dispatch(const fa3_bwd_args *a, const CUtensorMap *maps, int bf16, cudaStream_t stream) {
    return bf16 ? fa3_bwd_dispatch_mod<D, BM, WIDE, true>(a, maps, stream)
                : fa3_bwd_dispatch_mod<D, BM, WIDE, false>(a, maps, stream);
}

/* Per head dim launchers (fa3_bwd_hdim*.cu). */
fa_status fa3_bwd_run_hdim64(const fa3_bwd_args *a, const CUtensorMap *maps, int bf16, cudaStream_t stream);
fa_status fa3_bwd_run_hdim128(const fa3_bwd_args *a, const CUtensorMap *maps, int bf16, cudaStream_t stream);
fa_status fa3_bwd_run_hdim256(const fa3_bwd_args *a, const CUtensorMap *maps, int bf16, cudaStream_t stream);

#endif /* FLASHATTN_CUDA_FA3_BWD_CUH */
