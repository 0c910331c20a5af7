/* SPDX-License-Identifier: Apache-2.0 */
/*
 * fa3_bwd.cu - FlashAttention-3 backward for Hopper (sm_90a), host side: which problems it takes (dense and
 * varlen batches, deterministic mode, softcap or ALiBi), the workspace (the FA2 backward's: fp32 dQ
 * accumulator, LSE * log2(e), D), the tensor maps and the dispatch to the per-head-dim launchers (the kernel is in
 * fa3_bwd.cuh).
 *
 * Query tile per head dim: 128 rows at head dim 64 and 64 at 128, so that dQ = dS K splits into one 64 x 64
 * product per consumer warpgroup, and S^T, dP^T, dK and dV of a warpgroup's 64 keys fit its 240 registers. Head
 * dim 256: 64 queries x 64 keys, the consumers splitting the keys for S and dP and the head dim for dK, dV and dQ
 * (fa3_bwd_wide_kernel).
 */
#include <stdio.h>
#include <string.h>

#include "cuda/fa3_bwd.cuh"

static int fa3_bwd_block_m(int head_dim) {
    return head_dim == 64 ? 128 : 64;
}
/* Keys per CTA: 128 (two warpgroups of 64 keys), 64 at head dim 256 (fa3_bwd_wide_kernel). */
static int fa3_bwd_block_n(int head_dim) {
    return head_dim == 256 ? 64 : 128;
}

extern "C" fa_status fa3_bwd_supported(const fa_params *p, const fa_cuda_device *dev) {
    if (dev->cc_major != 9 || dev->cc_minor != 0)
        return fa_fail(FA_ERR_UNSUPPORTED, "fa3 backward: needs compute capability 9.0 (device %d has %d.%d)",
                       dev->ordinal, dev->cc_major, dev->cc_minor);
    if (!fa3_sm90a_available(dev))
        return fa_fail(FA_ERR_UNSUPPORTED, "fa3 backward: this library was built without sm_90a code");
    switch (p->head_dim) {
#define FA3_BWD_CASE(D) case D:
        FA3_BWD_HDIMS(FA3_BWD_CASE)
#undef FA3_BWD_CASE
        break;
    default:
        return fa_fail(FA_ERR_UNSUPPORTED, "fa3 backward: head_dim %d (compiled:" FA3_BWD_HDIMS_STR ")", p->head_dim);
    }
    if (p->alibi_slopes != NULL && p->softcap > 0.0f) /* (an instance set of its own for a rare pair) */
        return fa_fail(FA_ERR_UNSUPPORTED, "fa3 backward: softcap with ALiBi runs the FA2 backward");
    if (p->seqlen_q < 1 || p->seqlen_k < 1) return fa_fail(FA_ERR_UNSUPPORTED, "fa3 backward: empty Q or K");
    const int block_n = fa3_bwd_block_n(p->head_dim);
    if ((int64_t)((p->seqlen_k + block_n - 1) / block_n) * p->heads_kv * p->batch > INT32_MAX) /* a 1-D grid */
        return fa_fail(FA_ERR_UNSUPPORTED, "fa3 backward: grid too large");
    /* varlen: TMA coordinates are 32-bit token indices */
    if (fa_is_varlen(p) && (p->total_q > INT32_MAX - 128 || p->total_k > INT32_MAX - 128))
        return fa_fail(FA_ERR_UNSUPPORTED, "fa3 backward: more than 2^31 - 129 packed tokens");
    /* the preprocess is the FA2 backward's, with its requirements (dtype, alignment, strides) */
    fa_status st = fa2_bwd_supported(p, dev);
    if (st != FA_OK) return st;
    const int dense = !fa_is_varlen(p);
    if ((st = fa3_check_tensor("q", &p->q, dense, p->batch, p->heads_q)) != FA_OK) return st;
    if ((st = fa3_check_tensor("k", &p->k, dense, p->batch, p->heads_kv)) != FA_OK) return st;
    if ((st = fa3_check_tensor("v", &p->v, dense, p->batch, p->heads_kv)) != FA_OK) return st;
    if ((st = fa3_check_tensor("dout", &p->dout, dense, p->batch, p->heads_q)) != FA_OK) return st;
    /* dK and dV leave in 16-byte stores (fa3_bwd_store_dkdv) */
    if ((st = fa3_check_tensor("dk", &p->dk, dense, p->batch, p->heads_kv)) != FA_OK) return st;
    if ((st = fa3_check_tensor("dv", &p->dv, dense, p->batch, p->heads_kv)) != FA_OK) return st;
    return FA_OK;
}

/* Deterministic mode's turn counts: an int per (batch, query head, query block), after the FA2 layout (the FA2
 * backward's deterministic slices make that layout larger than this kernel's one slice needs). */
static size_t fa3_bwd_turns_offset(const fa_params *p, const fa_cuda_device *dev) {
    return (fa2_bwd_workspace_size(p, dev) + 255) & ~(size_t)255;
}
static int fa3_bwd_m_blocks(const fa_params *p) {
    const int bm = fa3_bwd_block_m(p->head_dim);
    return (p->seqlen_q + bm - 1) / bm;
}

/* Deterministic mode, 4 (kv head, batch) pairs at a time (H200, d128 / d64, 8k, causal or not, Llama's GQA):
 * 0.92-1.0x the default mode; one pair at a time 0.74-0.99x (each key block a step behind the previous), all
 * pairs 0.70-0.83x, 8 pairs 0.82-0.98x (Q, dO and the dQ accumulator of that many heads fall out of L2). */
static int fa3_bwd_det_chunk(const fa_params *p) {
    return p->heads_kv * p->batch < 4 ? p->heads_kv * p->batch : 4;
}

/* The default mode's launch order (fa3_bwd_cta_get runs key blocks longest first across a chunk of (kv head,
 * batch) pairs). Without a mask every CTA has the same steps: one pair at a time, its key blocks side by side.
 * Under a causal mask or a window the key blocks' steps differ: the first key block has the most, except under a
 * window bounded only on the left (no causal mask), where the last one has; the grid then ends on short CTAs.
 * A chunk holds about a wave of CTAs (SMs / key blocks pairs): the CTAs running together are then most or all
 * key blocks of a few pairs, which share each pair's Q, dO and dQ accumulator in L2. Chunks of 2-32 pairs swept on an
 * H100 (causal, b x h x 16k tokens): d64 4k and 8k lose 4-15% from twice this width on (fewer than all of a pair's key
 * blocks at a time), d128 2k-8k and Llama's GQA 4k are within 1% of their best at this width and lose 2-11% at twice
 * it; one pair at a time, longest first, loses 5-7% at d128 8k and Llama 4k (the last pair's long key blocks run last).
 * The chunks are balanced: sizes g + 1 (the first `wide`) and g. */
static void fa3_bwd_order(const fa_params *p, const fa_cuda_device *dev, int key_blocks, int *g, int *wide,
                          int *last_first) {
    const int pairs = p->heads_kv * p->batch;
    int chunk = 1;
    *last_first = !p->causal && p->window_left >= 0 && p->window_right < 0;
    if ((p->causal || p->window_left >= 0 || p->window_right >= 0) && key_blocks > 0) {
        chunk = dev->sm_count / key_blocks;
        if (chunk > pairs) chunk = pairs;
        if (chunk < 1) chunk = 1;
    }
    const int chunks = (pairs + chunk - 1) / chunk;
    *g = pairs / chunks;
    *wide = pairs % chunks;
}

extern "C" size_t fa3_bwd_workspace_size(const fa_params *p, const fa_cuda_device *dev) {
    if (!p->deterministic) return fa2_bwd_workspace_size(p, dev);
    return fa3_bwd_turns_offset(p, dev) + sizeof(int) * (size_t)p->batch * p->heads_q * fa3_bwd_m_blocks(p);
}

extern "C" void fa3_bwd_describe(const fa_params *p, const fa_cuda_device *dev, char *buf, size_t size) {
    const int block_m = fa3_bwd_block_m(p->head_dim), block_n = fa3_bwd_block_n(p->head_dim);
    const int key_blocks = (p->seqlen_k + block_n - 1) / block_n;
    int g = 0, wide = 0, last_first = 0;
    fa3_bwd_order(p, dev, key_blocks, &g, &wide, &last_first);
    char order[96];
    if (p->deterministic)
        snprintf(order, sizeof order, "key blocks last first, %d (kv head, batch) pair%s at a time",
                 fa3_bwd_det_chunk(p), fa3_bwd_det_chunk(p) == 1 ? "" : "s");
    else
        snprintf(order, sizeof order, "key blocks %s first, %d%s (kv head, batch) pair%s at a time",
                 last_first ? "last" : "first", g, wide ? " or one more" : "", g == 1 && !wide ? "" : "s");
    snprintf(buf, size,
             "a CTA per %d-key block (%d x %d x %d = %d CTAs; %s), two consumer warpgroups %s walking %d-query "
             "steps, dQ added to an fp32 accumulator%s (zeroed by the preprocess)",
             block_n, key_blocks, p->heads_kv, p->batch, key_blocks * p->heads_kv * p->batch, order,
             p->head_dim == 256 ? "splitting the keys for S and the head dim for dK, dV, dQ" : "of 64 keys", block_m,
             p->deterministic ? " by the key blocks in a fixed order (deterministic)" : "");
}

extern "C" fa_status fa3_bwd_run(const fa_params *p, const fa_cuda_device *dev, void *workspace, cudaStream_t stream) {
    fa_status st = fa3_bwd_supported(p, dev);
    if (st != FA_OK) return st;
    if (workspace == NULL) return fa_fail(FA_ERR_INTERNAL, "fa3 backward: no workspace");

    fa3_bwd_args a;
    memset(&a, 0, sizeof a);
    fa2_bwd_args_make(p, 1, workspace, &a.b);
    const int block_n = fa3_bwd_block_n(p->head_dim);
    a.key_blocks = (p->seqlen_k + block_n - 1) / block_n;
    a.chunk_heads = fa3_bwd_det_chunk(p);
    fa3_bwd_order(p, dev, a.key_blocks, &a.order_pairs, &a.order_wide, &a.order_last_first);
    const int block_m = fa3_bwd_block_m(p->head_dim);
    CUtensorMap maps[4]; /* q, k, v, dout; varlen: rows are the packed tokens */
    const int64_t rows_q = fa_is_varlen(p) ? p->total_q : p->seqlen_q,
                  rows_k = fa_is_varlen(p) ? p->total_k : p->seqlen_k;
    if ((st = fa3_tensor_map_rows(&maps[0], p, &p->q, rows_q, p->heads_q, block_m)) != FA_OK ||
        (st = fa3_tensor_map_rows(&maps[1], p, &p->k, rows_k, p->heads_kv, block_n)) != FA_OK ||
        (st = fa3_tensor_map_rows(&maps[2], p, &p->v, rows_k, p->heads_kv, block_n)) != FA_OK ||
        (st = fa3_tensor_map_rows(&maps[3], p, &p->dout, rows_q, p->heads_q, block_m)) != FA_OK)
        return st;
    /* (the preprocess kernel zeroes the dQ accumulator) */
    if (p->deterministic) {
        a.m_blocks = fa3_bwd_m_blocks(p);
        a.dq_turns = (int *)((char *)workspace + fa3_bwd_turns_offset(p, dev));
        st = fa_cuda_status(
            cudaMemsetAsync(a.dq_turns, 0, sizeof(int) * (size_t)p->batch * p->heads_q * a.m_blocks, stream),
            "fa3 backward turn counts reset");
        if (st != FA_OK) return st;
    }
    const int bf16 = p->dtype == FA_BF16;
    switch (p->head_dim) {
#if FA_HAS_HDIM_64
    case 64: return fa3_bwd_run_hdim64(&a, maps, bf16, stream);
#endif
#if FA_HAS_HDIM_128
    case 128: return fa3_bwd_run_hdim128(&a, maps, bf16, stream);
#endif
#if FA_HAS_HDIM_256
    case 256: return fa3_bwd_run_hdim256(&a, maps, bf16, stream);
#endif
    default: return fa_fail(FA_ERR_INTERNAL, "fa3 backward: no launcher for head_dim %d", p->head_dim);
    }
}

const fa_kernel_family fa3_bwd_family = { "fa3 backward", fa3_bwd_supported, fa3_bwd_workspace_size, fa3_bwd_run,
                                          fa3_bwd_describe };
