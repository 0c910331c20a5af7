#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Register pressure of one kernel, from nvdisasm's life ranges (no GPU needed).

    nvcc -O3 -std=c++17 -Iinclude -Isrc -gencode=arch=compute_90a,code=sm_90a -cubin -o /tmp/k.cubin \\
        src/cuda/fa3_bwd_hdim128.cu
    nvdisasm -lrm narrow /tmp/k.cubin > /tmp/k.lr
    python3 dev/hopper/live_regs.py /tmp/k.lr fa3_bwd_kernelILi128ELi64E13__nv_bfloat16Lb0ELb0ELb0E [ADDR ...]

Prints the kernel's instruction count, its peak of live registers and where it occurs, and for the peak (or each
ADDR, hex) the live registers grouped by the instruction that last defined them: which values a schedule holds at
once. nvdisasm comes with the CUDA toolkit (or Triton's wheel, triton/backends/nvidia/bin). In `-lrm narrow` output
the column of register Rn reads '^' where an instruction defines it, 'x' where it reads and defines it, 'v' at its
last read and ':' while it is live.
"""
import re
import sys

LINE = re.compile(r"\s+/\*([0-9a-f]{4,6})\*/\s+(.*?);\s*//\s*\|\s*(\d+)\s(.*?)\|")


def kernel_rows(path, name):
    lines = open(path).read().split("\n")
    starts = [i for i, line in enumerate(lines) if line.startswith(".text.") and name in line]
    if not starts:
        sys.exit("live_regs: no function matching %r in %s" % (name, path))
    rows = []
    for line in lines[starts[0] + 1:]:
        if line.startswith("//----"):
            break
        m = LINE.match(line)
        if m:
            rows.append((int(m.group(1), 16), m.group(2).strip(), int(m.group(3)), m.group(4)))
    return rows


def last_def(rows, idx, reg):
    for j in range(idx - 1, -1, -1):
        cols = rows[j][3]
        if reg < len(cols) and cols[reg] in "^x":
            return rows[j]
    return None


def show(rows, idx):
    addr, text, count, cols = rows[idx]
    print("%#06x %s: %d live" % (addr, text[:70], count))
    groups = {}
    for reg in (i for i, ch in enumerate(cols) if ch != " "):
        d = last_def(rows, idx, reg)
        key = (d[0], d[1][:64]) if d else (-1, "(before the function body)")
        groups.setdefault(key, []).append(reg)
    for (where, what), regs in sorted(groups.items(), key=lambda kv: kv[1][0]):
        name = "R%d..R%d (%d)" % (regs[0], regs[-1], len(regs)) if len(regs) > 2 else ",".join("R%d" % r for r in regs)
        print("  %-20s %s %s" % (name, "%#06x" % where if where >= 0 else "      ", what))


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    rows = kernel_rows(sys.argv[1], sys.argv[2])
    peak = max(r[2] for r in rows)
    at = [i for i, r in enumerate(rows) if r[2] == peak]
    where = ", ".join("%#06x" % rows[i][0] for i in at[:4])
    print("%d instructions, peak %d live registers at %s" % (len(rows), peak, where))
    wanted = [int(a, 16) for a in sys.argv[3:]] or [rows[at[0]][0]]
    for a in wanted:
        idx = [i for i, r in enumerate(rows) if r[0] == a]
        if not idx:
            sys.exit("live_regs: no instruction at %#x" % a)
        show(rows, idx[0])


if __name__ == "__main__":
    main()
