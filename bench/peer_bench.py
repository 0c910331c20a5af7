#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Times the attention implementations flashattn is compared with, on the machine it runs on.

GPU (default): torch.nn.functional.scaled_dot_product_attention with exactly one SDPA backend allowed at a
time -- torch-flash (PyTorch's FlashAttention-2), torch-cudnn (cuDNN fused attention), and optionally
torch-efficient (memory-efficient kernel) and torch-math (the unfused composite). BF16, the sweep of the
FlashAttention-2 paper (section 4.1): batch * seqlen = 16k tokens, heads * head_dim = 2048.

CPU (--cpu): PyTorch's CPU SDPA flash kernel, fp32 (or --dtype), batch 1, 8 heads, seqlen 2048, head_dim 128,
at the thread counts given by --threads.

FLOPs as in the paper: forward 4 * seqlen^2 * head_dim * heads * batch, halved when causal; the backward
counts 2.5x the forward. Times are medians of CUDA-event timed calls after warm-up (triton's do_bench when
it is installed, the same method otherwise); q, k, v are (batch, heads, seqlen, head_dim) contiguous.

  bench/peer_bench.py                                   # the full paper sweep, forward and backward
  bench/peer_bench.py --head-dims 128 --seqlens 4096,16384 --causal no --passes fwd
  bench/peer_bench.py --impls flash,cudnn,efficient,math --ceilings --json peers.json
  bench/peer_bench.py --cpu --threads 1,16 --json cpu-peers.json
  bench/peer_bench.py --cpu --dtype bf16 --threads 1,16

--json writes a list of records {"impl", "head_dim", "causal", "seqlen", "batch", "heads", "pass",
"tflops", "ms"} (plus "device", and "threads" for --cpu), which `flashattn bench --peers FILE` reads.
Shapes an implementation refuses (or runs out of memory on) are left out of the list.
"""
import argparse
import json
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_core as core  # noqa: E402 (the argument parsers both benchmark scripts use)

IMPLS = {
    "flash": SDPBackend.FLASH_ATTENTION,
    "cudnn": SDPBackend.CUDNN_ATTENTION,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "math": SDPBackend.MATH,
}

try:
    from triton.testing import do_bench as _triton_do_bench
except ImportError:  # pragma: no cover - depends on the machine
    _triton_do_bench = None


def attention_flops(batch, heads, seqlen, head_dim, causal, backward):
    fwd = 4.0 * seqlen * seqlen * head_dim * heads * batch / (2 if causal else 1)
    return 2.5 * fwd if backward else fwd


def median_ms_cuda(fn, warmup_ms, rep_ms):
    """Median time of fn in milliseconds, each call timed with CUDA events after an L2 flush."""
    if _triton_do_bench is not None:
        return _triton_do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")
    flush = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    one = max((time.perf_counter() - t0) * 1e3, 1e-3)
    for _ in range(max(1, int(warmup_ms / one))):
        fn()
    times = []
    for _ in range(max(5, min(1000, int(rep_ms / one)))):
        flush.zero_()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        times.append((start, end))
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in times)


def median_ms_cpu(fn, reps):
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def attention_call(backend, q, k, v, causal, backward):
    """A closure running one forward, or one backward of a forward computed once, under `backend`."""
    if not backward:
        def fwd():
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return fwd
    with sdpa_kernel(backend):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    grad = torch.randn_like(o)

    def bwd():
        return torch.autograd.grad(o, (q, k, v), grad, retain_graph=True)
    return bwd


def try_time(timer, make_call):
    """Milliseconds, or None when the backend refuses the problem or runs out of memory."""
    try:
        fn = make_call()
        fn()
        return timer(fn)
    except RuntimeError:  # includes torch.OutOfMemoryError
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return None


def gpu_sweep(args, device_name):
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype]
    causals = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    timer = lambda fn: median_ms_cuda(fn, args.warmup_ms, args.rep_ms)
    records = []
    cols = ["%s_%s" % (i, p) for p in args.passes for i in args.impls]
    print("%4s %6s %6s %5s %5s  %s" % ("d", "causal", "seqlen", "batch", "heads",
                                     " ".join("%15s" % c for c in cols)) + "   (TFLOP/s)")
    for d in args.head_dims:
        heads = args.hidden // d
        for causal in causals:
            for s in args.seqlens:
                batch = max(1, args.tokens // s)
                q, k, v = (torch.randn(batch, heads, s, d, device="cuda", dtype=dtype, requires_grad=True)
                           for _ in range(3))
                row = {}
                for p in args.passes:
                    backward = p == "bwd"
                    flops = attention_flops(batch, heads, s, d, causal, backward)
                    for impl in args.impls:
                        ms = try_time(timer, lambda: attention_call(IMPLS[impl], q, k, v, causal, backward))
                        row["%s_%s" % (impl, p)] = None if ms is None else flops / ms / 1e9
                        if ms is not None:
                            records.append({"impl": "torch-" + impl, "head_dim": d, "causal": causal, "seqlen": s,
                                            "batch": batch, "heads": heads, "pass": p,
                                            "tflops": round(flops / ms / 1e9, 2), "ms": round(ms, 4),
                                            "device": device_name})
                print("%4d %6s %6d %5d %5d  %s" % (d, "yes" if causal else "no", s, batch, heads,
                      " ".join("%15s" % ("-" if row[c] is None else "%.1f" % row[c]) for c in cols)), flush=True)
                del q, k, v
                torch.cuda.empty_cache()
    return records


def cpu_model():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "cpu"


def cpu_sweep(args):
    batch, heads, s, d = 1, 8, 2048, 128
    causals = {"no": [False], "yes": [True], "both": [False, True]}[args.causal]
    records = []
    name = cpu_model()
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[args.dtype or "fp32"]
    print("%7s %6s %12s %12s   (GFLOP/s, torch CPU SDPA flash, %s, b1 h8 s2048 d128)"
          % ("threads", "causal", "fwd", "bwd", args.dtype or "fp32"))
    for threads in args.threads:
        torch.set_num_threads(threads)
        for causal in causals:
            q, k, v = (torch.randn(batch, heads, s, d, dtype=dtype, requires_grad=True) for _ in range(3))
            gflops = {}
            for p in args.passes:
                backward = p == "bwd"
                flops = attention_flops(batch, heads, s, d, causal, backward)
                ms = try_time(lambda fn: median_ms_cpu(fn, args.cpu_reps),
                              lambda: attention_call(SDPBackend.FLASH_ATTENTION, q, k, v, causal, backward))
                if ms is not None:
                    gflops[p] = flops / ms / 1e6
                    records.append({"impl": "torch-cpu-flash", "head_dim": d, "causal": causal, "seqlen": s,
                                    "batch": batch, "heads": heads, "pass": p,
                                    "tflops": round(flops / ms / 1e9, 6), "ms": round(ms, 3),
                                    "threads": threads, "device": name})
            show = lambda p: "%.1f" % gflops[p] if p in gflops else "-"
            print("%7d %6s %12s %12s" % (threads, "yes" if causal else "no", show("fwd"), show("bwd")), flush=True)
    return records


def ceilings(args):
    """The bf16 matrix-product and device-to-device copy rates of this GPU: the roofs attention runs under."""
    n = 8192
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    ms = median_ms_cuda(lambda: a @ b, args.warmup_ms, args.rep_ms)
    gemm = 2.0 * n ** 3 / ms / 1e9
    src = torch.empty(1 << 30, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)
    ms = median_ms_cuda(lambda: dst.copy_(src), args.warmup_ms, args.rep_ms)
    copy_tbps = 2.0 * src.numel() / ms / 1e9  # bytes read + written
    print("# ceilings: bf16 GEMM %d^3 %.0f TFLOP/s; device-to-device copy %.2f TB/s (read + write)"
          % (n, gemm, copy_tbps), flush=True)
    del a, b, src, dst
    torch.cuda.empty_cache()
    return {"gemm_bf16_tflops": round(gemm, 1), "copy_tbps": round(copy_tbps, 3)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impls", type=core.name_list(list(IMPLS)), default=["flash", "cudnn"],
                    help="SDPA backends to time, comma-separated (default flash,cudnn)")
    ap.add_argument("--head-dims", type=core.int_list, default=[64, 128, 256])
    ap.add_argument("--seqlens", type=core.int_list, default=[512, 1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--causal", choices=["no", "yes", "both"], default="both")
    ap.add_argument("--passes", type=core.name_list(["fwd", "bwd"]), default=["fwd", "bwd"])
    ap.add_argument("--tokens", type=int, default=16384, help="batch * seqlen (default 16384)")
    ap.add_argument("--hidden", type=int, default=2048, help="heads * head_dim (default 2048)")
    ap.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], help="default bf16 (--cpu: fp32)")
    ap.add_argument("--warmup-ms", type=float, default=25.0)
    ap.add_argument("--rep-ms", type=float, default=100.0)
    ap.add_argument("--ceilings", action="store_true", help="also measure the bf16 GEMM and copy ceilings")
    ap.add_argument("--ceilings-json", metavar="FILE", help="write the ceilings as a JSON object")
    ap.add_argument("--cpu", action="store_true", help="time PyTorch's CPU SDPA flash kernel instead")
    ap.add_argument("--threads", type=core.int_list, default=[1], help="CPU thread counts for --cpu (e.g. 1,16)")
    ap.add_argument("--cpu-reps", type=int, default=5)
    ap.add_argument("--json", metavar="FILE", help="write the records as a JSON list")
    args = ap.parse_args()

    if args.cpu:
        print("# torch %s, CPU SDPA, %d threads available" % (torch.__version__, torch.get_num_threads()))
        records = cpu_sweep(args)
    else:
        if not torch.cuda.is_available():
            sys.exit("peer_bench.py: no CUDA device (use --cpu for the CPU comparison)")
        args.dtype = args.dtype or "bf16"
        if args.dtype == "fp32":
            sys.exit("peer_bench.py: --dtype fp32 is for --cpu")
        prop = torch.cuda.get_device_properties(0)
        print("# %s, %d SMs, torch %s, CUDA %s, cuDNN %s, %s, timer %s"
              % (prop.name, prop.multi_processor_count, torch.__version__, torch.version.cuda,
                 torch.backends.cudnn.version(), args.dtype,
                 "triton do_bench" if _triton_do_bench else "CUDA events"), flush=True)
        if args.ceilings or args.ceilings_json:
            c = ceilings(args)
            if args.ceilings_json:
                with open(args.ceilings_json, "w") as f:
                    json.dump(dict(c, device=prop.name), f, indent=1)
        records = gpu_sweep(args, prop.name)

    if args.json:
        with open(args.json, "w") as f:
            json.dump(records, f, indent=1)
        print("# wrote %d records to %s" % (len(records), args.json))


if __name__ == "__main__":
    main()
