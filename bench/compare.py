#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""One harness that times flashattn and its peers the same way, in one process, round-robin.

What it measures
  Implementations (--impls, default ours,ours-direct,cudnn,flash,ours-bf16):
    ours         flashattn.flash_attn_func, what users call (the Python binding; backward through autograd)
    ours-direct  the library's fa_fwd / fa_bwd through ctypes with a parameter block prepared once per shape:
                 kernel time plus one ctypes call, the floor under `ours`
    cudnn, flash, efficient
                 torch.nn.functional.scaled_dot_product_attention under sdpa_kernel(SDPBackend.X) on the
                 (batch, heads, seqlen, head_dim) transposed views of the same tensors (enable_gqa=True when
                 the head counts differ)
    flex         torch.nn.attention.flex_attention compiled once per shape, causal through a block mask
                 (opt-in: it compiles)
    ours-paged   decode set only (opt-in): flash_attn_with_kvcache on the same cache cut into pages of
                 --page-size rows (default 16) in a shuffled order, through a block table
    ours-append  decode set only (opt-in): flash_attn_with_kvcache appending the step's new keys and values
                 (rotary on q and the new keys over the whole head dim) into the cache's last rows first
    ours-bf16    fp8 set only (in the defaults there): flash_attn_func on the bf16 inputs that `ours` quantized
    base-direct  (opt-in) ours-direct on another copy of the library, --base-library FILE: a change against the
                 build before it, interleaved in one process with the same timer; ratio ours-direct/base-direct
  The fp8 set runs ours, ours-bf16 and cudnn (SDPA on the float8 tensors, where it takes them) only.
  An implementation that raises on a shape (unsupported, out of memory) is recorded as missing there.
  Passes: fwd (inputs require grad, as in training, except the decode set), bwd (autograd backward of a
  forward stored once; ours-direct: fa_bwd on the forward's o and lse), fwdbwd (forward then backward).

  Sets (--sets, default paper,decode,llama,overhead,fp8):
    paper     the FlashAttention-2 paper's sweep: head_dim 64/128/256, causal or not, seqlen 512-16k,
              batch = 16384 / seqlen, heads = 2048 / head_dim; TFLOP/s by the paper's formula
              (fwd 4 s^2 d h b, halved when causal; bwd 2.5x; fwdbwd 3.5x)
    decode    one query token against a KV cache, 32 query / 8 KV heads, d128: TB/s of K and V read,
              next to the device-to-device copy bandwidth of the same run
    llama     Llama-3-8B's attention (32/8 heads, d128, causal) at (1, 8k), (4, 4k), (1, 32k)
    overhead  host time per call on 1 x 128 x 1 x 64: 2000 calls by wall clock after 200 warm-up, forward
              without grad, forward with grad recording, forward + backward; bwd = (fwd + bwd) - fwd with grad.
              SDPA here is the default backend selection on its native (b, h, s, d) layout.
    fp8       the FP8 forward: the paper's shapes (--head-dims, --seqlens, --causal apply) from 4k tokens,
              `ours` on e4m3 q, k, v (flashattn.quantize_e4m3: one descale per batch entry and head) against
              ours-bf16 on the same inputs in bf16, TFLOP/s; ceiling: the e4m3 GEMM 8192^3 (torch._scaled_mm) at
              the start and the end. Then the accuracy table: RMSE of O against fp64 attention on
              FlashAttention-3's outlier inputs (N(0, 1) + N(0, 100) * Bernoulli(0.001); b1 h2 s8192 d128) for
              bf16 inputs and e4m3 with one descale per tensor, per (batch, head), per (batch, head) after the
              Hadamard rotation of q and k (flashattn.hadamard_rotate), per 128 rows, per 128 rows after the rotation.

The timer (the same for every implementation of a shape)
  CUDA events. --mode b2b (default): warm-up calls, then [L2 flush] start, N calls back to back, end;
  per-call time = elapsed / N (the GPU stays busy: this is throughput, host overhead hidden unless the host is
  the bottleneck). --mode single: each of N calls between its own events with a synchronisation before it
  (host launch cost included); the round's figure is the median of the N.
  N: every implementation is probed (one call that may build plans, then two timed calls); N is chosen so that
  the fastest one's block lasts about --block-ms (default 30 ms), clamped to [3, 500]; as many warm-up calls (the clock follows the power draw within tens of ms: a
  short warm-up favours whatever follows a light kernel). N and the warm-up are the same for every implementation of the shape and pass.
  Pre-heat (--preheat-ms, default 20): before every block, bf16 matrix products for that long, so that every
  implementation's block starts from the same loaded state (the clock follows the power draw: a block after a
  light kernel would start faster).
  --l2 flush (default): a buffer of twice the L2 size is zeroed outside the timed region, before each timed
  block (b2b) or each call (single); --l2 warm: never.
  Rounds (--rounds, default and minimum 3; --quick allows fewer): in each round every implementation is timed
  once, in an order rotated by one each round. Reported: per implementation the median of the per-round
  figures and their min-max; per ratio ours/peer (peer time / our time, >1 = ours faster) the median and
  min-max of the per-round ratios.
  Ceilings: the bf16 8192^3 torch.mm (same timer, b2b) at the start and the end, the 1 GiB device-to-device
  copy (bytes read + written) at the start.

Output: --json FILE (metadata, ceilings, one record per (set, shape, pass, impl) with every round), --csv FILE
(one row per record); both rewritten / appended as each shape finishes. The summary table is printed last.
--device cpu runs the same machinery on tiny shapes on the CPU (ours through the CPU backend, torch's CPU
SDPA, wall clock instead of events): a smoke test of the flow, not a benchmark.

  bench/compare.py --json compare.json --csv compare.csv          # the default sets (estimated 4 min, H100)
  bench/compare.py --sets paper --head-dims 128 --causal yes --passes fwd
  bench/compare.py --device cpu --quick                           # smoke test without a GPU
  bench/compare.py --device cpu --threads 1 --dtype bf16 --sets paper --head-dims 128 --seqlens 2048 \
      --paper-tokens 2048 --paper-hidden 1024 --impls ours,ours-direct,flash   # the CPU backend at b1 h8 s2048 d128
  bench/compare.py --sets paper,llama --passes bwd --impls ours-direct,base-direct \
      --base-library /tmp/base/build/libflashattn.so                # a change against the build before it
  bench/compare.py --estimate                                     # the run-time estimate, no GPU needed
  bench/compare.py --summary compare.json                         # the table of an earlier run
"""

import argparse
import contextlib
import csv
import ctypes
import datetime
import gc
import json
import os
import statistics
import subprocess
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import compare_core as core  # noqa: E402

ALL_IMPLS = ("ours", "ours-direct", "cudnn", "flash", "efficient", "flex", "ours-paged", "ours-append", "ours-bf16",
             "base-direct")
DEFAULT_IMPLS = ("ours", "ours-direct", "cudnn", "flash", "ours-bf16")

# --device cpu: tiny shapes of the same sets, so the flow runs in seconds.
CPU_SCALE = {"tokens": 512, "hidden": 128, "head_dims": (64,), "seqlens": (128, 256),
             "decode": ((1, 1024), (2, 512)), "decode_heads": (4, 1, 64),
             "llama": ((1, 256),), "llama_heads": (4, 1, 64)}


def shape_list(text):
    """"8x8192,1x32768" -> ((8, 8192), (1, 32768))."""
    try:
        return tuple(tuple(int(x) for x in item.split("x")) for item in text.split(","))
    except ValueError:
        raise argparse.ArgumentTypeError("expected BxL[,BxL...]: %r" % text) from None


def head_pair(text):
    """"32/8" -> (32, 8)."""
    try:
        q, kv = (int(x) for x in text.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError("expected QUERY_HEADS/KV_HEADS: %r" % text) from None
    return q, kv


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--impls", type=core.name_list(ALL_IMPLS), default=list(DEFAULT_IMPLS))
    ap.add_argument("--sets", type=core.name_list(core.SET_NAMES), default=list(core.SET_NAMES))
    ap.add_argument("--passes", type=core.name_list(core.PASSES), default=list(core.PASSES),
                    help="passes of the paper and llama sets (decode is forward only)")
    ap.add_argument("--head-dims", type=core.int_list, help="paper set (default 64,128,256)")
    ap.add_argument("--seqlens", type=core.int_list, help="paper set (default 512,...,16384)")
    ap.add_argument("--causal", choices=["no", "yes", "both"], default="both", help="paper set")
    ap.add_argument("--paper-tokens", type=int, help="paper set: batch x seqlen (default 16384; cpu: a tiny one)")
    ap.add_argument("--paper-hidden", type=int, help="paper set: heads x head_dim (default 2048; cpu: a tiny one)")
    ap.add_argument("--dtype", choices=["bf16", "fp16", "fp32"], help="default bf16 (cpu: fp32)")
    ap.add_argument("--page-size", type=int, default=16, help="rows per page of ours-paged (decode set)")
    ap.add_argument("--decode-shapes", type=shape_list, help="decode set: BxL,... (default the five bar shapes)")
    ap.add_argument("--decode-heads", type=head_pair, help="decode set: query/kv heads (default 32/8)")
    ap.add_argument("--decode-head-dim", type=int, help="decode set (default 128)")
    ap.add_argument("--decode-q", type=int, default=1,
                    help="decode set: query tokens per sequence (more than 1: causal; the SDPA peers skip it)")
    ap.add_argument("--base-library", metavar="FILE",
                    help="base-direct's library: another build (e.g. of the commit before a change)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--mode", choices=["b2b", "single"], default="b2b")
    ap.add_argument("--l2", choices=["flush", "warm"], default="flush")
    ap.add_argument("--block-ms", type=float, default=30.0)
    ap.add_argument("--preheat-ms", type=float, default=20.0,
                    help="bf16 matrix products before every timed block, so that each starts from the same "
                         "loaded state of the GPU (0: none)")
    ap.add_argument("--overhead-calls", type=int, help="timed calls per round of the overhead set (2000)")
    ap.add_argument("--overhead-warmup", type=int, help="warm-up calls of the overhead set (200)")
    ap.add_argument("--quick", action="store_true", help="a few shapes per set; --rounds below 3 allowed")
    ap.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    ap.add_argument("--threads", type=int, default=1,
                    help="--device cpu: threads of torch and of our CPU backend (default 1: a shared machine's "
                         "cores fought over by two thread pools make the smoke run's figures meaningless)")
    ap.add_argument("--json", metavar="FILE")
    ap.add_argument("--csv", metavar="FILE")
    ap.add_argument("--summary", metavar="FILE", help="print the summary table of an earlier --json and exit")
    ap.add_argument("--estimate", action="store_true", help="print the H100 run-time estimate and exit")
    args = ap.parse_args(argv)
    if args.rounds < 1 or (args.rounds < 3 and not args.quick):
        ap.error("--rounds must be at least 3 (or at least 1 with --quick)")
    if args.block_ms <= 0:
        ap.error("--block-ms must be positive")
    if ("base-direct" in args.impls) != (args.base_library is not None):
        ap.error("base-direct and --base-library go together")
    if args.overhead_calls is None:
        args.overhead_calls = 200 if args.quick else 2000
    if args.overhead_warmup is None:
        args.overhead_warmup = 20 if args.quick else 200
    if args.dtype is None:
        args.dtype = "fp32" if args.device == "cpu" else "bf16"
    return args


def build_cases(args):
    """The cases of the chosen sets, scaled down for --device cpu and thinned for --quick."""
    cpu = args.device == "cpu"
    causals = {"no": (False,), "yes": (True,), "both": (False, True)}[args.causal]
    train_passes = tuple(p for p in core.PASSES if p in args.passes)
    cases = []
    for s in args.sets:
        if s == "paper":
            if cpu:
                head_dims = args.head_dims or CPU_SCALE["head_dims"]
                seqlens = args.seqlens or CPU_SCALE["seqlens"]
                tokens, hidden = args.paper_tokens or CPU_SCALE["tokens"], args.paper_hidden or CPU_SCALE["hidden"]
                got = core.paper_cases(head_dims, seqlens, causals, train_passes, tokens, hidden)
            else:
                head_dims = args.head_dims or ((128,) if args.quick else (64, 128, 256))
                seqlens = args.seqlens or ((1024, 8192) if args.quick else (512, 1024, 2048, 4096, 8192, 16384))
                got = core.paper_cases(head_dims, seqlens, causals, train_passes, args.paper_tokens or 16384,
                                       args.paper_hidden or 2048)
        elif s == "decode":
            shapes, (hq, hkv, d) = CPU_SCALE["decode"], CPU_SCALE["decode_heads"]
            if not cpu:
                shapes, (hq, hkv, d) = core.DECODE_SHAPES, (32, 8, 128)
            hq, hkv = args.decode_heads or (hq, hkv)
            got = core.decode_cases(args.decode_shapes or shapes, hq, hkv, args.decode_head_dim or d, args.decode_q)
            got = core.quick_subset(got, 2) if args.quick else got
        elif s == "llama":
            if cpu:
                got = core.llama_cases(CPU_SCALE["llama"], train_passes, *CPU_SCALE["llama_heads"])
            else:
                got = core.llama_cases(passes=train_passes)
            got = core.quick_subset(got, 1) if args.quick else got
        elif s == "fp8":
            if cpu:
                got = core.fp8_cases(args.head_dims or CPU_SCALE["head_dims"], args.seqlens or CPU_SCALE["seqlens"],
                                     causals, args.paper_tokens or CPU_SCALE["tokens"],
                                     args.paper_hidden or CPU_SCALE["hidden"])
            else:
                got = core.fp8_cases(args.head_dims or core.FP8_HEAD_DIMS, args.seqlens or core.FP8_SEQLENS,
                                     causals, args.paper_tokens or 16384, args.paper_hidden or 2048)
            got = core.quick_subset(got, 2) if args.quick else got
        else:
            got = [core.overhead_case()]
        cases += [c for c in got if c.passes]
    return cases


def print_estimate(args, cases):
    total, per_set = core.estimate_seconds(cases, args.impls, args.rounds, args.block_ms,
                                           overhead_calls=args.overhead_calls + args.overhead_warmup,
                                           preheat_ms=args.preheat_ms)
    print("estimate for an H100 (model in bench/compare_core.py H100_MODEL): %.0f s (%.1f min) for %d shapes, "
          "%d implementations, %d rounds, block %.0f ms" % (total, total / 60, len(cases), len(args.impls),
                                                           args.rounds, args.block_ms))
    for s, t in per_set.items():
        print("  %-9s %6.0f s" % (s, t))
    return total


def summary_from_json(path):
    with open(path) as f:
        data = json.load(f)
    for line in header_lines(data):
        print(line)
    for line in core.summary_lines(data["records"], data.get("meta", {}).get("options", {}).get("impls"),
                                   data.get("ceilings")):
        print(line)
    for line in core.fp8_accuracy_lines(data.get("fp8_accuracy")):
        print(line)


def header_lines(data):
    meta, ceil = data.get("meta", {}), data.get("ceilings", {})
    lines = ["# %s, %s SMs, torch %s, CUDA %s, cuDNN %s, git %s%s, %s UTC" % (
        meta.get("device_name"), meta.get("sm_count"), meta.get("torch"), meta.get("cuda"), meta.get("cudnn"),
        meta.get("git"), " (dirty)" if meta.get("git_dirty") else "", meta.get("date_utc"))]
    opts = meta.get("options", {})
    lines.append("# timer %s, L2 %s, %s rounds, block %s ms, dtype %s" % (
        opts.get("mode"), opts.get("l2"), opts.get("rounds"), opts.get("block_ms"), opts.get("dtype")))
    for when in ("start", "end"):
        c = ceil.get(when)
        if c:
            parts = ["GEMM %s %d^3 %s TFLOP/s" % (c["gemm_dtype"], c["gemm_n"], core.fmt_value(c["gemm_tflops"]))]
            if "gemm_e4m3_tflops" in c:
                parts.append("GEMM e4m3 %s TFLOP/s" % core.fmt_value(c["gemm_e4m3_tflops"]))
            elif "gemm_e4m3_error" in c:
                parts.append("GEMM e4m3 missing (%s)" % c["gemm_e4m3_error"])
            if "copy_tbps" in c:
                parts.append("copy %s TB/s (read + write of %d MiB)" % (core.fmt_value(c["copy_tbps"]),
                                                                       c["copy_bytes"] >> 20))
            lines.append("# ceilings at the %s: %s" % (when, "; ".join(parts)))
    return lines


# ---------------------------------------------------------------------------------------------------------
# Everything below needs torch.

def git_info():
    try:
        head = subprocess.run(["git", "-C", REPO, "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = bool(subprocess.run(["git", "-C", REPO, "status", "--porcelain"], capture_output=True,
                                    text=True, timeout=10).stdout.strip())
        return head or None, dirty
    except (OSError, subprocess.SubprocessError):
        return None, None


def driver_version():
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20).stdout.strip()
        return out.splitlines()[0] if out else None
    except (OSError, subprocess.SubprocessError):
        return None


class Timer:
    """The one timer every implementation goes through (see the module docstring)."""

    def __init__(self, torch, device, mode, l2):
        self.torch = torch
        self.cuda = device == "cuda"
        self.mode = mode
        self.flush_buf = None
        self.l2_bytes = None
        self.preheat = None  # set by set_preheat on a GPU
        if l2 == "flush":
            if self.cuda:
                props = torch.cuda.get_device_properties(torch.cuda.current_device())
                self.l2_bytes = getattr(props, "L2_cache_size", 0) or None
                size = 2 * self.l2_bytes if self.l2_bytes else 256 << 20
            else:
                size = 32 << 20  # the CPU smoke run only exercises the path
            self.flush_buf = torch.empty(size, dtype=torch.uint8, device=device)

    def set_preheat(self, ms):
        """Before every block, about `ms` of bf16 matrix products: each implementation's block starts from the
        same loaded state of the GPU. Its clock follows the power draw over tens to hundreds of milliseconds,
        so without this a block that follows a light kernel (PyTorch's FA2, or idle time) starts at a higher
        clock than one that follows a heavy kernel: measured on an H200 as up to 10% between two timings of one
        kernel, by position in the round."""
        if not self.cuda or ms <= 0:
            return
        torch = self.torch
        a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(a)
        torch.mm(a, b, out=out)
        start, end = self._events()
        start.record()
        for _ in range(10):
            torch.mm(a, b, out=out)
        end.record()
        end.synchronize()
        reps = max(1, int(round(ms / (start.elapsed_time(end) / 10))))

        def preheat():
            for _ in range(reps):
                torch.mm(a, b, out=out)
        self.preheat = preheat

    def sync(self):
        if self.cuda:
            self.torch.cuda.synchronize()

    def flush(self):
        if self.flush_buf is not None:
            self.flush_buf.zero_()

    def _events(self):
        return (self.torch.cuda.Event(enable_timing=True), self.torch.cuda.Event(enable_timing=True))

    def block(self, fn, n, warmup, mode=None):
        """Milliseconds per call of fn: the pre-heat, warm-up calls, then n timed calls as `mode` (default
        --mode) says."""
        if self.preheat is not None:
            self.preheat()
        for _ in range(warmup):
            fn()
        if (mode or self.mode) == "b2b":
            # No synchronisation after the warm-up: the flush and the timed calls queue behind it, so the
            # GPU does not idle at the start of the block waiting for the host.
            self.flush()
            if self.cuda:
                start, end = self._events()
                start.record()
                for _ in range(n):
                    fn()
                end.record()
                end.synchronize()
                return start.elapsed_time(end) / n
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            return (time.perf_counter() - t0) * 1e3 / n
        times = []
        for _ in range(n):
            self.flush()
            self.sync()
            if self.cuda:
                start, end = self._events()
                start.record()
                fn()
                end.record()
                end.synchronize()
                times.append(start.elapsed_time(end))
            else:
                t0 = time.perf_counter()
                fn()
                times.append((time.perf_counter() - t0) * 1e3)
        return statistics.median(times)

    def wall_us(self, fn, n, warmup):
        """Microseconds per call by wall clock, synchronised before the start and after the end (overhead set)."""
        for _ in range(warmup):
            fn()
        self.sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        self.sync()
        return (time.perf_counter() - t0) * 1e6 / n


class Impl:
    """A callable to time and the context it runs under (entered once around the warm-up and the block, so
    that entering it is not part of the per-call time); `keep` holds what the call needs kept alive."""

    def __init__(self, fn, ctx=None, keep=None):
        self.fn = fn
        self.ctx = ctx or contextlib.nullcontext
        self.keep = keep


class Direct:
    """fa_fwd / fa_bwd through ctypes on a parameter block filled once, as python/flashattn/_torch.py's
    _forward / _backward / _run fill theirs: element strides, the lse buffer, the exec block on the current
    stream, and one workspace of the larger of the forward's and the backward's sizes. lib: another copy of the
    library (base-direct: _lib.load_library), else the package's own."""

    def __init__(self, torch, q, k, v, causal, dout=None, lib=None):
        from flashattn import _common, _lib
        self._lib = _lib
        self.lib = lib or _lib.lib
        dtypes = {torch.float32: _lib.FA_F32, torch.float16: _lib.FA_F16, torch.bfloat16: _lib.FA_BF16}
        q, k, v = (t.detach() for t in (q, k, v))
        b, sq, hq, d = q.shape
        sizes = (b, sq, k.shape[1], hq, k.shape[2], d)
        self.p = _common.make_params(dtypes[q.dtype], sizes, False, _common.scale(None, d), causal, (-1, -1), 0.0)
        self.o = torch.empty_like(q)
        self.lse = torch.empty((b, hq, sq), dtype=torch.float32, device=q.device)
        self.tensors = [q, k, v, self.o, self.lse]
        fields = [("q", q), ("k", k), ("v", v), ("o", self.o)]
        if dout is not None:
            self.dq, self.dk, self.dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
            dout = dout.detach()
            fields += [("dout", dout), ("dq", self.dq), ("dk", self.dk), ("dv", self.dv)]
            self.tensors += [dout, self.dq, self.dk, self.dv]
        for field, t in fields:
            _common.set_tensor(getattr(self.p, field), t.data_ptr(), t.stride(), False)
        self.p.lse = self.lse.data_ptr()
        self.exe = _lib.Exec()
        if q.is_cuda:
            self.exe.backend = _lib.FA_BACKEND_CUDA
            self.exe.device = q.device.index if q.device.index is not None else torch.cuda.current_device()
            self.exe.stream = torch.cuda.current_stream(q.device).cuda_stream
        else:
            self.exe.backend = _lib.FA_BACKEND_CPU
            self.exe.device = -1
            self.exe.num_threads = torch.get_num_threads()
        n = self.workspace_size(0)
        if dout is not None:
            n = max(n, self.workspace_size(1))
        self.workspace = torch.empty(n, dtype=torch.uint8, device=q.device) if n else None
        if n:
            self.exe.workspace, self.exe.workspace_bytes = self.workspace.data_ptr(), n
        self.pp, self.pe = ctypes.byref(self.p), ctypes.byref(self.exe)
        self.c_fwd, self.c_bwd = self.lib.fa_fwd, self.lib.fa_bwd
        # The status is checked here, once; the timed calls return it unchecked (Impl probes check it too).
        self.check("fa_fwd", self.c_fwd(self.pp, self.pe))
        if dout is not None:
            self.check("fa_bwd", self.c_bwd(self.pp, self.pe))

    def workspace_size(self, backward):
        n = ctypes.c_size_t(0)
        self.check("fa_workspace_size",
                   self.lib.fa_workspace_size(ctypes.byref(self.p), ctypes.byref(self.exe), backward, ctypes.byref(n)))
        return n.value

    def check(self, function, status):
        """Raises for a failed call, with the message of the copy of the library that made it."""
        if self.lib is self._lib.lib:
            self._lib.raise_for_status(function, status)
        elif status != 0:
            detail = self.lib.fa_last_error()
            raise RuntimeError("%s (%s): %s: %s" % (function, self.lib._name, self.lib.fa_status_name(status).decode(),
                                                    detail.decode("utf-8", "replace") if detail else ""))

    def fwd(self):
        return self.c_fwd(self.pp, self.pe)

    def bwd(self):
        return self.c_bwd(self.pp, self.pe)

    def fwdbwd(self):
        s = self.c_fwd(self.pp, self.pe)
        return s if s else self.c_bwd(self.pp, self.pe)


class Runner:
    def __init__(self, args):
        import torch
        import torch.nn.functional as F
        self.torch, self.F = torch, F
        self.args = args
        self.device = args.device
        if self.device == "cuda" and not torch.cuda.is_available():
            sys.exit("compare.py: no CUDA device visible to torch (--device cpu runs the smoke test)")
        if os.path.isdir(os.path.join(REPO, "python", "flashattn")):
            sys.path.insert(0, os.path.join(REPO, "python"))  # this tree's binding, as the tests use it
        import flashattn
        self.fa = flashattn
        # base-direct: the build from before a change, in this process beside ours-direct
        self.base_lib = flashattn._lib.load_library(args.base_library) if "base-direct" in args.impls else None
        if self.device == "cpu":
            torch.set_num_threads(args.threads)  # our CPU backend takes torch's thread count (_torch.py)
        self.dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
        self.elem_bytes = torch.tensor([], dtype=self.dtype).element_size()
        self.timer = Timer(torch, self.device, args.mode, args.l2)
        self.timer.set_preheat(args.preheat_ms)
        self.records, self.missing, self.ceilings = [], [], {}
        self.fp8_accuracy = None
        self.csv_file = None
        self.t_start = time.perf_counter()
        self.meta = self.metadata()
        self._flex = None

    # ---- metadata and outputs ----

    def metadata(self):
        torch = self.torch
        head, dirty = git_info()
        meta = {"date_utc": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M:%S"),
                "git": head, "git_dirty": dirty, "torch": torch.__version__, "cuda": torch.version.cuda,
                "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
                "library": self.fa.library_path, "build_info": self.fa.build_info(),
                "options": {k: v for k, v in vars(self.args).items()}, "l2_bytes": self.timer.l2_bytes}
        if self.device == "cuda":
            props = torch.cuda.get_device_properties(torch.cuda.current_device())
            meta.update(device_name=props.name, sm_count=props.multi_processor_count, driver=driver_version(),
                        compute_capability="%d.%d" % (props.major, props.minor))
        else:
            meta.update(device_name="cpu (%d threads)" % torch.get_num_threads(), sm_count=None, driver=None)
        return meta

    def write_json(self):
        if not self.args.json:
            return
        data = {"meta": self.meta, "ceilings": self.ceilings, "records": self.records,
                "ratios": core.ratio_entries(self.records), "missing": self.missing}
        if self.fp8_accuracy:
            data["fp8_accuracy"] = self.fp8_accuracy
        tmp = self.args.json + ".tmp"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
        os.replace(tmp, self.args.json)  # an interrupted run leaves the last complete file

    def add_records(self, recs):
        self.records += recs
        if self.args.csv:
            if self.csv_file is None:
                self.csv_file = open(self.args.csv, "w", newline="")
                self.csv_writer = csv.DictWriter(self.csv_file, fieldnames=core.CSV_FIELDS)
                self.csv_writer.writeheader()
            for r in recs:
                self.csv_writer.writerow(core.csv_row(r))
            self.csv_file.flush()

    def log(self, text):
        print("[%5.0fs] %s" % (time.perf_counter() - self.t_start, text), flush=True)

    # ---- ceilings ----

    def time_auto(self, fn):
        """The ceilings' timing: always back to back, whatever --mode, so that they measure the roofs."""
        fn()
        self.timer.sync()
        n, w = core.choose_calls(self.timer.block(fn, 2, 0, "b2b"), self.args.block_ms)
        return self.timer.block(fn, n, w, "b2b")

    def measure_ceilings(self, when):
        torch = self.torch
        cuda = self.device == "cuda"
        n = 8192 if cuda else 512
        dt = torch.bfloat16 if cuda else torch.float32
        a = torch.randn(n, n, device=self.device, dtype=dt)
        b = torch.randn(n, n, device=self.device, dtype=dt)
        c = torch.empty(n, n, device=self.device, dtype=dt)
        ms = self.time_auto(lambda: torch.mm(a, b, out=c))
        res = {"gemm_n": n, "gemm_dtype": "bf16" if cuda else "fp32", "gemm_tflops": 2.0 * n ** 3 / ms / 1e9,
               "gemm_ms": ms}
        del a, b, c
        e4m3 = getattr(torch, "float8_e4m3fn", None)
        if cuda and "fp8" in self.args.sets and e4m3 is not None:
            try:
                a8 = torch.randn(n, n, device=self.device).to(e4m3)
                b8 = torch.randn(n, n, device=self.device).to(e4m3).t()  # column-major, as _scaled_mm wants it
                one = torch.ones((), device=self.device)
                ms8 = self.time_auto(lambda: torch._scaled_mm(a8, b8, scale_a=one, scale_b=one,
                                                              out_dtype=torch.bfloat16))
                res.update(gemm_e4m3_tflops=2.0 * n ** 3 / ms8 / 1e9, gemm_e4m3_ms=ms8)
                del a8, b8
            except Exception as e:  # noqa: BLE001 - a PyTorch without _scaled_mm: the ceiling is missing
                res.update(gemm_e4m3_error=("%s: %s" % (type(e).__name__, e)).splitlines()[0][:200])
        if when == "start":
            nbytes = (1 << 30) if cuda else (64 << 20)
            src = torch.empty(nbytes, dtype=torch.uint8, device=self.device).fill_(1)
            dst = torch.empty_like(src)
            ms = self.time_auto(lambda: dst.copy_(src))
            res.update(copy_bytes=nbytes, copy_tbps=2.0 * nbytes / ms / 1e9, copy_ms=ms)  # read + write
            del src, dst
        self.ceilings[when] = res
        self.free()
        for line in header_lines({"ceilings": {when: res}})[2:]:
            print(line, flush=True)

    def free(self):
        gc.collect()
        if self.device == "cuda":
            self.torch.cuda.empty_cache()

    # ---- implementations ----

    def tensors(self, case, grad):
        torch = self.torch
        mk = lambda s, h: torch.randn(case.batch, s, h, case.head_dim, device=self.device, dtype=self.dtype,
                                      requires_grad=grad)
        q, k, v = mk(case.seqlen_q, case.heads_q), mk(case.seqlen_k, case.heads_kv), mk(case.seqlen_k, case.heads_kv)
        g = torch.randn_like(q)
        return q, k, v, g

    def sdpa_fwd(self, backend, q, k, v, causal):
        """SDPA on the (b, h, s, d) views of our (b, s, h, d) tensors, its output viewed back as (b, s, h, d)
        (what a caller with our layout does; the views cost no copy); the context selects the backend."""
        from torch.nn.attention import SDPBackend, sdpa_kernel
        F = self.F
        kw = {"is_causal": causal}
        if q.shape[2] != k.shape[2]:
            kw["enable_gqa"] = True
        ctx = lambda: sdpa_kernel(getattr(SDPBackend, backend))
        return (lambda: F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2),
                                                        **kw).transpose(1, 2)), ctx

    def flex_fwd(self, case, q, k, v):
        torch = self.torch
        from torch.nn.attention.flex_attention import create_block_mask, flex_attention
        if self._flex is None:
            # Dynamo keeps one compiled graph per shape: raise its per-function limit above the sets' shapes.
            for name in ("cache_size_limit", "recompile_limit"):
                if hasattr(torch._dynamo.config, name):
                    setattr(torch._dynamo.config, name, max(getattr(torch._dynamo.config, name), 256))
            self._flex = torch.compile(flex_attention, dynamic=False)
        mask = None
        if case.causal:
            mask = create_block_mask(lambda b, h, qi, ki: qi >= ki, None, None, case.seqlen_q, case.seqlen_k,
                                     device=self.device)
        gqa = q.shape[2] != k.shape[2]
        return (lambda: self._flex(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), block_mask=mask,
                                   enable_gqa=gqa).transpose(1, 2)), None

    def ours_fwd(self, case, q, k, v):
        fa = self.fa
        if case.set == "decode" and hasattr(fa, "flash_attn_with_kvcache"):
            lens = self.torch.full((case.batch,), case.seqlen_k, dtype=self.torch.int32, device=self.device)
            return lambda: fa.flash_attn_with_kvcache(q, k, v, cache_seqlens=lens, causal=case.causal)
        return lambda: fa.flash_attn_func(q, k, v, causal=case.causal)

    def append_impl(self, case, q, k, v):
        """ours appending as many new keys and values per sequence as it has query tokens, into the cache's last
        rows (so that L keys are attended, as in `ours`), rotary over the whole head dim on q and the new keys;
        every call rewrites those rows."""
        torch = self.torch
        n = case.seqlen_q
        new_k = torch.randn(case.batch, n, case.heads_kv, case.head_dim, device=self.device, dtype=self.dtype)
        new_v = torch.randn_like(new_k)
        angle = torch.rand(case.seqlen_k + n, case.head_dim // 2, device=self.device) * 6.283
        cos, sin = angle.cos().to(self.dtype), angle.sin().to(self.dtype)
        lens = torch.full((case.batch,), case.seqlen_k - n, dtype=torch.int32, device=self.device)
        return Impl(lambda: self.fa.flash_attn_with_kvcache(q, k, v, k=new_k, v=new_v, rotary_cos=cos, rotary_sin=sin,
                                                           cache_seqlens=lens, causal=case.causal),
                    keep=(new_k, new_v, cos, sin, lens))

    def paged_impl(self, case, q, k, v):
        """ours on the cache cut into pages of --page-size rows, stored in a shuffled order: page j of sequence b
        is page table[b][j] of the pool (the copies live as long as the Impl)."""
        torch, page = self.torch, self.args.page_size
        if case.seqlen_k % page:
            raise ValueError("the cache length %d is not a multiple of --page-size %d" % (case.seqlen_k, page))
        per_seq = case.seqlen_k // page
        table = torch.randperm(case.batch * per_seq, device=self.device).to(torch.int32).view(case.batch, per_seq)
        pools = []
        for t in (k, v):
            pool = torch.empty((case.batch * per_seq, page) + tuple(t.shape[2:]), dtype=t.dtype, device=self.device)
            pool[table.flatten().long()] = t.reshape((case.batch * per_seq, page) + tuple(t.shape[2:]))
            pools.append(pool)
        lens = torch.full((case.batch,), case.seqlen_k, dtype=torch.int32, device=self.device)
        kp, vp = pools
        return Impl(lambda: self.fa.flash_attn_with_kvcache(q, kp, vp, cache_seqlens=lens, block_table=table,
                                                           causal=case.causal),
                    keep=(kp, vp, table, lens))

    def fp8_impl(self, impl, case, q, k, v):
        """The fp8 set: ours on e4m3 q, k, v quantized from the bf16 ones (one descale per batch entry and head),
        ours-bf16 on the bf16 ones, cudnn (SDPA) on the e4m3 ones."""
        fa = self.fa
        if impl == "ours-bf16":
            return Impl(lambda: fa.flash_attn_func(q, k, v, causal=case.causal))
        (q8, dq), (k8, dk), (v8, dv) = (fa.quantize_e4m3(t) for t in (q, k, v))
        if impl == "ours":
            return Impl(lambda: fa.flash_attn_func(q8, k8, v8, causal=case.causal, q_descale=dq, k_descale=dk,
                                                   v_descale=dv), keep=(q8, k8, v8, dq, dk, dv))
        fwd, ctx = self.sdpa_fwd("CUDNN_ATTENTION", q8, k8, v8, case.causal)
        return Impl(fwd, ctx, keep=(q8, k8, v8))

    def make_impl(self, impl, case, pass_, q, k, v, g):
        """The Impl timing `impl` on `pass_`; raises when the implementation cannot run the case."""
        torch = self.torch
        if case.set == "fp8":
            return self.fp8_impl(impl, case, q, k, v)
        if impl == "ours-paged":
            return self.paged_impl(case, q, k, v)
        if impl == "ours-append":
            return self.append_impl(case, q, k, v)
        if case.set == "decode" and case.seqlen_q > 1 and not impl.startswith("ours"):
            raise NotImplementedError("several query tokens per sequence: SDPA's causal mask is top-left, ours "
                                      "bottom-right")
        if impl in ("ours-direct", "base-direct"):
            d = Direct(torch, q, k, v, case.causal, g if pass_ != "fwd" else None,
                       self.base_lib if impl == "base-direct" else None)
            return Impl(getattr(d, pass_), keep=d)
        if impl == "ours":
            fwd, ctx = self.ours_fwd(case, q, k, v), None
        elif impl == "flex":
            fwd, ctx = self.flex_fwd(case, q, k, v)
        else:
            fwd, ctx = self.sdpa_fwd({"cudnn": "CUDNN_ATTENTION", "flash": "FLASH_ATTENTION",
                                      "efficient": "EFFICIENT_ATTENTION"}[impl], q, k, v, case.causal)
        ctx = ctx or contextlib.nullcontext
        inputs = (q, k, v)
        if pass_ == "fwd":
            return Impl(fwd, ctx)
        if pass_ == "bwd":
            with ctx():
                o = fwd()
            return Impl(lambda: torch.autograd.grad(o, inputs, g, retain_graph=True), ctx, keep=o)
        return Impl(lambda: torch.autograd.grad(fwd(), inputs, g), ctx)

    def probe(self, impl_obj):
        """First call (plans, compilation, errors), then two timed calls: the time N is chosen from."""
        with impl_obj.ctx():
            r = impl_obj.fn()
            if isinstance(r, int) and r != 0:  # an fa_status from ours-direct or base-direct
                impl_obj.keep.check("fa_fwd/fa_bwd", r)
            self.timer.sync()
            return self.timer.block(impl_obj.fn, 2, 0)

    def note_missing(self, case, pass_, impl, err):
        msg = ("%s: %s" % (type(err).__name__, err)).splitlines()[0][:300]
        self.missing.append({"set": case.set, "shape": case.label, "pass": pass_, "impl": impl, "error": msg})
        print("    %-11s %-6s missing: %s" % (impl, pass_, msg), flush=True)
        if self.device == "cuda":
            self.torch.cuda.empty_cache()

    # ---- one case ----

    def run_case(self, case):
        if case.set == "overhead":
            return self.run_overhead(case)
        grad = case.set not in ("decode", "fp8")  # inference
        q, k, v, g = self.tensors(case, grad)
        rounds = self.args.rounds
        for pass_ in case.passes:
            impls = {}
            probe_ms = {}
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # SDPA explains at length why a backend refuses a shape
                for name in self.args.impls:
                    if not core.impl_runs_on(name, case.set):
                        continue
                    try:
                        impls[name] = self.make_impl(name, case, pass_, q, k, v, g)
                        probe_ms[name] = self.probe(impls[name])
                    except Exception as e:  # noqa: BLE001 - unsupported shapes and OOM alike are "missing"
                        impls.pop(name, None)
                        self.note_missing(case, pass_, name, e)
                if not impls:
                    continue
                n, w = core.choose_calls(min(probe_ms.values()), self.args.block_ms)
                ms = {name: [None] * rounds for name in impls}
                for r in range(rounds):
                    for name in core.rotated(list(impls), r):
                        if name not in impls:
                            continue
                        try:
                            with impls[name].ctx():
                                ms[name][r] = self.timer.block(impls[name].fn, n, w)
                        except Exception as e:  # noqa: BLE001
                            del impls[name]
                            self.note_missing(case, pass_, name, e)
            recs = [core.make_record(case, pass_, name, times, self.elem_bytes, n, w)
                    for name, times in ms.items() if any(t is not None for t in times)]
            self.add_records(recs)
            self.print_pass(case, pass_, recs, n)
            del impls
            self.free()
        del q, k, v, g
        self.free()

    def print_pass(self, case, pass_, recs, n):
        parts = ["%s %s" % (r["impl"], core.fmt_value(r["median"])) for r in recs]
        ratios = {(e["num"], e["den"]): e for e in core.ratio_entries(recs)}
        parts += ["%s/%s %s" % (a, b, core.fmt_ratio(ratios.get((a, b))))
                  for a, b in core.RATIO_PAIRS.get(case.set, ()) if (a, b) in ratios]
        print("  %-8s %-20s %-6s N=%-3d %s: %s" % (case.set, case.label, pass_, n, case.unit, ", ".join(parts)),
              flush=True)

    # ---- the overhead set ----

    def run_overhead(self, case):
        torch, F, fa = self.torch, self.F, self.fa
        b, s, h, d = case.batch, case.seqlen_q, case.heads_q, case.head_dim
        mk = lambda shape, grad: torch.randn(*shape, device=self.device, dtype=self.dtype, requires_grad=grad)
        ours_in = [mk((b, s, h, d), False) for _ in range(3)]
        ours_gr = [mk((b, s, h, d), True) for _ in range(3)]
        sdpa_in = [mk((b, h, s, d), False) for _ in range(3)]  # SDPA's native layout: no transposes timed
        sdpa_gr = [mk((b, h, s, d), True) for _ in range(3)]
        g_ours, g_sdpa = torch.randn(b, s, h, d, device=self.device, dtype=self.dtype), \
            torch.randn(b, h, s, d, device=self.device, dtype=self.dtype)

        def fwdbwd(f, ins, g):
            def run():
                f(*ins).backward(g)
                for t in ins:
                    t.grad = None
            return run

        direct = Direct(torch, *ours_in, False)
        items = {("ours", "fwd"): lambda: fa.flash_attn_func(*ours_in),
                 ("ours", "fwd_grad"): lambda: fa.flash_attn_func(*ours_gr),
                 ("ours", "fwdbwd"): fwdbwd(fa.flash_attn_func, ours_gr, g_ours),
                 ("sdpa", "fwd"): lambda: F.scaled_dot_product_attention(*sdpa_in),
                 ("sdpa", "fwd_grad"): lambda: F.scaled_dot_product_attention(*sdpa_gr),
                 ("sdpa", "fwdbwd"): fwdbwd(F.scaled_dot_product_attention, sdpa_gr, g_sdpa),
                 ("ours-direct", "fwd"): direct.fwd}
        rounds = self.args.rounds
        us = {key: [None] * rounds for key in items}
        keys = list(items)
        for r in range(rounds):
            for key in core.rotated(keys, r):
                if key not in items:
                    continue
                try:
                    us[key][r] = self.timer.wall_us(items[key], self.args.overhead_calls, self.args.overhead_warmup)
                except Exception as e:  # noqa: BLE001
                    del items[key]
                    self.note_missing(case, key[1], key[0], e)
        recs = []
        for impl in ("ours", "sdpa", "ours-direct"):
            got = {p: us[(impl, p)] for p in core.OVERHEAD_PASSES if (impl, p) in us}
            if "fwdbwd" in got and "fwd_grad" in got:
                got["bwd"] = core.derived_difference(got["fwdbwd"], got["fwd_grad"])
            for p, vals in got.items():
                if any(x is not None for x in vals):
                    ms = [None if x is None else x / 1e3 for x in vals]
                    recs.append(core.make_record(case, p, impl, ms, self.elem_bytes, self.args.overhead_calls,
                                                 self.args.overhead_warmup))
        self.add_records(recs)
        for p in ("fwd", "fwd_grad", "fwdbwd", "bwd"):
            self.print_pass(case, p, [r for r in recs if r["pass"] == p], self.args.overhead_calls)
        del items, direct
        self.free()

    # ---- the fp8 set's accuracy table ----

    def run_fp8_accuracy(self):
        """RMSE of O against fp64 attention on the unquantized inputs, FlashAttention-3's outlier distribution."""
        torch, fa = self.torch, self.fa
        cpu = self.device == "cpu"
        b, s, h, d = (1, 256, 2, 64) if cpu else (1, 8192, 2, 128)
        gen = torch.Generator(device="cpu").manual_seed(0)

        def outliers():
            x = torch.randn(b, s, h, d, generator=gen, dtype=torch.float64)
            spikes = torch.rand(b, s, h, d, generator=gen, dtype=torch.float64) < 1e-3
            return (x + spikes * torch.randn(b, s, h, d, generator=gen, dtype=torch.float64) * 10.0).to(self.device)

        q, k, v = outliers(), outliers(), outliers()
        ref = torch.empty_like(q)
        for i in range(h):  # fp64 attention, one head at a time
            sc = (q[:, :, i] @ k[:, :, i].transpose(-1, -2)) / d ** 0.5
            ref[:, :, i] = torch.softmax(sc, dim=-1) @ v[:, :, i]
        f32 = [t.float() for t in (q, k, v)]
        e4m3 = getattr(torch, "float8_e4m3fn", None)

        def per_tensor(x):
            descale = (x.abs().amax() / 448.0).clamp_min(1e-30)
            return (x / descale).to(e4m3), descale.expand(b, h).contiguous()

        def run_e4m3(ins, block):
            (q8, dq), (k8, dk), (v8, dv) = ins
            return fa.flash_attn_func(q8, k8, v8, q_descale=dq, k_descale=dk, v_descale=dv, descale_block=block)

        variants = [
            ("bf16 inputs", lambda: fa.flash_attn_func(*(t.to(torch.bfloat16) for t in f32))),
            ("e4m3, one descale per tensor", lambda: run_e4m3([per_tensor(t) for t in f32], 0)),
            ("e4m3, per (batch, head)", lambda: run_e4m3([fa.quantize_e4m3(t) for t in f32], 0)),
            ("e4m3, per (batch, head) + Hadamard q, k", lambda: run_e4m3(
                [fa.quantize_e4m3(fa.hadamard_rotate(f32[0], 7)), fa.quantize_e4m3(fa.hadamard_rotate(f32[1], 7)),
                 fa.quantize_e4m3(f32[2])], 0)),
            ("e4m3, per 128 rows", lambda: run_e4m3([fa.quantize_e4m3(t, 128) for t in f32], 128)),
            ("e4m3, per 128 rows + Hadamard q, k", lambda: run_e4m3(
                [fa.quantize_e4m3(fa.hadamard_rotate(f32[0], 7), 128),
                 fa.quantize_e4m3(fa.hadamard_rotate(f32[1], 7), 128), fa.quantize_e4m3(f32[2], 128)], 128)),
        ]
        rows = []
        for name, fn in variants:
            try:
                o = fn()
                rows.append({"variant": name, "rmse": float(((o.double() - ref) ** 2).mean().sqrt())})
            except Exception as e:  # noqa: BLE001 - e.g. no e4m3 kernel on this backend: recorded, not fatal
                rows.append({"variant": name, "rmse": None,
                             "error": ("%s: %s" % (type(e).__name__, e)).splitlines()[0][:200]})
        self.fp8_accuracy = {"inputs": "b%d h%d s%d d%d, N(0, 1) + N(0, 100) * Bernoulli(0.001), seed 0" % (b, h, s, d),
                             "rows": rows}
        for line in core.fp8_accuracy_lines(self.fp8_accuracy):
            print(line, flush=True)
        del q, k, v, ref, f32
        self.free()

    # ---- the whole run ----

    def run(self, cases):
        print("\n".join(header_lines({"meta": self.meta})), flush=True)
        self.measure_ceilings("start")
        # Each shape's share of the estimate weighs the progress for the ETA.
        per_case = [sum(core.estimate_seconds([c], self.args.impls, self.args.rounds, self.args.block_ms,
                                              overhead_calls=self.args.overhead_calls
                                              + self.args.overhead_warmup,
                                              preheat_ms=self.args.preheat_ms)[1].values()) for c in cases]
        est_total = sum(per_case) or 1.0
        t0, est_done = time.perf_counter(), 0.0
        for i, case in enumerate(cases):
            self.run_case(case)
            self.write_json()
            est_done += per_case[i]
            spent = time.perf_counter() - t0
            eta = spent / est_done * (est_total - est_done) if est_done else 0.0
            self.log("%d/%d shapes (%s %s), ETA %.0f s" % (i + 1, len(cases), case.set, case.label, eta))
        if "fp8" in self.args.sets:
            self.run_fp8_accuracy()
        self.measure_ceilings("end")
        self.meta["elapsed_s"] = round(time.perf_counter() - self.t_start, 1)
        self.write_json()
        if self.csv_file:
            self.csv_file.close()
        self.log("done")
        print("")
        for line in header_lines({"meta": self.meta, "ceilings": self.ceilings}):
            print(line)
        for line in core.summary_lines(self.records, self.args.impls, self.ceilings):
            print(line)
        for line in core.fp8_accuracy_lines(self.fp8_accuracy):
            print(line)
        sys.stdout.flush()


def main(argv=None):
    args = parse_args(argv)
    if args.summary:
        summary_from_json(args.summary)
        return
    cases = build_cases(args)
    if args.estimate:
        print_estimate(args, cases)
        return
    Runner(args).run(cases)


if __name__ == "__main__":
    main()
