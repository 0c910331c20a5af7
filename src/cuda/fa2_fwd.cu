/*
 * fa2_fwd.cu - FlashAttention-2 forward, host side: which problems the kernels take, the head-dim table, and
 * the launch. The kernel and its tile sizes are in fa2_fwd.cuh, one instantiation per head dim in
 * fa2_fwd_hdim*.cu.
 */
#include <math.h>

#include "fa2_fwd.cuh"
#include "kernels.h"

typedef cudaError_t (*fa2_fwd_launcher)(const fa2_fwd_args *a, fa_dtype dtype, int batch, cudaStream_t stream);

/* Head dim -> launcher and shared memory per block. Tile sizes and the reason for each: fa2_fwd_tile<D>. */
static const struct fa2_fwd_variant {
    int              head_dim;
    fa2_fwd_launcher launch;
    size_t           smem;
} fa2_fwd_variants[] = {
    {32, fa2_fwd_hdim32, fa2_fwd_smem_bytes<32>()},    {64, fa2_fwd_hdim64, fa2_fwd_smem_bytes<64>()},
    {96, fa2_fwd_hdim96, fa2_fwd_smem_bytes<96>()},    {128, fa2_fwd_hdim128, fa2_fwd_smem_bytes<128>()},
    {192, fa2_fwd_hdim192, fa2_fwd_smem_bytes<192>()}, {256, fa2_fwd_hdim256, fa2_fwd_smem_bytes<256>()},
};

static const struct fa2_fwd_variant *fa2_fwd_find(int head_dim) {
    for (size_t i = 0; i < sizeof fa2_fwd_variants / sizeof fa2_fwd_variants[0]; i++)
        if (fa2_fwd_variants[i].head_dim == head_dim) return &fa2_fwd_variants[i];
    return NULL;
}

extern "C" fa_status fa2_fwd_supported(const fa_params *p, const fa_cuda_device *dev) {
    if (p->dtype != FA_F16 && p->dtype != FA_BF16)
        return fa_fail(FA_ERR_UNSUPPORTED, "the FA2 kernels take f16 or bf16 only (dtype %d)", (int)p->dtype);
    const struct fa2_fwd_variant *v = fa2_fwd_find(p->head_dim);
    if (!v)
        return fa_fail(FA_ERR_UNSUPPORTED, "head_dim (%d) has no FA2 forward kernel (32, 64, 96, 128, 192, 256)",
                       p->head_dim);
    if (dev->cc_major < 8)
        return fa_fail(FA_ERR_UNSUPPORTED, "the FA2 kernels need compute capability 8.0 or newer (device %d is %d.%d)",
                       dev->ordinal, dev->cc_major, dev->cc_minor);
    if (v->smem > dev->smem_optin)
        return fa_fail(FA_ERR_UNSUPPORTED, "the FA2 forward for head_dim %d needs %zu bytes of shared memory per block; "
                       "device %d allows %zu", p->head_dim, v->smem, dev->ordinal, dev->smem_optin);
    if (p->batch > 65535 || p->heads_q > 65535)
        return fa_fail(FA_ERR_UNSUPPORTED, "batch (%d) and heads_q (%d) must be <= 65535 for the FA2 forward grid",
                       p->batch, p->heads_q);
    /* tile copies use 32-bit offsets within a tile of at most 256 rows */
    const fa_tensor *ts[3] = {&p->q, &p->k, &p->v};
    const char      *nm[3] = {"q", "k", "v"};
    for (int i = 0; i < 3; i++)
        if (ts[i]->stride_seq > INT32_MAX / 256)
            return fa_fail(FA_ERR_UNSUPPORTED, "%s.stride_seq (%lld) exceeds the FA2 kernels' limit (%d elements)",
                           nm[i], (long long)ts[i]->stride_seq, INT32_MAX / 256);
    cudaError_t err = v->launch(NULL, p->dtype, 0, 0);
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
    (void)dev;
    (void)workspace;
    const struct fa2_fwd_variant *v = fa2_fwd_find(p->head_dim);
    if (!v) return fa_fail(FA_ERR_INTERNAL, "FA2 forward run for head_dim %d without a kernel", p->head_dim);

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
    a.total_q       = p->total_q;
    a.scale         = p->softmax_scale;
    a.scale_log2    = fabsf(p->softmax_scale) * 1.4426950408889634f;
    a.inv_abs_scale = 1.0f / fabsf(p->softmax_scale);
    a.softcap       = p->softcap;
    a.inv_softcap   = p->softcap > 0.0f ? 1.0f / p->softcap : 0.0f;
    a.window_left = p->window_left, a.window_right = p->window_right;
    a.alibi = p->alibi_slopes, a.alibi_batch_stride = p->alibi_batch_stride;
    a.every_block_modified = p->softcap > 0.0f || p->alibi_slopes != NULL || p->softmax_scale < 0.0f;

    if (p->seqlen_q == 0) return FA_OK; /* a varlen batch of empty query sequences */
    return fa_cuda_status(v->launch(&a, p->dtype, p->batch, stream), "FA2 forward launch");
}
