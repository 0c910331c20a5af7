/* SPDX-License-Identifier: Apache-2.0 */
/*
 * decode.cu - decoding with a KV cache on the CUDA backend, host side: which calls the kernels take, the
 * split count, the workspace, and the launches (append, attention, combine) on the stream. The kernels are in
 * decode.cuh; the attention kernel is instantiated once per head dim in decode_hdim*.cu.
 *
 * Row blocks: more than 16 query rows per kv head (MQA, long query groups) go two blocks of 16 to an attention
 * block, whose two sets of warps share every K/V tile it loads.
 *
 * Split count (kv->num_splits = 0): the blocks on one SM share its rate (H200, 1x32k 32/8 d128: 128 blocks of
 * 32 tiles, one per SM, 3.45 TB/s; 256 blocks of 16 tiles, two per SM, 3.35; 160 blocks, two on some SMs, 2.6),
 * so s splits of the blocks of one split (batch x kv heads x groups of query rows) cost the waves of one block
 * per SM they take times a block's time (the key tiles of one split, plus two for its fixed part): the cheapest s,
 * the fewest among equals, at most one split per key tile of the largest possible cache length. A grid of at
 * most one block per SM asks for more than half of an SM's shared memory: the blocks of a programmatic dependent
 * launch are placed while the previous kernel's still hold their SMs, and would otherwise land two to an SM on
 * some SMs (8x8k, 128 blocks: 11 SMs), whose blocks then end 10% late. A longer grid keeps two blocks per SM.
 * A block of two row blocks reads each tile once for both and takes one such slot. Head dims below 64 count a
 * wave as every block an SM holds (two with their six-tile ring) and keep two per SM: their tiles hold half the
 * bytes, a block's per-tile work sets its pace (head dim 64 measured so with 64-key tiles, one block per SM at
 * 0.80-0.89x of two; its 128-key tiles hold as many bytes as head dim 128's, and one per SM gains there). Pages
 * smaller than a tile count and keep two per SM as well: a thread's copies of each tile wait for its page-table
 * reads, which a second block on the SM covers (H200 d128, pages of 16 on the split shapes: 0.72-0.77 of
 * contiguous at one block per SM, 0.93-0.97 at two; pages of 256, one read per tile: 0.98-1.00 at one, 0.95-0.98
 * at two).
 * It depends on host-known sizes only (the cache's capacity, never cache_seqlens), so a captured CUDA graph
 * stays valid as the lengths change. An explicit count is taken as given, up to the key tiles of the capacity
 * and DECODE_MAX_SPLITS.
 */
#include <stdio.h>
#include <string.h>

#include "decode.cuh"
#include "kernels.h"
#include "smem_limit.h"

typedef cudaError_t (*decode_launcher)(const decode_args *a, fa_dtype dtype, int stages, cudaStream_t stream);

static decode_launcher attn_launcher(int head_dim) {
    switch (head_dim) {
#define DECODE_CASE(D) \
    case D: return decode_attn_hdim##D;
        FA_HDIMS(DECODE_CASE)
#undef DECODE_CASE
    default: return NULL;
    }
}

static int64_t kv_capacity(const fa_kvcache *kv) {
    return kv->block_table ? (int64_t)kv->max_pages * kv->page_size : kv->seqlen_cache;
}

/* Blocks of 16 query rows per attention block. */
static int row_blocks_for(const fa_params *p) {
    return (int64_t)(p->heads_q / p->heads_kv) * p->seqlen_q > 16 ? 2 : 1;
}

/* K/V tiles in the attention kernel's ring: of the counts its head dim is built for (decode_stages_max, 3, 2),
 * the most that fit the device's shared memory per block (2 where none does: decode_supported refuses it). */
static int stages_for(int head_dim, int row_blocks, const fa_cuda_device *dev) {
    for (int s = decode_stages_max(head_dim); s > 2; s = s > 3 ? 3 : 2)
        if (decode_smem_bytes(head_dim, s, row_blocks) <= fa_cuda_smem_limit(dev)) return s;
    return 2;
}

/* The launch geometry of a call. */
typedef struct decode_plan {
    int64_t m_blocks, m_groups; /* blocks of 16 query rows per kv head; attention blocks they take */
    int row_blocks;
    int num_splits;
    int stages, per_sm;  /* K/V tiles in the ring; attention blocks an SM holds at once */
    size_t smem_request; /* an attention block's shared memory: more than half an SM's for a grid of one per SM */
    size_t workspace;    /* bytes: partial O and LSE when split */
} decode_plan;

/* The split count of the header's cost model for `blocks` attention blocks over `tiles` key tiles with `wave`
 * of them at once; + 2: a block's fixed part (Q, filling the ring, the warps' merge, the epilogue) in tiles'
 * time. */
static int64_t cheapest_splits(int64_t blocks, int64_t tiles, int64_t max_splits, int64_t wave) {
    int64_t best = INT64_MAX, splits = 1;
    for (int64_t s = 1; s <= max_splits; s++) {
        const int64_t waves = (blocks * s + wave - 1) / wave, cost = waves * ((tiles + s - 1) / s + 2);
        if (cost < best) best = cost, splits = s;
    }
    return splits;
}

static decode_plan plan_get(const fa_params *p, const fa_kvcache *kv, const fa_cuda_device *dev) {
    decode_plan pl;
    const int64_t rows = (int64_t)(p->heads_q / p->heads_kv) * p->seqlen_q;
    pl.m_blocks = (rows + 15) / 16;
    pl.row_blocks = row_blocks_for(p);
    pl.m_groups = (pl.m_blocks + pl.row_blocks - 1) / pl.row_blocks;
    const int64_t blocks = (int64_t)p->batch * p->heads_kv * pl.m_groups;
    const int64_t bn = decode_block_n(p->head_dim), tiles = (kv_capacity(kv) + bn - 1) / bn;
    const int64_t max_splits = tiles < DECODE_MAX_SPLITS ? (tiles > 0 ? tiles : 1) : DECODE_MAX_SPLITS;
    int64_t splits = 1;
    const bool small_pages = kv->block_table && kv->page_size < bn;
    pl.stages = stages_for(p->head_dim, pl.row_blocks, dev);
    const size_t smem = decode_smem_bytes(p->head_dim, pl.stages, pl.row_blocks);
    int per_sm = (int)(dev->smem_per_sm / (smem + dev->smem_reserved));
    pl.per_sm = per_sm < 1 ? 1 : per_sm > 4 ? 4 : per_sm;
    if (kv->num_splits > 0) {
        splits = kv->num_splits < max_splits ? kv->num_splits : max_splits;
    } else {
        /* the file header's cost model: a wave is one block per SM; below head dim 64 or with pages smaller than a
         * tile, every block an SM holds */
        int64_t wave = dev->sm_count;
        if ((p->head_dim < 64 || small_pages) && (int64_t)dev->sm_count * pl.per_sm / pl.row_blocks > wave)
            wave = (int64_t)dev->sm_count * pl.per_sm / pl.row_blocks;
        splits = cheapest_splits(blocks, tiles, max_splits, wave);
    }
    pl.num_splits = (int)splits;
    pl.smem_request = smem;
    if (p->head_dim >= 64 && !small_pages && blocks * splits <= dev->sm_count) { /* one block per SM */
        const size_t half = dev->smem_per_sm / 2 + 1024, limit = fa_cuda_smem_limit(dev);
        if (smem < half && half <= limit) pl.smem_request = half, pl.per_sm = 1;
    }
    pl.workspace = 0;
    if (splits > 1) {
        const size_t out_rows = (size_t)p->batch * p->heads_q * p->seqlen_q;
        pl.workspace = (size_t)splits * out_rows * ((size_t)p->head_dim + 1) * sizeof(float);
    }
    return pl;
}

/* A 16-bit tensor the kernels read or write with 16-byte vectors. */
static fa_status check_vector_tensor(const fa_tensor *t, const char *name) {
    if (!t->data) return FA_OK;
    if ((uintptr_t)t->data % 16)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "%s.data (%p) is not 16-byte aligned (the CUDA decode kernels load "
                       "16-byte vectors)",
                       name, t->data);
    const int64_t strides[3] = { t->stride_batch, t->stride_seq, t->stride_head };
    const char *names[3] = { "stride_batch", "stride_seq", "stride_head" };
    for (int s = 0; s < 3; s++)
        if (strides[s] % 8)
            return fa_fail(FA_ERR_UNSUPPORTED,
                           "%s.%s (%lld) is not a multiple of 8 elements (the CUDA decode kernels "
                           "load 16-byte vectors)",
                           name, names[s], (long long)strides[s]);
    return FA_OK;
}

extern "C" fa_status decode_supported(const fa_params *p, const fa_kvcache *kv, const fa_cuda_device *dev) {
    if (p->dtype != FA_F16 && p->dtype != FA_BF16)
        return fa_fail(FA_ERR_UNSUPPORTED, "the CUDA decode kernels take f16 or bf16 only (dtype %d)", (int)p->dtype);
    const decode_launcher launch = attn_launcher(p->head_dim);
    if (!launch)
        return fa_fail(FA_ERR_UNSUPPORTED, "head_dim (%d) has no CUDA decode kernel (compiled:" FA_HDIMS_STR ")",
                       p->head_dim);
    if (dev->cc_major < 8)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "the CUDA decode kernels need compute capability 8.0 or newer (device %d "
                       "is %d.%d)",
                       dev->ordinal, dev->cc_major, dev->cc_minor);
    const int row_blocks = row_blocks_for(p), stages = stages_for(p->head_dim, row_blocks, dev);
    const size_t smem = decode_smem_bytes(p->head_dim, stages, row_blocks), limit = fa_cuda_smem_limit(dev);
    if (smem > limit)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "the CUDA decode kernel for head_dim %d needs %zu bytes of shared memory "
                       "per block; device %d allows %zu",
                       p->head_dim, smem, dev->ordinal, limit);
    fa_status st;
    if ((st = check_vector_tensor(&p->q, "q")) || (st = check_vector_tensor(&p->o, "o")) ||
        (st = check_vector_tensor(&p->k, "k")) || (st = check_vector_tensor(&p->v, "v")) ||
        (st = check_vector_tensor(&kv->k_cache, "k_cache")) || (st = check_vector_tensor(&kv->v_cache, "v_cache")))
        return st;
    /* key indices are int32 in the kernels, with a tile of slack */
    if (kv_capacity(kv) > INT32_MAX - 2 * decode_block_n(p->head_dim))
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "the cache's capacity (%lld rows) exceeds the CUDA decode kernels' int32 "
                       "key range",
                       (long long)kv_capacity(kv));
    const decode_plan pl = plan_get(p, kv, dev);
    if (p->batch > 65535 || p->heads_kv * pl.m_groups > 65535)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "batch (%d) and heads_kv x ceil(heads_q / heads_kv x seqlen_q / %d) (%lld) "
                       "must be <= 65535 for the CUDA decode grids",
                       p->batch, 16 * pl.row_blocks, (long long)(p->heads_kv * pl.m_groups));
    cudaError_t err = fa_cuda_device_is_virtual(dev) ? cudaSuccess : launch(NULL, p->dtype, stages, 0);
    if (err != cudaSuccess) {
        cudaGetLastError();
        if (err == cudaErrorNoKernelImageForDevice || err == cudaErrorInvalidDeviceFunction)
            return fa_fail(FA_ERR_UNSUPPORTED,
                           "this build has no CUDA decode kernel for compute capability %d.%d "
                           "(device %d)",
                           dev->cc_major, dev->cc_minor, dev->ordinal);
        return fa_cuda_status(err, "CUDA decode kernel lookup");
    }
    return FA_OK;
}

extern "C" size_t decode_workspace_size(const fa_params *p, const fa_kvcache *kv, const fa_cuda_device *dev) {
    return plan_get(p, kv, dev).workspace;
}

extern "C" void decode_describe(const fa_params *p, const fa_kvcache *kv, const fa_cuda_device *dev, char *buf,
                                size_t size) {
    const decode_plan pl = plan_get(p, kv, dev);
    const int64_t ctas = (int64_t)p->batch * p->heads_kv * pl.m_groups * pl.num_splits;
    const int bn = decode_block_n(p->head_dim), slices = decode_combine_slices(p->head_dim, pl.num_splits);
    char combine[128] = "";
    if (pl.num_splits > 1)
        snprintf(combine, sizeof combine, "; a combine pass over the splits (a block per query row%s)",
                 slices > 1 ? " and column slice" : "");
    snprintf(buf, size,
             "%s%d split%s of the cache's %lld rows (%lld %d-key tiles); %lld attention CTAs (batch %d x kv heads %d x "
             "%lld groups of %d query rows x splits), %d per SM, a ring of %d K/V tiles%s",
             p->k.data ? "append, then " : "", pl.num_splits, pl.num_splits == 1 ? "" : "s", (long long)kv_capacity(kv),
             (long long)((kv_capacity(kv) + bn - 1) / bn), bn, (long long)ctas, p->batch, p->heads_kv,
             (long long)pl.m_groups, 16 * pl.row_blocks, pl.per_sm, pl.stages, combine);
}

template <typename T>
static cudaError_t launch_append(const decode_args *a, cudaStream_t stream) {
    dim3 grid((unsigned)a->seqlen_new, (unsigned)a->heads_kv, (unsigned)a->batch);
    return decode_launch(decode_append_kernel<T>, grid, (unsigned)min(a->head_dim, 128), 0, stream, *a);
}

template <typename T>
static cudaError_t launch_combine(const decode_args *a, cudaStream_t stream) {
    const int64_t rows = (int64_t)a->batch * a->heads_q * a->seqlen_q;
    return decode_launch(decode_combine_kernel<T>, dim3((unsigned)rows, (unsigned)a->combine_slices),
                         DECODE_COMBINE_THREADS, 0, stream, *a);
}

extern "C" fa_status decode_run(const fa_params *p, const fa_kvcache *kv, const fa_cuda_device *dev, void *workspace,
                                cudaStream_t stream) {
    const decode_launcher launch = attn_launcher(p->head_dim);
    if (!launch) return fa_fail(FA_ERR_INTERNAL, "CUDA decode run for head_dim %d without a kernel", p->head_dim);
    const decode_plan pl = plan_get(p, kv, dev);

    decode_args a;
    memset(&a, 0, sizeof a);
    a.q = p->q.data, a.o = p->o.data, a.lse = p->lse;
    a.q_batch = p->q.stride_batch, a.q_row = p->q.stride_seq, a.q_head = p->q.stride_head;
    a.o_batch = p->o.stride_batch, a.o_row = p->o.stride_seq, a.o_head = p->o.stride_head;
    a.k_cache = kv->k_cache.data, a.v_cache = kv->v_cache.data;
    a.kc_batch = kv->k_cache.stride_batch, a.kc_row = kv->k_cache.stride_seq, a.kc_head = kv->k_cache.stride_head;
    a.vc_batch = kv->v_cache.stride_batch, a.vc_row = kv->v_cache.stride_seq, a.vc_head = kv->v_cache.stride_head;
    a.k_new = p->k.data, a.v_new = p->v.data;
    a.kn_batch = p->k.stride_batch, a.kn_row = p->k.stride_seq, a.kn_head = p->k.stride_head;
    a.vn_batch = p->v.stride_batch, a.vn_row = p->v.stride_seq, a.vn_head = p->v.stride_head;
    a.block_table = kv->block_table;
    a.block_table_stride = kv->block_table_stride ? kv->block_table_stride : kv->max_pages;
    a.page_size = kv->page_size;
    a.page_shift = a.page_mask = -1;
    if (kv->block_table && (kv->page_size & (kv->page_size - 1)) == 0) { /* a power of two: shifts, not divisions */
        a.page_shift = 0;
        while ((1 << a.page_shift) < kv->page_size) a.page_shift++;
        a.page_mask = kv->page_size - 1;
    }
    a.cache_seqlens = kv->cache_seqlens, a.cache_batch_idx = kv->cache_batch_idx, a.cache_leftpad = kv->cache_leftpad;
    a.capacity = (int32_t)kv_capacity(kv);
    a.rotary_cos = kv->rotary_cos, a.rotary_sin = kv->rotary_sin;
    a.rotary_dim = kv->rotary_dim, a.rotary_interleaved = kv->rotary_interleaved;
    a.q_positions_local = p->window_left >= 0 || p->window_right >= 0; /* (resolved: causal is window_right = 0) */
    a.batch = p->batch, a.seqlen_q = p->seqlen_q, a.seqlen_new = p->seqlen_k;
    a.heads_q = p->heads_q, a.heads_kv = p->heads_kv, a.group = p->heads_q / p->heads_kv;
    a.rows = a.group * p->seqlen_q, a.m_blocks = (int32_t)pl.m_blocks;
    a.row_blocks = pl.row_blocks, a.m_groups = (int32_t)pl.m_groups;
    a.head_dim = p->head_dim;
    a.scale = p->softmax_scale, a.softcap = p->softcap;
    a.window_left = p->window_left, a.window_right = p->window_right;
    a.alibi = p->alibi_slopes, a.alibi_batch_stride = p->alibi_batch_stride;
    a.num_splits = pl.num_splits;
    a.combine_slices = decode_combine_slices(p->head_dim, pl.num_splits);
    a.overlap_launch = dev->cc_major >= 9;
    a.smem_request = (int32_t)pl.smem_request;
    if (pl.num_splits > 1) {
        const size_t out_rows = (size_t)p->batch * p->heads_q * p->seqlen_q;
        a.part_o = (float *)workspace;
        a.part_lse = a.part_o + (size_t)pl.num_splits * out_rows * p->head_dim;
    }

    const int bf16 = p->dtype == FA_BF16;
    cudaError_t err = cudaSuccess;
    if (a.k_new && a.seqlen_new > 0)
        err = bf16 ? launch_append<__nv_bfloat16>(&a, stream) : launch_append<__half>(&a, stream);
    if (err == cudaSuccess) err = launch(&a, p->dtype, pl.stages, stream);
    if (err == cudaSuccess && pl.num_splits > 1)
        err = bf16 ? launch_combine<__nv_bfloat16>(&a, stream) : launch_combine<__half>(&a, stream);
    return fa_cuda_status(err, "CUDA decode launch");
}
