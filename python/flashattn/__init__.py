# SPDX-License-Identifier: Apache-2.0
"""flashattn: exact attention (FlashAttention-2/3) from libflashattn, through ctypes.

    import flashattn
    out = flashattn.flash_attn_func(q, k, v, causal=True)    # PyTorch, flash-attn 2.x compatible
    out = flashattn.scaled_dot_product_attention(q, k, v)    # PyTorch, SDPA's (batch, heads, seqlen, head_dim)
    out = flashattn.attention(q, k, v, causal=True)          # numpy arrays, CPU backend

The PyTorch functions (flash_attn_func, flash_attn_varlen_func, scaled_dot_product_attention, ...) import
torch on first use and the numpy ones (attention, attention_backward) import numpy on first use, so neither
is needed to import the package.
The library is found through $FLASHATTN_LIBRARY, next to this package, or in the repository's build/ tree;
`library_path` says which one was loaded.
"""

from ._lib import (
    VERSION_NUMBER,
    FlashAttnError,
    backend_built,
    build_info,
    device_count,
    device_info,
    library_path,
    version,
)

from ._lib import VERSION_MAJOR as _MAJOR, VERSION_MINOR as _MINOR, VERSION_PATCH as _PATCH

__version__ = f"{_MAJOR}.{_MINOR}.{_PATCH}"  # include/flashattn.h's version, as _lib mirrors it

_TORCH_NAMES = (
    "flash_attn_func",
    "flash_attn_varlen_func",
    "flash_attn_qkvpacked_func",
    "flash_attn_kvpacked_func",
    "flash_attn_varlen_qkvpacked_func",
    "flash_attn_varlen_kvpacked_func",
    "scaled_dot_product_attention",
    "flash_attn_with_kvcache",
    "quantize_e4m3",
    "hadamard_rotate",
)
_NUMPY_NAMES = ("attention", "attention_backward", "attention_with_kvcache")

__all__ = [
    "FlashAttnError",
    "VERSION_NUMBER",
    "backend_built",
    "build_info",
    "device_count",
    "device_info",
    "library_path",
    "version",
    *_TORCH_NAMES,
    *_NUMPY_NAMES,
]


def __getattr__(name):
    if name in _TORCH_NAMES:
        try:
            from . import _torch as module
        except ModuleNotFoundError as e:
            if e.name != "torch":
                raise
            raise ModuleNotFoundError(
                f"flashattn.{name} is the PyTorch entry point and needs PyTorch (>= 2.4), which is not "
                "installed: `pip install torch`, or, for numpy arrays without PyTorch, use "
                "flashattn.attention (and flashattn.attention_backward)",
                name="torch",
            ) from e
    elif name in _NUMPY_NAMES:
        from . import _numpy as module
    else:
        raise AttributeError(f"module 'flashattn' has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value  # later lookups (and torch.compile's tracing) see a plain module attribute
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
