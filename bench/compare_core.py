# SPDX-License-Identifier: Apache-2.0
"""The parts of bench/compare.py that need neither torch nor a GPU: FLOP and byte counts, the shape sets, the
choice of the number of timed calls, the round-robin order, statistics over rounds, ratio spreads, the
summary table, CSV rows, and the run-time estimate. Kept apart so that `make test` checks them on machines
without torch (bench/test_compare.py).

A record is one (set, shape, pass, impl): `ms` holds one time per round (None where that round has no
figure), `values` the same rounds in the record's unit. Ratios ours/peer are peer time / our time, round by
round, so above 1.0 means ours is faster whatever the unit.
"""

import argparse
import math
import statistics

# Units whose larger values are better; the others ("us") are times.
THROUGHPUT_UNITS = ("TFLOP/s", "TB/s")

# Ratios printed per set: (numerator, denominator) implementations.
RATIO_PAIRS = {
    "paper": (("ours", "cudnn"), ("ours", "flash"), ("ours-direct", "base-direct")),
    "decode": (("ours", "cudnn"), ("ours", "flash"), ("ours-paged", "ours"), ("ours-append", "ours"),
               ("ours-direct", "base-direct")),
    "llama": (("ours", "cudnn"), ("ours", "flash"), ("ours-direct", "base-direct")),
    "overhead": (("ours", "sdpa"),),
    "fp8": (("ours", "ours-bf16"), ("ours", "cudnn")),
}

# Implementations timed on one set only.
SET_ONLY_IMPLS = {"ours-paged": "decode", "ours-append": "decode", "ours-bf16": "fp8"}

# Sets that run only these implementations (the fp8 set: ours on e4m3 inputs, ours on the bf16 inputs they were
# quantized from, and cuDNN where SDPA takes float8 tensors).
SET_IMPLS = {"fp8": ("ours", "ours-bf16", "cudnn")}


def impl_runs_on(impl, set_name):
    return SET_ONLY_IMPLS.get(impl, set_name) == set_name and impl in SET_IMPLS.get(set_name, (impl,))


# A ratio against this peer whose median is below 1.0 gets a trailing "<" in the table.
MARKED_PEERS = ("cudnn",)

SET_NAMES = ("paper", "decode", "llama", "overhead", "fp8")
PASSES = ("fwd", "bwd", "fwdbwd")


# ---- work per call ----

def attention_flops(batch, heads, seqlen_q, seqlen_k, head_dim, causal, pass_):
    """FLOPs by the FlashAttention-2 paper's formula: forward 4 * seqlen_q * seqlen_k * head_dim * heads * batch
    (its 4 s^2 d h b), halved when causal; the backward counts 2.5x the forward, forward + backward 3.5x."""
    fwd = 4.0 * seqlen_q * seqlen_k * head_dim * heads * batch / (2.0 if causal else 1.0)
    return fwd * {"fwd": 1.0, "bwd": 2.5, "fwdbwd": 3.5}[pass_]


def kv_bytes(batch, seqlen_k, heads_kv, head_dim, elem_bytes):
    """Bytes of K and V one decode step has to read: the bound a memory-bound kernel is judged against."""
    return 2 * batch * seqlen_k * heads_kv * head_dim * elem_bytes


# ---- shape sets ----

class Case:
    """One problem: its set, a label for the table, the sizes, the passes to time and the unit of its figures."""

    def __init__(self, set_name, label, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim, causal, passes,
                 unit):
        self.set = set_name
        self.label = label
        self.batch, self.seqlen_q, self.seqlen_k = batch, seqlen_q, seqlen_k
        self.heads_q, self.heads_kv, self.head_dim = heads_q, heads_kv, head_dim
        self.causal = bool(causal)
        self.passes = tuple(passes)
        self.unit = unit

    def sizes(self):
        return {"batch": self.batch, "seqlen_q": self.seqlen_q, "seqlen_k": self.seqlen_k,
                "heads_q": self.heads_q, "heads_kv": self.heads_kv, "head_dim": self.head_dim,
                "causal": self.causal}

    def flops(self, pass_):
        return attention_flops(self.batch, self.heads_q, self.seqlen_q, self.seqlen_k, self.head_dim, self.causal,
                               pass_)

    def value(self, ms, pass_, elem_bytes):
        """The figure reported for a call of `ms` milliseconds, in self.unit."""
        if self.unit == "TFLOP/s":
            return self.flops(pass_) / ms / 1e9
        if self.unit == "TB/s":
            return kv_bytes(self.batch, self.seqlen_k, self.heads_kv, self.head_dim, elem_bytes) / ms / 1e9
        if self.unit == "us":
            return ms * 1e3
        raise ValueError(f"unknown unit {self.unit!r}")

    def __repr__(self):
        return f"Case({self.set} {self.label})"


def paper_cases(head_dims=(64, 128, 256), seqlens=(512, 1024, 2048, 4096, 8192, 16384), causals=(False, True),
                passes=PASSES, tokens=16384, hidden=2048):
    """The FlashAttention-2 paper's sweep: batch * seqlen = tokens, heads * head_dim = hidden."""
    cases = []
    for d in head_dims:
        for c in causals:
            for s in seqlens:
                cases.append(Case("paper", f"d{d} {'causal' if c else 'full'} {s}", max(1, tokens // s), s, s,
                                  max(1, hidden // d), max(1, hidden // d), d, c, passes, "TFLOP/s"))
    return cases


DECODE_SHAPES = ((1, 32768), (1, 131072), (8, 8192), (32, 4096), (64, 16384))


def decode_cases(shapes=DECODE_SHAPES, heads_q=32, heads_kv=8, head_dim=128, seqlen_q=1):
    """seqlen_q query tokens (1: a decoding step; more: a speculative step, under the bottom-right causal mask)
    against a KV cache of length L per sequence, forward only, judged by K/V bytes."""
    tag = "" if seqlen_q == 1 else f" q{seqlen_q}"
    return [Case("decode", f"{b}x{L}{tag}", b, seqlen_q, L, heads_q, heads_kv, head_dim, seqlen_q > 1, ("fwd",),
                 "TB/s") for b, L in shapes]


LLAMA_SHAPES = ((1, 8192), (4, 4096), (1, 32768))


def llama_cases(shapes=LLAMA_SHAPES, passes=PASSES, heads_q=32, heads_kv=8, head_dim=128):
    """Llama-3-8B's attention: 32 query heads, 8 KV heads, head_dim 128, causal."""
    return [Case("llama", f"b{b} s{s}", b, s, s, heads_q, heads_kv, head_dim, True, passes, "TFLOP/s")
            for b, s in shapes]


FP8_HEAD_DIMS = (64, 128, 256)
FP8_SEQLENS = (4096, 8192, 16384)


def fp8_cases(head_dims=FP8_HEAD_DIMS, seqlens=FP8_SEQLENS, causals=(False,), tokens=16384, hidden=2048):
    """The FP8 forward on the paper's shapes from 4k tokens: e4m3 q, k, v with one descale per (batch, head),
    against our bf16 forward on the inputs they were quantized from; TFLOP/s by the paper's formula."""
    return [Case("fp8", c.label, c.batch, c.seqlen_q, c.seqlen_k, c.heads_q, c.heads_kv, c.head_dim, c.causal,
                 ("fwd",), "TFLOP/s") for c in paper_cases(head_dims, seqlens, causals, ("fwd",), tokens, hidden)]


# The overhead set's problem (batch, seqlen, heads, head_dim): so small that host time dominates.
OVERHEAD_SHAPE = (1, 128, 1, 64)
OVERHEAD_PASSES = ("fwd", "fwd_grad", "fwdbwd")  # timed; "bwd" is derived: fwdbwd - fwd_grad, per round


def overhead_case(shape=OVERHEAD_SHAPE):
    b, s, h, d = shape
    return Case("overhead", f"{b}x{s}x{h}x{d}", b, s, s, h, h, d, False, OVERHEAD_PASSES, "us")


def quick_subset(cases, keep):
    """A few cases spread over the list (first, last, and evenly between), for smoke runs."""
    if len(cases) <= keep:
        return list(cases)
    step = (len(cases) - 1) / (keep - 1) if keep > 1 else 0
    idx = sorted({round(i * step) for i in range(keep)})
    return [cases[i] for i in idx]


# ---- timing plan ----

def choose_calls(fastest_ms, block_ms, lo=3, hi=500):
    """(timed calls N, warm-up calls) for a shape: N such that the fastest implementation's block lasts about
    block_ms, clamped to [lo, hi]; as many warm-up calls as timed ones. The same for every implementation of the
    shape. The warm-up is that long because the GPU's clock follows its power draw within tens of
    milliseconds: measured on an H200 (d128 16k forward), the first ~35 ms of a kernel that follows idle time or
    a lighter kernel run ~10% faster than its sustained rate, so a short warm-up favours whichever
    implementation comes after a light one."""
    if not fastest_ms or fastest_ms <= 0 or math.isnan(fastest_ms):
        n = hi
    else:
        n = int(round(block_ms / fastest_ms))
    n = max(lo, min(hi, n))
    return n, n


def rotated(items, round_index):
    """items in the order of round round_index: rotated by one place each round, so that no implementation is
    always first (after the probe or the previous pass) or always last."""
    items = list(items)
    if not items:
        return items
    k = round_index % len(items)
    return items[k:] + items[:k]


# ---- statistics ----

def spread(values):
    """(median, min, max) of the values that are not None; (None, None, None) when there are none."""
    v = [x for x in values if x is not None]
    if not v:
        return None, None, None
    return statistics.median(v), min(v), max(v)


def round_ratios(ours_ms, peer_ms):
    """Per-round ratios peer time / our time, for the rounds where both have a time."""
    return [p / o for o, p in zip(ours_ms, peer_ms) if o is not None and p is not None and o > 0]


def derived_difference(total, part):
    """Round by round total - part (the overhead set's backward: (fwd + bwd) - fwd with grad)."""
    return [t - p if t is not None and p is not None else None for t, p in zip(total, part)]


def int_list(text):
    """argparse type: "1,2,3" -> [1, 2, 3]."""
    return [int(x) for x in text.split(",") if x]


def name_list(allowed):
    """argparse type: comma-separated names, each one of `allowed`."""
    def parse(text):
        names = [x for x in text.split(",") if x]
        bad = [x for x in names if x not in allowed]
        if bad:
            raise argparse.ArgumentTypeError("unknown %s (choose from %s)" % (",".join(bad), ",".join(allowed)))
        return names
    return parse


def geomean(values):
    v = [x for x in values if x is not None and x > 0]
    if not v:
        return None
    return math.exp(sum(math.log(x) for x in v) / len(v))


def make_record(case, pass_, impl, ms_rounds, elem_bytes, n=None, warmup=None):
    """The record of one (case, pass, impl) from its per-round times in milliseconds."""
    values = [None if m is None else case.value(m, pass_, elem_bytes) for m in ms_rounds]
    med, lo, hi = spread(values)
    rec = {"set": case.set, "shape": case.label, "pass": pass_, "impl": impl, "unit": case.unit,
           "values": values, "ms": list(ms_rounds), "median": med, "min": lo, "max": hi,
           "calls": n, "warmup": warmup}
    rec.update(case.sizes())
    return rec


def ratio_entries(records):
    """For every (set, shape, pass) and every ratio pair of its set with both records present: the per-round
    ratios and their (median, min, max)."""
    by_key = {}
    for r in records:
        by_key.setdefault((r["set"], r["shape"], r["pass"]), {})[r["impl"]] = r
    out = []
    for (set_name, shape, pass_), impls in by_key.items():
        for num, den in RATIO_PAIRS.get(set_name, ()):
            if num in impls and den in impls:
                rounds = round_ratios(impls[num]["ms"], impls[den]["ms"])
                med, lo, hi = spread(rounds)
                if med is not None:
                    out.append({"set": set_name, "shape": shape, "pass": pass_, "num": num, "den": den,
                                "rounds": rounds, "median": med, "min": lo, "max": hi})
    return out


# ---- formatting ----

def fmt_value(x):
    if x is None:
        return "-"
    if abs(x) >= 100:
        return "%.0f" % x
    if abs(x) >= 10:
        return "%.1f" % x
    return "%.3g" % x


def fmt_ratio(entry):
    """'median [min-max]', with a trailing '<' when the median is below 1.0 against a marked peer."""
    if entry is None:
        return "-"
    text = "%.2f [%.2f-%.2f]" % (entry["median"], entry["min"], entry["max"])
    if entry["den"] in MARKED_PEERS and entry["median"] < 1.0:
        text += "<"
    return text


def summary_lines(records, impls=None, ceilings=None):
    """The summary table: per set, one row per (shape, pass) with each implementation's median and the ratios
    of the set's pairs as median [min-max]; then per set and pass the geometric means of the ratio medians.
    The decode set's header quotes the copy bandwidth of `ceilings` (compare.py's), its memory roof."""
    ratios = ratio_entries(records)
    ratio_at = {(e["set"], e["shape"], e["pass"], e["num"], e["den"]): e for e in ratios}
    lines = []
    for set_name in [s for s in SET_NAMES if any(r["set"] == s for r in records)] + \
            sorted({r["set"] for r in records} - set(SET_NAMES)):
        recs = [r for r in records if r["set"] == set_name]
        present = []
        for r in recs:
            if r["impl"] not in present:
                present.append(r["impl"])
        cols = [i for i in (impls or present) if i in present] + [i for i in present if impls and i not in impls]
        pairs = [(n, d) for n, d in RATIO_PAIRS.get(set_name, ()) if n in present and d in present]
        units = sorted({r["unit"] for r in recs})
        lines.append("")
        marked = any(d in MARKED_PEERS for _, d in pairs)
        lines.append(f"== {set_name} ({', '.join(units)}; ratios = peer time / our time, median [min-max] of the "
                     "rounds" + ("; '<' = below 1.0x cuDNN)" if marked else ")"))
        copy = ((ceilings or {}).get("start") or {}).get("copy_tbps")
        if set_name == "decode" and copy:
            lines.append("   (TB/s of K and V read; the device-to-device copy of this run: %s TB/s read + write)"
                         % fmt_value(copy))
        e4m3 = ((ceilings or {}).get("start") or {}).get("gemm_e4m3_tflops")
        if set_name == "fp8" and e4m3:
            lines.append("   (ours: e4m3 q, k, v, bf16 o; the e4m3 GEMM 8192^3 of this run: %s TFLOP/s; ours/ceiling per "
                         "shape after the table)" % fmt_value(e4m3))
        shape_w = max([len("shape")] + [len(r["shape"]) for r in recs])
        head = "%-*s %-8s" % (shape_w, "shape", "pass") + "".join(" %11s" % c[:11] for c in cols)
        head += "".join(" %-19s" % f"{n}/{d}" for n, d in pairs)
        lines.append(head)
        rows = []
        for r in recs:
            key = (r["shape"], r["pass"])
            if key not in rows:
                rows.append(key)
        cell = {(r["shape"], r["pass"], r["impl"]): r for r in recs}
        for shape, pass_ in rows:
            line = "%-*s %-8s" % (shape_w, shape, pass_)
            for c in cols:
                rec = cell.get((shape, pass_, c))
                line += " %11s" % fmt_value(rec["median"] if rec else None)
            for n, d in pairs:
                line += " %-19s" % fmt_ratio(ratio_at.get((set_name, shape, pass_, n, d)))
            lines.append(line.rstrip())
        for pass_ in [p for p in dict.fromkeys(pr for _, pr in rows)]:
            parts = []
            for n, d in pairs:
                meds = [e["median"] for e in ratios
                        if e["set"] == set_name and e["pass"] == pass_ and e["num"] == n and e["den"] == d]
                g = geomean(meds)
                if g is not None:
                    parts.append("%s/%s %.3f (%d shapes)" % (n, d, g, len(meds)))
            if parts:
                lines.append("geomean %s %s: %s" % (set_name, pass_, "; ".join(parts)))
        if set_name == "fp8" and e4m3:
            parts = ["%s %.2f" % (r["shape"], r["median"] / e4m3) for r in recs
                     if r["impl"] == "ours" and r["median"] is not None]
            if parts:
                lines.append("ours / e4m3 GEMM ceiling: " + ", ".join(parts))
    return lines


def fp8_accuracy_lines(acc):
    """The FP8 accuracy table of compare.py's fp8 set: RMSE of O against fp64 attention per input variant."""
    if not acc:
        return []
    lines = ["", "== fp8 accuracy (RMSE of O against fp64 attention on the unquantized inputs; %s)" % acc["inputs"]]
    for row in acc["rows"]:
        lines.append("  %-34s %s" % (row["variant"], "-" if row["rmse"] is None else "%.2e" % row["rmse"])
                     + ("   (%s)" % row["error"] if row.get("error") else ""))
    return lines


CSV_FIELDS = ("set", "shape", "pass", "impl", "unit", "median", "min", "max", "ms_median", "rounds", "calls",
              "warmup", "batch", "seqlen_q", "seqlen_k", "heads_q", "heads_kv", "head_dim", "causal")


def csv_row(rec):
    """One CSV row (a dict over CSV_FIELDS) of a record: the median and spread in its unit, the median time."""
    ms_med, _, _ = spread(rec["ms"])
    row = {k: rec.get(k) for k in CSV_FIELDS}
    for k in ("median", "min", "max"):
        row[k] = "" if rec[k] is None else "%.6g" % rec[k]
    row["ms_median"] = "" if ms_med is None else "%.6g" % ms_med
    row["rounds"] = sum(1 for m in rec["ms"] if m is not None)
    row["causal"] = int(bool(rec.get("causal")))
    for k in ("calls", "warmup"):
        if row[k] is None:
            row[k] = ""
    return row


# ---- run-time estimate ----

# What the estimate assumes on an H100 (conservative: slower than measured, so the estimate errs long):
# the fastest implementation's rate per pass, how much slower the slowest peer is, the cost of a probe and a
# shape's setup, and the host time per call of the overhead set's variants.
H100_MODEL = {
    "tflops": {"fwd": 300.0, "bwd": 200.0, "fwdbwd": 220.0},
    "decode_tbps": 2.0,
    "slowdown": {"ours": 1.0, "ours-direct": 1.0, "cudnn": 1.0, "flash": 2.0, "efficient": 3.0, "flex": 2.0,
                 "ours-paged": 1.2, "ours-append": 1.1, "ours-bf16": 1.0, "base-direct": 1.0},
    "probe_s": {"cudnn": 0.3, "flex": 20.0, "other": 0.05},  # first call on a shape: plans, compilation
    "block_overhead_ms": 0.5,  # L2 flush, events, synchronisation per timed block
    "setup_s": 0.3,          # tensor allocation, random fill and release per shape
    "overhead_us": {"ours": (40, 60, 200), "sdpa": (25, 45, 160), "ours-direct": (12, 0, 0)},
    "fixed_s": 20.0,         # import, CUDA context, cuBLAS/cuDNN handles, the ceilings
}


def estimate_seconds(cases, impls, rounds, block_ms, model=H100_MODEL, overhead_calls=2200,
                     overhead_rounds=None, preheat_ms=20.0):
    """Seconds a run of these cases should take: for each (case, pass), rounds x implementations x
    (warm-up + N) calls at the model's rates, plus probes, per-block overhead and setup. Returns
    (total seconds, {set: seconds})."""
    per_set = {}
    for case in cases:
        t = model["setup_s"]
        if case.set == "overhead":
            for impl in ("ours", "sdpa", "ours-direct"):
                t += (overhead_rounds or rounds) * overhead_calls * sum(model["overhead_us"][impl]) * 1e-6
        else:
            for pass_ in case.passes:
                if case.unit == "TB/s":
                    fast_ms = kv_bytes(case.batch, case.seqlen_k, case.heads_kv, case.head_dim, 2) / \
                        (model["decode_tbps"] * 1e9)
                else:
                    fast_ms = case.flops(pass_) / (model["tflops"][pass_] * 1e9)
                n, w = choose_calls(fast_ms, block_ms)
                for impl in (i for i in impls if impl_runs_on(i, case.set)):
                    slow = model["slowdown"].get(impl, 2.0)
                    probe = model["probe_s"].get(impl, model["probe_s"]["other"])
                    t += probe + 3 * fast_ms * slow * 1e-3
                    t += rounds * ((n + w) * fast_ms * slow + model["block_overhead_ms"] + preheat_ms) * 1e-3
        per_set[case.set] = per_set.get(case.set, 0.0) + t
    return model["fixed_s"] + sum(per_set.values()), per_set
