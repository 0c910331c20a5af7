# SPDX-License-Identifier: Apache-2.0
"""Argument checks and fa_params filling shared by the numpy and the PyTorch entry points. Works on plain
shapes and numbers so that it needs neither numpy nor torch. Every message names the offending argument."""

import math

from . import _lib

INT32_MAX = 2**31 - 1


def int_arg(name, value, lo=0, hi=INT32_MAX):
    """value as an int in [lo, hi], for a C integer field: ctypes would otherwise silently keep the low bits
    (2**32 + 1 threads would become 1)."""
    try:
        n = int(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be an integer, got {value!r}") from None
    if n != value or not lo <= n <= hi:
        raise ValueError(f"{name} ({value!r}) must be an integer in [{lo}, {hi}]")
    return n


def _check_sizes(**sizes):
    for what, n in sizes.items():
        int_arg(what, n)


def check_shape_ndim(name, shape, ndim, layout):
    if len(shape) != ndim:
        raise ValueError(f"{name} must be {ndim}-D {layout}, got shape {tuple(shape)}")


def dense_sizes(q_shape, k_shape, v_shape):
    """(batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim) of dense (batch, seqlen, heads, head_dim)
    tensors, checking that they agree."""
    layout = "(batch, seqlen, heads, head_dim)"
    for name, shape in (("q", q_shape), ("k", k_shape), ("v", v_shape)):
        check_shape_ndim(name, shape, 4, layout)
    batch, seqlen_q, heads_q, head_dim = q_shape
    if tuple(v_shape) != tuple(k_shape):
        raise ValueError(f"v must have the shape of k {tuple(k_shape)}, got {tuple(v_shape)}")
    if k_shape[0] != batch:
        raise ValueError(f"k has batch {k_shape[0]} but q has batch {batch}")
    if k_shape[3] != head_dim:
        raise ValueError(f"k has head_dim {k_shape[3]} but q has head_dim {head_dim}")
    heads_kv = k_shape[2]
    _check_heads(heads_q, heads_kv)
    _check_sizes(batch=batch, seqlen_q=seqlen_q, seqlen_k=k_shape[1], heads_q=heads_q, heads_kv=heads_kv,
                 head_dim=head_dim)
    return batch, seqlen_q, k_shape[1], heads_q, heads_kv, head_dim


def varlen_sizes(q_shape, k_shape, v_shape, cu_q_shape, cu_k_shape):
    """(batch, total_q, total_k, heads_q, heads_kv, head_dim) of packed (total, heads, head_dim) tensors."""
    layout = "(total_tokens, heads, head_dim)"
    for name, shape in (("q", q_shape), ("k", k_shape), ("v", v_shape)):
        check_shape_ndim(name, shape, 3, layout)
    total_q, heads_q, head_dim = q_shape
    if tuple(v_shape) != tuple(k_shape):
        raise ValueError(f"v must have the shape of k {tuple(k_shape)}, got {tuple(v_shape)}")
    if k_shape[2] != head_dim:
        raise ValueError(f"k has head_dim {k_shape[2]} but q has head_dim {head_dim}")
    heads_kv = k_shape[1]
    _check_heads(heads_q, heads_kv)
    for name, shape in (("cu_seqlens_q", cu_q_shape), ("cu_seqlens_k", cu_k_shape)):
        if len(shape) != 1 or shape[0] < 1:
            raise ValueError(f"{name} must be 1-D with batch + 1 entries, got shape {tuple(shape)}")
    if cu_q_shape[0] != cu_k_shape[0]:
        raise ValueError(
            f"cu_seqlens_q has {cu_q_shape[0]} entries but cu_seqlens_k has {cu_k_shape[0]}; both must be batch + 1"
        )
    _check_sizes(batch=cu_q_shape[0] - 1, total_q=total_q, total_k=k_shape[0], heads_q=heads_q, heads_kv=heads_kv,
                 head_dim=head_dim)
    return cu_q_shape[0] - 1, total_q, k_shape[0], heads_q, heads_kv, head_dim


def _check_heads(heads_q, heads_kv):
    if heads_kv == 0 or heads_q % heads_kv != 0:
        raise ValueError(f"q's heads ({heads_q}) must be a multiple of k's and v's heads ({heads_kv})")


def window(window_size):
    """(left, right) from flash-attn's window_size; any negative side means unbounded (-1)."""
    try:
        left, right = window_size
        left, right = int(left), int(right)
    except (TypeError, ValueError):
        raise ValueError(f"window_size must be a pair of ints (left, right), got {window_size!r}") from None
    for side, n in (("left", left), ("right", right)):
        if n > INT32_MAX:
            raise ValueError(f"window_size {side} ({n}) exceeds the int32 limit")
    return (left if left >= 0 else -1), (right if right >= 0 else -1)


def scale(softmax_scale, head_dim):
    if softmax_scale is None:
        return head_dim ** -0.5 if head_dim > 0 else 1.0
    s = float(softmax_scale)
    # plain comparisons (also false for NaN) rather than math.isfinite, so torch.compile can trace symbolic floats
    if not (-math.inf < s < math.inf) or s == 0.0:
        raise ValueError(f"softmax_scale must be finite and nonzero, got {softmax_scale!r}")
    return s


def check_softcap(softcap):
    c = float(softcap)
    if not (0.0 <= c < math.inf):
        raise ValueError(f"softcap must be a finite number >= 0 (0 = off), got {softcap!r}")
    return c


def check_dropout(dropout_p):
    if dropout_p != 0.0:
        raise NotImplementedError(
            f"dropout_p={dropout_p!r}: dropout is not supported by flashattn yet; pass dropout_p=0.0 "
            "(e.g. in eval mode) or apply dropout elsewhere"
        )


def check_alibi_shape(shape, batch, heads_q):
    if tuple(shape) not in ((heads_q,), (batch, heads_q)):
        raise ValueError(
            f"alibi_slopes must have shape (heads_q,) = ({heads_q},) or (batch, heads_q) = ({batch}, {heads_q}), "
            f"got {tuple(shape)}"
        )


def set_tensor(t, ptr, strides, varlen):
    """Fills an fa_tensor from a data pointer and element strides of a (b, s, h, d) or (t, h, d) array."""
    t.data = ptr
    if varlen:
        t.stride_batch = 0
        t.stride_seq, t.stride_head = strides[0], strides[1]
    else:
        t.stride_batch, t.stride_seq, t.stride_head = strides[0], strides[1], strides[2]


def make_params(dtype, sizes, varlen, softmax_scale, causal, window_lr, softcap, deterministic=False):
    """fa_params with sizes and options set; tensors are set by the caller."""
    if varlen:
        batch, total_q, total_k, heads_q, heads_kv, head_dim, max_q, max_k = sizes
        p = _lib.new_params(dtype, batch, max_q, max_k, heads_q, heads_kv, head_dim)
        p.total_q, p.total_k = total_q, total_k
    else:
        batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim = sizes
        p = _lib.new_params(dtype, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim)
    p.softmax_scale = softmax_scale
    p.causal = 1 if causal else 0
    p.window_left, p.window_right = window_lr
    p.softcap = softcap
    p.deterministic = 1 if deterministic else 0
    return p
