# SPDX-License-Identifier: Apache-2.0
"""What a new user meets before the first call: the messages of a failed import, and the version and licence
the package declares. The import cases run in a child interpreter, so that this process's flashattn and
torch modules are left alone."""

import os
import re
import shutil
import subprocess
import sys

import pytest

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_ROOT = os.path.dirname(PYTHON_DIR)


def _python(code, **env):
    """Runs code in a fresh interpreter that imports the package from this tree; returns (rc, stderr)."""
    full_env = dict(os.environ, PYTHONPATH=PYTHON_DIR, **env)
    r = subprocess.run([sys.executable, "-c", code], env=full_env, capture_output=True, text=True, timeout=120)
    return r.returncode, r.stderr


def test_missing_dependency_is_named(tmp_path):
    # A stand-in libflashattn.so that needs a library which is then deleted: the loader finds the file and
    # fails on the dependency, as a CUDA-linked build does on a machine without the CUDA runtime.
    cc = next((c for c in (os.environ.get("CC"), "cc", "gcc", "clang") if c and shutil.which(c)), None)
    if cc is None:
        pytest.skip("no C compiler")
    (tmp_path / "gone.c").write_text("int fa_test_gone(void) { return 1; }\n")
    (tmp_path / "lib.c").write_text("int fa_test_gone(void);\nint fa_test_user(void) { return fa_test_gone(); }\n")
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(tmp_path / "libfa_test_gone.so"), str(tmp_path / "gone.c")],
                   check=True)
    lib = tmp_path / "libflashattn.so"
    subprocess.run([cc, "-shared", "-fPIC", "-o", str(lib), str(tmp_path / "lib.c"), f"-L{tmp_path}",
                    "-lfa_test_gone"], check=True)
    (tmp_path / "libfa_test_gone.so").unlink()
    rc, err = _python("import flashattn", FLASHATTN_LIBRARY=str(lib))
    assert rc != 0
    assert "was found but a library it depends on is missing (libfa_test_gone.so)" in err, err
    assert "cannot find" not in err


def test_not_found_is_not_a_dependency_message(tmp_path):
    rc, err = _python("import flashattn", FLASHATTN_LIBRARY=str(tmp_path / "libflashattn.so"))
    assert rc != 0
    assert "does not exist" in err and "depends on" not in err, err


def test_torch_entry_point_without_torch_names_the_numpy_one():
    # None in sys.modules makes `import torch` raise ModuleNotFoundError, as when PyTorch is not installed.
    code = "import sys; sys.modules['torch'] = None\nfrom flashattn import flash_attn_func"
    rc, err = _python(code)
    assert rc != 0
    last = err.strip().splitlines()[-1]
    assert last.startswith("ModuleNotFoundError:") and "flashattn.attention" in last and "PyTorch" in last, err
    # the numpy entry point still imports
    rc, err = _python("import sys; sys.modules['torch'] = None\nfrom flashattn import attention")
    assert rc == 0, err


def test_version_comes_from_the_header():
    import flashattn

    header = os.path.join(REPO_ROOT, "include", "flashattn.h")
    if not os.path.exists(header):
        pytest.skip("package tested outside its source tree")
    text = open(header).read()
    parts = [re.search(rf"#define FA_VERSION_{p}\s+(\d+)", text).group(1) for p in ("MAJOR", "MINOR", "PATCH")]
    assert flashattn.__version__ == ".".join(parts) == flashattn.version()
    pyproject = open(os.path.join(PYTHON_DIR, "pyproject.toml")).read()
    assert re.search(r'^dynamic = \["version"\]', pyproject, re.M), "pyproject.toml repeats the version"
    assert not re.search(r"^version\s*=", pyproject, re.M)
    assert re.search(r'^license = \{text = "Apache-2.0"\}', pyproject, re.M)
