# SPDX-License-Identifier: Apache-2.0
"""bench/compare.py, the harness that times ours and the peers the same way: its torch-free helpers
(bench/compare_core.py: FLOP and byte counts, shape sets, the number of calls, the round order, statistics,
ratios, the summary table, CSV rows, the run-time estimate), its argument handling, the direct ctypes call on a
second copy of the library (base-direct; numpy arrays), and, when PyTorch is installed, the direct call against the
binding and whole --device cpu runs."""

import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest

from conftest import REPO_ROOT

BENCH = os.path.join(REPO_ROOT, "bench")
if BENCH not in sys.path:
    sys.path.insert(0, BENCH)

import compare  # noqa: E402  (torch is imported only when something is timed)
import compare_core as core  # noqa: E402


# ---- work per call ----

def test_flops_follow_the_paper_formula():
    # 4 * s^2 * d * h * b for the forward
    assert core.attention_flops(2, 3, 5, 5, 7, False, "fwd") == 4 * 25 * 7 * 3 * 2
    assert core.attention_flops(2, 3, 5, 5, 7, True, "fwd") == 4 * 25 * 7 * 3 * 2 / 2
    fwd = core.attention_flops(1, 16, 4096, 4096, 128, True, "fwd")
    assert core.attention_flops(1, 16, 4096, 4096, 128, True, "bwd") == pytest.approx(2.5 * fwd)
    assert core.attention_flops(1, 16, 4096, 4096, 128, True, "fwdbwd") == pytest.approx(3.5 * fwd)
    # seqlen_q != seqlen_k (decode): the product of the two lengths
    assert core.attention_flops(1, 1, 1, 1000, 64, False, "fwd") == 4 * 1000 * 64


def test_kv_bytes_count_k_and_v():
    assert core.kv_bytes(8, 8192, 8, 128, 2) == 2 * 8 * 8192 * 8 * 128 * 2


def test_case_values_in_their_units():
    c = core.Case("paper", "x", 2, 1024, 1024, 16, 16, 128, False, ("fwd",), "TFLOP/s")
    assert c.value(1.0, "fwd", 2) == pytest.approx(c.flops("fwd") / 1e9)
    d = core.decode_cases([(2, 4096)])[0]
    assert d.value(0.5, "fwd", 2) == pytest.approx(core.kv_bytes(2, 4096, 8, 128, 2) / 0.5e9)
    o = core.overhead_case()
    assert o.value(0.025, "fwd", 2) == pytest.approx(25.0)
    with pytest.raises(ValueError):
        core.Case("x", "x", 1, 1, 1, 1, 1, 8, False, ("fwd",), "furlongs").value(1.0, "fwd", 2)


# ---- shape sets ----

def test_paper_set_keeps_tokens_and_hidden():
    cases = core.paper_cases()
    assert len(cases) == 3 * 2 * 6
    for c in cases:
        assert c.batch * c.seqlen_q == 16384 and c.heads_q * c.head_dim == 2048
        assert c.seqlen_q == c.seqlen_k and c.heads_q == c.heads_kv and c.unit == "TFLOP/s"
    assert len({c.label for c in cases}) == len(cases)
    assert sum(c.causal for c in cases) == 18


def test_decode_and_llama_sets():
    dec = core.decode_cases()
    assert [(c.batch, c.seqlen_k) for c in dec] == [(1, 32768), (1, 131072), (8, 8192), (32, 4096), (64, 16384)]
    assert all(c.seqlen_q == 1 and (c.heads_q, c.heads_kv, c.head_dim) == (32, 8, 128) and not c.causal
               and c.passes == ("fwd",) and c.unit == "TB/s" for c in dec)
    ll = core.llama_cases()
    assert [(c.batch, c.seqlen_q) for c in ll] == [(1, 8192), (4, 4096), (1, 32768)]
    assert all(c.causal and (c.heads_q, c.heads_kv) == (32, 8) and c.passes == core.PASSES for c in ll)


def test_quick_subset_keeps_the_ends():
    xs = list(range(10))
    assert core.quick_subset(xs, 3) == [0, 4, 9] or core.quick_subset(xs, 3) == [0, 5, 9]
    assert core.quick_subset(xs, 1) == [0]
    assert core.quick_subset(xs[:2], 5) == [0, 1]


# ---- timing plan ----

def test_choose_calls_targets_the_block_and_clamps():
    assert core.choose_calls(0.1, 30.0) == (300, 300)     # warm-up as long as the timed block
    assert core.choose_calls(100.0, 30.0) == (3, 3)       # slow calls: at least 3
    assert core.choose_calls(0.001, 30.0) == (500, 500)   # fast calls: at most 500
    assert core.choose_calls(0.0, 30.0) == (500, 500)
    assert core.choose_calls(float("nan"), 30.0) == (500, 500)
    assert core.choose_calls(1.0, 30.0, lo=5, hi=20) == (20, 20)


def test_rotation_puts_every_impl_in_every_place():
    impls = ["a", "b", "c", "d"]
    orders = [core.rotated(impls, r) for r in range(4)]
    for pos in range(4):
        assert sorted(o[pos] for o in orders) == impls
    assert all(sorted(o) == impls for o in orders)
    assert core.rotated(impls, 5) == core.rotated(impls, 1)
    assert core.rotated([], 3) == []


# ---- statistics and ratios ----

def test_spread_skips_missing_rounds():
    assert core.spread([3.0, None, 1.0, 2.0]) == (2.0, 1.0, 3.0)
    assert core.spread([None, None]) == (None, None, None)


def test_ratios_pair_rounds():
    # peer time / our time, only rounds with both
    assert core.round_ratios([1.0, 2.0, None], [2.0, 3.0, 5.0]) == [2.0, 1.5]
    assert core.derived_difference([5.0, None, 4.0], [2.0, 1.0, 1.0]) == [3.0, None, 3.0]
    assert core.geomean([2.0, 8.0]) == pytest.approx(4.0)
    assert core.geomean([None, -1.0]) is None


def _records():
    c = core.Case("paper", "d128 full 1024", 16, 1024, 1024, 16, 16, 128, False, ("fwd",), "TFLOP/s")
    ours = core.make_record(c, "fwd", "ours", [1.0, 1.1, 0.9], 2, 30, 7)
    cudnn = core.make_record(c, "fwd", "cudnn", [0.9, 1.0, 0.95], 2, 30, 7)   # faster than ours
    flash = core.make_record(c, "fwd", "flash", [2.0, 2.2, None], 2, 30, 7)
    return c, [ours, cudnn, flash]


def test_make_record_and_ratio_entries():
    c, recs = _records()
    ours = recs[0]
    assert ours["values"][0] == pytest.approx(c.flops("fwd") / 1e9)
    assert ours["median"] == pytest.approx(c.flops("fwd") / 1.0 / 1e9)
    assert ours["min"] == pytest.approx(c.flops("fwd") / 1.1 / 1e9)
    assert ours["batch"] == 16 and ours["causal"] is False and ours["calls"] == 30
    ratios = {(e["num"], e["den"]): e for e in core.ratio_entries(recs)}
    assert ratios[("ours", "cudnn")]["rounds"] == pytest.approx([0.9, 1.0 / 1.1, 0.95 / 0.9])
    assert ratios[("ours", "cudnn")]["median"] == pytest.approx(1.0 / 1.1)
    assert ratios[("ours", "flash")]["rounds"] == pytest.approx([2.0, 2.0])


def test_summary_marks_cells_below_cudnn_and_ends_with_geomeans():
    _, recs = _records()
    lines = core.summary_lines(recs, ["ours", "ours-direct", "cudnn", "flash"])
    row = next(line for line in lines if line.startswith("d128 full 1024"))
    assert "0.91 [0.90-1.06]<" in row      # ours below cuDNN: marked
    assert "2.00 [2.00-2.00]" in row and "2.00 [2.00-2.00]<" not in row
    assert lines[-1].startswith("geomean paper fwd:") and "ours/cudnn 0.909" in lines[-1]
    # an implementation without records gets no column
    assert "ours-direc" not in next(line for line in lines if line.startswith("shape"))


def test_summary_decode_quotes_the_copy_bandwidth():
    d = core.decode_cases([(1, 4096)])[0]
    recs = [core.make_record(d, "fwd", "ours", [0.01] * 3, 2)]
    lines = core.summary_lines(recs, None, {"start": {"copy_tbps": 2.91}})
    assert any("copy of this run: 2.91 TB/s" in line for line in lines)


def test_csv_row():
    _, recs = _records()
    row = core.csv_row(recs[2])
    assert set(row) == set(core.CSV_FIELDS)
    assert row["rounds"] == 2 and row["ms_median"] == "2.1" and row["causal"] == 0 and row["impl"] == "flash"


# ---- run-time estimate ----

def test_default_plan_fits_eight_minutes_on_the_model():
    args = compare.parse_args([])
    cases = compare.build_cases(args)
    total, per_set = core.estimate_seconds(cases, args.impls, args.rounds, args.block_ms,
                                           overhead_calls=args.overhead_calls + args.overhead_warmup)
    assert set(per_set) == {"paper", "decode", "llama", "overhead", "fp8"}
    assert 60 < total < 8 * 60
    # the estimate grows with the rounds and the block length
    more, _ = core.estimate_seconds(cases, args.impls, 5, args.block_ms)
    longer, _ = core.estimate_seconds(cases, args.impls, 3, 100.0)
    assert more > total and longer > total


# ---- compare.py's arguments (torch-free) ----

def test_default_cases_and_options():
    args = compare.parse_args([])
    assert args.impls == ["ours", "ours-direct", "cudnn", "flash", "ours-bf16"] and args.rounds == 3
    assert (args.mode, args.l2, args.block_ms, args.dtype) == ("b2b", "flush", 30.0, "bf16")
    assert (args.overhead_calls, args.overhead_warmup) == (2000, 200)
    cases = compare.build_cases(args)
    assert [sum(c.set == s for c in cases) for s in core.SET_NAMES] == [36, 5, 3, 1, 18]


def test_fp8_set_shapes_and_implementations():
    cases = compare.build_cases(compare.parse_args(["--sets", "fp8", "--causal", "no"]))
    assert [(c.head_dim, c.seqlen_q, c.batch, c.heads_q) for c in cases[:3]] == \
        [(64, 4096, 4, 32), (64, 8192, 2, 32), (64, 16384, 1, 32)]
    assert {c.head_dim for c in cases} == {64, 128, 256} and all(c.passes == ("fwd",) for c in cases)
    # the fp8 set times ours (e4m3), ours-bf16 and cuDNN only; ours-bf16 runs nowhere else
    on_fp8 = [i for i in compare.ALL_IMPLS if core.impl_runs_on(i, "fp8")]
    assert on_fp8 == ["ours", "cudnn", "ours-bf16"]
    assert not any(core.impl_runs_on("ours-bf16", s) for s in ("paper", "decode", "llama"))
    assert core.impl_runs_on("ours-direct", "paper") and not core.impl_runs_on("ours-direct", "fp8")


def test_summary_fp8_against_the_e4m3_ceiling():
    case = core.fp8_cases((128,), (16384,))[0]
    recs = [core.make_record(case, "fwd", "ours", [1.0, 1.1, 0.9], 1),
            core.make_record(case, "fwd", "ours-bf16", [1.8, 1.8, 1.9], 2)]
    flops_ours = case.flops("fwd") / 1.0 / 1e9  # TFLOP/s of the median round
    lines = core.summary_lines(recs, None, {"start": {"gemm_e4m3_tflops": flops_ours / 0.8}})
    assert any("e4m3 GEMM 8192^3 of this run" in x for x in lines)
    assert lines[-1] == "ours / e4m3 GEMM ceiling: d128 full 16384 0.80"
    assert any(x.startswith("geomean fp8 fwd: ours/ours-bf16 1.80") for x in lines)
    acc = {"inputs": "b1", "rows": [{"variant": "bf16 inputs", "rmse": 1.5e-3},
                                    {"variant": "e4m3", "rmse": None, "error": "no kernel"}]}
    out = core.fp8_accuracy_lines(acc)
    assert "1.50e-03" in out[2] and out[3].endswith("(no kernel)") and core.fp8_accuracy_lines(None) == []


def test_rounds_below_three_need_quick():
    with pytest.raises(SystemExit):
        compare.parse_args(["--rounds", "2"])
    assert compare.parse_args(["--rounds", "1", "--quick"]).rounds == 1


def test_base_direct_needs_its_library_and_pairs_with_ours_direct():
    for argv in (["--impls", "ours-direct,base-direct"], ["--base-library", "x.so"]):
        with pytest.raises(SystemExit):
            compare.parse_args(argv)
    args = compare.parse_args(["--impls", "ours-direct,base-direct", "--base-library", "x.so"])
    assert args.impls == ["ours-direct", "base-direct"] and args.base_library == "x.so"
    for set_name in ("paper", "decode", "llama"):
        assert ("ours-direct", "base-direct") in core.RATIO_PAIRS[set_name]
    # the estimate counts it like ours-direct, and it is not timed in the FP8 set
    assert core.H100_MODEL["slowdown"]["base-direct"] == 1.0
    assert not core.impl_runs_on("base-direct", "fp8") and core.impl_runs_on("base-direct", "paper")


def test_paper_options_select_shapes():
    args = compare.parse_args(["--sets", "paper", "--head-dims", "128", "--seqlens", "2048,4096", "--causal", "yes",
                               "--passes", "fwd,bwd"])
    cases = compare.build_cases(args)
    assert [(c.head_dim, c.seqlen_q, c.causal) for c in cases] == [(128, 2048, True), (128, 4096, True)]
    assert all(c.passes == ("fwd", "bwd") for c in cases)
    # --passes is for the training sets; decode stays a forward, llama follows it
    got = compare.build_cases(compare.parse_args(["--sets", "decode,llama", "--passes", "bwd"]))
    assert [c.passes for c in got] == [("fwd",)] * 5 + [("bwd",)] * 3


def test_summary_from_json(tmp_path, capsys):
    _, recs = _records()
    path = tmp_path / "r.json"
    path.write_text(json.dumps({"meta": {"options": {"impls": ["ours", "cudnn", "flash"]}},
                                "ceilings": {"start": {"gemm_n": 8192, "gemm_dtype": "bf16", "gemm_tflops": 700.0,
                                                       "copy_tbps": 2.9, "copy_bytes": 1 << 30}},
                                "records": recs}))
    compare.main(["--summary", str(path)])
    out = capsys.readouterr().out
    assert "GEMM bf16 8192^3 700 TFLOP/s" in out and "copy 2.9 TB/s" in out
    assert out.rstrip().splitlines()[-1].startswith("geomean paper fwd")


# ---- the direct call on numpy arrays (the few tensor calls it makes, stood in for), then with PyTorch ----

class _Array:
    """What Direct asks of a torch tensor, on a numpy array (the CPU backend reads it through data_ptr)."""

    is_cuda, device = False, "cpu"

    def __init__(self, a):
        self.a = np.ascontiguousarray(a)

    def detach(self):
        return self

    @property
    def shape(self):
        return self.a.shape

    @property
    def dtype(self):
        return self.a.dtype.type

    def data_ptr(self):
        return self.a.ctypes.data

    def stride(self):
        return tuple(x // self.a.itemsize for x in self.a.strides)


class _ArrayTorch:
    float32, float16, bfloat16 = np.float32, "f16 (not used)", "bf16 (not used)"
    uint8 = np.uint8

    @staticmethod
    def empty_like(t):
        return _Array(np.empty_like(t.a))

    @staticmethod
    def empty(shape, dtype=None, device=None):
        return _Array(np.empty(shape, dtype=dtype))

    @staticmethod
    def get_num_threads():
        return 1


def test_direct_on_a_second_copy_of_the_library(tmp_path):
    # base-direct: the same parameter block through another copy of the library gives the same bits
    from flashattn import _lib
    base_path = tmp_path / "libflashattn-base.so"
    base_path.write_bytes(open(_lib.library_path, "rb").read())
    base = _lib.load_library(str(base_path))
    rng = np.random.default_rng(0)
    q, g = (_Array(rng.standard_normal((2, 40, 4, 64)).astype(np.float32)) for _ in range(2))
    k, v = (_Array(rng.standard_normal((2, 56, 2, 64)).astype(np.float32)) for _ in range(2))
    ours = compare.Direct(_ArrayTorch, q, k, v, True, g)   # fa_fwd, fa_bwd once each, statuses checked
    other = compare.Direct(_ArrayTorch, q, k, v, True, g, base)
    assert ours.lib is _lib.lib and other.lib is base
    for x, y in ((ours.o, other.o), (ours.dq, other.dq), (ours.dk, other.dk), (ours.dv, other.dv)):
        assert np.isfinite(x.a).all() and np.array_equal(x.a, y.a)
    other.o.a[:] = 0
    assert other.fwd() == 0 and np.array_equal(other.o.a, ours.o.a)
    assert other.bwd() == 0 and other.fwdbwd() == 0
    # a failed call reports the message of the copy that made it
    with pytest.raises(RuntimeError, match="libflashattn-base.so.*FA_ERR_INVALID_ARGUMENT"):
        other.check("fa_fwd", _lib.FA_ERR_INVALID_ARGUMENT)


# ---- with PyTorch: the direct call and a whole CPU run ----

def test_direct_call_matches_the_binding():
    torch = pytest.importorskip("torch", reason="PyTorch is not installed")
    import flashattn
    torch.manual_seed(0)
    q = torch.randn(2, 40, 4, 64, requires_grad=True)
    k = torch.randn(2, 56, 2, 64, requires_grad=True)
    v = torch.randn(2, 56, 2, 64, requires_grad=True)
    g = torch.randn_like(q)
    out = flashattn.flash_attn_func(q, k, v, causal=True)
    dq, dk, dv = torch.autograd.grad(out, (q, k, v), g)
    d = compare.Direct(torch, q, k, v, True, g)   # runs fa_fwd then fa_bwd once, checking the status
    torch.testing.assert_close(d.o, out.detach(), rtol=1e-5, atol=1e-5)
    for got, want in ((d.dq, dq), (d.dk, dk), (d.dv, dv)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    d.o.zero_()
    assert d.fwd() == 0 and torch.allclose(d.o, out.detach(), rtol=1e-5, atol=1e-5)


def test_cpu_quick_run_end_to_end(tmp_path):
    pytest.importorskip("torch", reason="PyTorch is not installed")
    js, cs = tmp_path / "c.json", tmp_path / "c.csv"
    cmd = [sys.executable, os.path.join(BENCH, "compare.py"), "--device", "cpu", "--quick", "--block-ms", "2",
           "--overhead-calls", "50", "--overhead-warmup", "5", "--json", str(js), "--csv", str(cs)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads(js.read_text())
    recs = data["records"]
    assert {r["set"] for r in recs} == {"paper", "decode", "llama", "overhead", "fp8"}
    paper = [r for r in recs if r["set"] == "paper"]
    assert {r["impl"] for r in paper} == {"ours", "ours-direct", "flash"}
    assert {r["pass"] for r in paper} == {"fwd", "bwd", "fwdbwd"}
    for r in recs:
        assert len(r["ms"]) == 3 and r["median"] is not None and r["min"] <= r["median"] <= r["max"]
    # every implementation of a (shape, pass) got the same number of calls and warm-up
    plan = {}
    for r in paper:
        plan.setdefault((r["shape"], r["pass"]), set()).add((r["calls"], r["warmup"]))
    assert all(len(v) == 1 for v in plan.values())
    # cuDNN has no CPU kernel: recorded as missing, not a crash
    assert any(m["impl"] == "cudnn" for m in data["missing"])
    ov = {(r["impl"], r["pass"]) for r in recs if r["set"] == "overhead"}
    assert {("ours", "bwd"), ("sdpa", "bwd"), ("ours-direct", "fwd")} <= ov
    assert data["ceilings"]["start"]["gemm_tflops"] > 0 and "end" in data["ceilings"]
    assert data["meta"]["options"]["rounds"] == 3 and data["meta"]["git"]
    assert any(e["num"] == "ours" and e["den"] == "flash" for e in data["ratios"])
    assert len(cs.read_text().strip().splitlines()) == len(recs) + 1
    # the FP8 set: e4m3 against bf16 on the same inputs, and the accuracy table (fp64 reference) after it
    assert {r["impl"] for r in recs if r["set"] == "fp8"} == {"ours", "ours-bf16"}
    acc = {row["variant"]: row["rmse"] for row in data["fp8_accuracy"]["rows"]}
    assert len(acc) == 6 and all(x is not None and 0 < x < 0.1 for x in acc.values())
    assert acc["bf16 inputs"] < acc["e4m3, per (batch, head)"]
    assert acc["e4m3, per 128 rows + Hadamard q, k"] < acc["e4m3, one descale per tensor"]
    # the summary table comes last, then the accuracy table
    tail = res.stdout.rstrip().splitlines()
    assert any(x.startswith("geomean overhead") for x in tail[-20:]) and tail[-1].startswith("  e4m3, per 128 rows + H")
    assert math.isfinite(data["meta"]["elapsed_s"])


def test_cpu_base_direct_beside_ours_direct(tmp_path):
    pytest.importorskip("torch", reason="PyTorch is not installed")
    import flashattn
    base = tmp_path / "libflashattn-base.so"
    base.write_bytes(open(flashattn.library_path, "rb").read())
    js = tmp_path / "b.json"
    cmd = [sys.executable, os.path.join(BENCH, "compare.py"), "--device", "cpu", "--quick", "--rounds", "2",
           "--block-ms", "2", "--sets", "paper,llama", "--impls", "ours-direct,base-direct", "--base-library",
           str(base), "--json", str(js)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads(js.read_text())
    assert not data["missing"]
    keys = {(r["set"], r["shape"], r["pass"]) for r in data["records"]}
    for key in keys:
        assert {r["impl"] for r in data["records"] if (r["set"], r["shape"], r["pass"]) == key} == \
            {"ours-direct", "base-direct"}
    pairs = [e for e in data["ratios"] if (e["num"], e["den"]) == ("ours-direct", "base-direct")]
    assert len(pairs) == len(keys) and all(len(e["rounds"]) == 2 for e in pairs)
    assert "ours-direct/base-direct" in res.stdout


def test_cpu_paged_decode(tmp_path):
    pytest.importorskip("torch", reason="PyTorch is not installed")
    js = tmp_path / "p.json"
    cmd = [sys.executable, os.path.join(BENCH, "compare.py"), "--device", "cpu", "--quick", "--rounds", "1",
           "--sets", "decode,paper", "--seqlens", "128", "--causal", "no", "--passes", "fwd",
           "--impls", "ours,ours-paged", "--page-size", "32", "--block-ms", "2", "--json", str(js)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads(js.read_text())
    # timed on the decode set only, and never missing elsewhere
    assert {r["impl"] for r in data["records"] if r["set"] == "decode"} == {"ours", "ours-paged"}
    assert {r["impl"] for r in data["records"] if r["set"] == "paper"} == {"ours"}
    assert not data["missing"]
    assert any(e["num"] == "ours-paged" and e["den"] == "ours" for e in data["ratios"])


def test_paper_tokens_and_hidden():
    args = compare.parse_args(["--sets", "paper", "--head-dims", "128", "--seqlens", "2048", "--causal", "no",
                               "--paper-tokens", "2048", "--paper-hidden", "1024", "--device", "cpu"])
    (c,) = compare.build_cases(args)
    assert (c.batch, c.seqlen_q, c.heads_q, c.head_dim) == (1, 2048, 8, 128)
    (g,) = compare.build_cases(compare.parse_args(["--sets", "paper", "--head-dims", "64", "--seqlens", "1024",
                                                   "--causal", "no"]))
    assert (g.batch, g.heads_q) == (16, 32)


def test_decode_options_select_shapes():
    args = compare.parse_args(["--sets", "decode", "--decode-shapes", "2x4096,1x65536", "--decode-heads", "32/1",
                               "--decode-head-dim", "256", "--decode-q", "4"])
    cases = compare.build_cases(args)
    assert [(c.batch, c.seqlen_k, c.seqlen_q, c.heads_q, c.heads_kv, c.head_dim, c.causal) for c in cases] == [
        (2, 4096, 4, 32, 1, 256, True), (1, 65536, 4, 32, 1, 256, True)]
    assert [c.label for c in cases] == ["2x4096 q4", "1x65536 q4"]
    assert [c.causal for c in compare.build_cases(compare.parse_args(["--sets", "decode"]))] == [False] * 5
    for bad in (["--decode-shapes", "2*4096"], ["--decode-heads", "32"]):
        with pytest.raises(SystemExit):
            compare.parse_args(bad)


def test_cpu_decode_append_and_speculative(tmp_path):
    pytest.importorskip("torch", reason="PyTorch is not installed")
    js = tmp_path / "a.json"
    cmd = [sys.executable, os.path.join(BENCH, "compare.py"), "--device", "cpu", "--quick", "--rounds", "1",
           "--sets", "decode", "--decode-shapes", "2x256", "--decode-q", "4", "--impls", "ours,ours-append,efficient",
           "--block-ms", "2", "--json", str(js)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads(js.read_text())
    assert {r["impl"] for r in data["records"]} == {"ours", "ours-append"}
    assert {r["shape"] for r in data["records"]} == {"2x256 q4"}
    # SDPA's causal mask is top-left: a peer on several query tokens is missing, not a wrong figure
    assert [m["impl"] for m in data["missing"]] == ["efficient"]
    assert any(e["num"] == "ours-append" and e["den"] == "ours" for e in data["ratios"])


def test_paged_impl_estimated_on_decode_only():
    args = compare.parse_args(["--sets", "paper", "--impls", "ours"])
    cases = compare.build_cases(args)
    base, _ = core.estimate_seconds(cases, ["ours"], 3, args.block_ms)
    assert core.estimate_seconds(cases, ["ours", "ours-paged"], 3, args.block_ms)[0] == base
    assert core.impl_runs_on("ours-paged", "decode") and not core.impl_runs_on("ours-paged", "paper")


def test_cpu_single_mode_without_flush(tmp_path):
    pytest.importorskip("torch", reason="PyTorch is not installed")
    js = tmp_path / "s.json"
    cmd = [sys.executable, os.path.join(BENCH, "compare.py"), "--device", "cpu", "--quick", "--rounds", "1",
           "--mode", "single", "--l2", "warm", "--sets", "paper", "--seqlens", "128", "--causal", "no",
           "--passes", "fwd", "--impls", "ours,ours-direct,efficient", "--block-ms", "2", "--json", str(js)]
    res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stdout[-3000:] + res.stderr[-3000:]
    data = json.loads(js.read_text())
    assert {(r["impl"], len(r["ms"])) for r in data["records"]} == {("ours", 1), ("ours-direct", 1)}
    assert [m["impl"] for m in data["missing"]] == ["efficient"]   # no CPU kernel: missing, not a crash
    assert (data["meta"]["options"]["mode"], data["meta"]["options"]["l2"]) == ("single", "warm")


# ---- the timer's CUDA path, on a stand-in for torch that logs what would reach the GPU ----

class _FakeTorch:
    uint8 = "uint8"

    def __init__(self, l2_bytes):
        self.log = []
        self.flush_bytes = None
        torch = self

        class Event:
            def __init__(self, enable_timing):
                assert enable_timing
                self.t = None

            def record(self):
                torch.log.append("record")
                self.t = len(torch.log)

            def synchronize(self):
                torch.log.append("event-sync")

            def elapsed_time(self, other):
                return 2.0 * (other.t - self.t)   # milliseconds: 2 per logged step in between

        class Props:
            L2_cache_size = l2_bytes

        class Cuda:
            @staticmethod
            def current_device():
                return 0

            @staticmethod
            def get_device_properties(i):
                return Props()

            @staticmethod
            def synchronize():
                torch.log.append("sync")

        Cuda.Event = Event
        self.cuda = Cuda

    def empty(self, n, dtype, device):
        assert device == "cuda"
        self.flush_bytes = n
        torch = self

        class Buf:
            def zero_(self):
                torch.log.append("flush")
        return Buf()


def test_timer_b2b_times_the_block_after_warmup_and_flush():
    t = _FakeTorch(50 << 20)
    timer = compare.Timer(t, "cuda", "b2b", "flush")
    assert t.flush_bytes == 100 << 20            # twice the L2
    ms = timer.block(lambda: t.log.append("call"), 4, 2)
    assert t.log == ["call"] * 2 + ["flush", "record"] + ["call"] * 4 + ["record", "event-sync"]
    assert ms == pytest.approx(2.0 * 5 / 4)      # elapsed over the block / N


def test_timer_single_times_each_call_after_a_flush_and_a_sync():
    t = _FakeTorch(None)
    timer = compare.Timer(t, "cuda", "single", "flush")
    assert t.flush_bytes == 256 << 20            # L2 size unknown: 256 MB
    ms = timer.block(lambda: t.log.append("call"), 3, 1)
    assert t.log == ["call"] + ["flush", "sync", "record", "call", "record", "event-sync"] * 3
    assert ms == pytest.approx(2.0 * 2)


def test_timer_warm_l2_never_flushes():
    t = _FakeTorch(50 << 20)
    timer = compare.Timer(t, "cuda", "b2b", "warm")
    assert t.flush_bytes is None
    timer.block(lambda: t.log.append("call"), 3, 3, "b2b")
    assert "flush" not in t.log
