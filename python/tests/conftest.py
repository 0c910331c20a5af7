# SPDX-License-Identifier: Apache-2.0
"""Test setup: import the package from this source tree (python/), so the tests run without installing it;
the package then finds the library in the repository's build/ directory (or through $FLASHATTN_LIBRARY)."""

import os
import sys

PYTHON_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO_ROOT = os.path.dirname(PYTHON_DIR)

if PYTHON_DIR not in sys.path:
    sys.path.insert(0, PYTHON_DIR)
