#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# tests/no_cuda_libs.sh FLASHATTN LIBDIR [PYTHON] - a CUDA build runs its host backends where the CUDA libraries
# are missing: in a private mount namespace with LIBDIR (the toolkit's lib64: cuBLAS) hidden under an empty
# tmpfs, `flashattn run --backend cpu` passes, `flashattn info` says what is missing, and the Python package
# imports and runs a CPU call (where numpy is installed). Skipped where the build has no CUDA or user and mount
# namespaces are not allowed.
fa=${1:?usage: tests/no_cuda_libs.sh path/to/flashattn cuda-libdir [python]}
libdir=${2:?usage: tests/no_cuda_libs.sh path/to/flashattn cuda-libdir [python]}
py=${3:-python3}
if ! "$fa" info | grep -q "cuda=yes"; then echo "SKIP  built without CUDA"; echo "0 passed, 0 failed"; exit 0; fi
if [ ! -d "$libdir" ] || ! unshare -rm true 2> /dev/null; then
    echo "SKIP  no private mount namespace here (unshare -rm), or no $libdir"; echo "0 passed, 0 failed"; exit 0
fi
root=$(cd "$(dirname "$0")/.." && pwd)
fa=$(cd "$(dirname "$fa")" && pwd)/$(basename "$fa")
out=$(unshare -rm sh -c '
    mount -t tmpfs none "$1" || exit 90
    echo "== run"; "$2" run --backend cpu --batch 1 --heads 2 --seqlen 256 --head-dim 64 2>&1 | tail -n 1
    echo "== info"; "$2" info 2>&1
    echo "== python"; cd /tmp && PYTHONPATH="$3/python" FLASHATTN_LIBRARY="$(dirname "$2")/libflashattn.so" "$4" -c "
import numpy as np, flashattn
q = np.random.default_rng(0).standard_normal((1, 8, 2, 64)).astype(np.float32)
o = flashattn.attention(q, q, q)
print(\"python: ok\", o.shape)
" 2>&1 | tail -n 2' sh "$libdir" "$fa" "$root" "$py")
rc=$?
pass=0 fail=0
check() { # NAME PATTERN
    if [ $rc -ne 90 ] && printf '%s\n' "$out" | grep -Eq -- "$2"; then echo "PASS  $1"; pass=$((pass + 1))
    else echo "FAIL  $1 (want '$2'):"; printf '%s\n' "$out" | tail -n 8; fail=$((fail + 1)); fi
}
check "flashattn run --backend cpu without the CUDA libraries" "PASS"
check "flashattn info names the missing cuBLAS" "cublas: .*libcublas"
if "$py" -c "import numpy" 2> /dev/null; then
    check "the Python package imports and runs on the CPU" "python: ok"
else
    echo "SKIP  the Python package's CPU call: $py has no numpy (.ci/run installs it)"
fi
echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
