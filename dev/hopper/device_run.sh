#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# One GPU-machine session for the FA3 forward: build the driver, bring-up checks, the correctness sweep,
# compute-sanitizer on a small problem, the paper sweep with PyTorch's SDPA (flash, cudnn) timed in the same
# session, the schedule steps, and (compare) ours interleaved with cuDNN and FA2 in one process. Logs go to
# $OUT; a summary is printed last.
#   dev/hopper/device_run.sh [libtest] [unit] [check] [sanitize] [bench] [peers] [steps] [compare] [ncu]
# COMPARE_ARGS adds options to compare.py (e.g. "--head-dims 64,128 --seqlens 4096,8192"); DEADLINE (seconds
# since the start, default 400) bounds the compare step so that the whole session ends in time.
set -u -o pipefail
START=$SECONDS
cd "$(dirname "$0")/../.."
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
PARTS=${*:-"unit check sanitize compare"}
B=build/dev-hopper
has() { [[ " $PARTS " == *" $1 "* ]]; }

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw --format=csv 2>&1 | tee "$OUT/summary.log"
if has libtest; then # the whole library and its GPU test suite, built while the driver runs its checks
    (make -j16 BUILD=build/dev-lib build/dev-lib/flashattn build/dev-lib/tests/test_backends > "$OUT/libbuild.log" 2>&1
     echo "rc=$?" >> "$OUT/libbuild.log") &
    libbuild=$!
fi
if [ "${SKIP_BUILD:-0}" = 1 ] && [ -x "$B/fa3_dev" ]; then # SKIP_BUILD=1: the driver built by an earlier step
    echo "build skipped" | tee -a "$OUT/summary.log"
else
    dev/hopper/build.sh "$B" > "$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
    echo "build ok" | tee -a "$OUT/summary.log"
fi

if has unit; then timeout 60 "$B/fa3_dev" unit 2>&1 | tee "$OUT/unit.log" | tee -a "$OUT/summary.log"; fi
if has check; then timeout 90 "$B/fa3_dev" check 2>&1 | tee "$OUT/check.log"; grep -E "FAIL|check:" "$OUT/check.log" >> "$OUT/summary.log"; fi
if has sanitize; then
    { timeout 60 compute-sanitizer --tool memcheck "$B/fa3_dev" small 2>&1 | tail -8
      timeout 75 compute-sanitizer --tool racecheck "$B/fa3_dev" small 2>&1 | tail -8; } > "$OUT/sanitize.log" 2>&1
    grep -E "ERROR SUMMARY|RACECHECK SUMMARY|check:|not supported|rror" "$OUT/sanitize.log" | head -8 >> "$OUT/summary.log"
fi
if has libtest; then
    wait "$libbuild"
    tail -1 "$OUT/libbuild.log" | sed 's/^/library build /' >> "$OUT/summary.log"
    timeout 120 build/dev-lib/tests/test_backends -b cuda > "$OUT/libtest.log" 2>&1
    echo "test_backends rc=$?" >> "$OUT/summary.log"
    grep -E "^summary|FAIL|passed" "$OUT/libtest.log" | head -20 >> "$OUT/summary.log"
    for args in "--dtype bf16 --head-dim 128 --causal --seqlen-q 1000 --seqlen-k 1000" \
                "--dtype f16 --head-dim 64 --heads 8 --heads-kv 2 --varlen --causal" \
                "--dtype bf16 --head-dim 256 --window 100,20 --softcap 30"; do
        timeout 60 build/dev-lib/flashattn check --backend cuda --kernel fa3 $args 2>&1 | tail -1 | sed "s|^|check $args: |" \
            >> "$OUT/summary.log"
    done
fi
if has bench; then timeout 300 "$B/fa3_dev" bench 2>&1 | tee "$OUT/bench.log" >> "$OUT/summary.log"; fi
if has peers; then
    PYTHONUNBUFFERED=1 timeout 300 python3 bench/peer_bench.py --passes fwd --impls flash,cudnn --json "$OUT/peers.json" \
        > "$OUT/peers.log" 2>&1
    tail -40 "$OUT/peers.log" >> "$OUT/summary.log"
fi
if has steps; then timeout 200 "$B/fa3_dev" steps 2>&1 | tee "$OUT/steps.log" >> "$OUT/summary.log"; fi
if has compare; then
    nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu --format=csv,noheader -lms 500 \
        > "$OUT/smi.log" 2>&1 &
    smi=$!
    left=$(( ${DEADLINE:-400} - (SECONDS - START) ))
    (( left < 60 )) && left=60
    echo "compare: ${left}s left" >> "$OUT/summary.log"
    PYTHONUNBUFFERED=1 timeout "$left" python3 dev/hopper/compare.py "$B/libfa3dev.so" --variants --json "$OUT/compare.json" \
        ${COMPARE_ARGS:-} > "$OUT/compare.log" 2>&1
    kill "$smi" 2>/dev/null
    grep -A40 "best variant" "$OUT/compare.log" >> "$OUT/summary.log" || grep -E "^d |WRONG|failed" "$OUT/compare.log" >> "$OUT/summary.log"
    awk -F', ' '{split($2,a," "); split($3,b," "); n++; c+=a[1]; w+=b[1]; if (a[1]<mn||mn=="") mn=a[1]} END {if (n) printf "smi: %d samples, mean SM clock %.0f MHz (min %d), mean power %.0f W\n", n, c/n, mn, w/n}' \
        "$OUT/smi.log" >> "$OUT/summary.log"
fi
if has ncu; then
    IFS=, read -r -a cfgs <<<"${NCU_CFGS:-128 8192 0,128 8192 1}" # NCU_CFGS: "d seqlen causal,..."
    for cfg in "${cfgs[@]}"; do
        timeout 120 ncu --clock-control none --kernel-name regex:fa3_fwd_kernel --launch-skip 4 --launch-count 1 \
            --section SpeedOfLight --section ComputeWorkloadAnalysis --section WarpStateStats --section LaunchStats \
            --section Occupancy "$B/fa3_dev" one $cfg > "$OUT/ncu_${cfg// /_}.log" 2>&1
        echo "ncu d/s/causal $cfg:" >> "$OUT/summary.log"
        grep -E "Duration|Compute \(SM\) Throughput|Memory Throughput|Executed Ipc A|Issue Slots Busy|Stall|Warp Cycles Per Issued|Registers Per|Tensor|Pipe" \
            "$OUT/ncu_${cfg// /_}.log" | head -24 >> "$OUT/summary.log"
    done
fi
echo "===== summary ====="
cat "$OUT/summary.log"
