/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fa3_fwd.cuh - the FlashAttention-3 forward kernel for Hopper (sm_90a) and its launcher, included by the
 * per-head-dim instantiation files fa3_fwd_hdim*.cu.
 *
 * A persistent grid (one CTA per SM) walks tiles of kBlockM = 64 * NWG query rows of one (batch, head); tiles
 * come from an atomic counter (or round robin) in head-major order (under a causal mask each head's longest
 * first; where a head's first tile has a single warpgroup's rows, every head's first tile after all the
 * others: fa3_sched::claim_order), or under a causal mask above 1k queries longest first across the heads of an
 * L2-sized section (fa3_sched::tile_get; the host chooses, longest_first_section). With three consumer warpgroups a
 * warpgroup whose 64 rows lie outside the sequence skips the tile (fa3_idle_tile), and under a causal mask the
 * tiles end at the last query, so that the partial tile is the first, shortest one. In a CTA:
 *   warpgroup 0  producer: one thread fetches the next tile index (with three consumer warpgroups it also
 *                publishes the tile's geometry) and issues TMA loads of Q (once per tile)
 *                and of K and V blocks into a two-stage ring; each load completes on a "full" mbarrier with
 *                expected transaction bytes, and a slot is refilled once the consumers have arrived on its
 *                "empty" mbarrier. The ring runs on across tiles, so the next tile's first K block and Q are
 *                in flight while the consumers finish the current one.
 *   warpgroups 1..NWG  consumers: 64 query rows each. S = Q K^T with wgmma, K from shared memory and Q from
 *                shared memory or (QRS) from registers, loaded once per tile (then the Q tile is free for the
 *                next tile's Q at once, and the tensor cores read a third fewer shared-memory bytes per Q K^T);
 *                online softmax on the accumulator fragment, P converted in registers to the A operand of
 *                O += P V (wgmma with V from shared memory, MN-major). setmaxnreg moves registers from producer
 *                to consumers. With three consumer warpgroups a block after the tile's first takes its softmax
 *                against the max its rows already have, unless the row sums show that the max grew
 *                (fa3_softmax_stale; then S is computed again with mma.sync, K read from global memory).
 *   OVERLAP      the next block's Q K^T is issued before the current block's softmax (two-stage pipeline
 *                inside a warpgroup). Blocks that need neither mask nor softcap run in pairs whose ring stages
 *                are compile-time constants (fa3_overlap_fast; with three consumer warpgroups also a lone one),
 *                so that their wgmma descriptors stay on the uniform datapath; the others take the general step
 *                (fa3_overlap_step with KST < 0).
 *   PINGPONG     named barriers order the GEMM issue of the consumer warpgroups round robin, so that one
 *                warpgroup's softmax runs while another's GEMMs occupy the tensor cores.
 *   GENERAL      softcap, left window edges and varlen batches are handled; head dims 64 and 256 also have
 *                kernels for dense batches without the other two, which need fewer registers (fa3_launch); ALiBi
 *                is an instance of its own of the general kernel (FA3_GENERAL_ALIBI).
 * Epilogue: O / l converted to 16 bits into shared memory (swizzled as TMA expects: a buffer of its own where
 * shared memory allows, else the warpgroup's Q tile) and written with a TMA store; varlen tiles that reach past
 * their sequence store rows directly so that the next sequence's rows are never touched. LSE is written from
 * registers.
 *
 * Shared-memory tiles are [D / 64 slabs][rows][64 elements] with the 128-byte swizzle, each 1024-byte aligned.
 * Tensor maps are 5-D {64, rows, D / 64, heads, batch} (batch = 1 and rows = packed tokens for varlen), so
 * one TMA moves a whole [rows x D] tile.
 *
 * Parts: fa3_cfg (tile shapes, shared-memory layout, register split, what differs with three consumer
 * warpgroups), fa3_bar_layout (every barrier's offset, the area's size, initialisation), fa3_pipe (the stage
 * and barrier parity of a ring's use number), fa3_sched (tile order and claims); for the producer fa3_producer
 * (fa3_publish_tile, fa3_load_tile) and fa3_v_fixer; for the consumers fa3_consumer_tile, fa3_mask_info_make,
 * fa3_overlap_tile (fa3_overlap_first, fa3_overlap_blocks, fa3_overlap_tail, fa3_skip_blocks) or fa3_plain_tile,
 * fa3_idle_tile, and the epilogue fa3_finalize, fa3_store_lse, fa3_store_o. ptxas's register allocation follows
 * the numbering of the PTX registers, which follows the order of the compiler's intermediate code: the use
 * counters are plain ints passed by reference (fa3_load_tile), and the arrays a part fills for the kernel
 * (fa3_finalize's inv and lse) are the kernel's, so that the default kernels' SASS is what it was with these
 * parts inline.
 */
#ifndef FLASHATTN_CUDA_FA3_FWD_CUH
#define FLASHATTN_CUDA_FA3_FWD_CUH

#include <cuda.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdlib.h>

#include "cuda/fa3_wgmma.cuh"
#include "cuda/hopper.cuh"
#include "cuda/kernels.h"

/* x / d for 0 <= x < 2^31 and 1 <= d < 2^31 by a multiply-high with a magic number made on the host
 * (fa3_divisor_make). The GPU has no integer divide instruction: x / d by a run-time d takes a reciprocal from
 * the MUFU pipe, where it queues behind the other warpgroups' softmax exponentials. */
struct fa3_divisor {
    unsigned m, l;
};
static inline fa3_divisor fa3_divisor_make(int d) {
    fa3_divisor v;
    v.l = 0;
    while ((1ull << v.l) < (unsigned long long)d) ++v.l;
    v.m = (unsigned)((((1ull << 32) * ((1ull << v.l) - (unsigned long long)d)) / (unsigned long long)d) + 1);
    return v;
}

/* What the kernel needs besides the tensor maps. */
struct fa3_args {
    int seqlen_q, seqlen_k; /* dense lengths; varlen: unused (read from cu_q / cu_k) */
    int heads_q;
    int group;        /* heads_q / heads_kv */
    int num_m_blocks; /* query blocks per (batch, head) */
    int reverse_m;    /* 1: a head's tiles take its query blocks from the last (the longest under a causal mask) */
    int align_end;    /* 1: a sequence's query tiles end at its last 64 rows, so that a partial tile is the first */
    int section;      /* > 0: tiles go m-major through sections of this many (batch, head) pairs; 0: head-major */
    const int32_t *cu_q, *cu_k;
    float scale_log2;  /* multiplies S (or tanh(S * softcap_pre) with softcap) inside exp2 */
    float softcap_pre; /* softmax_scale / softcap; 0 without softcap */
    float max_slack;   /* how far (in units of S) a row max may grow before O is rescaled: 8 / scale_log2 */
    int window_left, window_right;
    float *lse;
    int64_t total_q;
    void *o; /* for the direct stores of varlen boundary tiles and of tiles that see no key (e4m3: of every tile) */
    int64_t o_stride_batch, o_stride_seq, o_stride_head;
    const void *k; /* for S computed again where the softmax against the stale max failed (fa3_mma_scores) */
    int64_t k_stride_batch, k_stride_seq, k_stride_head;
    int num_tiles;     /* num_m_blocks * heads_q * batch */
    int *tile_counter; /* claims past the first wave (fa3_sched::counter_reset); NULL: tiles are dealt round robin */
    int num_bh;        /* heads_q * batch */
    fa3_divisor div_m_blocks, div_heads, div_group, div_section, div_section_tiles; /* by num_m_blocks, ... */
    /* fa3_sched::claim_order: claims from first_blocks_claim on take each head's first query block (= num_tiles:
     * none do); before it, claim c takes tile c + c / div_head_tiles (num_m_blocks - 1; 2^30: tile c) */
    int first_blocks_claim;
    fa3_divisor div_head_tiles;
    unsigned long long *counter_tag; /* beside tile_counter: the tag of the launch that last reset it */
    unsigned long long launch_tag;   /* this launch's, unique in the process (fa3_fwd.cu) */
    /* e4m3 (fa3_fp8_fwd.cuh): descales of q (heads_q) and of k, v (heads_q / group), NULL = 1; per (batch entry,
     * head), or per block of descale_block_q / _k rows (0: one block; descale_blocks_q / _k blocks per head, and
     * descale_kblocks 128-key blocks per k block) */
    const float *q_descale, *k_descale, *v_descale;
    int descale_block_q, descale_block_k, descale_blocks_q, descale_blocks_k, descale_kblocks;
    /* ALiBi (GENERAL kernels, not e4m3): slopes per (batch entry, query head) at alibi[b * alibi_batch_stride + h],
     * NULL = none; a slope times alibi_scale (log2(e) / scale_log2) is in units of S */
    const float *alibi;
    int64_t alibi_batch_stride;
    float alibi_scale;
};

/* The GENERAL template argument of the kernels: 0 the lean kernel (dense batches, no softcap, no left window
 * edge), 1 the general one, FA3_GENERAL_ALIBI the general one with ALiBi (an instance of its own: in the general
 * kernel, which every head-dim-128 forward runs, ALiBi's code made ptxas spill 40 B). */
#define FA3_GENERAL_ALIBI 2

/* A launch: tensor maps, arguments and grid. */
struct fa3_problem {
    CUtensorMap tm_q, tm_k, tm_v, tm_o;
    fa3_args args;
    int grid; /* CTAs: min(tiles, SMs), or one per tile */
};

/* Schedules (FLASHATTN_FA3_SCHEDULE, for measuring the design steps; bf16 only, f16 runs the default): */
enum {
    FA3_SCHEDULE_DEFAULT = -1, /* what the head dim's launcher picks */
    FA3_SCHEDULE_FULL = 0,     /* intra-warpgroup overlap + ping-pong, Q from shared memory */
    FA3_SCHEDULE_PINGPONG = 1, /* ping-pong only */
    FA3_SCHEDULE_OVERLAP = 2,  /* intra-warpgroup overlap only */
    FA3_SCHEDULE_PLAIN = 3,    /* warp specialization only */
    FA3_SCHEDULE_QREG = 4      /* Q K^T with Q from registers (the default where the head dim has it) */
};

/* The developer knobs of fa3_fwd.cu's header comment, read from the environment once per process (a getenv
 * per call is measurable host time); 0 = the library's choice. */
struct fa3_knobs {
    int schedule;    /* FLASHATTN_FA3_SCHEDULE: FA3_SCHEDULE_* */
    int block_m;     /* FLASHATTN_FA3_BLOCK_M: 128 | 192 */
    int block_n;     /* FLASHATTN_FA3_BLOCK_N: 96 | 128 */
    int order;       /* FLASHATTN_FA3_ORDER: 1 head, 2 longest */
    int section_mb;  /* FLASHATTN_FA3_SECTION_MB */
    int align_start; /* FLASHATTN_FA3_ALIGN = start */
    int eager_max;   /* FLASHATTN_FA3_LAZY = 0 */
    int scheduler;   /* FLASHATTN_FA3_SCHEDULER: 1 static, 2 grid */
};
const fa3_knobs *fa3_knobs_get(void);

/* Per head dim launchers (fa3_fwd_hdim*.cu): the tile shape (block_m and block_n for head dim 64, block_n
 * otherwise) and the schedule (FA3_SCHEDULE_*) pick the instantiation. */
fa_status fa3_run_hdim64(const fa3_problem *pr, int bf16, int block_m, int block_n, int schedule, cudaStream_t stream);
fa_status fa3_run_hdim128(const fa3_problem *pr, int bf16, int block_n, int schedule, cudaStream_t stream);
fa_status fa3_run_hdim256(const fa3_problem *pr, int bf16, int block_n, int schedule, cudaStream_t stream);
/* The e4m3 kernel's launchers (fa3_fp8_fwd_hdim*.cu): O in bf16 (out_bf16) or f16. */
fa_status fa3_fp8_run_hdim64(const fa3_problem *pr, int out_bf16, cudaStream_t stream);
fa_status fa3_fp8_run_hdim128(const fa3_problem *pr, int out_bf16, cudaStream_t stream);
fa_status fa3_fp8_run_hdim256(const fa3_problem *pr, int out_bf16, cudaStream_t stream);

/* Whether this build carries sm_90a code (fa3_fwd.cu), and whether TMA can move tensor t (16-byte aligned,
 * strides positive multiples of 8 elements; a message naming it when not). */
int fa3_has_sm90a_code(void);
fa_status fa3_check_tensor(const char *name, const fa_tensor *t, int dense, int batch, int heads);

/* Tensor map of a 5-D tiled view with the 128-byte swizzle (tensor_map.cu); cached, thread-safe. */
fa_status fa3_tensor_map(CUtensorMap *map, fa_dtype dtype, const void *base, const uint64_t dims[5],
                         const uint64_t strides_bytes[4], const uint32_t box[5]);
/* The 5-D view {64, rows, head_dim / 64, heads, batch} of tensor t of problem p (rows: seqlen, or the packed
 * tokens of a varlen batch, whose batch extent is 1), moving boxes of box_rows x head_dim (tensor_map.cu). */
fa_status fa3_tensor_map_rows(CUtensorMap *map, const fa_params *p, const fa_tensor *t, int64_t rows, int heads,
                              int box_rows);

/* Where a tile's keys are in global memory, for S computed again (fa3_mma_scores): written by the producer
 * beside the tile's geometry, in the same ring of four (see kSharedGeo in the kernel). */
struct fa3_krows {
    const uint16_t *k; /* key 0 of the tile's sequence, (batch, kv head) */
    int len_k;
    int pad;
};

/* Stages of the K and V rings. Two: a third does not fit in shared memory at head dims 128 (with O's own tiles)
 * and 256, and the steps whose stages are compile-time constants (fa3_overlap_fast) alternate between two. */
enum { FA3_STAGES = 2 };

/* The ring of barrier-guarded buffers that a use number j falls in (the K stages, the V stages, a warpgroup's Q
 * tile, the two slots of published tile indices): use j takes stage j % N in round j / N. A barrier's phase
 * completes once per round, so whoever waits for a stage to be filled waits for the parity of the round and
 * whoever waits for it to be emptied the opposite parity (the first round's wait for an empty stage passes at
 * once: the phase "before" the barrier's first counts as completed). Every stage and parity of the kernel comes
 * from here. The use number is a plain int that its owner counts on: held in a struct, it moved the register
 * numbering of the PTX, and ptxas's register allocation with it. */
template <int N>
struct fa3_pipe {
    static __device__ __forceinline__ int stage(int j) {
        return j % N;
    }
    static __device__ __forceinline__ uint32_t phase(int j) {
        return (j / N) & 1;
    }
    static __device__ __forceinline__ uint32_t empty_phase(int j) {
        return ((j / N) & 1) ^ 1;
    }
};

/* The shared-memory area after the tiles: the mbarriers (8 bytes each) and what the producer publishes beside
 * them. Offsets are bytes from the area's start; one layout gives both the addresses and the size. */
template <int NWG>
struct fa3_bar_layout {
    static constexpr int kGeoBytes = 48; /* a fa3_tile, as the producer publishes it (kSharedGeo) */
    static constexpr int kTileRing = 4;  /* entries of the rings of published tiles: tile k in entry k % 4 */
    static_assert((kTileRing & (kTileRing - 1)) == 0, "the ring is indexed by a mask");
    static constexpr int kQFull = 0;                 /* per consumer warpgroup: its Q tile loaded */
    static constexpr int kQEmpty = kQFull + 8 * NWG; /* ... and free again */
    static constexpr int kKFull = kQEmpty + 8 * NWG; /* per stage */
    static constexpr int kKEmpty = kKFull + 8 * FA3_STAGES;
    static constexpr int kVFull = kKEmpty + 8 * FA3_STAGES;
    static constexpr int kVEmpty = kVFull + 8 * FA3_STAGES;
    static constexpr int kTileFull = kVEmpty + 8 * FA3_STAGES; /* per slot of the two published tile indices */
    static constexpr int kTileEmpty = kTileFull + 16;
    static constexpr int kVReady = kTileEmpty + 16;           /* per V stage: rows past the sequence zeroed (varlen) */
    static constexpr int kTileIds = kVReady + 8 * FA3_STAGES; /* int[2]: the published tile indices */
    static constexpr int kVValid = kTileIds + 8; /* int[FA3_STAGES]: rows of each V stage in the sequence */
    static constexpr int kHeadBytes = kVValid + ((4 * FA3_STAGES + 7) / 8) * 8;
    /* then, with three consumer warpgroups, the rings of tile geometries and of fa3_krows */
    static constexpr int kGeo = kHeadBytes;
    static constexpr int kKrows = kGeo + kTileRing * kGeoBytes;
    static constexpr int kBytes = kHeadBytes + (NWG == 3 ? kTileRing * (kGeoBytes + (int)sizeof(fa3_krows)) : 0);

    /* Every barrier with its arrival count, by one thread before the CTA's first __syncthreads. The tile-index
     * slots are released per consumer thread where the geometry is published (each thread reads its entry),
     * else per consumer warp. */
    static __device__ __forceinline__ void init(uint32_t area, bool shared_geo, int v_ready_arrivals = 1,
                                                int v_empty_arrivals = 4 * NWG) {
        for (int i = 0; i < NWG; ++i) {
            hp_mbar_init(area + kQFull + 8 * i, 1);
            hp_mbar_init(area + kQEmpty + 8 * i, 4); /* one arrival per warp of the warpgroup */
        }
        for (int i = 0; i < FA3_STAGES; ++i) {
            hp_mbar_init(area + kKFull + 8 * i, 1);
            hp_mbar_init(area + kVFull + 8 * i, 1);
            hp_mbar_init(area + kKEmpty + 8 * i, 4 * NWG); /* one arrival per consumer warp */
            hp_mbar_init(area + kVEmpty + 8 * i, v_empty_arrivals);
        }
        for (int i = 0; i < 2; ++i) {
            hp_mbar_init(area + kTileFull + 8 * i, 1);
            hp_mbar_init(area + kTileEmpty + 8 * i, shared_geo ? 128 * NWG : 4 * NWG);
        }
        for (int i = 0; i < FA3_STAGES; ++i) hp_mbar_init(area + kVReady + 8 * i, v_ready_arrivals);
        hp_fence_barrier_init();
    }
};

/* EB: bytes per element of Q, K and V, 2 (f16, bf16) or 1 (e4m3, fa3_fp8_fwd.cuh: O is written from registers,
 * and the V^T stages take the place of O's tiles). A tile's rows are 128 bytes per slab either way: 64 16-bit
 * elements or 128 e4m3 ones. */
template <int D, int BN, int NWG, int EB = 2>
struct fa3_cfg {
    typedef fa3_bar_layout<NWG> Bars;
    static constexpr int kGeoBytes = Bars::kGeoBytes;
    static constexpr int kTileRing = Bars::kTileRing;
    static constexpr int kBlockM = 64 * NWG;
    static constexpr int kThreads = 128 * (NWG + 1);
    static constexpr int kQBytes = 64 * D * EB;  /* one consumer warpgroup's Q (and O) tile */
    static constexpr int kKVBytes = BN * D * EB; /* one K or V stage (and, e4m3, one V^T stage) */
    static constexpr int kQSlab = 64 * 128;      /* bytes between the 64-column slabs of a Q tile */
    static constexpr int kKVSlab = BN * 128;
    static constexpr int kBarBytes = Bars::kBytes;
    /* Layout: Q tiles | K stages | V stages | [O tiles] | barriers; + 1024 for aligning the base. O gets its own
     * tiles when they fit (then the next tile's Q can land during this tile's epilogue), else it reuses Q's. */
    static constexpr int kOffK = NWG * kQBytes;
    static constexpr int kOffV = kOffK + FA3_STAGES * kKVBytes;
    static constexpr int kOffVt = kOffV + FA3_STAGES * kKVBytes;
    /* e4m3: three V^T stages where they fit (head dim 128), else two (fa3_fp8_fwd.cuh) */
    static constexpr int kVtStages = EB == 1 ? (kOffVt + 3 * kKVBytes + kBarBytes + 1024 + 64 <= 232448 ? 3 : 2) : 0;
    static constexpr int kOffO = kOffVt + kVtStages * kKVBytes;
    static constexpr bool kSeparateO = EB == 2 && kOffO + NWG * kQBytes + kBarBytes + 1024 <= 232448;
    static constexpr int kOffBar = kOffO + (kSeparateO ? NWG * kQBytes : 0);
    static constexpr int kSmemBytes = kOffBar + kBarBytes + 1024;
    static constexpr int kOffGeo = kOffBar + Bars::kGeo;
    static constexpr int kOffKrows = kOffBar + Bars::kKrows;
    /* Register split: 24 + 2 x 240 or 40 + 2 x 232 = 3 x 168 (384 threads), 32 + 3 x 160 = 4 x 128 (512). With
     * two consumer warpgroups the producer gets 40 registers (its tile loop spills in 24) unless the consumers
     * need the full 240 (head dim 256). */
    static constexpr int kRegsProducer = NWG == 3 ? 32 : (BN > 128 || D > 128 ? 24 : 40);
    static constexpr int kRegsConsumer = NWG == 3 ? 160 : (504 - kRegsProducer) / 2;
    static_assert(hp_reg_split_fits(kRegsProducer, kRegsConsumer, NWG), "register split");
    /* The choices that differ between two and three consumer warpgroups: */
    static constexpr bool kSkipIdle = NWG == 3; /* warpgroups without rows skip the tile (fa3_wg_has_rows) */
    /* A lone unmasked block takes a step with compile-time stages, not the general one: +1-2% at head dim 64.
     * With two consumer warpgroups that step made ptxas serialize the wgmma of the head-dim-128 kernel. */
    static constexpr bool kLoneFast = NWG == 3;
    /* Tile geometry with magic-number divisions (fa3_divisor): H200 +4-6% up to 1k at head dim 64 (causal 1k
     * 301 -> 317); with two consumer warpgroups the extra registers made ptxas serialize the head-dim-128
     * kernel's wgmma. */
    static constexpr bool kFastDiv = NWG == 3;
    /* With three consumer warpgroups the producer publishes each tile's geometry (and its fa3_krows), so that the
     * consumers take no fa3_sched::tile_get of their own, neither at the tile's start (H200 +1-2% under a causal
     * mask up to 2k) nor for its epilogue (with the krows from the producer, which every consumer warp's lane 0
     * wrote at the tile's start before: +2.2% at causal 512, +1.3% at 1k, +0.4-0.6% from 4k). The CTA's tile k
     * goes into entry k % 4 of a ring: the producer writes it once every consumer thread has taken tile k - 2's
     * index slot, that is, has finished tile k - 4, whose entry it overwrites. Kept in registers from the tile's
     * start to its epilogue, the geometry spilled in the hot loop. */
    static constexpr bool kSharedGeo = NWG == 3;
    static_assert(NWG == 2 || NWG == 3, "two or three consumer warpgroups");
    static_assert(D % 64 == 0 && BN % 16 == 0 && BN <= 256, "tile shape");
};

/* The 16-bit element type T of Q, K, V and O (__half or __nv_bfloat16): a template argument of the kernel, the
 * helpers below and the wgmma wrappers (whose specializations name the PTX type); the launchers pick it by a
 * flag (fa3_elem). fa3_elem_traits<T> says what the code outside the wrappers asks of it. */
template <bool BF16>
struct fa3_elem {
    typedef __nv_bfloat16 type;
};
template <>
struct fa3_elem<false> {
    typedef __half type;
};
template <typename T>
struct fa3_elem_traits;
template <>
struct fa3_elem_traits<__nv_bfloat16> {
    static constexpr bool kBF16 = true;
};
template <>
struct fa3_elem_traits<__half> {
    static constexpr bool kBF16 = false;
};

/* Named barrier ids: 0 is __syncthreads; 1..NWG order GEMM issue (ping-pong); then one per consumer
 * warpgroup for its epilogue. */
#define FA3_BAR_PINGPONG 1

/* Developer timeline (build with -DFA3_TRACE=1; off, the hooks compile to nothing): thread 0 of each warpgroup
 * records (clock64, event, argument) into the buffer set by fa3_trace_arm; dev/hopper/trace.py reads it (its
 * NAMES table mirrors these event numbers). */
#ifndef FA3_TRACE
#define FA3_TRACE 0
#endif
enum {
    FA3_EV_TILE = 1,
    FA3_EV_Q,
    FA3_EV_TURN_REQ,
    FA3_EV_TURN,
    FA3_EV_ARRIVE,
    FA3_EV_QK_DONE,
    FA3_EV_PV_DONE,
    FA3_EV_EPI,
    FA3_EV_EPI_END,
    FA3_EV_PTILE,
    FA3_EV_KLOAD,
    FA3_EV_VLOAD,
    FA3_EV_QLOAD,
    FA3_EV_SLOT_WAIT,
    FA3_EV_SLOT,
    FA3_EV_INDEX
};
#define FA3_TRACE_CAP 8192 /* events per warpgroup */
#if FA3_TRACE
#include <stdio.h>
static __device__ unsigned long long *fa3_trace_buf;
static __shared__ int fa3_trace_n[4]; /* events so far per warpgroup; zeroed at kernel start */
static __device__ __forceinline__ void fa3_ev(int code, int arg) {
    if (threadIdx.x % 128 != 0 || fa3_trace_buf == nullptr) return;
    const int w = threadIdx.x / 128, i = fa3_trace_n[w];
    if (i >= FA3_TRACE_CAP) return;
    unsigned long long *e = fa3_trace_buf + 2 * ((size_t)(blockIdx.x * 4 + w) * FA3_TRACE_CAP + i);
    e[0] = clock64();
    e[1] = ((unsigned long long)code << 32) | (unsigned)arg;
    fa3_trace_n[w] = i + 1;
}
#define FA3_EV(code, arg) fa3_ev(code, arg)
#else
#define FA3_EV(code, arg) ((void)0)
#endif

static __device__ __forceinline__ int fa3_div(const fa3_divisor &v, int x) {
    return (int)((__umulhi((unsigned)x, v.m) + (unsigned)x) >> v.l);
}

/* Where one tile lies: query rows [m0 - shift, m0 - shift + kBlockM) of (b, h), key blocks [n_min, n_min +
 * nblocks). m0 is the tile's place in the grid of kBlockM rows; shift, a multiple of 64, moves the tiles up so
 * that they end with the sequence's last 64-row group (align_end). The first tile then starts before row 0: its
 * first warpgroups have no rows. */
struct fa3_tile {
    int m0, shift, h, b;
    int len_q, len_k, tok_q, tok_k;
    int row_last; /* last query row of the tile inside the sequence */
    int n_min, nblocks;
};

/* The first of consumer warpgroup w's 64 rows in the sequence (negative before row 0). */
static __device__ __forceinline__ int fa3_wg_row0(const fa3_tile &g, int w) {
    return g.m0 - g.shift + 64 * w;
}

/* One past the last key that query row `row` (and so every row before it) may see: len_k, or the right edge of
 * its window. */
static __device__ __forceinline__ long long fa3_key_end(const fa3_args &a, const fa3_tile &g, int row) {
    long long hi = g.len_k;
    if (a.window_right >= 0) hi = min(hi, (long long)row + (g.len_k - g.len_q) + a.window_right + 1);
    return hi;
}

/* The tile scheduler: which tile a claim stands for and where it lies (tile_get, claim_order), and the tile
 * counter that hands out the claims past the first wave (counter_reset, counter_wait, counter_retire). The
 * divisions by run-time sizes take fa3_div. */
struct fa3_sched {
    /* Decodes tile index -> (b, h, query block); false when the block starts past its (varlen) sequence. The
     * producer and the consumers call this with the same index and so agree on everything. Head-major order (all
     * query blocks of a head, then the next head) unless a.section > 0: then the (batch, head) pairs are taken in
     * sections whose K and V fit in L2 together, and a section's tiles go query block by query block across its
     * heads. With reverse_m (from the last query block, the longest under a causal mask) that hands out the longest
     * tiles first and leaves only short ones for the end of the grid; head-major, the last head's longest tile
     * starts near the end and the other SMs idle while it runs. */
    template <int BM, int BN, bool ALIGN, bool VARLEN, bool FASTDIV>
    static __device__ __forceinline__ bool tile_get(const fa3_args &a, int tile, fa3_tile &g) {
        int bh, mi;
        if (a.section > 0) {
            const int per_section = a.section * a.num_m_blocks;
            const int sec = FASTDIV ? fa3_div(a.div_section_tiles, tile) : tile / per_section;
            const int r = tile - sec * per_section, bh0 = sec * a.section;
            /* the last section may be short; num_bh = num_tiles / num_m_blocks (the two-warpgroup kernels keep the
             * divide: taking it out moved ptxas's schedule of their whole loop) */
            const int n = min(a.section, (FASTDIV ? a.num_bh : a.num_tiles / a.num_m_blocks) - bh0);
            mi = FASTDIV && n == a.section ? fa3_div(a.div_section, r) : r / n;
            bh = bh0 + (r - mi * n);
        } else {
            bh = FASTDIV ? fa3_div(a.div_m_blocks, tile) : tile / a.num_m_blocks;
            mi = tile - bh * a.num_m_blocks;
        }
        const int m_block = a.reverse_m ? a.num_m_blocks - 1 - mi : mi;
        g.b = FASTDIV ? fa3_div(a.div_heads, bh) : bh / a.heads_q;
        g.h = bh - g.b * a.heads_q;
        g.len_q = a.seqlen_q;
        g.len_k = a.seqlen_k;
        g.tok_q = g.tok_k = 0;
        if (VARLEN && a.cu_q != nullptr) {
            g.tok_q = a.cu_q[g.b];
            g.tok_k = a.cu_k[g.b];
            g.len_q = a.cu_q[g.b + 1] - g.tok_q;
            g.len_k = a.cu_k[g.b + 1] - g.tok_k;
        }
        /* Aligned to the end (ALIGN: kernels whose idle warpgroups skip their work), the warpgroups a partial tile
         * lacks are taken off the first tile: under a causal mask the shortest one, so the tiles are 1-2 key blocks
         * shorter than with the partial tile last (the longest). */
        g.m0 = m_block * BM;
        g.shift = 0;
        if (ALIGN && a.align_end) {
            const int tiles_q = (g.len_q + BM - 1) / BM;
            if (m_block >= tiles_q) return false;
            g.shift = (tiles_q * BM - g.len_q) / 64 * 64;
        } else if (g.m0 >= g.len_q) {
            return false;
        }
        const int off = g.len_k - g.len_q; /* query i sits at key position i + off */
        g.row_last = min(fa3_wg_row0(g, 0) + BM, g.len_q) - 1;
        long long key_hi = fa3_key_end(a, g, g.row_last), key_lo = 0;
        /* A first row before row 0 (align_end) gives a lower bound that is only too low: correct, masked per row. */
        if (a.window_left >= 0) key_lo = max(key_lo, (long long)fa3_wg_row0(g, 0) + off - a.window_left);
        g.n_min = 0;
        g.nblocks = 0;
        if (key_hi > key_lo) {
            g.n_min = (int)(key_lo / BN);
            g.nblocks = (int)((key_hi + BN - 1) / BN) - g.n_min;
        }
        return true;
    }

    /* The tile counter lives in the caller's workspace, which may hold anything, and is reset inside the kernel
     * rather than by a memset before the launch (one more operation on the stream; H200, head dim 64: +0.3-0.6%
     * under a causal mask up to 2k): CTA 0 zeroes it and then publishes the launch's tag beside it; every other CTA
     * sees the tag before its first claim. A CTA's first tile is blockIdx.x, so by then CTA 0 (the first to be
     * dispatched) has long passed its reset. That CTA 0 runs while others wait is the assumption of CUB's
     * decoupled look-back: at most one CTA per SM, dispatched in index order. A reset by whichever CTA comes first
     * (an atomic exchange per CTA before its first claim) needs none, but measured 0.2-1.3% slower up to 1k at head
     * dims 64 and 128; one pointer for the counter and the tag (a struct) lost 0.8% at head dim 64 causal 1k
     * through the consumers' register allocation. */
    static __device__ __forceinline__ void counter_reset(const fa3_args &a) {
#if FA_SM90A
        asm volatile("st.relaxed.gpu.global.b32 [%0], 0;" ::"l"(a.tile_counter) : "memory");
        asm volatile("st.release.gpu.global.b64 [%0], %1;" ::"l"(a.counter_tag), "l"(a.launch_tag) : "memory");
#endif
    }

    /* Every CTA claims until a claim fails, so a launch makes exactly num_tiles claims. The one that returns
     * num_tiles - 1 is the launch's last access to the counter: it zeroes the counter and the tag. A CUDA graph
     * replays a launch with the same tag on the same workspace; without this, the next replay's CTAs would see
     * the tag already published and could claim from the old count before CTA 0 resets it. */
    static __device__ __forceinline__ void counter_retire(const fa3_args &a) {
#if FA_SM90A
        asm volatile("st.relaxed.gpu.global.b32 [%0], 0;" ::"l"(a.tile_counter) : "memory");
        asm volatile("st.relaxed.gpu.global.b64 [%0], 0;" ::"l"(a.counter_tag) : "memory");
#endif
    }

    static __device__ __forceinline__ void counter_wait(const fa3_args &a) {
#if FA_SM90A
        unsigned long long tag;
        do {
            asm volatile("ld.acquire.gpu.global.b64 %0, [%1];" : "=l"(tag) : "l"(a.counter_tag) : "memory");
        } while (tag != a.launch_tag);
#endif
    }

    /* The tile that the producer's claim number `claim` stands for: the same, or (head-major order, reverse_m, set
     * by the host where a head's first query block is its shortest tile by far) each head's other query blocks
     * first and every head's first query block after all of those, so that the grid ends with short tiles. The
     * tile index c of head-major order is bh * num_m_blocks + mi; the first part's claim c = bh * (num_m_blocks - 1)
     * + mi maps to c + bh. Only the producer maps; the consumers decode the tile index it publishes. */
    static __device__ __forceinline__ int next_claim(const fa3_args &a, int claim, bool first);
    static __device__ __forceinline__ int claim_order(const fa3_args &a, int claim) {
        if (claim >= a.num_tiles) return claim;
        return claim < a.first_blocks_claim ? claim + fa3_div(a.div_head_tiles, claim)
                                            : (claim - a.first_blocks_claim + 1) * a.num_m_blocks - 1;
    }
};

/* The producer's claim after `claim`: from the counter (`first`: the CTA's first claim from it waits for the
 * counter's reset), or round robin. */
__device__ __forceinline__ int fa3_sched::next_claim(const fa3_args &a, int claim, bool first) {
    if (a.tile_counter != nullptr) {
        if (first) counter_wait(a);
        const int n = atomicAdd(a.tile_counter, 1);
        if (n == a.num_tiles - 1) counter_retire(a);
        return (int)gridDim.x + n;
    }
    return claim + (int)gridDim.x;
}

/* Key blocks n with n_lo <= n < n_hi need no mask for query rows [first, last]: they end inside len_k and inside
 * the window of each of those rows. The others (the ragged last block, the diagonal, the window edges) are
 * masked. The three-warpgroup kernels ask for a warpgroup's own 64 rows: under a causal mask its later rows
 * then run the blocks between the tile's first row and their own diagonal unmasked. */
template <int BN, int GENERAL>
static __device__ __forceinline__ void fa3_mask_range(const fa3_args &a, const fa3_tile &g, int first, int last,
                                                      int &n_lo, int &n_hi) {
    const long long off = g.len_k - g.len_q;
    long long hi = g.len_k / BN;
    if (a.window_right >= 0) {
        /* a first row before row 0 (align_end) only marks more blocks as masked */
        const long long t = first + off + a.window_right + 1;
        hi = min(hi, t <= 0 ? 0 : t / BN);
    }
    long long lo = 0;
    if (GENERAL && a.window_left >= 0) {
        const long long t = last + off - a.window_left;
        lo = t <= 0 ? 0 : (t + BN - 1) / BN;
    }
    n_lo = (int)lo;
    n_hi = (int)hi;
}

/* The producer's copy of a tile's geometry and fa3_krows for the consumers (three consumer warpgroups);
 * nblocks = -1 marks a tile that starts past its sequence. */
static __device__ __forceinline__ void fa3_publish_tile(const fa3_args &a, const fa3_tile &g, bool valid, bool varlen,
                                                        fa3_tile &geo, fa3_krows &kr) {
    geo = g;
    if (!valid) {
        geo.nblocks = -1;
    } else {
        kr.k = (const uint16_t *)a.k + (varlen ? 0 : g.b * a.k_stride_batch) + (int64_t)g.tok_k * a.k_stride_seq +
               (int64_t)fa3_div(a.div_group, g.h) * a.k_stride_head;
        kr.len_k = g.len_k;
    }
}

/* Whether consumer warpgroup w has any of its 64 rows inside the sequence. One that has none (the rows a
 * partial tile lacks) skips the tile's work and only keeps the barriers' counts (kernels with three consumer
 * warpgroups; in the others, whose 128-row tiles lose less, the extra code made ptxas spill). */
static __device__ __forceinline__ bool fa3_wg_has_rows(const fa3_tile &g, int w) {
    const int r0 = fa3_wg_row0(g, w);
    return r0 >= 0 && r0 < g.len_q;
}

#if FA_SM90A

template <typename T>
static __device__ __forceinline__ uint32_t fa3_pack(float lo, float hi) {
    uint32_t r;
    if (fa3_elem_traits<T>::kBF16) {
        __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
        r = *reinterpret_cast<uint32_t *>(&v);
    } else {
        __half2 v = __floats2half2_rn(lo, hi);
        r = *reinterpret_cast<uint32_t *>(&v);
    }
    return r;
}

/* The Q operand of S = Q K^T: the warpgroup's Q tile in shared memory, or (QRS) its A fragments in registers,
 * four 16-bit pairs per 16 columns. */
template <int D, bool QRS>
struct fa3_qop {
    uint64_t desc;
    uint32_t frag[QRS ? D / 4 : 1];
};

/* Loads the A fragments of a [64 x D] swizzled Q tile: for columns 16 kk.., the pairs at (row, 2 quad),
 * (row + 8, 2 quad), (row, 8 + 2 quad), (row + 8, 8 + 2 quad), row = 16 warp + lane / 4 (the layout of P). */
static __device__ __forceinline__ uint32_t fa3_q_pair(uint32_t s_q, int warp, int lane, int kk, int x) {
    const int r = 16 * warp + lane / 4 + 8 * (x & 1), col = 16 * kk + 8 * (x >> 1);
    const uint32_t addr =
        s_q + (col / 64) * (64 * 128) + r * 128 + ((((col % 64) / 8) ^ (r % 8)) << 4) + 4 * (lane % 4);
    uint32_t v;
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
    return v;
}
template <int D>
static __device__ __forceinline__ void fa3_load_q_frag(uint32_t (&frag)[D / 4], uint32_t s_q, int warp, int lane) {
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
        for (int x = 0; x < 4; ++x) frag[4 * kk + x] = fa3_q_pair(s_q, warp, lane, kk, x);
}

/* S = Q K^T for one key block: D / 16 wgmma steps along the head dim. */
template <int D, int BN, typename T, bool QRS>
static __device__ __forceinline__ void fa3_issue_qk(float (&s)[BN / 2], const fa3_qop<D, QRS> &q, uint64_t desc_k) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) hp_fence_reg(s[i]);
    hp_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
        const uint32_t off_q = ((kk / 4) * 64 * 128 + (kk % 4) * 32) >> 4;
        const uint32_t off_k = ((kk / 4) * BN * 128 + (kk % 4) * 32) >> 4;
        if constexpr (QRS)
            fa3_wgmma_rs_kmajor<BN, T>(s, q.frag[4 * kk], q.frag[4 * kk + 1], q.frag[4 * kk + 2], q.frag[4 * kk + 3],
                                       hp_desc_add(desc_k, off_k), kk > 0);
        else
            fa3_wgmma_ss<BN, T>(s, q.desc + off_q, hp_desc_add(desc_k, off_k), kk > 0);
    }
    hp_wgmma_commit();
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) hp_fence_reg(s[i]);
}

/* O += P V for one key block: BN / 16 wgmma steps along the keys, P from registers; N < BN: the first N keys
 * only (P is zero for the others). */
template <int D, int BN, typename T, int N = BN>
static __device__ __forceinline__ void fa3_issue_pv(float (&o)[D / 2], uint32_t (&p)[BN / 4], uint64_t desc_v) {
#pragma unroll
    for (int i = 0; i < D / 2; ++i) hp_fence_reg(o[i]);
#pragma unroll
    for (int i = 0; i < BN / 4; ++i) hp_fence_reg(p[i]);
    hp_wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < N / 16; ++kk)
        fa3_wgmma_rs<D, T>(o, p[4 * kk], p[4 * kk + 1], p[4 * kk + 2], p[4 * kk + 3],
                           hp_desc_add(desc_v, (kk * 2048) >> 4), 1);
    hp_wgmma_commit();
}

/* After the wait that completes a P V: the accumulators may be read again and P may be overwritten. Keeping P
 * live until here also keeps the register allocator from reusing P's registers (which the tensor cores are
 * still reading) before the wait. */
template <int D, int BN>
static __device__ __forceinline__ void fa3_pv_done(float (&o)[D / 2], uint32_t (&p)[BN / 4]) {
#pragma unroll
    for (int i = 0; i < D / 2; ++i) hp_fence_reg(o[i]);
#pragma unroll
    for (int i = 0; i < BN / 4; ++i) hp_fence_reg(p[i]);
}

/* S = Q K^T again for the warp's 16 rows with mma.sync (m16n8k16, whose fragments are the wgmma accumulator's
 * and Q operand's), for a block whose softmax against the stale max failed (fa3_softmax_stale): per warp, so the
 * warpgroup need not agree on it. Q from its shared tile; K from global memory (L2: the block was just
 * loaded), its ring stage being released before the softmax. k points at the block's first key, of which `valid`
 * lie inside the sequence (the others read the last one: the mask drops them). One column group at a time: the
 * least registers beside S and O (with all of Q's fragments loaded at once the kernel spilled in its hot loop). */
template <int D, int BN, typename T, bool QRS>
static __device__ __forceinline__ void fa3_mma_scores(float (&s)[BN / 2], const fa3_qop<D, QRS> &q, const uint16_t *k,
                                                      int64_t stride_seq, int valid, int lane) {
    static_assert(!QRS, "Q from its shared tile (held until the tile's last Q K^T)");
    const int warp = (threadIdx.x % 128) / 32, g = lane / 4, t = lane % 4;
    const uint32_t s_q = (uint32_t)(q.desc & 0x3fff) << 4;
    k += 2 * t;
#pragma unroll
    for (int c = 0; c < BN / 8; ++c) {
        const uint32_t *row = (const uint32_t *)(k + min(8 * c + g, valid - 1) * stride_seq);
        float d[4] = { 0.0f, 0.0f, 0.0f, 0.0f };
#pragma unroll 1
        for (int kk = 0; kk < D / 16; ++kk) {
            uint32_t qa[4];
#pragma unroll
            for (int x = 0; x < 4; ++x) qa[x] = fa3_q_pair(s_q, warp, lane, kk, x);
            const uint32_t b0 = row[8 * kk], b1 = row[8 * kk + 4];
            if (fa3_elem_traits<T>::kBF16)
                asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                             "{%8, %9}, {%0, %1, %2, %3};"
                             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                             : "r"(qa[0]), "r"(qa[1]), "r"(qa[2]), "r"(qa[3]), "r"(b0), "r"(b1));
            else
                asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                             "{%8, %9}, {%0, %1, %2, %3};"
                             : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                             : "r"(qa[0]), "r"(qa[1]), "r"(qa[2]), "r"(qa[3]), "r"(b0), "r"(b1));
        }
#pragma unroll
        for (int e = 0; e < 4; ++e) s[4 * c + e] = d[e];
    }
}

/* Sets S to -inf where key (n0 + col) is not visible to the thread's two rows (row0, row0 + 8). The thread's
 * columns of a row, 8c + e (c < BN / 8, e < 2), become the bits 2c + e of a word, and each element is kept by
 * its bit: one bit test (or, R2P, a seventh of one) and a select per element, where comparing each column with
 * both edges took two compares and a select. */
template <int BN, bool R2P>
static __device__ __forceinline__ void fa3_mask(float (&s)[BN / 2], int n0, int row0, int quad, int len_k, int off,
                                                int window_left, int window_right) {
    static_assert(BN <= 128, "one bit per element of a row in a 32-bit word");
    const long long base = (long long)n0 + 2 * quad;
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const long long r = (long long)row0 + 8 * h + off;
        long long hi = len_k;
        if (window_right >= 0 && r + window_right + 1 < hi) hi = r + window_right + 1;
        hi -= base;
        const int hi_c = hi < 0 ? 0 : (hi > BN ? BN : (int)hi);
        int lo_c = 0;
        if (window_left >= 0) {
            const long long lo = r - window_left - base;
            lo_c = lo < 0 ? 0 : (lo > BN ? BN : (int)lo);
        }
        /* bits 2c + e with 8c + e in [lo_c, hi_c): column groups c below (hi_c + 7 - e) / 8 and from (lo_c + 7 -
         * e) / 8 on; funnel shifts clamp at 32, where a plain shift is undefined */
        const unsigned below_even = __funnelshift_lc(0xffffffffu, 0u, 2 * ((hi_c + 7) >> 3));
        const unsigned below_odd = __funnelshift_lc(0xffffffffu, 0u, 2 * ((hi_c + 6) >> 3));
        const unsigned from_even = ~__funnelshift_lc(0xffffffffu, 0u, 2 * ((lo_c + 7) >> 3));
        const unsigned from_odd = ~__funnelshift_lc(0xffffffffu, 0u, 2 * ((lo_c + 6) >> 3));
        unsigned keep = (below_even & from_even & 0x55555555u) | (below_odd & from_odd & 0xaaaaaaaau);
        /* R2P: the word made opaque, so that ptxas moves its bits into predicates seven at a time (R2P); else it
         * tests the even and odd bits one by one (with R2P the two-warpgroup d=128 kernel spilled 36 B). */
        if (R2P) asm("mov.b32 %0, %0;" : "+r"(keep));
#pragma unroll
        for (int c = 0; c < BN / 8; ++c)
#pragma unroll
            for (int e = 0; e < 2; ++e)
                if (!((keep >> (2 * c + e)) & 1u)) s[e + 2 * h + 4 * c] = -INFINITY;
    }
}

/* Online softmax on one block of S (in place: S becomes P). m holds the max that P is taken against, per row,
 * l the thread's partial row sums. The max is only moved (and O must then be rescaled by factor) when some row
 * of the warp has grown by more than `slack` (in units of S; 8 in the exponent of 2): until then P may reach 2^8,
 * harmless in fp32 and in the 16-bit P, and most blocks skip the rescale of O. Whether to move is decided on the
 * thread's own maxima (a row grew by more than slack iff one of its four threads saw it), so the shuffles that
 * form the row maxima run only when the max moves; the thread's maxima are four FMNMX chains, not one. Returns
 * whether the warp moved its max (the same for the whole warp).
 * JOINT: one branch moves both rows' maxima. With a branch per row ptxas may schedule the first row's
 * exponentials between the two, as one burst on the MUFU pipe instead of interleaved with the row sums: seen
 * in the three-warpgroup kernels, 6% slower at head dim 64. The two-warpgroup kernels keep a branch per row
 * (with one, head dim 256 spills more). */
static __device__ __forceinline__ void fa3_move_max(float &mx, float &m, float &factor, float scale_log2) {
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    mx = fmaxf(mx, m);
    const float use = mx == -INFINITY ? 0.0f : mx; /* a row that has seen no key yet */
    factor = hp_exp2((m - use) * scale_log2);
    m = mx;
}

/* P = 2^(S * scale_log2 + neg_max) in place, and the thread's partial row sums (two chains per row). */
template <int BN>
static __device__ __forceinline__ void fa3_exp_rows(float (&s)[BN / 2], const float (&neg_max)[2], float scale_log2,
                                                    float (&sum)[2]) {
    float chain[2][2] = { { 0.0f, 0.0f }, { 0.0f, 0.0f } };
#pragma unroll
    for (int c = 0; c < BN / 8; ++c)
#pragma unroll
        for (int h = 0; h < 2; ++h)
#pragma unroll
            for (int e = 0; e < 2; ++e) {
                float &x = s[4 * c + 2 * h + e];
                x = hp_exp2(fmaf(x, scale_log2, neg_max[h]));
                chain[h][c & 1] += x;
            }
    sum[0] = chain[0][0] + chain[0][1];
    sum[1] = chain[1][0] + chain[1][1];
}

/* p_log2: P = 2^p_log2 at the row max (the e4m3 kernel's P fills more of e4m3's exponents; l carries the factor,
 * and fa3_finalize takes it out of the LSE). */
template <int BN, bool JOINT>
static __device__ __forceinline__ bool fa3_softmax(float (&s)[BN / 2], float (&m)[2], float (&l)[2], float (&factor)[2],
                                                   float scale_log2, float slack, float p_log2 = 0.0f) {
    constexpr int kChains = 4; /* independent FMNMX chains per row, joined at the end */
    float mx[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float t[kChains];
#pragma unroll
        for (int c = 0; c < kChains; ++c) t[c] = fmaxf(s[4 * c + 2 * h], s[4 * c + 2 * h + 1]);
#pragma unroll
        for (int c = kChains; c < BN / 8; ++c)
            t[c % kChains] = fmaxf(t[c % kChains], fmaxf(s[4 * c + 2 * h], s[4 * c + 2 * h + 1]));
        mx[h] = fmaxf(fmaxf(t[0], t[1]), fmaxf(t[2], t[3]));
    }
    /* mx > m + slack is also true when m is -inf (no key seen yet) and mx is not. */
    const bool move = __any_sync(0xffffffffu, mx[0] > m[0] + slack || mx[1] > m[1] + slack);
    float neg_max[2];
    if (JOINT) {
        if (move) {
            fa3_move_max(mx[0], m[0], factor[0], scale_log2);
            fa3_move_max(mx[1], m[1], factor[1], scale_log2);
        } else {
            factor[0] = factor[1] = 1.0f;
        }
#pragma unroll
        for (int h = 0; h < 2; ++h) neg_max[h] = -(m[h] == -INFINITY ? 0.0f : m[h]) * scale_log2;
    } else {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            if (move)
                fa3_move_max(mx[h], m[h], factor[h], scale_log2);
            else
                factor[h] = 1.0f;
            neg_max[h] = -(m[h] == -INFINITY ? 0.0f : m[h]) * scale_log2;
        }
    }
    if (p_log2 != 0.0f) { /* a constant of the caller: the 16-bit kernels' code is unchanged */
        neg_max[0] += p_log2;
        neg_max[1] += p_log2;
    }
    float sum[2];
    fa3_exp_rows<BN>(s, neg_max, scale_log2, sum);
#pragma unroll
    for (int h = 0; h < 2; ++h) l[h] = l[h] * factor[h] + sum[h];
    return move;
}

/* The softmax of a block against the max the rows already have, without looking for the block's own max: the
 * max's FMNMX chains (one instruction per element) and the test on them sat between the Q K^T and the first
 * exponential (H200, d=64 192-row tiles: +2-4% up to 2k, +5-8% from 4k). Each P is at most its thread's partial
 * row sum, so sums up to kStaleSumMax show that no P outgrew what the full softmax allows a stale max (2^8) by
 * more than 2^4, harmless in fp32 and in the 16-bit P; a larger sum (a row max that grew, or inf / NaN) returns
 * false with S destroyed, and the caller computes S again. Only for rows that all have a max (the caller
 * checks). */
constexpr float kStaleSumMax = 4096.0f;
template <int BN>
static __device__ __forceinline__ bool fa3_softmax_stale(float (&s)[BN / 2], const float (&m)[2], float (&l)[2],
                                                         float scale_log2, const bool (&past)[2]) {
    const float neg_max[2] = { -m[0] * scale_log2, -m[1] * scale_log2 };
    float sum[2];
    fa3_exp_rows<BN>(s, neg_max, scale_log2, sum);
    if (!__all_sync(0xffffffffu, (past[0] || sum[0] <= kStaleSumMax) && (past[1] || sum[1] <= kStaleSumMax)))
        return false;
    l[0] += sum[0];
    l[1] += sum[1];
    return true;
}

template <int D>
static __device__ __forceinline__ void fa3_rescale(float (&o)[D / 2], const float (&factor)[2]) {
#pragma unroll
    for (int i = 0; i < D / 2; ++i) o[i] *= factor[(i >> 1) & 1];
}

template <int BN, typename T>
static __device__ __forceinline__ void fa3_convert_p(const float (&s)[BN / 2], uint32_t (&p)[BN / 4]) {
#pragma unroll
    for (int i = 0; i < BN / 4; ++i) p[i] = fa3_pack<T>(s[2 * i], s[2 * i + 1]);
}

static __device__ __forceinline__ void fa3_release(uint32_t bar, int lane) {
    if (lane == 0) hp_mbar_arrive(bar);
}

/* Softcap, mask and online softmax of one key block n, in place; pinned before whatever follows (without the
 * register fences the compiler may sink the softmax past the next wgmma wait). */
struct fa3_mask_info {
    int n_lo, n_hi; /* blocks outside [n_lo, n_hi) are masked */
    int len_k, off; /* key count, and where query 0 sits among the keys */
    float alibi;    /* ALiBi's slope in units of S (slope log2(e) / scale_log2), 0 without */
};

/* The mask of consumer warpgroup c's rows in tile g: its own 64 rows (OWN_ROWS, the kernels that skip idle
 * warpgroups), else the whole tile's. */
template <int BN, int GENERAL, bool OWN_ROWS>
static __device__ __forceinline__ fa3_mask_info fa3_mask_info_make(const fa3_args &a, const fa3_tile &g, int c) {
    fa3_mask_info mi;
    if (OWN_ROWS)
        fa3_mask_range<BN, GENERAL>(a, g, fa3_wg_row0(g, c), min(fa3_wg_row0(g, c) + 63, g.len_q - 1), mi.n_lo,
                                    mi.n_hi);
    else
        fa3_mask_range<BN, GENERAL>(a, g, fa3_wg_row0(g, 0), g.row_last, mi.n_lo, mi.n_hi);
    mi.len_k = g.len_k;
    mi.off = g.len_k - g.len_q - g.shift;
    mi.alibi = GENERAL == FA3_GENERAL_ALIBI ? a.alibi[g.b * a.alibi_batch_stride + g.h] * a.alibi_scale : 0.f;
    return mi;
}

/* Whether the thread's rows (row0, row0 + 8) lie past the sequence: in a varlen batch they hold the next
 * sequence's queries, which must not sway the warp's votes (fa3_softmax_stale), or this sequence's bits would
 * depend on the next one's values. Never in a dense batch: those rows are TMA's zero fill. */
template <int GENERAL>
static __device__ __forceinline__ void fa3_rows_past(bool (&past)[2], const fa3_mask_info &mi, int row0) {
#pragma unroll
    for (int h = 0; h < 2; ++h) past[h] = GENERAL && row0 + 8 * h + mi.off >= mi.len_k;
}

template <int BN>
static __device__ __forceinline__ void fa3_pin_scores(float (&s)[BN / 2], float (&factor)[2], float (&l)[2]) {
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) hp_fence_reg(s[i]);
    hp_fence_reg(factor[0]);
    hp_fence_reg(factor[1]);
    hp_fence_reg(l[0]);
    hp_fence_reg(l[1]);
}

/* Softcap, ALiBi and mask of key block n, in place. */
template <int BN, int GENERAL, bool R2P>
static __device__ __forceinline__ void fa3_softcap_mask(float (&s)[BN / 2], const fa3_args &a, const fa3_mask_info &mi,
                                                        int n, int row0, int quad) {
    if (GENERAL && a.softcap_pre != 0.0f) {
#pragma unroll
        for (int i = 0; i < BN / 2; ++i) s[i] = hp_tanh(s[i] * a.softcap_pre);
    }
    if (GENERAL == FA3_GENERAL_ALIBI) { /* -slope |key - query - off|: element e + 2 h + 4 c is (row0 + 8 h, 8 c + e) */
        const int d0 = n * BN + 2 * quad - (row0 + mi.off);
#pragma unroll
        for (int c = 0; c < BN / 8; ++c)
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int e = 0; e < 2; ++e) s[e + 2 * h + 4 * c] -= mi.alibi * fabsf((float)(d0 + 8 * c + e - 8 * h));
    }
    if (n < mi.n_lo || n >= mi.n_hi)
        fa3_mask<BN, R2P>(s, n * BN, row0, quad, mi.len_k, mi.off, GENERAL ? a.window_left : -1, a.window_right);
}

template <int BN, bool JOINT, int GENERAL, bool R2P>
static __device__ __forceinline__ bool fa3_scores(float (&s)[BN / 2], float (&m)[2], float (&l)[2], float (&factor)[2],
                                                  const fa3_args &a, const fa3_mask_info &mi, int n, int row0,
                                                  int quad) {
    fa3_softcap_mask<BN, GENERAL, R2P>(s, a, mi, n, row0, quad);
    const bool move = fa3_softmax<BN, JOINT>(s, m, l, factor, a.scale_log2, a.max_slack);
    fa3_pin_scores<BN>(s, factor, l);
    return move;
}

/* Softcap, mask and the softmax against the stale max (fa3_softmax_stale) of block n, where every row of the
 * warp has a max. Returns whether S is now P; if not, `destroyed` says whether S must be computed again
 * (fa3_mma_scores) before the full fa3_scores, which the caller runs once P V(n - 1) has retired. */
template <int BN, int GENERAL, bool MASKED>
static __device__ __forceinline__ bool fa3_scores_stale(float (&s)[BN / 2], const float (&m)[2], float (&l)[2],
                                                        const fa3_args &a, const fa3_mask_info &mi, int n, int row0,
                                                        int quad, bool &destroyed) {
    destroyed = false;
    bool past[2];
    fa3_rows_past<GENERAL>(past, mi, row0);
    if (!__all_sync(0xffffffffu, (past[0] || m[0] != -INFINITY) && (past[1] || m[1] != -INFINITY))) return false;
    if (MASKED) fa3_softcap_mask<BN, GENERAL, true>(s, a, mi, n, row0, quad);
    destroyed = !fa3_softmax_stale<BN>(s, m, l, a.scale_log2, past);
    return !destroyed;
}

/* S of key block n computed again (fa3_mma_scores) from K in global memory, found through the tile's fa3_krows
 * (at shared address `krows`). */
template <int D, int BN, typename T, bool QRS>
static __device__ __forceinline__ void fa3_scores_again(float (&s)[BN / 2], const fa3_qop<D, QRS> &q, uint32_t krows,
                                                        const fa3_args &a, int n, int lane) {
    unsigned long long k;
    int len_k;
    asm volatile("ld.shared.u64 %0, [%1];" : "=l"(k) : "r"(krows) : "memory");
    asm volatile("ld.shared.u32 %0, [%1];" : "=r"(len_k) : "r"(krows + 8) : "memory");
    const int key0 = n * BN;
    fa3_mma_scores<D, BN, T, QRS>(s, q, (const uint16_t *)k + key0 * a.k_stride_seq, a.k_stride_seq,
                                  min(BN, len_k - key0), lane);
}

/* The softmax of a tile's first key block n (three consumer warpgroups): against an estimate of the row max,
 * the max over a quarter of the block's columns (four column groups spread over it), checked like the stale
 * max (fa3_softmax_stale: each P at most 2^12). That takes three quarters of the max's FMNMX chains off the
 * path from the tile's first Q K^T to its first P V. Rows without a visible column among those, or a failed
 * check, take the full softmax (on S computed again where the check destroyed it). */
template <int D, int BN, typename T, bool QRS, int GENERAL>
static __device__ __forceinline__ void fa3_first_scores(float (&s)[BN / 2], const fa3_qop<D, QRS> &q, uint32_t krows,
                                                        float (&m)[2], float (&l)[2], const fa3_args &a,
                                                        const fa3_mask_info &mi, int n, int row0, int lane) {
    const int quad = lane % 4;
    fa3_softcap_mask<BN, GENERAL, true>(s, a, mi, n, row0, quad);
    constexpr int kGroups = BN / 8, kStep = (kGroups - 1) / 3;
    float est[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float t[4];
#pragma unroll
        for (int j = 0; j < 4; ++j) t[j] = fmaxf(s[4 * (j * kStep) + 2 * h], s[4 * (j * kStep) + 2 * h + 1]);
        est[h] = fmaxf(fmaxf(t[0], t[1]), fmaxf(t[2], t[3]));
        est[h] = fmaxf(est[h], __shfl_xor_sync(0xffffffffu, est[h], 1));
        est[h] = fmaxf(est[h], __shfl_xor_sync(0xffffffffu, est[h], 2));
    }
    bool past[2];
    fa3_rows_past<GENERAL>(past, mi, row0);
    bool done = __all_sync(0xffffffffu, (past[0] || est[0] != -INFINITY) && (past[1] || est[1] != -INFINITY)),
         destroyed = false;
    if (done) {
        m[0] = est[0];
        m[1] = est[1];
        done = fa3_softmax_stale<BN>(s, m, l, a.scale_log2, past);
        destroyed = !done;
    }
    float factor[2] = { 1.0f, 1.0f };
    if (!done) {
        /* S as computed again is raw; the intact S has had its softcap and mask (which must not be taken twice) */
        if (destroyed) {
            fa3_scores_again<D, BN, T, QRS>(s, q, krows, a, n, lane);
            fa3_softcap_mask<BN, GENERAL, true>(s, a, mi, n, row0, quad);
        }
        m[0] = m[1] = -INFINITY;
        fa3_softmax<BN, true>(s, m, l, factor, a.scale_log2, a.max_slack);
    }
    fa3_pin_scores<BN>(s, factor, l);
}

/* The LSE of the thread's two rows (seq_row0, seq_row0 + 8 of the sequence), rows < len_q only. */
static __device__ __forceinline__ void fa3_store_lse(const fa3_args &a, const fa3_tile &g, const float (&lse)[2],
                                                     int seq_row0, bool varlen) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int r = seq_row0 + 8 * hh;
        if (r < g.len_q) {
            const int64_t idx =
                varlen ? (int64_t)g.h * a.total_q + g.tok_q + r : ((int64_t)g.b * a.heads_q + g.h) * a.seqlen_q + r;
            a.lse[idx] = lse[hh];
        }
    }
}

/* O / l in 16 bits into a swizzled [D / 64][64][64] shared tile (what the O tensor map's TMA store reads). */
template <int D, typename T>
static __device__ __forceinline__ void fa3_o_to_smem(const float (&o)[D / 2], const float (&inv)[2], uint32_t s_o,
                                                     int warp, int lane) {
    const int quad = lane % 4;
#pragma unroll
    for (int cc = 0; cc < D / 8; ++cc)
#pragma unroll
        for (int hh = 0; hh < 2; ++hh) {
            const int r = 16 * warp + lane / 4 + 8 * hh;
            const uint32_t addr = s_o + (cc / 8) * (64 * 128) + r * 128 + (((cc % 8) ^ (r % 8)) << 4) + 4 * quad;
            const uint32_t v = fa3_pack<T>(o[4 * cc + 2 * hh] * inv[hh], o[4 * cc + 2 * hh + 1] * inv[hh]);
            asm volatile("st.shared.u32 [%0], %1;" ::"r"(addr), "r"(v) : "memory");
        }
}

/* O / l straight to global memory, rows < len_q only. */
template <int D, typename T>
static __device__ __forceinline__ void fa3_o_to_global(const float (&o)[D / 2], const float (&inv)[2],
                                                       const fa3_args &a, const fa3_tile &g, int row0, int quad) {
    uint16_t *obase = (uint16_t *)a.o +
                      (a.cu_q != nullptr ? (int64_t)g.tok_q * a.o_stride_seq : (int64_t)g.b * a.o_stride_batch) +
                      (int64_t)g.h * a.o_stride_head + 2 * quad;
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        const int r = row0 + 8 * hh;
        if (r < g.len_q) {
            uint16_t *orow = obase + (int64_t)r * a.o_stride_seq;
#pragma unroll
            for (int cc = 0; cc < D / 8; ++cc)
                *(uint32_t *)(orow + 8 * cc) =
                    fa3_pack<T>(o[4 * cc + 2 * hh] * inv[hh], o[4 * cc + 2 * hh + 1] * inv[hh]);
        }
    }
}

/* The K/V ring as a consumer warpgroup walks it. */
struct fa3_ring {
    uint32_t s_k, s_v;                         /* stage 0 of K and of V */
    uint32_t k_full, k_empty, v_full, v_empty; /* v_full: where the consumers wait for V (full or ready) */
    uint32_t krows;                            /* the tile's fa3_krows (three consumer warpgroups) */
};

/* Ping-pong: a consumer warpgroup waits for its turn to issue GEMMs, and passes the turn on after issuing.
 * Every warpgroup takes the same number of turns per tile, also one that skips the tile or its last blocks:
 * nb + 1 with the overlap (2 nb without) with two consumer warpgroups, whose turns start afresh each tile (the
 * last warpgroup drops its final arrival and hands the first turn over when it starts the next tile). With three
 * (fa3_turns_across_tiles) they run on across tiles: warpgroup 0 takes the next tile's first turn right after
 * the last warpgroup's last P V is issued instead of after its epilogue, so that the tensor cores do not drain
 * between tiles; one arrival is left over at the end, which warpgroup 0 takes before it exits. And with three a
 * tile's first Q K^T goes out without a turn, as soon as Q and its K block have landed (fa3_first_qk_free): nb
 * turns per tile, so a warpgroup between tiles has one turn fewer that can come due before it is ready. */
static __host__ __device__ constexpr bool fa3_turns_across_tiles(int nwg) {
    return nwg == 3;
}
static __host__ __device__ constexpr bool fa3_first_qk_free(int nwg) {
    return nwg == 3;
}
template <bool PINGPONG>
static __device__ __forceinline__ void fa3_pp_sync(int c) {
    FA3_EV(FA3_EV_TURN_REQ, 0);
    if (PINGPONG) hp_bar_sync(FA3_BAR_PINGPONG + c, 256);
    FA3_EV(FA3_EV_TURN, 0);
}
template <bool PINGPONG, int NWG>
static __device__ __forceinline__ void fa3_pp_arrive(int c, bool last_round) {
    if (PINGPONG && !(last_round && c == NWG - 1 && !fa3_turns_across_tiles(NWG)))
        hp_bar_arrive(FA3_BAR_PINGPONG + (c + 1) % NWG, 256);
    FA3_EV(FA3_EV_ARRIVE, last_round);
}
/* The first turn of a tile (or, with turns across tiles, of the CTA's first tile) goes to warpgroup 0. */
template <bool PINGPONG, int NWG>
static __device__ __forceinline__ void fa3_pp_first_turn(int c) {
    if (PINGPONG && c == NWG - 1) hp_bar_arrive(FA3_BAR_PINGPONG, 256);
}

/* One steady-state block i of the overlapped schedule: issue S = Q K(i)^T and O += P(i - 1) V(i - 1); softmax of
 * S(i) while P V runs; then retire P V, rescale O if the max moved, and convert S(i) into P for the next block.
 * (Converting before the wait, into a second P buffer, would take P V's registers off the critical path, but
 * ptxas gives the second buffer the in-flight registers of the first and waits anyway.)
 * KST < 0: any block (softcap, mask), the ring stage a run-time value. KST = 0 or 1: a block with neither, whose
 * K sits in stage KST of a two-stage ring: with the stages compile-time constants every wgmma descriptor is a
 * constant offset from the ring base, which ptxas keeps on the uniform datapath; with a run-time stage it
 * rebuilds each descriptor in vector registers and moves it over (R2UR) before each wgmma. */
template <int D, int BN, int NWG, typename T, bool PINGPONG, bool QRS, int GENERAL, int KST>
static __device__ __forceinline__ void
fa3_overlap_step(int i, int nb, int kv, const fa3_ring &r, const fa3_qop<D, QRS> &q, float (&s)[BN / 2],
                 float (&o)[D / 2], uint32_t (&p)[BN / 4], float (&m)[2], float (&l)[2], const fa3_args &a,
                 const fa3_mask_info &mi, int n_min, int row0, int lane, int c) {
    static_assert(KST < 0 || FA3_STAGES == 2, "compile-time stages need a two-stage ring");
    constexpr int kKV = BN * D * 2;
    const int j = kv + i; /* K(i); V(i - 1) is use j - 1 */
    const int st = KST < 0 ? fa3_pipe<FA3_STAGES>::stage(j) : KST,
              sp = KST < 0 ? fa3_pipe<FA3_STAGES>::stage(j - 1) : KST ^ 1;
    fa3_pp_sync<PINGPONG>(c); /* K(i) has landed: waited for one block earlier */
    fa3_issue_qk<D, BN, T, QRS>(s, q, hp_desc_sw128(r.s_k + st * kKV, 16, 1024));
    hp_mbar_wait(r.v_full + 8 * sp, fa3_pipe<FA3_STAGES>::phase(j - 1));
    fa3_issue_pv<D, BN, T>(o, p, hp_desc_sw128(r.s_v + sp * kKV, BN * 128, 1024));
    fa3_pp_arrive<PINGPONG, NWG>(c, false);
    hp_wgmma_wait<1>();
#pragma unroll
    for (int jj = 0; jj < BN / 2; ++jj) hp_fence_reg(s[jj]);
    FA3_EV(FA3_EV_QK_DONE, i);
    fa3_release(r.k_empty + 8 * st, lane);
    /* The three-warpgroup kernels take the softmax against the stale max. */
    constexpr bool kStale = NWG == 3;
    float factor[2] = { 1.0f, 1.0f };
    bool move = false, done = true, destroyed = false;
    if constexpr (kStale) {
        done = fa3_scores_stale<BN, GENERAL, (KST < 0)>(s, m, l, a, mi, n_min + i, row0, lane % 4, destroyed);
        fa3_pin_scores<BN>(s, factor, l);
    } else if constexpr (KST < 0) {
        move = fa3_scores<BN, false, GENERAL, false>(s, m, l, factor, a, mi, n_min + i, row0, lane % 4);
    } else {
        move = fa3_softmax<BN, false>(s, m, l, factor, a.scale_log2, a.max_slack);
        fa3_pin_scores<BN>(s, factor, l);
    }
    /* Waiting for the next K block here (it is needed next anyway) puts a loop between the softmax and the
     * wait below; otherwise ptxas hoists that wait above the softmax and P V(i - 1) no longer overlaps it. */
    if (i + 1 < nb) hp_mbar_wait(r.k_full + 8 * fa3_pipe<FA3_STAGES>::stage(j + 1), fa3_pipe<FA3_STAGES>::phase(j + 1));
    hp_wgmma_wait<0>();
    fa3_pv_done<D, BN>(o, p);
    FA3_EV(FA3_EV_PV_DONE, i);
    fa3_release(r.v_empty + 8 * sp, lane);
    if constexpr (kStale) {
        if (!done) {
            /* The rare block the stale max does not cover (or a row without a max yet): the full softmax, after
             * P V(i - 1), so that P's registers are free for computing S again (the K stage is gone by now). */
            if (destroyed) fa3_scores_again<D, BN, T, QRS>(s, q, r.krows, a, n_min + i, lane);
            move = fa3_scores<BN, true, GENERAL, true>(s, m, l, factor, a, mi, n_min + i, row0, lane % 4);
        }
    }
    if (move) fa3_rescale<D>(o, factor);
    fa3_convert_p<BN, T>(s, p);
}

/* A tile's first key block in the overlapped schedule: Q K(0)^T (with three consumer warpgroups without a turn,
 * fa3_first_qk_free), its softmax (fa3_first_scores with three) and P(0), then the wait for K(1). */
template <int D, int BN, int NWG, typename T, bool PINGPONG, bool QRS, int GENERAL>
static __device__ __forceinline__ void
fa3_overlap_first(int nbw, int kv, const fa3_ring &r, const fa3_qop<D, QRS> &q, float (&s)[BN / 2],
                  uint32_t (&p)[BN / 4], float (&m)[2], float (&l)[2], float (&factor)[2], const fa3_args &a,
                  const fa3_mask_info &mi, int n_min, int row0, int lane, int c) {
    constexpr int kKV = BN * D * 2;
    const int st0 = fa3_pipe<FA3_STAGES>::stage(kv);
    hp_mbar_wait(r.k_full + 8 * st0, fa3_pipe<FA3_STAGES>::phase(kv));
    if (!fa3_first_qk_free(NWG)) fa3_pp_sync<PINGPONG>(c);
    fa3_issue_qk<D, BN, T, QRS>(s, q, hp_desc_sw128(r.s_k + st0 * kKV, 16, 1024));
    if (!fa3_first_qk_free(NWG)) fa3_pp_arrive<PINGPONG, NWG>(c, false);
    hp_wgmma_wait<0>();
#pragma unroll
    for (int i = 0; i < BN / 2; ++i) hp_fence_reg(s[i]);
    FA3_EV(FA3_EV_QK_DONE, 0);
    fa3_release(r.k_empty + 8 * st0, lane);
    if constexpr (NWG == 3)
        fa3_first_scores<D, BN, T, QRS, GENERAL>(s, q, r.krows, m, l, a, mi, n_min, row0, lane);
    else
        fa3_scores<BN, false, GENERAL, false>(s, m, l, factor, a, mi, n_min, row0, lane % 4);
    fa3_convert_p<BN, T>(s, p);
    if (nbw > 1) hp_mbar_wait(r.k_full + 8 * fa3_pipe<FA3_STAGES>::stage(kv + 1), fa3_pipe<FA3_STAGES>::phase(kv + 1));
}

/* N (1 or 2) blocks from i, neither masked nor softcapped, in steps whose ring stages are compile-time constants
 * (one copy of the code per parity of block i's stage). */
template <int D, int BN, int NWG, typename T, bool PINGPONG, bool QRS, int GENERAL, int N>
static __device__ __forceinline__ void
fa3_overlap_fast(int i, int nb, int kv, const fa3_ring &r, const fa3_qop<D, QRS> &q, float (&s)[BN / 2],
                 float (&o)[D / 2], uint32_t (&p)[BN / 4], float (&m)[2], float (&l)[2], const fa3_args &a,
                 const fa3_mask_info &mi, int n_min, int row0, int lane, int c) {
    static_assert(N == 1 || N == 2, "one or two blocks");
    if (fa3_pipe<FA3_STAGES>::stage(kv + i) != 0) {
        fa3_overlap_step<D, BN, NWG, T, PINGPONG, QRS, GENERAL, 1>(i, nb, kv, r, q, s, o, p, m, l, a, mi, n_min, row0,
                                                                   lane, c);
        if (N == 2)
            fa3_overlap_step<D, BN, NWG, T, PINGPONG, QRS, GENERAL, 0>(i + 1, nb, kv, r, q, s, o, p, m, l, a, mi, n_min,
                                                                       row0, lane, c);
    } else {
        fa3_overlap_step<D, BN, NWG, T, PINGPONG, QRS, GENERAL, 0>(i, nb, kv, r, q, s, o, p, m, l, a, mi, n_min, row0,
                                                                   lane, c);
        if (N == 2)
            fa3_overlap_step<D, BN, NWG, T, PINGPONG, QRS, GENERAL, 1>(i + 1, nb, kv, r, q, s, o, p, m, l, a, mi, n_min,
                                                                       row0, lane, c);
    }
}

/* Key blocks [1, nbw) of a tile in the overlapped schedule. Blocks [fast_lo, fast_hi) need neither mask nor
 * softcap: pairs of them take the steps with compile-time stages, and so does a lone one (kLoneFast; an even
 * block count leaves one after the tile's first block); the other blocks the general step. */
template <int D, int BN, int NWG, typename T, bool PINGPONG, bool QRS, int GENERAL>
static __device__ __forceinline__ void
fa3_overlap_blocks(int nbw, int kv, const fa3_ring &r, const fa3_qop<D, QRS> &q, float (&s)[BN / 2], float (&o)[D / 2],
                   uint32_t (&p)[BN / 4], float (&m)[2], float (&l)[2], const fa3_args &a, const fa3_mask_info &mi,
                   int n_min, int row0, int lane, int c) {
    constexpr bool kLoneFast = fa3_cfg<D, BN, NWG>::kLoneFast;
    const int fast_lo = max(1, mi.n_lo - n_min);
    const int fast_hi =
        GENERAL == FA3_GENERAL_ALIBI || (GENERAL && a.softcap_pre != 0.0f) ? 0 : min(nbw, mi.n_hi - n_min);
#pragma unroll 1
    for (int i = 1; i < nbw;) {
        if (i >= fast_lo && i + 1 < fast_hi) {
            fa3_overlap_fast<D, BN, NWG, T, PINGPONG, QRS, GENERAL, 2>(i, nbw, kv, r, q, s, o, p, m, l, a, mi, n_min,
                                                                       row0, lane, c);
            i += 2;
        } else if (kLoneFast && i >= fast_lo && i < fast_hi) {
            fa3_overlap_fast<D, BN, NWG, T, PINGPONG, QRS, GENERAL, 1>(i, nbw, kv, r, q, s, o, p, m, l, a, mi, n_min,
                                                                       row0, lane, c);
            ++i;
        } else {
            fa3_overlap_step<D, BN, NWG, T, PINGPONG, QRS, GENERAL, -1>(i, nbw, kv, r, q, s, o, p, m, l, a, mi, n_min,
                                                                        row0, lane, c);
            ++i;
        }
    }
}

/* The last P V of a tile (overlapped schedule). half (with HALF): no row sees the block's second half, so P is
 * zero there and the P V takes the first half of the keys only. */
template <int D, int BN, int NWG, typename T, bool PINGPONG, bool HALF>
static __device__ __forceinline__ void fa3_overlap_tail(int nb, int kv, const fa3_ring &r, float (&o)[D / 2],
                                                        uint32_t (&p)[BN / 4], bool half, int lane, int c) {
    const int j = kv + nb - 1;
    const int sl = fa3_pipe<FA3_STAGES>::stage(j);
    hp_mbar_wait(r.v_full + 8 * sl, fa3_pipe<FA3_STAGES>::phase(j));
    fa3_pp_sync<PINGPONG>(c);
    const uint64_t desc_v = hp_desc_sw128(r.s_v + sl * (BN * D * 2), BN * 128, 1024);
    if (HALF && half)
        fa3_issue_pv<D, BN, T, HALF ? BN / 2 : BN>(o, p, desc_v);
    else
        fa3_issue_pv<D, BN, T>(o, p, desc_v);
    fa3_pp_arrive<PINGPONG, NWG>(c, true);
    hp_wgmma_wait<0>();
    fa3_pv_done<D, BN>(o, p);
    FA3_EV(FA3_EV_PV_DONE, nb);
    fa3_release(r.v_empty + 8 * sl, lane);
}

/* Key blocks [i0, nb) of the tile that this warpgroup does not compute (overlapped schedule, the only one of the
 * kernels that skip): it issues nothing, but takes its turn of the ping-pong for each (Q K(i)^T with P V(i - 1);
 * block 0 has none, fa3_first_qk_free) and releases every K and V block like the others, so that the barriers'
 * counts and phases stay what the producer and the other warpgroups expect. A block is released only once it has
 * landed: an early arrival would count towards the stage's previous use. */
template <int NWG, bool PINGPONG>
static __device__ __forceinline__ void fa3_skip_blocks(int i0, int nb, int kv, const fa3_ring &r, int lane, int c) {
#pragma unroll 1
    for (int i = i0; i < nb; ++i) {
        if (i > 0 || !fa3_first_qk_free(NWG)) {
            fa3_pp_sync<PINGPONG>(c);
            fa3_pp_arrive<PINGPONG, NWG>(c, false);
        }
        const int j = kv + i;
        const int st = fa3_pipe<FA3_STAGES>::stage(j);
        const uint32_t parity = fa3_pipe<FA3_STAGES>::phase(j);
        hp_mbar_wait(r.k_full + 8 * st, parity);
        fa3_release(r.k_empty + 8 * st, lane);
        hp_mbar_wait(r.v_full + 8 * st, parity);
        fa3_release(r.v_empty + 8 * st, lane);
    }
}

/* A tile in which this warpgroup has no rows: Q and every block skipped, then the turn of the tile's last P V
 * (the turns run on across tiles in these kernels: no first turn to hand over). */
template <int NWG, bool PINGPONG>
static __device__ __forceinline__ void fa3_idle_tile(int nb, int kv, const fa3_ring &r, uint32_t q_full,
                                                     uint32_t q_empty, uint32_t q_parity, int lane, int c) {
    static_assert(fa3_turns_across_tiles(NWG), "idle tiles take no first turn");
    hp_mbar_wait(q_full, q_parity);
    fa3_release(q_empty, lane);
    fa3_skip_blocks<NWG, PINGPONG>(0, nb, kv, r, lane, c);
    fa3_pp_sync<PINGPONG>(c);
    fa3_pp_arrive<PINGPONG, NWG>(c, true);
}

/* A tile's key blocks in the overlapped schedule, for consumer warpgroup c: the first block, the steady state,
 * the last P V, and the blocks past the warpgroup's own rows skipped. q_empty: the warpgroup's Q tile, free once
 * every Q K^T has completed where O has tiles of its own and Q is read from shared memory. */
template <int D, int BN, int NWG, typename T, bool PINGPONG, bool QRS, int GENERAL>
static __device__ __forceinline__ void
fa3_overlap_tile(int nb, int kv, const fa3_ring &r, const fa3_qop<D, QRS> &q, float (&s)[BN / 2], float (&o)[D / 2],
                 uint32_t (&p)[BN / 4], float (&m)[2], float (&l)[2], float (&factor)[2], const fa3_args &a,
                 const fa3_tile &g, const fa3_mask_info &mi, int row0, int lane, int c, uint32_t q_empty) {
    typedef fa3_cfg<D, BN, NWG> C;
    constexpr bool kSkipIdle = C::kSkipIdle;
    const int n_min = g.n_min;
    /* Under a right-bounded mask the rows of the tile's first warpgroups may end before its last key blocks,
     * which are then masked out for all of them: such a warpgroup stops after its own blocks (nbw) and only takes
     * its turns through the rest. */
    int nbw = nb;
    /* The last block's P V over its first half only (fa3_overlap_tail): one warpgroup in two under a causal mask;
     * without one, where the last block holds at most BN / 2 keys. */
    bool half_pv = false;
    if (kSkipIdle) {
        const long long hi = fa3_key_end(a, g, min(fa3_wg_row0(g, c) + 63, g.len_q - 1));
        if (a.window_right >= 0) nbw = max(1, min(nb, (int)((hi + BN - 1) / BN) - n_min));
        half_pv = hi - (long long)(n_min + nbw - 1) * BN <= BN / 2;
    }
    fa3_overlap_first<D, BN, NWG, T, PINGPONG, QRS, GENERAL>(nbw, kv, r, q, s, p, m, l, factor, a, mi, n_min, row0,
                                                             lane, c);
    fa3_overlap_blocks<D, BN, NWG, T, PINGPONG, QRS, GENERAL>(nbw, kv, r, q, s, o, p, m, l, a, mi, n_min, row0, lane,
                                                              c);
    /* Every Q K^T of the tile has completed. */
    if (C::kSeparateO && !QRS) fa3_release(q_empty, lane);
    fa3_overlap_tail<D, BN, NWG, T, PINGPONG, kSkipIdle>(nbw, kv, r, o, p, half_pv, lane, c);
    if constexpr (kSkipIdle) fa3_skip_blocks<NWG, PINGPONG>(nbw, nb, kv, r, lane, c);
}

/* A tile's key blocks without the overlap (the measurement schedules of a tuning build): per block Q K^T, the
 * softmax and P V, each GEMM in a turn of its own. q_empty as in fa3_overlap_tile. */
template <int D, int BN, int NWG, typename T, bool PINGPONG, bool QRS, int GENERAL>
static __device__ __forceinline__ void
fa3_plain_tile(int kv, const fa3_ring &r, const fa3_qop<D, QRS> &q, float (&s)[BN / 2], float (&o)[D / 2],
               uint32_t (&p)[BN / 4], float (&m)[2], float (&l)[2], float (&factor)[2], const fa3_args &a,
               const fa3_tile &g, const fa3_mask_info &mi, int row0, int lane, int c, uint32_t q_empty) {
    typedef fa3_cfg<D, BN, NWG> C;
    const int nb = g.nblocks, n_min = g.n_min, quad = lane % 4;
#pragma unroll 1
    for (int i = 0; i < nb; ++i) {
        const int j = kv + i;
        const int st = fa3_pipe<FA3_STAGES>::stage(j);
        const uint32_t parity = fa3_pipe<FA3_STAGES>::phase(j);
        hp_mbar_wait(r.k_full + 8 * st, parity);
        fa3_pp_sync<PINGPONG>(c);
        fa3_issue_qk<D, BN, T, QRS>(s, q, hp_desc_sw128(r.s_k + st * C::kKVBytes, 16, 1024));
        fa3_pp_arrive<PINGPONG, NWG>(c, false);
        hp_wgmma_wait<0>();
#pragma unroll
        for (int jj = 0; jj < BN / 2; ++jj) hp_fence_reg(s[jj]);
        fa3_release(r.k_empty + 8 * st, lane);
        if (C::kSeparateO && !QRS && i == nb - 1) fa3_release(q_empty, lane);
        if (fa3_scores<BN, false, GENERAL, false>(s, m, l, factor, a, mi, n_min + i, row0, quad))
            fa3_rescale<D>(o, factor);
        fa3_convert_p<BN, T>(s, p);
        hp_mbar_wait(r.v_full + 8 * st, parity);
        fa3_pp_sync<PINGPONG>(c);
        fa3_issue_pv<D, BN, T>(o, p, hp_desc_sw128(r.s_v + st * C::kKVBytes, C::kKVSlab, 1024));
        fa3_pp_arrive<PINGPONG, NWG>(c, i == nb - 1);
        hp_wgmma_wait<0>();
        fa3_pv_done<D, BN>(o, p);
        fa3_release(r.v_empty + 8 * st, lane);
    }
}

/* A tile's rows at its end: full row sums, then per row of the thread the factor of O (1 / l) and the LSE
 * (natural log). A row the mask leaves no key (none at all, or the window's right edge before key 0; its left
 * edge never passes the last key, where the last row sits) gets O = 0, not O / l (a masked key's 0 times a NaN in
 * V reaches it), and LSE = -inf; a row that sees keys but whose sum is not positive (NaN after a NaN or +inf
 * score, 0 when every visible score is -inf) is NaN. seq_row0: the thread's first row in the sequence. The e4m3
 * kernel passes its tile's scale_log2 (q and k descales folded in), v's descale, which multiplies 1 / l, and the
 * log2 of P at the row max (fa3_softmax's p_log2), which l carries. */
template <int D>
static __device__ __forceinline__ void
fa3_finalize(float (&o)[D / 2], float (&l)[2], const float (&m)[2], float (&inv)[2], float (&lse)[2], const fa3_args &a,
             const fa3_tile &g, int seq_row0, float scale_log2, float v_descale = 1.0f, float p_log2 = 0.0f) {
    bool empty_row[2];
#pragma unroll
    for (int hh = 0; hh < 2; ++hh)
        empty_row[hh] = g.len_k == 0 ||
                        (a.window_right >= 0 && (long long)seq_row0 + 8 * hh + g.len_k - g.len_q + a.window_right < 0);
    /* zeroed under a warp-uniform branch: a per-thread one made ptxas copy every O register on both paths */
    if (__any_sync(0xffffffffu, empty_row[0] || empty_row[1])) {
#pragma unroll
        for (int i = 0; i < D / 2; ++i)
            if (empty_row[(i >> 1) & 1]) o[i] = 0.0f;
    }
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
        l[hh] += __shfl_xor_sync(0xffffffffu, l[hh], 1);
        l[hh] += __shfl_xor_sync(0xffffffffu, l[hh], 2);
        const bool empty = empty_row[hh];
        inv[hh] = empty ? 0.0f : l[hh] > 0.0f ? v_descale / l[hh] : NAN;
        const float log2_l = p_log2 != 0.0f ? __log2f(l[hh]) - p_log2 : __log2f(l[hh]);
        lse[hh] = empty ? -INFINITY : l[hh] > 0.0f ? (m[hh] * scale_log2 + log2_l) * 0.69314718055994531f : NAN;
    }
}

/* A consumer warpgroup's O of a tile (times inv): through shared memory and one TMA store (rows past a dense
 * sequence's end fall outside the tensor map and are not written); directly for tiles that saw no key and
 * varlen tiles that reach past their sequence. Where O is staged in the Q tile, that tile is then released. */
template <int D, int BN, int NWG, typename T>
static __device__ __forceinline__ void fa3_store_o(const float (&o)[D / 2], const float (&inv)[2], const fa3_args &a,
                                                   const fa3_tile &g, const CUtensorMap &tm_o, uint8_t *smem, int nb,
                                                   int seq_row0, bool varlen, int c, int t, int warp, int lane) {
    typedef fa3_cfg<D, BN, NWG> C;
    const uint32_t s_q = hp_smem_addr(smem), bar_q_empty = s_q + C::kOffBar + C::Bars::kQEmpty;
    const int wg_row0 = fa3_wg_row0(g, c);
    const bool tma_store = nb > 0 && (!varlen || wg_row0 + 64 <= g.len_q);
    if (tma_store) {
        const uint32_t s_o = C::kSeparateO ? s_q + C::kOffO + c * C::kQBytes : s_q + c * C::kQBytes;
        if (C::kSeparateO) {
            if (t == 0) hp_tma_store_wait_read(); /* the previous tile's store has left the buffer */
            hp_bar_sync(FA3_BAR_PINGPONG + NWG + c, 128);
        }
        fa3_o_to_smem<D, T>(o, inv, s_o, warp, lane);
        hp_fence_proxy_async();
        hp_bar_sync(FA3_BAR_PINGPONG + NWG + c, 128);
        if (t == 0) {
            hp_tma_store_5d(&tm_o, s_o, 0, g.tok_q + wg_row0, 0, g.h, varlen ? 0 : g.b);
            hp_tma_store_commit();
            if (!C::kSeparateO) {
                hp_tma_store_wait_read(); /* O sits in the Q tile: free it for the next tile's Q */
                hp_mbar_arrive_cnt(bar_q_empty + 8 * c, 4);
            }
        }
    } else {
        fa3_o_to_global<D, T>(o, inv, a, g, seq_row0, lane % 4);
        if (!C::kSeparateO && nb > 0) fa3_release(bar_q_empty + 8 * c, lane);
    }
}

#endif /* FA_SM90A */

/* Warpgroup 0's second warp in a varlen batch: every V block in ring order; zero the rows past the sequence, then
 * mark the block ready. The rows of a V block past its sequence belong to the next sequence or to the padding
 * after the last one, which may hold anything (NaN), and 0 * NaN in P V would poison O. */
template <int D, int BN, int NWG>
static __device__ __forceinline__ void fa3_v_fixer(uint32_t s_v, uint32_t bar_v_full, uint32_t bar_v_ready,
                                                   volatile const int *v_valid) {
    typedef fa3_cfg<D, BN, NWG> C;
    const int lane = threadIdx.x % 32;
    for (int j = 0;; ++j) {
        const int st = fa3_pipe<FA3_STAGES>::stage(j);
        hp_mbar_wait(bar_v_full + 8 * st, fa3_pipe<FA3_STAGES>::phase(j));
        const int valid = __shfl_sync(0xffffffffu, lane == 0 ? v_valid[st] : 0, 0); /* as tile_ids */
        if (valid < 0) break;
        if (valid < BN) {
            const uint32_t base = s_v + st * C::kKVBytes;
            const int per_slab = (BN - valid) * 8; /* 16-byte chunks of the dead rows of one 64-column slab */
            for (int x = lane; x < per_slab * (D / 64); x += 32) {
                const int slab = x / per_slab, rem = x - slab * per_slab;
                const uint32_t addr = base + slab * C::kKVSlab + (valid + rem / 8) * 128 + (rem % 8) * 16;
                asm volatile("st.shared.v4.u32 [%0], {%1, %1, %1, %1};" ::"r"(addr), "r"(0) : "memory");
            }
            hp_fence_proxy_async(); /* before wgmma (async proxy) reads what these stores wrote */
        }
        __syncwarp();
        if (lane == 0) hp_mbar_arrive(bar_v_ready + 8 * st);
    }
}

/* A consumer's geometry of the tile it took: the producer's copy (three consumer warpgroups; every thread reads
 * it, then releases the index slot tile_empty), else its own fa3_sched::tile_get. False: the tile starts past
 * its sequence. */
template <int D, int BN, int NWG, int GENERAL>
static __device__ __forceinline__ bool fa3_consumer_tile(const fa3_args &a, int tile, const fa3_tile &published,
                                                         uint32_t tile_empty, fa3_tile &g) {
    typedef fa3_cfg<D, BN, NWG> C;
    if constexpr (C::kSharedGeo) {
        g = published;
        hp_mbar_arrive(tile_empty);
        return g.nblocks >= 0;
    } else {
        return fa3_sched::tile_get<C::kBlockM, BN, C::kSkipIdle, GENERAL, C::kFastDiv>(a, tile, g);
    }
}

/* The producer's loads of a tile with key blocks (one thread). K(i) goes out before V(i - 1): with the overlap,
 * Q K(i)^T is issued before P(i - 1) V(i - 1). The first K block goes before Q, which may wait for the previous
 * tile's epilogue. kv: the K/V ring's use number of the tile's first block; q_loads: the Q tiles', counted on
 * here. */
template <int D, int BN, int NWG, int EB = 2>
static __device__ __forceinline__ void fa3_load_tile(const fa3_args &a, const fa3_tile &g, int &kv, int &q_loads,
                                                     bool varlen, const CUtensorMap &tm_q, const CUtensorMap &tm_k,
                                                     const CUtensorMap &tm_v, uint8_t *smem) {
    typedef fa3_cfg<D, BN, NWG, EB> C;
    typedef typename C::Bars B;
    const uint32_t s_q = hp_smem_addr(smem), s_k = s_q + C::kOffK, s_v = s_q + C::kOffV, bars = s_q + C::kOffBar;
    volatile int *v_valid = (volatile int *)(smem + C::kOffBar + B::kVValid);
    const int bq = varlen ? 0 : g.b, hk = C::kFastDiv ? fa3_div(a.div_group, g.h) : g.h / a.group;
    for (int i = 0; i <= g.nblocks; ++i) {
        if (i < g.nblocks) {
            const int j = kv + i;
            const int st = fa3_pipe<FA3_STAGES>::stage(j);
            hp_mbar_wait(bars + B::kKEmpty + 8 * st, fa3_pipe<FA3_STAGES>::empty_phase(j));
            FA3_EV(FA3_EV_KLOAD, i);
            hp_mbar_arrive_expect_tx(bars + B::kKFull + 8 * st, C::kKVBytes);
            hp_tma_load_5d(s_k + st * C::kKVBytes, &tm_k, bars + B::kKFull + 8 * st, 0, g.tok_k + (g.n_min + i) * BN, 0,
                           hk, bq);
        }
        if (i == 0) {
            for (int w = 0; w < NWG; ++w) {
                hp_mbar_wait(bars + B::kQEmpty + 8 * w, fa3_pipe<1>::empty_phase(q_loads));
                if (!C::kSkipIdle || fa3_wg_has_rows(g, w)) {
                    hp_mbar_arrive_expect_tx(bars + B::kQFull + 8 * w, C::kQBytes);
                    hp_tma_load_5d(s_q + w * C::kQBytes, &tm_q, bars + B::kQFull + 8 * w, 0,
                                   g.tok_q + fa3_wg_row0(g, w), 0, g.h, bq);
                    FA3_EV(FA3_EV_QLOAD, w);
                } else {
                    hp_mbar_arrive(bars + B::kQFull + 8 * w);
                }
            }
            ++q_loads;
        } else {
            const int j = kv + i - 1;
            const int st = fa3_pipe<FA3_STAGES>::stage(j);
            hp_mbar_wait(bars + B::kVEmpty + 8 * st, fa3_pipe<FA3_STAGES>::empty_phase(j));
            FA3_EV(FA3_EV_VLOAD, i - 1);
            v_valid[st] = min(BN, g.len_k - (g.n_min + i - 1) * BN);
            hp_mbar_arrive_expect_tx(bars + B::kVFull + 8 * st, C::kKVBytes);
            hp_tma_load_5d(s_v + st * C::kKVBytes, &tm_v, bars + B::kVFull + 8 * st, 0,
                           g.tok_k + (g.n_min + i - 1) * BN, 0, hk, bq);
        }
    }
    kv += g.nblocks;
}

/* Warpgroup 0's first thread: claims the tiles (fa3_sched), publishes each one's index (with kSharedGeo also its
 * geometry) to the consumers in the two index slots, and loads its Q, K and V (fa3_load_tile). EB = 1 (e4m3):
 * the V^T writer waits for every V block, as the varlen V fixer does. */
template <int D, int BN, int NWG, int GENERAL, int EB = 2>
static __device__ __forceinline__ void fa3_producer(const fa3_args &a, const CUtensorMap &tm_q, const CUtensorMap &tm_k,
                                                    const CUtensorMap &tm_v, uint8_t *smem, bool varlen) {
    typedef fa3_cfg<D, BN, NWG, EB> C;
    typedef typename C::Bars B;
    const uint32_t bars = hp_smem_addr(smem) + C::kOffBar;
    volatile int *tile_ids = (volatile int *)(smem + C::kOffBar + B::kTileIds);
    volatile int *v_valid = (volatile int *)(smem + C::kOffBar + B::kVValid);
    fa3_tile *geo = (fa3_tile *)(smem + C::kOffGeo);
    fa3_krows *krows = (fa3_krows *)(smem + C::kOffKrows);
    hp_prefetch_tensor_map(&tm_q);
    hp_prefetch_tensor_map(&tm_k);
    hp_prefetch_tensor_map(&tm_v);
    if (a.tile_counter != nullptr && blockIdx.x == 0) fa3_sched::counter_reset(a);
    int claim = blockIdx.x, q_loads = 0, kv = 0;
    for (int k = 0;; ++k) {
        const int tile = C::kSharedGeo ? fa3_sched::claim_order(a, claim) : claim;
        /* Publish the tile index (double-buffered) to the consumers. */
        const int slot = fa3_pipe<2>::stage(k);
        hp_mbar_wait(bars + B::kTileEmpty + 8 * slot, fa3_pipe<2>::empty_phase(k));
        tile_ids[slot] = tile;
        fa3_tile g;
        bool valid = false;
        if (C::kSharedGeo && tile < a.num_tiles) {
            valid = fa3_sched::tile_get<C::kBlockM, BN, C::kSkipIdle, GENERAL, C::kFastDiv>(a, tile, g);
            fa3_publish_tile(a, g, valid, varlen, geo[k & (C::kTileRing - 1)], krows[k & (C::kTileRing - 1)]);
        }
        hp_mbar_arrive(bars + B::kTileFull + 8 * slot);
        if (tile >= a.num_tiles) break;
        FA3_EV(FA3_EV_PTILE, tile);
        if (!C::kSharedGeo) valid = fa3_sched::tile_get<C::kBlockM, BN, C::kSkipIdle, GENERAL, C::kFastDiv>(a, tile, g);
        if (valid && g.nblocks > 0) {
            fa3_load_tile<D, BN, NWG, EB>(a, g, kv, q_loads, varlen, tm_q, tm_k, tm_v, smem);
        }
        /* The next tile is claimed once this one's loads are out (about two blocks before the consumers finish
         * it), not when it starts: the SM that frees up first takes the next tile of the order (measured 1-3%
         * faster at head dim 128). */
        claim = fa3_sched::next_claim(a, claim, k == 0);
    }
    if (varlen || EB == 1) { /* tell the V fixer (V^T writer) that no block follows: a phase of V full, no transfer */
        const int st = fa3_pipe<FA3_STAGES>::stage(kv);
        hp_mbar_wait(bars + B::kVEmpty + 8 * st, fa3_pipe<FA3_STAGES>::empty_phase(kv));
        v_valid[st] = -1;
        hp_mbar_arrive(bars + B::kVFull + 8 * st);
    }
}

extern __shared__ __align__(1024) uint8_t fa3_smem[];

template <int D, int BN, int NWG, typename T, bool OVERLAP, bool PINGPONG, bool QRS, int GENERAL>
__global__ void __launch_bounds__(128 * (NWG + 1), 1)
    fa3_fwd_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                   const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_o,
                   const __grid_constant__ fa3_args a) {
#if FA_SM90A
    typedef fa3_cfg<D, BN, NWG> C;
    constexpr int BM = C::kBlockM;
    constexpr bool kSkipIdle = C::kSkipIdle, kFastDiv = C::kFastDiv;
    static_assert(!kSkipIdle || OVERLAP, "skipped tiles and blocks take the turns of the overlapped schedule");
    /* With Q in registers its tile is free once loaded; O must then have tiles of its own. */
    static_assert(!QRS || C::kSeparateO, "Q in registers needs separate O tiles");

    uint8_t *smem = (uint8_t *)(((uintptr_t)fa3_smem + 1023) & ~(uintptr_t)1023);
    const uint32_t s_q = hp_smem_addr(smem), s_k = s_q + C::kOffK, s_v = s_q + C::kOffV;
    typedef typename C::Bars B;
    const uint32_t bar_q_full = s_q + C::kOffBar + B::kQFull, bar_q_empty = s_q + C::kOffBar + B::kQEmpty;
    const uint32_t bar_k_full = s_q + C::kOffBar + B::kKFull, bar_k_empty = s_q + C::kOffBar + B::kKEmpty;
    const uint32_t bar_v_full = s_q + C::kOffBar + B::kVFull, bar_v_empty = s_q + C::kOffBar + B::kVEmpty;
    const uint32_t bar_tile_full = s_q + C::kOffBar + B::kTileFull, bar_tile_empty = s_q + C::kOffBar + B::kTileEmpty;
    const uint32_t bar_v_ready = s_q + C::kOffBar + B::kVReady;
    volatile int *tile_ids = (volatile int *)(smem + C::kOffBar + B::kTileIds);
    volatile int *v_valid = (volatile int *)(smem + C::kOffBar + B::kVValid); /* -1: no more blocks */
    constexpr bool kSharedGeo = C::kSharedGeo;
    static_assert(sizeof(fa3_tile) <= C::kGeoBytes, "tile geometry slot");
    fa3_tile *geo = (fa3_tile *)(smem + C::kOffGeo);
    const bool varlen = GENERAL && a.cu_q != nullptr;
    /* In a varlen batch the rows of a V block past its sequence belong to the next sequence or to the padding
     * after the last one, which may hold anything (NaN): 0 * NaN in P V would poison O. There the second
     * producer warp zeroes those rows after the TMA lands and the consumers wait for it (V "ready") instead of
     * for the TMA (V "full"); past len_k inside the tensor TMA's own zero fill does the same for dense batches. */
    const uint32_t bar_v_wait = varlen ? bar_v_ready : bar_v_full;

    if (threadIdx.x == 0) B::init(s_q + C::kOffBar, kSharedGeo);
#if FA3_TRACE
    if (threadIdx.x < 4) fa3_trace_n[threadIdx.x] = 0;
#endif
    __syncthreads();

    const int wg = threadIdx.x / 128;
    if (wg == 0) {
        hp_setmaxnreg_dec<C::kRegsProducer>();
        if (threadIdx.x == 0)
            fa3_producer<D, BN, NWG, GENERAL>(a, tm_q, tm_k, tm_v, smem, varlen);
        else if (varlen && threadIdx.x / 32 == 1)
            fa3_v_fixer<D, BN, NWG>(s_v, bar_v_full, bar_v_ready, v_valid);
    } else {
        hp_setmaxnreg_inc<C::kRegsConsumer>();
        const int c = wg - 1;
        const int t = threadIdx.x % 128, warp = t / 32, lane = t % 32;
        fa3_qop<D, QRS> q;
        q.desc = hp_desc_sw128(s_q + c * C::kQBytes, 16, 1024);
        int kv = 0, q_uses = 0;
        if (fa3_turns_across_tiles(NWG)) fa3_pp_first_turn<PINGPONG, NWG>(c);

        for (int k = 0;; ++k) {
            const int slot = fa3_pipe<2>::stage(k);
            FA3_EV(FA3_EV_SLOT_WAIT, 0);
            hp_mbar_wait(bar_tile_full + 8 * slot, fa3_pipe<2>::phase(k));
            FA3_EV(FA3_EV_SLOT, 0);
            /* Lane 0 reads the index slot and releases it, so that the read is ordered before the release in one
             * thread; the warp gets the index by shuffle. With the geometry published (kSharedGeo) every lane
             * reads its ring entry and then releases the slot, which is what lets the producer reuse the entry
             * two tiles later (a warp sync and then lane 0's release order the reads as well, but racecheck does
             * not follow that and reported the producer's next write as a race). (One release after the geometry
             * read for both cases measured 1-1.5% slower up to 2k.) */
            const int tile = __shfl_sync(0xffffffffu, lane == 0 ? tile_ids[slot] : 0, 0);
            if (!kSharedGeo)
                fa3_release(bar_tile_empty + 8 * slot, lane);
            else if (tile >= a.num_tiles)
                hp_mbar_arrive(bar_tile_empty + 8 * slot);
            FA3_EV(FA3_EV_INDEX, tile);
            if (tile >= a.num_tiles) break;
            fa3_tile g;
            if (!fa3_consumer_tile<D, BN, NWG, GENERAL>(a, tile, geo[k & (C::kTileRing - 1)], bar_tile_empty + 8 * slot,
                                                        g))
                continue;
            FA3_EV(FA3_EV_TILE, tile);
            /* The thread's rows, row0 and row0 + 8, counted from m0 (the rows of the sequence are row0 - shift
             * and row0 + 8 - shift): the shift goes into the mask's offset, and the loop sees the same row
             * arithmetic as without it (with the shift in row0 ptxas scheduled the unmasked steps worse). */
            const int row0 = g.m0 + 64 * c + 16 * warp + lane / 4;
            const int nb = g.nblocks;
            const fa3_ring r = { s_k,
                                 s_v,
                                 bar_k_full,
                                 bar_k_empty,
                                 bar_v_wait,
                                 bar_v_empty,
                                 s_q + C::kOffKrows + (uint32_t)sizeof(fa3_krows) * (k & (C::kTileRing - 1)) };
            if constexpr (kSkipIdle) {
                if (!fa3_wg_has_rows(g, c)) {
                    if (nb > 0) {
                        fa3_idle_tile<NWG, PINGPONG>(nb, kv, r, bar_q_full + 8 * c, bar_q_empty + 8 * c,
                                                     fa3_pipe<1>::phase(q_uses), lane, c);
                        kv += nb;
                        ++q_uses;
                    }
                    continue;
                }
            }
            const fa3_mask_info mi = fa3_mask_info_make<BN, GENERAL, kSkipIdle>(a, g, c);

            float o[D / 2];
#pragma unroll
            for (int i = 0; i < D / 2; ++i) o[i] = 0.0f;
            float m[2] = { -INFINITY, -INFINITY }, l[2] = { 0.0f, 0.0f };

            if (nb > 0) {
                float s[BN / 2];
                uint32_t p[BN / 4];
                float factor[2];
#pragma unroll
                for (int i = 0; i < BN / 2; ++i) s[i] = 0.0f;
                if (!fa3_turns_across_tiles(NWG)) fa3_pp_first_turn<PINGPONG, NWG>(c);

                hp_mbar_wait(bar_q_full + 8 * c, fa3_pipe<1>::phase(q_uses));
                FA3_EV(FA3_EV_Q, 0);
                if constexpr (QRS) {
                    fa3_load_q_frag<D>(q.frag, s_q + c * C::kQBytes, warp, lane);
                    __syncwarp();
                    fa3_release(bar_q_empty + 8 * c, lane); /* the next tile's Q may land now */
                }
                if (OVERLAP)
                    fa3_overlap_tile<D, BN, NWG, T, PINGPONG, QRS, GENERAL>(nb, kv, r, q, s, o, p, m, l, factor, a, g,
                                                                            mi, row0, lane, c, bar_q_empty + 8 * c);
                else
                    fa3_plain_tile<D, BN, NWG, T, PINGPONG, QRS, GENERAL>(kv, r, q, s, o, p, m, l, factor, a, g, mi,
                                                                          row0, lane, c, bar_q_empty + 8 * c);
            }

            /* The geometry again (from the ring) rather than kept in registers through the loop. */
            if constexpr (kSharedGeo)
                g = geo[k & (C::kTileRing - 1)];
            else
                fa3_sched::tile_get<BM, BN, kSkipIdle, GENERAL, kFastDiv>(a, tile, g);
            FA3_EV(FA3_EV_EPI, tile);
            const int seq_row0 = row0 - g.shift;
            float inv[2], lse[2];
            fa3_finalize<D>(o, l, m, inv, lse, a, g, seq_row0, a.scale_log2);
            if (a.lse != nullptr && lane % 4 == 0) fa3_store_lse(a, g, lse, seq_row0, varlen);
            fa3_store_o<D, BN, NWG, T>(o, inv, a, g, tm_o, smem, nb, seq_row0, varlen, c, t, warp, lane);
            FA3_EV(FA3_EV_EPI_END, tile);
            if (nb > 0) {
                kv += nb;
                ++q_uses;
            }
        }
        if (fa3_turns_across_tiles(NWG) && PINGPONG && c == 0) fa3_pp_sync<PINGPONG>(c); /* the arrival left over */
        if (C::kSeparateO && t == 0) hp_tma_store_wait_read(); /* shared memory must outlive the last store */
    }
#endif /* FA_SM90A */
}

#if FA3_TRACE
/* FLASHATTN_FA3_TRACE = FILE: each launch's timeline overwrites FILE (header: grid, capacity; then the events). */
static unsigned long long *fa3_trace_arm(int grid) {
    static unsigned long long *buf = nullptr;
    static int buf_grid = 0;
    if (getenv("FLASHATTN_FA3_TRACE") == nullptr) return nullptr;
    const size_t bytes = (size_t)grid * 4 * FA3_TRACE_CAP * 16;
    if (grid > buf_grid) { /* one CTA per tile (FLASHATTN_FA3_SCHEDULER = grid) needs more than the SM count */
        cudaFree(buf);
        buf = nullptr;
        buf_grid = 0;
        if (cudaMalloc(&buf, bytes) != cudaSuccess) return nullptr;
        buf_grid = grid;
    }
    cudaMemset(buf, 0, bytes);
    return buf;
}
static void fa3_trace_dump(const unsigned long long *trace, int grid, cudaStream_t stream) {
    const char *path = getenv("FLASHATTN_FA3_TRACE");
    if (trace == nullptr || path == nullptr) return;
    const size_t n = (size_t)grid * 4 * FA3_TRACE_CAP * 2;
    unsigned long long *host = (unsigned long long *)malloc(n * 8);
    if (host == nullptr) return;
    cudaStreamSynchronize(stream);
    cudaMemcpy(host, trace, n * 8, cudaMemcpyDeviceToHost);
    FILE *f = fopen(path, "wb");
    if (f != nullptr) {
        const int hdr[2] = { grid, FA3_TRACE_CAP };
        fwrite(hdr, sizeof hdr, 1, f);
        fwrite(host, 8, n, f);
        fclose(f);
    }
    free(host);
}
#endif

/* Whether a problem needs the GENERAL kernel: softcap, ALiBi, a left window edge or a varlen batch. */
static inline bool fa3_needs_general(const fa3_args *a) {
    return a->softcap_pre != 0.0f || a->alibi != nullptr || a->window_left >= 0 || a->cu_q != nullptr ||
           a->descale_block_q > 0 || a->descale_block_k > 0;
}

/* Launches one configuration on the persistent grid. BF16 picks the kernel's element type (bf16, else f16; the
 * flag is what the per-head-dim launchers pass). QRS: Q K^T takes Q from registers. GENERAL = 0: a kernel for
 * dense batches without softcap, ALiBi and a left window edge (plain, causal, right windows): its masked step is
 * shorter, and it spills less; 1: the general kernel, or its ALiBi instance (FA3_GENERAL_ALIBI) where the problem
 * has slopes. */
template <int D, int BN, int NWG, bool BF16, bool OVERLAP, bool PINGPONG, bool QRS = false, int GENERAL = 1>
static fa_status fa3_launch(const fa3_problem *pr, cudaStream_t stream) {
    typedef fa3_cfg<D, BN, NWG> C;
    static_assert(GENERAL == 0 || GENERAL == 1, "the ALiBi instance is chosen here");
    if (!GENERAL && fa3_needs_general(&pr->args))
        return fa_fail(FA_ERR_INTERNAL, "fa3 forward: softcap, a left window or varlen in a kernel without them");
    typedef typename fa3_elem<BF16>::type T;
    void (*kernel)(const CUtensorMap, const CUtensorMap, const CUtensorMap, const CUtensorMap, const fa3_args) =
        fa3_fwd_kernel<D, BN, NWG, T, OVERLAP, PINGPONG, QRS, GENERAL>;
    if constexpr (GENERAL && NWG != 3) { /* (three warpgroups: see fa3_block_m) */
        if (pr->args.alibi != nullptr)
            kernel = fa3_fwd_kernel<D, BN, NWG, T, OVERLAP, PINGPONG, QRS, FA3_GENERAL_ALIBI>;
    } else if (pr->args.alibi != nullptr) {
        return fa_fail(FA_ERR_INTERNAL, "fa3 forward: ALiBi in a kernel without it");
    }
    cudaError_t err =
        cudaFuncSetAttribute((const void *)kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, C::kSmemBytes);
    if (err != cudaSuccess) return fa_cuda_status(err, "fa3 forward: setting the shared-memory size");
#if FA3_TRACE
    unsigned long long *trace = fa3_trace_arm(pr->grid);
    cudaMemcpyToSymbolAsync(fa3_trace_buf, &trace, sizeof trace, 0, cudaMemcpyHostToDevice, stream);
#endif
    kernel<<<pr->grid, C::kThreads, C::kSmemBytes, stream>>>(pr->tm_q, pr->tm_k, pr->tm_v, pr->tm_o, pr->args);
    err = cudaGetLastError();
    if (err != cudaSuccess) return fa_cuda_status(err, "fa3 forward launch");
#if FA3_TRACE
    fa3_trace_dump(trace, pr->grid, stream);
#endif
    return FA_OK;
}

/* Block-M of the configuration a problem uses (the query-tile height the grid assumes; the Q and O tensor maps
 * move 64 rows, one consumer warpgroup's). Head dim 64 runs three consumer warpgroups (192 rows), except for
 * the shortest sequences: up to 256 queries under a causal (or right-windowed) mask and up to 128 without one,
 * two (128 rows) are faster. By the library's benchmark (H200, 16k tokens, 32 heads, TFLOP/s 128 -> 192 rows):
 * causal 128 / 256 64 -> 58 / 112 -> 104, 384 / 512 / 768 145 -> 163 / 174 -> 196 / 216 -> 247, 1k equal;
 * without a mask 128 169 -> 157, 256 equal, 384 / 512 / 1k 273 -> 337 / 295 -> 355 / 364 -> 429.
 * FLASHATTN_FA3_BLOCK_M = 128 | 192 overrides that for head dim 64 (not with ALiBi). */
static inline int fa3_block_m(const fa_params *p) {
    if (p->head_dim != 64 || p->dtype == FA_E4M3) return 128; /* the e4m3 kernel: two consumer warpgroups */
    /* ALiBi moves a row's scores by its slope x 128 from one key block to the next, past what the three-warpgroup
     * kernel's softmax against the stale max takes: it computed S again for nearly every block (H200, causal 4k:
     * 61 TFLOP/s against the FA2 forward's 228). */
    if (p->alibi_slopes != NULL) return 128;
    if (fa3_knobs_get()->block_m) return fa3_knobs_get()->block_m;
    const int right_bounded = p->causal || p->window_right >= 0;
    return p->seqlen_q > (right_bounded ? 256 : 128) ? 192 : 128;
}

#endif /* FLASHATTN_CUDA_FA3_FWD_CUH */
