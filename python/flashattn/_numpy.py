# SPDX-License-Identifier: Apache-2.0
"""numpy entry points: attention() and attention_backward() on host arrays, run by the CPU backend (or the
fp64 reference backend on request). Needs numpy, not torch."""

import ctypes

import numpy as np

from . import _common, _lib

_HOST_BACKENDS = ("cpu", "reference", "auto")


def _fa_dtype(name, a):
    if a.dtype == np.float32:
        return _lib.FA_F32
    if a.dtype == np.float16:
        return _lib.FA_F16
    if a.dtype.name == "bfloat16" and a.dtype.itemsize == 2:  # ml_dtypes.bfloat16, if the caller uses it
        return _lib.FA_BF16
    raise TypeError(f"{name} must be float32, float16 or bfloat16, got {a.dtype}")


def _check_array(name, a, dtype):
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray, got {type(a).__name__}")
    if a.dtype != dtype:
        raise TypeError(f"{name} has dtype {a.dtype} but q has dtype {dtype}; all of q, k, v must match")
    _check_last_dim(name, a)


def _check_last_dim(name, a):
    if a.size == 0:
        return  # numpy gives empty arrays arbitrary strides; nothing is read
    if a.ndim and a.shape[-1] > 1 and a.strides[-1] != a.itemsize:
        raise ValueError(f"{name} must be contiguous in its last dimension (head_dim); got strides {a.strides} "
                         "bytes; use numpy.ascontiguousarray")
    if any(s % a.itemsize for s in a.strides):
        raise ValueError(f"{name} has strides {a.strides} that are not multiples of its item size {a.itemsize}")


def _strides(a):
    return [s // a.itemsize for s in a.strides]


def _backend(backend, num_threads):
    if backend not in _HOST_BACKENDS:
        raise ValueError(f"backend must be one of {_HOST_BACKENDS} for numpy arrays, got {backend!r}")
    exe = _lib.Exec()
    exe.backend = _lib.BACKENDS[backend]
    exe.device = -1
    exe.num_threads = _common.int_arg("num_threads", num_threads)
    return exe


def _cu_seqlens(name, cu, total, total_name):
    if not isinstance(cu, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray of int32, got {type(cu).__name__}")
    if cu.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers (int32), got dtype {cu.dtype}")
    if cu.ndim != 1 or cu.shape[0] < 1:
        raise ValueError(f"{name} must be 1-D with batch + 1 entries, got shape {cu.shape}")
    c = cu.astype(np.int64)
    if c[0] != 0:
        raise ValueError(f"{name} must start at 0, got {int(c[0])}")
    if np.any(np.diff(c) < 0):
        raise ValueError(f"{name} must be non-decreasing, got {cu.tolist()}")
    if c[-1] > total:
        raise ValueError(f"{name}[-1] ({int(c[-1])}) exceeds {total_name} ({total})")
    return np.ascontiguousarray(cu, dtype=np.int32)


def _max_seqlen(name, given, cu):
    actual = int(np.max(np.diff(cu.astype(np.int64)), initial=0))
    if given is None:
        return actual
    if int(given) < actual:
        raise ValueError(f"{name} ({given}) is smaller than the longest sequence in cu_seqlens ({actual})")
    return int(given)


def _alibi(alibi_slopes, batch, heads_q):
    if alibi_slopes is None:
        return None, 0
    if not isinstance(alibi_slopes, np.ndarray):
        raise TypeError(f"alibi_slopes must be a numpy.ndarray of float32, got {type(alibi_slopes).__name__}")
    if alibi_slopes.dtype != np.float32:
        raise TypeError(f"alibi_slopes must be float32, got {alibi_slopes.dtype}")
    _common.check_alibi_shape(alibi_slopes.shape, batch, heads_q)
    a = np.ascontiguousarray(alibi_slopes)
    return a, (heads_q if a.ndim == 2 else 0)


class _Problem:
    """Checked inputs of one call and the fa_params describing them; keeps referenced arrays alive."""

    def __init__(self, q, k, v, causal, softmax_scale, window_size, softcap, alibi_slopes, deterministic,
                 cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k):
        if not isinstance(q, np.ndarray):
            raise TypeError(f"q must be a numpy.ndarray, got {type(q).__name__}")
        self.dtype = _fa_dtype("q", q)
        _check_last_dim("q", q)
        _check_array("k", k, q.dtype)
        _check_array("v", v, q.dtype)
        self.varlen = cu_seqlens_q is not None or cu_seqlens_k is not None
        if self.varlen:
            if cu_seqlens_q is None or cu_seqlens_k is None:
                raise ValueError("cu_seqlens_q and cu_seqlens_k must be given together")
            batch, total_q, total_k, heads_q, heads_kv, head_dim = _common.varlen_sizes(
                q.shape, k.shape, v.shape, np.shape(cu_seqlens_q), np.shape(cu_seqlens_k))
            self.cu_q = _cu_seqlens("cu_seqlens_q", cu_seqlens_q, total_q, "q's total tokens")
            self.cu_k = _cu_seqlens("cu_seqlens_k", cu_seqlens_k, total_k, "k's total tokens")
            max_q = _max_seqlen("max_seqlen_q", max_seqlen_q, self.cu_q)
            max_k = _max_seqlen("max_seqlen_k", max_seqlen_k, self.cu_k)
            sizes = (batch, total_q, total_k, heads_q, heads_kv, head_dim, max_q, max_k)
            self.lse_shape = (heads_q, total_q)
            self.rows = total_q * heads_q
        else:
            if max_seqlen_q is not None or max_seqlen_k is not None:
                raise ValueError("max_seqlen_q / max_seqlen_k are only meaningful with cu_seqlens_q/k")
            sizes = _common.dense_sizes(q.shape, k.shape, v.shape)
            batch, seqlen_q, _, heads_q, heads_kv, head_dim = sizes
            self.lse_shape = (batch, heads_q, seqlen_q)
            self.rows = batch * seqlen_q * heads_q
        self.no_keys = k.shape[0] == 0 or (not self.varlen and k.shape[1] == 0)
        self.alibi, alibi_stride = _alibi(alibi_slopes, batch, heads_q)
        self.p = _common.make_params(self.dtype, sizes, self.varlen, _common.scale(softmax_scale, head_dim),
                                     causal, _common.window(window_size), _common.check_softcap(softcap),
                                     deterministic)
        if self.varlen:
            self.p.cu_seqlens_q = self.cu_q.ctypes.data
            self.p.cu_seqlens_k = self.cu_k.ctypes.data
        if self.alibi is not None:
            self.p.alibi_slopes = self.alibi.ctypes.data
            self.p.alibi_batch_stride = alibi_stride
        self.arrays = [q, k, v]
        self.set("q", q)
        self.set("k", k)
        self.set("v", v)

    def set(self, field, a):
        _common.set_tensor(getattr(self.p, field), a.ctypes.data, _strides(a), self.varlen)
        self.arrays.append(a)

    def run(self, function, exe, backward):
        ws = None
        n = _lib.workspace_size(self.p, exe, backward)
        if n:
            ws = np.empty(n, dtype=np.uint8)
            exe.workspace, exe.workspace_bytes = ws.ctypes.data, n
        _lib.call(function, ctypes.byref(self.p), ctypes.byref(exe))
        del ws


def attention(q, k, v, causal=False, softmax_scale=None, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
              return_lse=False, *, cu_seqlens_q=None, cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None,
              backend="cpu", num_threads=0):
    """Exact attention of numpy arrays on the CPU.

    q: (batch, seqlen_q, heads_q, head_dim); k, v: (batch, seqlen_k, heads_kv, head_dim); float32 or float16
    (bfloat16 through ml_dtypes also works). Any strides, except that head_dim must be contiguous.
    With cu_seqlens_q / cu_seqlens_k (int32, batch + 1 prefix sums), q/k/v are packed
    (total_tokens, heads, head_dim); max_seqlen_q/k default to the longest sequence.

    causal: bottom-right aligned; window_size=(left, right), -1 = unbounded; softcap > 0 applies
    softcap * tanh(S / softcap); alibi_slopes: float32 (heads_q,) or (batch, heads_q).
    backend: "cpu" (FlashAttention-2 on the CPU) or "reference" (the library's fp64 oracle).

    Returns out (like q), or (out, lse) with return_lse=True: lse is float32 (batch, heads_q, seqlen_q), or
    (heads_q, total_q) for varlen; rows that see no key have out = 0 and lse = -inf.
    """
    exe = _backend(backend, num_threads)
    pr = _Problem(q, k, v, causal, softmax_scale, window_size, softcap, alibi_slopes, False, cu_seqlens_q,
                  cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    out = np.empty(q.shape, dtype=q.dtype)
    lse = np.empty(pr.lse_shape, dtype=np.float32)
    if pr.no_keys:  # the library wants seqlen_k >= 1; every row is empty
        out[...] = 0
        lse[...] = -np.inf
    elif pr.rows:
        pr.set("o", out)
        pr.p.lse = lse.ctypes.data
        pr.run("fa_fwd", exe, 0)
    return (out, lse) if return_lse else out


def attention_backward(dout, q, k, v, out, lse, causal=False, softmax_scale=None, window_size=(-1, -1),
                       softcap=0.0, alibi_slopes=None, deterministic=False, *, cu_seqlens_q=None,
                       cu_seqlens_k=None, max_seqlen_q=None, max_seqlen_k=None, backend="cpu", num_threads=0):
    """Gradients (dq, dk, dv) of attention() for the upstream gradient dout (shape and dtype of q).

    out and lse must come from attention(..., return_lse=True) with the same arguments. dq has q's shape,
    dk and dv k's shape (summed over the query heads of each group for GQA/MQA); all contiguous.
    """
    exe = _backend(backend, num_threads)
    pr = _Problem(q, k, v, causal, softmax_scale, window_size, softcap, alibi_slopes, deterministic,
                  cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k)
    for name, a in (("dout", dout), ("out", out)):
        _check_array(name, a, q.dtype)
        if a.shape != q.shape:
            raise ValueError(f"{name} must have q's shape {q.shape}, got {a.shape}")
    if not isinstance(lse, np.ndarray):
        raise TypeError(f"lse must be a numpy.ndarray, got {type(lse).__name__}")
    if lse.dtype != np.float32:
        raise TypeError(f"lse must be float32, got {lse.dtype}")
    if lse.shape != pr.lse_shape:
        raise ValueError(f"lse must have shape {pr.lse_shape}, got {lse.shape}")
    lse = np.ascontiguousarray(lse)
    dq = np.empty(q.shape, dtype=q.dtype)
    dk = np.empty(k.shape, dtype=k.dtype)
    dv = np.empty(v.shape, dtype=v.dtype)
    if pr.no_keys or not pr.rows:
        dq[...], dk[...], dv[...] = 0, 0, 0
    else:
        pr.set("o", out)
        pr.set("dout", dout)
        pr.set("dq", dq)
        pr.set("dk", dk)
        pr.set("dv", dv)
        pr.arrays.append(lse)
        pr.p.lse = lse.ctypes.data
        pr.run("fa_bwd", exe, 1)
    return dq, dk, dv


def _int32_view(name, a, batch_like=None):
    """A contiguous int32 copy of an integer array (or a scalar broadcast to (batch,)), as a View."""
    from ._kvcache import View

    if a is None:
        return None, None
    if batch_like is not None and np.ndim(a) == 0:
        a = np.full((batch_like,), int(a), dtype=np.int64)
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy.ndarray of int32, got {type(a).__name__}")
    if a.dtype.kind not in "iu":
        raise TypeError(f"{name} must hold integers (int32), got dtype {a.dtype}")
    if a.size and (a.min() < -2**31 or a.max() >= 2**31):
        raise ValueError(f"{name} holds values outside the int32 range")
    c = np.ascontiguousarray(a, dtype=np.int32)
    return View(name, c.ctypes.data, c.shape, _strides(c)), c


def attention_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                           cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                           rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False, *,
                           backend="cpu", num_threads=0):
    """Decoding with a KV cache on numpy arrays: flash-attn's flash_attn_with_kvcache, argument for argument.

    q: (batch, seqlen_q, heads_q, head_dim). k_cache, v_cache: (batch_cache, seqlen_cache, heads_kv, head_dim),
    or (num_pages, page_size, heads_kv, head_dim) with block_table (batch, max_pages) int32. k, v: new tokens
    (batch, seqlen_new, heads_kv, head_dim), written into the cache IN PLACE at rows cache_seqlens[b] ..
    before attending. rotary_cos / rotary_sin (seqlen_ro, rotary_dim / 2): rotary embedding of q and the new
    keys (interleaved pairs or halves), only with k and v. cache_seqlens: int or (batch,) int (default: the
    whole cache); cache_batch_idx: (batch,) cache rows (contiguous cache only); cache_leftpad: (batch,) first
    attended row. Every float array has q's dtype. num_splits is a hint the host backends ignore.
    Returns out (like q), or (out, lse float32 (batch, heads_q, seqlen_q)) with return_softmax_lse=True.
    """
    from . import _kvcache

    exe = _backend(backend, num_threads)
    if not isinstance(q, np.ndarray):
        raise TypeError(f"q must be a numpy.ndarray, got {type(q).__name__}")
    dtype = _fa_dtype("q", q)
    keep = []

    def view(name, a):
        if a is None:
            return None
        _check_array(name, a, q.dtype)
        if not a.flags.writeable and name in ("k_cache", "v_cache") and k is not None:
            raise ValueError(f"{name} is read-only but the new tokens k, v are written into it")
        keep.append(a)
        return _kvcache.View(name, a.ctypes.data, a.shape, _strides(a))

    _check_last_dim("q", q)
    batch = q.shape[0] if q.ndim == 4 else 0
    ints = {}
    for name, a in (("cache_seqlens", cache_seqlens), ("cache_batch_idx", cache_batch_idx),
                    ("cache_leftpad", cache_leftpad), ("block_table", block_table)):
        ints[name], arr = _int32_view(name, a, batch if name == "cache_seqlens" else None)
        keep.append(arr)
    alibi, stride = _alibi(alibi_slopes, batch, q.shape[2] if q.ndim == 4 else 0)
    out = np.empty(q.shape, dtype=q.dtype)
    lse = np.empty((batch, q.shape[2], q.shape[1]) if q.ndim == 4 else (0,), dtype=np.float32)
    p, kv = _kvcache.build(dtype, view("q", q), view("k_cache", k_cache), view("v_cache", v_cache), view("k", k),
                           view("v", v), view("out", out), view("rotary_cos", rotary_cos),
                           view("rotary_sin", rotary_sin), ints["cache_seqlens"], ints["cache_batch_idx"],
                           ints["cache_leftpad"], ints["block_table"], softmax_scale, causal, window_size, softcap,
                           None if alibi is None else (alibi.ctypes.data, stride), rotary_interleaved, num_splits)
    p.lse = lse.ctypes.data

    def allocate(n):
        ws = np.empty(n, dtype=np.uint8)
        return ws, ws.ctypes.data

    _kvcache.run(p, kv, exe, allocate)
    del keep
    return (out, lse) if return_softmax_lse else out
