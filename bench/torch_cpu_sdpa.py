#!/usr/bin/env python3
"""Times PyTorch's CPU scaled_dot_product_attention (the flash kernel) for comparison with flashattn's CPU
backend: forward and backward GFLOP/s with the FlashAttention-2 paper's FLOP count (4 * s^2 * d * h per batch
entry, halved when causal; the backward counts 2.5x), median of repeats after a warm-up.

    python3 bench/torch_cpu_sdpa.py --threads 1 16 --dtype f32 --causal both

Layout (batch, heads, seqlen, head_dim), as SDPA expects.
"""
import argparse
import statistics
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

DTYPES = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}


def median_seconds(fn, reps):
    fn()  # warm-up
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench(batch, heads, seqlen, dim, dtype, causal, reps):
    shape = (batch, heads, seqlen, dim)
    q, k, v = (torch.randn(shape, dtype=dtype, requires_grad=True) for _ in range(3))
    dout = torch.randn(shape, dtype=dtype)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION), torch.no_grad():
        t_fwd = median_seconds(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=causal), reps)
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        t_bwd = median_seconds(lambda: torch.autograd.grad(out, (q, k, v), dout, retain_graph=True), reps)
    flops = 4.0 * seqlen * seqlen * dim * heads * batch / (2.0 if causal else 1.0)
    return flops / t_fwd * 1e-9, 2.5 * flops / t_bwd * 1e-9, t_fwd, t_bwd


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--threads", type=int, nargs="+", default=[1])
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seqlen", type=int, default=2048)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--dtype", choices=sorted(DTYPES), default="f32")
    ap.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()

    causals = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    print(f"torch {torch.__version__}, SDPA flash kernel on the CPU, b={args.batch} h={args.heads} "
          f"s={args.seqlen} d={args.head_dim} {args.dtype}, median of {args.reps}")
    for threads in args.threads:
        torch.set_num_threads(threads)
        for causal in causals:
            fwd, bwd, t_fwd, t_bwd = bench(args.batch, args.heads, args.seqlen, args.head_dim,
                                           DTYPES[args.dtype], causal, args.reps)
            print(f"torch threads={threads} causal={int(causal)} | fwd {t_fwd * 1e3:.2f} ms {fwd:.1f} GFLOP/s "
                  f"| bwd {t_bwd * 1e3:.2f} ms {bwd:.1f} GFLOP/s", flush=True)


if __name__ == "__main__":
    main()
