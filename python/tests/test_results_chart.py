# SPDX-License-Identifier: Apache-2.0
"""tools/results_chart.py, the README's chart from one bench/compare.py run: on the committed H200 run it writes
well-formed SVG with one bar per paper shape and pass, each bar's height and colour following its ratio, and
the committed chart is its current output."""

import json
import os
import re
import sys
import xml.etree.ElementTree as ET

import pytest

from conftest import REPO_ROOT

TOOLS = os.path.join(REPO_ROOT, "tools")
if TOOLS not in sys.path:
    sys.path.insert(0, TOOLS)

import results_chart  # noqa: E402

RUN = os.path.join(REPO_ROOT, "docs", "compare-h200-2026-11-27.json")
CHART = os.path.join(REPO_ROOT, "docs", "results-h200-2026-11-27.svg")
TREE = "1f50871"  # the tree docs/results.md names for this run
SVG_NS = "{http://www.w3.org/2000/svg}"


def load_run():
    with open(RUN) as f:
        return json.load(f)


def bars(root):
    return [e for e in root.iter(SVG_NS + "rect") if e.get("class") == "bar"]


def test_one_bar_per_shape_and_pass():
    data = load_run()
    root = ET.fromstring(results_chart.svg(data, TREE))
    expected = {(r["shape"], r["pass"]) for r in data["records"] if r["set"] == "paper" and r["impl"] == "ours"}
    found = bars(root)
    assert len(found) == len(expected) == 108
    panels = [g.get("id") for g in root.iter(SVG_NS + "g") if g.get("class") == "panel"]
    assert panels == ["panel-fwd", "panel-bwd", "panel-fwdbwd"]
    parity = [e for e in root.iter(SVG_NS + "line") if e.get("class") == "parity"]
    assert len(parity) == 3
    whiskers = [e for e in root.iter(SVG_NS + "path") if e.get("class") == "whisker"]
    assert len(whiskers) == len(found)
    titles = "".join(root.itertext())
    assert "NVIDIA H200" in titles and "tree %s" % TREE in titles and "d256, causal" in titles


def test_bars_follow_the_ratios():
    data = load_run()
    root = ET.fromstring(results_chart.svg(data, TREE))
    entries = {(e["shape"], e["pass"]): e for e in results_chart.core.ratio_entries(data["records"])
               if e["set"] == "paper" and e["den"] == "cudnn"}
    y_lo, y_hi = results_chart.y_range(entries)
    per_unit = results_chart.PANEL_HEIGHT / (y_hi - y_lo)
    for bar in bars(root):
        shape, pass_, med = re.match(r"(.+) (\w+): ([0-9.]+) \[", bar.find(SVG_NS + "title").text).groups()
        e = entries[(shape, pass_)]
        assert float(med) == pytest.approx(e["median"], abs=0.005)
        assert bar.get("fill") == (results_chart.AHEAD if e["median"] >= 1.0 else results_chart.BEHIND)
        # from the 1.0 line to the median, on the panel's scale (coordinates are written to 0.1)
        assert float(bar.get("height")) == pytest.approx(max(abs(e["median"] - 1.0) * per_unit, 0.5), abs=0.11)




DECODE_RUN = os.path.join(REPO_ROOT, "docs", "compare-h100-decode-2026-11-28.json")
DECODE_CHART = os.path.join(REPO_ROOT, "docs", "decode-h100-2026-11-28.svg")
DECODE_TREE = "174d7c2"  # the commit of the decode kernel that run measured


def load_decode_run():
    with open(DECODE_RUN) as f:
        return json.load(f)


def test_decode_chart_bars_follow_the_run():
    data = load_decode_run()
    root = ET.fromstring(results_chart.decode_svg(data, DECODE_TREE))
    recs = {(r["shape"], r["impl"]): r for r in data["records"] if r["set"] == "decode"}
    found = bars(root)
    assert len(found) == 10  # five cache shapes, ours and cuDNN
    heights = {}
    for bar in found:
        shape, impl, med = re.match(r"(\S+) (\w+): ([0-9.]+) TB/s", bar.find(SVG_NS + "title").text).groups()
        assert float(med) == pytest.approx(recs[(shape, impl)]["median"], abs=0.005)
        assert bar.get("fill") == (results_chart.AHEAD if impl == "ours" else results_chart.PEER_FILL)
        heights[(shape, impl)] = float(bar.get("height"))
    # one scale for every bar: height / TB/s the same throughout
    scales = [heights[k] / recs[k]["median"] for k in heights]
    assert max(scales) - min(scales) < 0.1
    ratios = [e.text for e in root.iter(SVG_NS + "text") if e.get("class") == "ratio"]
    assert len(ratios) == 5 and ratios[0].startswith("0.99x")
    copy_line = [e for e in root.iter(SVG_NS + "line") if e.get("class") == "copy"]
    assert len(copy_line) == 1
    assert "device copy 3.01 TB/s" in "".join(root.itertext())


# (run, committed chart, the tree it names, the drawing function) of each chart the README shows
CHARTS = {"paper": (RUN, CHART, TREE, results_chart.svg),
          "decode": (DECODE_RUN, DECODE_CHART, DECODE_TREE, results_chart.decode_svg)}


@pytest.mark.parametrize("name", sorted(CHARTS))
def test_committed_chart_is_current(name):
    run, chart, tree, draw = CHARTS[name]
    with open(run) as f:
        data = json.load(f)
    with open(chart) as f:
        assert f.read() == draw(data, tree), \
            "%s differs from tools/results_chart.py's output (regenerate it)" % os.path.relpath(chart, REPO_ROOT)


@pytest.mark.parametrize("name", sorted(CHARTS))
def test_missing_peer_is_named(name):
    run, _, _, draw = CHARTS[name]
    with open(run) as f:
        data = json.load(f)
    data["records"] = [r for r in data["records"] if r["impl"] != "cudnn"]
    with pytest.raises(ValueError, match="cudnn"):
        draw(data)
