#!/usr/bin/env python3
"""Markdown tables for the README's Results section from one device run's files:

    python3 tools/results_table.py DIR      # DIR holds bench.csv and peers.json (tools/device.sh bench)

One row per (pass, head_dim, causal, seqlen) of the paper's sweep: ours (the cuda backend with its default
kernel choice), PyTorch SDPA's FlashAttention-2 and cuDNN backends, the naive baseline, and the ratios of ours
to the two peers. If DIR also holds fa2.csv (the same sweep under FLASHATTN_KERNEL=fa2), a column gives the
FA2 kernels' figures and their ratio to PyTorch's FA2.
"""
import csv
import json
import os
import sys


def read_bench(path, label=None):
    rows = {}
    for r in csv.DictReader(open(path)):
        if r["status"].strip() != "FA_OK":
            continue
        key = (r["pass"], int(r["head_dim"]), r["causal"] == "1", int(r["seqlen_q"]))
        rows.setdefault(key, {})[label or r["backend"]] = float(r["tflops"])
    return rows


def main(folder):
    ours = read_bench(os.path.join(folder, "bench.csv"))
    fa2_path = os.path.join(folder, "fa2.csv")
    fa2 = read_bench(fa2_path, "fa2") if os.path.exists(fa2_path) else {}
    peers = {}
    for r in json.load(open(os.path.join(folder, "peers.json"))):
        key = (r["pass"], r["head_dim"], bool(r["causal"]), r["seqlen"])
        peers.setdefault(key, {})[r["impl"]] = r["tflops"]
    extra = " flashattn FA2 kernels | FA2 kernels vs FA2 |" if fa2 else ""
    print("| pass | head_dim | causal | seqlen | flashattn | torch flash (FA2) | cuDNN | naive | vs FA2 | vs cuDNN |"
          + extra)
    print("|---" * (12 if fa2 else 10) + "|")
    for key in sorted(ours, key=lambda k: (k[0] != "fwd", k[1], k[2], k[3])):
        o, p = ours[key], peers.get(key, {})
        cuda, fl, cu = o.get("cuda"), p.get("torch-flash"), p.get("torch-cudnn")
        cell = lambda x: "%.0f" % x if x else "-"
        ratio = lambda a, b: "%.2f" % (a / b) if a and b else "-"
        line = "| %s | %d | %s | %d | %s | %s | %s | %s | %s | %s |" % (
            key[0], key[1], "yes" if key[2] else "no", key[3], cell(cuda), cell(fl), cell(cu),
            cell(o.get("naive")), ratio(cuda, fl), ratio(cuda, cu))
        if fa2:
            f = fa2.get(key, {}).get("fa2")
            line += " %s | %s |" % (cell(f), ratio(f, fl))
        print(line)


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else ".")
