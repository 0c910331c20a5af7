# SPDX-License-Identifier: Apache-2.0
"""PyTorch entry points with flash-attn 2.x's names, arguments and (batch, seqlen, heads, head_dim) layout.

The library calls are torch.library custom ops (namespace "flashattn": fwd, bwd, varlen_fwd, varlen_bwd)
with fake implementations, so torch.compile(fullgraph=True) traces through them; the forward ops carry an
autograd formula (register_autograd) that runs the backward ops. CUDA tensors run on the CUDA backend on the
current stream, CPU tensors on the CPU backend. Workspace comes from PyTorch's allocator.
"""

import ctypes
import threading
from typing import Optional, Tuple

import torch

from . import _common, _lib

if not hasattr(torch, "library") or not hasattr(torch.library, "custom_op"):
    raise ImportError(f"flashattn needs PyTorch >= 2.4 (torch.library.custom_op); found {torch.__version__}")

_DTYPES = {torch.float32: _lib.FA_F32, torch.float16: _lib.FA_F16, torch.bfloat16: _lib.FA_BF16}

Tensor = torch.Tensor


# ---- checks (run in the real and the fake implementations, so torch.compile reports them at trace time) ----

def _check_tensor(name, t, like=None):
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    if like is None:
        if t.dtype not in _DTYPES:
            raise TypeError(f"{name} must be float16, bfloat16 or float32, got {t.dtype}")
        if t.device.type not in ("cpu", "cuda"):
            raise ValueError(f"{name} must be a CPU or CUDA tensor, got device {t.device}")
    else:
        if t.dtype != like.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but q has dtype {like.dtype}; they must match")
        if t.device != like.device:
            raise ValueError(f"{name} is on {t.device} but q is on {like.device}; they must be on one device")
    if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        raise ValueError(f"{name} must be contiguous in its last dimension (head_dim); got strides {t.stride()}")


def _check_alibi(alibi_slopes, q, batch, heads_q):
    if alibi_slopes is None:
        return
    if not isinstance(alibi_slopes, torch.Tensor):
        raise TypeError(f"alibi_slopes must be a torch.Tensor, got {type(alibi_slopes).__name__}")
    if alibi_slopes.dtype != torch.float32:
        raise TypeError(f"alibi_slopes must be float32, got {alibi_slopes.dtype}")
    if alibi_slopes.device != q.device:
        raise ValueError(f"alibi_slopes is on {alibi_slopes.device} but q is on {q.device}")
    _common.check_alibi_shape(alibi_slopes.shape, batch, heads_q)


def _check_dense(q, k, v, alibi_slopes):
    _check_tensor("q", q)
    _check_tensor("k", k, q)
    _check_tensor("v", v, q)
    sizes = _common.dense_sizes(q.shape, k.shape, v.shape)
    _check_alibi(alibi_slopes, q, sizes[0], sizes[3])
    return sizes


def _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes):
    _check_tensor("q", q)
    _check_tensor("k", k, q)
    _check_tensor("v", v, q)
    for name, cu in (("cu_seqlens_q", cu_seqlens_q), ("cu_seqlens_k", cu_seqlens_k)):
        if not isinstance(cu, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor of int32, got {type(cu).__name__}")
        if cu.dtype != torch.int32:
            raise TypeError(f"{name} must be int32, got {cu.dtype}")
        if cu.device != q.device:
            raise ValueError(f"{name} is on {cu.device} but q is on {q.device}")
    batch, total_q, total_k, heads_q, heads_kv, head_dim = _common.varlen_sizes(
        q.shape, k.shape, v.shape, cu_seqlens_q.shape, cu_seqlens_k.shape)
    for name, n in (("max_seqlen_q", max_seqlen_q), ("max_seqlen_k", max_seqlen_k)):
        if n < 0 or n > _common.INT32_MAX:
            raise ValueError(f"{name} must be in [0, 2^31), got {n}")
    _check_alibi(alibi_slopes, q, batch, heads_q)
    return batch, total_q, total_k, heads_q, heads_kv, head_dim, max_seqlen_q, max_seqlen_k


def _check_cu_seqlens_host(name, cu, total):
    """Host-side sanity of cu_seqlens on CPU tensors (cheap); on CUDA it would cost a synchronisation."""
    if cu.device.type != "cpu":
        return
    c = cu.to(torch.int64)
    if c[0].item() != 0:
        raise ValueError(f"{name} must start at 0, got {c[0].item()}")
    if c.numel() > 1 and bool((c[1:] < c[:-1]).any()):
        raise ValueError(f"{name} must be non-decreasing, got {cu.tolist()}")
    if c[-1].item() > total:
        raise ValueError(f"{name}[-1] ({c[-1].item()}) exceeds the {total} token rows of its tensor")


def _check_backward_inputs(dout, q, out, lse, lse_shape):
    _check_tensor("dout", dout, q)
    _check_tensor("out", out, q)
    for name, t in (("dout", dout), ("out", out)):
        if t.shape != q.shape:
            raise ValueError(f"{name} must have q's shape {tuple(q.shape)}, got {tuple(t.shape)}")
    if lse.dtype != torch.float32 or lse.device != q.device or tuple(lse.shape) != tuple(lse_shape):
        raise ValueError(f"lse must be float32 {tuple(lse_shape)} on {q.device}, got {lse.dtype} "
                         f"{tuple(lse.shape)} on {lse.device}")


# ---- calling the library ----

def _exec_for(t):
    exe = _lib.Exec()
    if t.device.type == "cuda":
        exe.backend = _lib.FA_BACKEND_CUDA
        exe.device = t.device.index if t.device.index is not None else torch.cuda.current_device()
        exe.stream = torch.cuda.current_stream(t.device).cuda_stream
        exe.check = int(_lib.DEBUG)
    else:
        exe.backend = _lib.FA_BACKEND_CPU
        exe.device = -1
        exe.num_threads = torch.get_num_threads()
    return exe


def _gpu_friendly(t):
    """GPU kernels load 16-byte vectors: a CUDA input whose data pointer is not 16-byte aligned or whose strides
    are not multiples of 16 bytes is copied (rare: odd views); everything else is passed through as is."""
    if t.device.type != "cuda":
        return t
    unit = 16 // t.element_size()
    if t.data_ptr() % 16 == 0 and all(st % unit == 0 or n == 1 for st, n in zip(t.stride()[:-1], t.shape[:-1])):
        return t
    return t.clone(memory_format=torch.contiguous_format)


def _set(p, field, t, varlen):
    _common.set_tensor(getattr(p, field), t.data_ptr(), t.stride(), varlen)


def _run(function, p, like, backward):
    exe = _exec_for(like)
    n = _lib.workspace_size(p, exe, backward)
    workspace = None
    if n:
        workspace = torch.empty(n, dtype=torch.uint8, device=like.device)
        exe.workspace, exe.workspace_bytes = workspace.data_ptr(), n
    _lib.call(function, ctypes.byref(p), ctypes.byref(exe))
    del workspace  # safe on CUDA: the allocator reuses it only for work queued after this call on the stream


def _params(q, sizes, varlen, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
            deterministic=False):
    p = _common.make_params(_DTYPES[q.dtype], sizes, varlen, softmax_scale, causal, (window_left, window_right),
                            softcap, deterministic)
    if alibi_slopes is not None:
        alibi_slopes = alibi_slopes.contiguous()
        p.alibi_slopes = alibi_slopes.data_ptr()
        p.alibi_batch_stride = sizes[3] if alibi_slopes.dim() == 2 else 0
    return p, alibi_slopes


def _forward(q, k, v, sizes, varlen, cu_q, cu_k, lse_shape, rows, softmax_scale, causal, window_left,
             window_right, softcap, alibi_slopes):
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = torch.empty(lse_shape, dtype=torch.float32, device=q.device)
    if rows == 0:
        return out, lse
    if k.shape[0] == 0 or (not varlen and k.shape[1] == 0):  # no keys at all: every row is empty
        return out.zero_(), lse.fill_(float("-inf"))
    p, alibi = _params(q, sizes, varlen, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes)
    if varlen:
        cu_q, cu_k = cu_q.contiguous(), cu_k.contiguous()
        p.cu_seqlens_q, p.cu_seqlens_k = cu_q.data_ptr(), cu_k.data_ptr()
    q, k, v = _gpu_friendly(q), _gpu_friendly(k), _gpu_friendly(v)
    for field, t in (("q", q), ("k", k), ("v", v), ("o", out)):
        _set(p, field, t, varlen)
    p.lse = lse.data_ptr()
    _run("fa_fwd", p, q, 0)
    return out, lse


def _backward(dout, q, k, v, out, lse, sizes, varlen, cu_q, cu_k, rows, softmax_scale, causal, window_left,
              window_right, softcap, alibi_slopes, deterministic):
    dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dk = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    dv = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    if rows == 0 or k.shape[0] == 0 or (not varlen and k.shape[1] == 0):
        return dq.zero_(), dk.zero_(), dv.zero_()
    p, alibi = _params(q, sizes, varlen, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
                       deterministic)
    if varlen:
        cu_q, cu_k = cu_q.contiguous(), cu_k.contiguous()
        p.cu_seqlens_q, p.cu_seqlens_k = cu_q.data_ptr(), cu_k.data_ptr()
    lse = lse.contiguous()
    dout, q, k, v, out = (_gpu_friendly(t) for t in (dout, q, k, v, out))
    for field, t in (("q", q), ("k", k), ("v", v), ("o", out), ("dout", dout), ("dq", dq), ("dk", dk), ("dv", dv)):
        _set(p, field, t, varlen)
    p.lse = lse.data_ptr()
    _run("fa_bwd", p, q, 1)
    return dq, dk, dv


# ---- custom ops ----
# The forward ops take `deterministic` (unused there) so that their autograd formula can pass it to the backward.

@torch.library.custom_op("flashattn::fwd", mutates_args=())
def _fwd_op(q: Tensor, k: Tensor, v: Tensor, softmax_scale: float, causal: bool, window_left: int,
            window_right: int, softcap: float, alibi_slopes: Optional[Tensor],
            deterministic: bool) -> Tuple[Tensor, Tensor]:
    sizes = _check_dense(q, k, v, alibi_slopes)
    batch, seqlen_q, _, heads_q, _, _ = sizes
    return _forward(q, k, v, sizes, False, None, None, (batch, heads_q, seqlen_q), batch * seqlen_q * heads_q,
                    softmax_scale, causal, window_left, window_right, softcap, alibi_slopes)


@_fwd_op.register_fake
def _fwd_fake(q, k, v, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, deterministic):
    batch, seqlen_q, _, heads_q, _, _ = _check_dense(q, k, v, alibi_slopes)
    return q.new_empty(q.shape), q.new_empty((batch, heads_q, seqlen_q), dtype=torch.float32)


@torch.library.custom_op("flashattn::bwd", mutates_args=())
def _bwd_op(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, softmax_scale: float,
            causal: bool, window_left: int, window_right: int, softcap: float, alibi_slopes: Optional[Tensor],
            deterministic: bool) -> Tuple[Tensor, Tensor, Tensor]:
    sizes = _check_dense(q, k, v, alibi_slopes)
    batch, seqlen_q, _, heads_q, _, _ = sizes
    _check_backward_inputs(dout, q, out, lse, (batch, heads_q, seqlen_q))
    return _backward(dout, q, k, v, out, lse, sizes, False, None, None, batch * seqlen_q * heads_q, softmax_scale,
                     causal, window_left, window_right, softcap, alibi_slopes, deterministic)


@_bwd_op.register_fake
def _bwd_fake(dout, q, k, v, out, lse, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes,
              deterministic):
    batch, seqlen_q, _, heads_q, _, _ = _check_dense(q, k, v, alibi_slopes)
    _check_backward_inputs(dout, q, out, lse, (batch, heads_q, seqlen_q))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


@torch.library.custom_op("flashattn::varlen_fwd", mutates_args=())
def _varlen_fwd_op(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, max_seqlen_q: int,
                   max_seqlen_k: int, softmax_scale: float, causal: bool, window_left: int, window_right: int,
                   softcap: float, alibi_slopes: Optional[Tensor], deterministic: bool) -> Tuple[Tensor, Tensor]:
    sizes = _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes)
    _check_cu_seqlens_host("cu_seqlens_q", cu_seqlens_q, sizes[1])
    _check_cu_seqlens_host("cu_seqlens_k", cu_seqlens_k, sizes[2])
    heads_q, total_q = sizes[3], sizes[1]
    return _forward(q, k, v, sizes, True, cu_seqlens_q, cu_seqlens_k, (heads_q, total_q), heads_q * total_q,
                    softmax_scale, causal, window_left, window_right, softcap, alibi_slopes)


@_varlen_fwd_op.register_fake
def _varlen_fwd_fake(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal,
                     window_left, window_right, softcap, alibi_slopes, deterministic):
    sizes = _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes)
    return q.new_empty(q.shape), q.new_empty((sizes[3], sizes[1]), dtype=torch.float32)


@torch.library.custom_op("flashattn::varlen_bwd", mutates_args=())
def _varlen_bwd_op(dout: Tensor, q: Tensor, k: Tensor, v: Tensor, out: Tensor, lse: Tensor, cu_seqlens_q: Tensor,
                   cu_seqlens_k: Tensor, max_seqlen_q: int, max_seqlen_k: int, softmax_scale: float, causal: bool,
                   window_left: int, window_right: int, softcap: float, alibi_slopes: Optional[Tensor],
                   deterministic: bool) -> Tuple[Tensor, Tensor, Tensor]:
    sizes = _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes)
    _check_cu_seqlens_host("cu_seqlens_q", cu_seqlens_q, sizes[1])
    _check_cu_seqlens_host("cu_seqlens_k", cu_seqlens_k, sizes[2])
    heads_q, total_q = sizes[3], sizes[1]
    _check_backward_inputs(dout, q, out, lse, (heads_q, total_q))
    return _backward(dout, q, k, v, out, lse, sizes, True, cu_seqlens_q, cu_seqlens_k, heads_q * total_q,
                     softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, deterministic)


@_varlen_bwd_op.register_fake
def _varlen_bwd_fake(dout, q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                     softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, deterministic):
    sizes = _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, alibi_slopes)
    _check_backward_inputs(dout, q, out, lse, (sizes[3], sizes[1]))
    return q.new_empty(q.shape), k.new_empty(k.shape), v.new_empty(v.shape)


# ---- autograd ----
# torch.library.register_autograd wraps each forward op in a torch.autograd.Function whose backward is the
# matching backward op. Unlike a hand-written autograd.Function around the op, torch.compile then sees one
# opaque op, so it also traces calls that pass one tensor twice (q = k = v, cu_seqlens_q = cu_seqlens_k).
# lse is marked non-differentiable: gradients do not flow through it (as in flash-attn).

def _last_dim_contiguous(t):
    return t if t.shape[-1] <= 1 or t.stride(-1) == 1 else t.contiguous()


def _fwd_setup_context(ctx, inputs, output):
    q, k, v, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, deterministic = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, alibi_slopes)
    ctx.options = (softmax_scale, causal, window_left, window_right, softcap)
    ctx.deterministic = deterministic
    ctx.mark_non_differentiable(lse)


def _fwd_backward(ctx, dout, dlse):
    q, k, v, out, lse, alibi_slopes = ctx.saved_tensors
    softmax_scale, causal, window_left, window_right, softcap = ctx.options
    dq, dk, dv = torch.ops.flashattn.bwd(_last_dim_contiguous(dout), q, k, v, out, lse, softmax_scale, causal,
                                         window_left, window_right, softcap, alibi_slopes, ctx.deterministic)
    return dq, dk, dv, None, None, None, None, None, None, None


def _varlen_fwd_setup_context(ctx, inputs, output):
    (q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left,
     window_right, softcap, alibi_slopes, deterministic) = inputs
    out, lse = output
    ctx.save_for_backward(q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes)
    ctx.options = (max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap)
    ctx.deterministic = deterministic
    ctx.mark_non_differentiable(lse)


def _varlen_fwd_backward(ctx, dout, dlse):
    q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, alibi_slopes = ctx.saved_tensors
    max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_left, window_right, softcap = ctx.options
    dq, dk, dv = torch.ops.flashattn.varlen_bwd(
        _last_dim_contiguous(dout), q, k, v, out, lse, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
        softmax_scale, causal, window_left, window_right, softcap, alibi_slopes, ctx.deterministic)
    return dq, dk, dv, None, None, None, None, None, None, None, None, None, None, None


_fwd_op.register_autograd(_fwd_backward, setup_context=_fwd_setup_context)
_varlen_fwd_op.register_autograd(_varlen_fwd_backward, setup_context=_varlen_fwd_setup_context)


# ---- the eager path ----
# A call's host time is what a decoding step or a short sequence waits for. Outside torch.compile's tracing and
# on plain tensors, the public functions skip the custom-op dispatch: the first call of a signature (shapes,
# strides, dtypes, devices, options) runs the custom ops' checks and keeps a prepared call, an fa_params and
# fa_exec filled for it, and the workspace size; later calls of the signature fill in only the data pointers and
# the stream, allocate the outputs and the workspace, and call the library, which validates every call as
# always. Autograd goes through a torch.autograd.Function whose backward is prepared the same way, per output
# gradient strides. torch.compile, opcheck, functorch transforms, tensor subclasses and the inputs a prepared
# call leaves out (padded head dims, empty problems, unaligned data) take the custom ops.
# A call's Python is counted in hundreds of nanoseconds: outputs come from empty_like or from sizes passed as
# separate arguments (a torch.empty that parses a shape tuple costs twice as much), and the key is built inline.

_PREPARED_MAX = 256  # per thread; emptied when full (a model has a handful of attention signatures)
_prepared = threading.local()  # per thread, so that no two threads fill one parameter block at once
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)  # what PyTorch's generated code calls
_functorch_active = torch._C._are_functorch_transforms_active
_is_compiling = torch.compiler.is_compiling
_empty = torch.empty
_empty_like = torch.empty_like
_CONTIGUOUS = torch.contiguous_format


def _current_stream(index):
    if _raw_stream is not None:
        return _raw_stream(index)
    return torch.cuda.current_stream(index).cuda_stream


def _by_address(name):
    """A second handle on fa_fwd / fa_bwd taking the parameter block and the exec by address: the declared
    prototypes' byref conversions cost more than the call itself."""
    fn = _lib.lib[name]
    fn.restype = ctypes.c_int
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
    return fn


_fa_fwd = _by_address("fa_fwd")
_fa_bwd = _by_address("fa_bwd")


def _contiguous_strides(shape):
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _vector_strides(t):
    """Whether every stride but the last is a whole number of 16-byte vectors (or spans an extent of 1)."""
    unit = 16 // t.element_size()
    return all(st % unit == 0 or n == 1 for st, n in zip(t.stride()[:-1], t.shape[:-1]))


class _Prepared:
    """One call signature's filled fa_params and fa_exec, views of the fa_tensor fields each call fills, and
    what its outputs look like. `sizes`, `options` and `lse_shape` are what the custom ops' helpers take."""

    __slots__ = ("params", "exe", "params_addr", "exe_addr", "views", "cuda", "device", "device_index",
                 "workspace_bytes", "sizes", "options", "lse_shape", "rows", "varlen", "entry", "name", "backward")

    def __init__(self, params, fields, device, sizes, options, lse_shape, rows, varlen, backward):
        self.params = params
        self.exe = _lib.Exec()
        self.cuda = device.type == "cuda"
        self.device = device
        if self.cuda:
            self.exe.backend = _lib.FA_BACKEND_CUDA
            self.device_index = device.index if device.index is not None else torch.cuda.current_device()
            self.exe.device = self.device_index
            self.exe.check = int(_lib.DEBUG)
        else:
            self.exe.backend = _lib.FA_BACKEND_CPU
            self.exe.device = -1
        self.params_addr, self.exe_addr = ctypes.addressof(params), ctypes.addressof(self.exe)
        self.views = tuple(getattr(params, f) for f in fields)  # share params' memory
        self.workspace_bytes = None  # asked of the library at the first call, which has real pointers
        self.sizes, self.options, self.lse_shape, self.rows, self.varlen = sizes, options, lse_shape, rows, varlen
        self.entry, self.name = (_fa_bwd, "fa_bwd") if backward else (_fa_fwd, "fa_fwd")
        self.backward = {}  # (dout strides, deterministic) -> prepared backward, None where the custom op runs it

    def run(self, alibi_slopes, cu_q, cu_k):
        """Runs the library on the pointers already in the views; alibi and cu_seqlens are set here."""
        p, exe = self.params, self.exe
        if alibi_slopes is not None:
            p.alibi_slopes = alibi_slopes.data_ptr()
        if cu_q is not None:
            p.cu_seqlens_q, p.cu_seqlens_k = cu_q.data_ptr(), cu_k.data_ptr()
        workspace = None
        if self.cuda:
            exe.stream = _current_stream(self.device_index)
            if self.workspace_bytes is None:
                exe.workspace, exe.workspace_bytes = None, 0
                exe.workspace_bytes = self.workspace_bytes = _lib.workspace_size(p, exe, self.entry is _fa_bwd)
            if self.workspace_bytes:
                workspace = _empty(self.workspace_bytes, dtype=torch.uint8, device=self.device)
                exe.workspace = workspace.data_ptr()
        else:
            exe.num_threads = torch.get_num_threads()
        status = self.entry(self.params_addr, self.exe_addr)
        if status:
            _lib.raise_for_status(self.name, status)
        # `workspace` returns to PyTorch's allocator here; on CUDA it is reused only by work queued after this


def _cache():
    """This thread's prepared calls (a dict), emptied when full."""
    try:
        cache = _prepared.cache
    except AttributeError:
        cache = _prepared.cache = {}
    if len(cache) >= _PREPARED_MAX:
        cache.clear()
    return cache


def _tensor_key(t):
    return None if t is None else (t.shape, t.stride(), t.dtype, t.device)


def _eager(q, k, v, alibi_slopes):
    """Whether the eager path may take a call: plain tensors (FakeTensor and other subclasses take the custom
    ops), outside torch.compile's tracing and functorch's transforms."""
    T = torch.Tensor
    return (type(q) is T and type(k) is T and type(v) is T and (alibi_slopes is None or type(alibi_slopes) is T)
            and not _is_compiling() and not _functorch_active())


def _prepare_forward(q, k, v, sizes, varlen, options, alibi_slopes, lse_shape, rows):
    """A prepared forward for a signature whose checks passed, or None for what the custom ops handle."""
    if rows == 0 or k.shape[0] == 0 or (not varlen and k.shape[1] == 0):
        return None
    if alibi_slopes is not None and not alibi_slopes.is_contiguous():
        return None
    if q.is_cuda and not (_vector_strides(q) and _vector_strides(k) and _vector_strides(v)):
        return None
    softmax_scale, causal, window_left, window_right, softcap = options
    p, _ = _params(q, sizes, varlen, softmax_scale, causal, window_left, window_right, softcap, alibi_slopes)
    for field, t in (("q", q), ("k", k), ("v", v)):
        _set(p, field, t, varlen)
    _common.set_tensor(p.o, 0, _contiguous_strides(q.shape), varlen)
    return _Prepared(p, ("q", "k", "v", "o"), q.device, sizes, options, lse_shape, rows, varlen, False)


def _prepare_backward(fwd, q, k, dout, deterministic):
    """The prepared backward of fwd for dout's strides, or None where the custom op takes dout (strides a GPU
    kernel cannot load as vectors)."""
    if fwd.cuda and not _vector_strides(dout):
        return None
    p = _lib.Params.from_buffer_copy(fwd.params)
    p.deterministic = 1 if deterministic else 0
    _common.set_tensor(p.dout, 0, dout.stride(), fwd.varlen)
    for field, shape in (("dq", q.shape), ("dk", k.shape), ("dv", k.shape)):
        _common.set_tensor(getattr(p, field), 0, _contiguous_strides(shape), fwd.varlen)
    return _Prepared(p, ("q", "k", "v", "o", "dout", "dq", "dk", "dv"), fwd.device, fwd.sizes, fwd.options,
                     fwd.lse_shape, fwd.rows, fwd.varlen, True)


def _forward_eager(fwd, q, k, v, alibi_slopes, cu_q, cu_k, with_lse=True):
    """out and lse (None without with_lse: the library skips it, and the call one allocation)."""
    out = _empty_like(q, memory_format=_CONTIGUOUS)
    vq, vk, vv, vo = fwd.views
    vq.data, vk.data, vv.data, vo.data = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()
    if with_lse:
        lse = _empty(*fwd.lse_shape, dtype=torch.float32, device=fwd.device)
        fwd.params.lse = lse.data_ptr()
    else:
        lse = fwd.params.lse = None
    fwd.run(alibi_slopes, cu_q, cu_k)
    return out, lse


def _backward_eager(fwd, dout, q, k, v, out, lse, alibi_slopes, cu_q, cu_k, deterministic):
    dout = _last_dim_contiguous(dout)
    key = (dout.stride(), deterministic)
    bwd = fwd.backward.get(key, False)
    if bwd is False:
        bwd = fwd.backward[key] = _prepare_backward(fwd, q, k, dout, deterministic)
    if bwd is None or (bwd.cuda and dout.data_ptr() % 16):
        return _backward(dout, q, k, v, out, lse, fwd.sizes, fwd.varlen, cu_q, cu_k, fwd.rows, *fwd.options,
                         alibi_slopes, deterministic)
    dq = _empty_like(q, memory_format=_CONTIGUOUS)
    dk = _empty_like(k, memory_format=_CONTIGUOUS)
    dv = _empty_like(v, memory_format=_CONTIGUOUS)
    vq, vk, vv, vo, vdo, vdq, vdk, vdv = bwd.views
    vq.data, vk.data, vv.data, vo.data = q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr()
    vdo.data, vdq.data, vdk.data, vdv.data = dout.data_ptr(), dq.data_ptr(), dk.data_ptr(), dv.data_ptr()
    bwd.params.lse = lse.data_ptr()
    bwd.run(alibi_slopes, cu_q, cu_k)
    return dq, dk, dv


class _EagerAttention(torch.autograd.Function):
    """Returns out, or (out, lse) with with_lse; lse is saved either way and is not differentiable."""

    @staticmethod
    def forward(ctx, q, k, v, alibi_slopes, cu_q, cu_k, fwd, deterministic, with_lse):
        out, lse = _forward_eager(fwd, q, k, v, alibi_slopes, cu_q, cu_k)
        ctx.save_for_backward(q, k, v, out, lse, alibi_slopes, cu_q, cu_k)
        ctx.fwd, ctx.deterministic = fwd, deterministic
        if not with_lse:
            return out
        ctx.mark_non_differentiable(lse)
        return out, lse

    @staticmethod
    def backward(ctx, dout, dlse=None):
        q, k, v, out, lse, alibi_slopes, cu_q, cu_k = ctx.saved_tensors
        dq, dk, dv = _backward_eager(ctx.fwd, dout, q, k, v, out, lse, alibi_slopes, cu_q, cu_k, ctx.deterministic)
        return dq, dk, dv, None, None, None, None, None, None


# Function.apply's Python layer binds default arguments for setup_context-style Functions and unwraps
# functorch's dead wrappers; neither concerns this one (no setup_context; _eager leaves functorch's transforms
# to the custom ops), and it costs more than the rest of a forward's Python. This is the C entry it ends in.
_eager_apply = super(torch.autograd.Function, _EagerAttention).apply


def _run_eager(fwd, q, k, v, alibi_slopes, cu_q, cu_k, deterministic, with_lse):
    """out and lse (None unless with_lse) of a prepared forward, through autograd where an input needs it."""
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad):
        if with_lse:
            return _eager_apply(q, k, v, alibi_slopes, cu_q, cu_k, fwd, bool(deterministic), True)
        return _eager_apply(q, k, v, alibi_slopes, cu_q, cu_k, fwd, bool(deterministic), False), None
    return _forward_eager(fwd, q, k, v, alibi_slopes, cu_q, cu_k, with_lse)


def _prepare_dense(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes):
    scale, (wl, wr), cap = _options(q, dropout_p, softmax_scale, window_size, softcap)
    sizes = _check_dense(q, k, v, alibi_slopes)
    batch, seqlen_q, _, heads_q, _, head_dim = sizes
    if _pad_target(q) != head_dim:
        return None
    return _prepare_forward(q, k, v, sizes, False, (scale, bool(causal), wl, wr, cap), alibi_slopes,
                            (batch, heads_q, seqlen_q), batch * seqlen_q * heads_q)


def _eager_dense(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes):
    """The prepared forward of a dense call, or None where the custom ops take it. A first call of a signature
    runs the checks (bad arguments raise there); later ones only look it up."""
    if dropout_p or not _eager(q, k, v, alibi_slopes):
        return None
    key = ("dense", q.shape, q.stride(), q.dtype, q.device, k.shape, k.stride(), k.dtype, k.device, v.shape,
           v.stride(), v.dtype, v.device, softmax_scale, causal, window_size, softcap,
           None if alibi_slopes is None else _tensor_key(alibi_slopes))
    cache = _cache()
    try:
        fwd = cache.get(key, False)
    except TypeError:  # an option of an unhashable type (a list window): the custom ops read it
        return None
    if fwd is False:
        fwd = cache[key] = _prepare_dense(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap,
                                          alibi_slopes)
    if fwd is None or (fwd.cuda and (q.data_ptr() | k.data_ptr() | v.data_ptr()) % 16):
        return None  # unaligned data on a GPU: the custom ops copy it
    return fwd


def _prepare_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                    causal, window_size, softcap, alibi_slopes):
    scale, (wl, wr), cap = _options(q, dropout_p, softmax_scale, window_size, softcap)
    sizes = _check_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q), int(max_seqlen_k), alibi_slopes)
    heads_q, total_q, head_dim = sizes[3], sizes[1], sizes[5]
    if _pad_target(q) != head_dim or not (cu_seqlens_q.is_contiguous() and cu_seqlens_k.is_contiguous()):
        return None
    return _prepare_forward(q, k, v, sizes, True, (scale, bool(causal), wl, wr, cap), alibi_slopes,
                            (heads_q, total_q), heads_q * total_q)


def _eager_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                  causal, window_size, softcap, alibi_slopes):
    """The prepared forward of a varlen call, or None where the custom ops take it."""
    T = torch.Tensor
    if dropout_p or type(cu_seqlens_q) is not T or type(cu_seqlens_k) is not T or not _eager(q, k, v, alibi_slopes):
        return None
    key = ("varlen", _tensor_key(q), _tensor_key(k), _tensor_key(v), _tensor_key(cu_seqlens_q),
           _tensor_key(cu_seqlens_k), max_seqlen_q, max_seqlen_k, softmax_scale, causal, window_size, softcap,
           _tensor_key(alibi_slopes))
    cache = _cache()
    try:
        fwd = cache.get(key, False)
    except TypeError:
        return None
    if fwd is False:
        fwd = cache[key] = _prepare_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k,
                                           dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes)
    if fwd is None or (fwd.cuda and (q.data_ptr() | k.data_ptr() | v.data_ptr()) % 16):
        return None
    if not fwd.cuda:  # host cu_seqlens are read on every call: their values are in no key
        _check_cu_seqlens_host("cu_seqlens_q", cu_seqlens_q, fwd.sizes[1])
        _check_cu_seqlens_host("cu_seqlens_k", cu_seqlens_k, fwd.sizes[2])
    return fwd


# ---- public functions (flash-attn 2.x signatures) ----

# Head dims the CUDA kernels are compiled for, as the library reports them.
_CUDA_HEAD_DIMS = _lib.CUDA_HEAD_DIMS


def _pad_target(q):
    """The head_dim the backend of q's device takes for q's: a multiple of 8 on the CPU, the next compiled kernel
    size on CUDA (flash-attn likewise rounds a head dim up to its kernel's)."""
    d = q.shape[-1]
    target = d + (-d % 8)
    if q.is_cuda:
        target = next((c for c in _CUDA_HEAD_DIMS if c >= d), target)
    return target


def _pad_head_dim(q, k, v):
    """Zero-pads head_dim to _pad_target. Zero columns change neither Q K^T nor the first head_dim columns of
    the output, and autograd slices the gradients back. The softmax scale is computed from the unpadded head_dim
    by the caller."""
    if not all(isinstance(t, torch.Tensor) and t.dim() and t.shape[-1] == q.shape[-1] for t in (k, v)):
        return q, k, v  # mismatched head_dims are reported by the op's checks
    d, target = q.shape[-1], _pad_target(q)
    if target == d:
        return q, k, v
    return tuple(torch.nn.functional.pad(t, (0, target - d)) for t in (q, k, v))


def _options(q, dropout_p, softmax_scale, window_size, softcap):
    _common.check_dropout(dropout_p)
    if not isinstance(q, torch.Tensor):
        raise TypeError(f"q must be a torch.Tensor, got {type(q).__name__}")
    return _common.scale(softmax_scale, q.shape[-1]), _common.window(window_size), _common.check_softcap(softcap)


_E4M3 = getattr(torch, "float8_e4m3fn", None)


def _descale_arg(name, t, q, batch, heads, heads_kv, length, block):
    """A descale argument as the library's contiguous (batch, heads, blocks) fp32 array (None stays None)."""
    if t is None:
        return None
    if not isinstance(t, Tensor) or t.dtype != torch.float32:
        raise TypeError(f"{name} must be a float32 tensor, got {_shape_of(t) if not isinstance(t, Tensor) else t.dtype}")
    if t.device != q.device:
        raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    blocks = -(-length // block) if block > 0 else 1
    if block == 0 and t.dim() == 2 and tuple(t.shape) == (batch, heads_kv) and heads != heads_kv:
        t = t.repeat_interleave(heads // heads_kv, dim=1)  # flash-attn's q_descale: one per kv head
    if tuple(t.shape) not in ((batch, heads, blocks),) + (((batch, heads),) if blocks == 1 else ()):
        want = f"({batch}, {heads}, {blocks})" if block > 0 else f"({batch}, {heads})"
        raise ValueError(f"{name} must have shape {want}, got {tuple(t.shape)}")
    return t.contiguous()


def _fp8_forward(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes, descales,
                 descale_block, out_dtype, with_lse):
    """flash_attn_func on float8_e4m3fn q, k, v: out in out_dtype, lse; no autograd."""
    for name, t in (("k", k), ("v", v)):
        if not isinstance(t, Tensor) or t.dtype != _E4M3:
            raise TypeError(f"{name} must be float8_e4m3fn like q, got {t.dtype if isinstance(t, Tensor) else type(t)}")
        if t.device != q.device:
            raise ValueError(f"{name} is on {t.device} but q is on {q.device}; they must be on one device")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension (head_dim); got strides {t.stride()}")
    if out_dtype not in (torch.bfloat16, torch.float16):
        raise TypeError(f"out_dtype must be torch.bfloat16 or torch.float16, got {out_dtype}")
    block = int(descale_block)
    if block < 0:
        raise ValueError(f"descale_block must be >= 0, got {block}")
    sizes = _common.dense_sizes(q.shape, k.shape, v.shape)
    batch, seqlen_q, seqlen_k, heads_q, heads_kv, _ = sizes
    _check_alibi(alibi_slopes, q, batch, heads_q)
    scale, (wl, wr), cap = _options(q, dropout_p, softmax_scale, window_size, softcap)
    p = _common.make_params(_lib.FA_E4M3, sizes, False, scale, causal, (wl, wr), cap)
    if alibi_slopes is not None:
        alibi_slopes = alibi_slopes.contiguous()
        p.alibi_slopes = alibi_slopes.data_ptr()
        p.alibi_batch_stride = heads_q if alibi_slopes.dim() == 2 else 0
    p.out_dtype = _DTYPES[out_dtype]
    p.descale_block_q = p.descale_block_k = block
    keep = []
    for name, t, heads, length in (("q_descale", descales[0], heads_q, seqlen_q),
                                   ("k_descale", descales[1], heads_kv, seqlen_k),
                                   ("v_descale", descales[2], heads_kv, seqlen_k)):
        t = _descale_arg(name, t, q, batch, heads, heads_kv, length, block)
        if t is not None:
            setattr(p, name, t.data_ptr())
            keep.append(t)
    out = torch.empty(q.shape, dtype=out_dtype, device=q.device)
    lse = torch.empty(batch, heads_q, seqlen_q, dtype=torch.float32, device=q.device) if with_lse else None
    for field, t in (("q", q), ("k", k), ("v", v), ("o", out)):
        _set(p, field, t, False)
    p.lse = lse.data_ptr() if with_lse else None
    _run("fa_fwd", p, q, False)
    return out, lse


def quantize_e4m3(x, descale_block=0):
    """Block quantization for the FP8 forward, as the C helper fa_quantize_e4m3 (the same bits on the CPU).

    x: (batch, seqlen, heads, head_dim) float32, float16 or bfloat16, CPU or CUDA. Per (batch entry, head,
    block of descale_block rows; 0 = the whole sequence) descale = max |x| / 448 (1 for an all-zero block) and
    the e4m3 values round(x * (1 / descale)). Returns (x8 float8_e4m3fn of x's shape, descale float32 (batch,
    heads) or (batch, heads, blocks)), what flash_attn_func takes as q|k|v and q|k|v_descale with that
    descale_block. A NaN or Inf in x raises ValueError (e4m3 has no infinity; the check reads the device).
    """
    if _E4M3 is None:
        raise NotImplementedError(f"this PyTorch ({torch.__version__}) has no float8_e4m3fn")
    if not isinstance(x, Tensor) or x.dtype not in _DTYPES or x.dim() != 4:
        raise TypeError(f"x must be a float32, float16 or bfloat16 (batch, seqlen, heads, head_dim) tensor, got "
                        f"{_shape_of(x) if not isinstance(x, Tensor) else (x.dtype, tuple(x.shape))}")
    block = int(descale_block)
    if block < 0:
        raise ValueError(f"descale_block must be >= 0, got {block}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError("x holds a NaN or Inf: e4m3 has no infinity")
    b, s, h, d = x.shape
    xf = x.float().contiguous()
    span = block if block > 0 else max(s, 1)
    nb = -(-s // span) if s else 1
    padded = torch.cat([xf, xf.new_zeros(b, nb * span - s, h, d)], 1) if nb * span != s else xf
    amax = padded.view(b, nb, span, h, d).abs().amax(dim=(2, 4))  # (batch, blocks, heads)
    descale = torch.where(amax > 0, amax / 448.0, torch.ones_like(amax))
    scaled = padded.view(b, nb, span, h, d) * (1.0 / descale)[:, :, None, :, None]
    x8 = scaled.view(b, nb * span, h, d)[:, :s].to(_E4M3)
    descale = descale.permute(0, 2, 1).contiguous()
    return x8, (descale[..., 0].contiguous() if block == 0 else descale)


def _splitmix64(x):
    m = (1 << 64) - 1
    z = (x + 0x9E3779B97F4A7C15) & m
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def hadamard_rotate(x, seed=0):
    """Incoherent processing, as the C helper fa_hadamard_rotate: every row (head_dim elements) times D H /
    sqrt(n), D random signs from seed, H the Walsh-Hadamard matrix of order n, the largest power of two dividing
    head_dim, per n-element chunk. Rotate q and k with one seed (their scores stay the same) before
    quantize_e4m3; leave v as it is. x: (..., head_dim) float32, float16 or bfloat16, any device; returns the
    rotated copy in x's dtype (computed in float32: the same bits as the C helper)."""
    if not isinstance(x, Tensor) or x.dtype not in _DTYPES or x.dim() < 1:
        raise TypeError(f"x must be a float32, float16 or bfloat16 tensor, got {_shape_of(x)}")
    d = x.shape[-1]
    if d < 8 or d % 8 or d > 256:
        raise ValueError(f"head_dim (x.shape[-1] = {d}) must be a multiple of 8 in [8, 256]")
    n = d & -d
    seed = int(seed) & ((1 << 64) - 1)
    signs = torch.tensor([-1.0 if _splitmix64((seed + j) & ((1 << 64) - 1)) >> 63 else 1.0 for j in range(d)],
                         dtype=torch.float32, device=x.device)
    y = (x.float() * signs).reshape(-1, d // n, n)
    length = 1
    while length < n:
        y = y.view(-1, d // n, n // (2 * length), 2, length)
        a, c = y[..., 0, :], y[..., 1, :]
        y = torch.stack((a + c, a - c), dim=-2)
        length *= 2
    norm = torch.tensor(float(n), dtype=torch.float32).sqrt().reciprocal().to(x.device)
    return (y.reshape(x.shape) * norm).to(x.dtype)


def flash_attn_func(q, k, v, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                    alibi_slopes=None, deterministic=False, return_attn_probs=False, q_descale=None, k_descale=None,
                    v_descale=None, descale_block=0, out_dtype=None):
    """Exact attention, as flash_attn.flash_attn_func.

    q: (batch, seqlen_q, heads_q, head_dim); k, v: (batch, seqlen_k, heads_kv, head_dim), heads_q a multiple of
    heads_kv (MQA/GQA). float16, bfloat16 or float32; CUDA tensors run on the GPU (current stream), CPU tensors
    on the CPU backend. Strides are free except that head_dim must be contiguous. head_dim <= 256; one the
    backend has no kernel for (CPU: not a multiple of 8; CUDA: not 32/64/96/128/192/256) is zero-padded (a
    copy), as flash-attn does.
    causal is aligned to the bottom right when seqlen_q != seqlen_k; window_size=(left, right), -1 = unbounded;
    softcap > 0 applies softcap * tanh(S / softcap); alibi_slopes: float32 (heads_q,) or (batch, heads_q).
    dropout_p must be 0.0 (dropout is not implemented).
    FP8 (forward only, no autograd): q, k, v float8_e4m3fn, each standing for its values times its descale:
    q_descale, k_descale, v_descale float32 (batch, heads_kv) as flash-attn's FP8 interface (q's is per kv
    head, spread over its query heads), or (batch, heads_q) for q, or with descale_block = N > 0 one per N rows
    of a sequence: (batch, heads, ceil(seqlen / N)); None means 1. out is out_dtype (default bfloat16, or
    float16). Eager calls on CPU tensors so far: the CUDA backend has no e4m3 kernel yet and raises, and
    torch.compile does not trace this path.

    Returns out (batch, seqlen_q, heads_q, head_dim), or with return_attn_probs=True (out, softmax_lse, None)
    where softmax_lse is float32 (batch, heads_q, seqlen_q); rows that see no key get out = 0, lse = -inf.
    """
    if _E4M3 is not None and getattr(q, "dtype", None) == _E4M3:
        out, lse = _fp8_forward(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                                (q_descale, k_descale, v_descale), descale_block, out_dtype or torch.bfloat16,
                                return_attn_probs)
        return (out, lse, None) if return_attn_probs else out
    if q_descale is not None or k_descale is not None or v_descale is not None or out_dtype is not None:
        raise ValueError("q_descale, k_descale, v_descale and out_dtype are for float8_e4m3fn inputs; q is "
                         f"{q.dtype if isinstance(q, Tensor) else type(q).__name__}")
    fwd = _eager_dense(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes)
    if fwd is not None:
        out, lse = _run_eager(fwd, q, k, v, alibi_slopes, None, None, deterministic, return_attn_probs)
        return (out, lse, None) if return_attn_probs else out
    scale, (wl, wr), cap = _options(q, dropout_p, softmax_scale, window_size, softcap)
    head_dim = q.shape[-1]
    q, k, v = _pad_head_dim(q, k, v)
    out, lse = torch.ops.flashattn.fwd(q, k, v, scale, bool(causal), wl, wr, cap, alibi_slopes, bool(deterministic))
    out = out[..., :head_dim] if out.shape[-1] != head_dim else out
    return (out, lse, None) if return_attn_probs else out


def _gather_pages(q, k_pages, v_pages, block_table, cu_seqlens_k, max_seqlen_k):
    """The keys and values of a paged cache as packed (batch * max_seqlen_k, heads_kv, head_dim) tensors whose
    rows cu_seqlens_k[b] .. cu_seqlens_k[b + 1] - 1 are sequence b's keys (the rows past cu_seqlens_k[-1] repeat
    page 0's first row), computed on the device without reading device values on the host."""
    for name, t in (("k", k_pages), ("v", v_pages)):
        if not isinstance(t, Tensor) or t.dim() != 4:
            raise ValueError(f"with block_table, {name} must be a (num_pages, page_size, heads_kv, head_dim) tensor, "
                             f"got {_shape_of(t)}")
    if k_pages.shape != v_pages.shape:
        raise ValueError(f"with block_table, k and v must have one shape, got {tuple(k_pages.shape)} and "
                         f"{tuple(v_pages.shape)}")
    if not isinstance(block_table, Tensor) or block_table.dtype != torch.int32 or block_table.dim() != 2:
        raise TypeError(f"block_table must be an int32 (batch, max_pages) tensor, got {_shape_of(block_table)}")
    if block_table.device != q.device:
        raise ValueError(f"block_table is on {block_table.device} but q is on {q.device}")
    if not isinstance(cu_seqlens_k, Tensor) or cu_seqlens_k.dim() != 1:
        raise TypeError(f"cu_seqlens_k must be a 1-D int32 tensor, got {_shape_of(cu_seqlens_k)}")
    num_pages, page_size = k_pages.shape[0], k_pages.shape[1]
    batch, max_pages = cu_seqlens_k.numel() - 1, block_table.shape[1]
    if block_table.shape[0] != batch:
        raise ValueError(f"block_table has {block_table.shape[0]} rows for a batch of {batch} (cu_seqlens_k)")
    max_seqlen_k = int(max_seqlen_k)
    if max_seqlen_k < 0 or max_seqlen_k > max_pages * page_size:
        raise ValueError(f"max_seqlen_k ({max_seqlen_k}) must be in [0, {max_pages} pages x {page_size} rows] "
                         f"(block_table's width times the page size)")
    if batch < 1 or num_pages == 0 or page_size == 0 or max_seqlen_k == 0:
        shape = (0,) + tuple(k_pages.shape[2:])
        return k_pages.new_empty(shape), v_pages.new_empty(shape)
    cu = cu_seqlens_k.to(torch.int64)
    lengths = cu[1:] - cu[:-1]
    if q.device.type == "cpu" or _lib.DEBUG:
        used = (torch.arange(max_pages, device=q.device) * page_size).unsqueeze(0) < lengths.unsqueeze(1)
        bad = used & ((block_table < 0) | (block_table >= num_pages))
        if bool(bad.any()):
            b, j = (int(x) for x in bad.nonzero()[0])
            raise ValueError(f"block_table[{b}][{j}] = {int(block_table[b, j])} is not a page of k "
                             f"[0, {num_pages})")
    rows = torch.arange(batch * max_seqlen_k, device=q.device)
    seq = torch.searchsorted(cu[1:], rows, right=True).clamp_(max=batch - 1)
    pos = rows - cu[seq]
    inside = (pos >= 0) & (pos < lengths[seq])
    pos = torch.where(inside, pos, torch.zeros_like(pos))
    # a length past max_seqlen_k (trusted on CUDA) must not index past the table either
    page = block_table[seq, (pos // page_size).clamp_(max=max_pages - 1)].to(torch.int64)
    # entries are trusted on CUDA; clamping keeps a bad one from faulting the device (it reads some page)
    page = torch.where(inside, page, torch.zeros_like(page)).clamp_(0, num_pages - 1)
    index = page * page_size + pos % page_size
    k, v = k_pages.flatten(0, 1).index_select(0, index), v_pages.flatten(0, 1).index_select(0, index)
    if torch.is_grad_enabled() and (k.requires_grad or v.requires_grad):
        # the backward leaves the rows past the sequences unwritten: keep them out of the pages' gradients
        keep = inside.view(-1, 1, 1)
        k, v = torch.where(keep, k, 0.0), torch.where(keep, v, 0.0)
    return k, v


def flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                           softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0, alibi_slopes=None,
                           deterministic=False, return_attn_probs=False, block_table=None):
    """Exact attention of a packed batch of variable-length sequences, as flash_attn.flash_attn_varlen_func.

    q: (total_q, heads_q, head_dim), k, v: (total_k, heads_kv, head_dim); cu_seqlens_q/k: int32 (batch + 1)
    prefix sums starting at 0, on q's device; max_seqlen_q/k: ints >= every sequence's length.
    block_table: int32 (batch, max_pages) on q's device for a paged cache, k, v then (num_pages, page_size,
    heads_kv, head_dim) (any page size): key j of sequence b is row j % page_size of page block_table[b, j //
    page_size], its length cu_seqlens_k[b + 1] - cu_seqlens_k[b] (flash-attn's rule). The pages are gathered
    into a packed copy (batch * max_seqlen_k rows, index_select: differentiable, graph-capturable) that the
    varlen kernels read; the copy costs one read and write of the attended keys and values. Entries past a
    sequence's pages are not read; CUDA trusts the others (FLASHATTN_DEBUG=1 checks them, synchronising), CPU
    checks them.
    Other arguments as flash_attn_func.
    Returns out (total_q, heads_q, head_dim), or (out, softmax_lse (heads_q, total_q) float32, None).
    """
    if block_table is not None:
        k, v = _gather_pages(q, k, v, block_table, cu_seqlens_k, max_seqlen_k)
    fwd = _eager_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p, softmax_scale,
                        causal, window_size, softcap, alibi_slopes)
    if fwd is not None:
        out, lse = _run_eager(fwd, q, k, v, alibi_slopes, cu_seqlens_q, cu_seqlens_k, deterministic,
                              return_attn_probs)
        return (out, lse, None) if return_attn_probs else out
    scale, (wl, wr), cap = _options(q, dropout_p, softmax_scale, window_size, softcap)
    head_dim = q.shape[-1]
    q, k, v = _pad_head_dim(q, k, v)
    out, lse = torch.ops.flashattn.varlen_fwd(q, k, v, cu_seqlens_q, cu_seqlens_k, int(max_seqlen_q),
                                              int(max_seqlen_k), scale, bool(causal), wl, wr, cap, alibi_slopes,
                                              bool(deterministic))
    out = out[..., :head_dim] if out.shape[-1] != head_dim else out
    return (out, lse, None) if return_attn_probs else out


def flash_attn_qkvpacked_func(qkv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                              softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_func on qkv (batch, seqlen, 3, heads, head_dim)."""
    if not isinstance(qkv, torch.Tensor) or qkv.dim() != 5 or qkv.shape[2] != 3:
        raise ValueError(f"qkv must be a (batch, seqlen, 3, heads, head_dim) tensor, got {_shape_of(qkv)}")
    q, k, v = qkv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_kvpacked_func(q, kv, dropout_p=0.0, softmax_scale=None, causal=False, window_size=(-1, -1),
                             softcap=0.0, alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_func with kv (batch, seqlen_k, 2, heads_kv, head_dim)."""
    if not isinstance(kv, torch.Tensor) or kv.dim() != 5 or kv.shape[2] != 2:
        raise ValueError(f"kv must be a (batch, seqlen_k, 2, heads_kv, head_dim) tensor, got {_shape_of(kv)}")
    k, v = kv.unbind(2)
    return flash_attn_func(q, k, v, dropout_p, softmax_scale, causal, window_size, softcap, alibi_slopes,
                           deterministic, return_attn_probs)


def flash_attn_varlen_qkvpacked_func(qkv, cu_seqlens, max_seqlen, dropout_p=0.0, softmax_scale=None, causal=False,
                                     window_size=(-1, -1), softcap=0.0, alibi_slopes=None, deterministic=False,
                                     return_attn_probs=False):
    """flash_attn_varlen_func on qkv (total, 3, heads, head_dim)."""
    if not isinstance(qkv, torch.Tensor) or qkv.dim() != 4 or qkv.shape[1] != 3:
        raise ValueError(f"qkv must be a (total_tokens, 3, heads, head_dim) tensor, got {_shape_of(qkv)}")
    q, k, v = qkv.unbind(1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens, cu_seqlens, max_seqlen, max_seqlen, dropout_p, softmax_scale,
                                  causal, window_size, softcap, alibi_slopes, deterministic, return_attn_probs)


def flash_attn_varlen_kvpacked_func(q, kv, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p=0.0,
                                    softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                                    alibi_slopes=None, deterministic=False, return_attn_probs=False):
    """flash_attn_varlen_func with kv (total_k, 2, heads_kv, head_dim)."""
    if not isinstance(kv, torch.Tensor) or kv.dim() != 4 or kv.shape[1] != 2:
        raise ValueError(f"kv must be a (total_tokens, 2, heads_kv, head_dim) tensor, got {_shape_of(kv)}")
    k, v = kv.unbind(1)
    return flash_attn_varlen_func(q, k, v, cu_seqlens_q, cu_seqlens_k, max_seqlen_q, max_seqlen_k, dropout_p,
                                  softmax_scale, causal, window_size, softcap, alibi_slopes, deterministic,
                                  return_attn_probs)


def _shape_of(x):
    return tuple(x.shape) if isinstance(x, torch.Tensor) else type(x).__name__


# ---- PyTorch's scaled_dot_product_attention, on PyTorch's (batch, heads, seqlen, head_dim) layout ----

def _sdpa_check(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa):
    """SDPA's argument rules for what this entry point supports; anything it would compute differently from
    torch.nn.functional.scaled_dot_product_attention raises instead."""
    names = (("query", query), ("key", key), ("value", value))
    for name, t in names:
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise ValueError(f"{name} must be 4-D (batch, heads, seqlen, head_dim), got shape {tuple(t.shape)}")
    if attn_mask is not None:
        raise NotImplementedError(
            "attn_mask is not supported by flashattn.scaled_dot_product_attention: it computes no arbitrary "
            "mask. Use is_causal=True, or flash_attn_func on (batch, seqlen, heads, head_dim) tensors for "
            "bottom-right causal, sliding-window (window_size), softcap and ALiBi (alibi_slopes) masks")
    _common.check_dropout(dropout_p)
    if query.dtype not in _DTYPES:
        raise TypeError(f"query must be float16, bfloat16 or float32, got {query.dtype}")
    for name, t in names[1:]:
        if t.dtype != query.dtype:
            raise TypeError(f"{name} has dtype {t.dtype} but query has dtype {query.dtype}; they must match")
        if t.device != query.device:
            raise ValueError(f"{name} is on {t.device} but query is on {query.device}; they must be on one device")
    for name, t in names:  # the kernels read head_dim as a contiguous vector; PyTorch would copy, we ask
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ValueError(f"{name} must be contiguous in its last dimension (head_dim), got strides "
                             f"{t.stride()}; .contiguous() makes it so")
    (batch, heads_q, seqlen_q, head_dim), (_, heads_kv, seqlen_k, _) = query.shape, key.shape
    if key.shape[0] != batch or value.shape[0] != batch:
        raise ValueError(f"query, key and value must have one batch size, got {batch}, {key.shape[0]} and "
                         f"{value.shape[0]} (broadcast a batch of 1 with expand first)")
    if key.shape[3] != head_dim or value.shape[3] != head_dim:
        raise ValueError(f"query, key and value must have one head_dim, got {head_dim}, {key.shape[3]} and "
                         f"{value.shape[3]} (a value head_dim other than the query's is not supported)")
    if value.shape[2] != seqlen_k:
        raise ValueError(f"key and value must have one seqlen, got {seqlen_k} and {value.shape[2]}")
    if value.shape[1] != heads_kv:
        raise ValueError(f"key and value must have one number of heads, got {heads_kv} and {value.shape[1]}")
    # PyTorch's rules: with enable_gqa, query heads are grouped over key/value heads (heads_q a multiple of
    # heads_kv); without it, the heads must be equal, or 1 in key and value, which PyTorch broadcasts (the same
    # result as one group).
    if enable_gqa:
        if heads_kv == 0 or heads_q % heads_kv:
            raise ValueError(f"enable_gqa=True: the number of heads in key and value ({heads_kv}) must divide "
                             f"the number of heads in query ({heads_q})")
    elif heads_kv != heads_q and heads_kv != 1:
        raise ValueError(f"query has {heads_q} heads but key and value have {heads_kv}: pass enable_gqa=True for "
                         "grouped-query attention (as torch.nn.functional.scaled_dot_product_attention asks)")
    if is_causal and seqlen_q != seqlen_k:
        raise ValueError(
            f"is_causal=True with seqlen_q ({seqlen_q}) != seqlen_k ({seqlen_k}): PyTorch aligns this causal mask "
            "to the top left (query i sees keys 0..i), flashattn's kernels to the bottom right (query i sees keys "
            "0..i + seqlen_k - seqlen_q, as flash-attn >= 2.1 does); the two agree only when the lengths are "
            "equal, so this call would compute a different mask. For the bottom-right mask call "
            "flashattn.flash_attn_func(q, k, v, causal=True) on (batch, seqlen, heads, head_dim) tensors "
            "(query.transpose(1, 2) etc.); for the top-left one, PyTorch's own scaled_dot_product_attention")


def scaled_dot_product_attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None,
                                 enable_gqa=False):
    """torch.nn.functional.scaled_dot_product_attention's signature and layout on flashattn's kernels.

    query: (batch, heads_q, seqlen_q, head_dim); key, value: (batch, heads_kv, seqlen_k, head_dim); float16,
    bfloat16 or float32, CUDA (CUDA backend) or CPU (CPU backend), head_dim contiguous and at most 256.
    heads_kv must equal heads_q, or be 1, or divide heads_q with enable_gqa=True (PyTorch's rules).
    scale: None for 1/sqrt(head_dim). is_causal: query i sees keys 0..i; PyTorch aligns this mask to the top
    left and flashattn to the bottom right, which agree only for seqlen_q == seqlen_k, so other lengths raise
    (flash_attn_func(causal=True) has the bottom-right mask). attn_mask and dropout_p > 0 raise
    NotImplementedError: the result would differ from PyTorch's.

    Returns (batch, heads_q, seqlen_q, head_dim), a transposed view of a (batch, seqlen_q, heads_q, head_dim)
    tensor, as PyTorch's FlashAttention backend returns it. Autograd and torch.compile(fullgraph=True) work as
    with flash_attn_func, which this calls on transposed views (no copies).
    """
    _sdpa_check(query, key, value, attn_mask, dropout_p, is_causal, enable_gqa)
    out = flash_attn_func(query.transpose(1, 2), key.transpose(1, 2), value.transpose(1, 2), softmax_scale=scale,
                          causal=bool(is_causal))
    return out.transpose(1, 2)


# ---- decoding with a KV cache ----

def _kv_int32(name, t, q, batch=None):
    """An int32 tensor on q's device (a scalar cache_seqlens broadcast to (batch,)), contiguous."""
    if t is None:
        return None
    if batch is not None and isinstance(t, int):
        return torch.full((batch,), t, dtype=torch.int32, device=q.device)
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor of int32, got {type(t).__name__}")
    if t.dtype != torch.int32:
        raise TypeError(f"{name} must be int32, got {t.dtype}")
    if t.device != q.device:
        raise ValueError(f"{name} is on {t.device} but q is on {q.device}")
    return t.contiguous() if t.dim() == 1 else t


def flash_attn_with_kvcache(q, k_cache, v_cache, k=None, v=None, rotary_cos=None, rotary_sin=None,
                            cache_seqlens=None, cache_batch_idx=None, cache_leftpad=None, block_table=None,
                            softmax_scale=None, causal=False, window_size=(-1, -1), softcap=0.0,
                            rotary_interleaved=True, alibi_slopes=None, num_splits=0, return_softmax_lse=False):
    """Decoding with a KV cache, as flash_attn.flash_attn_with_kvcache.

    q: (batch, seqlen_q, heads_q, head_dim). k_cache, v_cache: (batch_cache, seqlen_cache, heads_kv, head_dim),
    or paged (num_pages, page_size, heads_kv, head_dim) with block_table int32 (batch, max_pages); any page
    size. k, v (batch, seqlen_new, heads_kv, head_dim): new tokens written into the cache IN PLACE at rows
    cache_seqlens[b] .. before attending. rotary_cos / rotary_sin (seqlen_ro, rotary_dim / 2), rotary_dim a
    multiple of 16: rotary embedding of q and the new keys, only with k and v; q sits at cache_seqlens[b] + i
    when causal or windowed, at cache_seqlens[b] otherwise (flash-attn's rule). cache_seqlens: int or int32
    (batch,), default the whole cache; cache_batch_idx int32 (batch,) (contiguous cache only);
    cache_leftpad int32 (batch,): the first attended row. causal is aligned bottom-right on the attended
    rows. head_dim must be a multiple of 8 (the cache cannot be padded in place). num_splits: the CUDA
    kernel's split of the keys (0: its heuristic); the CPU ignores it. CPU tensors run on the CPU backend, CUDA
    tensors (f16/bf16) on the CUDA backend, which trusts the int32 arrays it is given (FLASHATTN_DEBUG=1 checks
    them, outside graph capture) and can be captured in a CUDA graph (the split count does not depend on
    cache_seqlens). No autograd (as flash-attn's). Returns out, or (out, softmax_lse (batch, heads_q,
    seqlen_q) float32) with return_softmax_lse=True.
    """
    args = (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad,
            block_table, alibi_slopes)
    options = (softmax_scale, causal, window_size, softcap, rotary_interleaved, num_splits, return_softmax_lse)
    if type(cache_seqlens) is int or _is_compiling() or any(t is not None and type(t) is not Tensor for t in args):
        return _kvcache_call(args, options)[0]
    key = options + tuple(None if t is None else (t.shape, t.stride(), t.dtype, t.device) for t in args)
    cache = _cache()
    try:
        dec = cache.get(key, False)
    except TypeError:  # an unhashable option (a list for window_size): the checks take it
        return _kvcache_call(args, options)[0]
    if dec:
        return dec.run(args, return_softmax_lse)
    result, p, kv, exe, workspace_bytes = _kvcache_call(args, options)
    if dec is False:
        cache[key] = _PreparedDecode.make(p, kv, exe, workspace_bytes, args)
    return result


def _kvcache_call(args, options):
    """flash_attn_with_kvcache with every check: its result, the fa_params, fa_kvcache and fa_exec it ran, and
    the workspace bytes it took."""
    from . import _kvcache

    (q, k_cache, v_cache, k, v, rotary_cos, rotary_sin, cache_seqlens, cache_batch_idx, cache_leftpad, block_table,
     alibi_slopes) = args
    softmax_scale, causal, window_size, softcap, rotary_interleaved, num_splits, return_softmax_lse = options

    _check_tensor("q", q)
    dtype = _DTYPES[q.dtype]
    batch = q.shape[0] if q.dim() == 4 else 0
    heads_q = q.shape[2] if q.dim() == 4 else 0

    def view(name, t):
        if t is None:
            return None
        _check_tensor(name, t, q)
        return _kvcache.View(name, t.data_ptr(), tuple(t.shape), t.stride())

    ints = {}
    for name, t in (("cache_seqlens", cache_seqlens), ("cache_batch_idx", cache_batch_idx),
                    ("cache_leftpad", cache_leftpad), ("block_table", block_table)):
        t = _kv_int32(name, t, q, batch if name == "cache_seqlens" else None)
        ints[name] = t
    _check_alibi(alibi_slopes, q, batch, heads_q)
    alibi = None
    if alibi_slopes is not None:
        alibi_slopes = alibi_slopes.contiguous()
        alibi = (alibi_slopes.data_ptr(), heads_q if alibi_slopes.dim() == 2 else 0)
    out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    lse = None
    if return_softmax_lse:
        lse = torch.empty((batch, heads_q, q.shape[1] if q.dim() == 4 else 0), dtype=torch.float32, device=q.device)
    p, kv = _kvcache.build(dtype, view("q", q), view("k_cache", k_cache), view("v_cache", v_cache), view("k", k),
                           view("v", v), view("out", out), view("rotary_cos", rotary_cos),
                           view("rotary_sin", rotary_sin),
                           *(None if ints[n] is None else
                             _kvcache.View(n, ints[n].data_ptr(), tuple(ints[n].shape), ints[n].stride())
                             for n in ("cache_seqlens", "cache_batch_idx", "cache_leftpad", "block_table")),
                           softmax_scale, causal, window_size, softcap, alibi, rotary_interleaved, num_splits)
    p.lse = None if lse is None else lse.data_ptr()

    def allocate(n):
        ws = torch.empty(n, dtype=torch.uint8, device=q.device)
        return ws, ws.data_ptr()

    exe = _exec_for(q)
    workspace_bytes = _kvcache.run(p, kv, exe, allocate)
    return ((out, lse) if return_softmax_lse else out), p, kv, exe, workspace_bytes


_fa_fwd_kvcache = _lib.lib["fa_fwd_kvcache"]  # a second handle taking the three blocks by address (see _by_address)
_fa_fwd_kvcache.restype = ctypes.c_int
_fa_fwd_kvcache.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]

# The fields of a decode call that take an argument's data pointer: (block, field, the argument's position in
# flash_attn_with_kvcache's tensors). fa_tensor fields get it in .data.
_DECODE_TENSORS = (("p", "q", 0), ("kv", "k_cache", 1), ("kv", "v_cache", 2), ("p", "k", 3), ("p", "v", 4))
_DECODE_POINTERS = (("kv", "rotary_cos", 5), ("kv", "rotary_sin", 6), ("kv", "cache_seqlens", 7),
                    ("kv", "cache_batch_idx", 8), ("kv", "cache_leftpad", 9), ("kv", "block_table", 10),
                    ("p", "alibi_slopes", 11))


class _PreparedDecode:
    """A decode signature's fa_params, fa_kvcache and fa_exec as its first call (which ran every check) filled
    them; later calls set the data pointers, the stream and the workspace, and call the library, which validates
    every call as always (lengths, page indices, alignment). The CUDA workspace depends on sizes alone; the
    CPU's on the lengths, so it is asked for at every CPU call."""

    __slots__ = ("params", "kv", "exe", "addrs", "tensors", "pointers", "cuda", "device", "device_index",
                 "workspace_bytes", "lse_shape", "o")

    @staticmethod
    def make(p, kv, exe, workspace_bytes, args):
        """The prepared call, or None where the first call passed the library a copy of an argument (a strided
        int32 array or alibi_slopes): later calls must copy it too."""
        for t in (args[7], args[8], args[9], args[11]):  # cache_seqlens, cache_batch_idx, cache_leftpad, alibi_slopes
            if t is not None and not t.is_contiguous():
                return None
        return _PreparedDecode(p, kv, exe, workspace_bytes, args)

    def __init__(self, p, kv, exe, workspace_bytes, args):
        blocks = {"p": p, "kv": kv}
        self.params, self.kv, self.exe = p, kv, exe
        self.addrs = (ctypes.addressof(p), ctypes.addressof(kv), ctypes.addressof(exe))
        self.tensors = tuple((getattr(blocks[b], f), i) for b, f, i in _DECODE_TENSORS if args[i] is not None)
        self.pointers = tuple((blocks[b], f, i) for b, f, i in _DECODE_POINTERS if args[i] is not None)
        self.o = p.o
        q = args[0]
        self.cuda = q.device.type == "cuda"
        self.device, self.device_index = q.device, exe.device
        self.workspace_bytes = workspace_bytes
        self.lse_shape = (q.shape[0], q.shape[2], q.shape[1])

    def run(self, args, with_lse):
        out = _empty_like(args[0], memory_format=_CONTIGUOUS)
        self.o.data = out.data_ptr()
        for view, i in self.tensors:
            view.data = args[i].data_ptr()
        for block, field, i in self.pointers:
            setattr(block, field, args[i].data_ptr())
        p, exe = self.params, self.exe
        lse = None
        if with_lse:
            lse = _empty(*self.lse_shape, dtype=torch.float32, device=self.device)
            p.lse = lse.data_ptr()
        workspace = None
        if self.cuda:
            exe.stream = _current_stream(self.device_index)
            if self.workspace_bytes:
                workspace = _empty(self.workspace_bytes, dtype=torch.uint8, device=self.device)
                exe.workspace = workspace.data_ptr()
        else:
            exe.num_threads = torch.get_num_threads()
            exe.workspace, exe.workspace_bytes = None, 0
            n = _lib.workspace_size_kvcache(p, self.kv, exe)
            if n:
                workspace = _empty(n, dtype=torch.uint8, device=self.device)
                exe.workspace, exe.workspace_bytes = workspace.data_ptr(), n
        status = _fa_fwd_kvcache(*self.addrs)
        if status:
            _lib.raise_for_status("fa_fwd_kvcache", status)
        return (out, lse) if with_lse else out
