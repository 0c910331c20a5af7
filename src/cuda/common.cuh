/* SPDX-License-Identifier: Apache-2.0 */
/*
 * common.cuh - device functions shared by the CUDA kernels (sm_80+): 16-bit element types and the tensor-core
 * mma.sync m16n8k16 (fp32 accumulate), ldmatrix, cp.async, padded (and XOR-swizzled) shared-memory tiles,
 * warp reductions, exp2 and conversions, the grid-dependency controls. Everything is static inline; nothing here
 * allocates or launches.
 *
 * Fragment layouts of mma.sync m16n8k16 (lane = thread % 32, g = lane / 4, t = lane % 4); each 32-bit register
 * holds two 16-bit values, the lower column (or k) index in the low half:
 *   A (16 x 16, row-major):  a0 = (row g,   k 2t..2t+1)   a1 = (row g+8, k 2t..2t+1)
 *                            a2 = (row g,   k 2t+8..+9)   a3 = (row g+8, k 2t+8..+9)
 *   B (16 x 8, k by n):      b0 = (k 2t..2t+1, col g)     b1 = (k 2t+8..+9, col g)
 *   C (16 x 8, fp32):        c0, c1 = (row g, cols 2t, 2t+1)   c2, c3 = (row g+8, cols 2t, 2t+1)
 * The C fragments of two adjacent n8 tiles, converted to 16 bits, are exactly an A fragment (a0 = c0,c1 of the
 * first tile, a1 = c2,c3 of the first, a2/a3 the same of the second): that is how P goes from the QK^T
 * accumulator to the PV operand without shared memory.
 *
 * Shared-memory tiles (fa_smem_tile) either pad each row by 16 bytes (ldmatrix free of bank conflicts with plain
 * row-major addressing) or XOR-swizzle 16-byte chunks within 128-byte segments (cp.async also fills aligned
 * lines); the kernels choose per head dim.
 */
#ifndef FLASHATTN_CUDA_COMMON_CUH
#define FLASHATTN_CUDA_COMMON_CUH

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

#define FA_LOG2E 1.4426950408889634f
#define FA_LN2   0.6931471805599453f

/* ---- 16-bit element types: conversions and the matching mma instruction ---- */

template <typename T>
struct fa_elem;

template <>
struct fa_elem<__half> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __half2 h = __floats2half2_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ float2 unpack(uint32_t u) {
        return __half22float2(*reinterpret_cast<__half2 *>(&u));
    }
    static __device__ __forceinline__ float to_float(__half x) {
        return __half2float(x);
    }
    static __device__ __forceinline__ __half from_float(float x) {
        return __float2half_rn(x);
    }
    /* c += a * b (16x16 by 16x8, fp32 accumulators). */
    static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

template <>
struct fa_elem<__nv_bfloat16> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *reinterpret_cast<uint32_t *>(&h);
    }
    static __device__ __forceinline__ float2 unpack(uint32_t u) {
        return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162 *>(&u));
    }
    static __device__ __forceinline__ float to_float(__nv_bfloat16 x) {
        return __bfloat162float(x);
    }
    static __device__ __forceinline__ __nv_bfloat16 from_float(float x) {
        return __float2bfloat16_rn(x);
    }
    static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
                     "{%8,%9}, {%0,%1,%2,%3};\n"
                     : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

/* ---- shared memory: addresses, ldmatrix ---- */

static __device__ __forceinline__ uint32_t fa_smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* Four 8x8 16-bit matrices: lane l gives the address of row l % 8 of matrix l / 8 (16 contiguous bytes), and
 * register i receives matrix i as (row lane / 4, columns 2 (lane % 4), +1). The .trans form receives the
 * transpose: (row 2 (lane % 4), +1 of column lane / 4), which turns row-major K-by-N data into B fragments. */
static __device__ __forceinline__ void fa_ldmatrix_x4(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
static __device__ __forceinline__ void fa_ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(addr));
}
/* Two matrices: lanes 0-15 give the addresses (matrix l / 8). */
static __device__ __forceinline__ void fa_ldmatrix_x2(uint32_t (&r)[2], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(addr));
}
static __device__ __forceinline__ void fa_ldmatrix_x2_trans(uint32_t (&r)[2], uint32_t addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1])
                 : "r"(addr));
}

#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
/* sm_90: the inverse of fa_ldmatrix_x4: lane l gives the address of row l % 8 of matrix l / 8, and register i
 * of each lane holds matrix i as (row lane / 4, columns 2 (lane % 4), +1), i.e. a 16-bit C-fragment pair. */
static __device__ __forceinline__ void fa_stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                                      uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(r0), "r"(r1),
                 "r"(r2), "r"(r3)
                 : "memory");
}
/* fa_stmatrix_x4 storing each matrix transposed: lane l's address is that of row l % 8 of matrix l / 8 as stored,
 * i.e. of column l % 8 of the matrix as the registers hold it. */
static __device__ __forceinline__ void fa_stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2,
                                                            uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1,%2,%3,%4};\n" ::"r"(addr), "r"(r0), "r"(r1),
                 "r"(r2), "r"(r3)
                 : "memory");
}
#endif

/* ---- cp.async (global -> shared without registers), groups ---- */

#ifndef FA_CP_ASYNC_UNROLL_MAX
#define FA_CP_ASYNC_UNROLL_MAX 8 /* fa_cp_async_tile */
#endif

/* 16-byte copy; valid = false reads nothing and fills the 16 destination bytes with zeros (src must still be a
 * mapped address: pass the tensor's base). .cg: cache in L2 only; a block never re-reads what it copied.
 * .L2::128B: L2 fetches whole 128-byte lines (a warp's copies cover whole lines; ncu counted 1.5x the ideal L2
 * sectors for these copies without it; +0.5-1% at d = 256 on the H200). */
static __device__ __forceinline__ void fa_cp_async_16(uint32_t dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(valid ? 16 : 0));
}
static __device__ __forceinline__ void fa_cp_async_commit(void) {
    asm volatile("cp.async.commit_group;\n" ::);
}
/* Waits until at most N of this thread's committed groups are still in flight. Other threads' copies are
 * visible only after a barrier (__syncthreads) that follows every thread's wait. */
template <int N>
static __device__ __forceinline__ void fa_cp_async_wait(void) {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* ---- shared-memory tiles of 16-bit elements ---- */

/* A kRows x kCols tile of 16-bit elements (kCols a multiple of 8) in one of two layouts:
 *   padded (kSwizzle = false): each row padded by 16 bytes. The row stride is then 4 banks (mod 32) away from
 *     a multiple of 128 bytes, so the 8 rows an ldmatrix reads at one 16-byte chunk fall in distinct banks, and
 *     every fragment address is a per-lane base plus a compile-time constant.
 *   swizzled (kSwizzle, kCols a multiple of 64): unpadded rows; in each 128-byte segment of a row the 16-byte
 *     chunk index is XORed with row % 8, which spreads the same 8 rows over the banks instead. A warp's cp.async
 *     of whole segments then fills aligned 128-byte lines: into padded rows each such warp instruction costs
 *     ~10 shared-memory wavefronts on the H200 where 4 would do (ncu).
 * frag(base, R, C) is the address of (r + R, c + C) given base = the tile + offset(r, c), for, with the swizzle,
 * r % 8 + R % 8 carry-free (R a multiple of 8, or r below R's lowest set bit), C even and the lane's
 * c = 2 w + (0 or 1) with w + C / 2 carry-free (w's bits below C / 2's lowest set bit): then the swizzle of R
 * and C is one XOR on bits 4-6 of the base. */
template <int ROWS, int COLS, bool kSwizzle = false>
struct fa_smem_tile {
    static_assert(COLS % 8 == 0, "tile width must be a multiple of 8 elements");
    static_assert(!kSwizzle || COLS % 64 == 0, "swizzled tiles: whole 128-byte segments");
    static constexpr int kRows = ROWS, kCols = COLS;
    static constexpr bool kSwizzled = kSwizzle;
    static constexpr int kRowBytes = kSwizzle ? kCols * 2 : kCols * 2 + 16;
    static constexpr int kBytes = kRows * kRowBytes;
    static constexpr int kChunks = kCols / 8; /* 16-byte chunks per row */

    /* Byte offset of 16-byte chunk `chunk` of row `row`. */
    static __device__ __forceinline__ uint32_t offset(int row, int chunk) {
        if (kSwizzle) return (uint32_t)(row * kRowBytes + ((chunk & ~7) | ((chunk ^ row) & 7)) * 16);
        return (uint32_t)(row * kRowBytes + chunk * 16);
    }
    static __device__ __forceinline__ uint32_t frag(uint32_t base, int R, int C) {
        if (kSwizzle) return (base ^ (uint32_t)(((R & 7) ^ (C & 6)) << 4)) + (uint32_t)(R * kRowBytes + (C & ~7) * 16);
        return base + offset(R, C);
    }
};

/* Copies rows [0, rows of TL) of a row-major 16-bit global tile (row r at src + r * row_stride, contiguous
 * elements) into the shared-memory tile TL (an fa_smem_tile) at smem address dst, with cp.async from kThreads
 * threads. Rows >= rows_valid are zero-filled and not read. Commits nothing: the caller groups copies.
 * Needs rows * row_stride < 2^31 (a thread's offset inside the tile is 32-bit: keeping registers for 64-bit
 * per-thread addresses alive across a kernel's main loop costs spills). */
template <typename TL, int kThreads, typename T>
static __device__ __forceinline__ void fa_cp_async_tile(uint32_t dst, const T *src, int64_t row_stride, int rows_valid,
                                                        int tid) {
    constexpr int kRows = TL::kRows;
    constexpr int kTotal = kRows * TL::kChunks;
    static_assert(kTotal % kThreads == 0, "tile chunks must divide evenly among the threads");
    if constexpr (kThreads % TL::kChunks == 0) {
        /* Each thread copies one chunk column, every kStep-th row. The loop stays rolled: unrolled, the
         * compiler keeps one address per copy alive. */
        constexpr int kStep = kThreads / TL::kChunks;
        static_assert((kStep & (kStep - 1)) == 0, "a power-of-two row step (swizzled rows: row0 + i kStep carry-free)");
        const int row0 = tid / TL::kChunks, chunk = tid % TL::kChunks;
        const uint32_t s = dst + TL::offset(row0, chunk);
        const T *g = src + (row0 * (int32_t)row_stride + chunk * 8);
        const int64_t step = kStep * row_stride;
        /* A whole tile of at most FA_CP_ASYNC_UNROLL_MAX copies per thread: unrolled, without row checks (the
         * FA2 forward on the H200: +5% at d = 64 with 4 copies, +2-4% at d = 128 with 8). With 16 (d = 256) the
         * unrolled addresses crowd the registers: -10%. */
        if constexpr (kTotal / kThreads <= FA_CP_ASYNC_UNROLL_MAX)
            if (rows_valid >= kRows) {
#pragma unroll
                for (int i = 0; i < kTotal / kThreads; i++) {
                    fa_cp_async_16(TL::frag(s, i * kStep, 0), g, true);
                    g += step;
                }
                return;
            }
        /* (stepping a swizzled row address kStep rows at a time: kStep % 8 in {0, 4} keeps (row0 + i kStep) % 8
         * = row0 % 8 ^ (i kStep) % 8 one XOR per step) */
        static_assert(!TL::kSwizzled || kStep % 4 == 0, "swizzled rows: a row step of 4 or a multiple of 8");
        int left = rows_valid - row0; /* rows left for this thread, counting from its current row */
        uint32_t si = s;
#pragma unroll 1
        for (int i = 0; i < kTotal / kThreads; i++) {
            fa_cp_async_16(si, left > 0 ? g : src, left > 0);
            si = TL::frag(si, kStep, 0);
            g += step;
            left -= kStep;
        }
    } else {
#pragma unroll
        for (int i = 0; i < kTotal / kThreads; i++) {
            const int idx = tid + i * kThreads;
            const int row = idx / TL::kChunks;
            const int chunk = idx % TL::kChunks;
            const bool valid = row < rows_valid;
            fa_cp_async_16(dst + TL::offset(row, chunk), valid ? src + (row * (int32_t)row_stride + chunk * 8) : src,
                           valid);
        }
    }
}

/* The copies of one whole tile (every row valid) issued a few at a time between other instructions, e.g. one
 * group per k step of a product. A cp.async reads its address registers only when the memory pipe takes it, so
 * whatever next writes those registers (an address update, or ptxas reusing them for an ldmatrix) waits for
 * that (long-scoreboard stalls). Two thread splits:
 *   kPtrs > 0  fa_cp_async_tile's split (one chunk column per thread, every kStep-th row); kPtrs row addresses
 *              take turns, each advanced kPtrs row steps after its copy, so that update comes kPtrs copies later.
 *   kPtrs < 0  slabs: a thread copies one chunk of each 64-column slab of a row (chunks c, c + 8, ..), all from
 *              one address with immediate offsets (as are the shared-memory ones), and a row's copies go out
 *              together: a quarter of the address arithmetic and of the moves into aligned register pairs,
 *              and a warp instruction still covers whole 128-byte lines (4 rows x 128 bytes). */
template <typename TL, int kThreads, int kPtrs, typename T>
struct fa_cp_async_stream {
    typedef TL tile;
    static constexpr int kRows = TL::kRows, kCols = TL::kCols;
    static constexpr bool kSlabs = kPtrs < 0;
    static constexpr int kPerRow = kSlabs ? kCols / 64 : 1; /* copies per row and thread */
    static constexpr int kTPR = kSlabs ? 8 : tile::kChunks; /* threads per row */
    static_assert(!kSlabs || kCols % 64 == 0, "slabs: whole 64-column slabs");
    static_assert(kThreads % kTPR == 0 && kRows % (kThreads / kTPR) == 0, "stream split");
    static constexpr int kStep = kThreads / kTPR; /* rows between a thread's rows */
    static_assert((kStep & (kStep - 1)) == 0, "a power-of-two row step (swizzled rows: row0 + i kStep carry-free)");
    static constexpr int kCopies = kRows / kStep * kPerRow; /* per thread */
    uint32_t s;
    const T *g[kPtrs > 0 ? kPtrs : 1];
    int64_t step;     /* kPtrs row steps */
    int32_t row_step; /* slabs: kStep rows */

    __device__ __forceinline__ void init(uint32_t dst, const T *src, int64_t row_stride, int tid) {
        const int row0 = tid / kTPR, chunk = tid % kTPR;
        s = dst + tile::offset(row0, chunk);
        if constexpr (kSlabs) {
            g[0] = src + (row0 * (int32_t)row_stride + chunk * 8);
            row_step = kStep * (int32_t)row_stride;
        } else {
#pragma unroll
            for (int r = 0; r < kPtrs; r++) g[r] = src + ((row0 + r * kStep) * (int32_t)row_stride + chunk * 8);
            step = kPtrs * kStep * row_stride;
        }
    }
    /* Copy i (a compile-time constant after unrolling; copies must be issued in order 0, 1, ..). */
    __device__ __forceinline__ void copy(int i) {
        if constexpr (kSlabs) {
            const int r = i / kPerRow, j = i % kPerRow;
            fa_cp_async_16(tile::frag(s, r * kStep, j * 8), g[0] + r * row_step + j * 64, true);
        } else {
            fa_cp_async_16(tile::frag(s, i * kStep, 0), g[i % kPtrs], true);
            g[i % kPtrs] += step;
        }
    }
    /* The copies that belong to step `at` of a loop of `steps`: a thread's row r (its kPerRow copies) at step
     * r * steps / rows; steps at or past `steps` issue none, so a smaller `steps` front-loads the copies into a
     * longer loop. */
    __device__ __forceinline__ void copies_at(int at, int steps) {
        constexpr int kRowsPerThread = kCopies / kPerRow;
#pragma unroll
        for (int i = 0; i < kCopies; i++)
            if (i / kPerRow * steps / kRowsPerThread == at) copy(i);
    }
};

/* ---- programmatic dependent launch (sm_90; no-ops before) ---- */

/* A kernel launched with programmatic stream serialization may be resident while the kernel before it in the
 * stream finishes: it waits here, before its first access to global memory, until that kernel has completed and
 * its writes are visible. */
static __device__ __forceinline__ void fa_grid_dependency_wait(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
/* Lets the next kernel in the stream (launched as above) be scheduled once every block of this grid has passed
 * here or exited; it still waits for this grid's completion before touching memory. */
static __device__ __forceinline__ void fa_grid_launch_dependents(void) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

/* ---- launch order ---- */

/* A grid (x, y, z) whose x blocks of one (y, z) pair differ in work (the query or key blocks of a head under a
 * causal mask) runs in launch order, x fastest: each pair's blocks in turn, so the last pair's longest block
 * starts near the end of the grid. Remapped, the (y, z) pairs go in chunks of chunk_pairs and each chunk's
 * blocks go rank by rank over its pairs: rank 0 (the caller's longest) of every pair of the chunk first, so that
 * the grid's tail is short blocks, while a chunk's pairs stay few enough for their data to stay in L2. This
 * block's rank and pair (y + ny z) for nx = gridDim.x, ny = gridDim.y, cp = chunk_pairs; cp = 1 is launch order
 * (callers take blockIdx directly then). */
struct fa_grid_slot {
    int rank, pair;
};
static __device__ __forceinline__ fa_grid_slot fa_chunked_order(int nx, int ny, int cp) {
    const int pairs = ny * gridDim.z, id = blockIdx.x + nx * (blockIdx.y + ny * blockIdx.z);
    const int chunk = id / (nx * cp), r = id - chunk * nx * cp;
    const int np = min(cp, pairs - chunk * cp); /* pairs in this chunk */
    fa_grid_slot g;
    g.rank = r / np;
    g.pair = chunk * cp + (r - g.rank * np);
    return g;
}

/* ---- reductions over the 4 lanes of a quad (one mma row) and over a warp ---- */

static __device__ __forceinline__ float fa_quad_max(float x) {
    x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 1));
    return fmaxf(x, __shfl_xor_sync(0xffffffffu, x, 2));
}
static __device__ __forceinline__ float fa_quad_sum(float x) {
    x += __shfl_xor_sync(0xffffffffu, x, 1);
    return x + __shfl_xor_sync(0xffffffffu, x, 2);
}
static __device__ __forceinline__ float fa_warp_max(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, o));
    return x;
}
static __device__ __forceinline__ float fa_warp_sum(float x) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
    return x;
}

/* ---- masks ---- */

/* Whether query row i of a sequence of len_q queries and len_k keys sees any key under the bottom-right
 * aligned window (-1 = unbounded; causal is window_right = 0). A row is empty by this alone, never by its
 * scores: a row sum that is 0 or NaN belongs to a row of non-finite scores, which is NaN (flashattn.h). */
static __device__ __forceinline__ bool fa_row_sees_key(int64_t i, int64_t len_q, int64_t len_k, int window_left,
                                                       int window_right) {
    const int64_t diag = i + len_k - len_q;
    const int64_t lo = window_left < 0 ? 0 : max(diag - window_left, (int64_t)0);
    const int64_t hi = window_right < 0 ? len_k : min(diag + window_right + 1, len_k);
    return lo < hi;
}

/* ---- math ---- */

/* 2^x in one MUFU op (about 2 ulp; flushes denormal results to 0, so 2^-inf = 0). */
static __device__ __forceinline__ float fa_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

#endif /* FLASHATTN_CUDA_COMMON_CUH */
