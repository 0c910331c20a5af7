/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fa2_fwd.cu - FlashAttention-2 forward, host side: which problems the kernels take, the tile configuration,
 * and the launch. The kernel and its tile table are in fa2_fwd.cuh, instantiated once per head dim in
 * fa2_fwd_hdim*.cu.
 *
 * Tiles: the first row of fa2_fwd_tiles for the head dim whose shared memory fits the device's opt-in limit
 * per block, sm_blocks times over in an SM. Testing knob: FLASHATTN_SMEM_LIMIT=<bytes> caps the limit the
 * selection assumes (smem_limit.h), so that the configurations of GPUs with less shared memory run (and can be
 * checked) on a larger one.
 */
#include <math.h>
#include <stdio.h>

#include "fa2_fwd.cuh"
#include "kernels.h"
#include "smem_limit.h"

#ifndef FA2_FWD_CHUNK_SMS
#define FA2_FWD_CHUNK_SMS 4
#endif

typedef cudaError_t (*fa2_fwd_launcher)(const fa2_fwd_args *a, fa_dtype dtype, int tile, int batch,
                                        cudaStream_t stream);

static fa2_fwd_launcher fwd_launcher(int head_dim) {
    switch (head_dim) {
#define FA2_FWD_CASE(D) \
    case D: return fa2_fwd_hdim##D;
        FA_HDIMS(FA2_FWD_CASE)
#undef FA2_FWD_CASE
    default: return NULL;
    }
}

/* The selection takes the first row that fits: each head dim's rows must come in decreasing shared memory.
 * (Checked here, not in fa2_fwd.cuh: a tuning build may override a head dim's first row in its fa2_fwd_hdim*.cu
 * only, and that row is always the one taken on the GPU it is tuned on.) */
static constexpr bool fwd_tiles_ordered(int i) {
    return i >= FA2_FWD_NTILES || ((fa2_fwd_tiles[i].d != fa2_fwd_tiles[i - 1].d ||
                                    fa2_fwd_smem_bytes(fa2_fwd_tiles[i]) < fa2_fwd_smem_bytes(fa2_fwd_tiles[i - 1])) &&
                                   fwd_tiles_ordered(i + 1));
}
static_assert(fwd_tiles_ordered(1), "fa2_fwd_tiles: rows of a head dim out of order");

/* The first configuration of the head dim that fits in the device's shared memory (index into fa2_fwd_tiles);
 * -1 when the head dim has none, -2 when none fits. */
static int fwd_tile(int head_dim, const fa_cuda_device *dev) {
    const size_t limit = fa_cuda_smem_limit(dev);
    int found = -1;
    for (int i = 0; i < FA2_FWD_NTILES; i++) {
        if (fa2_fwd_tiles[i].d != head_dim) continue;
        const size_t smem = fa2_fwd_smem_bytes(fa2_fwd_tiles[i]);
        if (smem <= limit && fa_cuda_smem_fits_sm(dev, smem, fa2_fwd_tiles[i].sm_blocks)) return i;
        found = -2;
    }
    return found;
}
/* A head dim's last row asks for one block per SM: whatever fits a block is taken. */
static constexpr bool fwd_tiles_end_single(int i) {
    return i >= FA2_FWD_NTILES || ((i + 1 < FA2_FWD_NTILES && fa2_fwd_tiles[i + 1].d == fa2_fwd_tiles[i].d) ||
                                   fa2_fwd_tiles[i].sm_blocks == 1) &&
                                      fwd_tiles_end_single(i + 1);
}
static_assert(fwd_tiles_end_single(0), "fa2_fwd_tiles: a head dim's last row must have sm_blocks 1");

extern "C" fa_status fa2_fwd_supported(const fa_params *p, const fa_cuda_device *dev) {
    if (p->dtype != FA_F16 && p->dtype != FA_BF16)
        return fa_fail(FA_ERR_UNSUPPORTED, "the FA2 kernels take f16 or bf16 only (dtype %d)", (int)p->dtype);
    const fa2_fwd_launcher launch = fwd_launcher(p->head_dim);
    const int tile = fwd_tile(p->head_dim, dev);
    if (!launch || tile == -1)
        return fa_fail(FA_ERR_UNSUPPORTED, "head_dim (%d) has no FA2 forward kernel (compiled:" FA_HDIMS_STR ")",
                       p->head_dim);
    if (dev->cc_major < 8)
        return fa_fail(FA_ERR_UNSUPPORTED, "the FA2 kernels need compute capability 8.0 or newer (device %d is %d.%d)",
                       dev->ordinal, dev->cc_major, dev->cc_minor);
    if (tile < 0) {
        size_t smem = 0; /* of the head dim's last (smallest) configuration */
        for (int i = 0; i < FA2_FWD_NTILES; i++)
            if (fa2_fwd_tiles[i].d == p->head_dim) smem = fa2_fwd_smem_bytes(fa2_fwd_tiles[i]);
        const size_t limit = fa_cuda_smem_limit(dev);
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "the FA2 forward for head_dim %d needs %zu bytes of shared memory per block; device %d "
                       "allows %zu%s",
                       p->head_dim, smem, dev->ordinal, limit,
                       limit < dev->smem_optin ? " (FLASHATTN_SMEM_LIMIT)" : "");
    }
    if (p->batch > 65535 || p->heads_q > 65535)
        return fa_fail(FA_ERR_UNSUPPORTED, "batch (%d) and heads_q (%d) must be <= 65535 for the FA2 forward grid",
                       p->batch, p->heads_q);
    /* tile copies use 32-bit offsets within a tile of at most 256 rows */
    const fa_tensor *ts[3] = { &p->q, &p->k, &p->v };
    const char *nm[3] = { "q", "k", "v" };
    for (int i = 0; i < 3; i++)
        if (ts[i]->stride_seq > INT32_MAX / 256)
            return fa_fail(FA_ERR_UNSUPPORTED, "%s.stride_seq (%lld) exceeds the FA2 kernels' limit (%d elements)",
                           nm[i], (long long)ts[i]->stride_seq, INT32_MAX / 256);
    cudaError_t err = fa_cuda_device_is_virtual(dev) ? cudaSuccess : launch(NULL, p->dtype, tile, 0, 0);
    if (err != cudaSuccess) {
        cudaGetLastError();
        if (err == cudaErrorNoKernelImageForDevice || err == cudaErrorInvalidDeviceFunction)
            return fa_fail(FA_ERR_UNSUPPORTED, "this build has no FA2 kernel for compute capability %d.%d (device %d)",
                           dev->cc_major, dev->cc_minor, dev->ordinal);
        return fa_cuda_status(err, "FA2 forward kernel lookup");
    }
    return FA_OK;
}

extern "C" size_t fa2_fwd_workspace_size(const fa_params *p, const fa_cuda_device *dev) {
    (void)p;
    (void)dev;
    return 0;
}

extern "C" fa_status fa2_fwd_run(const fa_params *p, const fa_cuda_device *dev, void *workspace, cudaStream_t stream) {
    (void)workspace;
    const fa2_fwd_launcher launch = fwd_launcher(p->head_dim);
    const int tile = fwd_tile(p->head_dim, dev);
    if (!launch || tile < 0)
        return fa_fail(FA_ERR_INTERNAL, "FA2 forward run for head_dim %d without a kernel that fits", p->head_dim);

    fa2_fwd_args a;
    memset(&a, 0, sizeof a);
    a.q = p->q.data, a.k = p->k.data, a.v = p->v.data, a.o = p->o.data, a.lse = p->lse;
    a.q_batch = p->q.stride_batch, a.q_row = p->q.stride_seq, a.q_head = p->q.stride_head;
    a.k_batch = p->k.stride_batch, a.k_row = p->k.stride_seq, a.k_head = p->k.stride_head;
    a.v_batch = p->v.stride_batch, a.v_row = p->v.stride_seq, a.v_head = p->v.stride_head;
    a.o_batch = p->o.stride_batch, a.o_row = p->o.stride_seq, a.o_head = p->o.stride_head;
    a.cu_seqlens_q = p->cu_seqlens_q, a.cu_seqlens_k = p->cu_seqlens_k;
    a.seqlen_q = p->seqlen_q, a.seqlen_k = p->seqlen_k;
    a.heads_q = p->heads_q, a.group = p->heads_q / p->heads_kv;
    a.total_q = p->total_q;
    a.scale = p->softmax_scale;
    a.scale_log2 = fabsf(p->softmax_scale) * 1.4426950408889634f;
    a.inv_abs_scale = 1.0f / fabsf(p->softmax_scale);
    a.softcap = p->softcap;
    a.inv_softcap = p->softcap > 0.0f ? 1.0f / p->softcap : 0.0f;
    a.window_left = p->window_left, a.window_right = p->window_right;
    a.alibi = p->alibi_slopes, a.alibi_batch_stride = p->alibi_batch_stride;
    a.every_block_modified = p->softcap > 0.0f || p->alibi_slopes != NULL || p->softmax_scale < 0.0f;
    /* Under a causal mask the query blocks' work grows with their index: chunks of FA2_FWD_CHUNK_SMS * SMs
     * blocks start the long blocks of several heads first (fa2_fwd_block). Without one every block has the same
     * work, and one pair per chunk keeps each head's K and V shared by its blocks running together. */
    const int m_blocks = (p->seqlen_q + fa2_fwd_tiles[tile].block_m - 1) / fa2_fwd_tiles[tile].block_m;
    const bool id_fits = (int64_t)m_blocks * p->heads_q * p->batch <= INT32_MAX; /* fa2_fwd_block's linear index */
    a.chunk_pairs = 1;
    if (p->window_right >= 0 && m_blocks > 0 && id_fits)
        a.chunk_pairs = max(1, FA2_FWD_CHUNK_SMS * dev->sm_count / m_blocks);

    if (p->seqlen_q == 0) return FA_OK; /* a varlen batch of empty query sequences */
    return fa_cuda_status(launch(&a, p->dtype, tile, p->batch, stream), "FA2 forward launch");
}

static void fa2_fwd_describe(const fa_params *p, const fa_cuda_device *dev, char *buf, size_t size) {
    const int i = fwd_tile(p->head_dim, dev);
    if (i < 0) {
        snprintf(buf, size, "no tile fits");
        return;
    }
    const fa2_fwd_tile t = fa2_fwd_tiles[i];
    snprintf(buf, size, "%d x %d tiles, %d warps, %d K/V stages (row %d of fa2_fwd_tiles)", t.block_m, t.block_n,
             t.warps, t.stages, i);
}

const fa_kernel_family fa2_fwd_family = { "fa2 forward", fa2_fwd_supported, fa2_fwd_workspace_size, fa2_fwd_run,
                                          fa2_fwd_describe };
