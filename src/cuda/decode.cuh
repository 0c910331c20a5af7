/* SPDX-License-Identifier: Apache-2.0 */
/*
 * decode.cuh - decoding with a KV cache (fa_fwd_kvcache) on sm_80+: the append kernel, the split-KV attention
 * kernel and the kernel that combines the splits. The attention kernel is instantiated once per head dim in
 * decode_hdim*.cu; decode.cu picks the split count and launches.
 *
 * Append (when new tokens are given): one block per (new token, kv head, sequence) writes the token's key
 * (rotated in fp32 when rotary tables are given, rounded to the dtype) and value into the cache at row
 * cache_seqlens[b] + j, through the page table when paged.
 *
 * Attention: one block per (split of the keys, kv head x one or two blocks of 16 query rows, sequence). The
 * query heads that share a kv head and the query tokens are the rows of m16 tiles (row r is token r / group of
 * query head kv_head * group + r % group), so each K/V byte is read once per kv head, not once per query head;
 * with more than 16 rows (MQA, long query groups) a block takes two row blocks, a set of 4 warps each, which
 * share every K/V tile. The block's keys come in tiles of 64 rows, 128 at head dim 64 (decode_block_n; swizzled at
 * head dims 64 and 128: decode_kv_swizzled) by cp.async through a multi-stage ring (16-byte copies; one address per
 * thread and tile, fixed strides after it, where the tile lies in one page or the cache is contiguous, else the
 * page table read per row; rows past the sequence zero-filled and never read); each warp takes a quarter of the
 * keys of a tile: S = Q K^T and O += P V with mma.sync m16n8k16, the scores made general (scale, softcap, ALiBi,
 * the bottom-right mask) element by element: the kernel waits on memory, not on arithmetic. Each warp keeps its
 * own running max, sum and O; at the end the warps merge through shared memory. With one split the block
 * writes O and LSE; with several it writes its normalised O and its LSE in fp32 to the workspace, and the
 * combine kernel (a block per query row and column slice) weighs the splits by exp(lse_split - lse) into O and
 * LSE.
 *
 * On sm_90 the three kernels are launched as programmatic dependents (decode_launch) and let the next kernel
 * launch as they start: a kernel's blocks may be resident while the one before it in the stream finishes, and
 * wait for it before their first access to global memory, so that a launch leaves no gap between kernels (a
 * few microseconds of a 30-70 us call).
 *
 * Query rotary (when rotary tables are given) is applied as the Q tile is loaded: rotated in fp32, rounded to
 * the dtype, at cache_seqlens[b] + i under a mask (causal or a window), cache_seqlens[b] otherwise.
 */
#ifndef FLASHATTN_CUDA_DECODE_CUH
#define FLASHATTN_CUDA_DECODE_CUH

#include <cuda_runtime.h>
#include <math.h>
#include <stdint.h>

#include "cuda/hdims.h"
#include "flashattn.h"

/* Everything the kernels read, resolved on the host by decode.cu. Strides are in elements. */
typedef struct decode_args {
    const void *q;
    void *o;
    float *lse; /* may be NULL */
    int64_t q_batch, q_row, q_head;
    int64_t o_batch, o_row, o_head;
    void *k_cache, *v_cache;
    int64_t kc_batch, kc_row, kc_head; /* batch: one cache sequence, or one page when paged */
    int64_t vc_batch, vc_row, vc_head;
    const void *k_new, *v_new; /* NULL when nothing is appended */
    int64_t kn_batch, kn_row, kn_head;
    int64_t vn_batch, vn_row, vn_head;
    const int32_t *block_table; /* NULL: contiguous */
    int64_t block_table_stride;
    int32_t page_size;
    int32_t page_shift, page_mask; /* page size 2^page_shift: row >> page_shift, row & page_mask; else -1, -1 */
    const int32_t *cache_seqlens, *cache_batch_idx, *cache_leftpad; /* each may be NULL */
    int32_t capacity;                                               /* rows of a sequence's cache */
    const void *rotary_cos, *rotary_sin;                            /* NULL: no rotary */
    int32_t rotary_dim, rotary_interleaved;
    int32_t q_positions_local; /* query i sits at cache_seqlens + i (a mask is set), else at cache_seqlens */
    int32_t batch, seqlen_q, seqlen_new, heads_q, heads_kv, group;
    int32_t rows, m_blocks; /* rows = group * seqlen_q; m_blocks = ceil(rows / 16) */
    int32_t row_blocks;     /* blocks of 16 rows per attention block: 2 where m_blocks >= 2, else 1 */
    int32_t m_groups;       /* ceil(m_blocks / row_blocks) */
    int32_t head_dim;
    float scale, softcap;
    int32_t window_left, window_right; /* causal is window_right = 0 */
    const float *alibi;
    int64_t alibi_batch_stride;
    int32_t num_splits;
    int32_t combine_slices;   /* column slices of a row in the combine (decode_combine_slices) */
    int32_t overlap_launch;   /* host: launch as programmatic dependents (sm_90) */
    int32_t smem_request;     /* host: the block's shared memory, at least what the kernel uses (decode_plan) */
    float *part_o, *part_lse; /* workspace (num_splits > 1): (splits, batch, heads_q, seqlen_q[, head_dim]) */
} decode_args;

/* Warps per row block of an attention block (each takes a quarter of a tile's keys), keys per tile and K/V tiles in
 * the ring. A tile is 64 keys, 128 at head dim 64, whose 128-byte rows would otherwise give each barrier of the loop
 * half the bytes of head dim 128's tile (16 KB, not 32). Head dims up to 128 keep three tiles where they fit (the next
 * one is requested before the oldest is waited for, so all three are in flight during the wait; two blocks per SM on
 * A100/H100), head dims below 64 six (the bytes in flight of three tiles at d = 128); the most of these that fit,
 * else two: the 99 KB parts (sm_86, sm_89, sm_120) take three up to d = 64 and two at d = 128, every part two above
 * d = 128. */
#define DECODE_WARPS 4
static constexpr __host__ __device__ int decode_stages_max(int d) {
    return d < 64 ? 6 : d <= 128 ? 3 : 2;
}
static constexpr __host__ __device__ int decode_block_n(int d) {
    return d == 64 ? 128 : 64;
}
/* K/V tiles of head dims 64 and 128 are swizzled (fa_smem_tile): into rows padded by 16 bytes a warp's copy of
 * two row segments is split on the shared-memory side, and each part requested from L2 again (ncu, H200, d128:
 * every other copy instruction of a tile read twice its sectors). The swizzle's XORed fragment addresses take
 * registers that head dims 192 and 256 do not have (spills); they and the others keep the padding. */
static constexpr __host__ __device__ bool decode_kv_swizzled(int d) {
    return d == 64 || d == 128;
}
/* Shared memory of the attention kernel: the Q tile (16 rows per row block, rows padded by 16 bytes) and the
 * K/V ring. */
static constexpr __host__ __device__ size_t decode_smem_bytes(int d, int stages, int row_blocks) {
    return (size_t)(2 * d + 16) * 16 * row_blocks +
           (size_t)(decode_kv_swizzled(d) ? 2 * d : 2 * d + 16) * 2 * stages * decode_block_n(d);
}

/* One launcher per head dim (decode_hdim*.cu) for the attention kernel with `stages` K/V tiles (2, 3, or
 * decode_stages_max where that is more) and a->row_blocks row blocks per block: grid (num_splits, heads_kv x
 * m_groups, batch). With a == NULL it only checks that this build holds the kernel for the current device. */
#define DECODE_DECLARE_HDIM(D) \
    cudaError_t decode_attn_hdim##D(const decode_args *a, fa_dtype dtype, int stages, cudaStream_t stream)
#define DECODE_DECLARE_ONE(D) DECODE_DECLARE_HDIM(D);
FA_HDIMS(DECODE_DECLARE_ONE)
#undef DECODE_DECLARE_ONE

#ifdef __CUDACC__

#include "common.cuh"

/* ---------------------------------------------------------------------------------------------------------
 * Device code shared by the kernels
 * ------------------------------------------------------------------------------------------------------- */

static __device__ __forceinline__ int decode_seqlen(const decode_args &a, int b) {
    return a.cache_seqlens ? a.cache_seqlens[b] : a.capacity;
}
static __device__ __forceinline__ int decode_leftpad(const decode_args &a, int b) {
    return a.cache_leftpad ? a.cache_leftpad[b] : 0;
}

/* Where cache row `row` (absolute) of sequence b lives: its page and the row within it when paged, else its
 * cache sequence and the row. Element offset: unit * stride_batch + row * stride_seq (+ head). */
struct decode_slot {
    int64_t unit;
    int row;
};
static __device__ __forceinline__ decode_slot decode_cache_slot(const decode_args &a, int b, int row) {
    decode_slot s;
    if (a.block_table && a.page_shift >= 0) {
        s.unit = a.block_table[b * a.block_table_stride + (row >> a.page_shift)];
        s.row = row & a.page_mask;
    } else if (a.block_table) {
        s.unit = a.block_table[b * a.block_table_stride + row / a.page_size];
        s.row = row % a.page_size;
    } else {
        s.unit = a.cache_batch_idx ? a.cache_batch_idx[b] : b;
        s.row = row;
    }
    return s;
}

/* Element c of a row x rotated to position pos: x0 c - x1 s for the first of a pair, x0 s + x1 c for the
 * second, in fp32 without fused multiply-adds (the host backends' arithmetic). x(i) reads element i as fp32. */
template <typename T, typename Read>
static __device__ __forceinline__ float decode_rotate(const decode_args &a, int64_t pos, int c, Read x) {
    typedef fa_elem<T> E;
    const int half = a.rotary_dim / 2;
    int t, i0, i1;
    bool first;
    if (a.rotary_interleaved) {
        t = c / 2, i0 = c & ~1, i1 = c | 1, first = (c & 1) == 0;
    } else {
        first = c < half;
        t = first ? c : c - half, i0 = t, i1 = t + half;
    }
    const float cs = E::to_float(((const T *)a.rotary_cos)[pos * half + t]);
    const float sn = E::to_float(((const T *)a.rotary_sin)[pos * half + t]);
    const float x0 = x(i0), x1 = x(i1);
    return first ? __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn)) : __fadd_rn(__fmul_rn(x0, sn), __fmul_rn(x1, cs));
}

/* ---------------------------------------------------------------------------------------------------------
 * Append: grid (seqlen_new, heads_kv, batch), one thread per element of the row
 * ------------------------------------------------------------------------------------------------------- */

template <typename T>
__global__ void decode_append_kernel(const __grid_constant__ decode_args a) {
    typedef fa_elem<T> E;
    fa_grid_launch_dependents();
    fa_grid_dependency_wait();
    const int j = blockIdx.x, h = blockIdx.y, b = blockIdx.z;
    const int row = decode_seqlen(a, b) + j;
    const T *kn = (const T *)a.k_new + b * a.kn_batch + j * a.kn_row + h * a.kn_head;
    const T *vn = (const T *)a.v_new + b * a.vn_batch + j * a.vn_row + h * a.vn_head;
    const decode_slot at = decode_cache_slot(a, b, row);
    T *kc = (T *)a.k_cache + at.unit * a.kc_batch + (int64_t)at.row * a.kc_row + h * a.kc_head;
    T *vc = (T *)a.v_cache + at.unit * a.vc_batch + (int64_t)at.row * a.vc_row + h * a.vc_head;
    for (int c = threadIdx.x; c < a.head_dim; c += blockDim.x) {
        T k = kn[c];
        if (a.rotary_cos && c < a.rotary_dim)
            k = E::from_float(decode_rotate<T>(a, row, c, [&](int i) { return E::to_float(kn[i]); }));
        kc[c] = k;
        vc[c] = vn[c];
    }
}

/* ---------------------------------------------------------------------------------------------------------
 * Combine: a block per query row (b, h, i) and slice of its columns merges the splits' partial O and LSE. Thread
 * t weighs columns 4 (t % chunks) .. of the slice for the splits t / chunks, + groups, ..; the host picks the
 * slices (decode_combine_slices) so that a thread has at most DECODE_COMBINE_LOADS splits, whose partial O it
 * requests together with the LSEs: one round trip to L2 for both, however many splits a row has (MQA over a long
 * cache: 128). The groups' sums meet in shared memory.
 * ------------------------------------------------------------------------------------------------------- */

#define DECODE_COMBINE_THREADS 128
#define DECODE_COMBINE_LOADS   8
#define DECODE_MAX_SPLITS      128

/* The fewest column slices of a row (a divisor of its head_dim / 4 float4 columns) that leave each combine
 * thread at most DECODE_COMBINE_LOADS splits; head dims are multiples of 32, so 8 columns a slice always do. */
static inline __host__ __device__ int decode_combine_slices(int head_dim, int splits) {
    const int chunks = head_dim / 4;
    for (int slices = 1; slices < chunks; slices++) {
        if (chunks % slices) continue;
        if (DECODE_COMBINE_THREADS / (chunks / slices) * DECODE_COMBINE_LOADS >= splits) return slices;
    }
    return chunks;
}

template <typename T>
__global__ void __launch_bounds__(DECODE_COMBINE_THREADS) decode_combine_kernel(const __grid_constant__ decode_args a) {
    typedef fa_elem<T> E;
    constexpr int kThreads = DECODE_COMBINE_THREADS, kWarps = kThreads / 32, kLoads = DECODE_COMBINE_LOADS;
    static_assert(DECODE_MAX_SPLITS <= kThreads, "decode combine: a split's LSE per thread");
    __shared__ float weight[DECODE_MAX_SPLITS], red[2][kWarps];
    __shared__ float4 part[kThreads];
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int64_t rows = (int64_t)a.batch * a.heads_q * a.seqlen_q, row = blockIdx.x; /* (b heads_q + h) seqlen_q + i */
    const int S = a.num_splits, D = a.head_dim;
    const int chunks = D / 4 / a.combine_slices, groups = kThreads / chunks;
    const int g = tid / chunks, c = (int)blockIdx.y * chunks + tid % chunks; /* c: the thread's float4 column */
    fa_grid_launch_dependents();
    fa_grid_dependency_wait();

    /* the thread's splits' partial O, in flight while the LSEs are read */
    float4 x[kLoads];
#pragma unroll
    for (int k = 0; k < kLoads; k++) {
        const int s = g + k * groups;
        x[k] = g < groups && s < S ? *(const float4 *)(a.part_o + (s * rows + row) * D + 4 * c)
                                   : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
    }

    /* the splits' weights exp(lse_s - max) and their sum */
    const float l = tid < S ? a.part_lse[tid * rows + row] : -INFINITY;
    float mx = fa_warp_max(l);
    if (lane == 0) red[0][warp] = mx;
    __syncthreads();
    mx = red[0][0];
#pragma unroll
    for (int w = 1; w < kWarps; w++) mx = fmaxf(mx, red[0][w]);
    const float wt = mx == -INFINITY || l == -INFINITY ? 0.0f : expf(l - mx);
    if (tid < S) weight[tid] = wt;
    const float wsum = fa_warp_sum(wt);
    if (lane == 0) red[1][warp] = wsum;
    __syncthreads();
    float sum = 0.0f;
#pragma unroll
    for (int w = 0; w < kWarps; w++) sum += red[1][w];

    float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
    for (int k = 0; k < kLoads; k++) {
        const int s = g + k * groups;
        const float w = g < groups && s < S ? weight[s] : 0.0f; /* (x[k] is zeros there) */
        acc.x += w * x[k].x, acc.y += w * x[k].y, acc.z += w * x[k].z, acc.w += w * x[k].w;
    }
    part[tid] = acc;
    __syncthreads();
    if (tid < chunks) {
        for (int q = 1; q < groups; q++) {
            const float4 y = part[q * chunks + tid];
            acc.x += y.x, acc.y += y.y, acc.z += y.z, acc.w += y.w;
        }
        const float inv = sum > 0.0f ? 1.0f / sum : 0.0f;
        const int i = (int)(row % a.seqlen_q), h = (int)(row / a.seqlen_q % a.heads_q),
                  b = (int)(row / a.seqlen_q / a.heads_q);
        T *o = (T *)a.o + b * a.o_batch + i * a.o_row + h * a.o_head + 4 * c;
        uint2 packed;
        packed.x = E::pack(acc.x * inv, acc.y * inv);
        packed.y = E::pack(acc.z * inv, acc.w * inv);
        *(uint2 *)o = packed;
    }
    if (a.lse && blockIdx.y == 0 && tid == 0) a.lse[row] = sum > 0.0f ? mx + logf(sum) : -INFINITY;
}

/* ---------------------------------------------------------------------------------------------------------
 * Attention: grid (num_splits, heads_kv x m_groups, batch)
 * ------------------------------------------------------------------------------------------------------- */

/* The key tiles [x, y) of a split: the tiles of the keys that some row of the block (rows c0 .. c0 + crows) sees,
 * shared out among the splits. */
template <int BN>
static __device__ __forceinline__ int2 decode_split_tiles(const decode_args &a, int len_k, int c0, int crows,
                                                          int split) {
    const int64_t shift = (int64_t)len_k - a.seqlen_q;
    int64_t key_lo = 0, key_hi = len_k;
    if (a.window_left >= 0) key_lo = max((int64_t)0, c0 / a.group + shift - a.window_left);
    if (a.window_right >= 0) key_hi = min((int64_t)len_k, (c0 + crows - 1) / a.group + shift + a.window_right + 1);
    if (key_hi <= key_lo) return make_int2(0, 0);
    const int t_lo = (int)(key_lo / BN), t_hi = (int)((key_hi + BN - 1) / BN);
    const int per = (t_hi - t_lo + a.num_splits - 1) / a.num_splits;
    const int n_begin = min(t_hi, t_lo + split * per);
    return make_int2(n_begin, min(t_hi, n_begin + per));
}

/* Copies key tile n (keys n * BN ..) of sequence b, kv head hk, into sK and sV by cp.async: attended key j is
 * cache row leftpad + j; keys at or past len_k are zero-filled and not read (their pages may not exist). Thread
 * tid copies chunk tid % kChunks of kIters consecutive rows, from (tid / kChunks) kIters (a warp's copies still
 * cover whole 256-byte row segments). A tile in one run of rows (a contiguous cache, or one page) takes one slot
 * lookup and a fixed stride; across pages a thread's rows lie in at most two pages when a page holds kIters
 * rows, two lookups (a lookup per row cost page-16 caches twice the contiguous path's instructions); smaller
 * pages look up the page of each row. */
template <typename T, typename KVTile, int kThreads>
static __device__ __forceinline__ void decode_load_tile(const decode_args &a, int b, int hk, int pad, int len_k, int n,
                                                        uint32_t sK, uint32_t sV, int tid) {
    constexpr int kChunks = KVTile::kChunks, kGroups = kThreads / kChunks;
    constexpr int kIters = (KVTile::kRows + kGroups - 1) / kGroups;
    static_assert(kGroups >= 1, "decode: a row per thread group");
    if (kThreads % kChunks && tid >= kGroups * kChunks) return; /* head dims 96, 192: a few threads idle */
    const T *k0 = (const T *)a.k_cache, *v0 = (const T *)a.v_cache;
    const int r0 = tid / kChunks * kIters, c = tid % kChunks, j0 = n * KVTile::kRows + r0,
              first = pad + n * KVTile::kRows;
    /* row r0 + i of the tile exists (the last group of head dims 96, 192 reaches past the tile) */
    auto in_tile = [&](int i) { return kIters * kGroups == KVTile::kRows || r0 + i < KVTile::kRows; };
    auto copy = [&](int i, const T *ks, const T *vs) {
        const bool valid = j0 + i < len_k;
        const uint32_t d = KVTile::offset(r0 + i, c);
        fa_cp_async_16(sK + d, valid ? ks : k0, valid);
        fa_cp_async_16(sV + d, valid ? vs : v0, valid);
    };
    const int64_t hk_k = (int64_t)hk * a.kc_head + c * 8, hk_v = (int64_t)hk * a.vc_head + c * 8;
    if (!a.block_table ||
        (a.page_shift >= 0 ? first & a.page_mask : first % a.page_size) + KVTile::kRows <= a.page_size) {
        const decode_slot at = decode_cache_slot(a, b, first);
        const T *ks = k0 + at.unit * a.kc_batch + (int64_t)(at.row + r0) * a.kc_row + hk_k;
        const T *vs = v0 + at.unit * a.vc_batch + (int64_t)(at.row + r0) * a.vc_row + hk_v;
        if ((n + 1) * KVTile::kRows <= len_k) { /* every row attended: no predicate */
#pragma unroll
            for (int i = 0; i < kIters && in_tile(i); i++, ks += a.kc_row, vs += a.vc_row) {
                const uint32_t d = KVTile::offset(r0 + i, c);
                fa_cp_async_16(sK + d, ks, true);
                fa_cp_async_16(sV + d, vs, true);
            }
            return;
        }
#pragma unroll
        for (int i = 0; i < kIters && in_tile(i); i++, ks += a.kc_row, vs += a.vc_row) copy(i, ks, vs);
        return;
    }
    if (a.page_size >= kIters) { /* the rows from r0 in page A up to `split`, then in page B from its row 0 */
        const T *ka = k0, *va = v0, *kb = k0, *vb = v0;
        int split = kIters;
        if (j0 < len_k) {
            const decode_slot at = decode_cache_slot(a, b, pad + j0);
            ka = k0 + at.unit * a.kc_batch + (int64_t)at.row * a.kc_row + hk_k;
            va = v0 + at.unit * a.vc_batch + (int64_t)at.row * a.vc_row + hk_v;
            split = a.page_size - at.row;
            if (split < kIters && j0 + split < len_k) {
                const decode_slot bt = decode_cache_slot(a, b, pad + j0 + split);
                kb = k0 + bt.unit * a.kc_batch + hk_k;
                vb = v0 + bt.unit * a.vc_batch + hk_v;
            }
        }
#pragma unroll
        for (int i = 0; i < kIters && in_tile(i); i++) {
            const bool in_a = i < split;
            copy(i, in_a ? ka + (int64_t)i * a.kc_row : kb + (int64_t)(i - split) * a.kc_row,
                 in_a ? va + (int64_t)i * a.vc_row : vb + (int64_t)(i - split) * a.vc_row);
        }
        return;
    }
    /* every row's page first (independent loads of the page table), then the copies */
    const T *ks[kIters], *vs[kIters];
#pragma unroll
    for (int i = 0; i < kIters; i++) {
        ks[i] = k0, vs[i] = v0;
        if (in_tile(i) && j0 + i < len_k) {
            const decode_slot at = decode_cache_slot(a, b, pad + j0 + i);
            ks[i] = k0 + at.unit * a.kc_batch + (int64_t)at.row * a.kc_row + hk_k;
            vs[i] = v0 + at.unit * a.vc_batch + (int64_t)at.row * a.vc_row + hk_v;
        }
    }
#pragma unroll
    for (int i = 0; i < kIters && in_tile(i); i++) copy(i, ks[i], vs[i]);
}

template <typename T, int D, int STAGES, int MB>
__global__ void __launch_bounds__(DECODE_WARPS * 32 * MB) decode_attn_kernel(const __grid_constant__ decode_args a) {
    typedef fa_elem<T> E;
    constexpr int KW = DECODE_WARPS, NW = KW * MB, kThreads = NW * 32, BN = decode_block_n(D);
    constexpr int KN = BN / KW, KS = KN / 16; /* a warp's keys of a tile; its blocks of 16 keys */
    constexpr int DT = D / 8;                 /* n8 tiles of O */
    typedef fa_smem_tile<16 * MB, D> QTile;
    typedef fa_smem_tile<BN, D, decode_kv_swizzled(D)> KVTile;
    constexpr uint32_t kStageBytes = 2 * KVTile::kBytes;
    static_assert(D % 16 == 0 && STAGES >= 2, "decode tile shape");
    /* the warps' merge reuses the Q tile and the K/V ring: (max, sum) and O of every warp's 16 rows, fp32 */
    static_assert(NW * 16 * (2 + D) * 4 <= QTile::kBytes + STAGES * kStageBytes,
                  "decode: the merge buffer exceeds the Q tile and the ring");

    extern __shared__ __align__(128) unsigned char decode_smem[];
    const uint32_t sQ = fa_smem_addr(decode_smem);
    const uint32_t sKV = sQ + QTile::kBytes;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    const int kw = warp % KW, rb = warp / KW; /* the warp's 16 keys of a tile, its row block */

    const int split = blockIdx.x, mg = blockIdx.y % a.m_groups, hk = blockIdx.y / a.m_groups, b = blockIdx.z;
    const int c0 = mg * MB * 16, crows = min(16 * MB, a.rows - c0); /* the block's rows */
    fa_grid_launch_dependents();
    fa_grid_dependency_wait();
    const int len_c = decode_seqlen(a, b), pad = decode_leftpad(a, b);
    const int len_k = len_c + a.seqlen_new - pad;              /* attended keys */
    const int r0 = c0 + 16 * rb, nrows = min(16, a.rows - r0); /* the warp's (none: nrows <= 0) */
    const int64_t shift = (int64_t)len_k - a.seqlen_q;         /* query i sits at key i + shift */
    const int2 tiles = decode_split_tiles<BN>(a, len_k, c0, crows, split);
    const int n_begin = tiles.x, n_end = tiles.y;

    /* This thread's two rows (g, g + 8 of the tile): visible keys [lo, hi), ALiBi slope and diagonal. */
    int row_lo[2], row_hi[2], row_diag[2];
    float row_slope[2];
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int r = g + 8 * hf, pr = r0 + r, i = pr / a.group, h = hk * a.group + pr % a.group;
        const int64_t diag = i + shift;
        row_diag[hf] = (int)diag;
        row_slope[hf] = a.alibi && r < nrows ? a.alibi[b * a.alibi_batch_stride + h] : 0.0f;
        if (r >= nrows) {
            row_lo[hf] = row_hi[hf] = 0;
        } else {
            row_lo[hf] = a.window_left >= 0 ? (int)max((int64_t)0, diag - a.window_left) : 0;
            row_hi[hf] =
                a.window_right >= 0 ? (int)max((int64_t)0, min((int64_t)len_k, diag + a.window_right + 1)) : len_k;
        }
    }

    /* K/V ring prologue, then Q (rotated if asked) while the first tiles are in flight */
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (n_begin + s < n_end)
            decode_load_tile<T, KVTile, kThreads>(a, b, hk, pad, len_k, n_begin + s, sKV + s * kStageBytes,
                                                  sKV + s * kStageBytes + KVTile::kBytes, tid);
        fa_cp_async_commit();
    }
    for (int idx = tid; idx < 16 * MB * (D / 8); idx += kThreads) {
        const int r = idx / (D / 8), c = idx % (D / 8), pr = c0 + r;
        uint4 x = make_uint4(0, 0, 0, 0);
        if (r < crows) {
            const int i = pr / a.group, h = hk * a.group + pr % a.group;
            x = *(const uint4 *)((const T *)a.q + b * a.q_batch + i * a.q_row + h * a.q_head + c * 8);
        }
        *(uint4 *)(decode_smem + QTile::offset(r, c)) = x;
    }
    if (a.rotary_cos) {
        __syncthreads();
        /* each thread rotates whole pairs of a row: reads both, writes both */
        const int half = a.rotary_dim / 2;
        for (int idx = tid; idx < crows * half; idx += kThreads) {
            const int r = idx / half, tt = idx % half, pr = c0 + r;
            const int64_t pos = len_c + (a.q_positions_local ? pr / a.group : 0);
            T *row = (T *)(decode_smem + QTile::offset(r, 0)); /* padded rows: contiguous within a row */
            const int c0 = a.rotary_interleaved ? 2 * tt : tt, c1 = a.rotary_interleaved ? 2 * tt + 1 : tt + half;
            auto x = [&](int e) { return E::to_float(row[e]); };
            const float y0 = decode_rotate<T>(a, pos, c0, x), y1 = decode_rotate<T>(a, pos, c1, x);
            row[c0] = E::from_float(y0);
            row[c1] = E::from_float(y1);
        }
    }
    __syncthreads();

    /* Q's A fragments: in registers up to d = 128, else read from the tile at each step. */
    constexpr bool kQInRegs = D <= 128;
    const uint32_t q_addr = sQ + QTile::offset(16 * rb + lane % 16, lane / 16);
    uint32_t qreg[kQInRegs ? D / 16 : 1][4];
    if constexpr (kQInRegs) {
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++) fa_ldmatrix_x4(qreg[ks], QTile::frag(q_addr, 0, ks * 2));
    }

    float acc[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; dt++) acc[dt][0] = acc[dt][1] = acc[dt][2] = acc[dt][3] = 0.0f;
    float row_max[2] = { -INFINITY, -INFINITY }, row_sum[2] = { 0.0f, 0.0f };
    const float scale_log2 = a.scale * FA_LOG2E;
    const bool general = a.softcap > 0.0f || a.alibi;
    /* keys that every real row of the block sees (rows past nrows have a zero Q and are never written) */
    const int64_t diag_first = r0 / a.group + shift, diag_last = (r0 + nrows - 1) / a.group + shift;
    const int64_t full_lo = a.window_left >= 0 ? max((int64_t)0, diag_last - a.window_left) : 0;
    const int64_t full_hi =
        a.window_right >= 0 ? max((int64_t)0, min((int64_t)len_k, diag_first + a.window_right + 1)) : len_k;

    int stage = 0; /* ring slot of tile n */
    for (int n = n_begin; n < n_end; n++) {
        /* Tile n + STAGES - 1 goes into tile n - 1's slot as soon as every warp is done with it, before tile n
         * is waited for: STAGES tiles in flight during the wait, not STAGES - 1. */
        __syncthreads();
        {
            const int nn = n + STAGES - 1, slot = stage == 0 ? STAGES - 1 : stage - 1;
            if (nn < n_end)
                decode_load_tile<T, KVTile, kThreads>(a, b, hk, pad, len_k, nn, sKV + slot * kStageBytes,
                                                      sKV + slot * kStageBytes + KVTile::kBytes, tid);
            fa_cp_async_commit();
        }
        fa_cp_async_wait<STAGES - 1>();
        __syncthreads(); /* tile n landed, every thread's copies visible */
        const uint32_t sK = sKV + stage * kStageBytes, sV = sK + KVTile::kBytes;
        stage = stage + 1 == STAGES ? 0 : stage + 1;

        /* S = Q K^T over this warp's KN keys (n8 tiles 2 sb, 2 sb + 1: keys 16 sb .. of them) */
        constexpr int NT = 2 * KS;
        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.0f;
        const uint32_t k_addr = sK + KVTile::offset(kw * KN + (lane / 16) * 8 + lane % 8, (lane / 8) % 2);
#pragma unroll
        for (int ks = 0; ks < D / 16; ks++) {
            uint32_t qa[4];
            if constexpr (kQInRegs) {
#pragma unroll
                for (int e = 0; e < 4; e++) qa[e] = qreg[kQInRegs ? ks : 0][e];
            } else {
                fa_ldmatrix_x4(qa, QTile::frag(q_addr, 0, ks * 2));
            }
#pragma unroll
            for (int sb = 0; sb < KS; sb++) {
                uint32_t kb[4];
                fa_ldmatrix_x4(kb, KVTile::frag(k_addr, 16 * sb, ks * 2));
                E::mma(s[2 * sb], qa, kb[0], kb[1]);
                E::mma(s[2 * sb + 1], qa, kb[2], kb[3]);
            }
        }

        /* scores in log2 units: scale, softcap, ALiBi, then the mask (keys past the sequence included) where
         * some row of the block does not see every key of the tile */
        const int j0 = n * BN + kw * KN + 2 * t4;
        if (general) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int hf = e / 2, j = j0 + nt * 8 + (e & 1);
                    float x = s[nt][e] * a.scale;
                    if (a.softcap > 0.0f) x = a.softcap * tanhf(x / a.softcap);
                    if (a.alibi) x -= row_slope[hf] * fabsf((float)(row_diag[hf] - j));
                    s[nt][e] = x * FA_LOG2E;
                }
        } else {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) s[nt][e] *= scale_log2;
        }
        if (n * BN < full_lo || n * BN + BN > full_hi) {
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int hf = e / 2, j = j0 + nt * 8 + (e & 1);
                    if (j < row_lo[hf] || j >= row_hi[hf]) s[nt][e] = -INFINITY;
                }
        }

        /* online softmax per row; P packed to 16 bits as the A operands of P V (one per 16 keys). O is rescaled
         * only when some row's max moved (the factor is exactly 1 otherwise, as it mostly is after the first
         * tiles). */
        uint32_t pa[KS][4];
        float corr[2];
#pragma unroll
        for (int hf = 0; hf < 2; hf++) {
            float mx = -INFINITY;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) mx = fmaxf(mx, fmaxf(s[nt][2 * hf], s[nt][2 * hf + 1]));
            mx = fa_quad_max(mx);
            const float m_new = fmaxf(row_max[hf], mx);
            const float m_use = m_new == -INFINITY ? 0.0f : m_new; /* a row with no key yet: p = 0, not NaN */
            corr[hf] = fa_exp2(row_max[hf] - m_use);
            row_max[hf] = m_new;
            row_sum[hf] *= corr[hf];
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
                const float p0 = fa_exp2(s[nt][2 * hf] - m_use), p1 = fa_exp2(s[nt][2 * hf + 1] - m_use);
                row_sum[hf] += p0 + p1;
                /* a0: (g, keys 0-7 of the 16), a1: (g+8, 0-7), a2/a3: keys 8-15 */
                pa[nt / 2][2 * (nt % 2) + hf] = E::pack(p0, p1);
            }
        }
        if (__any_sync(0xffffffffu, corr[0] != 1.0f || corr[1] != 1.0f)) {
#pragma unroll
            for (int dt = 0; dt < DT; dt++)
                acc[dt][0] *= corr[0], acc[dt][1] *= corr[0], acc[dt][2] *= corr[1], acc[dt][3] *= corr[1];
        }

        /* O += P V */
        const uint32_t v_addr = sV + KVTile::offset(kw * KN + ((lane / 8) % 2) * 8 + lane % 8, lane / 16);
#pragma unroll
        for (int sb = 0; sb < KS; sb++)
#pragma unroll
            for (int dp = 0; dp < D / 16; dp++) {
                uint32_t vb[4];
                fa_ldmatrix_x4_trans(vb, KVTile::frag(v_addr, 16 * sb, dp * 2));
                E::mma(acc[2 * dp], pa[sb], vb[0], vb[1]);
                E::mma(acc[2 * dp + 1], pa[sb], vb[2], vb[3]);
            }
    }

    /* Merge the warps of each row block: each row's max M over them, every warp's O scaled by 2^(m_w - M) and
     * summed. */
    fa_cp_async_wait<0>();
    __syncthreads();                  /* the Q tile and the ring are free (no copy in flight, no warp reading) */
    float *ml = (float *)decode_smem; /* [NW][16][2]: max, sum */
    float *red = ml + NW * 16 * 2;    /* [NW][16][D] */
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const float l = fa_quad_sum(row_sum[hf]);
        if (t4 == 0) {
            ml[(warp * 16 + g + 8 * hf) * 2] = row_max[hf];
            ml[(warp * 16 + g + 8 * hf) * 2 + 1] = l;
        }
    }
    __syncthreads();
#pragma unroll
    for (int hf = 0; hf < 2; hf++) {
        const int r = g + 8 * hf;
        float M = -INFINITY;
#pragma unroll
        for (int w = 0; w < KW; w++) M = fmaxf(M, ml[((rb * KW + w) * 16 + r) * 2]);
        const float f = M == -INFINITY ? 0.0f : fa_exp2(row_max[hf] - M);
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
            *(float2 *)(red + (warp * 16 + r) * D + dt * 8 + 2 * t4) =
                make_float2(acc[dt][2 * hf] * f, acc[dt][2 * hf + 1] * f);
    }
    __syncthreads();

    const bool direct = a.num_splits == 1;
    const int64_t rows = (int64_t)a.batch * a.heads_q * a.seqlen_q;
    for (int idx = tid; idx < crows * (D / 4); idx += kThreads) {
        const int r = idx / (D / 4), c = idx % (D / 4) * 4, pr = c0 + r, w0 = r / 16 * KW, rr = r % 16;
        const int i = pr / a.group, h = hk * a.group + pr % a.group;
        float M = -INFINITY, L = 0.0f;
#pragma unroll
        for (int w = w0; w < w0 + KW; w++) M = fmaxf(M, ml[(w * 16 + rr) * 2]);
        float4 o = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (M != -INFINITY) {
#pragma unroll
            for (int w = w0; w < w0 + KW; w++) {
                L += ml[(w * 16 + rr) * 2 + 1] * fa_exp2(ml[(w * 16 + rr) * 2] - M);
                const float4 x = *(const float4 *)(red + (w * 16 + rr) * D + c);
                o.x += x.x, o.y += x.y, o.z += x.z, o.w += x.w;
            }
        }
        const float inv = L > 0.0f ? 1.0f / L : 0.0f;
        const float lse = L > 0.0f ? (M + log2f(L)) * FA_LN2 : -INFINITY;
        o.x *= inv, o.y *= inv, o.z *= inv, o.w *= inv;
        const int64_t row = ((int64_t)b * a.heads_q + h) * a.seqlen_q + i;
        if (direct) {
            uint2 packed;
            packed.x = E::pack(o.x, o.y);
            packed.y = E::pack(o.z, o.w);
            *(uint2 *)((T *)a.o + b * a.o_batch + i * a.o_row + h * a.o_head + c) = packed;
            if (a.lse && c == 0) a.lse[row] = lse;
        } else {
            const int64_t at = split * rows + row;
            *(float4 *)(a.part_o + at * D + c) = o; /* (zeros for an empty split: the combine reads every one) */
            if (c == 0) a.part_lse[at] = lse;
        }
    }
}

/* Launches kernel(a); a.overlap_launch: as a programmatic dependent of the kernel before it in the stream (the
 * kernels wait for it in fa_grid_dependency_wait), and plainly where the driver refuses that (an older driver
 * under a newer toolkit's minor-version compatibility). */
static cudaError_t decode_launch(void (*kernel)(const decode_args), dim3 grid, unsigned threads, size_t smem,
                                 cudaStream_t stream, const decode_args &a) {
    cudaLaunchAttribute attr;
    attr.id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attr.val.programmaticStreamSerializationAllowed = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = grid, cfg.blockDim = dim3(threads), cfg.dynamicSmemBytes = smem, cfg.stream = stream;
    cfg.attrs = &attr, cfg.numAttrs = a.overlap_launch ? 1 : 0;
    cudaError_t err = cudaLaunchKernelEx(&cfg, kernel, a);
    if (err != cudaSuccess && cfg.numAttrs) { /* (any other error recurs without the attribute) */
        cudaGetLastError();
        cfg.numAttrs = 0;
        err = cudaLaunchKernelEx(&cfg, kernel, a);
    }
    return err;
}

/* Launches the attention kernel for head dim D, dtype T and STAGES K/V tiles. */
template <typename T, int D, int STAGES, int MB>
static cudaError_t decode_attn_launch(const decode_args *a, cudaStream_t stream) {
    void (*kernel)(const decode_args) = decode_attn_kernel<T, D, STAGES, MB>;
    if (!a) {
        cudaFuncAttributes attr;
        return cudaFuncGetAttributes(&attr, kernel);
    }
    const size_t used = decode_smem_bytes(D, STAGES, MB);
    const int smem = (int)(used > (size_t)a->smem_request ? used : (size_t)a->smem_request);
    cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    /* all of the SM's shared memory: the blocks per SM are what keeps enough copies in flight */
    if (err == cudaSuccess)
        err = cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                   (int)cudaSharedmemCarveoutMaxShared);
    if (err != cudaSuccess) return err;
    dim3 grid((unsigned)a->num_splits, (unsigned)(a->heads_kv * a->m_groups), (unsigned)a->batch);
    return decode_launch(kernel, grid, DECODE_WARPS * 32 * MB, (size_t)smem, stream, *a);
}

template <typename T, int D, int STAGES>
static cudaError_t decode_attn_launch_rows(const decode_args *a, cudaStream_t stream) {
    return a && a->row_blocks == 2 ? decode_attn_launch<T, D, STAGES, 2>(a, stream)
                                   : decode_attn_launch<T, D, STAGES, 1>(a, stream);
}

template <typename T, int D>
static cudaError_t decode_attn_launch_stages(const decode_args *a, int stages, cudaStream_t stream) {
    if constexpr (decode_stages_max(D) > 3)
        if (stages == decode_stages_max(D)) return decode_attn_launch_rows<T, D, decode_stages_max(D)>(a, stream);
    if constexpr (decode_stages_max(D) >= 3)
        if (stages == 3) return decode_attn_launch_rows<T, D, 3>(a, stream);
    return stages == 2 ? decode_attn_launch_rows<T, D, 2>(a, stream) : cudaErrorInvalidValue;
}

#define DECODE_DEFINE_HDIM(D)                                                                    \
    DECODE_DECLARE_HDIM(D) {                                                                     \
        return dtype == FA_BF16 ? decode_attn_launch_stages<__nv_bfloat16, D>(a, stages, stream) \
                                : decode_attn_launch_stages<__half, D>(a, stages, stream);       \
    }

#endif /* __CUDACC__ */

#endif /* FLASHATTN_CUDA_DECODE_CUH */
