# SPDX-License-Identifier: Apache-2.0
"""Loading libflashattn with ctypes: the library search, mirrors of the C structs of include/flashattn.h,
the ABI checks done at import, and the call wrapper that turns an fa_status into a Python exception.

Nothing here imports numpy or torch.
"""

import ctypes
import ctypes.util
import os
import re
import sys

# The header this binding mirrors (FA_VERSION_NUMBER of include/flashattn.h).
VERSION_MAJOR = 0
VERSION_MINOR = 2
VERSION_PATCH = 0
VERSION_NUMBER = VERSION_MAJOR * 10000 + VERSION_MINOR * 100 + VERSION_PATCH

# fa_status
FA_OK = 0
FA_ERR_INVALID_ARGUMENT = 1
FA_ERR_UNSUPPORTED = 2
FA_ERR_NOT_COMPILED = 3
FA_ERR_NO_DEVICE = 4
FA_ERR_WORKSPACE_TOO_SMALL = 5
FA_ERR_OUT_OF_MEMORY = 6
FA_ERR_DEVICE = 7
FA_ERR_INTERNAL = 8

# fa_dtype
FA_F32 = 0
FA_F16 = 1
FA_BF16 = 2
FA_E4M3 = 3

# fa_backend
FA_BACKEND_AUTO = 0
FA_BACKEND_CPU = 1
FA_BACKEND_CUDA = 2
FA_BACKEND_REFERENCE = 3
FA_BACKEND_NAIVE = 4

BACKENDS = {
    "auto": FA_BACKEND_AUTO,
    "cpu": FA_BACKEND_CPU,
    "cuda": FA_BACKEND_CUDA,
    "reference": FA_BACKEND_REFERENCE,
    "naive": FA_BACKEND_NAIVE,
}

# fa_kernel
FA_KERNEL_AUTO = 0
FA_KERNEL_FA2 = 2
FA_KERNEL_FA3 = 3

_c_enum = ctypes.c_int  # C enums are int-sized on every ABI this library targets


class Tensor(ctypes.Structure):
    """fa_tensor: a (batch, seqlen, heads, head_dim) view; strides in elements, head_dim contiguous."""

    _fields_ = [
        ("data", ctypes.c_void_p),
        ("stride_batch", ctypes.c_int64),
        ("stride_seq", ctypes.c_int64),
        ("stride_head", ctypes.c_int64),
    ]


class Params(ctypes.Structure):
    """fa_params, field for field; ctypes applies the same alignment and padding rules as the C compiler."""

    _fields_ = [
        ("dtype", _c_enum),
        ("batch", ctypes.c_int32),
        ("seqlen_q", ctypes.c_int32),
        ("seqlen_k", ctypes.c_int32),
        ("heads_q", ctypes.c_int32),
        ("heads_kv", ctypes.c_int32),
        ("head_dim", ctypes.c_int32),
        ("cu_seqlens_q", ctypes.c_void_p),
        ("cu_seqlens_k", ctypes.c_void_p),
        ("total_q", ctypes.c_int64),
        ("total_k", ctypes.c_int64),
        ("softmax_scale", ctypes.c_float),
        ("causal", ctypes.c_int32),
        ("window_left", ctypes.c_int32),
        ("window_right", ctypes.c_int32),
        ("softcap", ctypes.c_float),
        ("alibi_slopes", ctypes.c_void_p),
        ("alibi_batch_stride", ctypes.c_int64),
        ("deterministic", ctypes.c_int32),
        ("q", Tensor),
        ("k", Tensor),
        ("v", Tensor),
        ("o", Tensor),
        ("lse", ctypes.c_void_p),
        ("dout", Tensor),
        ("dq", Tensor),
        ("dk", Tensor),
        ("dv", Tensor),
        ("out_dtype", _c_enum),
        ("q_descale", ctypes.c_void_p),
        ("k_descale", ctypes.c_void_p),
        ("v_descale", ctypes.c_void_p),
        ("descale_block_q", ctypes.c_int32),
        ("descale_block_k", ctypes.c_int32),
    ]


# FLASHATTN_DEBUG=1: every GPU call sets fa_exec.check (device-side checks of cu_seqlens, which synchronise the
# stream and do not work under CUDA graph capture).
DEBUG = os.environ.get("FLASHATTN_DEBUG", "") not in ("", "0")


class Exec(ctypes.Structure):
    """fa_exec: where and how a call runs."""

    _fields_ = [
        ("backend", _c_enum),
        ("kernel", _c_enum),
        ("device", ctypes.c_int32),
        ("num_threads", ctypes.c_int32),
        ("stream", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        ("workspace_bytes", ctypes.c_size_t),
        ("check", ctypes.c_int32),
    ]


class KvCache(ctypes.Structure):
    """fa_kvcache: the cache, its page table, the per-sequence int32 arrays and the rotary tables of a
    decode call (fa_fwd_kvcache)."""

    _fields_ = [
        ("k_cache", Tensor),
        ("v_cache", Tensor),
        ("batch_cache", ctypes.c_int32),
        ("seqlen_cache", ctypes.c_int32),
        ("block_table", ctypes.c_void_p),
        ("block_table_stride", ctypes.c_int64),
        ("max_pages", ctypes.c_int32),
        ("num_pages", ctypes.c_int32),
        ("page_size", ctypes.c_int32),
        ("cache_seqlens", ctypes.c_void_p),
        ("cache_batch_idx", ctypes.c_void_p),
        ("cache_leftpad", ctypes.c_void_p),
        ("rotary_cos", ctypes.c_void_p),
        ("rotary_sin", ctypes.c_void_p),
        ("rotary_seqlen", ctypes.c_int32),
        ("rotary_dim", ctypes.c_int32),
        ("rotary_interleaved", ctypes.c_int32),
        ("num_splits", ctypes.c_int32),
    ]


class DeviceInfo(ctypes.Structure):
    """fa_device_info."""

    _fields_ = [
        ("name", ctypes.c_char * 256),
        ("ordinal", ctypes.c_int32),
        ("cc_major", ctypes.c_int32),
        ("cc_minor", ctypes.c_int32),
        ("sm_count", ctypes.c_int32),
        ("memory_bytes", ctypes.c_int64),
    ]


class FlashAttnError(RuntimeError):
    """A call into libflashattn failed. `status` is the fa_status value, `status_name` its enumerator name
    ("FA_ERR_UNSUPPORTED"), `detail` the library's fa_last_error() message."""

    def __init__(self, function, status, status_name, description, detail):
        self.function = function
        self.status = status
        self.status_name = status_name
        self.description = description
        self.detail = detail
        message = f"{function}: {description} ({status_name})"
        if detail:
            message += f": {detail}"
        super().__init__(message)


if sys.platform == "darwin":
    _LIBRARY_NAME = "libflashattn.dylib"
elif sys.platform == "win32":
    _LIBRARY_NAME = "flashattn.dll"
else:
    _LIBRARY_NAME = "libflashattn.so"

_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


def candidate_paths():
    """Where the library is looked for, in order: $FLASHATTN_LIBRARY, next to this package, the build tree
    of the repository this package sits in (python/flashattn -> build/), then the system's search path."""
    paths = []
    env = os.environ.get("FLASHATTN_LIBRARY")
    if env:
        paths.append(env)
    paths.append(os.path.join(_PACKAGE_DIR, _LIBRARY_NAME))
    repo_root = os.path.dirname(os.path.dirname(_PACKAGE_DIR))
    # only when the package sits in a source tree: an installed package's grandparent is not one
    if os.path.isfile(os.path.join(repo_root, "include", "flashattn.h")):
        paths.append(os.path.join(repo_root, "build", _LIBRARY_NAME))
    return paths


def _load_error(path, error):
    """Why ctypes could not load an existing library file: the file itself, or a library it needs.

    The dynamic loader names the file it could not open first ("libcudart.so.13: cannot open shared object
    file: ..."); when that is not the library itself, the library was found and a dependency is missing."""
    text = str(error)
    match = re.match(r"(.+?): cannot open shared object file", text)
    if match and os.path.basename(match.group(1)) != os.path.basename(path):
        return ImportError(
            f"flashattn: {path} was found but a library it depends on is missing ({match.group(1)}): install "
            f"it or add its directory to LD_LIBRARY_PATH (`ldd {path}` lists what is not found). ({text})"
        )
    if "undefined symbol" in text or "version `" in text:
        return ImportError(
            f"flashattn: {path} was found but does not match a library it depends on ({text}); rebuild it "
            "with `make` on this machine"
        )
    return ImportError(f"flashattn: cannot load {path}: {text}")


def _load():
    env = os.environ.get("FLASHATTN_LIBRARY")
    tried = []
    load_error = None  # the first library that exists but does not load: what to report if none loads
    for path in candidate_paths():
        if not os.path.exists(path):
            tried.append(f"{path} (not found)")
            if env and path == env:
                raise ImportError(f"flashattn: FLASHATTN_LIBRARY={env} does not exist")
            continue
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            if env and path == env:
                raise _load_error(env, e) from e
            load_error = load_error or (_load_error(path, e), e)
            tried.append(f"{path} ({e})")
    found = ctypes.util.find_library("flashattn")
    if found:
        try:
            return ctypes.CDLL(found), found
        except OSError as e:
            load_error = load_error or (_load_error(found, e), e)
            tried.append(f"{found} ({e})")
    if load_error:
        raise load_error[0] from load_error[1]
    raise ImportError(
        "flashattn: cannot find " + _LIBRARY_NAME + "; build it with `make` in the repository root, or set "
        "FLASHATTN_LIBRARY to its path. Tried: " + "; ".join(tried)
    )


def _declare(lib):
    P = ctypes.POINTER
    signatures = {
        "fa_strerror": (ctypes.c_char_p, [_c_enum]),
        "fa_status_name": (ctypes.c_char_p, [_c_enum]),
        "fa_last_error": (ctypes.c_char_p, []),
        "fa_params_init": (
            _c_enum,
            [P(Params), _c_enum, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32,
             ctypes.c_int32, ctypes.c_int32],
        ),
        "fa_check": (_c_enum, [P(Params), P(Exec), ctypes.c_int]),
        "fa_workspace_size": (_c_enum, [P(Params), P(Exec), ctypes.c_int, P(ctypes.c_size_t)]),
        "fa_fwd": (_c_enum, [P(Params), P(Exec)]),
        "fa_bwd": (_c_enum, [P(Params), P(Exec)]),
        "fa_version_number": (ctypes.c_int, []),
        "fa_params_sizeof": (ctypes.c_size_t, []),
        "fa_exec_sizeof": (ctypes.c_size_t, []),
        "fa_build_info": (ctypes.c_char_p, []),
        "fa_backend_built": (ctypes.c_int, [_c_enum]),
        "fa_device_count": (ctypes.c_int, []),
        "fa_device_get_info": (_c_enum, [ctypes.c_int32, P(DeviceInfo)]),
        "fa_kvcache_init": (_c_enum, [P(KvCache), ctypes.c_int32, ctypes.c_int32]),
        "fa_check_kvcache": (_c_enum, [P(Params), P(KvCache), P(Exec)]),
        "fa_workspace_size_kvcache": (_c_enum, [P(Params), P(KvCache), P(Exec), P(ctypes.c_size_t)]),
        "fa_fwd_kvcache": (_c_enum, [P(Params), P(KvCache), P(Exec)]),
        "fa_kvcache_sizeof": (ctypes.c_size_t, []),
    }
    for name, (restype, argtypes) in signatures.items():
        fn = getattr(lib, name)
        fn.restype = restype
        fn.argtypes = argtypes


def _check_abi(lib, path):
    version = lib.fa_version_number()
    if version != VERSION_NUMBER:
        raise ImportError(
            f"flashattn: {path} is version {version // 10000}.{version // 100 % 100}.{version % 100} "
            f"(FA_VERSION_NUMBER {version}) but this package was written for {VERSION_NUMBER}; rebuild the "
            "library or reinstall the package from the same source tree"
        )
    for what, struct, size in (
        ("fa_params", Params, lib.fa_params_sizeof()),
        ("fa_exec", Exec, lib.fa_exec_sizeof()),
        ("fa_kvcache", KvCache, lib.fa_kvcache_sizeof()),
    ):
        if size != ctypes.sizeof(struct):
            raise ImportError(
                f"flashattn: sizeof({what}) is {size} in {path} but {ctypes.sizeof(struct)} in the Python "
                "mirror; the library and the package come from different versions of include/flashattn.h"
            )


lib, library_path = _load()
_declare(lib)
_check_abi(lib, library_path)


def load_library(path):
    """A second copy of the library, from a file other than the package's own (bench/compare.py's base-direct: a
    build from before a change, timed beside this one in one process), declared and checked like the package's
    own. The dynamic loader keeps the two apart: each copy resolves its own symbols and keeps its own state."""
    path = os.path.abspath(path)
    if not os.path.exists(path):
        raise ImportError(f"flashattn: {path} does not exist")
    if os.path.realpath(path) == os.path.realpath(library_path):
        raise ImportError(f"flashattn: {path} is the package's own library, not a second copy")
    try:
        other = ctypes.CDLL(path)
    except OSError as e:
        raise _load_error(path, e) from e
    _declare(other)
    _check_abi(other, path)
    return other


def _text(b):
    return b.decode("utf-8", "replace") if b else ""


def raise_for_status(function, status):
    if status == FA_OK:
        return
    detail = _text(lib.fa_last_error())  # read first: it is per thread and cleared by the next call
    raise FlashAttnError(function, status, _text(lib.fa_status_name(status)), _text(lib.fa_strerror(status)),
                         detail)


def call(function, *args):
    """Calls lib.<function>(*args) and raises FlashAttnError unless it returns FA_OK."""
    raise_for_status(function, getattr(lib, function)(*args))


def new_params(dtype, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim):
    p = Params()
    call("fa_params_init", ctypes.byref(p), dtype, batch, seqlen_q, seqlen_k, heads_q, heads_kv, head_dim)
    return p


def workspace_size(params, exe, backward):
    n = ctypes.c_size_t(0)
    call("fa_workspace_size", ctypes.byref(params), ctypes.byref(exe), int(backward), ctypes.byref(n))
    return n.value


def version():
    """The linked library's version as a string, e.g. "0.1.0"."""
    v = lib.fa_version_number()
    return f"{v // 10000}.{v // 100 % 100}.{v % 100}"


def build_info():
    """One line from the library: version, backends built, CUDA version and architectures, OpenMP, SIMD."""
    return _text(lib.fa_build_info())


def _cuda_head_dims():
    """The head dims the library's CUDA kernels are compiled for, ascending, from build_info()'s "hdims=32,64,...";
    () when the library has no CUDA backend."""
    m = re.search(r"\bhdims=([0-9,]+)", build_info())
    return tuple(int(d) for d in m.group(1).split(",") if d) if m else ()


CUDA_HEAD_DIMS = _cuda_head_dims()


def backend_built(name):
    """True if the backend ("cpu", "cuda", "reference", "naive", "auto") was compiled into the library."""
    if name not in BACKENDS:
        raise ValueError(f"backend must be one of {sorted(BACKENDS)}, got {name!r}")
    return bool(lib.fa_backend_built(BACKENDS[name]))


def device_count():
    """CUDA devices usable by the library (0 when CUDA is not built in or no GPU is present)."""
    return int(lib.fa_device_count())


def device_info(ordinal=0):
    """A dict describing CUDA device `ordinal` as the library sees it."""
    info = DeviceInfo()
    call("fa_device_get_info", int(ordinal), ctypes.byref(info))
    return {
        "name": _text(info.name),
        "ordinal": info.ordinal,
        "compute_capability": (info.cc_major, info.cc_minor),
        "sm_count": info.sm_count,
        "memory_bytes": info.memory_bytes,
    }


def new_kvcache(batch_cache, seqlen_cache):
    kv = KvCache()
    call("fa_kvcache_init", ctypes.byref(kv), batch_cache, seqlen_cache)
    return kv


def workspace_size_kvcache(params, kv, exe):
    n = ctypes.c_size_t(0)
    call("fa_workspace_size_kvcache", ctypes.byref(params), ctypes.byref(kv), ctypes.byref(exe), ctypes.byref(n))
    return n.value
