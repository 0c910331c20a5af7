#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Markdown tables for the README and docs/results.md from one bench/compare.py run:

    python3 tools/results_table.py compare.json [--tree HASH]

One table per set of the run (paper, decode, llama, overhead): each implementation's median over the rounds,
and the ratios ours/cuDNN and ours/FA2 as `median [min-max]` of the per-round ratios (peer time over ours:
above 1 we are faster). Cells below 1.0x cuDNN are in bold, so that the losses read as plainly as the wins. A
first line names the card, the date, the tree, the timer and the ceilings the run measured.
"""
import argparse
import json
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "bench"))
import compare_core as core  # noqa: E402

IMPL_NAMES = {"ours": "flashattn", "ours-direct": "flashattn (library call)", "cudnn": "cuDNN", "flash": "FA2 (SDPA)",
              "efficient": "SDPA efficient", "flex": "FlexAttention", "sdpa": "SDPA", "ours-bf16": "flashattn bf16"}


def fmt(x):
    if x is None:
        return "-"
    return "%.0f" % x if x >= 100 else ("%.1f" % x if x >= 10 else "%.2f" % x)


def ratio_cell(e):
    if e is None:
        return "-"
    text = "%.2f [%.2f-%.2f]" % (e["median"], e["min"], e["max"])
    return "**%s**" % text if e["den"] == "cudnn" and e["median"] < 1.0 else text


def header(meta, ceilings, tree):
    opts = meta.get("options", {})
    dirty = " (uncommitted changes)" if meta.get("git_dirty") and not tree else ""
    parts = ["%s (%s SMs, driver %s)" % (meta.get("device_name", "GPU"), meta.get("sm_count", "?"), meta.get("driver", "?")),
             "%s UTC" % meta.get("date_utc", "?"), "tree %s%s" % (tree or meta.get("git", "?"), dirty),
             "PyTorch %s, cuDNN %s" % (meta.get("torch"), meta.get("cudnn"))]
    timer = "timer %s, L2 %s, %s rounds, %s ms blocks" % (opts.get("mode"), opts.get("l2"), opts.get("rounds"),
                                                          opts.get("block_ms"))
    ceil = []
    start, end = ceilings.get("start", {}), ceilings.get("end", {})
    if start.get("gemm_tflops"):
        ceil.append("bf16 GEMM 8192^3 %s / %s TFLOP/s at the start / end" % (fmt(start["gemm_tflops"]),
                                                                           fmt(end.get("gemm_tflops"))))
    if start.get("gemm_e4m3_tflops"):
        ceil.append("e4m3 GEMM 8192^3 %s / %s TFLOP/s" % (fmt(start["gemm_e4m3_tflops"]),
                                                         fmt(end.get("gemm_e4m3_tflops"))))
    if start.get("copy_tbps"):
        ceil.append("device copy %.2f TB/s" % start["copy_tbps"])
    return "Measured by `bench/compare.py` on %s; %s%s." % (", ".join(parts), timer,
                                                          ("; " + ", ".join(ceil)) if ceil else "")


def tables(data, tree=None):
    recs = data["records"]
    out = [header(data.get("meta", {}), data.get("ceilings", {}), tree), ""]
    ratios = {(e["set"], e["shape"], e["pass"], e["num"], e["den"]): e for e in core.ratio_entries(recs)}
    for set_name in core.SET_NAMES:
        srecs = [r for r in recs if r["set"] == set_name]
        if not srecs:
            continue
        impls = [i for i in ("ours", "ours-direct", "ours-bf16", "cudnn", "flash", "sdpa", "efficient", "flex")
                 if any(r["impl"] == i for r in srecs)]
        pairs = [p for p in core.RATIO_PAIRS.get(set_name, ()) if p[1] in impls]
        unit = srecs[0]["unit"]
        out.append("%s (%s)" % (set_name, unit))
        out.append("")
        cols = ["shape", "pass"] + [IMPL_NAMES.get(i, i) for i in impls] + \
               ["vs %s" % IMPL_NAMES.get(d, d) for _, d in pairs]
        out.append("| " + " | ".join(cols) + " |")
        out.append("|" + "---|" * len(cols))
        seen = []
        for r in srecs:
            key = (r["shape"], r["pass"])
            if key not in seen:
                seen.append(key)
        for shape, pass_ in seen:
            by_impl = {r["impl"]: r for r in srecs if r["shape"] == shape and r["pass"] == pass_}
            row = [shape, pass_] + [fmt(by_impl[i]["median"]) if i in by_impl else "-" for i in impls]
            row += [ratio_cell(ratios.get((set_name, shape, pass_, n, d))) for n, d in pairs]
            out.append("| " + " | ".join(row) + " |")
        means = []
        for pass_ in [p for p in core.PASSES if any(q == p for _, q in seen)]:
            for n, d in pairs:
                vals = [ratios[(set_name, s, p, n, d)]["median"] for s, p in seen
                        if p == pass_ and (set_name, s, p, n, d) in ratios]
                if len(vals) > 1:
                    means.append("%s vs %s %.2f" % (pass_, IMPL_NAMES.get(d, d), core.geomean(vals)))
        if means:
            out.append("")
            out.append("Geometric means of the ratios over the set's %d shapes: %s." % (
                len({s for s, _ in seen}), "; ".join(means)))
        e4m3 = data.get("ceilings", {}).get("start", {}).get("gemm_e4m3_tflops")
        if set_name == "fp8" and e4m3:
            cells = ["%s %.2f" % (r["shape"], r["median"] / e4m3) for r in srecs
                     if r["impl"] == "ours" and r["median"] is not None]
            if cells:
                out.append("")
                out.append("flashattn e4m3 / the e4m3 GEMM ceiling at the start (%s TFLOP/s): %s." % (fmt(e4m3),
                                                                                                ", ".join(cells)))
        out.append("")
    acc = data.get("fp8_accuracy")
    if acc:
        out.append("fp8 accuracy (RMSE of O against fp64 attention on the unquantized inputs; %s)" % acc["inputs"])
        out.append("")
        out.append("| inputs | RMSE |")
        out.append("|---|---|")
        for row in acc["rows"]:
            out.append("| %s | %s |" % (row["variant"], "-" if row["rmse"] is None else "%.2e" % row["rmse"]))
        out.append("")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", help="a bench/compare.py --json file")
    ap.add_argument("--tree", help="the commit the run measured, when the run's own git field is stale")
    args = ap.parse_args()
    print(tables(json.load(open(args.json)), args.tree))


if __name__ == "__main__":
    main()
