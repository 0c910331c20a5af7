# SPDX-License-Identifier: Apache-2.0
"""Packaging glue; everything else is in pyproject.toml.

Version: FA_VERSION_* of ../include/flashattn.h (or, in a source distribution without it, the same numbers
as mirrored by flashattn/_lib.py), so that the version is written in one place.

Library: a non-editable install (`pip install python/`) copies the library into the package: $FLASHATTN_LIBRARY
if set, else ../build/libflashattn.so, which is first built with `make -C .. lib` when it does not exist
(FA_CUDA and the Makefile's other knobs pass through the environment; by default CUDA is built when nvcc is
found). Without a library and without the Makefile to build one, the install fails with a message rather
than producing a package that cannot import. An editable install (`pip install -e python/`) copies nothing:
the package loads the library from the build tree, so a rebuild takes effect without reinstalling; it too
builds the library when it is missing.

Wheel: `pip wheel python/ -w dist` bundles the library the same way. The package is pure Python and loads
the library with ctypes, so the wheel fits every Python 3 (tag py3-none) but only the platform the library
was built for (linux_x86_64 here; `make wheel` builds a portable library and lets auditwheel replace that
tag by the manylinux one the library's glibc symbol versions allow).
"""

import os
import re
import shutil
import subprocess
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
NAME = "libflashattn.dylib" if sys.platform == "darwin" else "libflashattn.so"


def read_version():
    header = os.path.join(ROOT, "include", "flashattn.h")
    mirror = os.path.join(HERE, "flashattn", "_lib.py")
    for path, pattern in ((header, r"#define FA_VERSION_{}\s+(\d+)"), (mirror, r"^VERSION_{}\s*=\s*(\d+)")):
        if os.path.isfile(path):
            text = open(path).read()
            parts = [re.search(pattern.format(p), text, re.M) for p in ("MAJOR", "MINOR", "PATCH")]
            if all(parts):
                return ".".join(m.group(1) for m in parts)
    raise RuntimeError(f"flashattn: cannot find the version (FA_VERSION_* in {header})")


def library_source():
    """The library to bundle, building it first when the source tree has a Makefile and no library yet."""
    env = os.environ.get("FLASHATTN_LIBRARY")
    if env:
        if not os.path.isfile(env):
            raise RuntimeError(f"flashattn: FLASHATTN_LIBRARY={env} does not exist")
        return env
    built = os.path.join(ROOT, "build", NAME)
    if os.path.isfile(built):
        return built
    if not os.path.isfile(os.path.join(ROOT, "Makefile")):
        raise RuntimeError(
            f"flashattn: no {NAME} to bundle: {built} does not exist and there is no Makefile in {ROOT} to "
            "build it. Build the library with `make` in the repository root and install from python/ there, "
            "or set FLASHATTN_LIBRARY to a built libflashattn.so.")
    make = os.environ.get("MAKE", "make")
    jobs = str(os.cpu_count() or 1)
    print(f"flashattn: {built} does not exist; building it with `{make} -C {ROOT} -j{jobs} lib` (CUDA when "
          "nvcc is found, which takes minutes; FA_CUDA=0 in the environment builds the CPU backends only)",
          file=sys.stderr, flush=True)
    try:
        subprocess.run([make, "-C", ROOT, f"-j{jobs}", "lib"], check=True)
    except (OSError, subprocess.CalledProcessError) as e:
        raise RuntimeError(f"flashattn: building the library with `{make} -C {ROOT} lib` failed ({e}); run it "
                           "yourself to see why, then install again") from e
    if not os.path.isfile(built):
        raise RuntimeError(f"flashattn: `{make} -C {ROOT} lib` succeeded but {built} does not exist")
    return built


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        lib = library_source()
        if not getattr(self, "editable_mode", False):
            target = os.path.join(self.build_lib, "flashattn", NAME)
            self.announce(f"bundling {lib} as {target}", level=2)
            shutil.copyfile(lib, target)
            # The licence goes with the library it covers (Apache-2.0 asks that copies carry it); it sits in the
            # repository root, outside what setuptools' license-files may name (no "..").
            licence = os.path.join(ROOT, "LICENSE")
            if os.path.isfile(licence):
                shutil.copyfile(licence, os.path.join(self.build_lib, "flashattn", "LICENSE"))


try:  # setuptools >= 70.1 has bdist_wheel itself; before, the wheel package provides it
    from setuptools.command.bdist_wheel import bdist_wheel
except ImportError:
    try:
        from wheel.bdist_wheel import bdist_wheel
    except ImportError:
        bdist_wheel = None

CMDCLASS = {"build_py": BuildPyWithLibrary}

if bdist_wheel is not None:
    class BdistWheelAnyPython(bdist_wheel):
        """py3-none-<platform>: no Python extension module is compiled, so neither the interpreter nor its ABI
        matters, only the platform of the bundled library."""

        def get_tag(self):
            return ("py3", "none", super().get_tag()[2])

    CMDCLASS["bdist_wheel"] = BdistWheelAnyPython


class BinaryDistribution(Distribution):
    def has_ext_modules(self):
        return True  # the wheel bundles a shared library, so it is platform-specific


setup(version=read_version(), cmdclass=CMDCLASS, distclass=BinaryDistribution)
