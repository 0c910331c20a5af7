# SPDX-License-Identifier: Apache-2.0
"""Decoding with a KV cache: flashattn.attention_with_kvcache (numpy) and flashattn.flash_attn_with_kvcache
(PyTorch, CPU and, where a GPU is present, CUDA, also captured in a CUDA graph) against a float64 computation written here: the test appends the new tokens to its own copy
of the cache (rotating the keys), walks the page table or cache_batch_idx itself, rotates q, and runs the
attention of test_numpy.reference on the gathered rows. Outputs pass under the 2x-naive rule (the error of
the same computation in the dtype, doubled, plus a floor); the cache after the call must hold the appended
rows and be unchanged elsewhere. Then the invalid arguments: an error naming the argument, nothing written.
"""

import numpy as np
import pytest

import flashattn
from flashattn import _lib
from test_numpy import _ref_one, assert_2x_naive, assert_lse

RNG = np.random.default_rng(20261127)


def _make(dtype, batch=3, hq=4, hkv=2, d=64, sq=1, n_new=1, cap=48, page=0, rotary_dim=0, interleaved=True,
          leftpad=False, batch_idx=False, seqlens_int=None):
    """Inputs of one call, as numpy arrays of `dtype` (int32 for the indices)."""
    def randn(*shape):
        return RNG.standard_normal(shape).astype(dtype)

    a = {"q": randn(batch, sq, hq, d)}
    if page:
        max_pages = -(-cap // page)
        num_pages = batch * max_pages + 3
        a["block_table"] = RNG.permutation(num_pages)[: batch * max_pages].reshape(batch, max_pages).astype(np.int32)
        shape = (num_pages, page, hkv, d)
        capacity = max_pages * page
    else:
        rows = batch + 2 if batch_idx else batch
        shape = (rows, cap, hkv, d)
        capacity = cap
        if batch_idx:
            a["cache_batch_idx"] = RNG.permutation(rows)[:batch].astype(np.int32)
    a["k_cache"], a["v_cache"] = randn(*shape), randn(*shape)
    if n_new:
        a["k"], a["v"] = randn(batch, n_new, hkv, d), randn(batch, n_new, hkv, d)
    if seqlens_int is not None:
        a["cache_seqlens"] = seqlens_int
    else:
        seqlens = RNG.integers(0, capacity - n_new + 1, batch)
        seqlens[0] = capacity - n_new  # a full sequence, and an empty one
        if batch > 1:
            seqlens[1] = 0
        a["cache_seqlens"] = seqlens.astype(np.int32)
    if leftpad:
        a["cache_leftpad"] = np.array([RNG.integers(0, s + 1) for s in np.broadcast_to(a["cache_seqlens"], batch)],
                                      np.int32)
    if rotary_dim:
        ro = capacity + sq
        theta = np.arange(ro)[:, None] * 10000.0 ** (-2.0 * np.arange(rotary_dim // 2)[None] / rotary_dim)
        a["rotary_cos"], a["rotary_sin"] = np.cos(theta).astype(dtype), np.sin(theta).astype(dtype)
        a["rotary_interleaved"] = interleaved
    return a


def _rotate(x, cos, sin, interleaved):
    """x (..., d) float64 rotated by one row of cos / sin (float64)."""
    rd = 2 * cos.shape[-1]
    y = x.copy()
    if interleaved:
        x0, x1 = x[..., 0:rd:2], x[..., 1:rd:2]
        y[..., 0:rd:2], y[..., 1:rd:2] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    else:
        x0, x1 = x[..., : rd // 2], x[..., rd // 2 : rd]
        y[..., : rd // 2], y[..., rd // 2 : rd] = x0 * cos - x1 * sin, x0 * sin + x1 * cos
    return y


def expected_problem(a, causal=False, window_size=(-1, -1), round_fn=None):
    """The test's own append and gather: (q rotated, per-sequence (K, V) float64, the cache after the call,
    float64). round_fn rounds float64 values to the dtype (rotated q and keys are values of the dtype)."""
    q = a["q"].astype(np.float64)
    kc, vc = a["k_cache"].astype(np.float64), a["v_cache"].astype(np.float64)
    batch, sq = q.shape[:2]
    bt = a.get("block_table")
    page = kc.shape[1]
    capacity = bt.shape[1] * page if bt is not None else kc.shape[1]
    seqlens = np.broadcast_to(np.asarray(a.get("cache_seqlens", capacity)), (batch,))
    pads = a.get("cache_leftpad", np.zeros(batch, np.int32))
    idx = a.get("cache_batch_idx", np.arange(batch))
    cos = a.get("rotary_cos")
    inter = a.get("rotary_interleaved", True)

    def slot(b, r):
        return (bt[b, r // page], r % page) if bt is not None else (idx[b], r)

    if "k" in a:
        for b in range(batch):
            for j in range(a["k"].shape[1]):
                r = seqlens[b] + j
                row = a["k"][b, j].astype(np.float64)
                if cos is not None:
                    row = round_fn(_rotate(row, cos[r].astype(np.float64), a["rotary_sin"][r].astype(np.float64),
                                           inter))
                kc[slot(b, r)] = row
                vc[slot(b, r)] = a["v"][b, j]
    n_new = a["k"].shape[1] if "k" in a else 0
    local = causal or tuple(window_size) != (-1, -1)
    qr = q.copy()
    seqs = []
    for b in range(batch):
        if cos is not None:
            for i in range(sq):
                pos = seqlens[b] + (i if local else 0)
                qr[b, i] = round_fn(_rotate(q[b, i], cos[pos].astype(np.float64),
                                            a["rotary_sin"][pos].astype(np.float64), inter))
        rows = range(pads[b], seqlens[b] + n_new)
        seqs.append((np.stack([kc[slot(b, r)] for r in rows]) if len(rows) else np.zeros((0,) + kc.shape[2:]),
                     np.stack([vc[slot(b, r)] for r in rows]) if len(rows) else np.zeros((0,) + vc.shape[2:])))
    return qr, seqs, kc, vc


def _round_np(dtype):
    return lambda x: x.astype(dtype).astype(np.float64)


def attention_of(qr, seqs, dtype, causal, scale, window, softcap, slopes):
    """out (batch, sq, hq, d) and lse (batch, hq, sq) of the gathered problem, computed in dtype."""
    out = np.zeros(qr.shape, dtype)
    lse = np.zeros((qr.shape[0], qr.shape[2], qr.shape[1]))
    for b, (k, v) in enumerate(seqs):
        sl = None if slopes is None else (slopes if slopes.ndim == 1 else slopes[b])
        o, l = _ref_one(qr[b], k, v, None, causal, scale, window, softcap, sl, dtype)
        out[b], lse[b] = o, l
    return out, lse


def check_numpy(dtype, a, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None, backend="cpu"):
    inputs = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in a.items()}
    out, lse = flashattn.attention_with_kvcache(causal=causal, window_size=window_size, softcap=softcap,
                                                alibi_slopes=alibi_slopes, return_softmax_lse=True, backend=backend,
                                                **inputs)
    qr, seqs, kc, vc = expected_problem(a, causal, window_size, _round_np(dtype))
    scale = 1.0 / np.sqrt(a["q"].shape[-1])
    ref = attention_of(qr, seqs, np.float64, causal, scale, window_size, softcap, alibi_slopes)
    naive = attention_of(qr, seqs, dtype, causal, scale, window_size, softcap, alibi_slopes)
    assert out.shape == a["q"].shape and out.dtype == a["q"].dtype
    assert_2x_naive("out", out, naive[0], ref[0], dtype)
    assert_lse(lse, ref[1], 1e-4 if dtype == np.float32 else 1e-2)
    # the cache: appended rows as the test's (a rounding of the rotation apart), every other element unchanged
    tol = 0 if "rotary_cos" not in a else (2e-7 if dtype == np.float32 else 2e-3) * 4
    np.testing.assert_allclose(inputs["k_cache"].astype(np.float64), kc, rtol=tol, atol=tol)
    np.testing.assert_array_equal(inputs["v_cache"].astype(np.float64), vc)
    return out


@pytest.mark.parametrize("backend", ["cpu", "reference"])
@pytest.mark.parametrize("page", [1, 16, 64])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_paged_append(dtype, page, backend):
    a = _make(dtype, batch=3, hq=8, hkv=2, sq=1, n_new=2, cap=130, page=page)
    check_numpy(dtype, a, backend=backend)


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_append_rotary(dtype, interleaved):
    a = _make(dtype, batch=3, hq=4, hkv=2, sq=1, n_new=1, cap=40, rotary_dim=32, interleaved=interleaved)
    check_numpy(dtype, a)


@pytest.mark.parametrize("interleaved", [True, False])
def test_rotary_several_queries(interleaved):
    # causal: query i at cache_seqlens + i; not causal: every query at cache_seqlens (flash-attn's rule)
    for causal in (True, False):
        a = _make(np.float32, batch=2, hq=6, hkv=3, sq=4, n_new=4, cap=40, page=16, rotary_dim=64,
                  interleaved=interleaved)
        check_numpy(np.float32, a, causal=causal)


def test_gqa_causal_more_queries_than_new_tokens():
    a = _make(np.float32, batch=3, hq=8, hkv=1, sq=5, n_new=2, cap=30)
    check_numpy(np.float32, a, causal=True)


def test_no_new_tokens_whole_cache():
    a = _make(np.float32, batch=2, hq=4, hkv=4, n_new=0, cap=33)
    del a["cache_seqlens"]
    check_numpy(np.float32, a)


def test_leftpad_and_batch_idx():
    a = _make(np.float32, batch=4, hq=4, hkv=2, sq=3, n_new=2, cap=50, leftpad=True, batch_idx=True)
    check_numpy(np.float32, a, causal=True)


def test_window_softcap_alibi_scalar_seqlens():
    a = _make(np.float16, batch=2, hq=4, hkv=2, sq=2, n_new=1, cap=64, page=16, seqlens_int=20, leftpad=True)
    slopes = np.array([2.0 ** (-8.0 * (h + 1) / 4) for h in range(4)], np.float32)
    check_numpy(np.float16, a, window_size=(8, 0), softcap=5.0, alibi_slopes=slopes)


# ---- invalid arguments ----

def _expect_error(a, field, status="FA_ERR_INVALID_ARGUMENT", **opts):
    inputs = {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in a.items()}
    with pytest.raises(flashattn.FlashAttnError) as e:
        flashattn.attention_with_kvcache(**inputs, **opts)
    assert e.value.status_name == status and field in str(e.value), str(e.value)
    np.testing.assert_array_equal(inputs["k_cache"], a["k_cache"])  # nothing written
    np.testing.assert_array_equal(inputs["v_cache"], a["v_cache"])


def test_invalid_block_table():
    a = _make(np.float32, batch=3, n_new=1, cap=40, page=16)
    a["block_table"][1, 0] = a["k_cache"].shape[0]
    _expect_error(a, "block_table[1][0]")
    a["block_table"][1, 0] = -1
    _expect_error(a, "block_table[1][0]")


def test_invalid_lengths():
    a = _make(np.float32, batch=3, n_new=2, cap=40)
    a["cache_seqlens"][2] = 39
    _expect_error(a, "cache_seqlens[2]")
    a = _make(np.float32, batch=3, n_new=2, cap=40, leftpad=True)
    a["cache_leftpad"][0] = a["cache_seqlens"][0] + 1
    _expect_error(a, "cache_leftpad[0]")
    a = _make(np.float32, batch=3, n_new=2, cap=40, batch_idx=True)
    a["cache_batch_idx"][1] = a["k_cache"].shape[0]
    _expect_error(a, "cache_batch_idx[1]")


def test_invalid_rotary_and_pages():
    a = _make(np.float32, batch=2, n_new=1, cap=40, rotary_dim=16)
    a["rotary_cos"], a["rotary_sin"] = a["rotary_cos"][:, :4].copy(), a["rotary_sin"][:, :4].copy()
    _expect_error(a, "rotary_dim")
    a = _make(np.float32, batch=2, n_new=1, cap=40, rotary_dim=16)
    a["rotary_cos"], a["rotary_sin"] = a["rotary_cos"][:30].copy(), a["rotary_sin"][:30].copy()
    _expect_error(a, "rotary_seqlen")
    a = _make(np.float32, batch=2, n_new=1, cap=40, page=16)
    a["k_cache"], a["v_cache"] = a["k_cache"][:, :0].copy(), a["v_cache"][:, :0].copy()
    _expect_error(a, "page_size")
    a = _make(np.float32, batch=2, n_new=1, cap=40)
    _expect_error(a, "num_splits", num_splits=-1)
    with pytest.raises(ValueError, match="k and v"):
        flashattn.attention_with_kvcache(a["q"], a["k_cache"], a["v_cache"], k=a["k"])


def test_abi_mirror():
    assert _lib.lib.fa_kvcache_sizeof() == __import__("ctypes").sizeof(_lib.KvCache)


# ---- PyTorch (CPU) ----

torch = pytest.importorskip("torch")


def _torch_round(dtype):
    return lambda x: torch.from_numpy(np.ascontiguousarray(x)).to(dtype).double().numpy()


def _torch_attention(qr, seqs, dtype, causal, scale):
    """The gathered problem computed by PyTorch in dtype (the naive same-dtype implementation)."""
    outs, lses = [], []
    for b, (k, v) in enumerate(seqs):
        q = torch.from_numpy(qr[b]).to(dtype)
        kk = torch.from_numpy(k).to(dtype).repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        vv = torch.from_numpy(v).to(dtype).repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        s = torch.einsum("ihd,jhd->hij", q, kk) * scale
        lq, lk = q.shape[0], kk.shape[0]
        i = torch.arange(lq)[:, None]
        j = torch.arange(lk)[None, :]
        visible = (j <= i + lk - lq) if causal else torch.ones(lq, lk, dtype=torch.bool)
        s = s.masked_fill(~visible, float("-inf"))
        lse = torch.logsumexp(s.double(), dim=-1)
        p = torch.softmax(s.double(), dim=-1).nan_to_num(0.0).to(dtype)
        outs.append(torch.einsum("hij,jhd->ihd", p, vv))
        lses.append(lse)
    return torch.stack(outs).double(), torch.stack(lses)


def _has_gpu():
    return torch.cuda.is_available() and flashattn.backend_built("cuda") and flashattn.device_count() > 0


needs_gpu = pytest.mark.skipif(not _has_gpu(), reason="needs a GPU and a library built with CUDA")


@pytest.mark.parametrize("page", [0, 1, 16, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_gpu)])
def test_torch_paged_rotary_gqa(device, dtype, page):
    if device == "cuda" and dtype == torch.float32:
        pytest.skip("the CUDA decode kernels take f16 and bf16")
    a = _make(np.float32, batch=3, hq=8, hkv=2, sq=3, n_new=3, cap=70, page=page, rotary_dim=32,
              interleaved=page != 16)
    t = {k: (torch.from_numpy(v).to(dtype) if isinstance(v, np.ndarray) and v.dtype == np.float32 else
             torch.from_numpy(v) if isinstance(v, np.ndarray) else v) for k, v in a.items()}
    inputs = {k: (v.clone().to(device) if isinstance(v, torch.Tensor) else v) for k, v in t.items()}
    out, lse = flashattn.flash_attn_with_kvcache(causal=True, return_softmax_lse=True, **inputs)
    inputs = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
    out, lse = out.cpu(), lse.cpu()
    assert out.dtype == dtype and out.shape == t["q"].shape and lse.shape == (3, 8, 3)
    # the problem as the library sees it: the inputs' dtype values, in float64
    a64 = {k: (v.double().numpy() if isinstance(v, torch.Tensor) and v.is_floating_point() else
               v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in t.items()}
    qr, seqs, kc, vc = expected_problem(a64, True, (-1, -1), _torch_round(dtype))
    scale = 1.0 / np.sqrt(qr.shape[-1])
    ref = attention_of(qr, seqs, np.float64, True, scale, (-1, -1), 0.0, None)
    naive, _ = _torch_attention(qr, seqs, dtype, True, scale)
    err = float((out.double() - torch.from_numpy(ref[0])).abs().max())
    base = float((naive - torch.from_numpy(ref[0])).abs().max())
    floor = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1.6e-2}[dtype]
    assert err <= 2 * base + floor * max(1.0, float(np.abs(ref[0]).max())), (err, base)
    assert float((lse.double() - torch.from_numpy(ref[1])).abs().max()) <= 1e-4
    np.testing.assert_array_equal(inputs["v_cache"].double().numpy(), vc)
    assert float(np.abs(inputs["k_cache"].double().numpy() - kc).max()) <= 4 * float(np.abs(kc).max()) * {
        torch.float32: 2**-24, torch.float16: 2**-11, torch.bfloat16: 2**-8}[dtype]


def test_torch_errors_and_scalar_seqlens():
    a = _make(np.float32, batch=2, hq=4, hkv=2, sq=1, n_new=1, cap=32, page=16)
    t = {k: torch.from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in a.items()}
    t["cache_seqlens"] = 10  # an int: every sequence holds 10 tokens
    flashattn.flash_attn_with_kvcache(**t)
    t["block_table"] = t["block_table"].to(torch.int64)
    with pytest.raises(TypeError, match="block_table must be int32"):
        flashattn.flash_attn_with_kvcache(**t)
    t["block_table"] = torch.from_numpy(a["block_table"]).clone()
    t["block_table"][0, 0] = 10**6
    before = t["k_cache"].clone()
    with pytest.raises(flashattn.FlashAttnError, match=r"block_table\[0\]\[0\]"):
        flashattn.flash_attn_with_kvcache(**t)
    assert torch.equal(before, t["k_cache"])


def _torch_inputs(a, dtype, device):
    return {k: ((torch.from_numpy(v).to(dtype) if v.dtype == np.float32 else torch.from_numpy(v)).to(device)
                if isinstance(v, np.ndarray) else v) for k, v in a.items()}


@pytest.mark.parametrize("case", ["paged_append_rotary", "batch_idx_leftpad", "whole_cache_window_alibi"])
@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=needs_gpu)])
def test_torch_prepared_calls_equal_checked_calls(device, case, monkeypatch):
    """Later calls of a signature skip the Python checks and reuse the first call's parameter blocks: with new
    data, new lengths and the cache the previous call appended to, each equals (bit for bit: outputs, lse, the
    cache) a call that builds everything anew; lengths past the cache still fail in the library, naming the
    field, with nothing written (on the GPU with FLASHATTN_DEBUG=1: its kernels trust the int32 arrays)."""
    from flashattn import _lib, _torch as ft
    if device == "cuda":
        monkeypatch.setattr(_lib, "DEBUG", True)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    opts = dict(return_softmax_lse=True, causal=True)
    if case == "paged_append_rotary":
        a = _make(np.float32, batch=3, hq=8, hkv=2, sq=2, n_new=2, cap=70, page=16, rotary_dim=32)
    elif case == "batch_idx_leftpad":
        a = _make(np.float32, batch=3, hq=4, hkv=4, sq=1, n_new=1, cap=40, leftpad=True, batch_idx=True)
    else:
        a = _make(np.float32, batch=2, hq=4, hkv=1, sq=1, n_new=0, cap=50)
        opts = dict(return_softmax_lse=False, window_size=(7, 0), softcap=5.0,
                    alibi_slopes=torch.tensor([0.5, 0.25, 0.125, 0.0625], device=device))
    fast = _torch_inputs(a, dtype, device)
    ft._cache().clear()
    keep = []
    for step in range(3):
        checked = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in fast.items()}
        got = flashattn.flash_attn_with_kvcache(**fast, **opts)
        names = ("q", "k_cache", "v_cache", "k", "v", "rotary_cos", "rotary_sin", "cache_seqlens", "cache_batch_idx",
                 "cache_leftpad", "block_table", "alibi_slopes")
        merged = dict(checked, **{k: v for k, v in opts.items() if k == "alibi_slopes"})
        want = ft._kvcache_call(tuple(merged.get(n) for n in names),
                                (None, opts["causal"] if "causal" in opts else False, opts.get("window_size", (-1, -1)),
                                 opts.get("softcap", 0.0), True, 0, opts["return_softmax_lse"]))[0]
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            assert torch.equal(g, w)
        assert torch.equal(fast["k_cache"], checked["k_cache"]) and torch.equal(fast["v_cache"], checked["v_cache"])
        # the next step: new tensors (new addresses: the old ones stay alive) with new data and lengths
        keep.append(dict(fast))
        for name in ("q", "k", "v"):
            if name in fast:
                fast[name] = torch.randn_like(fast[name])
        cap = (fast["block_table"].shape[1] * fast["k_cache"].shape[1] if "block_table" in fast
               else fast["k_cache"].shape[1])
        n_new = fast["k"].shape[1] if "k" in fast else 0
        fast["cache_seqlens"] = torch.from_numpy(RNG.integers(n_new, cap - n_new + 1, len(fast["q"]))
                                                 .astype(np.int32)).to(device)
        if "cache_leftpad" in fast:
            fast["cache_leftpad"] = torch.minimum(fast["cache_leftpad"], fast["cache_seqlens"])
    assert any(isinstance(v, ft._PreparedDecode) for v in ft._cache().values())
    fast["cache_seqlens"][0] = 10**6
    before = fast["k_cache"].clone()
    with pytest.raises(flashattn.FlashAttnError, match=r"cache_seqlens\[0\]"):
        flashattn.flash_attn_with_kvcache(**fast, **opts)
    assert torch.equal(before, fast["k_cache"])


def test_torch_strided_seqlens_and_list_window_take_the_checked_path():
    """A strided cache_seqlens (the checked call copies it) and an unhashable window_size are not prepared, and
    their calls still run."""
    from flashattn import _torch as ft
    a = _make(np.float32, batch=2, hq=4, hkv=2, sq=1, n_new=0, cap=32)
    t = _torch_inputs(a, torch.float32, "cpu")
    t["cache_seqlens"] = torch.tensor([5, 0, 7, 0], dtype=torch.int32)[::2]
    ft._cache().clear()
    first = flashattn.flash_attn_with_kvcache(**t)
    again = flashattn.flash_attn_with_kvcache(**t, window_size=[-1, -1])
    assert torch.equal(first, again) and torch.equal(first, flashattn.flash_attn_with_kvcache(**t))
    assert not any(isinstance(v, ft._PreparedDecode) for v in ft._cache().values())


@needs_gpu
def test_torch_cuda_f32_unsupported():
    a = _make(np.float32, batch=2, hq=4, hkv=2, sq=1, n_new=1, cap=32)
    t = {k: torch.from_numpy(v).cuda() if isinstance(v, np.ndarray) else v for k, v in a.items()}
    before = t["k_cache"].clone()
    with pytest.raises(flashattn.FlashAttnError) as e:
        flashattn.flash_attn_with_kvcache(**t)
    assert e.value.status_name == "FA_ERR_UNSUPPORTED"
    assert torch.equal(before, t["k_cache"])


@needs_gpu
@pytest.mark.parametrize("num_splits", [0, 1, 3])
def test_torch_cuda_graph_replay_changing_seqlens(num_splits):
    """One decode step (append with rotary, paged cache, GQA 4:1) captured in a CUDA graph and replayed with new
    q, new tokens and new cache_seqlens each time: every replay equals an eager call on the same inputs and the
    float64 computation of the test, so the captured launch reads the lengths from device memory and its split
    count holds for every length."""
    dtype = torch.bfloat16
    a = _make(np.float32, batch=4, hq=16, hkv=4, d=128, sq=1, n_new=1, cap=700, page=16, rotary_dim=64)
    t = {k: (torch.from_numpy(v).to(dtype) if v.dtype == np.float32 else torch.from_numpy(v)).cuda()
         if isinstance(v, np.ndarray) else v for k, v in a.items()}
    opts = dict(return_softmax_lse=True, num_splits=num_splits)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        flashattn.flash_attn_with_kvcache(**t, **opts)  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out, lse = flashattn.flash_attn_with_kvcache(**t, **opts)
    capacity = t["block_table"].shape[1] * t["k_cache"].shape[1]
    for step in range(4):
        with torch.no_grad():
            for name in ("q", "k", "v"):
                t[name].copy_(torch.randn_like(t[name]))
            lens = RNG.integers(0, capacity, 4)
            lens[step % 4] = capacity - 1 if step % 2 else 0
            t["cache_seqlens"].copy_(torch.from_numpy(lens.astype(np.int32)))
        before = {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in t.items()}
        graph.replay()
        torch.cuda.synchronize()
        got_out, got_lse = out.clone(), lse.clone()
        eager_out, eager_lse = flashattn.flash_attn_with_kvcache(**t, **opts)  # rewrites the same rows
        assert torch.equal(got_out, eager_out) and torch.equal(got_lse, eager_lse)
        a64 = {k: (v.double().numpy() if isinstance(v, torch.Tensor) and v.is_floating_point() else
                   v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in before.items()}
        qr, seqs, kc, vc = expected_problem(a64, False, (-1, -1), _torch_round(dtype))
        ref = attention_of(qr, seqs, np.float64, False, 1.0 / np.sqrt(128), (-1, -1), 0.0, None)
        naive, _ = _torch_attention(qr, seqs, dtype, False, 1.0 / np.sqrt(128))
        err = float((got_out.cpu().double() - torch.from_numpy(ref[0])).abs().max())
        base = float((naive - torch.from_numpy(ref[0])).abs().max())
        assert err <= 2 * base + 1.6e-2 * max(1.0, float(np.abs(ref[0]).max())), (step, err, base)
        finite = np.isfinite(ref[1])
        assert np.array_equal(np.isfinite(got_lse.cpu().double().numpy()), finite)
        assert float(np.abs(got_lse.cpu().double().numpy()[finite] - ref[1][finite]).max()) <= 1e-4
        np.testing.assert_array_equal(t["v_cache"].cpu().double().numpy(), vc)
