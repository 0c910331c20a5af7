#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Times the FA3 forward (libfa3dev.so, see build.sh) interleaved with PyTorch SDPA's cuDNN and FLASH backends,
config by config in one process, on the same (batch, heads, seqlen, head_dim) bf16 tensors, so that clock and
power drift hits every implementation alike. The sweep of the FlashAttention-2 paper: batch * seqlen = 16k,
heads * head_dim = 2048. cuDNN and our default are each timed twice per config (best of two is reported).

  dev/hopper/compare.py LIB [--head-dims 64,128,256] [--seqlens ...] [--variants] [--alt NAME=LIB ...] [--json FILE]

--alt times another build of libfa3dev.so (e.g. the previous commit's) as one more variant of every config
(with --variants, which times the variants).
"""
import argparse
import ctypes
import json
import math
import os
import sys

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from triton.testing import do_bench

# name -> (head dims it applies to, environment, layout: 1 = (b, h, s, d) as the peers, 0 = (b, s, h, d))
VARIANTS = {
    "ssq": ((128,), {"FLASHATTN_FA3_SCHEDULE": "full"}, 1),  # Q K^T with Q from shared memory
    "head": ((256,), {"FLASHATTN_FA3_ORDER": "head"}, 1),  # causal tiles head-major
    "grid": ((64, 128), {"FLASHATTN_FA3_SCHEDULER": "grid"}, 1),  # one CTA per tile
    "m128": ((64,), {"FLASHATTN_FA3_BLOCK_M": "128"}, 1),
    "m192": ((64,), {"FLASHATTN_FA3_BLOCK_M": "192"}, 1),
    "n96": ((64,), {"FLASHATTN_FA3_BLOCK_N": "96"}, 1),  # 192-row tiles with 96-key blocks (no spill)
    "n128": ((64,), {"FLASHATTN_FA3_BLOCK_N": "128"}, 1),  # 192-row tiles with 128-key blocks (the default)
    "pp128": ((64,), {"FLASHATTN_FA3_BLOCK_M": "128", "FLASHATTN_FA3_SCHEDULE": "full"}, 1),  # 128 rows, ping-pong
}
KNOBS = ("FLASHATTN_FA3_SCHEDULER", "FLASHATTN_FA3_SCHEDULE", "FLASHATTN_FA3_BLOCK_M", "FLASHATTN_FA3_LAZY",
         "FLASHATTN_FA3_ORDER", "FLASHATTN_FA3_BLOCK_N")


def int_list(s):
    return [int(x) for x in s.split(",") if x]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("lib")
    ap.add_argument("--head-dims", type=int_list, default=[64, 128, 256])
    ap.add_argument("--seqlens", type=int_list, default=[512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    ap.add_argument("--variants", action="store_true", help="also time the developer variants")
    ap.add_argument("--alt", action="append", default=[], metavar="NAME=LIB", help="another libfa3dev.so to time")
    ap.add_argument("--json")
    args = ap.parse_args()

    def load(path):
        lib = ctypes.CDLL(path)
        lib.fa3_dev_forward.restype = ctypes.c_int
        lib.fa3_dev_forward.argtypes = [ctypes.c_void_p] * 5 + [ctypes.c_int] * 6 + [ctypes.c_void_p] * 2
        lib.fa3_dev_error.restype = ctypes.c_char_p
        return lib

    lib = load(args.lib)
    alts = {}
    for spec in args.alt:
        name, path = spec.split("=", 1)
        alts[name] = load(os.path.abspath(path))
        VARIANTS[name] = ((64, 80, 96, 128, 192, 256), {}, 1)
    ws = torch.zeros(256, dtype=torch.uint8, device="cuda")
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, cuDNN {torch.backends.cudnn.version()}, "
          "bf16, triton do_bench median, interleaved", flush=True)

    records = []
    causals = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    for d in args.head_dims:
        for causal in causals:
            for s in args.seqlens:
                b, h = 16384 // s, 2048 // d
                flops = 4.0 * s * s * d * h * b / (2 if causal else 1)
                q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))
                o = torch.empty_like(q)
                q2, k2, v2 = (x.transpose(1, 2).contiguous() for x in (q, k, v))  # (b, s, h, d)
                o2 = torch.empty_like(q2)
                lse = torch.empty(b, h, s, device="cuda", dtype=torch.float32)
                stream = torch.cuda.current_stream().cuda_stream

                def ours(layout=1, which=None):
                    t = (q, k, v, o) if layout == 1 else (q2, k2, v2, o2)
                    fn = alts.get(which, lib)
                    st = fn.fa3_dev_forward(t[0].data_ptr(), t[1].data_ptr(), t[2].data_ptr(), t[3].data_ptr(),
                                             lse.data_ptr(), b, s, h, d, int(causal), layout, ws.data_ptr(), stream)
                    if st != 0:
                        raise RuntimeError(f"fa3_dev_forward: status {st}: {fn.fa3_dev_error().decode()}")

                def sdpa(backend):
                    def f():
                        with sdpa_kernel([backend]):
                            F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                    return f

                def tflops(fn, env=None):
                    for key in KNOBS:
                        os.environ.pop(key, None)
                    os.environ.update(env or {})
                    try:
                        ms = do_bench(fn, warmup=25, rep=100, return_mode="median")
                    except RuntimeError as e:
                        print(f"  failed: {e}", flush=True)
                        return float("nan")
                    finally:
                        for key in KNOBS:
                            os.environ.pop(key, None)
                    return flops / (ms * 1e-3) / 1e12

                # Same answer as cuDNN (a check that the tensors are passed right).
                ours()
                with sdpa_kernel([SDPBackend.CUDNN_ATTENTION]):
                    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
                err = (o.float() - ref.float()).abs().max().item()
                row = {"d": d, "causal": causal, "seqlen": s}
                row["cudnn"] = tflops(sdpa(SDPBackend.CUDNN_ATTENTION))
                row["ours"] = tflops(ours)
                row["flash"] = tflops(sdpa(SDPBackend.FLASH_ATTENTION))
                if args.variants:
                    for name, (dims, env, layout) in VARIANTS.items():
                        if d in dims:
                            row[name] = tflops(lambda: ours(layout, name), env)
                            # every variant computes the same function: check it once against cuDNN
                            os.environ.update(env)
                            (o if layout == 1 else o2).fill_(float("nan"))
                            ours(layout, name)
                            for key in KNOBS:
                                os.environ.pop(key, None)
                            got = o if layout == 1 else o2.transpose(1, 2)
                            verr = (got.float() - ref.float()).abs().max().item()
                            if not verr <= 4 * err + 1e-2:
                                print(f"  VARIANT {name} WRONG: maxdiff {verr:.1e} (default {err:.1e})", flush=True)
                                row[name] = float("nan")
                row["cudnn"] = max(row["cudnn"], tflops(sdpa(SDPBackend.CUDNN_ATTENTION)))
                row["ours"] = max(row["ours"], tflops(ours))
                extra = "  ".join(f"{n} {row[n]:.0f}" for n in VARIANTS if n in row)
                print(f"d {d:3d} causal {int(causal)} seqlen {s:5d}: ours {row['ours']:6.1f}  cudnn {row['cudnn']:6.1f}  "
                      f"flash {row['flash']:6.1f}  x{row['ours'] / row['cudnn']:.3f} cudnn  "
                      f"x{row['ours'] / row['flash']:.2f} flash  maxdiff {err:.1e}  {extra}", flush=True)
                row["maxdiff"] = err
                records.append(row)
    print("\n   d causal seqlen     ours    cudnn    flash  vs cudnn  vs flash  best variant")
    for r in records:
        best = max(((r[n], n) for n in VARIANTS if n in r and not math.isnan(r[n])), default=(float("nan"), "-"))
        print(f"{r['d']:4d} {'yes' if r['causal'] else 'no':>6} {r['seqlen']:6d} {r['ours']:8.1f} {r['cudnn']:8.1f} "
              f"{r['flash']:8.1f} {r['ours'] / r['cudnn']:9.3f} {r['ours'] / r['flash']:9.2f}  {best[1]} {best[0]:.1f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
