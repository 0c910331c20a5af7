#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# tests/cli_exit_codes.sh FLASHATTN - the CLI's exit codes and option parsing (0 ok, 1 numerical failure, 2 bad usage or
# invalid shape, 3 unsupported, 4 runtime or I/O error). One PASS/FAIL line per case, then "N passed, M failed".
fa=${1:?usage: tests/cli_exit_codes.sh path/to/flashattn}
tmp=$(mktemp -d) || exit 1
trap 'rm -rf "$tmp"' EXIT
pass=0 fail=0

# expect CODE NAME [PATTERN] -- ARGS...: the exit code, and PATTERN (grep -E) in the output when given
expect() {
    want=$1 name=$2 pattern=$3
    shift 4
    "$fa" "$@" > "$tmp/out" 2>&1
    got=$?
    if [ "$got" -eq "$want" ] && { [ -z "$pattern" ] || grep -Eq -- "$pattern" "$tmp/out"; }; then
        echo "PASS  $name: exit $got"
        pass=$((pass + 1))
    else
        echo "FAIL  $name: exit $got (want $want${pattern:+, output matching '$pattern'}): $(tail -n 2 "$tmp/out")"
        fail=$((fail + 1))
    fi
}

# the CPU backend on every machine: head_dim 16 has no CUDA kernel, and the cases are about the CLI
small="--backend cpu --batch 1 --heads 2 --seqlen-q 40 --head-dim 16"
expect 0 "check of a small problem" "check: PASS" -- check $small --bwd
expect 0 "check --dtype e4m3 (descales per 8 rows) reports what the quantization costs" "RMSE of O: .* bf16 inputs" -- \
    check $small --dtype e4m3 --descale-block 8
expect 3 "check --dtype e4m3 --bwd: FP8 is forward only" "forward only" -- check $small --dtype e4m3 --bwd
expect 2 "--dtype e5m2 is not a dtype" "e4m3" -- check $small --dtype e5m2
expect 3 "head_dim INT32_MAX is unsupported, not a runtime error" "head_dim" -- check --head-dim 2147483647
expect 2 "head_dim 0 is invalid" "" -- check --head-dim 0
expect 0 "a long left window bound is read whole (leading zeros)" "window 1,0" -- \
    check $small --window 00000000000000000000000000000000000000000000000001,0
expect 2 "a long left window bound out of range is refused" "expected an integer" -- \
    check $small --window 10000000000000000000000000000000000000000000000000,0
expect 4 "--peers on a missing file is an I/O failure" "cannot open" -- \
    bench --sweep paper --backend cpu --plot "$tmp/p.svg" --peers "$tmp/missing.json"
echo '{"not": "a list"}' > "$tmp/bad.json"
expect 2 "--peers on a malformed file is bad usage" "not a JSON list" -- \
    bench --sweep paper --backend cpu --plot "$tmp/p.svg" --peers "$tmp/bad.json"
expect 2 "an unknown option" "" -- check --no-such-option
expect 0 "check --no-device-check (the host backends ignore fa_exec.check)" "check: PASS" -- \
    check $small --varlen --no-device-check
decode="--decode --backend cpu --batch 3 --heads 4 --heads-kv 2 --head-dim 32 --seqlen-k 100"
expect 0 "check --decode, paged, appending with rotary, causal" "check: PASS" -- \
    check $decode --page-size 16 --new 3 --seqlen-q 3 --causal --rotary-dim 32 --leftpad
expect 0 "check --decode on the reference, contiguous, halves rotary, f16" "check: PASS" -- \
    check $decode --backend reference --dtype f16 --rotary-dim 16 --rotary-halves
expect 2 "check --decode refuses a rotary_dim that is not a multiple of 16" "rotary_dim \(8\).*--rotary-dim" -- \
    check $decode --rotary-dim 8
expect 2 "check --decode refuses more new tokens than the cache holds" "capacity" -- check $decode --new 101
expect 0 "bench --decode, paged, next to a copy timed in the same run" "bench --decode: .* of the copy bandwidth" -- \
    bench $decode --page-size 16 --repeats 2 --warmup 0
expect 2 "bench --decode takes one backend" "one backend" -- bench $decode --backend cpu,reference

# info --plan: the CUDA family and choices for a problem, on a Hopper device or, without a usable GPU, on the
# description of one (the figures below are for 132 SMs, compute capability 9.0)
if "$fa" info | grep -q "cuda=yes" && { ! "$fa" info | grep -q "^device 0:" || "$fa" info | grep -q "capability 9.0, 132 SMs"; }; then
    plan="info --plan --batch 16 --heads 32 --seqlen 1024 --head-dim 64 --causal"
    expect 0 "info --plan: head dim 64, causal 1k: 192-row FA3 tiles, first tiles last" \
        "fwd: +fa3 forward: 192 x 128 tiles, 3 consumer warpgroups.*every head's first tile claimed last; 132 CTAs over 3072 tiles" -- $plan
    expect 0 "info --plan: head dim 64, causal 1k: the FA3 backward" "bwd: +fa3 backward: a CTA per 128-key block \(8 x 32 x 16" -- $plan
    expect 0 "info --plan: head dim 64, causal 200: 128-row tiles" "fwd: +fa3 forward: 128 x 128 tiles, 2 consumer warpgroups" -- \
        info --plan --head-dim 64 --seqlen 200 --causal
    expect 0 "info --plan: head dim 256: the FA3 backward's 64-key blocks" "bwd: +fa3 backward: a CTA per 64-key block \(256 x 8 x 1" -- \
        info --plan --head-dim 256 --seqlen 16384 --batch 1 --heads 8 --no-causal
    expect 0 "info --plan: head dim 256 with softcap: the FA3 backward" "bwd: +fa3 backward: a CTA per 64-key block" -- \
        info --plan --head-dim 256 --softcap 30
    expect 0 "info --plan: ALiBi: the FA3 backward" "bwd: +fa3 backward: a CTA per 128-key block" -- \
        info --plan --head-dim 128 --alibi
    expect 0 "info --plan: softcap with ALiBi: the FA2 backward" "bwd: +fa2 backward: [0-9]+-key blocks" -- \
        info --plan --head-dim 128 --alibi --softcap 30
    expect 0 "info --plan: head dim 256 forward tiles" "fwd: +fa3 forward: 128 x 80 tiles.*tiles head-major" -- \
        info --plan --head-dim 256 --seqlen 16384 --batch 1 --heads 8 --no-causal
    expect 0 "info --plan --kernel fa2" "fwd: +fa2 forward: 128 x [0-9]+ tiles" -- info --plan --kernel fa2
    expect 0 "info --plan --deterministic: the FA3 backward's dQ in a fixed order" \
        "bwd: +fa3 backward.*fixed order \(deterministic\)" -- info --plan --deterministic
    expect 0 "info --plan --deterministic, head dim 256: the FA3 backward's fixed order" \
        "bwd: +fa3 backward.*fixed order \(deterministic\)" -- info --plan --deterministic --head-dim 256
    expect 0 "info --plan --deterministic with softcap and ALiBi: the FA2 backward's slices" \
        "bwd: +fa2 backward.*deterministic" -- info --plan --deterministic --alibi --softcap 30
    expect 2 "info --plan refuses f32" "f16 or bf16" -- info --plan --dtype f32
    expect 0 "info --plan --decode: one sequence of 32k splits the keys, a block per SM" \
        "decode: append, then 16 splits of the cache's 32768 rows.*128 attention CTAs.*1 per SM" -- \
        info --plan --decode --batch 1 --seqlen-k 32768
    expect 0 "info --plan --decode: one paged sequence of 32k keeps two blocks per SM" \
        "decode: append, then 32 splits of the cache's 32768 rows.*256 attention CTAs.*2 per SM" -- \
        info --plan --decode --batch 1 --seqlen-k 32768 --page-size 16
    expect 0 "info --plan --decode: 32 sequences fill the SMs unsplit, no new token, paged" \
        "decode: 1 split of the cache's 4096 rows.*256 attention CTAs.*2 per SM" -- \
        info --plan --decode --batch 32 --seqlen-k 4096 --new 0 --page-size 16
else
    echo "SKIP  info --plan: no CUDA backend, or a GPU other than a 132-SM Hopper (the expected figures are for one)"
fi

echo "$pass passed, $fail failed"
[ "$fail" -eq 0 ]
