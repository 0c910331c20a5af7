#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Two builds' compare.py runs side by side, for a change whose peer ratios are measured in separate processes.

    bench/ab_report.py this-1=RUN.json base-1=RUN.json this-2=RUN.json base-2=RUN.json ...

Each RUN.json is a bench/compare.py --json file of one build (the library chosen by FLASHATTN_LIBRARY), the runs
alternated between the builds in one call. One row per shape and ratio of the runs (e.g. ours / cuDNN): the
ratio's median [min-max] over the rounds of each run, then the numerator's median rate. The builds' ratios to the
same peer are what compare: a peer's own rate moves between processes, the ratio to it in one process less.
tools/device.sh ab-decode runs the builds and prints this table.
"""

import json
import sys


def load(path):
    with open(path) as f:
        data = json.load(f)
    rates = {(r["shape"], r["pass"], r["impl"]): r["median"] for r in data["records"]}
    ratios = {}
    for r in data["ratios"]:
        key = (r["shape"], r["pass"], r["num"], r["den"])
        ratios[key] = (r["median"], r["min"], r["max"], rates.get((r["shape"], r["pass"], r["num"])))
    return ratios


def cell(v):
    if v is None:
        return "-"
    text = "%.3f [%.2f-%.2f]" % v[:3]
    return text if v[3] is None else "%s (%.3g)" % (text, v[3])


def main(argv):
    if not argv or any("=" not in a for a in argv):
        print(__doc__.strip().splitlines()[2].strip(), file=sys.stderr)
        return 2
    runs = [(a.split("=", 1)[0], load(a.split("=", 1)[1])) for a in argv]
    keys = []
    for _, ratios in runs:
        keys += [k for k in ratios if k not in keys]
    print("| shape | pass | ratio | " + " | ".join(name for name, _ in runs) + " |")
    print("|---|---|---|" + "---|" * len(runs))
    for shape, pas, num, den in keys:
        cells = [cell(ratios.get((shape, pas, num, den))) for _, ratios in runs]
        print("| %s | %s | %s / %s | %s |" % (shape, pas, num, den, " | ".join(cells)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
