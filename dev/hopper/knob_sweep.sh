#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One GPU-machine session that times the FA3 forward under developer knobs with the library's own benchmark
# (`flashattn bench --sweep paper`, the README's method), each run twice, and prints TFLOP/s per shape with one
# column per knob setting ("a/b": the two repeats).
#   KNOBS='m128|--head-dim 64|FLASHATTN_FA3_BLOCK_M=128
#   m192|--head-dim 64|FLASHATTN_FA3_BLOCK_M=192' dev/hopper/knob_sweep.sh
# Each line: name | sweep arguments | environment (space-separated NAME=VALUE; empty: the defaults) [| the
# flashattn binary, default build/tuning/flashattn (FA_TUNING=1): another tree's build, for an A/B in the same call].
set -u
cd "$(dirname "$0")/../.." || exit 1
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
make -j16 FA_TUNING=1 BUILD=build/tuning FA_CUDA_ARCHS=90a build/tuning/flashattn >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
: "${KNOBS:?KNOBS: one 'name|sweep arguments|NAME=VALUE ...' per line}"
for rep in 1 2; do
    while IFS='|' read -r name args envs bin; do
        [ -n "$name" ] || continue
        # shellcheck disable=SC2086
        env $envs "${bin:-build/tuning/flashattn}" bench --sweep paper --backend cuda --fwd-only $args 2>/dev/null |
            awk -v n="$name" 'NR > 2 && NF >= 6 {print n, $1, $2, $3, $6}'
    done <<<"$KNOBS"
done >"$OUT/knobs.txt"
python3 - "$OUT/knobs.txt" <<'PY'
import collections, sys
runs = collections.defaultdict(list)
for line in open(sys.argv[1]):
    name, d, causal, seqlen, tflops = line.split()
    runs[(int(d), causal, int(seqlen), name)].append(float(tflops))
names = list(dict.fromkeys(k[3] for k in runs))
print("   d causal seqlen " + " ".join("%14s" % n for n in names))
for shape in sorted({k[:3] for k in runs}):
    cells = ["/".join("%.0f" % x for x in runs.get(shape + (n,), [])) or "-" for n in names]
    print("%4d %6s %6d " % shape + " ".join("%14s" % c for c in cells))
PY
