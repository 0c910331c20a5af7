#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# device.sh - everything the GPU machine runs, in one script: build, the test suite (GPU tests included),
# compute-sanitizer on small problems, the benchmark of ours against PyTorch's attention backends in one
# harness (bench/compare.py), our kernels alone (flashattn bench), and the CPU comparison with PyTorch's CPU
# SDPA. Logs and results go to $OUT (default ./device-out), at most 10 files (build.log tests.log
# sanitize.log bench.log compare.json compare.csv cpu.log decode.log profile.log extras.tar); compare.py's
# summary table of ours vs the peers is printed last.
#
#   tools/device.sh [--quick] [--jobs N] [PART ...]
#
# PARTS (default: all = build test sanitize bench cpu; build runs first, incrementally, unless only summary)
#   build      make -j; prints the CUDA build time                          -> build.log
#   test       make test (C tests with the GPU ones, install test, Python) -> tests.log
#   sanitize   compute-sanitizer memcheck, racecheck, synccheck, initcheck -> sanitize.log
#   bench      bench/compare.py (ours and the peers, every ratio)           -> bench.log compare.json compare.csv
#              then flashattn bench --sweep paper (our kernels alone)       -> extras.tar: ours-bench.log/.csv, plots
#   cpu        compare.py --device cpu: b1 h8 s2048 d128, bf16 / fp16 / fp32 at 1 and 16 threads, ours vs torch's
#              CPU SDPA; bench/cpu_report.py's table of them              -> cpu.log (the runs' JSON in extras.tar)
#   decode     compare.py --sets decode: the plain shapes (ours, cuDNN, pages of 16, append + rotary), pages
#              of 64 and 256, MQA 32/1, head dims 64 and 256, 4 query tokens; bench/decode_report.py's table
#              of them all -> decode.log, the runs' JSON in extras.tar (not part of all)
#   ab         a change against the build before it: FA_AB_BASE names that build's source tree (e.g. what `git
#              archive BASE | tar x -C DIR` writes), whose library is built there with this FA_HDIMS; then
#              compare.py --impls ours-direct,base-direct (FA_COMPARE_ARGS replaces the default --sets paper,llama
#              --passes bwd): both in one process, ratio ours-direct/base-direct -> ab.log, ab.json, ab-build.log
#              (not part of all)
#   ab-decode  the same for calls whose builds cannot share a process (decode): FA_AB_BASE's library and this one
#              alternated twice, each a compare.py process of its own (FLASHATTN_LIBRARY; FA_COMPARE_ARGS replaces
#              the default --sets decode --impls ours,cudnn), bench/ab_report.py's table of their ratios to the
#              peer -> ab.log, the runs' JSON in extras.tar (not part of all)
#   profile    ncu (--set full) of one call of ours and of cuDNN's SDPA on one shape (FA_PROFILE="bwd 128
#              16384 [causal]", the default, or "decode BATCH CACHE_LENGTH [HQ/HKV [D]]"), the main metrics of every
#              kernel side by side -> profile.log, the reports in extras.tar (not part of all)
#   summary    only compare.py's table, from compare.json already in $OUT
# --quick      compare.py --quick (a few shapes per set), head_dim 128 only in flashattn bench, the sanitizers
#              on one small shape per kernel family and head dim only
# Environment: FA_COMPARE_ARGS / FA_BENCH_ARGS replace the arguments of compare.py / flashattn bench.
set -u -o pipefail

cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
EXTRA="$OUT/extra"
JOBS=16
QUICK=0
PARTS=()
while [ $# -gt 0 ]; do
    case "$1" in
    --quick) QUICK=1 ;;
    --jobs) JOBS=$2; shift ;;
    --jobs=*) JOBS=${1#--jobs=} ;;
    build | test | sanitize | bench | cpu | decode | ab | ab-decode | profile | summary) PARTS+=("$1") ;;
    all) PARTS+=(test sanitize bench cpu) ;;
    -h | --help) awk 'NR > 1 && !/^#/ { exit } NR > 1' "$0"; exit 0 ;;
    *) echo "device.sh: unknown argument '$1' (see --help)" >&2; exit 2 ;;
    esac
    shift
done
[ ${#PARTS[@]} -gt 0 ] || PARTS=(test sanitize bench cpu)

FA=build/flashattn
PY=${PYTHON:-python3}
FAILED=()
SECONDS=0

note() { printf '[%4ds] %s\n' "$SECONDS" "$*"; }

machine_header() {
    echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $(hostname)"
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv,noheader 2>/dev/null |
        sed 's/^/# gpu: /'
    echo "# cpu: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) logical cores"
    echo "# nvcc: $(nvcc --version 2>/dev/null | tail -1)"
    echo "# git: $(git rev-parse --short HEAD 2>/dev/null || echo '?') $(git status --porcelain 2>/dev/null | wc -l) changed file(s)"
}

part_build() {
    note "build: make -j$JOBS"
    { machine_header; make -j"$JOBS" all; } > "$OUT/build.log" 2>&1
    local rc=$?
    grep -E '^(flashattn [0-9]|CUDA build|note:)' "$OUT/build.log"
    if [ $rc -ne 0 ]; then
        grep -E 'error|Error' "$OUT/build.log" | head -30
        note "build: FAILED (rc $rc), see build.log"
        FAILED+=(build)
        return 1
    fi
    "$FA" info 2>&1 | head -20
    note "build: ok"
}

part_test() {
    note "test: make test"
    make -j"$JOBS" test > "$OUT/tests.log" 2>&1
    local rc=$?
    grep -E 'passed|FAIL|skipped' "$OUT/tests.log" | grep -v '^PASS' | tail -40
    if [ $rc -ne 0 ]; then note "test: FAILED (rc $rc), see tests.log"; FAILED+=(test); else note "test: ok"; fi
}

# compute-sanitizer over flashattn check (which runs the device-side cu_seqlens check too: exec.check = 1 is
# its default). Zero reports are required. Two lists:
#   - every kernel family at every head dim it has, one small shape each (FA2 forward + backward, the FA3
#     forward, the naive forward + backward), under all four tools: memcheck (out-of-bounds and misaligned
#     accesses, leaks), racecheck (shared-memory hazards), synccheck (barriers), initcheck (reads of device
#     memory nothing wrote);
#   - shapes that once exposed a bug (partial tiles, varlen, GQA, windows, softcap, ALiBi, the FA3 192-row
#     tiles), under racecheck with FA2 and FA3 (without --quick).
# Exit status 3 from the CLI means the shape is unsupported there (FA3 off compute capability 9.0): recorded, not
# a failure. NAME=VALUE words in a shape are the environment of its runs. One summary line per tool.
# About 3-4 minutes on an H200.
part_sanitize() {
    local cs
    cs=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
    if [ -z "$cs" ]; then note "sanitize: compute-sanitizer not found"; FAILED+=(sanitize); return 1; fi
    local small="--dtype bf16 --batch 1 --seqlen-q 100 --seqlen-k 130 --heads 2 --heads-kv 1 --causal"
    local matrix=() d
    for d in 32 64 96 128 192 256; do matrix+=("--backend cuda --kernel fa2 --bwd $small --head-dim $d"); done
    matrix+=("--backend cuda --kernel fa2 --bwd --dtype f16 --batch 3 --seqlen-q 90 --seqlen-k 120 --heads 2 \
--head-dim 128 --varlen --window 32,8 --softcap 30 --alibi")
    for d in 64 128 256; do
        matrix+=("--backend cuda --kernel fa3 --dtype bf16 --batch 2 --seqlen 150 --heads 2 --head-dim $d --causal --varlen")
    done
    # the FA3 backward (head dims 64, 128, 256; dense, and varlen, whose boxes reach into the next sequence), and the
    # decode kernels (paged, append + rotary)
    for d in 64 128 256; do
        matrix+=("--backend cuda --kernel fa3 --bwd $small --head-dim $d --window 40,7")
        matrix+=("--backend cuda --kernel fa3 --bwd --dtype bf16 --batch 3 --seqlen-q 150 --seqlen-k 170 --heads 4 \
--heads-kv 2 --head-dim $d --varlen")
    done
    matrix+=("--backend cuda --kernel fa3 --bwd --deterministic $small --head-dim 128")
    # (6 (kv head, batch) pairs: one chunk of 4 in deterministic mode's launch order, then one of 2)
    matrix+=("--backend cuda --kernel fa3 --bwd --deterministic --dtype bf16 --batch 3 --seqlen 300 --heads 4 \
--heads-kv 2 --head-dim 64 --varlen")
    # the e4m3 forward (V^T written by the producer's warps into a ring of its own; varlen zeroes rows past a sequence)
    matrix+=("--backend cuda --kernel fa3 --dtype e4m3 --batch 2 --seqlen-q 200 --seqlen-k 333 --heads 4 --heads-kv 2 \
--head-dim 128 --causal")
    matrix+=("--backend cuda --kernel fa3 --dtype e4m3 --batch 3 --seqlen 150 --heads 2 --head-dim 256 --varlen --window 40,7")
    # (head dim 64: rows of half a tile row, the rest filled by TMA)
    matrix+=("--backend cuda --kernel fa3 --dtype e4m3 --batch 3 --seqlen-q 150 --seqlen-k 270 --heads 4 --heads-kv 1 \
--head-dim 64 --varlen --causal")
    matrix+=("--decode --backend cuda --dtype bf16 --batch 2 --heads 8 --heads-kv 2 --seqlen-k 300 --head-dim 128 \
--page-size 16 --new 1 --rotary-dim 64")
    matrix+=("--decode --backend cuda --dtype f16 --batch 3 --heads 6 --heads-kv 2 --seqlen-k 300 --head-dim 192 \
--page-size 96 --new 2 --leftpad")
    matrix+=("--decode --backend cuda --dtype bf16 --batch 2 --heads 8 --heads-kv 2 --seqlen-k 333 --head-dim 96 --leftpad")
    # (128 splits, some empty under the leftpad: the combine's column slices, every partial read)
    matrix+=("--decode --backend cuda --dtype bf16 --batch 1 --heads 32 --heads-kv 1 --seqlen-k 16384 --head-dim 128 \
--leftpad")
    matrix+=("--backend naive --bwd $small --head-dim 64")
    local regressions=(
        "--dtype bf16 --batch 2 --seqlen-q 100 --seqlen-k 200 --heads 4 --heads-kv 2 --head-dim 64 --causal"
        "--dtype f16 --batch 1 --seqlen-q 129 --seqlen-k 129 --heads 2 --head-dim 128"
        "--dtype bf16 --batch 3 --seqlen-q 150 --seqlen-k 150 --heads 4 --heads-kv 1 --head-dim 128 --varlen --window 32,8 --softcap 30 --alibi"
        "--dtype bf16 --batch 1 --seqlen-q 96 --seqlen-k 96 --heads 2 --head-dim 256 --causal"
        "--dtype bf16 --batch 2 --seqlen-q 200 --seqlen-k 300 --heads 4 --heads-kv 2 --head-dim 128 --causal --varlen"
        "FLASHATTN_FA3_BLOCK_M=192 --dtype bf16 --batch 3 --seqlen-q 300 --seqlen-k 300 --heads 4 --heads-kv 2 --head-dim 64 --causal --varlen"
        "--dtype f16 --batch 2 --seqlen-q 300 --seqlen-k 300 --heads 4 --head-dim 64 --softcap 20 --window 40,-1"
        "--dtype bf16 --batch 1 --seqlen-q 700 --seqlen-k 700 --heads 2 --head-dim 64 --causal --k-ramp 1000"
        "--dtype bf16 --batch 2 --seqlen-q 448 --seqlen-k 448 --heads 2 --heads-kv 1 --head-dim 64 --causal"
    )
    [ $QUICK -eq 1 ] && regressions=()
    local runs=() tool kernel shape
    for tool in memcheck racecheck synccheck initcheck; do
        for shape in "${matrix[@]}"; do runs+=("$tool|$shape"); done
    done
    for kernel in fa2 fa3; do
        for shape in "${regressions[@]}"; do runs+=("racecheck|--backend cuda --kernel $kernel --bwd $shape"); done
    done
    : > "$OUT/sanitize.log"
    declare -A n_run n_clean n_report n_fail n_unsup n_found
    local run
    for run in "${runs[@]}"; do
        tool=${run%%|*}
        shape=${run#*|}
        local envs=() args=() w
        for w in $shape; do
            if [[ $w =~ ^[A-Z][A-Z0-9_]*= ]]; then envs+=("$w"); else args+=("$w"); fi
        done
        local cmd=(env "${envs[@]}" "$cs" --tool "$tool" --error-exitcode 99)
        [ "$tool" = memcheck ] && cmd+=(--leak-check full)
        local log
        log=$("${cmd[@]}" "$FA" check "${args[@]}" 2>&1)
        local rc=$?
        {
            echo "== $tool: ${envs[*]} $FA check ${args[*]} (rc $rc)"
            echo "$log" | grep -E '^=========|^check:|^flashattn:' | grep -v '^========= *$' | head -40
        } >> "$OUT/sanitize.log"
        # reports: the summary's count (racecheck: hazards; the others: errors)
        local found
        found=$(echo "$log" | sed -nE 's/.*(ERROR SUMMARY: ([0-9]+) error|RACECHECK SUMMARY: ([0-9]+) hazard).*/\2\3/p' |
            tail -1)
        found=${found:-0}
        n_run[$tool]=$((${n_run[$tool]:-0} + 1))
        n_found[$tool]=$((${n_found[$tool]:-0} + found))
        if [ $rc -eq 3 ]; then
            n_unsup[$tool]=$((${n_unsup[$tool]:-0} + 1))
        elif [ $rc -eq 99 ] || [ "$found" -gt 0 ]; then
            n_report[$tool]=$((${n_report[$tool]:-0} + 1))
            echo "REPORT: $tool: $FA check ${args[*]}" | tee -a "$OUT/sanitize.log"
        elif [ $rc -ne 0 ]; then
            n_fail[$tool]=$((${n_fail[$tool]:-0} + 1))
            echo "FAIL rc=$rc: $tool: $FA check ${args[*]}" | tee -a "$OUT/sanitize.log"
        else
            n_clean[$tool]=$((${n_clean[$tool]:-0} + 1))
        fi
    done
    local bad=0
    for tool in memcheck racecheck synccheck initcheck; do
        printf 'sanitize %-9s %3d runs: %3d clean, %d with reports (%d found), %d failed, %d unsupported\n' "$tool" \
            "${n_run[$tool]:-0}" "${n_clean[$tool]:-0}" "${n_report[$tool]:-0}" "${n_found[$tool]:-0}" \
            "${n_fail[$tool]:-0}" "${n_unsup[$tool]:-0}" | tee -a "$OUT/sanitize.log"
        bad=$((bad + ${n_report[$tool]:-0} + ${n_fail[$tool]:-0}))
    done
    if [ $bad -ne 0 ]; then FAILED+=(sanitize); fi
    note "sanitize: done"
}

# compare.py times ours and the peers with one timer, interleaved in one process: every ratio against a peer
# comes from it. flashattn bench then times our kernels alone (and the naive baseline) for their own table.
part_bench() {
    local cmp_args ours_args
    if [ $QUICK -eq 1 ]; then
        cmp_args="--quick"
        ours_args="--head-dim 128"
    else
        cmp_args=""
        ours_args=""
    fi
    cmp_args=${FA_COMPARE_ARGS:-$cmp_args}
    ours_args=${FA_BENCH_ARGS:-$ours_args}
    mkdir -p "$EXTRA/plots"
    note "bench: $PY bench/compare.py --json $OUT/compare.json --csv $OUT/compare.csv $cmp_args"
    # shellcheck disable=SC2086
    "$PY" bench/compare.py --json "$OUT/compare.json" --csv "$OUT/compare.csv" $cmp_args > "$OUT/bench.log" 2>&1 ||
        { tail -5 "$OUT/bench.log"; note "bench: compare.py FAILED"; FAILED+=(compare); }
    grep -E '^(# |\[ *[0-9]+s\] done)' "$OUT/bench.log"
    note "bench: ours alone ($FA bench --sweep paper --backend cuda,naive $ours_args)"
    # shellcheck disable=SC2086
    "$FA" bench --sweep paper --backend cuda,naive --csv "$EXTRA/ours-bench.csv" --plot "$EXTRA/plots/paper.svg" \
        $ours_args > "$EXTRA/ours-bench.log" 2>&1 || { tail -5 "$EXTRA/ours-bench.log"; note "bench: ours FAILED"; FAILED+=(bench); }
    note "bench: done"
}

part_cpu() {
    mkdir -p "$EXTRA"
    : > "$OUT/cpu.log"
    local runs=() dt t
    for t in 1 16; do
        for dt in bf16 fp16 fp32; do
            note "cpu: compare.py --device cpu --dtype $dt --threads $t"
            if OMP_PROC_BIND=close "$PY" bench/compare.py --device cpu --threads "$t" --dtype "$dt" --sets paper \
                --head-dims 128 --seqlens 2048 --paper-tokens 2048 --paper-hidden 1024 --impls ours,flash \
                --passes fwd,bwd,fwdbwd --rounds 3 --json "$EXTRA/cpu-$dt-t$t.json" >> "$OUT/cpu.log" 2>&1; then
                runs+=("$EXTRA/cpu-$dt-t$t.json")
            else
                note "cpu: $dt threads $t FAILED"; FAILED+=("cpu $dt t=$t")
            fi
        done
    done
    { grep -m1 'model name' /proc/cpuinfo | sed 's/^model name\s*: /# cpu: /'; "$FA" info | grep 'cpu simd'; } |
        tee -a "$OUT/cpu.log"
    [ ${#runs[@]} -gt 0 ] && "$PY" bench/cpu_report.py "${runs[@]}" | tee -a "$OUT/cpu.log"
}

# At most 8 files under $OUT: the extras (plots included) go into extras.tar.
# Every decode figure docs/results.md quotes, from one call: compare.py runs of the decode set (3 rounds each),
# then one table of them (bench/decode_report.py).
part_decode() {
    mkdir -p "$EXTRA"
    : > "$OUT/decode.log"
    local runs=() name args
    local variants=(
        "base|--impls ours,cudnn,ours-paged,ours-append --page-size 16"
        "paged64|--impls ours-paged --page-size 64"
        "paged256|--impls ours-paged --page-size 256"
        "mqa|--impls ours,cudnn --decode-heads 32/1"
        "d64|--impls ours,cudnn --decode-head-dim 64"
        "d256|--impls ours,cudnn --decode-head-dim 256"
        "q4|--impls ours --decode-q 4")
    for v in "${variants[@]}"; do
        name=${v%%|*}
        args=${v#*|}
        note "decode: $name ($args)"
        # shellcheck disable=SC2086
        if "$PY" bench/compare.py --sets decode --rounds 3 $args --json "$EXTRA/decode-$name.json" \
            >> "$OUT/decode.log" 2>&1; then
            runs+=("$name=$EXTRA/decode-$name.json")
        else
            note "decode: $name FAILED"; FAILED+=("decode $name")
        fi
    done
    if [ ${#runs[@]} -gt 0 ] && [ "${runs[0]%%=*}" = base ]; then
        "$PY" bench/decode_report.py "${runs[@]}" | tee -a "$OUT/decode.log"
    fi
}

pack_outputs() {
    if [ -d "$EXTRA" ]; then tar -C "$OUT" -cf "$OUT/extras.tar" extra && rm -rf "$EXTRA"; fi
}

# Builds the library of the tree FA_AB_BASE names (part ab, ab-decode).
build_ab_base() {
    local base=${FA_AB_BASE:-}
    if [ -z "$base" ] || [ ! -f "$base/Makefile" ]; then
        note "$1: FA_AB_BASE must name the base build's source tree (FA_AB_BASE='$base')"; FAILED+=("$1"); return 1
    fi
    note "$1: building the base library in $base"
    (cd "$base" && make -j"$JOBS" build/libflashattn.so) > "$OUT/ab-build.log" 2>&1 ||
        { tail -20 "$OUT/ab-build.log"; note "$1: base build FAILED"; FAILED+=("$1"); return 1; }
}
part_ab() {
    build_ab_base ab || return 1
    local base=$FA_AB_BASE
    local cmp_args=${FA_COMPARE_ARGS:---sets paper,llama --passes bwd}
    note "ab: $PY bench/compare.py --impls ours-direct,base-direct $cmp_args"
    # shellcheck disable=SC2086
    "$PY" bench/compare.py --impls ours-direct,base-direct --base-library "$(cd "$base" && pwd)/build/libflashattn.so" \
        --json "$OUT/ab.json" $cmp_args > "$OUT/ab.log" 2>&1 || { tail -5 "$OUT/ab.log"; FAILED+=(ab); return 1; }
    grep -E '^(==|shape|geomean)|ours-direct/base' "$OUT/ab.log" | tail -60
    note "ab: done"
}
part_ab_decode() {
    build_ab_base ab-decode || return 1
    local base lib runs=() r v
    base=$(cd "$FA_AB_BASE" && pwd)
    local cmp_args=${FA_COMPARE_ARGS:---sets decode --impls ours,cudnn}
    mkdir -p "$EXTRA"
    : > "$OUT/ab.log"
    for r in 1 2; do
        for v in this base; do
            lib=$PWD/build/libflashattn.so
            [ "$v" = base ] && lib=$base/build/libflashattn.so
            note "ab-decode: $v, pass $r: compare.py $cmp_args"
            # shellcheck disable=SC2086
            if FLASHATTN_LIBRARY=$lib "$PY" bench/compare.py --rounds 3 $cmp_args --json "$EXTRA/ab-$v-$r.json" \
                >> "$OUT/ab.log" 2>&1; then
                runs+=("$v-$r=$EXTRA/ab-$v-$r.json")
            else
                note "ab-decode: $v pass $r FAILED"; FAILED+=(ab-decode)
            fi
        done
    done
    [ ${#runs[@]} -gt 0 ] && "$PY" bench/ab_report.py "${runs[@]}" | tee -a "$OUT/ab.log"
    note "ab-decode: done"
}
part_profile() {
    local ncu shape impl
    ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
    [ -x "$ncu" ] || { note "profile: ncu not found"; FAILED+=(profile); return 1; }
    read -r -a shape <<< "${FA_PROFILE:-bwd 128 16384}"
    mkdir -p "$EXTRA"
    : > "$OUT/profile.log"
    for impl in ours cudnn; do
        note "profile: $impl ${shape[*]}"
        if ! "$ncu" --profile-from-start off --set full -f -o "$EXTRA/$impl" "$PY" bench/ncu_one.py "$impl" "${shape[@]}" \
            > "$EXTRA/ncu-$impl.log" 2>&1; then
            tail -5 "$EXTRA/ncu-$impl.log"; FAILED+=(profile); continue
        fi
        "$ncu" -i "$EXTRA/$impl.ncu-rep" --page details --csv > "$EXTRA/$impl-details.csv" 2> /dev/null
        $PY - "$impl" "$EXTRA/$impl-details.csv" >> "$OUT/profile.log" << 'PY'
import csv, sys
want = ("Duration", "SM Frequency", "Compute (SM) Throughput", "Issue Slots Busy", "Executed Ipc Active",
        "L2 Cache Throughput", "DRAM Throughput", "L1/TEX Hit Rate", "Registers Per Thread", "Grid Size",
        "Dynamic Shared Memory Per Block", "Warp Cycles Per Issued Instruction", "No Eligible")
kernels = {}
for r in csv.DictReader(open(sys.argv[2])):
    if r["Metric Name"] in want:
        kernels.setdefault((r["ID"], r["Kernel Name"][:70]), {})[r["Metric Name"]] = r["Metric Value"] + r["Metric Unit"]
print("== %s" % sys.argv[1])
for (i, name), m in kernels.items():
    print("%s %s\n    %s" % (i, name, "; ".join("%s %s" % (k, m[k]) for k in want if k in m)))
PY
    done
    cat "$OUT/profile.log"
}

if [ "${PARTS[*]}" != summary ]; then
    part_build || { pack_outputs; exit 1; }
fi
for p in "${PARTS[@]}"; do
    case "$p" in
    build) ;;
    test) part_test ;;
    sanitize) part_sanitize ;;
    bench) part_bench ;;
    cpu) part_cpu ;;
    decode) part_decode ;;
    ab) part_ab ;;
    ab-decode) part_ab_decode ;;
    profile) part_profile ;;
    summary) ;;
    esac
done
pack_outputs
rc=0
if [ ${#FAILED[@]} -gt 0 ]; then
    note "device.sh: FAILED: ${FAILED[*]}"
    rc=1
else
    note "device.sh: all parts passed (${PARTS[*]})"
fi
# compare.py's summary table, last (bench.log ends with it too).
if [ -s "$OUT/compare.json" ]; then
    echo
    "$PY" bench/compare.py --summary "$OUT/compare.json" || { note "device.sh: summary FAILED"; rc=1; }
fi
exit $rc
