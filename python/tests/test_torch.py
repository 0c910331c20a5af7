# SPDX-License-Identifier: Apache-2.0
"""The PyTorch binding against torch.nn.functional.scaled_dot_product_attention in float64 on the same inputs:
forward, LSE and gradients (causal, GQA, windows, ALiBi, varlen), on CPU tensors (CPU backend) and CUDA
tensors (CUDA backend); torch.compile(fullgraph=True) of a small attention module; torch.library.opcheck.

Skipped without PyTorch; the CUDA tests are skipped without a GPU or a library built with CUDA.
Tolerance rule (flash-attn's): error(flashattn vs fp64) <= 2 * error(SDPA's math backend in the same
precision vs fp64) + a small floor, for out and for each gradient. The math backend runs with reduced-precision
reductions allowed, so that it really computes in fp16/bf16 (by default it upcasts to fp32).

Note: SDPA's is_causal is aligned top-left; flashattn (like flash-attn >= 2.1) aligns bottom-right, so the
reference always passes an explicit bottom-right boolean mask.
"""

import contextlib
import ctypes
import shutil
import warnings

import pytest

torch = pytest.importorskip("torch", reason="PyTorch is not installed: the PyTorch binding tests need it")

import torch.nn.functional as F  # noqa: E402
from torch.nn.attention import SDPBackend, sdpa_kernel  # noqa: E402

import flashattn  # noqa: E402
from flashattn import _lib, flash_attn_func, flash_attn_varlen_func  # noqa: E402

if not torch.cuda.is_available():
    _NO_CUDA = "no CUDA device visible to PyTorch"
elif not flashattn.backend_built("cuda"):
    _NO_CUDA = "libflashattn was built without CUDA (nvcc not found or FA_CUDA=0)"
elif flashattn.device_count() == 0:
    _NO_CUDA = "libflashattn sees no usable CUDA device"
else:
    _NO_CUDA = None

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(_NO_CUDA is not None, reason=str(_NO_CUDA)))]
needs_cuda = pytest.mark.skipif(_NO_CUDA is not None, reason=str(_NO_CUDA))

FLOOR = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}


# ---------------------------------------------------------------------------------------------------------
# References
# ---------------------------------------------------------------------------------------------------------

def bottom_right_mask(len_q, len_k, causal, window_size, device):
    """Boolean (len_q, len_k) mask, True = visible, and the ALiBi distances |i + len_k - len_q - j|."""
    i = torch.arange(len_q, device=device)[:, None]
    j = torch.arange(len_k, device=device)[None, :]
    diag = i + len_k - len_q
    left, right = window_size
    if causal:
        right = 0
    mask = torch.ones(len_q, len_k, dtype=torch.bool, device=device)
    if left >= 0:
        mask &= j >= diag - left
    if right >= 0:
        mask &= j <= diag + right
    return mask, (diag - j).abs()


def sdpa_reference(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1), alibi_slopes=None,
                   dtype=torch.float64):
    """SDPA on (batch, seqlen, heads, d) inputs computed in `dtype` (differentiable w.r.t. q, k, v).
    GQA through repeat_interleave; rows that see no key give 0 (and no gradient)."""
    hq, hkv = q.shape[2], k.shape[2]
    qt = q.to(dtype).transpose(1, 2)
    kt = k.to(dtype).transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    vt = v.to(dtype).transpose(1, 2).repeat_interleave(hq // hkv, dim=1)
    mask, dist = bottom_right_mask(q.shape[1], k.shape[1], causal, window_size, q.device)
    has_key = mask.any(dim=-1)
    safe = mask | ~has_key[:, None]  # SDPA would give NaN for rows without keys
    attn_mask = safe
    if alibi_slopes is not None:
        slopes = alibi_slopes.to(dtype)
        slopes = slopes[None, :, None, None] if slopes.dim() == 1 else slopes[:, :, None, None]
        attn_mask = (-slopes * dist.to(dtype)).masked_fill(~safe, float("-inf"))
    out = F.scaled_dot_product_attention(qt, kt, vt, attn_mask=attn_mask, scale=softmax_scale)
    out = out * has_key[:, None].to(dtype)
    return out.transpose(1, 2)


def manual_reference(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0,
                     alibi_slopes=None):
    """float64 attention written out (for softcap, which SDPA lacks, and for the LSE). Returns out, lse."""
    hq, hkv, d = q.shape[2], k.shape[2], q.shape[3]
    scale = softmax_scale if softmax_scale is not None else d ** -0.5
    q64 = q.double()
    k64 = k.double().repeat_interleave(hq // hkv, dim=2)
    v64 = v.double().repeat_interleave(hq // hkv, dim=2)
    s = torch.einsum("bqhd,bkhd->bhqk", q64, k64) * scale
    if softcap > 0:
        s = softcap * torch.tanh(s / softcap)
    mask, dist = bottom_right_mask(q.shape[1], k.shape[1], causal, window_size, q.device)
    if alibi_slopes is not None:
        slopes = alibi_slopes.double()
        slopes = slopes[None, :, None, None] if slopes.dim() == 1 else slopes[:, :, None, None]
        s = s - slopes * dist.double()
    s = s.masked_fill(~mask, float("-inf"))
    lse = torch.logsumexp(s, dim=-1)
    p = torch.exp(s - lse[..., None]).nan_to_num(0.0)  # rows without keys: exp(-inf - -inf) = nan -> 0
    return torch.einsum("bhqk,bkhd->bqhd", p, v64), lse


@contextlib.contextmanager
def naive_low_precision():
    """SDPA's math backend, computing in the inputs' precision."""
    allow = getattr(torch.backends.cuda, "allow_fp16_bf16_reduction_math_sdp", None)
    previous = torch.backends.cuda.fp16_bf16_reduction_math_sdp_allowed() if allow else None
    if allow:
        allow(True)
    try:
        with sdpa_kernel(SDPBackend.MATH):
            yield
    finally:
        if allow:
            allow(previous)


def max_err(a, b):
    return (a.double() - b.double()).abs().max().item() if a.numel() else 0.0


def assert_2x_naive(name, ours, naive, ref, dtype):
    err, base = max_err(ours, ref), max_err(naive, ref)
    scale = max(1.0, ref.abs().max().item() if ref.numel() else 0.0)
    bound = 2 * base + FLOOR[dtype] * scale
    assert err <= bound, f"{name}: error {err:.3g} vs fp64 exceeds 2 x naive error {base:.3g} + floor ({bound:.3g})"


def assert_same(a, b):
    """Bitwise equal on the CPU; on the GPU the kernel chosen may depend on strides and alignment (and dQ is
    accumulated with atomics), so agreement to within a few units of the last place is asked for instead."""
    if a.device.type == "cpu":
        assert torch.equal(a, b)
    else:
        assert max_err(a, b) <= 2e-2 * max(1.0, b.abs().max().item())


def leaf(x, dtype=None):
    return x.detach().clone().to(dtype or x.dtype).requires_grad_(True)


def run_with_grads(fn, q, k, v, dout, dtype=None):
    q, k, v = leaf(q, dtype), leaf(k, dtype), leaf(v, dtype)
    out = fn(q, k, v)
    out.backward(dout.to(out.dtype))
    return out.detach(), q.grad, k.grad, v.grad


def compare_with_sdpa(device, dtype, shape, causal=False, window_size=(-1, -1), alibi=None, softmax_scale=None,
                      seed=0):
    """Forward + gradients of flash_attn_func vs SDPA in fp64, with the 2x-naive rule."""
    b, sq, sk, hq, hkv, d = shape
    g = torch.Generator(device="cpu").manual_seed(seed)
    q = torch.randn(b, sq, hq, d, generator=g).to(device, dtype)
    k = torch.randn(b, sk, hkv, d, generator=g).to(device, dtype)
    v = torch.randn(b, sk, hkv, d, generator=g).to(device, dtype)
    dout = torch.randn(b, sq, hq, d, generator=g).to(device, dtype)
    slopes = None
    if alibi is not None:
        slopes = torch.tensor([2.0 ** (-8.0 * (h + 1) / hq) for h in range(hq)], device=device)
        if alibi == "batch":
            slopes = torch.stack([slopes * (1 + 0.5 * i) for i in range(b)])
    opts = dict(causal=causal, window_size=window_size, softmax_scale=softmax_scale)
    ours = run_with_grads(lambda q, k, v: flash_attn_func(q, k, v, alibi_slopes=slopes, **opts), q, k, v, dout)
    ref = run_with_grads(lambda q, k, v: sdpa_reference(q, k, v, alibi_slopes=slopes, **opts), q, k, v, dout,
                         torch.float64)
    with naive_low_precision():
        naive = run_with_grads(lambda q, k, v: sdpa_reference(q, k, v, alibi_slopes=slopes, dtype=dtype, **opts),
                               q, k, v, dout)
    for name, o, n, r, x in zip(("out", "dq", "dk", "dv"), ours, naive, ref, (q, q, k, v)):
        assert o.shape == x.shape and o.dtype == dtype and o.device == x.device, name
        assert torch.isfinite(o).all(), f"{name} has non-finite values"
        assert_2x_naive(name, o, n, r, dtype)
    return q, k, v, ours


SHAPES = [
    # batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim
    (2, 64, 64, 4, 4, 64),
    (1, 33, 91, 4, 2, 64),     # GQA, seqlen_q < seqlen_k
    (2, 77, 20, 6, 1, 32),     # MQA, seqlen_q > seqlen_k: the first rows see no key when causal
    (1, 1, 130, 2, 2, 128),    # one query row
    (1, 129, 129, 2, 1, 128),
]
SHAPE_IDS = ["x".join(map(str, s)) for s in SHAPES]


# ---------------------------------------------------------------------------------------------------------
# CPU and CUDA numerics
# ---------------------------------------------------------------------------------------------------------

def _dtypes(device):
    return [torch.float32, torch.bfloat16] if device == "cpu" else [torch.float16, torch.bfloat16]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES, ids=SHAPE_IDS)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_against_sdpa(device, shape, causal):
    for dtype in _dtypes(device):
        compare_with_sdpa(device, dtype, shape, causal=causal)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("window_size", [(16, 0), (8, 8), (-1, 4), (0, -1)])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_windows_against_sdpa(device, window_size, causal):
    for dtype in _dtypes(device):
        compare_with_sdpa(device, dtype, (2, 70, 90, 4, 2, 64), causal=causal, window_size=window_size)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("alibi", ["heads", "batch"])
def test_alibi_against_sdpa(device, alibi):
    for dtype in _dtypes(device):
        compare_with_sdpa(device, dtype, (2, 50, 61, 4, 2, 64), causal=True, alibi=alibi)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("head_dim", [59, 89, 20, 111, 40, 80])
def test_head_dim_padding(device, head_dim):
    """A head_dim the backend has no kernel for is zero-padded in Python; the scale stays 1/sqrt(head_dim)."""
    compare_with_sdpa(device, _dtypes(device)[0], (1, 45, 50, 4, 2, head_dim), causal=True)


@pytest.mark.parametrize("device", DEVICES)
def test_misaligned_views(device):
    """Views at an odd element offset, and with strides that are not multiples of 8 elements."""
    dtype = _dtypes(device)[0]
    flat = torch.randn(1 + 2 * 33 * 2 * 64, device=device, dtype=dtype)
    q = flat[1:].view(2, 33, 2, 64)
    wide = torch.randn(2, 40, 2, 68, device=device, dtype=dtype)
    k, v = wide[..., :64], wide[..., 4:]
    out = flash_attn_func(q, k, v, causal=True)
    assert_same(out, flash_attn_func(q.clone(), k.contiguous(), v.contiguous(), causal=True))


@pytest.mark.parametrize("device", DEVICES)
def test_softmax_scale(device):
    compare_with_sdpa(device, _dtypes(device)[0], (1, 40, 40, 2, 2, 64), softmax_scale=0.05)


@pytest.mark.parametrize("device", DEVICES)
def test_softcap_and_lse(device):
    dtype = _dtypes(device)[0]
    g = torch.Generator().manual_seed(1)
    q = (3 * torch.randn(1, 45, 4, 64, generator=g)).to(device, dtype)
    k = (3 * torch.randn(1, 52, 2, 64, generator=g)).to(device, dtype)
    v = torch.randn(1, 52, 2, 64, generator=g).to(device, dtype)
    for softcap in (0.0, 5.0):
        out, lse, probs = flash_attn_func(q, k, v, causal=True, softcap=softcap, return_attn_probs=True)
        assert probs is None and lse.dtype == torch.float32 and lse.shape == (1, 4, 45)
        ref_out, ref_lse = manual_reference(q, k, v, causal=True, softcap=softcap)
        assert max_err(out, ref_out) <= 2e-2 * max(1.0, ref_out.abs().max().item())
        assert max_err(lse, ref_lse) <= 2e-2
    # gradients through softcap, against autograd of the manual fp64 reference
    ql, kl, vl = leaf(q), leaf(k), leaf(v)
    flash_attn_func(ql, kl, vl, softcap=5.0).sum().backward()
    qr, kr, vr = leaf(q, torch.float64), leaf(k, torch.float64), leaf(v, torch.float64)
    manual_reference(qr, kr, vr, softcap=5.0)[0].sum().backward()
    for name, a, b in (("dq", ql.grad, qr.grad), ("dk", kl.grad, kr.grad), ("dv", vl.grad, vr.grad)):
        assert max_err(a, b) <= 3e-2 * max(1.0, b.abs().max().item()), name


@pytest.mark.parametrize("device", DEVICES)
def test_empty_rows(device):
    dtype = _dtypes(device)[0]
    q = torch.randn(1, 10, 2, 64, device=device, dtype=dtype)
    k = torch.randn(1, 4, 2, 64, device=device, dtype=dtype)
    out, lse, _ = flash_attn_func(q, k, k, causal=True, return_attn_probs=True)
    assert (out[:, :6] == 0).all()
    assert torch.isneginf(lse[:, :, :6]).all() and torch.isfinite(lse[:, :, 6:]).all()


@pytest.mark.parametrize("device", DEVICES)
def test_no_keys(device):
    dtype = _dtypes(device)[0]
    q = torch.randn(2, 5, 2, 64, device=device, dtype=dtype, requires_grad=True)
    k = torch.zeros(2, 0, 1, 64, device=device, dtype=dtype, requires_grad=True)
    out, lse, _ = flash_attn_func(q, k, k, return_attn_probs=True)
    assert (out == 0).all() and torch.isneginf(lse).all()
    out.sum().backward()
    assert (q.grad == 0).all() and k.grad.shape == k.shape


@pytest.mark.parametrize("device", DEVICES)
def test_strided_inputs(device):
    """q, k, v as views into a packed qkv tensor (strides passed through, no copies), and a transposed q."""
    dtype = _dtypes(device)[0]
    qkv = torch.randn(2, 50, 3, 4, 64, device=device, dtype=dtype)
    q, k, v = qkv.unbind(2)
    out = flash_attn_func(q, k, v, causal=True)
    ref = flash_attn_func(q.contiguous(), k.contiguous(), v.contiguous(), causal=True)
    assert_same(out, ref)
    packed = flashattn.flash_attn_qkvpacked_func(qkv, causal=True)
    assert_same(packed, ref)
    qt = torch.randn(2, 4, 50, 64, device=device, dtype=dtype).transpose(1, 2)  # (b, s, h, d) view
    assert_same(flash_attn_func(qt, k, v), flash_attn_func(qt.contiguous(), k, v))


def _varlen_inputs(lens_q, lens_k, hq, hkv, d, device, dtype, g):
    """cu_seqlens_q/k and packed q, k, v of random values for the given sequence lengths."""
    cu_q = torch.tensor([0] + list(torch.tensor(lens_q).cumsum(0)), dtype=torch.int32, device=device)
    cu_k = torch.tensor([0] + list(torch.tensor(lens_k).cumsum(0)), dtype=torch.int32, device=device)
    q = torch.randn(sum(lens_q), hq, d, generator=g).to(device, dtype)
    k = torch.randn(sum(lens_k), hkv, d, generator=g).to(device, dtype)
    v = torch.randn(sum(lens_k), hkv, d, generator=g).to(device, dtype)
    return cu_q, cu_k, q, k, v


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_varlen_against_sdpa(device, causal):
    lens_q, lens_k = [17, 1, 64, 30], [17, 40, 50, 0]
    hq, hkv, d = 4, 2, 64
    for dtype in _dtypes(device):
        g = torch.Generator().manual_seed(2)
        cu_q, cu_k, q, k, v = _varlen_inputs(lens_q, lens_k, hq, hkv, d, device, dtype, g)
        dout = torch.randn(sum(lens_q), hq, d, generator=g).to(device, dtype)
        window = (20, 3)

        def ours_fn(q, k, v):
            return flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                          window_size=window)

        def ref_fn(dtype_):
            def f(q, k, v):
                outs = []
                for i in range(len(lens_q)):
                    sq, sk = slice(cu_q[i], cu_q[i + 1]), slice(cu_k[i], cu_k[i + 1])
                    outs.append(sdpa_reference(q[None, sq], k[None, sk], v[None, sk], causal=causal,
                                               window_size=window, dtype=dtype_)[0])
                return torch.cat(outs)
            return f

        ours = run_with_grads(ours_fn, q, k, v, dout)
        ref = run_with_grads(ref_fn(torch.float64), q, k, v, dout, torch.float64)
        with naive_low_precision():
            naive = run_with_grads(ref_fn(dtype), q, k, v, dout)
        for name, o, n, r in zip(("out", "dq", "dk", "dv"), ours, naive, ref):
            assert_2x_naive(name, o, n, r, dtype)
        # the sequence without keys: zero output, lse = -inf
        out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), return_attn_probs=True)
        assert lse.shape == (hq, sum(lens_q))
        tail = slice(cu_q[3].item(), cu_q[4].item())
        assert (out[tail] == 0).all() and torch.isneginf(lse[:, tail]).all()


@pytest.mark.parametrize("device", DEVICES)
def test_varlen_matches_dense(device):
    dtype = _dtypes(device)[0]
    q, k, v = (torch.randn(3, 40, 2, 64, device=device, dtype=dtype) for _ in range(3))
    cu = torch.arange(0, 121, 40, dtype=torch.int32, device=device)
    dense = flash_attn_func(q, k, v, causal=True)
    packed = flash_attn_varlen_func(q.flatten(0, 1), k.flatten(0, 1), v.flatten(0, 1), cu, cu, 40, 40, causal=True)
    assert max_err(dense.flatten(0, 1), packed) <= 1e-2


def _paged_copy(k, cu_k, page_size, num_pages, perm):
    """k (total_k, h, d) scattered into num_pages pages (sequence b's page i is perm[next free]), the table."""
    lens = (cu_k[1:] - cu_k[:-1]).tolist()
    max_pages = max(1, max((n + page_size - 1) // page_size for n in lens))
    pages = torch.full((num_pages, page_size) + tuple(k.shape[1:]), float("nan"), dtype=k.dtype, device=k.device)
    table = torch.full((len(lens), max_pages), -1, dtype=torch.int32)  # unused entries: not pages
    nxt = 0
    for b, n in enumerate(lens):
        for i in range((n + page_size - 1) // page_size):
            page = int(perm[nxt])
            nxt += 1
            rows = k[cu_k[b] + i * page_size: cu_k[b] + min(n, (i + 1) * page_size)]
            pages[page, : rows.shape[0]] = rows
            table[b, i] = page
    return pages, table.to(k.device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("page_size", [1, 16, 48])
def test_varlen_paged_kv(device, page_size):
    lens_q, lens_k = [5, 1, 33, 20], [70, 40, 0, 33]
    hq, hkv, d = 4, 2, 64
    dtype = _dtypes(device)[-1]
    g = torch.Generator().manual_seed(5)
    cu_q, cu_k, q, k, v = _varlen_inputs(lens_q, lens_k, hq, hkv, d, device, dtype, g)
    num_pages = sum((n + page_size - 1) // page_size for n in lens_k) + 3  # spare pages hold NaN
    perm = torch.randperm(num_pages, generator=g)
    k_pages, table = _paged_copy(k, cu_k, page_size, num_pages, perm)
    v_pages, _ = _paged_copy(v, cu_k, page_size, num_pages, perm)
    for causal in (False, True):
        args = dict(causal=causal, window_size=(30, -1), return_attn_probs=True)
        out, lse, _ = flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), **args)
        out_p, lse_p, _ = flash_attn_varlen_func(q, k_pages, v_pages, cu_q, cu_k, max(lens_q), max(lens_k),
                                                 block_table=table, **args)
        assert torch.equal(out, out_p) and torch.equal(lse, lse_p), (max_err(out, out_p), causal)
    # gradients reach q and the pages through the gather: the same values as the contiguous tensors'
    dout = torch.randn(sum(lens_q), hq, d, generator=g).to(device, dtype)
    qg, kg, vg = (t.clone().requires_grad_() for t in (q, k, v))
    flash_attn_varlen_func(qg, kg, vg, cu_q, cu_k, max(lens_q), max(lens_k), causal=True).backward(dout)
    qp, kp, vp = (t.clone().requires_grad_() for t in (q, k_pages, v_pages))
    flash_attn_varlen_func(qp, kp, vp, cu_q, cu_k, max(lens_q), max(lens_k), causal=True,
                           block_table=table).backward(dout)
    dk_pages, _ = _paged_copy(kg.grad, cu_k, page_size, num_pages, perm)
    dv_pages, _ = _paged_copy(vg.grad, cu_k, page_size, num_pages, perm)
    used = ~torch.isnan(dk_pages)
    assert torch.equal(qg.grad, qp.grad)
    assert torch.equal(kp.grad[used], dk_pages[used]) and torch.equal(vp.grad[used], dv_pages[used])
    assert (kp.grad[~used] == 0).all() and (vp.grad[~used] == 0).all()


def test_varlen_paged_kv_refuses():
    cu = torch.tensor([0, 10, 30], dtype=torch.int32)
    q = torch.randn(30, 2, 32)
    pages = torch.randn(6, 8, 2, 32)
    table = torch.tensor([[0, 1, -1, -1], [2, 3, 4, -1]], dtype=torch.int32)
    flash_attn_varlen_func(q, pages, pages, cu, cu, 20, 20, block_table=table)  # valid
    bad = table.clone()
    bad[1, 2] = 6
    with pytest.raises(ValueError, match=r"block_table\[1\]\[2\] = 6"):
        flash_attn_varlen_func(q, pages, pages, cu, cu, 20, 20, block_table=bad)
    with pytest.raises(TypeError, match="block_table must be an int32"):
        flash_attn_varlen_func(q, pages, pages, cu, cu, 20, 20, block_table=table.long())
    with pytest.raises(ValueError, match="max_seqlen_k"):
        flash_attn_varlen_func(q, pages, pages, cu, cu, 20, 33, block_table=table)
    with pytest.raises(ValueError, match="block_table has 1 rows"):
        flash_attn_varlen_func(q, pages, pages, cu, cu, 20, 20, block_table=table[:1])
    with pytest.raises(ValueError, match="num_pages, page_size"):
        flash_attn_varlen_func(q, pages[0], pages[0], cu, cu, 20, 20, block_table=table)
    # a sequence longer than max_seqlen_k: the library refuses cu_seqlens_k (the gather itself stays in bounds)
    with pytest.raises(flashattn.FlashAttnError, match="cu_seqlens_k"):
        flash_attn_varlen_func(q, pages, pages, cu, cu, 20, 16, block_table=table[:, :2])


def _quantize_e4m3(x, block=0):
    """x (batch, seqlen, heads, head_dim) as float8_e4m3fn with float32 descales (batch, heads[, blocks])."""
    b, s, h, d = x.shape
    if block == 0:
        ds = x.abs().amax(dim=(1, 3)) / 448
        return (x / ds[:, None, :, None]).to(torch.float8_e4m3fn), ds
    nb = -(-s // block)
    pad = torch.zeros(b, nb * block - s, h, d, dtype=x.dtype)
    xb = torch.cat([x, pad], 1).view(b, nb, block, h, d)
    ds = (xb.abs().amax(dim=(2, 4)) / 448).clamp_min(1e-12)  # (b, nb, h)
    x8 = (xb / ds[:, :, None, :, None]).view(b, nb * block, h, d)[:, :s].to(torch.float8_e4m3fn)
    return x8, ds.permute(0, 2, 1).contiguous()


def _dequantize(x8, ds, block=0):
    x = x8.float()
    if block == 0:
        return x * ds[:, None, :, None]
    rows = torch.arange(x.shape[1]) // block
    return x * ds[:, :, rows].permute(0, 2, 1)[..., None]


@pytest.mark.parametrize("block", [0, 16])
def test_fp8_forward_matches_dequantized(block):
    """e4m3 inputs with descales give the f32 call on the dequantized values, rounded once to the output."""
    g = torch.Generator().manual_seed(11)
    q, k, v = (torch.randn(2, n, h, 64, generator=g) * 3 for n, h in ((70, 4), (90, 2), (90, 2)))
    (q8, qd), (k8, kd), (v8, vd) = (_quantize_e4m3(t, block) for t in (q, k, v))
    for causal, window, out_dtype in ((False, (-1, -1), torch.bfloat16), (True, (30, -1), torch.float16)):
        out, lse, _ = flash_attn_func(q8, k8, v8, causal=causal, window_size=window, q_descale=qd, k_descale=kd,
                                      v_descale=vd, descale_block=block, out_dtype=out_dtype, return_attn_probs=True)
        ref, ref_lse, _ = flash_attn_func(_dequantize(q8, qd, block), _dequantize(k8, kd, block),
                                          _dequantize(v8, vd, block), causal=causal, window_size=window,
                                          return_attn_probs=True)
        unit = 2.0 ** (-8 if out_dtype == torch.bfloat16 else -11)
        assert out.dtype == out_dtype and out.shape == q.shape
        assert max_err(out.float(), ref) <= unit * float(ref.abs().max()) + 1e-6, (causal, block)
        assert max_err(lse, ref_lse) <= 1e-5 * float(ref_lse.abs().max())


def test_fp8_flash_attn_descale_layout():
    """flash-attn's FP8 descales: (batch, heads_kv) for q, k and v alike, q's spread over its query heads."""
    g = torch.Generator().manual_seed(12)
    q, k, v = (torch.randn(2, 40, h, 32, generator=g) for h in (6, 2, 2))
    qd = q.abs().amax(dim=(1, 3)).view(2, 2, 3).amax(-1) / 448  # one per kv head
    q8 = (q / qd.repeat_interleave(3, 1)[:, None, :, None]).to(torch.float8_e4m3fn)
    (k8, kd), (v8, vd) = _quantize_e4m3(k), _quantize_e4m3(v)
    out = flash_attn_func(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd)
    ref = flash_attn_func(_dequantize(q8, qd.repeat_interleave(3, 1)), _dequantize(k8, kd), _dequantize(v8, vd))
    assert max_err(out.float(), ref) <= 2.0**-8 * float(ref.abs().max()) + 1e-6
    plain = flash_attn_func(q8, k8, v8)  # no descales: the e4m3 values as they are
    assert max_err(plain.float(), flash_attn_func(q8.float(), k8.float(), v8.float())) <= 2.0**-8 * 448


def test_fp8_refusals():
    q8, k8, v8 = (torch.randn(1, 16, 2, 32).to(torch.float8_e4m3fn) for _ in range(3))
    ds = torch.ones(1, 2)
    with pytest.raises(ValueError, match="float8_e4m3fn inputs"):
        flash_attn_func(q8.float(), k8.float(), v8.float(), q_descale=ds)
    with pytest.raises(TypeError, match="k must be float8_e4m3fn"):
        flash_attn_func(q8, k8.bfloat16(), v8)
    with pytest.raises(ValueError, match=r"k_descale must have shape \(1, 2, 2\)"):
        flash_attn_func(q8, k8, v8, k_descale=ds, descale_block=8)
    with pytest.raises(TypeError, match="v_descale must be a float32"):
        flash_attn_func(q8, k8, v8, v_descale=ds.double())
    with pytest.raises(TypeError, match="out_dtype"):
        flash_attn_func(q8, k8, v8, out_dtype=torch.float32)
    with pytest.raises(flashattn.FlashAttnError, match="q_descale"):
        flash_attn_func(q8, k8, v8, q_descale=torch.full((1, 2), float("nan")))


class _Rows(ctypes.Structure):  # fa_rows, for calling the C helpers directly
    _fields_ = [("x", _lib.Tensor), ("dtype", ctypes.c_int), ("batch", ctypes.c_int32), ("seqlen", ctypes.c_int32),
                ("heads", ctypes.c_int32), ("head_dim", ctypes.c_int32), ("cu_seqlens", ctypes.c_void_p)]


def _c_rows(x):
    b, s, h, d = x.shape
    dt = {torch.float32: _lib.FA_F32, torch.float16: _lib.FA_F16, torch.bfloat16: _lib.FA_BF16}[x.dtype]
    return _Rows(_lib.Tensor(x.data_ptr(), *x.stride()[:3]), dt, b, s, h, d, None)


@pytest.mark.parametrize("block", [0, 7])
def test_fp8_helpers_match_the_c_helpers(block):
    """quantize_e4m3 and hadamard_rotate (torch) give the C helpers' bits on CPU tensors."""
    g = torch.Generator().manual_seed(13)
    x = (torch.randn(2, 30, 3, 96, generator=g) * torch.rand(96, generator=g) * 5).bfloat16()
    rotated = flashattn.hadamard_rotate(x, seed=77)
    c_rot = x.clone()
    _lib.call("fa_hadamard_rotate", ctypes.byref(_c_rows(c_rot)), ctypes.c_uint64(77))
    assert torch.equal(rotated, c_rot)
    x8, ds = flashattn.quantize_e4m3(rotated, descale_block=block)
    c8 = torch.empty(x.shape, dtype=torch.uint8)
    nb = -(-30 // block) if block else 1
    c_ds = torch.empty(2, 3, nb)
    quantize = _lib.lib["fa_quantize_e4m3"]  # a handle of its own: the argument types are this test's
    quantize.argtypes = [ctypes.c_void_p, ctypes.c_int32, _lib.Tensor, ctypes.c_void_p]
    _lib.raise_for_status("fa_quantize_e4m3", quantize(ctypes.byref(_c_rows(rotated)), block,
                                                       _lib.Tensor(c8.data_ptr(), *c8.stride()[:3]), c_ds.data_ptr()))
    assert torch.equal(x8.view(torch.uint8), c8)
    assert torch.equal(ds, c_ds if block else c_ds[..., 0])


@pytest.mark.parametrize("block", [0, 8, 40])
def test_fp8_quantize_strided_input(block):
    x = torch.randn(2, 3, 40, 64, generator=torch.Generator().manual_seed(15)).transpose(1, 2)  # a view
    got, want = flashattn.quantize_e4m3(x, descale_block=block), flashattn.quantize_e4m3(x.contiguous(), block)
    assert torch.equal(got[0].view(torch.uint8), want[0].view(torch.uint8)) and torch.equal(got[1], want[1])


def test_fp8_incoherent_processing_lowers_the_error():
    """The paper's outlier inputs (N(0, 1) + N(0, 100) Bernoulli(0.001)), d128, 2k: RMSE of the e4m3 forward
    against fp64 attention, per-block descales, with and without rotating q and k first."""
    g = torch.Generator().manual_seed(14)

    def outliers(*shape):
        return torch.randn(*shape, generator=g) + 10 * torch.randn(*shape, generator=g) * (
            torch.rand(*shape, generator=g) < 1e-3)

    q, k, v = (outliers(1, 2048, 1, 128) for _ in range(3))
    ref = F.scaled_dot_product_attention(*(t.double().transpose(1, 2) for t in (q, k, v))).transpose(1, 2)

    def rmse(rotate):
        qq, kk = (flashattn.hadamard_rotate(t, seed=3) for t in (q, k)) if rotate else (q, k)
        (q8, qd), (k8, kd), (v8, vd) = (flashattn.quantize_e4m3(t, descale_block=64) for t in (qq, kk, v))
        out = flash_attn_func(q8, k8, v8, q_descale=qd, k_descale=kd, v_descale=vd, descale_block=64)
        return float((out.double() - ref).pow(2).mean().sqrt())

    plain, rotated = rmse(False), rmse(True)
    assert rotated < 0.8 * plain, (rotated, plain)


@needs_cuda
@pytest.mark.parametrize("d,causal", [(64, False), (64, True), (128, False), (128, True), (256, False)])
def test_fp8_cuda_matches_dequantized(d, causal):
    """The Hopper e4m3 kernel (where the device has one) against the CPU backend's fp32 forward on the dequantized
    inputs: P is rounded to e4m3 and the tensor cores sum with fewer bits, so the bound is a few e4m3 units of P's
    share of O, not bf16's."""
    g = torch.Generator().manual_seed(16)
    q, k, v = (torch.randn(2, n, h, d, generator=g) * 2 for n, h in ((300, 4), (333, 2), (333, 2)))
    (q8, qd), (k8, kd), (v8, vd) = (_quantize_e4m3(t) for t in (q, k, v))
    ref = flash_attn_func(_dequantize(q8, qd), _dequantize(k8, kd), _dequantize(v8, vd), causal=causal)
    try:
        out = flash_attn_func(q8.cuda(), k8.cuda(), v8.cuda(), causal=causal, q_descale=qd.cuda(),
                              k_descale=kd.cuda(), v_descale=vd.cuda())
    except flashattn.FlashAttnError as e:  # a GPU without the e4m3 kernel (not Hopper) says so
        assert "e4m3" in str(e) and torch.cuda.get_device_capability() != (9, 0), str(e)
        return
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    assert max_err(out.float().cpu(), ref) <= 2.0**-4 * float(ref.abs().max())


@needs_cuda
@pytest.mark.parametrize("d", [64, 128, 256])
def test_fp8_cuda_block_descales(d):
    """Per-block descales on the Hopper kernel (q in blocks of 64 rows, k and v of 128), against the CPU backend's
    fp32 forward on the dequantized inputs; the blocks' scales differ by up to 16x."""
    g = torch.Generator().manual_seed(17)
    q, k, v = (torch.randn(2, n, h, d, generator=g) for n, h in ((300, 4), (400, 2), (400, 2)))
    ramp = lambda n: 2.0 ** (torch.arange(n) // 128 % 5 - 2.0)[None, :, None, None]  # noqa: E731
    q, k, v = q * ramp(300), k * ramp(400), v * ramp(400).flip(1)
    (q8, qd), (k8, kd), (v8, vd) = (_quantize_e4m3(t, 128) for t in (q, k, v))
    ref = flash_attn_func(_dequantize(q8, qd, 128), _dequantize(k8, kd, 128), _dequantize(v8, vd, 128), causal=True)
    try:
        out = flash_attn_func(q8.cuda(), k8.cuda(), v8.cuda(), causal=True, q_descale=qd.cuda(), k_descale=kd.cuda(),
                              v_descale=vd.cuda(), descale_block=128)
    except flashattn.FlashAttnError as e:
        assert "e4m3" in str(e) and torch.cuda.get_device_capability() != (9, 0), str(e)
        return
    assert max_err(out.float().cpu(), ref) <= 2.0**-4 * float(ref.abs().max())


@needs_cuda
def test_fp8_cuda_refusals_name_the_cause():
    q8, k8, v8 = (torch.randn(1, 16, 2, 96, device="cuda").to(torch.float8_e4m3fn) for _ in range(3))
    with pytest.raises(flashattn.FlashAttnError, match="e4m3"):  # head dim 96: no e4m3 kernel
        flash_attn_func(q8, k8, v8)
    q8, k8, v8 = (torch.randn(1, 32, 2, 128, device="cuda").to(torch.float8_e4m3fn) for _ in range(3))
    ds = torch.ones(1, 2, 4, device="cuda")
    with pytest.raises(flashattn.FlashAttnError, match="descale_block"):  # per-block descales: the CPU has them
        flash_attn_func(q8, k8, v8, q_descale=ds, k_descale=ds, v_descale=ds, descale_block=8)


# ---------------------------------------------------------------------------------------------------------
# CUDA specifics
# ---------------------------------------------------------------------------------------------------------

@needs_cuda
def test_runs_on_the_current_stream():
    q, k, v = (torch.randn(2, 256, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    expected = flash_attn_func(q, k, v, causal=True)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            out = flash_attn_func(q, k, v, causal=True)
    torch.cuda.current_stream().wait_stream(side)
    assert torch.equal(out, expected)


def _fresh(*tensors):
    """New random values in place: a graph replay reads the captured addresses."""
    for t in tensors:
        with torch.no_grad():
            t.copy_(torch.randn_like(t))


@needs_cuda
@pytest.mark.parametrize("shape", [(1, 128, 2, 2, 64), (4, 2048, 16, 4, 64), (2, 1000, 8, 8, 128)],
                         ids=["small", "many-tiles-d64", "d128"])
def test_cuda_graph_forward_replays_new_inputs(shape):
    """A captured forward replayed several times, with new values each time, equals eager calls. The second
    shape has more query tiles than SMs, so the persistent grid claims tiles from its counter in every replay."""
    b, s, hq, hkv, d = shape
    q = torch.randn(b, s, hq, d, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(b, s, hkv, d, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        flash_attn_func(q, k, v, causal=True)  # warm up outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = flash_attn_func(q, k, v, causal=True)
    for _ in range(4):
        _fresh(q, k, v)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, flash_attn_func(q, k, v, causal=True))


@needs_cuda
@pytest.mark.parametrize("varlen", [False, True, "paged"], ids=["dense", "varlen", "paged"])
def test_cuda_graph_forward_backward(varlen):
    """Forward and backward captured in one graph (gradients by torch.autograd.grad), replayed with new inputs
    and new output gradients, equal eager calls."""
    lens = [300, 1, 700, 0, 513]
    total, hq, hkv, d = sum(lens), 8, 2, 128
    if varlen == "paged":  # keys and values in 16-row pages, the table a permutation
        q = torch.randn(total, hq, d, device="cuda", dtype=torch.float16, requires_grad=True)
        k, v = (torch.randn(220, 16, hkv, d, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(2))
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device="cuda", dtype=torch.int32)
        table = torch.randperm(220, generator=torch.Generator().manual_seed(1)).view(5, 44)
        table = table.to("cuda", torch.int32)

        def attention(q, k, v):
            return flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True, block_table=table)
    elif varlen:
        q = torch.randn(total, hq, d, device="cuda", dtype=torch.float16, requires_grad=True)
        k, v = (torch.randn(total, hkv, d, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(2))
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), device="cuda", dtype=torch.int32)

        def attention(q, k, v):
            return flash_attn_varlen_func(q, k, v, cu, cu, max(lens), max(lens), causal=True)
    else:
        q = torch.randn(2, 777, hq, d, device="cuda", dtype=torch.float16, requires_grad=True)
        k, v = (torch.randn(2, 777, hkv, d, device="cuda", dtype=torch.float16, requires_grad=True) for _ in range(2))

        def attention(q, k, v):
            return flash_attn_func(q, k, v, causal=True)
    dout = torch.randn_like(q)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(2):
            torch.autograd.grad(attention(q, k, v), (q, k, v), dout)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = attention(q, k, v)
        grads = torch.autograd.grad(out, (q, k, v), dout)
    for _ in range(3):
        _fresh(q, k, v, dout)
        graph.replay()
        torch.cuda.synchronize()
        expected_out = attention(q, k, v)
        expected = torch.autograd.grad(expected_out, (q, k, v), dout)
        assert torch.equal(out, expected_out)
        for got, want in zip(grads, expected):
            assert torch.equal(got, want)


@needs_cuda
def test_deterministic_backward_is_bitwise_reproducible():
    q, k, v = (torch.randn(2, 300, 4, 64, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    dout = torch.randn_like(q)
    grads = []
    for _ in range(3):
        out = flash_attn_func(q, k, v, causal=True, deterministic=True)
        grads.append(torch.autograd.grad(out, (q, k, v), dout))
    for g in grads[1:]:
        for a, b in zip(g, grads[0]):
            assert torch.equal(a, b)


def _op_path(q, k, v, **kw):
    """flash_attn_func through the custom ops (the path of torch.compile), for comparing with the eager path."""
    scale = q.shape[-1] ** -0.5
    out, lse = torch.ops.flashattn.fwd(q, k, v, scale, kw.get("causal", False), -1, -1, 0.0, kw.get("alibi"), False)
    return out, lse


@pytest.mark.parametrize("device", DEVICES)
def test_eager_path_matches_custom_ops(device):
    """The eager path (a prepared call per signature) gives bitwise what the custom ops give, on a first and a
    later call of each signature, interleaved with other signatures, for outputs and gradients."""
    dtype = _dtypes(device)[-1]
    base = torch.randn(2, 96, 4, 64, device=device, dtype=dtype)
    signatures = [
        lambda: (torch.randn(2, 96, 4, 64, device=device, dtype=dtype), torch.randn(2, 80, 2, 64, device=device,
                 dtype=dtype), torch.randn(2, 80, 2, 64, device=device, dtype=dtype), {"causal": True}),
        lambda: (torch.randn(2, 4, 96, 64, device=device, dtype=dtype).transpose(1, 2),  # strided q
                 torch.randn(2, 96, 4, 64, device=device, dtype=dtype), torch.randn_like(base), {}),
        lambda: (torch.randn(1, 33, 4, 64, device=device, dtype=dtype), torch.randn(1, 70, 4, 64, device=device,
                 dtype=dtype), torch.randn(1, 70, 4, 64, device=device, dtype=dtype),
                 {"alibi": torch.rand(4, device=device, dtype=torch.float32)}),
    ]
    for _ in range(2):
        for make in signatures:
            q, k, v, kw = make()
            alibi = kw.get("alibi")
            q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
            out, lse, _ = flash_attn_func(q, k, v, causal=kw.get("causal", False), alibi_slopes=alibi,
                                          return_attn_probs=True)
            ref_out, ref_lse = _op_path(q, k, v, **kw)
            assert torch.equal(out, ref_out) and torch.equal(lse, ref_lse)
            dout = torch.randn_like(out)
            grads = torch.autograd.grad(out, (q, k, v), dout)
            ref = torch.autograd.grad(ref_out, (q, k, v), dout)
            for got, want in zip(grads, ref):
                assert torch.equal(got, want)
            # a strided output gradient (a view) takes the same path
            wide = torch.randn(*out.shape[:-1], 2 * out.shape[-1], device=device, dtype=dtype)[..., ::2]
            out = flash_attn_func(q, k, v, causal=kw.get("causal", False), alibi_slopes=alibi)
            got = torch.autograd.grad(out, (q, k, v), wide)
            want = torch.autograd.grad(_op_path(q, k, v, **kw)[0], (q, k, v), wide.contiguous())
            for g, w in zip(got, want):
                assert torch.equal(g, w)


@pytest.mark.parametrize("device", DEVICES)
def test_eager_path_still_checks(device):
    """A signature seen before is still checked where the checks depend on more than the signature."""
    dtype = _dtypes(device)[0]
    q = torch.randn(1, 16, 2, 64, device=device, dtype=dtype)
    flash_attn_func(q, q, q)
    with pytest.raises(NotImplementedError, match="dropout"):
        flash_attn_func(q, q, q, dropout_p=0.1)
    with pytest.raises(ValueError, match="window_size"):
        flash_attn_func(q, q, q, window_size=(1, 2, 3))
    cu = torch.tensor([0, 10, 16], dtype=torch.int32, device=device)
    packed = q[0]
    flash_attn_varlen_func(packed, packed, packed, cu, cu, 10, 10)
    if device == "cpu":  # host cu_seqlens are values, part of no signature
        bad = torch.tensor([0, 17, 16], dtype=torch.int32)
        with pytest.raises(ValueError, match="cu_seqlens_q"):
            flash_attn_varlen_func(packed, packed, packed, bad, cu, 17, 10)


@pytest.mark.parametrize("device", DEVICES)
def test_eager_path_signature_changes_miss(device):
    """After a signature is cached, a call that differs in one tensor's dtype, shape, strides or device, or in
    alibi_slopes, is checked afresh: it raises what the first call of it raises, or computes what the custom
    ops compute."""
    dtype = _dtypes(device)[0]
    q, k, v = (torch.randn(1, 16, 2, 64, device=device, dtype=dtype) for _ in range(3))
    flash_attn_func(q, k, v)
    other = torch.float32 if dtype != torch.float32 else torch.float16
    with pytest.raises(TypeError, match="k has dtype"):
        flash_attn_func(q, k.to(other), v)
    with pytest.raises(TypeError, match="v has dtype"):
        flash_attn_func(q, k, v.to(other))
    with pytest.raises(ValueError, match="v must have the shape of k"):
        flash_attn_func(q, k, v[:, :8])
    with pytest.raises(ValueError, match="k is on meta"):
        flash_attn_func(q, torch.empty_like(k, device="meta"), v)
    with pytest.raises(ValueError, match="v must be contiguous in its last dimension"):
        flash_attn_func(q, k, torch.randn(1, 16, 2, 128, device=device, dtype=dtype)[..., ::2])
    with pytest.raises(ValueError, match="alibi_slopes must have shape"):
        flash_attn_func(q, k, v, alibi_slopes=torch.rand(3, device=device))
    # other strides of one shape: a new signature, computed as the custom ops compute it
    for strided in (torch.randn(1, 2, 16, 64, device=device, dtype=dtype).transpose(1, 2),
                    torch.randn(1, 16, 4, 64, device=device, dtype=dtype)[:, :, ::2]):
        q2 = strided.copy_(q)
        assert not q2.is_contiguous()
        assert torch.equal(flash_attn_func(q2, k, v), _op_path(q, k, v)[0])


def test_eager_path_under_vmap():
    """functorch's transforms take the custom ops (a batched tensor has no data pointer to prepare)."""
    q, k, v = (torch.randn(3, 1, 16, 2, 64) for _ in range(3))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # PyTorch's note that the op has no batching rule
        got = torch.func.vmap(flash_attn_func)(q, k, v)
    for i in range(3):
        assert torch.equal(got[i], flash_attn_func(q[i], k[i], v[i]))


@needs_cuda
def test_host_overhead_against_sdpa():
    """Host time per call on a problem whose kernel takes a few microseconds: the eager path must cost at most
    three times what SDPA costs on the same machine, for the forward and for the backward through autograd
    (measured as bench/compare.py does: forward + backward minus a forward with inputs that need gradients). A
    loose guard; the benchmark reports the figures."""
    import time

    def qkv(layout, grad):
        return [torch.randn(*layout, device="cuda", dtype=torch.bfloat16, requires_grad=grad) for _ in range(3)]

    ours_shape, sdpa_shape = (1, 128, 1, 64), (1, 1, 128, 64)  # each one's native layout: no transposes timed

    def per_call(fn, n=2000):
        for _ in range(200):
            fn()
        torch.cuda.synchronize()
        best = float("inf")
        for _ in range(3):
            start = time.perf_counter()
            for _ in range(n):
                fn()
            torch.cuda.synchronize()
            best = min(best, (time.perf_counter() - start) / n)
        return best

    def fwd_and_bwd(f, shape):
        plain, grad = qkv(shape, False), qkv(shape, True)
        dout = torch.randn(*shape, device="cuda", dtype=torch.bfloat16)

        def step():
            f(*grad).backward(dout)
            for t in grad:
                t.grad = None

        fwd, fwd_grad, both = per_call(lambda: f(*plain)), per_call(lambda: f(*grad)), per_call(step)
        return fwd, both - fwd_grad

    ours = fwd_and_bwd(flash_attn_func, ours_shape)
    sdpa = fwd_and_bwd(F.scaled_dot_product_attention, sdpa_shape)
    for what, o, s in zip(("forward", "backward"), ours, sdpa):
        print(f"host time per {what}: flashattn {o * 1e6:.1f} us, SDPA {s * 1e6:.1f} us")
    for what, o, s in zip(("forward", "backward"), ours, sdpa):
        assert o <= 3 * s, f"flash_attn_func {what} {o * 1e6:.1f} us per call > 3x SDPA's {s * 1e6:.1f} us"


@pytest.mark.parametrize("device", DEVICES)
def test_library_error_carries_detail(device):
    """What only the library rejects (head_dim 512 here) raises FlashAttnError with fa_last_error's detail."""
    q = torch.randn(1, 8, 1, 512, device=device, dtype=_dtypes(device)[0])
    with pytest.raises(flashattn.FlashAttnError) as info:
        flash_attn_func(q, q, q)
    e = info.value
    assert e.status_name == "FA_ERR_UNSUPPORTED" and "head_dim" in e.detail and e.detail in str(e)


@needs_cuda
def test_device_mismatch():
    q = torch.randn(1, 8, 2, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="k is on cpu but q is on cuda"):
        flash_attn_func(q, q.cpu(), q)


# ---------------------------------------------------------------------------------------------------------
# torch.compile and opcheck
# ---------------------------------------------------------------------------------------------------------

class TinyAttention(torch.nn.Module):
    def __init__(self, dim=128, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.head_dim)
        self.proj = torch.nn.Linear(dim, dim)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.head_dim).unbind(2)
        out = flash_attn_func(q, k, v, causal=True, window_size=(48, 0))
        return self.proj(out.reshape(b, s, -1))


def _compile_backends(device):
    backends = ["aot_eager"]
    if device == "cuda" or shutil.which("g++") or shutil.which("c++"):
        backends.append("inductor")
    return backends


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_fullgraph(device):
    torch._dynamo.reset()
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    torch.manual_seed(0)
    model = TinyAttention().to(device, dtype)
    x = torch.randn(2, 96, 128, device=device, dtype=dtype)
    out_eager = model(x)
    grads_eager = torch.autograd.grad(out_eager.sum(), list(model.parameters()))
    for backend in _compile_backends(device):
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend=backend)
        out = compiled(x)
        grads = torch.autograd.grad(out.sum(), list(model.parameters()))
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        assert max_err(out, out_eager) <= tol * max(1.0, out_eager.abs().max().item()), backend
        for a, b in zip(grads, grads_eager):
            assert max_err(a, b) <= tol * max(1.0, b.abs().max().item()), backend


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_dynamic_shapes_and_varlen(device):
    torch._dynamo.reset()
    dtype = _dtypes(device)[0]

    def f(q, k, v, cu, max_len):
        return flash_attn_varlen_func(q, k, v, cu, cu, max_len, max_len, causal=True).float().square().sum()

    compiled = torch.compile(f, fullgraph=True, dynamic=True, backend="aot_eager")
    for lens in ([5, 9, 12], [31, 2]):
        cu = torch.tensor([0] + list(torch.tensor(lens).cumsum(0)), dtype=torch.int32, device=device)
        q, k, v = (torch.randn(sum(lens), 2, 64, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
        loss = compiled(q, k, v, cu, max(lens))
        grads = torch.autograd.grad(loss, (q, k, v))
        loss_e = f(q, k, v, cu, max(lens))
        grads_e = torch.autograd.grad(loss_e, (q, k, v))
        assert max_err(loss, loss_e) <= 1e-3 * max(1.0, abs(loss_e.item()))
        for a, b in zip(grads, grads_e):
            assert max_err(a, b) <= 2e-2 * max(1.0, b.abs().max().item())


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    dtype = _dtypes(device)[0]
    q = torch.randn(2, 24, 4, 64, device=device, dtype=dtype)
    k = torch.randn(2, 30, 2, 64, device=device, dtype=dtype)
    v = torch.randn(2, 30, 2, 64, device=device, dtype=dtype)
    slopes = torch.rand(4, device=device)
    fwd_args = (q, k, v, 0.125, True, -1, 0, 0.0, slopes, False)
    torch.library.opcheck(torch.ops.flashattn.fwd.default, fwd_args)
    grad_args = (q.clone().requires_grad_(), k.clone().requires_grad_(), v.clone().requires_grad_()) + fwd_args[3:]
    torch.library.opcheck(torch.ops.flashattn.fwd.default, grad_args)
    out, lse = torch.ops.flashattn.fwd(*fwd_args)
    torch.library.opcheck(torch.ops.flashattn.bwd.default,
                          (torch.randn_like(out), q, k, v, out, lse, 0.125, True, -1, 0, 0.0, slopes, False))
    cu = torch.tensor([0, 10, 24], dtype=torch.int32, device=device)
    cuk = torch.tensor([0, 5, 30], dtype=torch.int32, device=device)
    qv, kv, vv = q.flatten(0, 1)[:24], k.flatten(0, 1)[:30], v.flatten(0, 1)[:30]
    vfwd_args = (qv, kv, vv, cu, cuk, 14, 25, 0.125, False, 8, 8, 0.0, None, False)
    torch.library.opcheck(torch.ops.flashattn.varlen_fwd.default, vfwd_args)
    vgrad_args = (qv.clone().requires_grad_(), kv.clone().requires_grad_(), vv.clone().requires_grad_()) + vfwd_args[3:]
    torch.library.opcheck(torch.ops.flashattn.varlen_fwd.default, vgrad_args)
    vout, vlse = torch.ops.flashattn.varlen_fwd(*vfwd_args)
    torch.library.opcheck(torch.ops.flashattn.varlen_bwd.default,
                          (torch.randn_like(vout), qv, kv, vv, vout, vlse, cu, cuk, 14, 25, 0.125, False, 8, 8, 0.0,
                           None, False))


@pytest.mark.parametrize("device", DEVICES)
def test_torch_compile_same_tensor_twice(device):
    """Self-attention on one tensor (q = k = v) and the packed varlen function (cu_seqlens_q = cu_seqlens_k)."""
    torch._dynamo.reset()
    dtype = _dtypes(device)[0]
    x = torch.randn(1, 40, 2, 64, device=device, dtype=dtype, requires_grad=True)
    cu = torch.tensor([0, 15, 40], dtype=torch.int32, device=device)
    qkv = torch.randn(40, 3, 2, 64, device=device, dtype=dtype, requires_grad=True)

    def f(x, qkv):
        a = flash_attn_func(x, x, x, causal=True).float().sum()
        b = flashattn.flash_attn_varlen_qkvpacked_func(qkv, cu, 25, causal=True).float().sum()
        return a + b

    loss = torch.compile(f, fullgraph=True, backend="aot_eager")(x, qkv)
    grads = torch.autograd.grad(loss, (x, qkv))
    loss_e = f(x, qkv)
    grads_e = torch.autograd.grad(loss_e, (x, qkv))
    assert max_err(loss, loss_e) <= 1e-3 * max(1.0, abs(loss_e.item()))
    for a, b in zip(grads, grads_e):
        assert max_err(a, b) <= 2e-2 * max(1.0, b.abs().max().item())


# ---------------------------------------------------------------------------------------------------------
# Argument checks
# ---------------------------------------------------------------------------------------------------------

def _qkv(dtype=torch.float32, device="cpu"):
    return tuple(torch.randn(1, 8, 2, 64, dtype=dtype, device=device) for _ in range(3))


def test_unsupported_arguments_raise():
    q, k, v = _qkv()
    with pytest.raises(NotImplementedError, match="dropout_p"):
        flash_attn_func(q, k, v, dropout_p=0.1)


def test_bad_inputs_name_the_argument():
    q, k, v = _qkv()
    with pytest.raises(TypeError, match="q must be float16, bfloat16 or float32"):
        flash_attn_func(q.double(), k, v)
    with pytest.raises(TypeError, match="^v has dtype torch.float16"):
        flash_attn_func(q, k, v.half())
    with pytest.raises(ValueError, match="k must be contiguous in its last dimension"):
        flash_attn_func(q, k.transpose(1, 3).contiguous().transpose(1, 3), v)
    with pytest.raises(ValueError, match="q must be 4-D"):
        flash_attn_func(q[0], k, v)
    with pytest.raises(ValueError, match=r"q's heads \(3\) must be a multiple"):
        flash_attn_func(torch.randn(1, 8, 3, 64), k, v)
    with pytest.raises(ValueError, match="alibi_slopes must have shape"):
        flash_attn_func(q, k, v, alibi_slopes=torch.ones(5))
    with pytest.raises(TypeError, match="alibi_slopes must be float32"):
        flash_attn_func(q, k, v, alibi_slopes=torch.ones(2, dtype=torch.float64))
    with pytest.raises(ValueError, match="softcap"):
        flash_attn_func(q, k, v, softcap=-2.0)
    with pytest.raises(ValueError, match="window_size"):
        flash_attn_func(q, k, v, window_size=(1, 2, 3))
    cu = torch.tensor([0, 8], dtype=torch.int32)
    with pytest.raises(TypeError, match="cu_seqlens_k must be int32"):
        flash_attn_varlen_func(q[0], k[0], v[0], cu, cu.long(), 8, 8)
    with pytest.raises(ValueError, match="cu_seqlens_q must be non-decreasing"):
        flash_attn_varlen_func(q[0], k[0], v[0], torch.tensor([0, 6, 4], dtype=torch.int32),
                               torch.tensor([0, 4, 8], dtype=torch.int32), 8, 8)


def test_lse_is_not_differentiable_and_out_is():
    q, k, v = (t.requires_grad_() for t in _qkv())
    out, lse, _ = flash_attn_func(q, k, v, return_attn_probs=True)
    assert out.requires_grad and not lse.requires_grad
    out.sum().backward()  # dout with zero strides (expanded ones) must work
    assert q.grad is not None and k.grad is not None and v.grad is not None


# ---------------------------------------------------------------------------------------------------------
# scaled_dot_product_attention: PyTorch's signature and (batch, heads, seqlen, head_dim) layout
# ---------------------------------------------------------------------------------------------------------

def torch_sdpa(q, k, v, dtype, is_causal=False, scale=None):
    """PyTorch's SDPA in `dtype` on (b, h, s, d) inputs; GQA through repeat_interleave, which is what its
    enable_gqa means (query head h uses key/value head h // (heads_q // heads_kv)), so that the reference does
    not depend on enable_gqa being in the installed PyTorch."""
    group = q.shape[1] // k.shape[1]
    k, v = (t.to(dtype).repeat_interleave(group, dim=1) for t in (k, v))
    return F.scaled_dot_product_attention(q.to(dtype), k, v, is_causal=is_causal, scale=scale)


SDPA_CASES = [
    # batch, heads_q, heads_kv, seqlen_q, seqlen_k, head_dim, is_causal, scale, enable_gqa
    (2, 4, 4, 50, 70, 64, False, None, False),
    (2, 4, 4, 77, 77, 64, True, None, False),      # causal, square: PyTorch's top-left mask is ours
    (1, 8, 2, 33, 91, 64, False, None, True),      # GQA
    (1, 8, 2, 65, 65, 128, True, None, True),      # GQA, causal
    (2, 6, 1, 40, 24, 32, False, None, False),     # one key/value head: PyTorch broadcasts it without enable_gqa
    (1, 2, 2, 40, 40, 64, True, 0.07, False),      # explicit scale
    (1, 4, 2, 45, 50, 40, False, None, True),      # head_dim the CUDA kernels pad
]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", SDPA_CASES, ids=["x".join(map(str, c[:6])) + ("-causal" if c[6] else "")
                                                   + ("-scale" if c[7] else "") + ("-gqa" if c[8] else "")
                                                   for c in SDPA_CASES])
def test_sdpa_against_torch(device, case):
    """Output and gradients against PyTorch's SDPA in fp64, with the 2x-naive rule of the other tests."""
    b, hq, hkv, sq, sk, d, is_causal, scale, enable_gqa = case
    for dtype in _dtypes(device):
        g = torch.Generator().manual_seed(3)
        q = torch.randn(b, hq, sq, d, generator=g).to(device, dtype)
        k = torch.randn(b, hkv, sk, d, generator=g).to(device, dtype)
        v = torch.randn(b, hkv, sk, d, generator=g).to(device, dtype)
        dout = torch.randn(b, hq, sq, d, generator=g).to(device, dtype)

        def ours_fn(q, k, v):
            return flashattn.scaled_dot_product_attention(q, k, v, is_causal=is_causal, scale=scale,
                                                          enable_gqa=enable_gqa)

        ours = run_with_grads(ours_fn, q, k, v, dout)
        ref = run_with_grads(lambda q, k, v: torch_sdpa(q, k, v, torch.float64, is_causal, scale), q, k, v, dout)
        with naive_low_precision():
            naive = run_with_grads(lambda q, k, v: torch_sdpa(q, k, v, dtype, is_causal, scale), q, k, v, dout)
        for name, o, n, r, x in zip(("out", "dq", "dk", "dv"), ours, naive, ref, (q, q, k, v)):
            assert o.shape == x.shape and o.dtype == dtype and o.device == x.device, name
            assert_2x_naive(name, o, n, r, dtype)
        # the output is PyTorch's layout over (batch, seqlen, heads, head_dim) memory, as its flash backend's
        # (a head dim the CUDA kernels lack is padded: then it is a slice of that memory)
        if device == "cpu" or d in (32, 64, 96, 128, 192, 256):
            assert ours[0].transpose(1, 2).is_contiguous()


@pytest.mark.parametrize("device", DEVICES)
def test_sdpa_is_flash_attn_func_on_transposed_views(device):
    """The entry point passes views: the same result, bitwise, as flash_attn_func on the (b, s, h, d) copies."""
    dtype = _dtypes(device)[-1]
    q, k, v = (torch.randn(2, 4, 96, 64, device=device, dtype=dtype) for _ in range(3))
    out = flashattn.scaled_dot_product_attention(q, k, v, is_causal=True)
    ref = flash_attn_func(*(t.transpose(1, 2).contiguous() for t in (q, k, v)), causal=True)
    assert_same(out, ref.transpose(1, 2))


def _torch_raises(fn):
    try:
        fn()
    except RuntimeError:
        return True
    return False


def test_sdpa_rejects_what_it_would_compute_differently():
    sdpa = flashattn.scaled_dot_product_attention
    q = torch.randn(1, 4, 8, 64)
    k = v = torch.randn(1, 4, 8, 64)
    with pytest.raises(NotImplementedError, match="attn_mask"):
        sdpa(q, k, v, attn_mask=torch.ones(8, 8, dtype=torch.bool))
    with pytest.raises(NotImplementedError, match="dropout"):
        sdpa(q, k, v, dropout_p=0.1)
    # PyTorch aligns is_causal top-left, we bottom-right: different lengths would be a different mask
    k_long = torch.randn(1, 4, 12, 64)
    with pytest.raises(ValueError, match=r"(?s)top left.*bottom right.*flash_attn_func\(q, k, v, causal=True\)"):
        sdpa(q, k_long, k_long, is_causal=True)
    sdpa(q, k_long, k_long)  # without the mask the lengths may differ
    with pytest.raises(ValueError, match="4-D"):
        sdpa(q[0], k[0], v[0])
    with pytest.raises(TypeError, match="value has dtype torch.float16"):
        sdpa(q, k, v.half())
    with pytest.raises(TypeError, match="query must be float16, bfloat16 or float32"):
        sdpa(q.double(), k.double(), v.double())
    with pytest.raises(ValueError, match="key must be contiguous in its last dimension"):
        sdpa(q, k.transpose(2, 3).contiguous().transpose(2, 3), v)
    with pytest.raises(ValueError, match="head_dim"):
        sdpa(q, k, torch.randn(1, 4, 8, 32))


def test_sdpa_head_rules_mirror_pytorch():
    """Head counts: what PyTorch's SDPA refuses, we refuse; what it accepts (equal, or one key/value head, or a
    divisor with enable_gqa), we compute."""
    sdpa = flashattn.scaled_dot_product_attention
    q = torch.randn(1, 4, 8, 64)
    kv2, kv1, q3 = torch.randn(1, 2, 8, 64), torch.randn(1, 1, 8, 64), torch.randn(1, 3, 8, 64)
    assert _torch_raises(lambda: F.scaled_dot_product_attention(q, kv2, kv2))
    with pytest.raises(ValueError, match="enable_gqa=True"):
        sdpa(q, kv2, kv2)
    assert _torch_raises(lambda: F.scaled_dot_product_attention(q3, kv2, kv2, enable_gqa=True))
    with pytest.raises(ValueError, match=r"key and value \(2\) must divide .* query \(3\)"):
        sdpa(q3, kv2, kv2, enable_gqa=True)
    for k, gqa in ((kv2, True), (kv1, False), (kv1, True)):
        want = F.scaled_dot_product_attention(q, k, k, enable_gqa=gqa)
        assert max_err(sdpa(q, k, k, enable_gqa=gqa), want) <= 1e-5


@pytest.mark.parametrize("device", DEVICES)
def test_sdpa_torch_compile_fullgraph(device):
    """A block in PyTorch's layout calling flashattn.scaled_dot_product_attention compiles without graph breaks
    and gives eager's output and gradients."""
    torch._dynamo.reset()
    dtype = _dtypes(device)[0]

    def block(q, k, v):
        out = flashattn.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return out.float().square().sum()

    q = torch.randn(2, 8, 64, 64, device=device, dtype=dtype, requires_grad=True)
    k, v = (torch.randn(2, 2, 64, 64, device=device, dtype=dtype, requires_grad=True) for _ in range(2))
    loss = torch.compile(block, fullgraph=True, backend="aot_eager")(q, k, v)
    grads = torch.autograd.grad(loss, (q, k, v))
    loss_e = block(q, k, v)
    grads_e = torch.autograd.grad(loss_e, (q, k, v))
    assert max_err(loss, loss_e) <= 1e-3 * max(1.0, abs(loss_e.item()))
    for a, b in zip(grads, grads_e):
        assert max_err(a, b) <= 2e-2 * max(1.0, b.abs().max().item())


@needs_cuda
def test_sdpa_device_mismatch():
    q = torch.randn(1, 2, 8, 64, device="cuda", dtype=torch.float16)
    with pytest.raises(ValueError, match="key is on cpu but query is on cuda"):
        flashattn.scaled_dot_product_attention(q, q.cpu(), q)
