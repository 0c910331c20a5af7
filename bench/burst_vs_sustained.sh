#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# burst_vs_sustained.sh - why `flashattn bench` and bench/compare.py read different figures for one kernel.
# For a few forward shapes it times our kernel four ways, with the GPU's SM clock and power logged every
# 100 ms by nvidia-smi: `flashattn bench` as it ships (3 warm-up + 10 timed calls: a burst), the same with
# 300 timed calls (sustained), and bench/compare.py's back-to-back mode (ours-direct, the library call alone,
# and cuDNN beside it) with the L2 flushed before each timed block and with it warm. Prints one row per shape
# and method: TFLOP/s, the mean SM clock and power over the samples taken while the GPU worked (power at least
# half the phase's peak; a burst of 13 calls may fall between two samples).
#
#   bench/burst_vs_sustained.sh [OUTDIR]      (needs build/flashattn, a GPU, nvidia-smi, PyTorch)
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 1
OUTDIR=${1:-${OUT:-/tmp}/burst}
mkdir -p "$OUTDIR"
FA=build/flashattn
PY=${PYTHON:-python3}
PHASES="$OUTDIR/phases.txt"
CLOCKS="$OUTDIR/clocks.csv"
: > "$PHASES"

nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw --format=csv,noheader,nounits -lms 100 > "$CLOCKS" &
SMI=$!
trap 'kill $SMI 2>/dev/null' EXIT
sleep 1

# name: d seqlen causal(yes|no); batch = 16k / seqlen, heads = 2048 / d, as the paper's sweep
SHAPES=("128 16384 no" "128 16384 yes" "128 1024 yes" "64 4096 yes" "256 8192 no")

phase() { # phase NAME TFLOPS_FILE command...
    local name=$1 out=$2
    shift 2
    local t0 t1
    t0=$(date +%s.%N)
    "$@" > "$out" 2>&1
    t1=$(date +%s.%N)
    echo "$name $t0 $t1 $out" >> "$PHASES"
}

for s in "${SHAPES[@]}"; do
    read -r d n causal <<< "$s"
    b=$((16384 / n)) h=$((2048 / d))
    flag=--no-causal
    [ "$causal" = yes ] && flag=--causal
    tag="d$d-s$n-$causal"
    common=(bench --backend cuda --dtype bf16 --batch $b --heads $h --head-dim $d --seqlen $n $flag)
    phase "$tag burst" "$OUTDIR/$tag-burst.csv.log" "$FA" "${common[@]}" --csv "$OUTDIR/$tag-burst.csv"
    phase "$tag sustained" "$OUTDIR/$tag-sustained.csv.log" "$FA" "${common[@]}" --repeats 300 \
        --csv "$OUTDIR/$tag-sustained.csv"
    for l2 in flush warm; do
        phase "$tag compare-$l2" "$OUTDIR/$tag-compare-$l2.log" "$PY" bench/compare.py --sets paper --head-dims "$d" \
            --seqlens "$n" --causal "$causal" --passes fwd --impls ours-direct,cudnn --l2 $l2 \
            --json "$OUTDIR/$tag-compare-$l2.json"
    done
done
kill $SMI 2>/dev/null

"$PY" - "$PHASES" "$CLOCKS" <<'PYEOF'
import csv, datetime, json, sys
phases, clocks = sys.argv[1], sys.argv[2]
samples = []
for row in csv.reader(open(clocks)):
    try:
        t = datetime.datetime.strptime(row[0].strip(), "%Y/%m/%d %H:%M:%S.%f").timestamp()
        samples.append((t, float(row[1]), float(row[2])))
    except (ValueError, IndexError):
        pass

def tflops(path):
    if path.endswith(".json"):
        recs = json.load(open(path)).get("records", [])
        return {r["impl"]: r["median"] for r in recs if "impl" in r and str(r.get("unit", "")).startswith("TFLOP")}
    rows = list(csv.DictReader(open(path)))
    return {"ours (flashattn bench)": float(rows[-1]["tflops"])} if rows else {}

print("%-18s %-16s %-34s %8s %7s" % ("shape", "method", "TFLOP/s", "SM MHz", "W"))
for line in open(phases):
    tag, method, t0, t1, log = line.split()
    t0, t1 = float(t0), float(t1)
    inside = [s for s in samples if t0 <= s[0] <= t1]
    # the samples while the GPU worked: a phase also holds process start and setup, at idle clocks
    busy = [s for s in inside if s[2] >= 0.5 * max(x[2] for x in inside)] if inside else []
    mhz = sum(s[1] for s in busy) / len(busy) if busy else float("nan")
    watts = sum(s[2] for s in busy) / len(busy) if busy else float("nan")
    src = log.replace(".csv.log", ".csv") if method in ("burst", "sustained") else log.replace(".log", ".json")
    try:
        figs = tflops(src)
    except (OSError, ValueError, KeyError):
        figs = {}
    text = ", ".join("%s %.0f" % (k, v) for k, v in figs.items()) or "-"
    print("%-18s %-16s %-34s %8.0f %7.0f" % (tag, method, text[:34], mhz, watts))
PYEOF
