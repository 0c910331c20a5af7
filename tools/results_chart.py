#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""An SVG chart for the README from one bench/compare.py run:

    python3 tools/results_chart.py compare.json -o chart.svg [--tree HASH] [--peer cudnn] [--set paper|decode]

For the paper set: the ratio ours/peer (peer time over ours: above 1 we are faster) of every shape, one panel per
pass (forward, backward, forward + backward). A bar runs from 1.0 to the median of the per-round ratios, its
whisker spans their min-max; shapes are grouped by head dim and mask, sequence length along each group. For the
decode set: the K/V bandwidth (TB/s) of ours and the peer side by side per cache shape, whiskers min-max, the
ratio above each pair and the device copy bandwidth of the same run as a line. The ratios, the meta line under
the chart and the implementation names come from tools/results_table.py, so the chart and docs/results.md's
tables say the same thing. Plain SVG text, no plotting library.
"""
import argparse
import json
import math
import os
import sys
import textwrap
from xml.sax.saxutils import escape

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import results_table  # noqa: E402

core = results_table.core

PASS_TITLES = {"fwd": "forward", "bwd": "backward", "fwdbwd": "forward + backward"}

WIDTH = 900
LEFT, RIGHT = 64, 12           # room for the y tick labels and the rotated y label
PANEL_HEIGHT = 160             # the plot area of one pass
PANEL_GAP = 44                 # seqlen labels under a panel and the next panel's title
GROUP_GAP = 10                 # between head dim / mask groups
AHEAD, BEHIND = "#2f6fad", "#c8553d"
PEER_FILL = "#9a9a9a"          # the peer's bars in the decode chart
DECODE_HEIGHT = 220            # the plot area of the decode chart
FONT = "DejaVu Sans, Helvetica, Arial, sans-serif"


def seqlen_label(n):
    return "%dk" % (n // 1024) if n >= 1024 and n % 1024 == 0 else str(n)


def group_label(head_dim, causal):
    return "d%d, %s" % (head_dim, "causal" if causal else "non-causal")


def chart_data(data, set_name, peer):
    """The passes, the shape groups and the ratio entries of `set_name` against `peer`, in the run's order.
    Raises ValueError naming what is missing when the run has no such ratio."""
    recs = [r for r in data["records"] if r["set"] == set_name]
    entries = {(e["shape"], e["pass"]): e for e in core.ratio_entries(recs) if e["num"] == "ours" and e["den"] == peer}
    if not entries:
        raise ValueError("no ours/%s ratio in set %r of this run" % (peer, set_name))
    groups, sizes = [], {}
    for r in recs:
        if r["shape"] in sizes:
            continue
        sizes[r["shape"]] = r
        key = (r["head_dim"], bool(r["causal"]))
        if not groups or groups[-1][0] != key:
            groups.append((key, []))
        groups[-1][1].append(r["shape"])
    shapes = {s for s, _ in entries}
    groups = [(key, [s for s in members if s in shapes]) for key, members in groups]
    groups = [g for g in groups if g[1]]
    passes = [p for p in core.PASSES if any(q == p for _, q in entries)]
    return passes, groups, sizes, entries


def y_range(entries):
    """The y axis of every panel: tenths around the lowest and highest ratio and 1.0, widened to whole ticks."""
    lo = min(min(e["min"] for e in entries.values()), 1.0)
    hi = max(max(e["max"] for e in entries.values()), 1.0)
    lo, hi = math.floor(lo * 10 - 1e-9) / 10, math.ceil(hi * 10 + 1e-9) / 10
    step = tick_step(lo, hi)
    return math.floor(lo / step + 1e-9) * step, math.ceil(hi / step - 1e-9) * step


def tick_step(lo, hi):
    return 0.1 if hi - lo <= 1.0 else (0.2 if hi - lo <= 2.0 else 0.5)


def text(x, y, s, size=11, anchor="start", extra=""):
    return '<text x="%.1f" y="%.1f" font-size="%g" text-anchor="%s"%s>%s</text>' % (x, y, size, anchor, extra,
                                                                                   escape(s))


def svg(data, tree=None, set_name="paper", peer="cudnn"):
    passes, groups, sizes, entries = chart_data(data, set_name, peer)
    meta = data.get("meta", {})
    peer_name = results_table.IMPL_NAMES.get(peer, peer)
    y_lo, y_hi = y_range(entries)

    n_slots = sum(len(m) for _, m in groups)
    plot_w = WIDTH - LEFT - RIGHT
    slot_w = (plot_w - GROUP_GAP * (len(groups) - 1)) / n_slots
    bar_w = slot_w * 0.62
    slot_x = {}
    x = LEFT
    group_spans = []
    for key, members in groups:
        start = x
        for s in members:
            slot_x[s] = x + slot_w / 2
            x += slot_w
        group_spans.append((key, start, x))
        x += GROUP_GAP

    footer = textwrap.wrap(results_table.header(meta, data.get("ceilings", {}), tree).replace("`", ""), 150)
    top = 84
    height = top + len(passes) * (PANEL_HEIGHT + PANEL_GAP) + 8 + 14 * len(footer) + 6

    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="%s">'
           % (WIDTH, height, WIDTH, height, FONT),
           '<rect width="100%" height="100%" fill="white"/>']
    dirty = " (uncommitted changes)" if meta.get("git_dirty") and not tree else ""
    title = "flashattn / %s, FlashAttention-2 paper shapes, %s, %s" % (
        peer_name, meta.get("options", {}).get("dtype", "?"), meta.get("device_name", "GPU"))
    out.append(text(WIDTH / 2, 20, title, 15, "middle", ' font-weight="bold"'))
    out.append(text(WIDTH / 2, 38, "%s UTC, tree %s%s; bar: median of %s rounds, whisker: min-max; above 1.0 we are "
                    "faster" % (meta.get("date_utc", "?"), tree or meta.get("git", "?"), dirty,
                                meta.get("options", {}).get("rounds", "?")), 11, "middle"))
    for key, x0, x1 in group_spans:
        out.append(text((x0 + x1) / 2, top - 22, group_label(*key), 11, "middle", ' font-weight="bold"'))

    for i, pass_ in enumerate(passes):
        p_top = top + i * (PANEL_HEIGHT + PANEL_GAP)
        p_bot = p_top + PANEL_HEIGHT

        def y_of(v):
            return p_bot - (v - y_lo) / (y_hi - y_lo) * PANEL_HEIGHT

        out.append('<g class="panel" id="panel-%s">' % pass_)
        for gi, (_, x0, x1) in enumerate(group_spans):
            if gi % 2 == 0:
                out.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="#f3f3f3"/>' % (
                    x0, p_top, x1 - x0, PANEL_HEIGHT))
        tick = tick_step(y_lo, y_hi)
        for k in range(int(round((y_hi - y_lo) / tick)) + 1):
            v = y_lo + k * tick
            y = y_of(v)
            out.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#dddddd"/>' % (LEFT, y, WIDTH - RIGHT, y))
            out.append(text(LEFT - 6, y + 4, "%.1f" % (v + 0.0), 10, "end"))
        meds = [entries[(s, pass_)]["median"] for _, m in groups for s in m if (s, pass_) in entries]
        label = "%s: geomean %.2f, %d of %d shapes below 1.0" % (
            PASS_TITLES.get(pass_, pass_), core.geomean(meds), sum(v < 1.0 for v in meds), len(meds))
        out.append(text(LEFT + 4, p_top - 6, label, 12, "start", ' font-weight="bold"'))
        out.append(text(16, (p_top + p_bot) / 2, "ours / %s" % peer_name, 11, "middle",
                        ' transform="rotate(-90 16 %.1f)"' % ((p_top + p_bot) / 2)))
        for _, members in groups:
            for s in members:
                e = entries.get((s, pass_))
                cx = slot_x[s]
                out.append(text(cx, p_bot + 13, seqlen_label(sizes[s]["seqlen_k"]), 10, "middle"))
                if e is None:
                    continue
                y0, y1 = y_of(1.0), y_of(e["median"])
                tip = "%s %s: %.2f [%.2f-%.2f]" % (s, pass_, e["median"], e["min"], e["max"])
                out.append('<rect class="bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s'
                           '</title></rect>' % (cx - bar_w / 2, min(y0, y1), bar_w, max(abs(y1 - y0), 0.5),
                                                AHEAD if e["median"] >= 1.0 else BEHIND, escape(tip)))
                ylo, yhi = y_of(e["min"]), y_of(e["max"])
                out.append('<path class="whisker" d="M%.1f %.1fV%.1fM%.1f %.1fh%.1fM%.1f %.1fh%.1f" stroke="#222222" '
                           'fill="none"/>' % (cx, ylo, yhi, cx - 3, ylo, 6, cx - 3, yhi, 6))
        out.append('<line class="parity" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black" stroke-width="1.2"/>'
                   % (LEFT, y_of(1.0), WIDTH - RIGHT, y_of(1.0)))
        out.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#888888"/>' % (
            LEFT, p_top, plot_w, PANEL_HEIGHT))
        out.append("</g>")

    y = top + len(passes) * (PANEL_HEIGHT + PANEL_GAP) - PANEL_GAP + 30
    out.append(text(LEFT + plot_w / 2, y, "sequence length (tokens), grouped by head dim and mask", 12, "middle"))
    for k, line in enumerate(footer):
        out.append(text(LEFT, y + 20 + 14 * k, line, 10, "start", ' fill="#555555"'))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def decode_svg(data, tree=None, peer="cudnn"):
    """The decode set: ours and the peer's TB/s per cache shape, the run's device copy bandwidth as a line."""
    recs = [r for r in data["records"] if r["set"] == "decode" and r["pass"] == "fwd"]
    by = {(r["shape"], r["impl"]): r for r in recs}
    shapes = [s for s in dict.fromkeys(r["shape"] for r in recs) if (s, "ours") in by and (s, peer) in by]
    if not shapes:
        raise ValueError("no decode shape with both ours and %s in this run" % peer)
    ratios = {e["shape"]: e for e in core.ratio_entries(recs) if e["num"] == "ours" and e["den"] == peer}
    meta = data.get("meta", {})
    copy_tbps = data.get("ceilings", {}).get("start", {}).get("copy_tbps")
    peer_name = results_table.IMPL_NAMES.get(peer, peer)
    top_v = max([by[(s, i)]["max"] for s in shapes for i in ("ours", peer)] + [copy_tbps or 0.0])
    step = 0.5 if top_v <= 5 else 1.0
    y_hi = math.ceil(top_v * 1.12 / step) * step

    plot_w = WIDTH - LEFT - RIGHT
    slot_w = plot_w / len(shapes)
    bar_w = slot_w * 0.3
    footer = textwrap.wrap(results_table.header(meta, data.get("ceilings", {}), tree).replace("`", ""), 150)
    top = 70
    bot = top + DECODE_HEIGHT
    height = bot + 50 + 14 * len(footer) + 6

    def y_of(v):
        return bot - v / y_hi * DECODE_HEIGHT

    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" viewBox="0 0 %d %d" font-family="%s">'
           % (WIDTH, height, WIDTH, height, FONT),
           '<rect width="100%" height="100%" fill="white"/>']
    r0 = recs[0]
    dirty = " (uncommitted changes)" if meta.get("git_dirty") and not tree else ""
    title = "decoding: one query token, %d / %d heads, d%d, %s, %s" % (
        r0["heads_q"], r0["heads_kv"], r0["head_dim"], meta.get("options", {}).get("dtype", "?"),
        meta.get("device_name", "GPU"))
    out.append(text(WIDTH / 2, 20, title, 15, "middle", ' font-weight="bold"'))
    out.append(text(WIDTH / 2, 38, "%s UTC, tree %s%s; K and V bytes read per second, bar: median of %s rounds, "
                    "whisker: min-max; ratio: ours / %s" % (meta.get("date_utc", "?"), tree or meta.get("git", "?"),
                                                            dirty, meta.get("options", {}).get("rounds", "?"),
                                                            peer_name), 11, "middle"))
    out.append('<rect x="%.1f" y="50" width="10" height="10" fill="%s"/>' % (LEFT + 4, AHEAD))
    out.append(text(LEFT + 18, 59, "flashattn", 11))
    out.append('<rect x="%.1f" y="50" width="10" height="10" fill="%s"/>' % (LEFT + 90, PEER_FILL))
    out.append(text(LEFT + 104, 59, peer_name, 11))
    k = 0
    while k * step <= y_hi + 1e-9:
        y = y_of(k * step)
        out.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#dddddd"/>' % (LEFT, y, WIDTH - RIGHT, y))
        out.append(text(LEFT - 6, y + 4, "%.1f" % (k * step), 10, "end"))
        k += 1
    out.append(text(16, (top + bot) / 2, "TB/s", 11, "middle", ' transform="rotate(-90 16 %.1f)"' % ((top + bot) / 2)))
    for i, s in enumerate(shapes):
        cx = LEFT + (i + 0.5) * slot_w
        for j, impl in enumerate(("ours", peer)):
            r = by[(s, impl)]
            x = cx - bar_w + j * bar_w
            tip = "%s %s: %.2f TB/s [%.2f-%.2f]" % (s, impl, r["median"], r["min"], r["max"])
            out.append('<rect class="bar" x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="%s"><title>%s</title>'
                       '</rect>' % (x + 1, y_of(r["median"]), bar_w - 2, bot - y_of(r["median"]),
                                    AHEAD if impl == "ours" else PEER_FILL, escape(tip)))
            ylo, yhi, wx = y_of(r["min"]), y_of(r["max"]), x + bar_w / 2
            out.append('<path class="whisker" d="M%.1f %.1fV%.1fM%.1f %.1fh%.1fM%.1f %.1fh%.1f" stroke="#222222" '
                       'fill="none"/>' % (wx, ylo, yhi, wx - 3, ylo, 6, wx - 3, yhi, 6))
        e = ratios.get(s)
        if e:
            y = y_of(max(by[(s, "ours")]["max"], by[(s, peer)]["max"])) - 6
            out.append(text(cx, y, "%.2fx [%.2f-%.2f]" % (e["median"], e["min"], e["max"]), 10, "middle",
                            ' class="ratio"'))
        out.append(text(cx, bot + 14, "%s x %s" % (by[(s, "ours")]["batch"], seqlen_label(by[(s, "ours")]["seqlen_k"])),
                        10, "middle"))
    if copy_tbps:
        y = y_of(copy_tbps)
        out.append('<line class="copy" x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="black" stroke-dasharray="5 3"/>'
                   % (LEFT, y, WIDTH - RIGHT, y))
        out.append(text(LEFT + 4, y - 4, "device copy %.2f TB/s (read + write)" % copy_tbps, 10))
    out.append('<rect x="%.1f" y="%.1f" width="%.1f" height="%.1f" fill="none" stroke="#888888"/>' % (
        LEFT, top, plot_w, DECODE_HEIGHT))
    out.append(text(LEFT + plot_w / 2, bot + 32, "batch x cache length (keys per sequence)", 12, "middle"))
    for k, line in enumerate(footer):
        out.append(text(LEFT, bot + 50 + 14 * k, line, 10, "start", ' fill="#555555"'))
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("json", help="a bench/compare.py --json file")
    ap.add_argument("-o", "--output", help="the SVG file to write (default: standard output)")
    ap.add_argument("--tree", help="the commit the run measured, when the run's own git field is stale")
    ap.add_argument("--peer", default="cudnn", help="the denominator of the ratios (default: cudnn)")
    ap.add_argument("--set", default="paper", choices=("paper", "decode"), help="the set to draw (default: paper)")
    args = ap.parse_args()
    try:
        data = json.load(open(args.json))
        if args.set == "decode":
            text_out = decode_svg(data, args.tree, peer=args.peer)
        else:
            text_out = svg(data, args.tree, peer=args.peer)
    except ValueError as err:
        sys.exit("results_chart.py: %s" % err)
    if args.output:
        with open(args.output, "w") as f:
            f.write(text_out)
    else:
        sys.stdout.write(text_out)


if __name__ == "__main__":
    main()
