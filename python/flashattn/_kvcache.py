# SPDX-License-Identifier: Apache-2.0
"""flash_attn_with_kvcache's arguments as an fa_params and an fa_kvcache, shared by the numpy and the
PyTorch entry points. Arrays arrive as Views (data pointer, shape, strides in elements), so nothing here
imports numpy or torch. Shapes are checked here, naming the argument; the values (lengths, page indices,
rotary positions) are checked by the library, which writes nothing, the cache included, when they are wrong.
"""

import ctypes
from collections import namedtuple

from . import _common, _lib

View = namedtuple("View", "name ptr shape strides")


def _ndim(view, ndim, layout):
    if len(view.shape) != ndim:
        raise ValueError(f"{view.name} must be {ndim}-D {layout}, got shape {tuple(view.shape)}")


def _per_sequence(view, batch):
    if view is None:
        return None
    if tuple(view.shape) != (batch,):
        raise ValueError(f"{view.name} must have shape (batch,) = ({batch},), got {tuple(view.shape)}")
    return view.ptr


def build(dtype, q, k_cache, v_cache, k, v, out, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx,
          cache_leftpad, block_table, softmax_scale, causal, window_size, softcap, alibi, rotary_interleaved,
          num_splits):
    """(fa_params, fa_kvcache) of one call. alibi: None or (pointer, batch stride); the int32 arrays are Views
    of contiguous int32 memory or None."""
    _ndim(q, 4, "(batch, seqlen_q, heads_q, head_dim)")
    batch, seqlen_q, heads_q, head_dim = q.shape
    paged = block_table is not None
    layout = "(num_pages, page_size, heads_kv, head_dim)" if paged else "(batch_cache, seqlen_cache, heads_kv, head_dim)"
    _ndim(k_cache, 4, layout)
    if tuple(v_cache.shape) != tuple(k_cache.shape):
        raise ValueError(f"v_cache must have the shape of k_cache {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    dim0, dim1, heads_kv, cache_dim = k_cache.shape
    if cache_dim != head_dim:
        raise ValueError(f"k_cache has head_dim {cache_dim} but q has head_dim {head_dim}")
    if heads_kv == 0 or heads_q % heads_kv:
        raise ValueError(f"q's heads ({heads_q}) must be a multiple of the cache's heads ({heads_kv})")
    if (k is None) != (v is None):
        raise ValueError("k and v (the new tokens) must be given together")
    seqlen_new = 0
    if k is not None:
        want = (batch, k.shape[1] if len(k.shape) == 4 else -1, heads_kv, head_dim)
        for t in (k, v):
            if len(t.shape) != 4 or tuple(t.shape) != want:
                raise ValueError(f"{t.name} must have shape (batch, seqlen_new, heads_kv, head_dim) = "
                                 f"({batch}, seqlen_new, {heads_kv}, {head_dim}), got {tuple(t.shape)}")
        seqlen_new = k.shape[1]
    for name, n in (("batch", batch), ("seqlen_q", seqlen_q), ("heads_q", heads_q), ("head_dim", head_dim),
                    ("seqlen_new", seqlen_new), ("k_cache.shape[0]", dim0), ("k_cache.shape[1]", dim1)):
        _common.int_arg(name, n)

    p = _lib.new_params(dtype, batch, seqlen_q, seqlen_new, heads_q, heads_kv, head_dim)
    p.softmax_scale = _common.scale(softmax_scale, head_dim)
    p.causal = 1 if causal else 0
    p.window_left, p.window_right = _common.window(window_size)
    p.softcap = _common.check_softcap(softcap)
    if alibi is not None:
        p.alibi_slopes, p.alibi_batch_stride = alibi
    _common.set_tensor(p.q, q.ptr, q.strides, False)
    _common.set_tensor(p.o, out.ptr, out.strides, False)
    if k is not None:
        _common.set_tensor(p.k, k.ptr, k.strides, False)
        _common.set_tensor(p.v, v.ptr, v.strides, False)

    kv = _lib.new_kvcache(0 if paged else dim0, 0 if paged else dim1)
    _common.set_tensor(kv.k_cache, k_cache.ptr, k_cache.strides, False)
    _common.set_tensor(kv.v_cache, v_cache.ptr, v_cache.strides, False)
    if paged:
        _ndim(block_table, 2, "(batch, max_pages)")
        if block_table.shape[0] != batch:
            raise ValueError(f"block_table has {block_table.shape[0]} rows but q has batch {batch}")
        if block_table.shape[1] > 1 and block_table.strides[1] != 1:
            raise ValueError(f"block_table must be contiguous in its last dimension, got strides {block_table.strides}")
        kv.block_table = block_table.ptr
        kv.block_table_stride = block_table.strides[0] if batch > 1 else 0
        kv.max_pages = _common.int_arg("block_table.shape[1]", block_table.shape[1])
        kv.num_pages, kv.page_size = dim0, dim1
    kv.cache_seqlens = _per_sequence(cache_seqlens, batch)
    kv.cache_batch_idx = _per_sequence(cache_batch_idx, batch)
    kv.cache_leftpad = _per_sequence(cache_leftpad, batch)
    if (rotary_cos is None) != (rotary_sin is None):
        raise ValueError("rotary_cos and rotary_sin must be given together")
    if rotary_cos is not None:
        for t in (rotary_cos, rotary_sin):
            _ndim(t, 2, "(seqlen_ro, rotary_dim / 2)")
        if tuple(rotary_sin.shape) != tuple(rotary_cos.shape):
            raise ValueError(f"rotary_sin must have the shape of rotary_cos {tuple(rotary_cos.shape)}, "
                             f"got {tuple(rotary_sin.shape)}")
        kv.rotary_cos, kv.rotary_sin = rotary_cos.ptr, rotary_sin.ptr
        kv.rotary_seqlen = _common.int_arg("rotary_cos.shape[0]", rotary_cos.shape[0])
        kv.rotary_dim = _common.int_arg("rotary_dim", 2 * rotary_cos.shape[1])
    kv.rotary_interleaved = 1 if rotary_interleaved else 0
    kv.num_splits = _common.int_arg("num_splits", num_splits, lo=-_common.INT32_MAX - 1)  # the library names a negative one
    return p, kv


def run(p, kv, exe, allocate):
    """Runs the call with a workspace from allocate(bytes) (an object kept alive until the call returns, and
    its address); returns the workspace's bytes."""
    n = _lib.workspace_size_kvcache(p, kv, exe)
    holder = None
    if n:
        holder, address = allocate(n)
        exe.workspace, exe.workspace_bytes = address, n
    _lib.call("fa_fwd_kvcache", ctypes.byref(p), ctypes.byref(kv), ctypes.byref(exe))
    del holder
    return n
