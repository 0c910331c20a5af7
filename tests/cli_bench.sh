#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# cli_bench.sh - tests of the flashattn command line beyond what the C tests reach: --version; bench's CSV and JSON
# written row by row and valid after an interrupt; the sweep's time estimate and its warning before a long
# run; --plot with --fwd-only; GFLOP/s on the CPU; the device line of check. Needs a POSIX shell; uses python3
# to parse JSON when it is there.
#   usage: tests/cli_bench.sh build/flashattn
# Ends with "N passed, N failed" and "cli-tests: ..."; exits non-zero on a failure.
set -u
FA=$(cd "$(dirname "$1")" && pwd)/$(basename "$1")
HEADER=$(cd "$(dirname "$0")/.." && pwd)/include/flashattn.h
T=$(mktemp -d "${TMPDIR:-/tmp}/flashattn-cli.XXXXXX")
trap 'rm -rf "$T"' EXIT
cd "$T" || exit 1
pass=0
fail=0
ok() { pass=$((pass + 1)); echo "ok: $1"; }
bad() { fail=$((fail + 1)); echo "FAILED: $1"; }
check() { desc=$1; shift; if "$@"; then ok "$desc"; else bad "$desc"; fi; }
has() { grep -q -- "$2" "$1"; }
lacks() { ! grep -q -- "$2" "$1"; }
lines() { wc -l < "$1" | tr -d ' '; }
# Prints the number of records of a JSON list file, or "invalid".
json_count() {
    if command -v python3 > /dev/null; then
        python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); assert isinstance(d, list); print(len(d))' \
            "$1" 2> /dev/null || echo invalid
    else # without python: the shape this program writes, a list of one object per line
        if [ "$(head -c 1 "$1")" = "[" ] && [ "$(tail -n 1 "$1")" = "]" ]; then grep -c '^  {' "$1"; else echo invalid; fi
    fi
}
# Waits (at most $3 seconds) until file $1 matches $2, or process $4 has ended.
wait_for() {
    i=0
    while [ $i -lt $(($3 * 10)) ] && kill -0 "$4" 2> /dev/null; do
        if [ -f "$1" ] && grep -q -- "$2" "$1"; then return 0; fi
        sleep 0.1
        i=$((i + 1))
    done
    [ -f "$1" ] && grep -q -- "$2" "$1"
}

# --version: the header's version
want=$(sed -n 's/^#define FA_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' "$HEADER" | paste -sd. -)
check "--version prints flashattn $want" [ "$("$FA" --version)" = "flashattn $want" ]

# A narrowed CPU sweep, forward only, with every output
"$FA" bench --sweep cpu --backend cpu --fwd-only --head-dim 64 --no-causal --repeats 1 --warmup 0 \
    --csv s.csv --json s.json --plot s.svg > s.out 2> s.err
rc=$?
check "bench --sweep cpu --fwd-only exits 0 (got $rc)" [ $rc -eq 0 ]
check "the sweep's table is in GFLOP/s on the CPU" sh -c "grep -q GFLOP/s s.out && ! grep -q TFLOP/s s.out"
check "the sweep's table has no backward column with --fwd-only" lacks s.out cpu_bwd
check "CSV: a header and 4 rows" [ "$(lines s.csv)" -eq 5 ]
check "JSON: 4 records" [ "$(json_count s.json)" = 4 ]
check "the sweep prints the time left" has s.err "left\]"
check "--plot --fwd-only writes the forward panel" [ -f s-fwd-d64.svg ]
check "--plot --fwd-only writes no backward panels" sh -c "! ls s-bwd-* s-fwdbwd-* > /dev/null 2>&1"
check "the --plot file is the forward panel" has s.svg "Attention forward speed"
check "the plot has an x-axis label" has s.svg ">sequence length</text>"
check "the plot's y axis is in GFLOP/s" has s.svg ">GFLOP/s"

# bench of one problem with --json, forward and backward
"$FA" bench --backend cpu --seqlen 128 --heads 2 --head-dim 64 --bwd --repeats 1 --warmup 0 --json one.json \
    > one.out 2>&1
check "bench --json: 2 records (fwd, bwd)" [ "$(json_count one.json)" = 2 ]
check "bench's table is in GFLOP/s on the CPU" has one.out GFLOP/s
check "run takes no --json (exit 2)" sh -c "'$FA' run --json x.json > /dev/null 2>&1; [ \$? -eq 2 ]"

# The interrupts below are SIGTERM: a shell script's background jobs ignore SIGINT (POSIX), and both signals
# end the program the same way (neither is caught), which is what Ctrl-C does.

# The paper's sweep on the CPU: a warning with an estimate before it starts; files valid from the start.
# One thread and f32 keep the estimate above the 15 min that warns (30 min on one Zen 5 core; in bf16, which
# runs on the bf16 dot product there, 21 min, and two threads would not warn).
"$FA" bench --sweep paper --backend cpu --threads 1 --dtype f32 --csv w.csv --json w.json > w.out 2> w.err &
pid=$!
wait_for w.err "warning:" 120 $pid
kill -TERM $pid 2> /dev/null
{ wait $pid; } 2> /dev/null # (no "Terminated" line from the shell)
check "a CPU paper sweep warns before it starts" has w.err "warning: this sweep will take about"
check "the warning names --sweep cpu" has w.err "sweep cpu"
check "CSV before the first row: the header" [ "$(lines w.csv)" -eq 1 ]
check "JSON before the first row: an empty list" [ "$(json_count w.json)" = 0 ]

# Interrupted after some rows: what was measured is on disk, in both files
"$FA" bench --sweep paper --backend cpu --fwd-only --repeats 1 --warmup 0 --csv i.csv --json i.json \
    > i.out 2> i.err &
pid=$!
wait_for i.csv "^cpu.*,1024,1024," 300 $pid
kill -TERM $pid 2> /dev/null
{ wait $pid; } 2> /dev/null # (no "Terminated" line from the shell)
rows=$(($(lines i.csv) - 1))
check "interrupted sweep: it did not finish" lacks i.err "sweep done"
check "interrupted sweep: CSV kept $rows rows (>= 2)" [ $rows -ge 2 ]
check "interrupted sweep: JSON valid with the CSV's rows" [ "$(json_count i.json)" = $rows ]

# check names the GPU, or says there is none; never "CPU threads" for a GPU backend
"$FA" check --backend cuda > c.out 2>&1
check "check --backend cuda does not claim CPU threads" sh -c "head -1 c.out | grep -vq 'CPU thread'"
if "$FA" info | grep -q "^devices:  none"; then
    check "check --backend cuda without a GPU says so" sh -c "head -1 c.out | grep -Eq 'no CUDA device|not built'"
fi
"$FA" run --backend cpu --seqlen 128 --heads 2 --head-dim 64 > r.out 2>&1
check "run on the CPU reports GFLOP/s" sh -c "grep -q GFLOP/s r.out && ! grep -q TFLOP/s r.out"

echo "$pass passed, $fail failed"
echo "cli-tests: $pass passed, $fail failed"
[ $fail -eq 0 ]
