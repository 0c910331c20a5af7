/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fa2_bwd.cu - FlashAttention-2 backward, host side: which problems the kernels take, the workspace they need
 * (fp32 dQ accumulator slices, LSE * log2(e), D = rowsum(dO * O)), and the launch by head dim. The kernels
 * are in fa2_bwd.cuh, instantiated once per head dim in fa2_bwd_hdim*.cu.
 *
 * Deterministic mode (params->deterministic) gives every CTA its own fp32 dQ slice (nsplit CTAs per kv head and
 * batch entry, at most FA2_BWD_MAX_SPLITS slices) and sums the slices in a fixed order. Its cost, measured on
 * an H200 (bf16, 16k tokens, hidden 2048, seqlen 2k-16k): 0-7% at head_dim 64, 0-11% at 128, 14-25% at 256,
 * plus nsplit times the fp32 dQ size of workspace.
 *
 * Tiles: the first row of fa2_bwd_tiles (fa2_bwd.cuh) for the head dim whose shared memory fits the device's
 * opt-in limit per block. Testing knob: FLASHATTN_SMEM_LIMIT=<bytes> caps the limit the selection assumes, so
 * that the configurations of GPUs with less shared memory run (and can be checked) on this one.
 */
#include <stdio.h>
#include <stdlib.h>

#include "fa2_bwd.cuh"
#include "smem_limit.h"

/* Deterministic mode: at most this many dQ accumulator slices (each as large as dQ in fp32). */
#define FA2_BWD_MAX_SPLITS 16

/* Total shared memory per block of tile configuration i. */
static size_t bwd_tile_smem(int i) {
    return fa2_bwd_smem_bytes(fa2_bwd_tiles[i]) + FA2_BWD_STATIC_SMEM;
}

/* The first configuration of the head dim that fits in the device's shared memory (index into fa2_bwd_tiles);
 * -1 when the head dim has none, -2 when none fits. */
static int bwd_tile(int head_dim, const fa_cuda_device *dev) {
    const size_t limit = fa_cuda_smem_limit(dev);
    int found = -1;
    for (int i = 0; i < FA2_BWD_NTILES; i++) {
        if (fa2_bwd_tiles[i].d != head_dim) continue;
        if (bwd_tile_smem(i) <= limit) return i;
        found = -2;
    }
    return found;
}

static int bwd_key_blocks(const fa_params *p, int tile) {
    const int bn = fa2_bwd_block_n(fa2_bwd_tiles[tile]);
    return (p->seqlen_k + bn - 1) / bn;
}

/* CTAs per (kv head, batch) in deterministic mode, each with its own dQ accumulator slice: the n <= 16 that
 * minimises waves(n) x key blocks per CTA (one CTA per SM), the smallest such n to save memory. */
static int bwd_nsplit(const fa_params *p, const fa_cuda_device *dev, int tile) {
    if (!p->deterministic) return 1;
    const int64_t heads = (int64_t)p->batch * p->heads_kv, sms = dev->sm_count > 0 ? dev->sm_count : 1;
    const int kb = bwd_key_blocks(p, tile);
    int best = 1;
    int64_t best_cost = INT64_MAX;
    for (int n = 1; n <= kb && n <= FA2_BWD_MAX_SPLITS; n++) {
        const int64_t cost = ((n * heads + sms - 1) / sms) * ((kb + n - 1) / n);
        if (cost < best_cost) best = n, best_cost = cost;
    }
    return best;
}

static int64_t bwd_tokens_q(const fa_params *p) {
    return fa_is_varlen(p) ? p->total_q : (int64_t)p->batch * p->seqlen_q;
}

static size_t bwd_align(size_t n) {
    return (n + 255) & ~(size_t)255;
}

static int bwd_aligned(const fa_tensor *t, int dense) {
    return ((uintptr_t)t->data % 16) == 0 && t->stride_seq % 8 == 0 && t->stride_head % 8 == 0 &&
           (!dense || t->stride_batch % 8 == 0);
}

fa_status fa2_bwd_supported(const fa_params *p, const fa_cuda_device *dev) {
    if (p->dtype != FA_F16 && p->dtype != FA_BF16)
        return fa_fail(FA_ERR_UNSUPPORTED, "the FA2 CUDA backward takes f16 or bf16 (dtype is f32)");
    const int tile = bwd_tile(p->head_dim, dev);
    if (tile == -1)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "the FA2 CUDA backward has no kernel for head_dim %d (compiled:" FA_HDIMS_STR ")",
                       (int)p->head_dim);
    if (dev->cc_major < 8)
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "the FA2 CUDA backward needs compute capability 8.0 or newer (device has %d.%d)", dev->cc_major,
                       dev->cc_minor);
    if (tile < 0) {
        size_t smem = 0; /* of the head dim's last (smallest) configuration */
        for (int i = 0; i < FA2_BWD_NTILES; i++)
            if (fa2_bwd_tiles[i].d == p->head_dim) smem = bwd_tile_smem(i);
        const size_t limit = fa_cuda_smem_limit(dev);
        return fa_fail(FA_ERR_UNSUPPORTED,
                       "the FA2 CUDA backward for head_dim %d needs %zu bytes of shared memory per block; the device "
                       "allows %zu%s",
                       (int)p->head_dim, smem, limit, limit < dev->smem_optin ? " (FLASHATTN_SMEM_LIMIT)" : "");
    }
    const int dense = !fa_is_varlen(p);
    const struct {
        const fa_tensor *t;
        const char *name;
    } tensors[] = { { &p->q, "q" },       { &p->k, "k" },   { &p->v, "v" },   { &p->o, "o" },
                    { &p->dout, "dout" }, { &p->dq, "dq" }, { &p->dk, "dk" }, { &p->dv, "dv" } };
    for (size_t i = 0; i < sizeof(tensors) / sizeof(tensors[0]); i++)
        if (!bwd_aligned(tensors[i].t, dense))
            return fa_fail(FA_ERR_UNSUPPORTED,
                           "the FA2 CUDA backward needs %s 16-byte aligned with strides that are multiples of 8 "
                           "elements",
                           tensors[i].name);
    return FA_OK;
}

size_t fa2_bwd_workspace_size(const fa_params *p, const fa_cuda_device *dev) {
    const int64_t lse_n =
        fa_is_varlen(p) ? (int64_t)p->heads_q * p->total_q : (int64_t)p->batch * p->heads_q * p->seqlen_q;
    const int tile = bwd_tile(p->head_dim, dev);
    const int nsplit = tile >= 0 ? bwd_nsplit(p, dev, tile) : 1;
    const size_t dq =
        (size_t)nsplit * (size_t)fa2_bwd_dq_rows(bwd_tokens_q(p), p->batch) * p->heads_q * p->head_dim * sizeof(float);
    return bwd_align(dq) + 2 * bwd_align((size_t)lse_n * sizeof(float));
}

/* The kernels' arguments for problem p with the workspace laid out as fa2_bwd_workspace_size counts it; also
 * what the FA3 backward's pre- and post-pass (the same preprocess kernel, a convert of its own) read. */
void fa2_bwd_args_make(const fa_params *p, int nsplit, void *workspace, fa2_bwd_args *a) {
    const int64_t lse_n =
        fa_is_varlen(p) ? (int64_t)p->heads_q * p->total_q : (int64_t)p->batch * p->heads_q * p->seqlen_q;
    const int64_t split_stride = fa2_bwd_dq_rows(bwd_tokens_q(p), p->batch) * p->heads_q * p->head_dim;
    const size_t dq_bytes = (size_t)nsplit * (size_t)split_stride * sizeof(float);
    memset(a, 0, sizeof(*a));
    a->q = p->q, a->k = p->k, a->v = p->v, a->o = p->o, a->dout = p->dout, a->dq = p->dq, a->dk = p->dk, a->dv = p->dv;
    a->cu_seqlens_q = p->cu_seqlens_q;
    a->cu_seqlens_k = p->cu_seqlens_k;
    a->lse = p->lse;
    a->alibi_slopes = p->alibi_slopes;
    a->alibi_batch_stride = p->alibi_batch_stride;
    a->dq_accum = (float *)workspace;
    a->lse2 = (float *)((char *)workspace + bwd_align(dq_bytes));
    a->dsum = (float *)((char *)a->lse2 + bwd_align((size_t)lse_n * sizeof(float)));
    a->dq_split_stride = split_stride;
    a->total_q = p->total_q;
    a->batch = p->batch;
    a->seqlen_q = p->seqlen_q;
    a->seqlen_k = p->seqlen_k;
    a->heads_q = p->heads_q;
    a->heads_kv = p->heads_kv;
    a->group = p->heads_q / p->heads_kv;
    a->scale = p->softmax_scale;
    a->scale_log2 = p->softmax_scale * 1.4426950408889634f;
    a->softcap = p->softcap;
    a->softcap_arg = p->softcap > 0 ? p->softmax_scale / p->softcap : 0.0f;
    a->window_left = p->window_left;
    a->window_right = p->causal ? 0 : p->window_right;
    a->deterministic = p->deterministic ? 1 : 0;
    a->nsplit = nsplit;
    a->chunk_pairs = 1;
}

/* Bytes of the fp32 dQ accumulator (all its slices), which the kernels expect zeroed. */
size_t fa2_bwd_dq_accum_bytes(const fa2_bwd_args *a) {
    return (size_t)a->nsplit * (size_t)a->dq_split_stride * sizeof(float);
}

fa_status fa2_bwd_run(const fa_params *p, const fa_cuda_device *dev, void *workspace, cudaStream_t stream) {
    fa_status st = fa2_bwd_supported(p, dev);
    if (st != FA_OK) return st;
    if (workspace == NULL) return fa_fail(FA_ERR_INTERNAL, "fa2 backward: no workspace");

    const int tile = bwd_tile(p->head_dim, dev);
    fa2_bwd_args a;
    fa2_bwd_args_make(p, bwd_nsplit(p, dev, tile), workspace, &a);
    const size_t dq_bytes = fa2_bwd_dq_accum_bytes(&a);
    /* Under a causal mask a key block's work falls with its index: chunks of FA2_BWD_CHUNK_SMS * SMs CTAs start
     * the long blocks of several kv heads first (bwd_block_get). (Not in deterministic mode, whose CTAs walk
     * key blocks, nor for grids whose linear index would not fit 32 bits.) */
    const int kb = bwd_key_blocks(p, tile);
    if (a.window_right >= 0 && !a.deterministic && kb > 0 && (int64_t)kb * p->heads_kv * p->batch <= INT32_MAX)
        a.chunk_pairs = max(1, FA2_BWD_CHUNK_SMS * dev->sm_count / kb);

    if (dq_bytes > 0) {
        st = fa_cuda_status(cudaMemsetAsync(a.dq_accum, 0, dq_bytes, stream), "fa2 backward dQ accumulator reset");
        if (st != FA_OK) return st;
    }
    switch (p->head_dim) {
#define FA2_BWD_CASE(D) \
    case D: return fa2_bwd_launch_hdim##D(&a, p->dtype, tile, kb, stream);
        FA_HDIMS(FA2_BWD_CASE)
#undef FA2_BWD_CASE
    default: return fa_fail(FA_ERR_INTERNAL, "fa2 backward: head_dim %d", (int)p->head_dim);
    }
}

static void fa2_bwd_describe(const fa_params *p, const fa_cuda_device *dev, char *buf, size_t size) {
    const int i = bwd_tile(p->head_dim, dev);
    if (i < 0) {
        snprintf(buf, size, "no tile fits");
        return;
    }
    const fa2_bwd_tile t = fa2_bwd_tiles[i];
    snprintf(buf, size, "%d-key blocks, %d-query steps, %d x %d warps (row %d of fa2_bwd_tiles)%s", 16 * t.kr * t.wk,
             t.bm, t.wk, t.wd, i, p->deterministic ? ", dQ in per-split slices (deterministic)" : "");
}

const fa_kernel_family fa2_bwd_family = { "fa2 backward", fa2_bwd_supported, fa2_bwd_workspace_size, fa2_bwd_run,
                                          fa2_bwd_describe };
