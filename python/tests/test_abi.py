# SPDX-License-Identifier: Apache-2.0
"""The ctypes mirrors in flashattn/_lib.py against include/flashattn.h: the offset of every field, every
struct's size and the version macros, as a C compiler sees them. Needs a C compiler, not the library's
backends (the package import itself checks sizeof(fa_params), sizeof(fa_exec) and the version)."""

import ctypes
import os
import re
import shutil
import subprocess

import pytest

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HEADER = os.path.join(REPO_ROOT, "include", "flashattn.h")


def _compiler():
    for cc in (os.environ.get("CC"), "cc", "gcc", "clang"):
        if cc and shutil.which(cc):
            return cc
    return None


@pytest.fixture(scope="module")
def lib():
    # Imported here, not at module level, so that a missing library fails this fixture only.
    from flashattn import _lib

    return _lib


def _mirrors(lib):
    return {"fa_tensor": lib.Tensor, "fa_params": lib.Params, "fa_exec": lib.Exec, "fa_device_info": lib.DeviceInfo,
            "fa_kvcache": lib.KvCache}


def test_version_macros_match_header(lib):
    if not os.path.exists(HEADER):
        pytest.skip(f"{HEADER} not found (package tested outside its source tree)")
    text = open(HEADER).read()
    macro = {m: int(re.search(rf"#define FA_VERSION_{m}\s+(\d+)", text).group(1)) for m in ("MAJOR", "MINOR", "PATCH")}
    assert (lib.VERSION_MAJOR, lib.VERSION_MINOR, lib.VERSION_PATCH) == (macro["MAJOR"], macro["MINOR"], macro["PATCH"])


def test_field_names_in_header_order(lib):
    if not os.path.exists(HEADER):
        pytest.skip(f"{HEADER} not found (package tested outside its source tree)")
    text = open(HEADER).read()
    for cname, mirror in _mirrors(lib).items():
        body = re.search(r"typedef struct %s \{(.*?)\} %s;" % (cname, cname), text, re.S).group(1)
        body = re.sub(r"/\*.*?\*/", "", body, flags=re.S)
        names = []
        for decl in body.split(";"):
            decl = decl.strip()
            if not decl:
                continue
            head = re.match(r"^(?:const\s+)?[A-Za-z_][A-Za-z0-9_]*\s*\**\s*", decl)
            for name in decl[head.end():].split(","):
                names.append(re.sub(r"[\s*]|\[.*\]", "", name))
        assert names == [f[0] for f in mirror._fields_], cname


def test_offsets_match_c_compiler(lib, tmp_path):
    cc = _compiler()
    if cc is None:
        pytest.skip("no C compiler found (set CC)")
    if not os.path.exists(HEADER):
        pytest.skip(f"{HEADER} not found (package tested outside its source tree)")
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "flashattn.h"', "int main(void) {"]
    expected = []
    for cname, mirror in _mirrors(lib).items():
        lines.append(f'    printf("{cname} %zu\\n", sizeof({cname}));')
        expected.append(f"{cname} {ctypes.sizeof(mirror)}")
        for field, *_ in mirror._fields_:
            lines.append(f'    printf("{cname}.{field} %zu\\n", offsetof({cname}, {field}));')
            expected.append(f"{cname}.{field} {getattr(mirror, field).offset}")
    lines += ["    return 0;", "}"]
    src = tmp_path / "offsets.c"
    exe = tmp_path / "offsets"
    src.write_text("\n".join(lines) + "\n")
    subprocess.run([cc, "-std=c11", "-I", os.path.dirname(HEADER), str(src), "-o", str(exe)], check=True)
    got = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout.split("\n")
    assert [line for line in got if line] == expected


def test_a_second_copy_of_the_library_loads_beside_the_package_s(lib, tmp_path):
    # bench/compare.py's base-direct: another build timed in the same process; its own symbols and state
    copy = tmp_path / "libflashattn-base.so"
    shutil.copyfile(lib.library_path, copy)
    other = lib.load_library(str(copy))
    assert other._handle != lib.lib._handle
    assert other.fa_version_number() == lib.lib.fa_version_number()
    assert other.fa_params_sizeof() == ctypes.sizeof(lib.Params)
    assert ctypes.cast(other.fa_fwd, ctypes.c_void_p).value != ctypes.cast(lib.lib.fa_fwd, ctypes.c_void_p).value
    with pytest.raises(ImportError, match="package's own library"):
        lib.load_library(lib.library_path)
    with pytest.raises(ImportError, match="does not exist"):
        lib.load_library(str(tmp_path / "missing.so"))
    text = tmp_path / "not-a-library.so"
    text.write_text("no ELF here")
    with pytest.raises(ImportError):
        lib.load_library(str(text))
