#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One GPU-machine session that times the FA3 forward of this tree against other trees' (A/B), interleaved with
# PyTorch's cuDNN and FLASH backends by compare.py. Each tree named in ALTS is a copy under dev/<name>/ (untracked,
# so that it travels), e.g. the last commit's:
#   mkdir -p dev/old && git archive HEAD src include dev/hopper | tar -x -C dev/old
#   ALTS="old" COMPARE_EXTRA="--seqlens 1024,4096" dev/hopper/ab.sh
# PARTS picks device_run.sh's steps after the build (default: unit check compare).
set -u
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
pids=()
alts=""
for t in ${ALTS:-old}; do
    (cd "dev/$t" && dev/hopper/build.sh build/dev-hopper) >"$OUT/build-$t.log" 2>&1 &
    pids+=($!)
    alts="$alts --alt $t=dev/$t/build/dev-hopper/libfa3dev.so"
done
dev/hopper/build.sh build/dev-hopper >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
grep -i spill "$OUT/build.log" | sed 's/.*function .\(.*\).,/\1/' | cut -c1-150
for p in "${pids[@]}"; do wait "$p"; done
SKIP_BUILD=1 DEADLINE=${DEADLINE:-420} COMPARE_ARGS="$alts ${COMPARE_EXTRA:-}" dev/hopper/device_run.sh ${PARTS:-unit check compare}
