# SPDX-License-Identifier: Apache-2.0
"""flashattn.attention / attention_backward (numpy, CPU backend) against a float64 numpy reference written
here from the definition in include/flashattn.h. Needs numpy, not torch, nor a GPU.

Tolerance rule (flash-attn's): the error of flashattn against the float64 reference must be at most twice
the error of the same reference computed naively in the input precision, plus a small floor.
"""

import ctypes
import os
import subprocess
import sys

import pytest

np = pytest.importorskip("numpy", reason="numpy is not installed (pip install numpy)")

import flashattn  # noqa: E402
from flashattn import _lib  # noqa: E402


# ---------------------------------------------------------------------------------------------------------
# Reference
# ---------------------------------------------------------------------------------------------------------

def _visible(len_q, len_k, causal, window_left, window_right):
    i = np.arange(len_q)[:, None]
    j = np.arange(len_k)[None, :]
    diag = i + len_k - len_q
    if causal:
        window_right = 0
    left_ok = (j >= diag - window_left) if window_left >= 0 else np.ones_like(j >= 0)
    right_ok = (j <= diag + window_right) if window_right >= 0 else np.ones_like(j >= 0)
    return left_ok & right_ok, np.abs(diag - j)


def _ref_one(q, k, v, dout, causal, scale, window, softcap, slopes, dtype):
    """One sequence: q (len_q, heads_q, d), k/v (len_k, heads_kv, d); computes in `dtype`.
    Returns out, lse (heads_q, len_q) and, if dout is given, dq, dk, dv."""
    q, k, v = (x.astype(dtype) for x in (q, k, v))
    len_q, heads_q, d = q.shape
    len_k, heads_kv, _ = k.shape
    group = heads_q // heads_kv
    kk = np.repeat(k, group, axis=1)
    vv = np.repeat(v, group, axis=1)
    s = dtype(scale) * np.einsum("ihd,jhd->hij", q, kk)
    t = None
    if softcap > 0:
        t = np.tanh(s / dtype(softcap))
        s = dtype(softcap) * t
    visible, dist = _visible(len_q, len_k, causal, *window)
    if slopes is not None:
        s = s - slopes.astype(dtype)[:, None, None] * dist.astype(dtype)[None]
    s = np.where(visible[None], s, dtype(-np.inf))
    m = s.max(axis=2, initial=-np.inf) if len_k else np.full((heads_q, len_q), -np.inf, dtype)
    empty = ~np.isfinite(m)
    m_safe = np.where(empty, 0, m)
    e = np.exp(s - m_safe[:, :, None])
    total = e.sum(axis=2)
    lse = np.where(empty, -np.inf, m_safe + np.log(np.where(empty, 1, total)))
    p = np.where(empty[:, :, None], 0, e / np.where(empty, 1, total)[:, :, None]).astype(dtype)
    out = np.einsum("hij,jhd->ihd", p, vv)
    if dout is None:
        return out, lse
    do = dout.astype(dtype)
    dvv = np.einsum("hij,ihd->jhd", p, do)
    dp = np.einsum("ihd,jhd->hij", do, vv)
    delta = np.einsum("ihd,ihd->hi", do, out)
    ds = p * (dp - delta[:, :, None])
    if t is not None:
        ds = ds * (1 - t * t)
    dq = dtype(scale) * np.einsum("hij,jhd->ihd", ds, kk)
    dkk = dtype(scale) * np.einsum("hij,ihd->jhd", ds, q)
    dk = dkk.reshape(len_k, heads_kv, group, d).sum(axis=2)
    dv = dvv.reshape(len_k, heads_kv, group, d).sum(axis=2)
    return out, lse, dq, dk, dv


def reference(q, k, v, dout=None, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
              alibi_slopes=None, cu_seqlens_q=None, cu_seqlens_k=None, dtype=np.float64):
    """Dense (batch, seqlen, heads, d) or packed varlen; returns out, lse[, dq, dk, dv] in `dtype`
    (lse always float64), with the library's layouts."""
    scale = softmax_scale if softmax_scale is not None else 1.0 / np.sqrt(q.shape[-1])
    varlen = cu_seqlens_q is not None
    if varlen:
        bounds = list(zip(zip(cu_seqlens_q[:-1], cu_seqlens_q[1:]), zip(cu_seqlens_k[:-1], cu_seqlens_k[1:])))
        out = np.zeros(q.shape, dtype)
        lse = np.full((q.shape[1], q.shape[0]), -np.inf)
    else:
        bounds = [None] * q.shape[0]
        out = np.zeros(q.shape, dtype)
        lse = np.full((q.shape[0], q.shape[2], q.shape[1]), -np.inf)
    grads = [np.zeros(x.shape, dtype) for x in (q, k, v)] if dout is not None else None
    for b, bound in enumerate(bounds):
        if varlen:
            (q0, q1), (k0, k1) = bound
            sel_q, sel_k = np.s_[q0:q1], np.s_[k0:k1]
        else:
            sel_q, sel_k = np.s_[b], np.s_[b]
        slopes = None
        if alibi_slopes is not None:
            slopes = alibi_slopes if alibi_slopes.ndim == 1 else alibi_slopes[b]
        res = _ref_one(q[sel_q], k[sel_k], v[sel_k], None if dout is None else dout[sel_q], causal, scale,
                       window_size, softcap, slopes, dtype)
        out[sel_q] = res[0]
        if varlen:
            lse[:, sel_q] = res[1]
        else:
            lse[b] = res[1]
        if dout is not None:
            grads[0][sel_q] += res[2]
            grads[1][sel_k] += res[3]
            grads[2][sel_k] += res[4]
    return (out, lse) if dout is None else (out, lse, *grads)


# ---------------------------------------------------------------------------------------------------------
# Comparison utilities
# ---------------------------------------------------------------------------------------------------------

RNG = np.random.default_rng(20261121)


def randn(shape, dtype):
    return RNG.standard_normal(shape).astype(dtype)


def max_err(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b), initial=0.0))


FLOOR = {np.float32: 1e-5, np.float16: 2e-3}


def assert_2x_naive(name, ours, naive, ref, dtype):
    err, base = max_err(ours, ref), max_err(naive, ref)
    scale = max(1.0, float(np.max(np.abs(ref), initial=0.0)))
    bound = 2 * base + FLOOR[dtype] * scale
    assert err <= bound, f"{name}: error {err:.3g} vs fp64 exceeds 2 x naive error {base:.3g} + floor ({bound:.3g})"


def assert_lse(ours, ref, tol):
    ref_inf = np.isneginf(ref)
    assert np.array_equal(np.isneginf(ours), ref_inf), "lse: -inf rows differ from the reference"
    assert max_err(ours[~ref_inf], ref[~ref_inf]) <= tol


def check_case(dtype, q, k, v, backward=True, **opts):
    """Runs forward (and backward) through flashattn and compares with the fp64 reference."""
    out, lse = flashattn.attention(q, k, v, return_lse=True, **opts)
    assert out.shape == q.shape and out.dtype == q.dtype
    dout = randn(q.shape, dtype)
    ref = reference(q, k, v, dout if backward else None, **opts)
    naive = reference(q, k, v, dout if backward else None, dtype=dtype, **opts)
    assert_2x_naive("out", out, naive[0], ref[0], dtype)
    assert_lse(lse, ref[1], 1e-4 if dtype == np.float32 else 1e-2)
    if backward:
        grads = flashattn.attention_backward(dout, q, k, v, out, lse, **opts)
        for name, g, n, r, x in zip(("dq", "dk", "dv"), grads, naive[2:], ref[2:], (q, k, v)):
            assert g.shape == x.shape and g.dtype == x.dtype, name
            assert_2x_naive(name, g, n, r, dtype)
    return out, lse


def alibi(heads, batch=None):
    slopes = np.array([2.0 ** (-8.0 * (h + 1) / heads) for h in range(heads)], np.float32)
    if batch is None:
        return slopes
    return np.stack([slopes * (1.0 + 0.25 * b) for b in range(batch)]).astype(np.float32)


# ---------------------------------------------------------------------------------------------------------
# Package and library
# ---------------------------------------------------------------------------------------------------------

def test_version_and_build_info():
    assert flashattn.version() == "0.2.0"
    assert _lib.lib.fa_version_number() == _lib.VERSION_NUMBER
    assert "cpu" in flashattn.build_info()
    assert flashattn.backend_built("cpu") and flashattn.backend_built("reference")
    assert os.path.exists(flashattn.library_path)
    assert flashattn.device_count() >= 0


def test_struct_sizes_match_library():
    assert _lib.lib.fa_params_sizeof() == ctypes.sizeof(_lib.Params)
    assert _lib.lib.fa_exec_sizeof() == ctypes.sizeof(_lib.Exec)


def test_numpy_path_does_not_import_torch():
    code = ("import sys, numpy as np, flashattn\n"
            "q = np.ones((1, 2, 1, 8), np.float32)\n"
            "flashattn.attention(q, q, q)\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.dirname(flashattn.__file__))]
                                                          + sys.path))
    subprocess.run([sys.executable, "-c", code], check=True, env=env)


def test_library_errors_carry_detail():
    p = _lib.new_params(_lib.FA_F32, 1, 4, 4, 2, 2, 8)  # tensors left NULL
    with pytest.raises(flashattn.FlashAttnError) as info:
        _lib.call("fa_check", ctypes.byref(p), None, 0)
    e = info.value
    assert e.status == _lib.FA_ERR_INVALID_ARGUMENT
    assert e.status_name == "FA_ERR_INVALID_ARGUMENT"
    assert e.detail and e.detail in str(e)
    assert "invalid argument" in str(e)


# ---------------------------------------------------------------------------------------------------------
# Numerics
# ---------------------------------------------------------------------------------------------------------

SHAPES = [
    # batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim
    (2, 17, 17, 4, 4, 32),
    (1, 33, 70, 4, 2, 64),   # GQA, seqlen_q < seqlen_k
    (2, 40, 9, 3, 1, 16),    # MQA, seqlen_q > seqlen_k
    (1, 1, 65, 2, 2, 128),   # decode-like
    (1, 70, 1, 2, 1, 40),    # a single key
]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_forward_backward_f32(shape, causal):
    b, sq, sk, hq, hkv, d = shape
    q, k, v = randn((b, sq, hq, d), np.float32), randn((b, sk, hkv, d), np.float32), randn((b, sk, hkv, d), np.float32)
    check_case(np.float32, q, k, v, causal=causal)


@pytest.mark.parametrize("window", [(4, 0), (3, 5), (-1, 2), (0, 0), (8, -1)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_windows(window, causal):
    q, k, v = randn((2, 24, 2, 32), np.float32), randn((2, 31, 1, 32), np.float32), randn((2, 31, 1, 32), np.float32)
    check_case(np.float32, q, k, v, causal=causal, window_size=window)


@pytest.mark.parametrize("softcap", [0.0, 2.0, 30.0])
def test_softcap(softcap):
    q, k, v = (randn((1, 20, 2, 64), np.float32) * 3 for _ in range(3))
    check_case(np.float32, q, k, v, causal=True, softcap=softcap)


@pytest.mark.parametrize("per_batch", [False, True], ids=["heads", "batch_heads"])
def test_alibi(per_batch):
    b, h = 2, 4
    q, k, v = randn((b, 19, h, 32), np.float32), randn((b, 27, 2, 32), np.float32), randn((b, 27, 2, 32), np.float32)
    slopes = alibi(h, b if per_batch else None)
    check_case(np.float32, q, k, v, causal=True, alibi_slopes=slopes)
    check_case(np.float32, q, k, v, window_size=(5, 3), softcap=5.0, alibi_slopes=slopes)


def test_softmax_scale():
    q, k, v = (randn((1, 12, 2, 32), np.float32) for _ in range(3))
    check_case(np.float32, q, k, v, softmax_scale=0.3)
    check_case(np.float32, q, k, v, softmax_scale=-0.05, causal=True)


def test_float16():
    q, k, v = randn((2, 37, 4, 64), np.float16), randn((2, 45, 2, 64), np.float16), randn((2, 45, 2, 64), np.float16)
    check_case(np.float16, q, k, v, causal=True)
    check_case(np.float16, q, k, v, window_size=(7, 7), softcap=10.0)


def test_empty_rows_are_zero_with_minus_inf_lse():
    # seqlen_q > seqlen_k with causal: the first seqlen_q - seqlen_k query rows see no key.
    q, k, v = randn((1, 9, 2, 16), np.float32), randn((1, 4, 2, 16), np.float32), randn((1, 4, 2, 16), np.float32)
    out, lse = check_case(np.float32, q, k, v, causal=True)
    assert np.all(out[:, :5] == 0)
    assert np.all(np.isneginf(lse[:, :, :5]))
    assert np.all(np.isfinite(lse[:, :, 5:]))
    dout = randn(q.shape, np.float32)
    dq, dk, dv = flashattn.attention_backward(dout, q, k, v, out, lse, causal=True)
    assert np.all(dq[:, :5] == 0)
    # A window that excludes every key of some rows, without causal: row i sees keys j <= i - 5 + 2.
    out, lse = check_case(np.float32, q, k, v, window_size=(-1, 2))
    assert np.all(out[:, :3] == 0) and np.all(np.isneginf(lse[:, :, :3]))
    assert np.all(np.isfinite(lse[:, :, 3:]))


def test_non_contiguous_inputs():
    base_q = randn((2, 4, 21, 32), np.float32)  # (batch, heads, seqlen, d): seqlen and heads swapped
    base_kv = randn((2, 29, 2, 2, 32), np.float32)  # packed k and v
    q = base_q.swapaxes(1, 2)
    k, v = base_kv[:, :, 0], base_kv[:, :, 1]
    assert not q.flags.c_contiguous and not k.flags.c_contiguous
    out = check_case(np.float32, q, k, v, causal=True, window_size=(6, -1))[0]
    dense = flashattn.attention(np.ascontiguousarray(q), np.ascontiguousarray(k), np.ascontiguousarray(v),
                                causal=True, window_size=(6, -1))
    np.testing.assert_array_equal(out, dense)


def test_reference_backend_agrees():
    q, k, v = randn((2, 21, 4, 32), np.float32), randn((2, 25, 2, 32), np.float32), randn((2, 25, 2, 32), np.float32)
    a, la = flashattn.attention(q, k, v, causal=True, return_lse=True)
    b, lb = flashattn.attention(q, k, v, causal=True, return_lse=True, backend="reference")
    assert max_err(a, b) < 1e-5 and max_err(la, lb) < 1e-5


def varlen_batch(lens_q, lens_k, hq, hkv, d, dtype):
    cu_q = np.concatenate([[0], np.cumsum(lens_q)]).astype(np.int32)
    cu_k = np.concatenate([[0], np.cumsum(lens_k)]).astype(np.int32)
    q = randn((cu_q[-1], hq, d), dtype)
    k, v = randn((cu_k[-1], hkv, d), dtype), randn((cu_k[-1], hkv, d), dtype)
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen(causal):
    q, k, v, cu_q, cu_k = varlen_batch([5, 1, 17, 8, 0], [9, 4, 17, 3, 6], 4, 2, 32, np.float32)
    out, lse = check_case(np.float32, q, k, v, causal=causal, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert lse.shape == (4, q.shape[0])
    check_case(np.float32, q, k, v, causal=causal, window_size=(3, 2), softcap=4.0, alibi_slopes=alibi(4),
               cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)


def test_varlen_empty_keys():
    # The second sequence has no key: its rows are zero with lse = -inf, and its gradients are zero.
    q, k, v, cu_q, cu_k = varlen_batch([4, 3, 2], [5, 0, 6], 2, 2, 16, np.float32)
    out, lse = check_case(np.float32, q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert np.all(out[4:7] == 0) and np.all(np.isneginf(lse[:, 4:7]))
    dq = flashattn.attention_backward(randn(q.shape, np.float32), q, k, v, out, lse, cu_seqlens_q=cu_q,
                                      cu_seqlens_k=cu_k)[0]
    assert np.all(dq[4:7] == 0)


def test_varlen_matches_dense():
    q, k, v = randn((3, 11, 2, 32), np.float32), randn((3, 14, 2, 32), np.float32), randn((3, 14, 2, 32), np.float32)
    cu_q = np.arange(0, 34, 11, dtype=np.int32)
    cu_k = np.arange(0, 43, 14, dtype=np.int32)
    dense = flashattn.attention(q, k, v, causal=True)
    packed = flashattn.attention(q.reshape(33, 2, 32), k.reshape(42, 2, 32), v.reshape(42, 2, 32), causal=True,
                                 cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert max_err(dense.reshape(33, 2, 32), packed) < 1e-5


def test_varlen_padding_rows_past_the_end():
    # total_q larger than cu_seqlens_q[-1]: trailing rows belong to no sequence; the others are unaffected.
    q, k, v, cu_q, cu_k = varlen_batch([3, 4], [5, 2], 2, 1, 16, np.float32)
    pad = np.full((2, 2, 16), np.nan, np.float32)
    out = flashattn.attention(np.concatenate([q, pad]), k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)
    assert max_err(out[:7], reference(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k)[0]) < 1e-5


def test_deterministic_backward_is_reproducible():
    q, k, v = randn((2, 33, 4, 32), np.float32), randn((2, 40, 2, 32), np.float32), randn((2, 40, 2, 32), np.float32)
    out, lse = flashattn.attention(q, k, v, causal=True, return_lse=True)
    dout = randn(q.shape, np.float32)
    a = flashattn.attention_backward(dout, q, k, v, out, lse, causal=True, deterministic=True)
    b = flashattn.attention_backward(dout, q, k, v, out, lse, causal=True, deterministic=True)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)


def test_no_keys():
    # seqlen_k = 0 (dense) or total_k = 0 (varlen): every row is empty.
    q, k = randn((2, 3, 2, 16), np.float32), np.zeros((2, 0, 1, 16), np.float32)
    out, lse = flashattn.attention(q, k, k, return_lse=True)
    assert np.all(out == 0) and np.all(np.isneginf(lse))
    dq, dk, dv = flashattn.attention_backward(q, q, k, k, out, lse)
    assert np.all(dq == 0) and dk.shape == k.shape and dv.shape == k.shape
    cu_q, cu_k = np.array([0, 2, 6], np.int32), np.zeros(3, np.int32)
    out, lse = flashattn.attention(q.reshape(6, 2, 16), k[0], k[0], cu_seqlens_q=cu_q, cu_seqlens_k=cu_k,
                                   return_lse=True)
    assert np.all(out == 0) and np.all(np.isneginf(lse))


def test_zero_length_batch():
    q = np.zeros((0, 5, 2, 16), np.float32)
    out, lse = flashattn.attention(q, q, q, return_lse=True)
    assert out.shape == q.shape and lse.shape == (0, 2, 5)


# ---------------------------------------------------------------------------------------------------------
# Bad inputs: every message names the argument
# ---------------------------------------------------------------------------------------------------------

def _qkv(dtype=np.float32, b=1, sq=4, sk=6, hq=2, hkv=2, d=16):
    return randn((b, sq, hq, d), dtype), randn((b, sk, hkv, d), dtype), randn((b, sk, hkv, d), dtype)


def test_bad_dtype():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="q must be float32"):
        flashattn.attention(q.astype(np.float64), k, v)
    with pytest.raises(TypeError, match="^k has dtype float16"):
        flashattn.attention(q, k.astype(np.float16), v)
    with pytest.raises(TypeError, match="q must be a numpy.ndarray"):
        flashattn.attention(q.tolist(), k, v)


def test_bad_shapes():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="q must be 4-D"):
        flashattn.attention(q[0], k, v)
    with pytest.raises(ValueError, match="v must have the shape of k"):
        flashattn.attention(q, k, v[:, :3])
    with pytest.raises(ValueError, match="k has batch"):
        flashattn.attention(q, np.concatenate([k, k]), np.concatenate([v, v]))
    with pytest.raises(ValueError, match="k has head_dim"):
        flashattn.attention(q, k[..., :8], v[..., :8])
    q3, k2, v2 = _qkv(hq=3, hkv=2)
    with pytest.raises(ValueError, match=r"q's heads \(3\) must be a multiple"):
        flashattn.attention(q3, k2, v2)


def test_last_dim_must_be_contiguous():
    q, k, v = _qkv()
    vt = np.asfortranarray(v)
    with pytest.raises(ValueError, match="v must be contiguous in its last dimension"):
        flashattn.attention(q, k, vt)


def test_bad_options():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="window_size"):
        flashattn.attention(q, k, v, window_size=3)
    with pytest.raises(ValueError, match="softcap"):
        flashattn.attention(q, k, v, softcap=-1.0)
    with pytest.raises(ValueError, match="softmax_scale"):
        flashattn.attention(q, k, v, softmax_scale=float("nan"))
    with pytest.raises(ValueError, match="alibi_slopes must have shape"):
        flashattn.attention(q, k, v, alibi_slopes=np.ones(3, np.float32))
    with pytest.raises(TypeError, match="alibi_slopes must be float32"):
        flashattn.attention(q, k, v, alibi_slopes=np.ones(2, np.float64))
    with pytest.raises(ValueError, match="backend"):
        flashattn.attention(q, k, v, backend="cuda")
    q20, k20, v20 = _qkv(d=20)
    with pytest.raises(flashattn.FlashAttnError, match="head_dim") as info:  # judged by the library
        flashattn.attention(q20, k20, v20)
    assert info.value.status == _lib.FA_ERR_UNSUPPORTED


def test_bad_varlen():
    q, k, v, cu_q, cu_k = varlen_batch([3, 4], [5, 2], 2, 1, 16, np.float32)
    with pytest.raises(ValueError, match="cu_seqlens_q and cu_seqlens_k must be given together"):
        flashattn.attention(q, k, v, cu_seqlens_q=cu_q)
    with pytest.raises(ValueError, match="cu_seqlens_k must be non-decreasing"):
        flashattn.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=np.array([0, 6, 5], np.int32))
    with pytest.raises(ValueError, match="cu_seqlens_q must start at 0"):
        flashattn.attention(q, k, v, cu_seqlens_q=cu_q + 1, cu_seqlens_k=cu_k)
    with pytest.raises(ValueError, match=r"cu_seqlens_k\[-1\] \(8\) exceeds"):
        flashattn.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=np.array([0, 5, 8], np.int32))
    with pytest.raises(ValueError, match="cu_seqlens_q has 3 entries but cu_seqlens_k has 2"):
        flashattn.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k[:2])
    with pytest.raises(ValueError, match="max_seqlen_q"):
        flashattn.attention(q, k, v, cu_seqlens_q=cu_q, cu_seqlens_k=cu_k, max_seqlen_q=2)
    with pytest.raises(TypeError, match="cu_seqlens_q must hold integers"):
        flashattn.attention(q, k, v, cu_seqlens_q=cu_q.astype(np.float32), cu_seqlens_k=cu_k)


def test_bad_backward_inputs():
    q, k, v = _qkv()
    out, lse = flashattn.attention(q, k, v, return_lse=True)
    with pytest.raises(ValueError, match="dout must have q's shape"):
        flashattn.attention_backward(out[:, :2], q, k, v, out, lse)
    with pytest.raises(ValueError, match="lse must have shape"):
        flashattn.attention_backward(out, q, k, v, out, lse[:, :1])
    with pytest.raises(TypeError, match="lse must be float32"):
        flashattn.attention_backward(out, q, k, v, out, lse.astype(np.float64))
    with pytest.raises(TypeError, match="out has dtype"):
        flashattn.attention_backward(out, q, k, v, out.astype(np.float16), lse)


def test_thread_counts_agree():
    q, k, v = randn((2, 50, 4, 64), np.float32), randn((2, 61, 2, 64), np.float32), randn((2, 61, 2, 64), np.float32)
    one = flashattn.attention(q, k, v, causal=True, num_threads=1)
    two = flashattn.attention(q, k, v, causal=True, num_threads=2)
    assert max_err(one, two) < 1e-6


def test_integers_range_checked_before_c():
    # ctypes keeps the low 32 bits: 2**32 + 1 threads would reach the library as 1
    q, k, v = _qkv()
    for bad in (2**32 + 1, -1, 2**31, 1.5):
        with pytest.raises(ValueError, match="num_threads"):
            flashattn.attention(q, k, v, num_threads=bad)
    from flashattn import _common
    with pytest.raises(ValueError, match="heads_q"):
        _common.dense_sizes((1, 4, 2**32 + 2, 8), (1, 4, 2, 8), (1, 4, 2, 8))
    with pytest.raises(ValueError, match="total_q"):
        _common.varlen_sizes((2**31, 2, 8), (4, 2, 8), (4, 2, 8), (2,), (2,))
