#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""FP8 (e4m3) forward accuracy, emulated on the CPU: how far an FP8 attention forward lands from the fp64
reference under per-tensor scaling, per-block scaling, and per-block scaling after incoherent processing (Q and
K multiplied by one random orthogonal matrix: random signs, then a Walsh-Hadamard transform), on the outlier
distribution of the FlashAttention-3 paper (N(0, 1) + N(0, 100) * Bernoulli(0.001)).

The emulation rounds what an FP8 kernel rounds: Q, K, V to e4m3 (times their scales), the scores in fp32, P to
e4m3 after the softmax's max shift (P in [0, 1], scaled by P_SCALE into e4m3's range first), P V accumulated in
fp32, O normalised in fp32 and stored in bf16. RMSE of O against fp64 attention on the unquantized inputs.

    python3 dev/fp8/accuracy.py [--seqlen 8192] [--head-dim 128] [--heads 2] [--block 64]
"""
import argparse
import math

import torch

E4M3_MAX = 448.0


def outliers(shape, gen):
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    mask = torch.rand(shape, generator=gen, dtype=torch.float64) < 1e-3
    return x + mask * torch.randn(shape, generator=gen, dtype=torch.float64) * 10.0  # N(0, 100): std 10


def hadamard(d):
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < d:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h / math.sqrt(d)


def quantize(x, block):
    """e4m3 values (as float64) and the scale per block of `block` rows per head (block = 0: one per tensor)."""
    s, h, d = x.shape
    if block == 0:
        scale = x.abs().amax().clamp_min(1e-12) / E4M3_MAX
        return (x / scale).to(torch.float8_e4m3fn).to(torch.float64) * scale
    nb = (s + block - 1) // block
    pad = nb * block - s
    xp = torch.cat([x, x.new_zeros(pad, h, d)]) if pad else x
    xb = xp.reshape(nb, block, h, d)
    scale = xb.abs().amax(dim=(1, 3), keepdim=True).clamp_min(1e-12) / E4M3_MAX
    q = (xb / scale).to(torch.float8_e4m3fn).to(torch.float64) * scale
    return q.reshape(nb * block, h, d)[:s]


def attention_fp8(q, k, v, p_scale):
    """q, k, v already e4m3-representable (times scales); P rounded to e4m3 after the max shift."""
    s = torch.einsum("ihd,jhd->hij", q.float(), k.float()).double() / math.sqrt(q.shape[-1])
    m = s.amax(-1, keepdim=True)
    p = torch.exp(s - m)
    l = p.sum(-1, keepdim=True)
    p8 = (p * p_scale).to(torch.float32).to(torch.float8_e4m3fn).to(torch.float64) / p_scale
    o = torch.einsum("hij,jhd->ihd", p8.float(), v.float()).double() / l.permute(1, 0, 2)
    return o.to(torch.bfloat16).double()


def attention_fp8_exact_pv(q, k, v):
    """Scores from the given q, k (fp32 products), P and the P V product in fp64."""
    s = torch.einsum("ihd,jhd->hij", q.float(), k.float()).double() / math.sqrt(q.shape[-1])
    return torch.einsum("hij,jhd->ihd", torch.softmax(s, -1), v)


def attention_ref(q, k, v):
    s = torch.einsum("ihd,jhd->hij", q, k) / math.sqrt(q.shape[-1])
    p = torch.softmax(s, -1)
    return torch.einsum("hij,jhd->ihd", p, v)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seqlen", type=int, default=8192)
    ap.add_argument("--head-dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=2)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    gen = torch.Generator().manual_seed(a.seed)
    shape = (a.seqlen, a.heads, a.head_dim)
    q, k, v = (outliers(shape, gen) for _ in range(3))
    ref = attention_ref(q, k, v)
    signs = torch.where(torch.rand(a.head_dim, generator=gen) < 0.5, -1.0, 1.0).double()
    rot = signs[:, None] * hadamard(a.head_dim)  # diag(signs) H: orthogonal
    rows = []
    for name, block, incoherent in (("per-tensor", 0, False), (f"per-block {a.block}", a.block, False),
                                    (f"per-block {a.block} + incoherent", a.block, True)):
        qq, kk = (q @ rot, k @ rot) if incoherent else (q, k)
        for p_scale in (1.0, E4M3_MAX):
            o = attention_fp8(quantize(qq, block), quantize(kk, block), quantize(v, block), p_scale)
            rmse = float(((o - ref) ** 2).mean().sqrt())
            rows.append((name, p_scale, rmse))
    # where the error of the last variant comes from: each rounding alone (the others exact), and V rotated too
    # (O = P (V R) R^T: the kernel would rotate O back in its epilogue)
    qr, kr = quantize(q @ rot, a.block), quantize(k @ rot, a.block)
    alone = {
        "Q, K rounded (incoherent), P and V exact": attention_fp8_exact_pv(qr, kr, v),
        "V rounded (per block), Q, K and P exact": attention_fp8_exact_pv(q, k, quantize(v, a.block)),
        "P rounded (x 448), Q, K and V exact": attention_fp8(q, k, v, E4M3_MAX),
        "all rounded, V rotated too": attention_fp8(qr, kr, quantize(v @ rot, a.block), E4M3_MAX) @ rot.T,
    }
    ob = attention_ref(q.to(torch.bfloat16).double(), k.to(torch.bfloat16).double(), v.to(torch.bfloat16).double())
    print(f"seqlen {a.seqlen}, head_dim {a.head_dim}, heads {a.heads}; RMSE of O against fp64 attention")
    print(f"  bf16 inputs (no FP8)                          {float(((ob.to(torch.bfloat16).double() - ref) ** 2).mean().sqrt()):.2e}")
    for name, p_scale, rmse in rows:
        print(f"  {name:34s} P x {p_scale:5.0f}  {rmse:.2e}")
    for name, o in alone.items():
        print(f"  {name:47s} {float(((o.to(torch.bfloat16).double() - ref) ** 2).mean().sqrt()):.2e}")


if __name__ == "__main__":
    main()
