#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""The decode figures of one call in one table, from bench/compare.py --sets decode runs (their --json files).

    bench/decode_report.py base=RUN.json [NAME=RUN.json ...]

`base` is the run of the plain shapes with ours and cuDNN (and, where given, ours-paged and ours-append): its
columns are both rates, ours / cuDNN and ours against the device copy of that run. Every other run adds columns:
  - a run with ours and cuDNN (other heads or head dim): ours / cuDNN in it;
  - ours-paged, ours-append: over ours of the same run where it has one, else over base's ours;
  - ours alone (another query count, the same heads and head dim): over base's ours.
Ratios of one run are medians of the rounds' ratios with their min-max (the rounds of one process pair up, as
compare.py's own table has them); ratios across runs are ratios of medians, marked "~" (two processes).
tools/device.sh decode runs the variants and prints this table.
"""

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import compare_core  # noqa: E402


def load(path):
    with open(path) as f:
        data = json.load(f)
    recs = {}
    for r in data["records"]:
        if r.get("set") == "decode":
            recs[(r["shape"].split()[0], r["impl"])] = r
    copy = (data.get("ceilings") or {}).get("start", {}).get("copy_tbps")
    return {"records": recs, "copy": copy, "meta": data.get("meta", {})}


def paired(a, b):
    """median [min-max] of the rounds' ratios of the rates a / b (rounds of one run: b's time over a's)."""
    med, lo, hi = compare_core.spread(compare_core.round_ratios(a["ms"], b["ms"]))
    return "-" if med is None else "%.2f [%.2f-%.2f]" % (med, lo, hi)


def across(a, b):
    return "~%.2f" % (a["median"] / b["median"]) if a and b and b["median"] else "-"


def columns(name, run, base):
    """(header, {shape: cell}) for one run."""
    recs = run["records"]
    shapes = ordered(recs)
    out = []
    impls = {i for _, i in recs}
    if name == "base":
        out.append(("flashattn TB/s", {s: "%.2f" % recs[(s, "ours")]["median"] for s in shapes if (s, "ours") in recs}))
        out.append(("cuDNN TB/s", {s: "%.2f" % recs[(s, "cudnn")]["median"] for s in shapes if (s, "cudnn") in recs}))
    if "ours" in impls and "cudnn" in impls:
        out.append(("%s / cuDNN" % label(name),
                    {s: paired(recs[(s, "ours")], recs[(s, "cudnn")]) for s in shapes
                     if (s, "ours") in recs and (s, "cudnn") in recs}))
    if name == "base" and run["copy"]:
        out.append(("of copy (%.2f TB/s)" % run["copy"],
                    {s: "%.2f" % (recs[(s, "ours")]["median"] / run["copy"]) for s in shapes if (s, "ours") in recs}))
    for impl in ("ours-paged", "ours-append"):
        if impl not in impls:
            continue
        cells = {}
        for s in shapes:
            if (s, impl) not in recs:
                continue
            if (s, "ours") in recs:
                cells[s] = paired(recs[(s, impl)], recs[(s, "ours")])
            else:
                cells[s] = across(recs[(s, impl)], base["records"].get((s, "ours")))
        out.append(("%s / ours" % impl if name == "base" else "%s %s / ours" % (name, impl), cells))
    if impls == {"ours"} and name != "base":  # another query count over base's (same heads and head dim)
        cells = {}
        for s in shapes:
            mine, theirs = recs[(s, "ours")], base["records"].get((s, "ours"))
            if theirs and all(mine.get(k) == theirs.get(k) for k in ("heads_q", "heads_kv", "head_dim")):
                cells[s] = across(mine, theirs)
        out.append(("%s / base" % name, cells))
    return out


def label(name):
    return "flashattn" if name == "base" else name


def ordered(recs):
    """The shapes of a run's records in their order (compare.py's)."""
    return list(dict.fromkeys(s for s, _ in recs))


def report(runs):
    base = runs["base"]
    cols = []
    for name, run in runs.items():
        cols.extend(c for c in columns(name, run, base) if c[1])  # (a column with no cell is left out)
    shapes = list(dict.fromkeys(s for run in runs.values() for s in ordered(run["records"])))
    head = ["shape"] + [h for h, _ in cols]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for s in shapes:
        lines.append("| " + " | ".join([s] + [c.get(s, "-") for _, c in cols]) + " |")
    m = base["meta"]
    lines.append("")
    lines.append("%s, %s UTC, git %s%s" % (m.get("device_name", "?"), m.get("date_utc", "?"), m.get("git", "?"),
                                           " (dirty)" if m.get("git_dirty") else ""))
    return "\n".join(lines)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("runs", nargs="+", metavar="NAME=RUN.json")
    args = ap.parse_args(argv)
    runs = {}
    for item in args.runs:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            ap.error("'%s' is not NAME=RUN.json" % item)
        runs[name] = load(path)
    if "base" not in runs:
        ap.error("a run named base (ours and cuDNN on the plain shapes) is needed")
    print(report(runs))
    return 0


if __name__ == "__main__":
    sys.exit(main())
