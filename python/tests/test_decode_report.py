# SPDX-License-Identifier: Apache-2.0
"""bench/decode_report.py: the table of a call's decode runs, from synthetic compare.py JSON files."""
import json
import os
import sys

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO_ROOT, "bench"))
import decode_report  # noqa: E402


def rec(shape, impl, values, heads=(32, 8), d=128):
    """A record as compare.py writes it: rates per round and the times they came from (1 GB read)."""
    return {"set": "decode", "shape": shape, "pass": "fwd", "impl": impl, "values": values,
            "ms": [1.0 / v for v in values], "median": sorted(values)[len(values) // 2], "heads_q": heads[0],
            "heads_kv": heads[1], "head_dim": d}


def write(tmp_path, name, records, copy=None):
    data = {"meta": {"device_name": "GPU X", "date_utc": "2026-01-01 00:00:00", "git": "abc1234"},
            "ceilings": {"start": {"copy_tbps": copy}} if copy else {}, "records": records}
    path = tmp_path / (name + ".json")
    path.write_text(json.dumps(data))
    return "%s=%s" % (name, path)


def table(capsys, runs):
    assert decode_report.main(runs) == 0
    lines = capsys.readouterr().out.splitlines()
    head = [c.strip() for c in lines[0].strip("|").split("|")]
    rows = {}
    for line in lines[2:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        rows[cells[0]] = dict(zip(head, cells))
    return head, rows, lines


def test_base_columns_pair_the_rounds(tmp_path, capsys):
    base = write(tmp_path, "base", [rec("1x32768", "ours", [2.0, 3.0, 4.0]), rec("1x32768", "cudnn", [4.0, 3.0, 2.0]),
                                    rec("8x8192", "ours", [3.0, 3.0, 3.0]), rec("8x8192", "cudnn", [2.0, 3.0, 6.0]),
                                    rec("1x32768", "ours-paged", [1.0, 3.0, 2.0]),
                                    rec("8x8192", "ours-paged", [3.0, 3.0, 3.0])], copy=4.0)
    head, rows, lines = table(capsys, [base])
    assert head == ["shape", "flashattn TB/s", "cuDNN TB/s", "flashattn / cuDNN", "of copy (4.00 TB/s)",
                    "ours-paged / ours"]
    assert list(rows) == ["1x32768", "8x8192"]  # compare.py's order
    # rounds paired: 2/4, 3/3, 4/2 -> median 1.0, range 0.5-2.0 (a ratio of medians would also be 1.0 here)
    assert rows["1x32768"]["flashattn / cuDNN"] == "1.00 [0.50-2.00]"
    assert rows["8x8192"]["flashattn / cuDNN"] == "1.00 [0.50-1.50]"
    assert rows["1x32768"]["of copy (4.00 TB/s)"] == "0.75"
    assert rows["1x32768"]["ours-paged / ours"] == "0.50 [0.50-1.00]"  # 1/2, 3/3, 2/4
    assert "GPU X" in lines[-1] and "abc1234" in lines[-1]


def test_other_runs_add_their_columns(tmp_path, capsys):
    base = write(tmp_path, "base", [rec("1x32768", "ours", [4.0, 4.0, 4.0]), rec("1x32768", "cudnn", [4.0, 4.0, 4.0])])
    mqa = write(tmp_path, "mqa", [rec("1x32768", "ours", [1.0, 1.0, 1.0], heads=(32, 1)),
                                  rec("1x32768", "cudnn", [2.0, 2.0, 2.0], heads=(32, 1))])
    paged = write(tmp_path, "paged64", [rec("1x32768", "ours-paged", [3.0, 3.0, 3.0])])
    q4 = write(tmp_path, "q4", [rec("1x32768 q4", "ours", [3.6, 3.6, 3.6])])
    d64 = write(tmp_path, "d64", [rec("1x32768", "ours", [3.0, 3.0, 3.0], d=64)])  # no cuDNN in it: no column
    head, rows, _ = table(capsys, [base, mqa, paged, q4, d64])
    assert "mqa / cuDNN" in head and "d64 / base" not in head
    assert rows["1x32768"]["mqa / cuDNN"] == "0.50 [0.50-0.50]"
    assert rows["1x32768"]["paged64 ours-paged / ours"] == "~0.75"  # across two runs: ratio of medians
    assert rows["1x32768"]["q4 / base"] == "~0.90"


def test_a_base_run_is_required(tmp_path):
    other = write(tmp_path, "mqa", [rec("1x32768", "ours", [1.0])])
    with pytest.raises(SystemExit):
        decode_report.main([other])
    with pytest.raises(SystemExit):
        decode_report.main(["no-equals-sign"])
