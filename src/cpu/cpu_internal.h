/* SPDX-License-Identifier: Apache-2.0 */
/*
 * cpu_internal.h - what the CPU backend's files share: block sizes, threads, the workspace carver, the fp32
 * views the kernels read their inputs through, and row conversion between the storage dtypes and fp32.
 */
#ifndef FLASHATTN_CPU_INTERNAL_H
#define FLASHATTN_CPU_INTERNAL_H

/* The kernels are compiled once per instruction-set level (the Makefile passes -DFA_CPU_ISA=avx512 with that
 * level's target flags, and so on; see cpu_dispatch.c). Each level's objects then give every function they
 * define outside their file the level as a suffix (fa_cpu_fwd_avx512), so that one library holds them all; a
 * function missing here is defined by each level under the same name, which the link rejects. Defined before
 * internal.h, whose declarations of the entry points it renames too. */
#ifdef FA_CPU_ISA
#define FA_CPU_ISA_NAME2(f, isa)      f##_##isa
#define FA_CPU_ISA_NAME(f, isa)       FA_CPU_ISA_NAME2(f, isa)
#define fa_cpu_workspace_size         FA_CPU_ISA_NAME(fa_cpu_workspace_size, FA_CPU_ISA)
#define fa_cpu_fwd                    FA_CPU_ISA_NAME(fa_cpu_fwd, FA_CPU_ISA)
#define fa_cpu_bwd                    FA_CPU_ISA_NAME(fa_cpu_bwd, FA_CPU_ISA)
#define fa_cpu_kvcache_workspace_size FA_CPU_ISA_NAME(fa_cpu_kvcache_workspace_size, FA_CPU_ISA)
#define fa_cpu_fwd_kvcache            FA_CPU_ISA_NAME(fa_cpu_fwd_kvcache, FA_CPU_ISA)
#define fa_cpu_threads                FA_CPU_ISA_NAME(fa_cpu_threads, FA_CPU_ISA)
#define fa_cpu_thread_id              FA_CPU_ISA_NAME(fa_cpu_thread_id, FA_CPU_ISA)
#define fa_workspace_acquire          FA_CPU_ISA_NAME(fa_workspace_acquire, FA_CPU_ISA)
#define fa_workspace_release          FA_CPU_ISA_NAME(fa_workspace_release, FA_CPU_ISA)
#define fa_cpu_tokens                 FA_CPU_ISA_NAME(fa_cpu_tokens, FA_CPU_ISA)
#define fa_cpu_block_prefix           FA_CPU_ISA_NAME(fa_cpu_block_prefix, FA_CPU_ISA)
#define fa_cpu_block_owner            FA_CPU_ISA_NAME(fa_cpu_block_owner, FA_CPU_ISA)
#define fa_cpu_packed_view            FA_CPU_ISA_NAME(fa_cpu_packed_view, FA_CPU_ISA)
#define fa_cpu_pack_rows              FA_CPU_ISA_NAME(fa_cpu_pack_rows, FA_CPU_ISA)
#define fa_cpu_load_row               FA_CPU_ISA_NAME(fa_cpu_load_row, FA_CPU_ISA)
#define fa_cpu_store_row              FA_CPU_ISA_NAME(fa_cpu_store_row, FA_CPU_ISA)
#define fa_cpu_store_zero_row         FA_CPU_ISA_NAME(fa_cpu_store_zero_row, FA_CPU_ISA)
#define fa_cpu_fwd_workspace          FA_CPU_ISA_NAME(fa_cpu_fwd_workspace, FA_CPU_ISA)
#define fa_cpu_bwd_workspace          FA_CPU_ISA_NAME(fa_cpu_bwd_workspace, FA_CPU_ISA)
#endif

#include "internal.h"
#include "cpu/cpu_simd.h"

#include <stddef.h>
#include <stdint.h>

/* Query rows and keys per block, forward and backward. Each is a multiple of the micro-kernel's rows (FA_MR)
 * and of its panel width (FA_NR * FA_VL) on every target, so whole blocks never need a remainder kernel.
 * Working set per thread at head_dim 128: about 400 KB forward (550 KB with the bf16 levels' 192-key blocks), 900 KB
 * backward (of a 2 MB L2; the backward's 192-key blocks halve how often Q, dO and dQ stream past each key block, and
 * measured fastest on a Sapphire Rapids class Xeon at 1 and 16 threads; the forward's, at the bf16 levels, halve the
 * passes over the output accumulator: AMX bf16 forward at one thread 5-9% faster without a mask, within noise under
 * a causal one). Compile-time tunables (-DFA_FWD_BR=96 ...), for measuring
 * other shapes. */
#ifndef FA_FWD_BR
#define FA_FWD_BR 192
#endif
#ifndef FA_FWD_BC
#if defined(__AVX512BF16__)
#define FA_FWD_BC 192
#else
#define FA_FWD_BC 96
#endif
#endif
#ifndef FA_BWD_BR
#define FA_BWD_BR 96
#endif
#ifndef FA_BWD_BC
#define FA_BWD_BC 192
#endif
#define FA_BLOCK_FITS(x) ((x) % FA_MR == 0 && (x) % (FA_NR * FA_VL) == 0)
_Static_assert(FA_BLOCK_FITS(FA_FWD_BR) && FA_BLOCK_FITS(FA_FWD_BC), "forward blocks must fit the micro-kernel");
_Static_assert(FA_BLOCK_FITS(FA_BWD_BR) && FA_BLOCK_FITS(FA_BWD_BC), "backward blocks must fit the micro-kernel");

#define FA_LOG2E 1.44269504088896341f

static inline int64_t fa_round_up(int64_t a, int64_t b) {
    return fa_ceil_div(a, b) * b;
}
static inline int64_t fa_min64(int64_t a, int64_t b) {
    return a < b ? a : b;
}
static inline int64_t fa_max64(int64_t a, int64_t b) {
    return a > b ? a : b;
}

/* Threads a call runs with: the request, or OpenMP's default for 0, capped at omp_get_thread_limit(), at
 * FA_CPU_MAX_THREADS or the processor count if larger, and at the call's number of tasks; 1 without
 * OpenMP. */
#define FA_CPU_MAX_THREADS 256
int fa_cpu_threads(const fa_params *p, int requested, int backward);

/* The calling thread's index inside a parallel region (0 outside one, or without OpenMP). */
int fa_cpu_thread_id(void);

/* Bump allocator over the workspace, 64-byte aligned pieces. With base == NULL it only measures, so one
 * layout function both sizes the workspace and carves it. */
typedef struct fa_arena {
    char *base;
    size_t used;
} fa_arena;

static inline void *fa_arena_take(fa_arena *a, size_t bytes) {
    size_t off = (a->used + 63) & ~(size_t)63;
    a->used = off + bytes;
    return a->base ? a->base + off : NULL;
}

/* The workspace of a call: the caller's, or one allocated here (fa_workspace_release frees that). */
typedef struct fa_workspace {
    char *base; /* 64-byte aligned */
    void *owned;
} fa_workspace;

fa_status fa_workspace_acquire(const fa_exec *x, size_t bytes, fa_workspace *ws);
void fa_workspace_release(fa_workspace *ws);

/* Number of rows or keys a tensor holds across the batch: batch * seqlen dense, cu_seqlens[batch] varlen. */
int64_t fa_cpu_tokens(const fa_params *p, int keys);

/* Per sequence, the prefix sum of its number of blocks of `block` rows (queries, keys = 0) or keys
 * (keys = 1): prefix[b] is the first block of sequence b, prefix[batch] the total. */
void fa_cpu_block_prefix(const fa_params *p, int keys, int64_t block, int64_t *prefix);

/* Sequence that global block g belongs to (prefix as above; binary search). */
int64_t fa_cpu_block_owner(const int64_t *prefix, int64_t batch, int64_t g);

/* Padded width of an fp32 row: head_dim rounded up to whole vectors. */
static inline int64_t fa_cpu_row_width(const fa_params *p) {
    return fa_round_up(p->head_dim, FA_VL);
}

/* Row stride of the packed fp32 copies: the padded width plus a cache line where needed, so a row is an odd
 * number of cache lines. The caller's own strides (heads * head_dim, often a multiple of 4 KB) would map the
 * rows of a block to a few L1 sets; rows an odd number of lines apart spread over all of them. FA_TILE_LD(n):
 * the same for the scratch tiles, whose rows of n floats are block sizes (192 floats = 12 lines would use a
 * quarter of the sets). */
#define FA_TILE_LD(n) ((((n) + 15) / 16 | 1) * 16)
static inline int64_t fa_cpu_row_stride(const fa_params *p) {
    return FA_TILE_LD(fa_cpu_row_width(p));
}

/* The packed fp32 copy of a tensor: (heads, tokens, row stride) contiguous, addressed with the same fa_offset
 * as the original (stride_batch is seqlen * row stride for the dense case). */
fa_tensor fa_cpu_packed_view(const fa_params *p, float *data, int keys);

/* Copies rows [r0, r1) of sequence b, head h from src (the caller's tensor) into dst (a packed view),
 * converted to fp32, times mul (and, for e4m3 inputs, the row's descale of tensor which: 'q', 'k' or 'v'),
 * zero-padded to the row width. */
void fa_cpu_pack_rows(const fa_params *p, const fa_tensor *src, const fa_tensor *dst, int64_t b, int64_t tok,
                      int64_t r0, int64_t r1, int64_t h, float mul, int which);

/* n elements of a row, from the storage dtype to fp32, and back (times mul, rounded to nearest even). */
void fa_cpu_load_row(const void *base, fa_dtype t, int64_t off, int64_t n, float *dst);
void fa_cpu_store_row(void *base, fa_dtype t, int64_t off, int64_t n, const float *src, float mul);
void fa_cpu_store_zero_row(void *base, fa_dtype t, int64_t off, int64_t n);

/* Whether a call's products run on bf16 pairs (fa_gemm_bf16): its inputs are bf16 and this level has the bf16
 * dot product. Its scores come out of the product unscaled, and the softmax multiplies them by softmax_scale
 * in fp32 (Q times the scale rounded to bf16 would add a rounding the fp32 path does not make). */
static inline int fa_cpu_bf16_products(const fa_params *p) {
#ifdef FA_CPU_BF16
    return p->dtype == FA_BF16;
#else
    (void)p;
    return 0;
#endif
}

/* Whether the bf16 products run on AMX tiles (cpu_simd.h): bf16 inputs on the AMX level, head_dim a whole
 * number of 32-element tile rows (the others stay on vdpbf16ps). */
static inline int fa_cpu_amx_products(const fa_params *p) {
#ifdef FA_CPU_AMX
    return fa_cpu_bf16_products(p) && p->head_dim % 32 == 0;
#else
    (void)p;
    return 0;
#endif
}

/* The forward and backward each size and carve their own workspace. */
size_t fa_cpu_fwd_workspace(const fa_params *p, int threads);
size_t fa_cpu_bwd_workspace(const fa_params *p, int threads);

#endif
