# SPDX-License-Identifier: Apache-2.0
"""Checks an installed flashattn wheel from outside the source tree (make test-wheel runs it in a fresh venv):
the package imports the library bundled in it, not one of a build tree or of $FLASHATTN_LIBRARY; the wheel's
name, the package and the library all carry the version of include/flashattn.h; the wheel is tagged for any
Python 3 and carries the licence.

    python tools/check_wheel.py WHEEL VERSION
"""

import os
import sys


def main():
    wheel, version = sys.argv[1], sys.argv[2]
    name = os.path.basename(wheel)
    checks = [(name.startswith(f"flashattn-{version}-"), f"wheel {name}: expected version {version} in its name"),
              ("-py3-none-" in name, f"wheel {name}: expected the py3-none tag (no extension module is compiled)"),
              (not (os.environ.get("FLASHATTN_LIBRARY") or os.environ.get("PYTHONPATH")),
               "FLASHATTN_LIBRARY or PYTHONPATH is set: the check would not test the wheel")]
    import flashattn

    package_dir = os.path.dirname(os.path.abspath(flashattn.__file__))
    bundled = os.path.realpath(flashattn.library_path).startswith(os.path.realpath(package_dir) + os.sep)
    checks += [(bundled, f"library loaded from {flashattn.library_path}, not from the package ({package_dir})"),
               (os.path.isfile(os.path.join(package_dir, "LICENSE")), "the package has no LICENSE"),
               (flashattn.__version__ == flashattn.version() == version,
                f"versions differ: package {flashattn.__version__}, library {flashattn.version()}, header {version}")]
    print(f"wheel {name}: flashattn {flashattn.__version__} from {package_dir}, library {flashattn.library_path}")
    failed = [message for ok, message in checks if not ok]
    for message in failed:
        print(f"FAILED: {message}")
    print(f"wheel-check: {len(checks) - len(failed)} passed, {len(failed)} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
