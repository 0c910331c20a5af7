# SPDX-License-Identifier: Apache-2.0
"""bench/ab_report.py: two builds' compare.py runs side by side, from synthetic JSON files."""
import json
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO_ROOT, "bench"))
import ab_report  # noqa: E402


def write(tmp_path, name, ours, peer):
    """A run of one shape: ours and cuDNN rates per round, and compare.py's ratio entry of them."""
    rates = [o / p for o, p in zip(ours, peer)]
    data = {"records": [{"shape": "1x32768", "pass": "fwd", "impl": "ours", "median": sorted(ours)[1]},
                        {"shape": "1x32768", "pass": "fwd", "impl": "cudnn", "median": sorted(peer)[1]}],
            "ratios": [{"shape": "1x32768", "pass": "fwd", "num": "ours", "den": "cudnn", "rounds": rates,
                        "median": sorted(rates)[1], "min": min(rates), "max": max(rates)}]}
    path = tmp_path / (name + ".json")
    path.write_text(json.dumps(data))
    return "%s=%s" % (name, path)


def test_each_run_is_a_column_of_its_ratios(tmp_path, capsys):
    this = write(tmp_path, "this-1", [4.0, 4.2, 4.4], [4.0, 4.0, 4.0])
    base = write(tmp_path, "base-1", [3.0, 3.2, 3.4], [4.0, 4.0, 4.0])
    assert ab_report.main([this, base]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [c.strip() for c in lines[0].strip("|").split("|")] == ["shape", "pass", "ratio", "this-1", "base-1"]
    cells = [c.strip() for c in lines[2].strip("|").split("|")]
    assert cells[:3] == ["1x32768", "fwd", "ours / cudnn"]
    assert cells[3] == "1.050 [1.00-1.10] (4.2)"
    assert cells[4] == "0.800 [0.75-0.85] (3.2)"
    assert len(lines) == 3


def test_a_run_without_the_ratio_shows_a_dash(tmp_path, capsys):
    this = write(tmp_path, "this-1", [4.0, 4.0, 4.0], [4.0, 4.0, 4.0])
    empty = tmp_path / "base-1.json"
    empty.write_text(json.dumps({"records": [], "ratios": []}))
    assert ab_report.main([this, "base-1=%s" % empty]) == 0
    assert capsys.readouterr().out.splitlines()[2].rstrip(" |").endswith("-")


def test_arguments_without_a_name_are_refused(capsys):
    assert ab_report.main(["no-equals-sign"]) == 2
    assert ab_report.main([]) == 2
