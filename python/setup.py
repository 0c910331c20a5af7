"""Packaging glue: a non-editable install (`pip install python/`) copies the library built by `make`
(../build/libflashattn.so, or $FLASHATTN_LIBRARY) into the package, if it exists. An editable install
(`pip install -e python/`) copies nothing: the package then loads the library from the build tree, so a
rebuild takes effect without reinstalling. Everything else is in pyproject.toml."""

import os
import shutil
import sys

from setuptools import setup
from setuptools.command.build_py import build_py
from setuptools.dist import Distribution

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "libflashattn.dylib" if sys.platform == "darwin" else "libflashattn.so"


def built_library():
    path = os.environ.get("FLASHATTN_LIBRARY") or os.path.join(HERE, "..", "build", NAME)
    return path if os.path.isfile(path) else None


class BuildPyWithLibrary(build_py):
    def run(self):
        super().run()
        lib = built_library()
        if lib and not getattr(self, "editable_mode", False):
            target = os.path.join(self.build_lib, "flashattn", NAME)
            self.announce(f"bundling {lib} as {target}", level=2)
            shutil.copyfile(lib, target)


class MaybeBinaryDistribution(Distribution):
    def has_ext_modules(self):
        return built_library() is not None  # a bundled library makes the wheel platform-specific


setup(cmdclass={"build_py": BuildPyWithLibrary}, distclass=MaybeBinaryDistribution)
