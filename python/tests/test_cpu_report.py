# SPDX-License-Identifier: Apache-2.0
"""bench/cpu_report.py: the README's CPU table from compare.py --device cpu runs, from synthetic JSON files."""
import json
import os
import sys

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(REPO_ROOT, "bench"))
import cpu_report  # noqa: E402


def run(dtype, threads, ratios):
    """A run of the two paper shapes: {(shape, pass): (ours TFLOP/s, median, min, max)}."""
    return {"meta": {"options": {"dtype": dtype, "threads": threads}},
            "records": [{"shape": s, "pass": p, "impl": "ours", "median": v[0]} for (s, p), v in ratios.items()],
            "ratios": [{"shape": s, "pass": p, "num": "ours", "den": "flash", "median": v[1], "min": v[2],
                        "max": v[3]} for (s, p), v in ratios.items()]}


def test_rows_by_dtype_threads_and_pass(tmp_path, capsys):
    full, causal = "d128 full 2048", "d128 causal 2048"
    a = run("fp32", 16, {(full, "fwd"): (1.15, 1.39, 1.34, 1.45), (causal, "fwd"): (1.19, 2.1, 2.04, 2.52)})
    b = run("bf16", 1, {(full, "bwd"): (0.41, 1.56, 1.53, 2.01), (causal, "bwd"): (0.296, 1.52, 1.36, 1.66),
                        (full, "fwd"): (0.515, 1.26, 1.24, 1.27)})
    pa, pb = tmp_path / "a.json", tmp_path / "b.json"
    pa.write_text(json.dumps(a))
    pb.write_text(json.dumps({"bf16-t1": b}))  # several runs in one file
    assert cpu_report.main([str(pa), str(pb)]) == 0
    lines = capsys.readouterr().out.splitlines()
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in lines[2:]]
    assert [c[:3] for c in cells] == [["bf16", "1", "fwd"], ["bf16", "1", "bwd"], ["fp32", "16", "fwd"]]
    assert cells[0][3:] == ["0.515, 1.26 [1.24-1.27]", "-"]
    assert cells[1][3:] == ["0.41, 1.56 [1.53-2.01]", "0.296, 1.52 [1.36-1.66]"]
    assert cells[2][4] == "1.19, 2.10 [2.04-2.52]"


def test_no_runs_is_refused(capsys):
    assert cpu_report.main([]) == 2
