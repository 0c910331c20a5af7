#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""One attention call of ours or of PyTorch's cuDNN SDPA between cudaProfilerStart and Stop, for
`ncu --profile-from-start off` (tools/device.sh profile): two untimed calls first, then the profiled one.

    python3 bench/ncu_one.py ours|cudnn fwd|bwd HEAD_DIM SEQLEN [causal]
    python3 bench/ncu_one.py ours|cudnn decode BATCH CACHE_LENGTH [HEADS_Q/HEADS_KV [HEAD_DIM]]

Shape: the paper sweep's, batch = 16384 / seqlen, heads = 2048 / head_dim, bf16, (batch, seqlen, heads, dim).
decode: one query token of 32 query heads against a full cache of 8 kv heads, d128, bf16 (compare.py's decode
set; the optional arguments are its --decode-heads and --decode-head-dim); ours is flash_attn_with_kvcache,
cuDNN's SDPA takes the cache with enable_gqa.
"""
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from flashattn import flash_attn_func, flash_attn_with_kvcache  # noqa: E402


def decode(impl, b, n, hq=32, hkv=8, d=128):
    q = torch.randn(b, 1, hq, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, n, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    lens = torch.full((b,), n, dtype=torch.int32, device="cuda")
    for it in range(3):
        if it == 2:
            torch.cuda.profiler.start()
        if impl == "ours":
            flash_attn_with_kvcache(q, k, v, cache_seqlens=lens)
        else:
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                               enable_gqa=True)
        torch.cuda.synchronize()
    torch.cuda.profiler.stop()


def main():
    if sys.argv[2] == "decode":
        heads = [int(x) for x in sys.argv[5].split("/")] if len(sys.argv) > 5 else [32, 8]
        return decode(sys.argv[1], int(sys.argv[3]), int(sys.argv[4]), *heads, *[int(x) for x in sys.argv[6:7]])
    impl, direction, d, s = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    causal = len(sys.argv) > 5 and sys.argv[5] == "causal"
    b, h = max(1, 16384 // s), 2048 // d
    q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    g = torch.randn(b, s, h, d, device="cuda", dtype=torch.bfloat16)

    def forward():
        if impl == "ours":
            return flash_attn_func(q, k, v, causal=causal)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                  is_causal=causal).transpose(1, 2)

    for it in range(3):
        profiled = it == 2
        if profiled and direction == "fwd":
            torch.cuda.profiler.start()
        out = forward()
        torch.cuda.synchronize()
        if profiled and direction == "bwd":
            torch.cuda.profiler.start()
        if direction == "bwd":
            out.backward(g)
        torch.cuda.synchronize()
        if profiled:
            torch.cuda.profiler.stop()


if __name__ == "__main__":
    main()
