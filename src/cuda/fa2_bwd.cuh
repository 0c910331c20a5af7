/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fa2_bwd.cuh - FlashAttention-2 backward kernels (mma.sync m16n8k16, ldmatrix, cp.async; sm_80+), templated
 * on the 16-bit element type, the head dim D and the tile sizes. Included by one fa2_bwd_hdim*.cu per head dim
 * (the instantiations) and by fa2_bwd.cu (the tile table and the argument struct only).
 *
 * Algorithm 2 of the FlashAttention-2 paper, in three kernels:
 *   1. preprocess: D = rowsum(dO * O) in fp32, and LSE * log2(e) (with -inf -> +inf, so that rows that see no
 *      key get P = exp2(s - LSE2) = 0), both indexed like the LSE.
 *   2. main: one CTA per (key block of BN rows, kv head, batch) keeps K_j, V_j in shared memory and dK_j, dV_j in
 *      registers, and loops over the query heads of its GQA group and the query blocks of BM rows that see the
 *      key block (causal / window block skipping; masks applied only to boundary blocks), starting at the query
 *      block level with its own key block and wrapping (so CTAs running together add to different dQ rows);
 *      under a causal mask CTAs launch longest first across chunks of kv heads (bwd_block_get). Per step:
 *        S^T = K Q^T                                    (per warp: its KR x 16 keys x its queries)
 *        P^T = exp2(S^T scale log2e - LSE2)             (kept in 16 bits)
 *        dP^T = V dO^T, dS^T = P^T (dP^T - D) [(1 - tanh^2) with softcap]
 *        dV += P^T dO, dK += dS^T Q                     (A operand from registers for the warp's own queries)
 *        dQ += dS K                                      (dS^T through shared memory; fp32 reductions)
 *      Warps are laid out WK along keys (KR m16 tiles each) x WD along the head dim of dK/dV. With WD = 1 every
 *      warp holds its keys' P^T and dS^T for the whole query block in registers, which are exactly the A
 *      fragments of the dV and dK products. WD > 1 (needed where dK and dV would not fit in registers, and
 *      cheaper in shared-memory traffic where they would: each B fragment then feeds KR products) splits the
 *      queries of S^T between the warps of a key stripe and exchanges P^T, dS^T through shared memory.
 *   3. convert: dQ = softmax_scale * dQaccum (summing the deterministic slices in order), in the 16-bit type.
 * dQaccum keeps each group of 16 columns permuted (fa2_bwd_dq_pos) so that the four values a thread holds of a
 * group in the mma fragment are adjacent: one 16-byte reduction instead of two 8-byte (or four 4-byte) ones; and
 * it is stored in blocks of 8 token rows x 16 columns (fa2_bwd_dq_index), so that a warp's reductions of one
 * fragment row block cover whole 128-byte lines.
 * Deterministic mode: gridDim.x = nsplit CTAs per (kv head, batch) walk the key blocks nb = blockIdx.x,
 * blockIdx.x + nsplit, ... and add dQ into their own fp32 slice. Within a slice each element is only ever added
 * to by one thread, in program order, so the sums are bit-identical run to run; the convert kernel adds the
 * slices in a fixed order.
 *
 * Shapes: B batch, Hq / Hkv heads, Sq / Sk sequence lengths (varlen: per-sequence), D head dim.
 */
#ifndef FLASHATTN_CUDA_FA2_BWD_CUH
#define FLASHATTN_CUDA_FA2_BWD_CUH

#include "bwd_common.cuh"
#include "kernels.h"

/* What the kernels read: the validated params flattened, plus the workspace pointers. */
typedef struct fa2_bwd_args {
    fa_tensor q, k, v, o, dout, dq, dk, dv;
    const int32_t *cu_seqlens_q, *cu_seqlens_k; /* NULL: dense */
    const float *lse;
    const float *alibi_slopes;
    int64_t alibi_batch_stride;
    float *lse2;     /* LSE * log2(e), +inf for rows that see no key; indexed like lse */
    float *dsum;     /* rowsum(dO * O); indexed like lse */
    float *dq_accum; /* nsplit slices of (tokens_q, Hq, D) fp32 in the order of fa2_bwd_dq_index */
    int64_t dq_split_stride;
    int64_t total_q; /* rows of the varlen lse layout */
    int batch, seqlen_q, seqlen_k, heads_q, heads_kv, group;
    float scale, scale_log2, softcap;
    float softcap_arg; /* scale / softcap: tanh's argument per unit of q.k (0 without softcap) */
    int window_left, window_right;
    int deterministic, nsplit;
    int chunk_pairs; /* launch order: (batch, kv head) pairs per chunk (bwd_block_get) */
} fa2_bwd_args;

/* One tile configuration of the main kernel for head dim D: BM query rows per step; WK x WD warps, warp (kw, wh)
 * owning KR m16 tiles of keys (BN = 16 KR WK key rows per CTA) and the column groups wh, wh + WD, .. of dK and dV;
 * the dQ product split WQM (rows) x NWARPS / WQM (columns) over the warps, in column chunks of DQ_CHUNK; QB
 * buffers of Q, dO, LSE2 and D (2: the next step's loads overlap the whole step; 1: they overlap the dQ product
 * only). Shared memory (bytes): 2 (2 BN + 2 QB BM) (D + 8) + 2 (WD > 1 ? 2 : 1) BN (BM + 8) + 8 QB BM. */
typedef struct fa2_bwd_tile {
    int d, bm, kr, wk, wd, wqm, dq_chunk, qb;
} fa2_bwd_tile;

#ifndef FA2_BWD_CHUNK_SMS
#define FA2_BWD_CHUNK_SMS 2 /* causal launch order: chunks of this many x SMs CTAs (bwd_block_get; 0: off) */
#endif
#ifndef FA2_BWD_ROTATE
#define FA2_BWD_ROTATE 1 /* 0: every key block's steps from its first visible query block (tuning comparison) */
#endif

/* Tuning builds may override the first row of a head dim with -DFA2_BWD_TILE_<D>="D, BM, KR, WK, WD, WQM, DQC, QB". */
#ifndef FA2_BWD_TILE_32
#define FA2_BWD_TILE_32 32, 128, 1, 8, 1, 4, 16, 2
#endif
#ifndef FA2_BWD_TILE_64
#define FA2_BWD_TILE_64 64, 128, 2, 4, 2, 8, 32, 2
#endif
#ifndef FA2_BWD_TILE_96
#define FA2_BWD_TILE_96 96, 64, 1, 8, 1, 4, 16, 2
#endif
#ifndef FA2_BWD_TILE_128
#define FA2_BWD_TILE_128 128, 64, 2, 4, 2, 2, 32, 2
#endif
#ifndef FA2_BWD_TILE_192
#define FA2_BWD_TILE_192 192, 64, 1, 4, 2, 2, 48, 2
#endif
#ifndef FA2_BWD_TILE_256
#define FA2_BWD_TILE_256 256, 64, 2, 2, 4, 4, 32, 2
#endif

/* The configurations of each head dim from the most shared memory to the least; the host takes the first that
 * fits the device's opt-in shared memory per block (fa2_bwd.cu). The first row of a head dim is the fastest
 * measured on the H200 (227 KB; docs/worklog.md, "FA2 backward (CUDA)"); the others serve the A100 (163 KB) and
 * the 99 KB parts (sm_86, sm_89). Comments: shared memory in KB of 1024 bytes, [BM x BN], the GPUs that take it. */
static constexpr fa2_bwd_tile fa2_bwd_tiles[] = {
    /* D  BM KR WK WD WQM DQC QB */
    { FA2_BWD_TILE_32 },            /* 96 KB [128 x 128]: every part */
    { FA2_BWD_TILE_64 },            /* 178 KB [128 x 128]: H100, H200 */
    { 64, 64, 2, 4, 2, 4, 32, 2 },  /* 109 KB [64 x 128]: A100; the H200 warp layout for half the queries */
    { 64, 64, 1, 8, 1, 4, 32, 2 },  /* 91 KB [64 x 128]: 99 KB parts; WD = 1 needs no P^T buffer (d = 96 layout) */
    { FA2_BWD_TILE_96 },            /* 123 KB [64 x 128]: H100, H200, A100 */
    { 96, 64, 1, 8, 1, 4, 16, 1 },  /* 96.5 KB [64 x 128]: 99 KB parts; one Q / dO buffer */
    { FA2_BWD_TILE_128 },           /* 173 KB [64 x 128]: H100, H200 */
    { 128, 64, 2, 4, 2, 2, 32, 1 }, /* 138.5 KB [64 x 128]: A100; one Q / dO buffer */
    { 128, 64, 1, 4, 2, 2, 32, 1 }, /* 86.5 KB [64 x 64]: 99 KB parts; half the keys, one Q / dO buffer */
    { FA2_BWD_TILE_192 },           /* 169 KB [64 x 64]: H100, H200 */
    { 192, 64, 1, 4, 2, 2, 48, 1 }, /* 118.5 KB [64 x 64]: A100; one Q / dO buffer */
    { 192, 32, 1, 4, 2, 2, 48, 1 }, /* 85 KB [32 x 64]: 99 KB parts; half the queries, one Q / dO buffer */
    { FA2_BWD_TILE_256 },           /* 217 KB [64 x 64]: H100, H200 */
    { 256, 64, 2, 2, 4, 2, 32, 1 }, /* 150.5 KB [64 x 64]: A100; one Q / dO buffer */
    { 256, 32, 1, 2, 2, 2, 32, 1 }, /* 71 KB [32 x 32]: 99 KB parts; 4 warps, one Q / dO buffer (64 x 32: 108.5 KB) */
};
#define FA2_BWD_NTILES ((int)(sizeof(fa2_bwd_tiles) / sizeof(fa2_bwd_tiles[0])))

static constexpr int fa2_bwd_block_n(const fa2_bwd_tile &c) {
    return 16 * c.kr * c.wk;
}
static constexpr int fa2_bwd_threads(const fa2_bwd_tile &c) {
    return 32 * c.wk * c.wd;
}
/* Dynamic shared memory of the main kernel; its static shared memory (the sequence geometry, aligned like the
 * dynamic area) takes FA2_BWD_STATIC_SMEM more. */
static constexpr size_t fa2_bwd_smem_bytes(const fa2_bwd_tile &c) {
    return 2 * ((size_t)(2 * fa2_bwd_block_n(c) + 2 * c.qb * c.bm) * (c.d + 8) +
                (size_t)(c.wd > 1 ? 2 : 1) * fa2_bwd_block_n(c) * (c.bm + 8)) +
           8 * (size_t)c.qb * c.bm;
}
#define FA2_BWD_STATIC_SMEM 128

/* The host takes the first row that fits: each head dim's rows must come in decreasing shared memory. */
static constexpr bool fa2_bwd_tiles_ordered(int i) {
    return i >= FA2_BWD_NTILES || ((fa2_bwd_tiles[i].d != fa2_bwd_tiles[i - 1].d ||
                                    fa2_bwd_smem_bytes(fa2_bwd_tiles[i]) < fa2_bwd_smem_bytes(fa2_bwd_tiles[i - 1])) &&
                                   fa2_bwd_tiles_ordered(i + 1));
}
static_assert(fa2_bwd_tiles_ordered(1), "fa2_bwd_tiles: rows of a head dim out of order");

void fa2_bwd_args_make(const fa_params *p, int nsplit, void *workspace, fa2_bwd_args *a);
size_t fa2_bwd_dq_accum_bytes(const fa2_bwd_args *a);

#ifdef __CUDACC__

/* Element offset of row r (token tok + r in varlen) of head h of batch entry b in tensor t. */
static __device__ __forceinline__ int64_t bwd_row(const fa_tensor &t, bool varlen, int b, int64_t tok, int64_t r,
                                                  int h) {
    return (varlen ? (tok + r) * t.stride_seq : b * t.stride_batch + r * t.stride_seq) + h * t.stride_head;
}

/* One sequence of the batch: lengths, and the first token row (varlen) or b * seqlen (dense, for dQaccum). */
struct bwd_seq {
    int len_q, len_k;
    int64_t tok_q, tok_k;
};
static __device__ __forceinline__ bwd_seq bwd_seq_get(const fa2_bwd_args &a, int b) {
    bwd_seq s;
    if (a.cu_seqlens_q) {
        s.tok_q = a.cu_seqlens_q[b];
        s.tok_k = a.cu_seqlens_k[b];
        s.len_q = (int)(a.cu_seqlens_q[b + 1] - s.tok_q);
        s.len_k = (int)(a.cu_seqlens_k[b + 1] - s.tok_k);
    } else {
        s.tok_q = (int64_t)b * a.seqlen_q;
        s.tok_k = (int64_t)b * a.seqlen_k;
        s.len_q = a.seqlen_q;
        s.len_k = a.seqlen_k;
    }
    return s;
}

static __device__ __forceinline__ int64_t bwd_lse_index(const fa2_bwd_args &a, int b, int64_t tok_q, int r, int h) {
    return a.cu_seqlens_q ? (int64_t)h * a.total_q + tok_q + r : ((int64_t)b * a.heads_q + h) * a.seqlen_q + r;
}

/* Where column c of a dQ row lives in dQaccum: in its group of 16, the mma fragment gives thread t (= lane % 4)
 * columns 2t, 2t+1 of the group's first n8 tile (u = 0) and of its second (u = 1); they sit at 4t + 2u, +1. */
static __host__ __device__ constexpr int fa2_bwd_dq_pos(int c) {
    return (c & ~15) + 4 * ((c % 8) / 2) + 2 * ((c % 16) / 8) + c % 2;
}
static_assert(fa2_bwd_dq_pos(1) == 1 && fa2_bwd_dq_pos(2) == 4 && fa2_bwd_dq_pos(8) == 2 && fa2_bwd_dq_pos(9) == 3 &&
                  fa2_bwd_dq_pos(14) == 14 && fa2_bwd_dq_pos(23) == 29,
              "dQaccum column order: a thread's (2t, 2t+1, 8+2t, 9+2t) of a group at 4t .. 4t+3");

/* Element offset in dQaccum of column c of head h of token row tok. dQaccum is stored in blocks of 8 token rows
 * x 16 columns of one head (512 bytes, columns permuted as above), so that one warp's 16-byte reductions of an
 * mma tile's 8 rows x 16 columns cover four whole 128-byte lines instead of two sectors of eight lines each. */
static __host__ __device__ __forceinline__ int64_t fa2_bwd_dq_index(int64_t tok, int h, int c, int heads_q, int d) {
    return ((tok >> 3) * heads_q + h) * (int64_t)(8 * d) + (c >> 4) * 128 + (tok & 7) * 16 + fa2_bwd_dq_pos(c & 15);
}
/* Token rows dQaccum holds for `tokens` rows of `batch` sequences: whole blocks of 8 here, and room for the FA3
 * backward's order below, which starts every sequence on a block of 16. */
static __host__ __device__ __forceinline__ int64_t fa2_bwd_dq_rows(int64_t tokens, int64_t batch) {
    return (tokens + 16 * batch + 15) & ~(int64_t)15;
}

/* The FA3 backward's dQaccum order: blocks of 16 rows x 8 columns of one head (512 bytes), in which the four values
 * a wgmma accumulator holds in consecutive registers, (row r, columns c, c + 1) and (row r + 8, the same columns),
 * are adjacent: one 16-byte reduction straight from those registers. Sequence b's rows start at
 * fa3_bwd_dq_row0(tok_q, b), a multiple of 16 (its first token plus 16 b, rounded down: past the previous one's
 * last row), so that a warp's 16 rows of a tile are one block. */
static __host__ __device__ __forceinline__ int64_t fa3_bwd_dq_row0(int64_t tok_q, int b) {
    return (tok_q + 16 * (int64_t)b) & ~(int64_t)15;
}
static __host__ __device__ __forceinline__ int64_t fa3_bwd_dq_index(int64_t row, int h, int c, int heads_q, int d) {
    return ((row >> 4) * heads_q + h) * (int64_t)(16 * d) + (c >> 3) * 128 + (row & 7) * 16 + ((c & 7) >> 1) * 4 +
           ((row >> 3) & 1) * 2 + (c & 1);
}

/* Lanes per row in the row-wise kernels: the power of two >= D / 8 (16 bytes each; the extra lanes idle). */
template <int D>
struct bwd_row_lanes {
    enum { N = D / 8 <= 4 ? 4 : D / 8 <= 8 ? 8 : D / 8 <= 16 ? 16 : 32 };
};

/* ---- 1. preprocess: D = rowsum(dO * O), LSE2 = LSE * log2(e). Grid (ceil(Sq / 64), Hq, B), 256 threads. With
 * ZERO_FA3 it also zeroes the FA3 backward's dQ accumulator (fa3_bwd_dq_index) for its 64 rows: whole blocks of 16
 * rows, which never reach another sequence's (fa3_bwd_dq_row0). Zeroing here, beside the reads of O and dO, costs
 * less than a memset of the whole accumulator before this kernel. ---- */

template <typename T, int D, bool ZERO_FA3>
__global__ void __launch_bounds__(256) fa2_bwd_preprocess_kernel(const fa2_bwd_args a) {
    constexpr int LANES = bwd_row_lanes<D>::N, ROWS = 256 / LANES; /* ROWS divides 64 */
    const int h = blockIdx.y, b = blockIdx.z;
    const bwd_seq s = bwd_seq_get(a, b);
    const bool varlen = a.cu_seqlens_q != nullptr;
    const int sub = threadIdx.x % LANES;
    if constexpr (ZERO_FA3) {
        const int64_t row0 = fa3_bwd_dq_row0(s.tok_q, b) + blockIdx.x * 64;
        for (int j = 0; j < 4 && (int)blockIdx.x * 64 + 16 * j < s.len_q; ++j) {
            float4 *blk = reinterpret_cast<float4 *>(a.dq_accum + fa3_bwd_dq_index(row0 + 16 * j, h, 0, a.heads_q, D));
            for (int i = threadIdx.x; i < 4 * D; i += 256) blk[i] = make_float4(0.f, 0.f, 0.f, 0.f);
        }
    }
    for (int r0 = blockIdx.x * 64; r0 < (int)(blockIdx.x + 1) * 64 && r0 < s.len_q; r0 += ROWS) {
        const int r = r0 + threadIdx.x / LANES;
        float dot = 0.f;
        if (r < s.len_q && sub < D / 8) {
            const uint4 o4 = *reinterpret_cast<const uint4 *>((const T *)a.o.data +
                                                              bwd_row(a.o, varlen, b, s.tok_q, r, h) + sub * 8);
            const uint4 d4 = *reinterpret_cast<const uint4 *>((const T *)a.dout.data +
                                                              bwd_row(a.dout, varlen, b, s.tok_q, r, h) + sub * 8);
            float2 x = fa_elem<T>::unpack(o4.x), y = fa_elem<T>::unpack(d4.x);
            dot += x.x * y.x + x.y * y.y;
            x = fa_elem<T>::unpack(o4.y), y = fa_elem<T>::unpack(d4.y);
            dot += x.x * y.x + x.y * y.y;
            x = fa_elem<T>::unpack(o4.z), y = fa_elem<T>::unpack(d4.z);
            dot += x.x * y.x + x.y * y.y;
            x = fa_elem<T>::unpack(o4.w), y = fa_elem<T>::unpack(d4.w);
            dot += x.x * y.x + x.y * y.y;
        }
#pragma unroll
        for (int m = LANES / 2; m > 0; m /= 2) dot += __shfl_xor_sync(0xffffffffu, dot, m);
        if (sub == 0 && r < s.len_q) {
            const int64_t li = bwd_lse_index(a, b, s.tok_q, r, h);
            const float lse = a.lse[li];
            a.dsum[li] = dot;
            a.lse2[li] = lse == -INFINITY ? INFINITY : lse * FA_LOG2E;
        }
    }
}

/* dQ = scale * v at columns col .. col + 7 of row r of head h in sequence b (s), one 16-byte store (the FA2 and FA3
 * converts). A row the mask leaves no key has dQ = 0 exactly: its P is 0, but 0 times a NaN in dP (from V) or in D
 * (from dO) would reach it. */
template <typename T>
static __device__ __forceinline__ void bwd_store_dq8(const fa2_bwd_args &a, const bwd_seq &s, int b, int r, int h,
                                                     int col, const float (&v)[8]) {
    uint4 out = make_uint4(0, 0, 0, 0);
    if (fa_row_sees_key(r, s.len_q, s.len_k, a.window_left, a.window_right)) {
        out.x = fa_elem<T>::pack(v[0] * a.scale, v[1] * a.scale);
        out.y = fa_elem<T>::pack(v[2] * a.scale, v[3] * a.scale);
        out.z = fa_elem<T>::pack(v[4] * a.scale, v[5] * a.scale);
        out.w = fa_elem<T>::pack(v[6] * a.scale, v[7] * a.scale);
    }
    *reinterpret_cast<uint4 *>((T *)a.dq.data + bwd_row(a.dq, a.cu_seqlens_q != nullptr, b, s.tok_q, r, h) + col) = out;
}

/* ---- 3. convert: dQ = scale * sum of the dQaccum slices. Grid (ceil(Sq / 64), Hq, B), 256 threads. (The FA3
 * backward's accumulator order has a convert of its own: fa3_bwd_convert_dq_kernel.) ---- */

template <typename T, int D>
__global__ void __launch_bounds__(256) fa2_bwd_convert_dq_kernel(const fa2_bwd_args a) {
    constexpr int LANES = bwd_row_lanes<D>::N, ROWS = 256 / LANES;
    const int h = blockIdx.y, b = blockIdx.z;
    const bwd_seq s = bwd_seq_get(a, b);
    const int sub = threadIdx.x % LANES;
    const int nsplit = a.deterministic ? a.nsplit : 1;
    if (sub >= D / 8) return;
    for (int r = blockIdx.x * 64 + threadIdx.x / LANES; r < min(s.len_q, (int)(blockIdx.x + 1) * 64); r += ROWS) {
        /* columns sub*8 .. sub*8+7 as four pairs at fa2_bwd_dq_pos(8 (sub % 2) + 2t) in group sub / 2 */
        const float *src = a.dq_accum + fa2_bwd_dq_index(s.tok_q + r, h, sub / 2 * 16, a.heads_q, D);
        float acc[8] = { 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f };
        for (int sp = 0; sp < nsplit; sp++) {
            const float *p = src + sp * a.dq_split_stride;
#pragma unroll
            for (int t = 0; t < 4; t++) {
                const float2 x = *reinterpret_cast<const float2 *>(p + fa2_bwd_dq_pos(sub % 2 * 8 + 2 * t));
                acc[2 * t] += x.x, acc[2 * t + 1] += x.y;
            }
        }
        bwd_store_dq8<T>(a, s, b, r, h, sub * 8, acc);
    }
}

/* Address of row r + k STEP, chunk c of tile TL at dst, given base = dst + TL::offset(r, c): one add (or, for a
 * swizzled tile and STEP not a multiple of 8, the full offset). */
template <typename TL, int STEP>
static __device__ __forceinline__ uint32_t bwd_tile_row(uint32_t dst, uint32_t base, int r, int c, int k) {
    return STEP % 8 == 0 ? TL::frag(base, k * STEP, 0) : dst + TL::offset(r + k * STEP, c);
}

/* cp.async of rows row0.. (ROWS of them, zeros at and past row_end) of one head of tensor t into a tile of
 * layout TL (fa_smem_tile). When NT is a multiple of DC, thread i copies chunk i % DC of rows i / DC + k (NT / DC). */
template <typename T, typename TL, int ROWS, int NT>
static __device__ __forceinline__ void bwd_load_tile(uint32_t dst, const fa_tensor &t, bool varlen, int b, int64_t tok,
                                                     int row0, int row_end, int h) {
    constexpr int DC = TL::kChunks;
    if constexpr (NT % DC == 0 && (ROWS * DC) % NT == 0) {
        constexpr int STEP = NT / DC;
        const int c = threadIdx.x % DC, r = threadIdx.x / DC;
        const T *src = (const T *)t.data + bwd_row(t, varlen, b, tok, row0 + r, h) + c * 8;
        const int64_t step = (int64_t)STEP * t.stride_seq;
        const uint32_t base = dst + TL::offset(r, c);
        if (row0 + ROWS <= row_end) { /* a whole tile (most steps): no per-row checks or address selects */
#pragma unroll
            for (int k = 0; k < ROWS / STEP; k++)
                fa_cp_async_16(bwd_tile_row<TL, STEP>(dst, base, r, c, k), src + k * step, true);
            return;
        }
#pragma unroll
        for (int k = 0; k < ROWS / STEP; k++) {
            const bool ok = row0 + r + k * STEP < row_end;
            fa_cp_async_16(bwd_tile_row<TL, STEP>(dst, base, r, c, k), ok ? src + k * step : (const T *)t.data, ok);
        }
    } else {
        for (int i = threadIdx.x; i < ROWS * DC; i += NT) {
            const int r = i / DC, c = i % DC;
            const bool ok = row0 + r < row_end;
            const T *src = ok ? (const T *)t.data + bwd_row(t, varlen, b, tok, row0 + r, h) + c * 8 : (const T *)t.data;
            fa_cp_async_16(dst + TL::offset(r, c), src, ok);
        }
    }
}

/* Issues the cp.async loads of a step: Q and dO rows m0.. of query head hq (zeros past the sequence), LSE2 and
 * D into fp32 arrays. */
template <typename T, typename TL, int BM, int NT>
static __device__ __forceinline__ void bwd_load_step(const fa2_bwd_args &a, const bwd_seq &s, int b, int hq, int m0,
                                                     uint32_t q_dst, uint32_t do_dst, float *lse_dst, float *ds_dst) {
    const bool varlen = a.cu_seqlens_q != nullptr;
    bwd_load_tile<T, TL, BM, NT>(q_dst, a.q, varlen, b, s.tok_q, m0, s.len_q, hq);
    bwd_load_tile<T, TL, BM, NT>(do_dst, a.dout, varlen, b, s.tok_q, m0, s.len_q, hq);
    if (threadIdx.x < BM) {
        const int i = threadIdx.x;
        const bool ok = m0 + i < s.len_q;
        const int64_t li = ok ? bwd_lse_index(a, b, s.tok_q, m0 + i, hq) : 0;
        bwd_cp_async4(fa_smem_addr(lse_dst + i), a.lse2 + li, ok);
        bwd_cp_async4(fa_smem_addr(ds_dst + i), a.dsum + li, ok);
    }
}

/* First key block, kv head and batch entry of this CTA: under a causal mask key block 0 (the one most queries
 * see) is the longest, and the launch order goes longest first across chunks of (batch, kv head) pairs
 * (fa_chunked_order). chunk_pairs = 1: blockIdx as it is (also in deterministic mode, whose CTAs walk key blocks). */
struct bwd_block {
    int nb, hk, b;
};
static __device__ __forceinline__ bwd_block bwd_block_get(const fa2_bwd_args &a) {
    const int nx = gridDim.x, ny = gridDim.y, cp = a.chunk_pairs;
    bwd_block w;
    if (FA2_BWD_CHUNK_SMS == 0 || cp == 1) {
        w.nb = blockIdx.x;
        w.hk = blockIdx.y;
        w.b = blockIdx.z;
        return w;
    }
    const fa_grid_slot g = fa_chunked_order(nx, ny, cp);
    w.nb = g.rank;
    w.hk = g.pair % ny;
    w.b = g.pair / ny;
    return w;
}

/* ---- 2. main kernel. Grid (key blocks or nsplit, Hkv, B). ----
 * Column groups of 16 are interleaved between warps sharing rows: warp half wh of dK/dV owns groups WD * j + wh,
 * dQ warp column wn owns groups WQN * j + wn. */

/* acc = A B^T over the head dim, for one warp: KR m16 tiles of A rows (K or V) times QW columns of B rows
 * (Q or dO), both in TD's layout (fa_smem_tile) with the lane's ldmatrix offsets folded into the base addresses.
 * S^T = K Q^T and dP^T = V dO^T are both this product. */
template <typename T, typename TD, int D, int KR, int QW>
static __device__ __forceinline__ void bwd_rows_x_rows(float (&acc)[KR][QW / 8][4], uint32_t a_base, uint32_t b_base) {
    typedef fa_elem<T> dt;
#pragma unroll
    for (int mr = 0; mr < KR; mr++)
#pragma unroll
        for (int j = 0; j < QW / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) acc[mr][j][e] = 0.f;
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        uint32_t a[KR][4];
#pragma unroll
        for (int mr = 0; mr < KR; mr++) fa_ldmatrix_x4(a[mr], TD::frag(a_base, mr * 16, 2 * kk));
#pragma unroll
        for (int jp = 0; jp < QW / 16; jp++) {
            uint32_t bf[4];
            fa_ldmatrix_x4(bf, TD::frag(b_base, jp * 16, 2 * kk));
#pragma unroll
            for (int mr = 0; mr < KR; mr++) {
                dt::mma(acc[mr][2 * jp], a[mr], bf[0], bf[1]);
                dt::mma(acc[mr][2 * jp + 1], a[mr], bf[2], bf[3]);
            }
        }
    }
}

/* One 16 x 16 block (key tile mr, query columns 16 jp..) of a warp's 16-bit P^T or dS^T fragments (the
 * C-fragment layout: f0 / f1 rows g / g+8 of the first 8 columns, f2 / f3 of the next 8) into the TM tile: with
 * stmatrix on sm_90 where STM (lane_base = the tile + this lane's stmatrix row address for block (0, 0)), else
 * 32-bit stores (thread_base = the tile + this thread's slot in block (0, 0)). stmatrix is 1 instruction for 4
 * (+1-2% at d = 64, 128 on the H200); where a warp holds only 16 query columns (d = 256) its extra address
 * register spills and it measured 2% slower. */
template <typename TM, bool STM>
static __device__ __forceinline__ void bwd_store_block(uint32_t lane_base, uint32_t thread_base, int mr, int jp,
                                                       uint32_t f0, uint32_t f1, uint32_t f2, uint32_t f3) {
#if __CUDA_ARCH__ >= 900
    if constexpr (STM) {
        fa_stmatrix_x4(lane_base + TM::offset(mr * 16, 2 * jp), f0, f1, f2, f3);
        return;
    }
#endif
    bwd_st_shared_u32(thread_base + TM::offset(mr * 16, 2 * jp), f0);
    bwd_st_shared_u32(thread_base + TM::offset(mr * 16 + 8, 2 * jp), f1);
    bwd_st_shared_u32(thread_base + TM::offset(mr * 16, 2 * jp + 1), f2);
    bwd_st_shared_u32(thread_base + TM::offset(mr * 16 + 8, 2 * jp + 1), f3);
}

template <typename T, int D, int BM, int KR, int WK, int WD, int WQM, int DQ_CHUNK, int QB>
__global__ void __launch_bounds__(WK *WD * 32, 1) fa2_bwd_main_kernel(const fa2_bwd_args a) {
    constexpr int KW = 16 * KR; /* keys per warp stripe */
    constexpr int BN = KW * WK, NWARPS = WK * WD, NT = NWARPS * 32;
    constexpr int QW = BM / WD; /* queries per warp in S^T, dP^T */
    constexpr int DW = D / WD;  /* dK, dV columns per warp */
    constexpr int WQN = NWARPS / WQM;
    constexpr int MW = BM / WQM; /* dQ rows per warp */
    constexpr int NWQ = D / WQN; /* dQ columns per warp */
    static_assert(WD == 1 || WD == 2 || WD == 4, "WD");
    static_assert(QW % 16 == 0 && DW % 16 == 0 && MW % 16 == 0 && NWQ % DQ_CHUNK == 0 && DQ_CHUNK % 16 == 0,
                  "tile shape");
    static_assert(NWARPS % WQM == 0, "warp split");
    static_assert((QB == 1 || QB == 2) && BM <= NT, "query buffers, LSE2 / D loads");
    typedef fa_elem<T> dt;

    extern __shared__ __align__(128) unsigned char bwd_smem[];
    constexpr int RD = D + 8, RM = BM + 8; /* padded row lengths: the allocation (a swizzled tile uses D of each RD) */
    T *sK = reinterpret_cast<T *>(bwd_smem);
    T *sV = sK + BN * RD;
    T *sQ = sV + BN * RD;       /* QB buffers */
    T *sdO = sQ + QB * BM * RD; /* QB buffers */
    T *sdS = sdO + QB * BM * RD;
    T *sP = sdS + BN * RM;                                                /* WD > 1 only */
    float *sLSE = reinterpret_cast<float *>(sP + (WD > 1 ? BN * RM : 0)); /* QB buffers */
    float *sDs = sLSE + QB * BM;                                          /* QB buffers */
    const uint32_t aK = fa_smem_addr(sK), aV = fa_smem_addr(sV), aQ = fa_smem_addr(sQ);
    const uint32_t adO = fa_smem_addr(sdO), adS = fa_smem_addr(sdS), aP = fa_smem_addr(sP);

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kw = warp % WK, wh = warp / WK;   /* key stripe; head-dim part of dK/dV and query part of S^T */
    const int wm = warp % WQM, wn = warp / WQM; /* dQ row and column block */
    const int g = lane >> 2, tq = lane & 3;
    const bwd_block cta = bwd_block_get(a);
    const int hk = cta.hk, b = cta.b;
    const bool varlen = a.cu_seqlens_q != nullptr;
    /* The sequence geometry lives in shared memory and is re-read where used: kept in registers across the
     * whole kernel it pushes loop invariants out to local memory. */
    __shared__ bwd_seq cta_seq;
    if (tid == 0) cta_seq = bwd_seq_get(a, b);
    __syncthreads();
    const bwd_seq &s = cta_seq;
#define BWD_OFF (s.len_k - s.len_q) /* query i sits at key position i + BWD_OFF */
    const int wl = a.window_left, wr = a.window_right;
    const bool has_softcap = a.softcap > 0.f, has_alibi = a.alibi_slopes != nullptr;
    /* deterministic: this CTA's own slice, which only it adds to, in program order */
    float *dq_accum = a.dq_accum + (a.deterministic ? blockIdx.x * a.dq_split_stride : 0);

    /* per-lane byte offsets of the ldmatrix patterns: lane l addresses row l % 8 of matrix l / 8 */
    const int c_l = lane >> 4, c_b = (lane >> 3) & 1;
    const int r_a = lane & 15, r_b = (lane & 7) + ((lane >> 4) << 3);
    /* K, V, Q, dO tiles: swizzled where the head dim is whole 128-byte segments (their cp.async fill aligned
     * lines, fa_smem_tile; on the H200 +3-5% at d = 64, +5-8% at d = 256, neutral at 128), else padded. frag()
     * needs the column groups of a warp's lane base carry-free. */
    constexpr bool kSwizzle = D % 64 == 0;
    static_assert(!kSwizzle || (WD <= 4 && WQN <= 4), "swizzled fragments: warp column groups within a segment");
    static_assert(!kSwizzle || (BN * RD * 2 % 128 == 0 && BM * RD * 2 % 128 == 0),
                  "swizzled tiles start 128-byte aligned (frag XORs bits 5-6 of the address)");
    typedef fa_smem_tile<BN, D, kSwizzle> td;
    typedef fa_smem_tile<BN, BM> tm;
    const uint32_t o_kv = td::offset(kw * KW + r_a, c_l);       /* A of S^T, dP^T: K, V rows kw*KW.. */
    const uint32_t o_qb = td::offset(wh * QW + r_b, c_b);       /* B of S^T, dP^T: Q, dO rows wh*QW.. */
    const uint32_t o_qt = td::offset(r_a, 2 * wh + c_l);        /* B of dV, dK: dO, Q transposed, groups WD*j + wh */
    const uint32_t o_pa = tm::offset(kw * KW + r_a, c_l);       /* A of dV, dK from P^T, dS^T (WD > 1) */
    const uint32_t o_da = tm::offset(r_b, wm * MW / 8 + c_b);   /* A of dQ: dS^T transposed, queries wm*MW.. */
    const uint32_t o_kt = td::offset(r_a, 2 * wn + c_l);        /* B of dQ: K transposed, groups WQN*j + wn */
    const uint32_t o_st = tm::offset(kw * KW + g, 0) + 4 * tq;  /* this thread's P^T, dS^T slot (row g, col 2 tq) */
    const uint32_t o_stq = o_st + tm::offset(0, wh * (QW / 8)); /* ... in the warp's first query column block */
    /* this lane's stmatrix row of the warp's P^T, dS^T block: matrix lane / 8 = (rows +8, columns +8) */
    const uint32_t o_sm = tm::offset(kw * KW + (lane & 7) + ((lane >> 3) & 1) * 8, wh * (QW / 8) + (lane >> 4));
    constexpr bool kStMatrix = QW >= 32; /* bwd_store_block */

    for (int nb = cta.nb; nb * BN < s.len_k; nb += gridDim.x) {
        const int n0 = nb * BN;
        const int n1 = min(n0 + BN, s.len_k);
        /* query rows that see at least one key of [n0, n1) */
        const int m_lo = wr >= 0 ? max(0, n0 - BWD_OFF - wr) : 0;
        const int m_hi = wl >= 0 ? min(s.len_q, n1 - BWD_OFF + wl) : s.len_q;
        const int mb_lo = m_lo / BM, mb_hi = m_hi > m_lo ? (m_hi + BM - 1) / BM : mb_lo;
        const int nmb = mb_hi - mb_lo, nsteps = nmb * a.group;
        /* The steps start at the query block level with this key block and wrap around: without a causal mask
         * every key block's CTA would otherwise add to the same dQ rows at the same time as its neighbours
         * (with one, the first visible query block already moves with the key block, and rot is about 0). */
        const int rot = FA2_BWD_ROTATE && nsteps > 0 ? max(0, n0 / BM - mb_lo) % nsteps : 0;

        __syncthreads(); /* the previous key block's last step is done with sK, sV, sdS */
        if (nsteps > 0) {
            bwd_load_tile<T, td, BN, NT>(aK, a.k, varlen, b, s.tok_k, n0, s.len_k, hk);
            bwd_load_tile<T, td, BN, NT>(aV, a.v, varlen, b, s.tok_k, n0, s.len_k, hk);
            bwd_load_step<T, td, BM, NT>(a, s, b, hk * a.group + rot / nmb, (mb_lo + rot % nmb) * BM, aQ, adO, sLSE,
                                         sDs);
        }
        fa_cp_async_commit();

        float dk[KR][DW / 8][4], dv[KR][DW / 8][4];
#pragma unroll
        for (int mr = 0; mr < KR; mr++)
#pragma unroll
            for (int j = 0; j < DW / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) dk[mr][j][e] = dv[mr][j][e] = 0.f;

        /* step t takes u = (t + rot) mod nsteps: query head hq, query block mb (the blocks of a head in order, then
         * the next head); hq and mb are derived from t (carried from step to step instead, they cost registers
         * that spill at d = 128) */
        for (int t = 0; t < nsteps; t++) {
            const int buf = QB == 2 ? t & 1 : 0;
            const int u = t + rot - (t + rot >= nsteps ? nsteps : 0);
            const int hq = hk * a.group + u / nmb, mb = mb_lo + u % nmb;
            const int m0 = mb * BM;
            const bool next_head = mb + 1 == mb_hi; /* step t + 1 starts the next head of the group */
            const int hq_next = u + 1 == nsteps ? hk * a.group : hq + next_head; /* (or wraps to the first) */
            fa_cp_async_wait<0>();
            __syncthreads(); /* step t's tiles have landed; step t-1 is done with the other buffer and sdS */
            if (QB == 2) {
                if (t + 1 < nsteps)
                    bwd_load_step<T, td, BM, NT>(a, s, b, hq_next, next_head ? mb_lo * BM : m0 + BM,
                                                 aQ + 2 * (buf ^ 1) * BM * RD, adO + 2 * (buf ^ 1) * BM * RD,
                                                 sLSE + (buf ^ 1) * BM, sDs + (buf ^ 1) * BM);
                fa_cp_async_commit();
            }

            const uint32_t aQb = aQ + 2 * buf * BM * RD, adOb = adO + 2 * buf * BM * RD;
            const float *lse2 = sLSE + buf * BM, *dsum = sDs + buf * BM;

            /* S^T = K Q^T: rows kw*KW.., columns (queries) wh*QW.. */
            float sacc[KR][QW / 8][4];
            bwd_rows_x_rows<T, td, D, KR, QW>(sacc, aK + o_kv, aQb + o_qb);

            /* P^T = exp2(S^T scale log2e - LSE2), masked on boundary blocks, kept in 16 bits: the dV product
             * takes it in 16 bits, and dS = P (dP - D) rounded to 16 bits loses nothing to it that matters.
             * With softcap the derivative 1 - tanh^2 waits in this thread's own dS^T slots (as f16). */
            uint32_t p16[KR][QW / 8][2];
            const uint32_t st_dS = fa_smem_addr(sdS), st_P = fa_smem_addr(sP);
            const bool need_mask = m0 + BM > s.len_q || n0 + BN > s.len_k ||
                                   (wr >= 0 && n0 + BN - 1 > m0 + BWD_OFF + wr) ||
                                   (wl >= 0 && n0 < m0 + BM - 1 + BWD_OFF - wl);
            if (!need_mask && !has_softcap && !has_alibi) {
#pragma unroll
                for (int j = 0; j < QW / 8; j++) {
                    const float2 l2 = *reinterpret_cast<const float2 *>(lse2 + wh * QW + j * 8 + 2 * tq);
#pragma unroll
                    for (int mr = 0; mr < KR; mr++) {
                        p16[mr][j][0] = dt::pack(fa_exp2(sacc[mr][j][0] * a.scale_log2 - l2.x),
                                                 fa_exp2(sacc[mr][j][1] * a.scale_log2 - l2.y));
                        p16[mr][j][1] = dt::pack(fa_exp2(sacc[mr][j][2] * a.scale_log2 - l2.x),
                                                 fa_exp2(sacc[mr][j][3] * a.scale_log2 - l2.y));
                    }
                }
            } else {
                const float slope_log2 = has_alibi ? a.alibi_slopes[b * a.alibi_batch_stride + hq] * FA_LOG2E : 0.f;
                const float cap_inv = a.softcap_arg;
                const float cap_log2 = a.softcap * FA_LOG2E;
                /* key - (query + offset) of element (mr = 0, j = 0, e = 0), and the visible range of that difference */
                const int dist0 = (n0 + kw * KW + g) - (m0 + wh * QW + 2 * tq + BWD_OFF);
                const int dlo = wl >= 0 ? -wl : INT_MIN, dhi = wr >= 0 ? wr : INT_MAX;
                const int rows_left = s.len_k - (n0 + kw * KW + g), cols_left = s.len_q - (m0 + wh * QW + 2 * tq);
#pragma unroll
                for (int j = 0; j < QW / 8; j++) {
                    const float2 l2 = *reinterpret_cast<const float2 *>(lse2 + wh * QW + j * 8 + 2 * tq);
#pragma unroll
                    for (int mr = 0; mr < KR; mr++) {
                        float p[4], dfac[4];
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int dr = mr * 16 + (e >> 1) * 8; /* key row offset of this element */
                            const int dist = dist0 + dr - j * 8 - (e & 1);
                            float x = sacc[mr][j][e];
                            dfac[e] = 1.f;
                            if (has_softcap) {
                                const float th = tanhf(x * cap_inv);
                                x = th * cap_log2;
                                dfac[e] = 1.f - th * th;
                            } else {
                                x *= a.scale_log2;
                            }
                            if (has_alibi) x -= slope_log2 * (float)abs(dist);
                            const bool visible =
                                dr < rows_left && j * 8 + (e & 1) < cols_left && dist >= dlo && dist <= dhi;
                            p[e] = visible ? fa_exp2(x - ((e & 1) ? l2.y : l2.x)) : 0.f;
                        }
                        p16[mr][j][0] = dt::pack(p[0], p[1]);
                        p16[mr][j][1] = dt::pack(p[2], p[3]);
                        if (has_softcap) {
                            const uint32_t o = o_st + tm::offset(mr * 16, wh * (QW / 8) + j);
                            bwd_st_shared_u32(st_dS + o, fa_elem<__half>::pack(dfac[0], dfac[1]));
                            bwd_st_shared_u32(st_dS + o + tm::offset(8, 0), fa_elem<__half>::pack(dfac[2], dfac[3]));
                        }
                    }
                }
            }
            if (WD > 1)
#pragma unroll
                for (int mr = 0; mr < KR; mr++)
#pragma unroll
                    for (int jp = 0; jp < QW / 16; jp++)
                        bwd_store_block<tm, kStMatrix>(st_P + o_sm, st_P + o_stq, mr, jp, p16[mr][2 * jp][0],
                                                       p16[mr][2 * jp][1], p16[mr][2 * jp + 1][0],
                                                       p16[mr][2 * jp + 1][1]);

            /* dP^T = V dO^T */
            float pacc[KR][QW / 8][4];
            bwd_rows_x_rows<T, td, D, KR, QW>(pacc, aV + o_kv, adOb + o_qb);

            /* dS^T = P^T (dP^T - D) [(1 - tanh^2)] (the softmax scale comes at the end), 16 bits, to shared
             * memory for the dQ product of the other warps */
            uint32_t ds16[KR][QW / 8][2];
#pragma unroll
            for (int jp = 0; jp < QW / 16; jp++) {
                float2 dd2[2];
#pragma unroll
                for (int u = 0; u < 2; u++)
                    dd2[u] = *reinterpret_cast<const float2 *>(dsum + wh * QW + (2 * jp + u) * 8 + 2 * tq);
#pragma unroll
                for (int mr = 0; mr < KR; mr++) {
#pragma unroll
                    for (int j = 2 * jp; j < 2 * jp + 2; j++) {
                        const float2 dd = dd2[j - 2 * jp];
                        const float2 p01 = dt::unpack(p16[mr][j][0]), p23 = dt::unpack(p16[mr][j][1]);
                        float ds[4] = { p01.x * (pacc[mr][j][0] - dd.x), p01.y * (pacc[mr][j][1] - dd.y),
                                        p23.x * (pacc[mr][j][2] - dd.x), p23.y * (pacc[mr][j][3] - dd.y) };
                        if (has_softcap) {
                            const uint32_t o = o_st + tm::offset(mr * 16, wh * (QW / 8) + j);
                            const float2 f01 = fa_elem<__half>::unpack(bwd_ld_shared_u32(st_dS + o));
                            const float2 f23 = fa_elem<__half>::unpack(bwd_ld_shared_u32(st_dS + o + tm::offset(8, 0)));
                            ds[0] *= f01.x, ds[1] *= f01.y, ds[2] *= f23.x, ds[3] *= f23.y;
                        }
                        ds16[mr][j][0] = dt::pack(ds[0], ds[1]);
                        ds16[mr][j][1] = dt::pack(ds[2], ds[3]);
                    }
                    /* (after the softcap factors of these slots have been read) */
                    bwd_store_block<tm, kStMatrix>(st_dS + o_sm, st_dS + o_stq, mr, jp, ds16[mr][2 * jp][0],
                                                   ds16[mr][2 * jp][1], ds16[mr][2 * jp + 1][0],
                                                   ds16[mr][2 * jp + 1][1]);
                }
            }
            /* dV += P^T dO, dK += dS^T Q: rows kw*KW.., column groups WD * np + wh, k = the BM queries, taken as
             * the WD query parts (wh + q) % WD, q = 0.. : part wh's A fragments are this warp's own P^T and dS^T
             * registers (no shared memory); the other parts come after the barrier. */
#pragma unroll
            for (int q = 0; q < WD; q++) {
                if (q == 1) __syncthreads(); /* P^T, dS^T of the other query parts are in shared memory */
                const int part = (wh + q) % WD;
                const uint32_t a_part = tm::offset(0, 2 * part * (QW / 16)), b_part = td::offset(part * QW, 0);
#pragma unroll
                for (int ks = 0; ks < QW / 16; ks++) {
                    uint32_t ap[KR][4], ad[KR][4];
#pragma unroll
                    for (int mr = 0; mr < KR; mr++) {
                        if (q == 0) {
                            ap[mr][0] = p16[mr][2 * ks][0], ap[mr][1] = p16[mr][2 * ks][1];
                            ap[mr][2] = p16[mr][2 * ks + 1][0], ap[mr][3] = p16[mr][2 * ks + 1][1];
                            ad[mr][0] = ds16[mr][2 * ks][0], ad[mr][1] = ds16[mr][2 * ks][1];
                            ad[mr][2] = ds16[mr][2 * ks + 1][0], ad[mr][3] = ds16[mr][2 * ks + 1][1];
                        } else {
                            fa_ldmatrix_x4(ap[mr], aP + o_pa + a_part + tm::offset(mr * 16, 2 * ks));
                            fa_ldmatrix_x4(ad[mr], adS + o_pa + a_part + tm::offset(mr * 16, 2 * ks));
                        }
                    }
#pragma unroll
                    for (int np = 0; np < DW / 16; np++) {
                        uint32_t bo[4], bq[4];
                        fa_ldmatrix_x4_trans(bo, td::frag(adOb + o_qt + b_part, ks * 16, 2 * WD * np));
#pragma unroll
                        for (int mr = 0; mr < KR; mr++) {
                            dt::mma(dv[mr][2 * np], ap[mr], bo[0], bo[1]);
                            dt::mma(dv[mr][2 * np + 1], ap[mr], bo[2], bo[3]);
                        }
                        fa_ldmatrix_x4_trans(bq, td::frag(aQb + o_qt + b_part, ks * 16, 2 * WD * np));
#pragma unroll
                        for (int mr = 0; mr < KR; mr++) {
                            dt::mma(dk[mr][2 * np], ad[mr], bq[0], bq[1]);
                            dt::mma(dk[mr][2 * np + 1], ad[mr], bq[2], bq[3]);
                        }
                    }
                }
            }
            if (WD == 1 || QB == 1)
                __syncthreads(); /* dS^T of every warp is in shared memory; QB = 1: every warp is done with Q, dO */
            else
                __syncwarp(); /* keeps the compiler from interleaving the two products (register pressure) */
            /* QB = 1: the next step's loads into the only buffer, under the dQ product */
            if (QB == 1) {
                if (t + 1 < nsteps)
                    bwd_load_step<T, td, BM, NT>(a, s, b, hq_next, next_head ? mb_lo * BM : m0 + BM, aQ, adO, sLSE,
                                                 sDs);
                fa_cp_async_commit();
            }

            /* dQ (BM x D) += dS K: warp (wm, wn) owns rows wm*MW.. and column groups WQN * j + wn. This thread adds
             * to rows qrow + 8 k (k = 2 mt + hi), which lie 8 k token rows, i.e. k blocks of dQaccum, after its
             * first; the addresses are set up once per step (fa2_bwd_dq_index). */
            const int qrow = m0 + wm * MW + g, rows_left = s.len_q - qrow;
            const int64_t qtok = s.tok_q + qrow;
            float *const dq_thread = dq_accum + fa2_bwd_dq_index(qtok, hq, 16 * wn + 2 * tq, a.heads_q, D);

#pragma unroll
            for (int ch = 0; ch < NWQ / DQ_CHUNK; ch++) {
                constexpr int NG = DQ_CHUNK / 16; /* column groups per chunk */
                float qacc[MW / 16][2 * NG][4];
#pragma unroll
                for (int mt = 0; mt < MW / 16; mt++)
#pragma unroll
                    for (int nt = 0; nt < 2 * NG; nt++)
#pragma unroll
                        for (int e = 0; e < 4; e++) qacc[mt][nt][e] = 0.f;
#pragma unroll
                for (int kk = 0; kk < BN / 16; kk++) {
                    uint32_t as[MW / 16][4];
#pragma unroll
                    for (int mt = 0; mt < MW / 16; mt++)
                        fa_ldmatrix_x4_trans(as[mt], adS + o_da + tm::offset(kk * 16, 2 * mt));
#pragma unroll
                    for (int j = 0; j < NG; j++) {
                        uint32_t bk[4];
                        fa_ldmatrix_x4_trans(bk, td::frag(aK + o_kt, kk * 16, 2 * WQN * (ch * NG + j)));
#pragma unroll
                        for (int mt = 0; mt < MW / 16; mt++) {
                            dt::mma(qacc[mt][2 * j], as[mt], bk[0], bk[1]);
                            dt::mma(qacc[mt][2 * j + 1], as[mt], bk[2], bk[3]);
                        }
                    }
                }
                /* fp32 reductions (fire and forget) of the thread's four values of each 16-column group, adjacent
                 * in dQaccum's column order (fa2_bwd_dq_pos); the same thread adds to a given element in every
                 * step, so with a private slice per CTA (deterministic mode) the order of the additions is fixed */
#pragma unroll
                for (int mt = 0; mt < MW / 16; mt++)
#pragma unroll
                    for (int hi = 0; hi < 2; hi++) {
                        if (mt * 16 + hi * 8 >= rows_left) continue;
                        float *dst = dq_thread + (int64_t)((2 * mt + hi) * 8 * D) * a.heads_q;
#pragma unroll
                        for (int j = 0; j < NG; j++) {
                            float *p = dst + fa2_bwd_dq_index(0, 0, 16 * WQN * (ch * NG + j), a.heads_q, D);
                            const float4 v = make_float4(qacc[mt][2 * j][2 * hi], qacc[mt][2 * j][2 * hi + 1],
                                                         qacc[mt][2 * j + 1][2 * hi], qacc[mt][2 * j + 1][2 * hi + 1]);
#if __CUDA_ARCH__ >= 900
                            atomicAdd(reinterpret_cast<float4 *>(p), v);
#else
                            atomicAdd(p, v.x);
                            atomicAdd(p + 1, v.y);
                            atomicAdd(p + 2, v.z);
                            atomicAdd(p + 3, v.w);
#endif
                        }
                    }
            }
        }
        fa_cp_async_wait<0>();

        /* dK (times the softmax scale) and dV: rows kw*KW + mr*16 + g (+8), column groups WD * np + wh */
        T *gdK = (T *)a.dk.data, *gdV = (T *)a.dv.data;
#pragma unroll
        for (int mr = 0; mr < KR; mr++)
#pragma unroll
            for (int hi = 0; hi < 2; hi++) {
                const int r = n0 + kw * KW + mr * 16 + g + hi * 8;
                if (r >= s.len_k) continue;
                const int64_t ko = bwd_row(a.dk, varlen, b, s.tok_k, r, hk) + 16 * wh + 2 * tq;
                const int64_t vo = bwd_row(a.dv, varlen, b, s.tok_k, r, hk) + 16 * wh + 2 * tq;
#pragma unroll
                for (int j = 0; j < DW / 8; j++) {
                    const int col = 16 * WD * (j / 2) + 8 * (j % 2);
                    *reinterpret_cast<uint32_t *>(gdK + ko + col) =
                        dt::pack(dk[mr][j][2 * hi] * a.scale, dk[mr][j][2 * hi + 1] * a.scale);
                    *reinterpret_cast<uint32_t *>(gdV + vo + col) = dt::pack(dv[mr][j][2 * hi], dv[mr][j][2 * hi + 1]);
                }
            }
    }
#undef BWD_OFF
}

/* The main kernel of tile configuration I (an index into fa2_bwd_tiles). */
template <typename T, int I>
static fa_status fa2_bwd_launch_main(const fa2_bwd_args *a, int key_blocks, cudaStream_t st) {
    constexpr fa2_bwd_tile c = fa2_bwd_tiles[I];
    void (*kernel)(const fa2_bwd_args) = fa2_bwd_main_kernel<T, c.d, c.bm, c.kr, c.wk, c.wd, c.wqm, c.dq_chunk, c.qb>;
    const size_t smem = fa2_bwd_smem_bytes(c);
    fa_status st1 = fa_cuda_status(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem),
                                   "fa2 backward shared memory attribute");
    if (st1 != FA_OK) return st1;
    const dim3 grid(a->deterministic ? a->nsplit : key_blocks, a->heads_kv, a->batch);
    kernel<<<grid, fa2_bwd_threads(c), smem, st>>>(*a);
    return fa_cuda_status(cudaGetLastError(), "fa2 backward main launch");
}

/* Instantiates the main kernel for the rows I.. of fa2_bwd_tiles that belong to head dim D and launches row tile. */
template <typename T, int D, int I>
static fa_status fa2_bwd_launch_tile(const fa2_bwd_args *a, int tile, int key_blocks, cudaStream_t st) {
    if constexpr (I == FA2_BWD_NTILES) {
        return fa_fail(FA_ERR_INTERNAL, "fa2 backward: tile %d is not one of head_dim %d", tile, D);
    } else {
        if constexpr (fa2_bwd_tiles[I].d == D)
            if (tile == I) return fa2_bwd_launch_main<T, I>(a, key_blocks, st);
        return fa2_bwd_launch_tile<T, D, I + 1>(a, tile, key_blocks, st);
    }
}

/* Launches the three kernels for one head dim and dtype with tile configuration tile (dQaccum already zeroed). */
template <typename T, int D>
static fa_status fa2_bwd_launch(const fa2_bwd_args *a, int tile, int key_blocks, cudaStream_t st) {
    const dim3 rows_grid((a->seqlen_q + 63) / 64, a->heads_q, a->batch);
    if (a->seqlen_q > 0) {
        fa2_bwd_preprocess_kernel<T, D, false><<<rows_grid, 256, 0, st>>>(*a);
        fa_status st0 = fa_cuda_status(cudaGetLastError(), "fa2 backward preprocess launch");
        if (st0 != FA_OK) return st0;
    }
    if (key_blocks > 0) {
        fa_status st1 = fa2_bwd_launch_tile<T, D, 0>(a, tile, key_blocks, st);
        if (st1 != FA_OK) return st1;
    }
    if (a->seqlen_q > 0) {
        fa2_bwd_convert_dq_kernel<T, D><<<rows_grid, 256, 0, st>>>(*a);
        return fa_cuda_status(cudaGetLastError(), "fa2 backward convert launch");
    }
    return FA_OK;
}

#endif /* __CUDACC__ */

/* One per instantiation file: launch for head dim D with the dtype of a (f16 or bf16) and tile configuration
 * tile (an index into fa2_bwd_tiles). */
#define FA2_BWD_DECLARE_LAUNCH(D) \
    fa_status fa2_bwd_launch_hdim##D(const fa2_bwd_args *a, fa_dtype dtype, int tile, int key_blocks, cudaStream_t st)
#define FA2_BWD_DECLARE_ONE(D) FA2_BWD_DECLARE_LAUNCH(D);
FA_HDIMS(FA2_BWD_DECLARE_ONE)
#undef FA2_BWD_DECLARE_ONE

#endif /* FLASHATTN_CUDA_FA2_BWD_CUH */
