#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The CPU table of the README from bench/compare.py --device cpu runs: one run per dtype and thread count.

    bench/cpu_report.py RUN.json [RUN.json ...]

Each RUN.json is a compare.py --json file (or a file of several such runs as {name: run}) of the CPU backend against
torch's CPU kernel (--impls ours,flash) on one paper shape, causal and not (tools/device.sh cpu makes them: bf16, fp16
and fp32 at 1 and 16 threads). One row per
dtype, thread count and pass: ours in TFLOP/s and ours/torch as median [min-max] of the rounds, non-causal then
causal.
"""

import json
import sys

DTYPES = {"bf16": "bf16", "fp16": "f16", "fp32": "fp32"}
PASSES = ("fwd", "bwd", "fwdbwd")


def cell(rate, ratio):
    if ratio is None:
        return "-"
    text = "%.2f [%.2f-%.2f]" % (ratio["median"], ratio["min"], ratio["max"])
    return text if rate is None else "%.3g, %s" % (rate, text)


def rows(data):
    """(dtype, threads, pass, non-causal cell, causal cell) of one run."""
    opts = data["meta"]["options"]
    rates = {(r["shape"], r["pass"]): r["median"] for r in data["records"] if r["impl"] == "ours"}
    ratios = {(r["shape"], r["pass"]): r for r in data["ratios"] if r["num"] == "ours" and r["den"] == "flash"}
    shapes = {s for s, _ in ratios}  # one seqlen: a non-causal shape and a causal one
    full = next((s for s in shapes if "causal" not in s), None)
    causal = next((s for s in shapes if "causal" in s), None)
    out = []
    for p in PASSES:
        cells = [cell(rates.get((s, p)), ratios.get((s, p))) for s in (full, causal)]
        if cells != ["-", "-"]:
            out.append((DTYPES.get(opts["dtype"], opts["dtype"]), opts["threads"], p, cells[0], cells[1]))
    return out


def main(argv):
    if not argv:
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    table = []
    for path in argv:
        with open(path) as f:
            data = json.load(f)
        # one run, or several kept in one file as {name: run} (docs/compare-xeon-cpu-*.json)
        for run in [data] if "meta" in data else data.values():
            table += rows(run)
    order = list(DTYPES.values())
    table.sort(key=lambda r: (order.index(r[0]) if r[0] in order else len(order), r[1], PASSES.index(r[2])))
    print("| dtype | threads | pass | non-causal | causal |")
    print("|---|---|---|---|---|")
    for r in table:
        print("| %s | %d | %s | %s | %s |" % r)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
