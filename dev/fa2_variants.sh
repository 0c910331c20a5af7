#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# fa2_variants.sh - one GPU-machine session for tuning the FA2 kernels: build (sm_90a only), the GPU suite for
# both kernel families, the paper sweep of the FA2 kernels (forward and backward), the same sweep for each
# compile-time variant, and PyTorch's SDPA flash backend in the same call. Logs go to $OUT; a table of every
# variant's TFLOP/s over the main build's is printed last.
#
#   dev/fa2_variants.sh [build] [test] [main] [variants] [peers] [ncu] [ncusrc]   (default: all but ncu*)
#
# ncu: our FA2 kernel next to PyTorch's at d = 64 and 128 (NCU_DIMS), seqlen NCU_SEQLEN (4096), pass NCU_PASS = bwd | fwd,
# causal with NCU_CAUSAL=1:
# throughput, shared memory, L2, and the stall reasons, as a table.
#
# VARIANTS: one per line, "name|files|head dims|sweep args|header text": the listed src/cuda/<file>.cu are
# recompiled with the header text pre-included (a -D value with commas would be split by nvcc's option parser),
# the library relinked, and the sweep run for the listed head dims with the extra arguments (e.g. --fwd-only).
# The header text may use \n.
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
PARTS=("$@")
[ ${#PARTS[@]} -gt 0 ] || PARTS=(build test main variants peers)
has() { local p; for p in "${PARTS[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }
SECONDS=0
note() { printf '[%4ds] %s\n' "$SECONDS" "$*"; }
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CC=${CC:-$(command -v cc || command -v gcc)}
NVCC_FLAGS="-O3 -std=c++17 -Xcompiler -fPIC,-fvisibility=hidden -Iinclude -Isrc -lineinfo -Xptxas --warn-on-spills -DFA_WITH_CUDA"
# Example: VARIANTS='fwd128_s2|fa2_fwd_hdim128|128|--fwd-only|#define FA2_FWD_TILE_128 128, 64, 64, 4, 2, 0, 0, 0'
VARIANTS=${VARIANTS:-}
VDIR=/tmp/fa2var

build_variants() {
    rm -rf "$VDIR"
    mkdir -p "$VDIR"
    while IFS= read -r line; do
        [ -n "$line" ] || continue
        IFS='|' read -r name files dims args header <<<"$line"
        (
            d=$VDIR/$name
            mkdir -p "$d"
            printf '%b\n' "$header" >"$d/variant.h"
            objs="|-none-"
            for f in $files; do
                $NVCC $NVCC_FLAGS -gencode=arch=compute_90a,code=sm_90a -include "$d/variant.h" -Xptxas -v \
                    -c src/cuda/$f.cu -o "$d/$f.o" >>"$d/nvcc.log" 2>&1 || { echo "variant $name: $f failed"; tail -5 "$d/nvcc.log"; exit 1; }
                objs="$objs|$f.o"
            done
            keep=$(ls build/src/*.o build/src/*/*.o | grep -vE "/(${objs#|})\$")
            ar rcs "$d/lib.a" $keep $(ls "$d"/*.o 2>/dev/null) &&
                $CC -o "$d/flashattn" build/cli/*.o "$d/lib.a" -lm -fopenmp -L/usr/local/cuda/lib64 \
                    -Wl,-rpath,/usr/local/cuda/lib64 -lcudart -lcublas -lstdc++ >>"$d/nvcc.log" 2>&1 ||
                { echo "variant $name failed to link"; tail -5 "$d/nvcc.log"; }
        ) &
    done <<<"$VARIANTS"
}

if has build; then
    note "build (sm_90a)"
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/build.log"
    make -j16 FA_CUDA_ARCHS=90a build/flashattn build/tests/test_backends >>"$OUT/build.log" 2>&1 ||
        { tail -30 "$OUT/build.log"; exit 1; }
    grep -E "spill|error" "$OUT/build.log" | sort | uniq | head -20
fi
has variants && build_variants # on the CPU while the tests run

if has test; then
    for k in ${TEST_KERNELS:-default fa2}; do
        note "test_backends -b cuda (kernel $k)"
        if [ $k = default ]; then run=(env -u FLASHATTN_KERNEL); else run=(env FLASHATTN_KERNEL=$k); fi
        "${run[@]}" timeout 300 build/tests/test_backends -b cuda >"$OUT/tests-$k.log" 2>&1
        echo "rc=$?"
        grep -E "^(FAIL|ERROR)|summary" "$OUT/tests-$k.log" | head -20
    done
    if [ "${TEST_QUICK:-0}" != 1 ]; then # TEST_QUICK=1: the suites above only
        note "test_backends -b cuda (kernel fa2, A100 tiles: FLASHATTN_SMEM_LIMIT=163000)"
        FLASHATTN_SMEM_LIMIT=163000 FLASHATTN_KERNEL=fa2 timeout 300 build/tests/test_backends -b cuda >"$OUT/tests-a100.log" 2>&1
        echo "rc=$?"
        grep -E "^(FAIL|ERROR)|summary" "$OUT/tests-a100.log" | head -20
        note "compute-sanitizer (FA2 backward)"
        for tool in memcheck racecheck; do
            for shape in "--batch 2 --heads 4 --heads-kv 2 --seqlen-q 200 --seqlen-k 300 --head-dim 128 --causal --varlen" \
                "--batch 2 --heads 2 --seqlen 260 --head-dim 64 --deterministic" "--batch 1 --heads 2 --seqlen 130 --head-dim 192"; do
                # shellcheck disable=SC2086
                timeout 120 compute-sanitizer --tool $tool --error-exitcode 99 build/flashattn check --backend cuda --kernel fa2 --bwd $shape >"$OUT/san.tmp" 2>&1
                echo "$tool rc=$? $(grep -E 'SUMMARY' "$OUT/san.tmp" | head -1) $(tail -1 "$OUT/san.tmp" | cut -c1-60) [$shape]"
            done
        done | tee "$OUT/sanitize.log"
        {
            build/flashattn check --backend cuda --kernel fa2 --bwd --batch 2 --heads 4 --seqlen 1024 --head-dim 128 --causal | tail -1
            build/flashattn check --backend cuda --kernel fa2 --bwd --batch 2 --heads 4 --seqlen 777 --head-dim 64 | tail -1
            build/flashattn check --backend cuda --kernel fa2 --bwd --batch 1 --heads 8 --heads-kv 2 --seqlen-q 300 --seqlen-k 1000 --head-dim 256 --causal --varlen | tail -1
            build/flashattn check --backend cuda --kernel fa2 --bwd --deterministic --batch 2 --heads 4 --seqlen 1024 --head-dim 128 | tail -1
        } 2>&1 | tee "$OUT/checks.log"
    fi
fi

# sweep BINARY CSV [NAME=VALUE ...] [ARGS ...]: the paper sweep on the GPU; leading NAME=VALUE words go to the
# environment (e.g. FLASHATTN_SMEM_LIMIT=163000), the rest to flashattn bench (default kernel: fa2).
sweep() {
    local bin=$1 csv=$2 envs=()
    shift 2
    while [ $# -gt 0 ] && [[ $1 == *=* ]]; do envs+=("$1"); shift; done
    timeout 300 env "${envs[@]}" "$bin" bench --sweep paper --backend cuda --kernel fa2 --csv "$csv" "$@" 2>/dev/null
}

if has main; then
    note "sweep: FA2 kernels (main build)"
    # shellcheck disable=SC2086
    sweep build/flashattn "$OUT/main.csv" ${MAIN_ARGS:-} > "$OUT/main.log"
    tail -n +2 "$OUT/main.log" | head -40
fi

if has variants; then
    note "variants: waiting for the builds"
    wait
    while IFS= read -r line; do
        [ -n "$line" ] || continue
        IFS='|' read -r name files dims args header <<<"$line"
        [ -x "$VDIR/$name/flashattn" ] || continue
        grep -E "registers|spill" "$VDIR/$name/nvcc.log" | grep -B1 -E "[1-9][0-9]* bytes spill" | head -4
        for d in $dims; do
            note "sweep: $name d=$d"
            # shellcheck disable=SC2086
            sweep "$VDIR/$name/flashattn" "$OUT/v-$name-$d.csv" $args --head-dim "$d" > "$OUT/v-$name-$d.log"
        done
    done <<<"$VARIANTS"
fi

if has peers; then
    note "peers: PyTorch SDPA flash"
    PYTHONUNBUFFERED=1 timeout 300 python3 bench/peer_bench.py --impls ${PEER_IMPLS:-flash} --seqlens ${PEER_SEQLENS:-2048,4096,8192,16384} ${PEER_ARGS:-} --json "$OUT/peers.json" > "$OUT/peers.log" 2>&1 ||
        tail -5 "$OUT/peers.log"
fi

# PyTorch's FA2 kernels under ncu: /tmp/torch_flash.py D fwd|bwd runs SDPA flash twice (bf16, seqlen 4096).
if has ncu || has ncusrc; then
    NCU_CAUSAL_FLAG=--no-causal
    [ "${NCU_CAUSAL:-0}" = 1 ] && NCU_CAUSAL_FLAG=--causal
    cat >/tmp/torch_flash.py <<'PY'
import sys, torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
d = int(sys.argv[1]); s = int(sys.argv[3]) if len(sys.argv) > 3 else 4096; h = 2048 // d; b = 16384 // s
causal = len(sys.argv) > 4 and sys.argv[4] == "1"
q, k, v = [torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    for _ in range(2):
        o = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        if sys.argv[2] == "bwd":
            o.backward(torch.randn_like(o))
torch.cuda.synchronize()
PY
fi

if has ncu; then
    NCU_PASS=${NCU_PASS:-bwd} # fwd | bwd
    if [ "$NCU_PASS" = fwd ]; then ours_k=fa2_fwd_kernel peer_k=flash_fwd_kernel bwd_flag=""; else
        ours_k=fa2_bwd_main peer_k=flash_bwd_dq_dk_dv bwd_flag=--bwd; fi
    note "ncu: FA2 $NCU_PASS, ours vs PyTorch flash (bf16, seqlen ${NCU_SEQLEN:-4096}, not causal)"
    M=gpu__time_duration.sum,sm__cycles_elapsed.avg,smsp__inst_executed.sum,smsp__issue_active.avg.pct_of_peak_sustained_active
    M=$M,sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active
    M=$M,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_st.sum
    M=$M,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum
    M=$M,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,lts__t_sectors_op_red.sum,lts__t_sectors_op_atom.sum
    M=$M,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_sector_hit_rate.pct,dram__bytes_read.sum
    M=$M,launch__registers_per_thread,launch__shared_mem_per_block_dynamic,launch__block_size,launch__grid_size
    M=$M,sm__cycles_active.avg.pct_of_peak_sustained_elapsed,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem
    for st in barrier long_scoreboard short_scoreboard mio_throttle math_pipe_throttle wait not_selected selected dispatch_stall lg_throttle no_instruction membar branch_resolving; do
        M=$M,smsp__average_warps_issue_stalled_${st}_per_issue_active.ratio
    done
    {
        for d in ${NCU_DIMS:-64 128}; do
            echo "== ours d=$d"
            timeout 120 ncu --clock-control none -k regex:$ours_k --launch-skip 1 --launch-count 1 --metrics $M \
                build/flashattn bench --backend cuda --kernel fa2 $bwd_flag --batch $((16384 / ${NCU_SEQLEN:-4096})) --heads $((2048 / d)) --seqlen ${NCU_SEQLEN:-4096} \
                --head-dim $d $NCU_CAUSAL_FLAG --repeats 1 --warmup 1 2>&1 | grep -E "^\s+(sm__|smsp__|l1tex__|launch__|lts__|dram__|gpu__)"
            echo "== torch flash d=$d"
            timeout 120 ncu --clock-control none -k regex:$peer_k --launch-skip 1 --launch-count 1 --metrics $M \
                python3 /tmp/torch_flash.py $d $NCU_PASS ${NCU_SEQLEN:-4096} ${NCU_CAUSAL:-0} 2>&1 | grep -E "^\s+(sm__|smsp__|l1tex__|launch__|lts__|dram__|gpu__)|flash_" | cut -c1-160
        done
    } >"$OUT/ncu.log" 2>&1
    python3 - "$OUT/ncu.log" <<'PY'
import re, sys
blocks, cur = {}, None
for line in open(sys.argv[1]):
    if line.startswith("== "): cur = line[3:].strip(); blocks[cur] = {}; continue
    m = re.match(r"\s+(\S+)\s+(\S+\s+)?([\d.,]+)\s*$", line)
    if m and cur: blocks[cur][m.group(1)] = m.group(3).replace(",", "")
names = list(blocks)
metrics = sorted({k for b in blocks.values() for k in b})
print("%-72s " % "metric" + " ".join("%16s" % n[-16:] for n in names))
for k in metrics:
    print("%-72s " % k[:72] + " ".join("%16s" % blocks[n].get(k, "-") for n in names))
PY
fi

if has ncusrc; then
    # Source-level stall sampling, ours next to PyTorch's: NCU_SRC = "pass:d ..." (pass fwd | bwd), seqlen 4096.
    # Per kernel: stall samples by opcode and the hottest SASS lines (ncusrc-*.txt); raw CSVs in ncusrc.tar.gz.
    note "ncu source counters: ${NCU_SRC:=bwd:64 bwd:256 fwd:128}"
    mkdir -p /tmp/ncusrc
    for pd in $NCU_SRC; do
        pass=${pd%%:*} d=${pd##*:}
        if [ "$pass" = fwd ]; then ours_k=fa2_fwd_kernel peer_k=flash_fwd_kernel bwd_flag=""; else
            ours_k=fa2_bwd_main peer_k=flash_bwd_dq_dk_dv bwd_flag=--bwd; fi
        for who in ours torch; do
            name=$who-$pass-$d
            if [ $who = ours ]; then
                cmd=(build/flashattn bench --backend cuda --kernel fa2 $bwd_flag --batch $((16384 / ${NCU_SEQLEN:-4096})) --heads $((2048 / d)) --seqlen ${NCU_SEQLEN:-4096}
                    --head-dim $d $NCU_CAUSAL_FLAG --repeats 1 --warmup 1) k=$ours_k
            else cmd=(python3 /tmp/torch_flash.py $d $pass ${NCU_SEQLEN:-4096} ${NCU_CAUSAL:-0}) k=$peer_k; fi
            timeout 150 ncu --clock-control none --section SourceCounters --section WarpStateStats -k regex:$k \
                --launch-skip 1 --launch-count 1 -f -o /tmp/ncusrc/$name "${cmd[@]}" >/tmp/ncusrc/$name.log 2>&1
            ncu -i /tmp/ncusrc/$name.ncu-rep --page source --csv --print-source sass >/tmp/ncusrc/$name.csv 2>&1 ||
                ncu -i /tmp/ncusrc/$name.ncu-rep --page source --csv >/tmp/ncusrc/$name.csv 2>&1
            ncu -i /tmp/ncusrc/$name.ncu-rep --page details --csv >/tmp/ncusrc/$name-details.csv 2>&1
            python3 - /tmp/ncusrc/$name.csv >"$OUT/ncusrc-$name.txt" 2>&1 <<'PY'
import csv, re, sys, collections
rows = list(csv.reader(open(sys.argv[1], errors="replace")))
hi = next((i for i, r in enumerate(rows) if any("Source" == c or "Address" in c for c in r)), None)
if hi is None:
    print("no source table:"); print("\n".join(",".join(r)[:200] for r in rows[:20])); sys.exit()
head = rows[hi]; data = [r for r in rows[hi + 1:] if len(r) == len(head)]
print("columns:", " | ".join(head))
src = next(i for i, c in enumerate(head) if c == "Source" or "Source" in c)
def num(x):
    try: return float(x.replace(",", ""))
    except ValueError: return None
samp = next((i for i, c in enumerate(head) if "Sampling (All" in c), None)
numeric = [i for i in range(len(head)) if i != src and sum(num(r[i]) is not None for r in data) > len(data) // 2]
if samp is None: print("no sampling column"); sys.exit()
tot = sum(num(r[samp]) or 0 for r in data)
by_op = collections.Counter()
for r in data:
    m = re.match(r"\s*(@!?U?P\w+\s+)?([A-Z0-9_]+)", r[src]); by_op[m.group(2) if m else "?"] += num(r[samp]) or 0
print("total samples %d, instructions %d" % (tot, len(data)))
print("by opcode:", ", ".join("%s %.1f%%" % (k, 100 * v / tot) for k, v in by_op.most_common(16)))
stall_cols = [i for i in numeric if i != samp and re.search(r"stall|Stall|smsp__pcsamp", head[i])]
print("stall columns:", [head[i] for i in stall_cols][:40])
agg = {head[i]: sum(num(r[i]) or 0 for r in data) for i in stall_cols}
print("stall totals:", ", ".join("%s %.0f" % (k, v) for k, v in sorted(agg.items(), key=lambda x: -x[1])[:14]))
print("hottest lines (index, samples %, SASS, nonzero stall columns):")
idx = sorted(range(len(data)), key=lambda i: -(num(data[i][samp]) or 0))[:70]
for i in sorted(idx):
    r = data[i]
    extra = " ".join("%s=%s" % (re.sub(r"[^a-z_]", "", head[c].lower())[-14:], r[c]) for c in stall_cols if (num(r[c]) or 0) > 0.02 * (num(r[samp]) or 1))
    print("%5d %5.2f%% %-58s %s" % (i, 100 * (num(r[samp]) or 0) / tot, r[src].strip()[:58], extra[:150]))
PY
            head -4 "$OUT/ncusrc-$name.txt" | cut -c1-300
        done
    done
    tar czf "$OUT/ncusrc.tar.gz" -C /tmp/ncusrc $(cd /tmp/ncusrc && ls *.csv *.log) 2>/dev/null
fi

note "summary"
grep -H -E "^summary" "$OUT"/tests-*.log 2>/dev/null | sed "s|$OUT/||"
python3 - "$OUT" <<'PY'
import csv, glob, json, os, sys
out = sys.argv[1]
def load(path):
    rows = {}
    if not os.path.exists(path): return rows
    for r in csv.DictReader(open(path)):
        rows[(r["pass"], int(r["head_dim"]), int(r["causal"]), int(r["seqlen_q"]))] = float(r["tflops"])
    return rows
main = load(os.path.join(out, "main.csv"))
peers, cudnn = {}, {}
p = os.path.join(out, "peers.json")
if os.path.exists(p):
    for r in json.load(open(p)):
        if r.get("impl") in ("flash", "torch-flash") and r.get("tflops"):
            peers[(r["pass"], r["head_dim"], int(r["causal"]), r["seqlen"])] = r["tflops"]
        if r.get("impl") in ("cudnn", "torch-cudnn") and r.get("tflops"):
            cudnn[(r["pass"], r["head_dim"], int(r["causal"]), r["seqlen"])] = r["tflops"]
vars_ = {}
for f in sorted(glob.glob(os.path.join(out, "v-*.csv"))):
    name = os.path.basename(f)[2:].rsplit("-", 1)[0]
    vars_.setdefault(name, {}).update(load(f))
keys = sorted(set(main) | set(peers), key=lambda k: (k[0] != "fwd", k[1], k[2], k[3]))
names = list(vars_)
print("pass d causal seqlen | main flash main/flash | " + " ".join(f"{n}/main" for n in names))
for k in keys:
    m, f = main.get(k), peers.get(k)
    if not m: continue
    ratio = f"{m / f:.2f}" if m and f else "-"
    c = cudnn.get(k)
    if c: ratio += f" cudnn {c} {m / c:.2f}"
    cells = [f"{vars_[n][k] / m:.3f}" if m and k in vars_[n] else "-" for n in names]
    print(f"{k[0]} {k[1]} {k[2]} {k[3]} | {m or '-'} {f or '-'} {ratio} | " + " ".join(cells))
PY
# Everything but the summary in one archive (the GPU machine returns only a few files).
(cd "$OUT" && tar czf logs.tar.gz --exclude logs.tar.gz --exclude '*.ncu-rep' . 2>/dev/null)
