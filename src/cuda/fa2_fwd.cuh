/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fa2_fwd.cuh - the FlashAttention-2 forward kernel (Algorithm 1 of the paper) for sm_80+, its tile table
 * and launcher. Instantiated once per head dim in fa2_fwd_hdim*.cu (every row of the tile table of that head
 * dim); the row is chosen and launched by fa2_fwd.cu.
 *
 * One block per (block of block_m query rows, query head, batch entry). The block keeps its Q tile in shared
 * memory and walks the key/value blocks it can see from the last to the first, so the blocks that need a mask
 * (the sequence tail and the causal diagonal) come first. Each warp owns block_m / warps whole query rows
 * ("split-Q"): its row max and row sum never leave the warp. Per key block:
 *   S = Q K^T            mma.sync m16n8k16, Q and K fragments by ldmatrix from shared memory (Q held
 *                        in registers when a warp has a single m16 tile)
 *   mask / softcap / ALiBi only on blocks that need them (a warp-uniform branch)
 *   online softmax       m and l in log2 units; exp2(s * scale * log2(e) - m) is one FFMA and one MUFU op;
 *                        1/l is applied once at the end
 *   O += P V             P converted to 16 bits in registers is the A operand; V fragments by ldmatrix.trans
 * (both products optionally software-pipelined: the next step's fragments are loaded before this step's mma).
 * K/V arrive by cp.async: with 2 stages the next block's K and V are copied while this one is computed (one
 * barrier per block), and a block may be processed in softmax steps of step_n keys; with 1 stage (head dims 192
 * and 256, and 128 where two double-buffered blocks do not fit an SM: two blocks per SM, which hide each other's
 * loads) V is copied during QK^T and the next K during softmax and PV, as in the paper's implementation.
 * O goes back through the warp's own rows of the Q tile for 16-byte coalesced stores. Under a causal mask the
 * blocks are launched longest first across chunks of heads (fa2_fwd_block).
 */
#ifndef FLASHATTN_CUDA_FA2_FWD_CUH
#define FLASHATTN_CUDA_FA2_FWD_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "common.cuh"
#include "cuda/hdims.h"
#include "flashattn.h"

/* Everything the kernel reads, resolved on the host by fa2_fwd.cu. Strides are in elements. */
typedef struct fa2_fwd_args {
    const void *q, *k, *v;
    void *o;
    float *lse; /* may be NULL */
    int64_t q_batch, q_row, q_head;
    int64_t k_batch, k_row, k_head;
    int64_t v_batch, v_row, v_head;
    int64_t o_batch, o_row, o_head;
    const int32_t *cu_seqlens_q, *cu_seqlens_k; /* device; NULL for a dense batch */
    int32_t seqlen_q, seqlen_k;                 /* dense lengths, or the varlen upper bounds */
    int32_t heads_q, group;                     /* group = heads_q / heads_kv */
    int64_t total_q;                            /* varlen: lse is (heads_q, total_q) */
    float scale;                                /* softmax_scale */
    float scale_log2;                           /* |softmax_scale| * log2(e) */
    float inv_abs_scale;                        /* 1 / |softmax_scale| */
    float softcap, inv_softcap;                 /* softcap > 0: on */
    int32_t window_left, window_right;          /* -1 = unbounded; causal is window_right = 0 */
    const float *alibi;                         /* device; NULL = off */
    int64_t alibi_batch_stride;
    int32_t every_block_modified; /* softcap, ALiBi or a negative scale: scores need the slow path */
    int32_t chunk_pairs;          /* launch order: (batch, head) pairs per chunk (fa2_fwd_block) */
} fa2_fwd_args;

/* ---------------------------------------------------------------------------------------------------------
 * Tile table for sm_80 .. sm_90. One row is one configuration of the kernel for head dim d:
 *   block_m  query rows per block (block_m / warps per warp, a multiple of 16)
 *   block_n  keys per K/V tile (one barrier per tile)
 *   step_n   keys per softmax step inside a tile (S takes (block_m / warps / 16) * step_n / 2 registers)
 *   stages   K/V tiles in flight (2: the next tile is copied during this one; 1: V during QK^T, next K after)
 *   pipe     1: the Q K^T and P V products load the next step's fragments before this step's mma (two register
 *            sets; ptxas otherwise puts each ldmatrix right before its mma, whose wait then dominates: +5% at
 *            d = 128, +1-2% at d = 64 and, with slab copies, at d = 256 on the H200)
 *   stream_v, stream_k  single stage only, 0: V (and the next K) copied all at once; v > 0: V's copies spread
 *            over the first 1 / v of the Q K^T product, the next K's over the first 1 / k of P V
 *            (fa_cp_async_stream; d = 256: +3-9%, d = 128: +1-2% on the H200)
 * Shared memory = (block_m + 2 * stages * block_n) * (2 * d + 16) bytes (rows padded by 16 bytes; 2 d at d = 256,
 * whose tiles are swizzled instead: fa2_fwd_swizzled); the kernel has no static shared memory. O takes
 * (block_m / warps / 16) * d / 2 fp32 registers per thread. Each warp needs two m16 tiles of rows to feed the
 * tensor cores from shared memory: with one, ldmatrix traffic per mma doubles.
 * ------------------------------------------------------------------------------------------------------- */
typedef struct fa2_fwd_tile {
    int d, block_m, block_n, step_n, warps, stages, pipe, stream_v, stream_k;
    int sm_blocks; /* the row is taken only where this many of its blocks fit in an SM's shared memory */
} fa2_fwd_tile;

/* Tuning builds may override the first row of a head dim with -DFA2_FWD_TILE_<D>="M, N, STEP, WARPS, STAGES,
 * PIPE, STREAM_V, STREAM_K". */
#ifndef FA2_FWD_TILE_32
#define FA2_FWD_TILE_32 128, 128, 64, 4, 2, 0, 0, 0
#endif
#ifndef FA2_FWD_TILE_64
#define FA2_FWD_TILE_64 128, 64, 64, 4, 2, 1, 0, 0
#endif
#ifndef FA2_FWD_TILE_96
#define FA2_FWD_TILE_96 128, 64, 32, 4, 2, 0, 0, 0
#endif
#ifndef FA2_FWD_TILE_128
#define FA2_FWD_TILE_128 128, 64, 64, 4, 2, 1, 0, 0
#endif
#ifndef FA2_FWD_TILE_192
#define FA2_FWD_TILE_192 64, 64, 64, 4, 1, 0, 0, 0
#endif
#ifndef FA2_FWD_TILE_256
#define FA2_FWD_TILE_256 64, 64, 64, 4, 1, 1, 2, 2
#endif

/* The configurations of each head dim from the most shared memory to the least; the host takes the first that
 * fits the device's opt-in shared memory per block (227 KB on H100/H200, 163 KB on A100, 99 KB (101376 bytes)
 * on sm_86, sm_89 and sm_120) sm_blocks times over in an SM's (228, 164, 100 KB; fa2_fwd.cu). The first row of a head
 * dim is the one measured on the H200 (docs/worklog.md). Comments: shared memory in KB of 1024 bytes, [block_m x
 * block_n], the GPUs that take it. */
static constexpr fa2_fwd_tile fa2_fwd_tiles[] = {
    /* d, block_m, block_n, step_n, warps, stages, pipe, stream_v, stream_k, sm_blocks */
    { 32, FA2_FWD_TILE_32, 1 },   /* 50 KB [128 x 128]: every part; O is 32 registers, so 128-key tiles halve the
                                     barriers per key */
    { 64, FA2_FWD_TILE_64, 1 },   /* 54 KB [128 x 64]: every part; O 64 + S 64 registers; pipelined */
    { 96, FA2_FWD_TILE_96, 1 },   /* 78 KB [128 x 64]: every part; O is 96 registers, which leaves room for a 32-key
                                     softmax step only */
    { 128, FA2_FWD_TILE_128, 2 }, /* 102 KB [128 x 64]: H100/H200 (two blocks per SM); O 128 + S 64 registers, the
                                     paper's A100/H100 tile, pipelined and double-buffered (+3-7% over the single
                                     stage below on the H200) */
    { 128, 128, 64, 64, 4, 1, 1, 2, 2, 1 }, /* 68 KB [128 x 64]: every part; single-stage: V copied during Q K^T, the
                                     next K during P V */
    { 192, FA2_FWD_TILE_192, 1 }, /* 75 KB [64 x 64]: every part; single-stage so that two blocks share an H200 SM;
                                     one m16 tile per warp (O 96 registers) */
    { 256, FA2_FWD_TILE_256, 1 }, /* 96 KB [64 x 64]: every part (the 99 KB parts too); single-stage: two
                                     blocks per H200 SM hide each other's loads (O alone is 128 registers) */
    { 256, 64, 32, 32, 4, 1, 0, 0, 0, 1 }, /* 64 KB [64 x 32]: below 96 KB (a limit set by FLASHATTN_SMEM_LIMIT); half
                                     the keys per tile */
};
#define FA2_FWD_NTILES ((int)(sizeof(fa2_fwd_tiles) / sizeof(fa2_fwd_tiles[0])))

/* Q, K and V tiles XOR-swizzled (fa_smem_tile) at d = 256, else rows padded by 16 bytes. Swizzled, a warp's
 * cp.async fills aligned 128-byte lines (4 shared-memory wavefronts instead of ~10), but each fragment address
 * of a product becomes one of four XORed bases: on the H200 +0.5-3% at d = 256, neutral at 64, -4% at 128
 * (its pipelined kernel spills more). Tuning builds: -DFA2_FWD_SWIZZLE_MIN_D=64 swizzles every multiple of 64. */
#ifndef FA2_FWD_SWIZZLE_MIN_D
#define FA2_FWD_SWIZZLE_MIN_D 256
#endif
static constexpr __host__ __device__ bool fa2_fwd_swizzled(int d) {
    return d % 64 == 0 && d >= FA2_FWD_SWIZZLE_MIN_D;
}

static constexpr size_t fa2_fwd_smem_bytes(const fa2_fwd_tile &t) {
    return (size_t)(2 * t.d + (fa2_fwd_swizzled(t.d) ? 0 : 16)) * (t.block_m + 2 * t.stages * t.block_n);
}

/* One launcher per head dim (fa2_fwd_hdim*.cu): runs configuration `tile` (an index into fa2_fwd_tiles, a row
 * of that head dim). With a == NULL it only checks that this build holds the kernel for the current device
 * (cudaErrorNoKernelImageForDevice if not). */
#define FA2_FWD_DECLARE_HDIM(D) \
    cudaError_t fa2_fwd_hdim##D(const fa2_fwd_args *a, fa_dtype dtype, int tile, int batch, cudaStream_t stream)
#define FA2_FWD_DECLARE_ONE(D) FA2_FWD_DECLARE_HDIM(D);
FA_HDIMS(FA2_FWD_DECLARE_ONE)
#undef FA2_FWD_DECLARE_ONE

#ifdef __CUDACC__

/* ---------------------------------------------------------------------------------------------------------
 * Device code
 * ------------------------------------------------------------------------------------------------------- */

/* Where sequence b's rows start in each tensor, and its lengths. */
struct fa2_seq {
    int len_q, len_k;
    int64_t q, k, v, o, lse; /* element offsets of row 0 (head 0) */
};

static __device__ __forceinline__ fa2_seq fa2_seq_get(const fa2_fwd_args &a, int b, int h) {
    fa2_seq s;
    if (a.cu_seqlens_q) {
        const int tq = a.cu_seqlens_q[b], tk = a.cu_seqlens_k[b];
        s.len_q = a.cu_seqlens_q[b + 1] - tq;
        s.len_k = a.cu_seqlens_k[b + 1] - tk;
        s.q = tq * a.q_row;
        s.o = tq * a.o_row;
        s.k = tk * a.k_row;
        s.v = tk * a.v_row;
        s.lse = h * a.total_q + tq;
    } else {
        s.len_q = a.seqlen_q;
        s.len_k = a.seqlen_k;
        s.q = b * a.q_batch;
        s.o = b * a.o_batch;
        s.k = b * a.k_batch;
        s.v = b * a.v_batch;
        s.lse = ((int64_t)b * a.heads_q + h) * a.seqlen_q;
    }
    return s;
}

/* Query block, head and batch entry of this block: under a causal mask the last query block (the most keys) is
 * the longest, and the launch order goes longest first across chunks of (batch, head) pairs (fa_chunked_order). */
struct fa2_fwd_block {
    int m_block, h, b;
};
static __device__ __forceinline__ fa2_fwd_block fa2_fwd_block_get(const fa2_fwd_args &a) {
    const int nm = gridDim.x, ny = gridDim.y, cp = a.chunk_pairs;
    fa2_fwd_block w;
    if (cp == 1) { /* (also every grid of 2^31 blocks or more: the host sets cp = 1 for those) */
        w.m_block = nm - 1 - blockIdx.x;
        w.h = blockIdx.y;
        w.b = blockIdx.z;
        return w;
    }
    const fa_grid_slot g = fa_chunked_order(nm, ny, cp);
    w.m_block = nm - 1 - g.rank;
    w.h = g.pair % ny;
    w.b = g.pair / ny;
    return w;
}

template <typename T, int D, int BM, int BN, int SN, int NW, int STAGES, bool PIPE, int STREAM_V, int STREAM_K>
__global__ void __launch_bounds__(NW * 32) fa2_fwd_kernel(const __grid_constant__ fa2_fwd_args a) {
    typedef fa_elem<T> E;
    constexpr bool kSwizzle = fa2_fwd_swizzled(D);
    typedef fa_smem_tile<BM, D, kSwizzle> QTile;
    typedef fa_smem_tile<BN, D, kSwizzle> KVTile;
    constexpr int kThreads = NW * 32;
    constexpr int RPW = BM / NW; /* query rows per warp */
    constexpr int MT = RPW / 16; /* m16 tiles per warp */
    constexpr int NT = SN / 8;   /* n8 tiles of S (one softmax step of SN keys) */
    constexpr int DT = D / 8;    /* n8 tiles of O */
    constexpr uint32_t kStageBytes = 2 * KVTile::kBytes;
    static_assert(RPW % 16 == 0 && SN % 16 == 0 && BN % SN == 0 && D % 16 == 0, "tile shape");
    static_assert(SN == BN || STAGES == 2, "single-stage K/V needs the whole block in one softmax step");
    static_assert(!PIPE || MT > 1 || D > 128, "the pipelined Q K^T takes Q from shared memory");
    /* Single-stage K/V with stream_v > 0: V's copies spread over the Q K^T product, the next K's over P V
     * (fa_cp_async_stream). */
    constexpr bool kStream = STAGES == 1 && STREAM_V > 0 && STREAM_K > 0;
    static_assert(!kStream || kThreads % (D / 8) == 0, "streamed copies: whole rows per group of threads");
    /* d = 256 copies by slabs (+2.5-4.5% over two alternating row addresses on the H200); d = 128 keeps the row
     * addresses (with slabs it spills). FA2_STREAM_PTRS overrides it in tuning builds. */
#ifndef FA2_STREAM_PTRS
    constexpr int kStreamPtrs = !kStream || D < 256 ? 2 : -1;
#else
    constexpr int kStreamPtrs = FA2_STREAM_PTRS;
#endif
    typedef fa_cp_async_stream<KVTile, kStream ? kThreads : D / 8, kStreamPtrs, T>
        KVStream;                                                               /* (unused if not kStream) */
    constexpr int kVSteps = D / 16 / (STREAM_V > 0 ? STREAM_V : 1);             /* Q K^T steps that carry V's copies */
    constexpr int kKSteps = SN / 16 * (D / 16) / (STREAM_K > 0 ? STREAM_K : 1); /* P V steps that carry K's */

    extern __shared__ __align__(128) unsigned char fa2_smem[];
    const uint32_t sQ = fa_smem_addr(fa2_smem);
    const uint32_t sKV = sQ + QTile::kBytes; /* stage s: K at sKV + s kStageBytes, V right after K */

    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const fa2_fwd_block work = fa2_fwd_block_get(a);
    const int m_block = work.m_block, h = work.h, b = work.b;

    const fa2_seq sq = fa2_seq_get(a, b, h);
    const int m0 = m_block * BM;
    if (m0 >= sq.len_q) return;
    const int len_k = sq.len_k;
    const int rows_q = min(BM, sq.len_q - m0);
    const int hk = h / a.group;
    const T *k = (const T *)a.k + sq.k + hk * a.k_head;
    const T *v = (const T *)a.v + sq.v + hk * a.v_head;

    /* Query i sits at key i + shift. Keys visible to some row of the block: [key_lo, key_hi). Blocks whose
     * keys are visible to every row of the block: [n_full_lo, n_full_hi). */
    const int64_t shift = (int64_t)len_k - sq.len_q;
    int64_t key_lo = 0, key_hi = len_k, full_lo = 0, full_hi = len_k;
    if (a.window_left >= 0) {
        key_lo = max((int64_t)0, m0 + shift - a.window_left);
        full_lo = m0 + rows_q - 1 + shift - a.window_left;
    }
    if (a.window_right >= 0) {
        key_hi = min((int64_t)len_k, m0 + rows_q - 1 + shift + a.window_right + 1);
        full_hi = min((int64_t)len_k, m0 + shift + a.window_right + 1);
    }

    if (key_hi <= key_lo) { /* no row of this block sees a key: O = 0, LSE = -inf */
        T *o = (T *)a.o + sq.o + h * a.o_head + m0 * a.o_row;
        for (int idx = tid; idx < rows_q * (D / 8); idx += kThreads) {
            const int r = idx / (D / 8), c = idx % (D / 8);
            *(uint4 *)(o + r * a.o_row + c * 8) = make_uint4(0, 0, 0, 0);
        }
        if (a.lse)
            for (int r = tid; r < rows_q; r += kThreads) a.lse[sq.lse + m0 + r] = -INFINITY;
        return;
    }
    const int n_lo = (int)(key_lo / BN), n_hi = (int)((key_hi + BN - 1) / BN);
    const int n_full_lo = (int)min((max(full_lo, (int64_t)0) + BN - 1) / BN, (int64_t)n_hi);
    const int n_full_hi = (int)max(full_hi / BN, (int64_t)0);
    /* This thread's first query row, as a key position: m0 + warp rows + lane / 4 + shift. */
    const int64_t diag0 = m0 + warp * RPW + lane / 4 + shift;

    float acc[MT][DT][4];
    float row_max[MT][2], row_sum[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mt][dt][e] = 0.0f;
        row_max[mt][0] = row_max[mt][1] = -INFINITY;
        row_sum[mt][0] = row_sum[mt][1] = 0.0f;
    }

    int n = n_hi - 1;
    fa_cp_async_tile<QTile, kThreads>(sQ, (const T *)a.q + sq.q + h * a.q_head + m0 * a.q_row, a.q_row, rows_q, tid);
    fa_cp_async_tile<KVTile, kThreads>(sKV, k + (int64_t)n * BN * a.k_row, a.k_row, len_k - n * BN, tid);
    if (STAGES == 2)
        fa_cp_async_tile<KVTile, kThreads>(sKV + KVTile::kBytes, v + (int64_t)n * BN * a.v_row, a.v_row, len_k - n * BN,
                                           tid);
    fa_cp_async_commit();

    /* With one m16 tile per warp, Q's A fragments fit in registers (4 per 16 head dims) and are loaded once:
     * that saves a third of the ldmatrix traffic, which bounds such tiles. */
    constexpr bool kQInRegs = MT == 1 && D <= 128;
    uint32_t qreg[kQInRegs ? D / 16 : 1][4];
    if (kQInRegs) {
        fa_cp_async_wait<0>();
        __syncthreads();
        const uint32_t q_addr = sQ + QTile::offset(warp * RPW + lane % 16, lane / 16);
#pragma unroll
        for (int ks = 0; ks < (kQInRegs ? D / 16 : 0); ks++) fa_ldmatrix_x4(qreg[ks], QTile::frag(q_addr, 0, ks * 2));
    }

    uint32_t stage_off = 0; /* byte offset of this block's K/V stage */
    for (; n >= n_lo; n--) {
        const uint32_t sK = sKV + stage_off;
        const uint32_t sV = sK + KVTile::kBytes;

        fa_cp_async_wait<0>();
        __syncthreads(); /* this block's K (and V) landed; every warp is done with the buffers refilled next */
        /* (only the first block, at the sequence end, can be partial: its V is copied at once) */
        const bool v_stream = kStream && len_k - n * BN >= BN;
        KVStream kv_stream;
        if (STAGES == 1) {
            if (v_stream)
                kv_stream.init(sV, v + (int64_t)n * BN * a.v_row, a.v_row, tid);
            else
                fa_cp_async_tile<KVTile, kThreads>(sV, v + (int64_t)n * BN * a.v_row, a.v_row, len_k - n * BN, tid);
            if (!kStream) fa_cp_async_commit();
        }

        /* The block's SN-key steps: S = Q K^T, scores, online softmax, O += P V. */
#pragma unroll
        for (int sb = 0; sb < BN / SN; sb++) {
            /* S = Q K^T for this warp's rows */
            float s[MT][NT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int nt = 0; nt < NT; nt++)
#pragma unroll
                    for (int e = 0; e < 4; e++) s[mt][nt][e] = 0.0f;
            {
                /* ldmatrix lane addresses: Q as A (matrix j = lane / 8: rows +8 (j & 1), k +8 (j >> 1)); K as B for
                 * two n8 tiles (keys +8 (j >> 1), k +8 (j & 1)) */
                const uint32_t q_addr = sQ + QTile::offset(warp * RPW + lane % 16, lane / 16);
                const uint32_t k_addr = sK + KVTile::offset(sb * SN + (lane / 16) * 8 + lane % 8, (lane / 8) % 2);
                if constexpr (PIPE) {
                    /* Software-pipelined: the K fragment of the next n16 block and the Q fragments of the next k
                     * step are loaded before the mma of this one (two register sets each), so that an mma does
                     * not wait on the ldmatrix issued right before it. */
                    constexpr int NP = NT / 2, kSteps = D / 16 * NP;
                    uint32_t kb[2][4], qa[2][MT][4];
                    fa_ldmatrix_x4(kb[0], k_addr);
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) fa_ldmatrix_x4(qa[0][mt], QTile::frag(q_addr, mt * 16, 0));
#pragma unroll
                    for (int ks = 0; ks < D / 16; ks++)
#pragma unroll
                        for (int np = 0; np < NP; np++) {
                            const int i = ks * NP + np;
                            if (np == 0 && v_stream) kv_stream.copies_at(ks, kVSteps);
                            if (i + 1 < kSteps)
                                fa_ldmatrix_x4(kb[(i + 1) & 1],
                                               KVTile::frag(k_addr, (i + 1) % NP * 16, (i + 1) / NP * 2));
                            if (np == NP - 1 && ks + 1 < D / 16)
#pragma unroll
                                for (int mt = 0; mt < MT; mt++)
                                    fa_ldmatrix_x4(qa[(ks + 1) & 1][mt], QTile::frag(q_addr, mt * 16, (ks + 1) * 2));
#pragma unroll
                            for (int mt = 0; mt < MT; mt++) {
                                E::mma(s[mt][2 * np], qa[ks & 1][mt], kb[i & 1][0], kb[i & 1][1]);
                                E::mma(s[mt][2 * np + 1], qa[ks & 1][mt], kb[i & 1][2], kb[i & 1][3]);
                            }
                        }
                } else {
#pragma unroll
                    for (int ks = 0; ks < D / 16; ks++) {
                        if (v_stream) kv_stream.copies_at(ks, kVSteps);
                        uint32_t qa[MT][4];
#pragma unroll
                        for (int mt = 0; mt < MT; mt++) {
                            if (kQInRegs)
#pragma unroll
                                for (int e = 0; e < 4; e++) qa[mt][e] = qreg[kQInRegs ? ks : 0][e];
                            else
                                fa_ldmatrix_x4(qa[mt], QTile::frag(q_addr, mt * 16, ks * 2));
                        }
#pragma unroll
                        for (int np = 0; np < NT / 2; np++) {
                            uint32_t kb[4];
                            fa_ldmatrix_x4(kb, KVTile::frag(k_addr, np * 16, ks * 2));
#pragma unroll
                            for (int mt = 0; mt < MT; mt++) {
                                E::mma(s[mt][2 * np], qa[mt], kb[0], kb[1]);
                                E::mma(s[mt][2 * np + 1], qa[mt], kb[2], kb[3]);
                            }
                        }
                    }
                }
            }

            if (STAGES == 2 && sb == 0) {
                /* The next block's K and V go to the other stage. Issued behind the first QK^T rather than right
                 * after the barrier, where every warp would wait on the address arithmetic at once. */
                stage_off ^= kStageBytes;
                if (n > n_lo) {
                    const uint32_t sK2 = sKV + stage_off;
                    const int nb = n - 1;
                    fa_cp_async_tile<KVTile, kThreads>(sK2, k + (int64_t)nb * BN * a.k_row, a.k_row, len_k - nb * BN,
                                                       tid);
                    fa_cp_async_tile<KVTile, kThreads>(sK2 + KVTile::kBytes, v + (int64_t)nb * BN * a.v_row, a.v_row,
                                                       len_k - nb * BN, tid);
                }
                fa_cp_async_commit();
            }
            if (STAGES == 1) { /* (SN == BN here) */
                if (kStream) fa_cp_async_commit();
                fa_cp_async_wait<0>();
                __syncthreads(); /* V landed; every warp is done reading K */
                if (n > n_lo) {
                    const int nb = n - 1; /* a whole block */
                    if (kStream)
                        kv_stream.init(sK, k + (int64_t)nb * BN * a.k_row, a.k_row, tid);
                    else
                        fa_cp_async_tile<KVTile, kThreads>(sK, k + (int64_t)nb * BN * a.k_row, a.k_row, len_k - nb * BN,
                                                           tid);
                }
                if (!kStream) fa_cp_async_commit();
            }
            const bool k_stream = kStream && n > n_lo;

            /* Scores that are not plain scale * QK^T (softcap, ALiBi, a negative scale) are rewritten as
             * score / |scale|, so that the softmax below is the same for every block. */
            const int n0 = n * BN + sb * SN;
            if (a.every_block_modified) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) s[mt][nt][e] *= a.scale;
                if (a.softcap > 0.0f) { /* tanh(x) = 1 - 2 / (e^2x + 1): branch-free, absolute error ~1e-7 */
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int nt = 0; nt < NT; nt++)
#pragma unroll
                            for (int e = 0; e < 4; e++)
                                s[mt][nt][e] =
                                    a.softcap *
                                    (1.0f - __fdividef(2.0f, 1.0f + __expf(2.0f * a.inv_softcap * s[mt][nt][e])));
                }
                if (a.alibi) {
                    const fa2_fwd_block w = fa2_fwd_block_get(a); /* (recomputed, as in the epilogue) */
                    const float slope = a.alibi[w.b * a.alibi_batch_stride + w.h];
#pragma unroll
                    for (int mt = 0; mt < MT; mt++)
#pragma unroll
                        for (int hf = 0; hf < 2; hf++) {
                            const float drf = (float)(diag0 + mt * 16 + 8 * hf - n0); /* diagonal - n0 */
#pragma unroll
                            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                                for (int e = 0; e < 2; e++)
                                    s[mt][nt][2 * hf + e] -= slope * fabsf(drf - (float)(nt * 8 + 2 * (lane % 4) + e));
                        }
                }
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int nt = 0; nt < NT; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) s[mt][nt][e] *= a.inv_abs_scale;
            }
            /* Keys outside a row's window or past the sequence: -inf. */
            if (n < n_full_lo || n >= n_full_hi) {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int hf = 0; hf < 2; hf++) {
                        /* this row's visible keys relative to n0 + 2 (lane % 4), as [lo, hi) clamped to [-1, SN + 1]:
                         * the comparisons below are then with compile-time key offsets */
                        const int64_t dr = diag0 + mt * 16 + 8 * hf - n0 - 2 * (lane % 4);
                        const int64_t hi = min((int64_t)len_k - n0 - 2 * (lane % 4),
                                               a.window_right < 0 ? (int64_t)SN + 1 : dr + a.window_right + 1);
                        const int hi_c = (int)min(max(hi, (int64_t)-1), (int64_t)SN + 1);
                        if (a.window_left < 0) {
#pragma unroll
                            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                                for (int e = 0; e < 2; e++)
                                    if (nt * 8 + e >= hi_c) s[mt][nt][2 * hf + e] = -INFINITY;
                        } else {
                            const int lo_c = (int)min(max(dr - a.window_left, (int64_t)-1), (int64_t)SN + 1);
#pragma unroll
                            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                                for (int e = 0; e < 2; e++)
                                    if (nt * 8 + e < lo_c || nt * 8 + e >= hi_c) s[mt][nt][2 * hf + e] = -INFINITY;
                        }
                    }
            }

            /* Online softmax: m in log2 units; P = 2^(s c - m), packed to 16 bits as soon as it is computed (the
             * C fragment of key tile nt, rows g / g+8, is half of an A fragment); O and l are rescaled by
             * 2^(m_old - m). */
            const float c = a.scale_log2;
            float m_use[MT][2], corr[MT][2];
            bool grew = false; /* did any row maximum of this thread change */
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
#pragma unroll
                for (int hf = 0; hf < 2; hf++) {
                    float mx = -INFINITY;
#pragma unroll
                    for (int nt = 0; nt < NT; nt++) mx = fmaxf(mx, fmaxf(s[mt][nt][2 * hf], s[mt][nt][2 * hf + 1]));
                    mx = fa_quad_max(mx);
                    const float m_new = fmaxf(row_max[mt][hf], mx * c);
                    m_use[mt][hf] = m_new == -INFINITY ? 0.0f : m_new; /* a row with no key yet: p = 0, not NaN */
                    corr[mt][hf] = fa_exp2(row_max[mt][hf] - m_use[mt][hf]);
                    grew |= m_new != row_max[mt][hf];
                    row_max[mt][hf] = m_new;
                }
                /* Rescaling is exact to skip when no row maximum of the warp moved (corr == 1): saves D/2 FMULs per
                 * row pair, most steps of a long sequence. */
#ifndef FA2_FWD_RESCALE_ALWAYS
            if (__any_sync(0xffffffffu, grew))
#endif
            {
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int hf = 0; hf < 2; hf++) {
                        row_sum[mt][hf] *= corr[mt][hf]; /* this lane's columns; summed over the quad at the end */
#pragma unroll
                        for (int dt = 0; dt < DT; dt++) {
                            acc[mt][dt][2 * hf] *= corr[mt][hf];
                            acc[mt][dt][2 * hf + 1] *= corr[mt][hf];
                        }
                    }
            }
            uint32_t p[MT][NT][2]; /* 16-bit P: key tile nt, row g (0) / g+8 (1), columns 2t, 2t+1 */
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int mt = 0; mt < MT; mt++)
#pragma unroll
                    for (int hf = 0; hf < 2; hf++) {
                        const float p0 = fa_exp2(fmaf(s[mt][nt][2 * hf], c, -m_use[mt][hf]));
                        const float p1 = fa_exp2(fmaf(s[mt][nt][2 * hf + 1], c, -m_use[mt][hf]));
                        row_sum[mt][hf] += p0 + p1;
                        p[mt][nt][hf] = E::pack(p0, p1);
                    }

            /* O += P V: P of key tiles 2kk and 2kk+1 is the A fragment of key step kk. */
            {
                /* V as B by ldmatrix.trans for two n8 tiles of head dims: keys +8 (j & 1), dims +8 (j >> 1) */
                const uint32_t v_addr = sV + KVTile::offset(sb * SN + ((lane / 8) % 2) * 8 + lane % 8, lane / 16);
                if constexpr (PIPE) { /* the V fragment of the next step loaded before this step's mma */
                    uint32_t vb[2][4];
                    fa_ldmatrix_x4_trans(vb[0], v_addr);
#pragma unroll
                    for (int kk = 0; kk < SN / 16; kk++)
#pragma unroll
                        for (int dp = 0; dp < D / 16; dp++) {
                            const int i = kk * (D / 16) + dp;
                            if (k_stream) kv_stream.copies_at(i, kKSteps);
                            if (i + 1 < SN / 16 * (D / 16))
                                fa_ldmatrix_x4_trans(vb[(i + 1) & 1], KVTile::frag(v_addr, (i + 1) / (D / 16) * 16,
                                                                                   (i + 1) % (D / 16) * 2));
#pragma unroll
                            for (int mt = 0; mt < MT; mt++) {
                                const uint32_t pa[4] = { p[mt][2 * kk][0], p[mt][2 * kk][1], p[mt][2 * kk + 1][0],
                                                         p[mt][2 * kk + 1][1] };
                                E::mma(acc[mt][2 * dp], pa, vb[i & 1][0], vb[i & 1][1]);
                                E::mma(acc[mt][2 * dp + 1], pa, vb[i & 1][2], vb[i & 1][3]);
                            }
                        }
                } else {
#pragma unroll
                    for (int kk = 0; kk < SN / 16; kk++) {
#pragma unroll
                        for (int dp = 0; dp < D / 16; dp++) {
                            if (k_stream) kv_stream.copies_at(kk * (D / 16) + dp, kKSteps);
                            uint32_t vb[4];
                            fa_ldmatrix_x4_trans(vb, KVTile::frag(v_addr, kk * 16, dp * 2));
#pragma unroll
                            for (int mt = 0; mt < MT; mt++) {
                                const uint32_t pa[4] = { p[mt][2 * kk][0], p[mt][2 * kk][1], p[mt][2 * kk + 1][0],
                                                         p[mt][2 * kk + 1][1] };
                                E::mma(acc[mt][2 * dp], pa, vb[0], vb[1]);
                                E::mma(acc[mt][2 * dp + 1], pa, vb[2], vb[3]);
                            }
                        }
                    }
                }
            }
            if (kStream) fa_cp_async_commit(); /* the next block's K */
        }
    }

    /* Epilogue: O /= l, LSE = (m + log2 l) ln 2. Rows the mask leaves no key get O = 0 and LSE = -inf (O is
     * not l-scaled there: a masked key's 0 times a NaN in V would reach it); a row that sees keys but whose sum
     * is not positive (NaN after a NaN or +inf score, 0 when every visible score is -inf) is NaN. O is staged in
     * this warp's own rows of the Q tile (no other warp reads them) and stored as 16-byte rows. */
    {
        /* the block's coordinates recomputed (b, h and m0 kept across the loop cost the d = 128 kernel 12 bytes
         * more spills) */
        const fa2_fwd_block w = fa2_fwd_block_get(a);
        const fa2_seq sq2 = fa2_seq_get(a, w.b, w.h);
        const int m0e = w.m_block * BM; /* = m0 */
        const int rows = min(BM, sq2.len_q - m0e);
        T *o = (T *)a.o + sq2.o + w.h * a.o_head + m0e * a.o_row;
        float *lse = a.lse ? a.lse + sq2.lse + m0e : NULL;
        const int row_w = warp * RPW;
        const int g = lane / 4, t = lane % 4;
        __syncwarp(); /* every lane's last ldmatrix of Q rows is done before O overwrites them (no barrier follows
                       * the last Q K^T when K and V are double-buffered) */
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int hf = 0; hf < 2; hf++) {
                const float l = fa_quad_sum(row_sum[mt][hf]);
                const int r = row_w + mt * 16 + g + 8 * hf;
                const bool seen = fa_row_sees_key(m0e + r, sq2.len_q, sq2.len_k, a.window_left, a.window_right);
                const float inv = l > 0.0f ? 1.0f / l : NAN;
                if (lse && t == 0 && r < rows)
                    lse[r] = !seen ? -INFINITY : l > 0.0f ? (row_max[mt][hf] + log2f(l)) * FA_LN2 : NAN;
#pragma unroll
                for (int dt = 0; dt < DT; dt++) {
                    const uint32_t off = QTile::offset(r, dt) + 4 * t;
                    *(uint32_t *)(fa2_smem + off) =
                        seen ? E::pack(acc[mt][dt][2 * hf] * inv, acc[mt][dt][2 * hf + 1] * inv) : 0u;
                }
            }
        __syncwarp();
#pragma unroll
        for (int i = 0; i < RPW * (D / 8) / 32; i++) {
            const int idx = lane + i * 32;
            const int r = row_w + idx / (D / 8), ch = idx % (D / 8);
            if (r < rows) *(uint4 *)(o + r * a.o_row + ch * 8) = *(const uint4 *)(fa2_smem + QTile::offset(r, ch));
        }
    }
}

/* Launches configuration I of fa2_fwd_tiles for dtype T: grid (query blocks, heads_q, batch). */
template <typename T, int I>
static cudaError_t fa2_fwd_launch_tile(const fa2_fwd_args *a, int batch, cudaStream_t stream) {
    constexpr fa2_fwd_tile t = fa2_fwd_tiles[I];
    void (*kernel)(const fa2_fwd_args) =
        fa2_fwd_kernel<T, t.d, t.block_m, t.block_n, t.step_n, t.warps, t.stages, t.pipe != 0, t.stream_v, t.stream_k>;
    if (!a) {
        cudaFuncAttributes attr;
        return cudaFuncGetAttributes(&attr, kernel);
    }
    const int smem = (int)fa2_fwd_smem_bytes(t);
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                   (int)cudaSharedmemCarveoutMaxShared);
    if (err != cudaSuccess) return err;
    dim3 grid((unsigned)((a->seqlen_q + t.block_m - 1) / t.block_m), (unsigned)a->heads_q, (unsigned)batch);
    kernel<<<grid, t.warps * 32, smem, stream>>>(*a);
    return cudaGetLastError();
}

/* Instantiates the kernel for the rows I.. of fa2_fwd_tiles that belong to head dim D and launches row `tile`. */
template <typename T, int D, int I>
static cudaError_t fa2_fwd_launch(const fa2_fwd_args *a, int tile, int batch, cudaStream_t stream) {
    if constexpr (I == FA2_FWD_NTILES) {
        return cudaErrorInvalidValue; /* tile is not a row of head dim D */
    } else {
        if constexpr (fa2_fwd_tiles[I].d == D)
            if (tile == I) return fa2_fwd_launch_tile<T, I>(a, batch, stream);
        return fa2_fwd_launch<T, D, I + 1>(a, tile, batch, stream);
    }
}

#define FA2_FWD_DEFINE_HDIM(D)                                                                \
    FA2_FWD_DECLARE_HDIM(D) {                                                                 \
        return dtype == FA_BF16 ? fa2_fwd_launch<__nv_bfloat16, D, 0>(a, tile, batch, stream) \
                                : fa2_fwd_launch<__half, D, 0>(a, tile, batch, stream);       \
    }

#endif /* __CUDACC__ */

#endif /* FLASHATTN_CUDA_FA2_FWD_CUH */
