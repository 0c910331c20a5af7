#!/usr/bin/env bash
# fa2_fwd_device.sh - one GPU-machine session for the FA2 forward: build, correctness (the GPU suite of
# test_backends with FLASHATTN_KERNEL=fa2, extra `flashattn check` shapes), compute-sanitizer on small
# problems, and forward timings of tile variants next to PyTorch's SDPA flash and cuDNN backends.
#
#   dev/fa2_fwd_device.sh [build] [test] [sanitize] [sweep] [variants] [ncu] [peers]   (default: all of them)
#
# Tile variants are built by recompiling one head dim's file with FA2_FWD_TILE_<D> defined as "M, N, STEP, WARPS,
# STAGES" (see fa2_fwd.cuh) and relinking the CLI; list them in VARIANTS ("name:D:M, N, STEP, WARPS, STAGES"
# with an optional ":-DFLAG ..." of extra compiler flags).
# Logs go to $OUT (default ./device-out); a summary is printed last.
set -u -o pipefail
cd "$(dirname "$0")/.." || exit 1
OUT=${OUT:-$PWD/device-out}
mkdir -p "$OUT"
PARTS=("$@")
[ ${#PARTS[@]} -gt 0 ] || PARTS=(build test sanitize sweep variants ncu peers)
has() { local p; for p in "${PARTS[@]}"; do [ "$p" = "$1" ] && return 0; done; return 1; }
SECONDS=0
note() { printf '[%4ds] %s\n' "$SECONDS" "$*"; }
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CC=${CC:-$(command -v cc || command -v gcc)}
NVCC_FLAGS="-O3 -std=c++17 -Xcompiler -fPIC,-fvisibility=hidden -Iinclude -Isrc -lineinfo -Xptxas --warn-on-spills -DFA_WITH_CUDA"
VARIANTS=${VARIANTS:-"d128_rescale_always:128:128, 64, 64, 4, 2:-DFA2_FWD_RESCALE_ALWAYS
d128_m128n64s32:128:128, 64, 32, 4, 2
d128_m64n64:128:64, 64, 64, 4, 2
d128_m128n64w8:128:128, 64, 64, 8, 2
d64_m128n128:64:128, 128, 64, 4, 2
d64_m64n64:64:64, 64, 64, 4, 2
d256_m128n64w8:256:128, 64, 64, 8, 2"}
SEQLENS=${SEQLENS:-"2048 4096 8192 16384"}

build_variants() {
    mkdir -p /tmp/fa2v
    LIBOBJS=$(ls build/src/*.o build/src/*/*.o)
    while IFS= read -r line; do
        [ -n "$line" ] || continue
        name=${line%%:*}; rest=${line#*:}; d=${rest%%:*}; tile=${rest#*:}; extra=""
        case "$tile" in *:*) extra=${tile#*:}; tile=${tile%%:*} ;; esac
        (
            mkdir -p /tmp/fa2v/$name
            # (a -D value with commas would be split by nvcc's option parser: the row goes in a pre-included header)
            printf '#define FA2_FWD_TILE_%s %s\n' "$d" "$tile" >/tmp/fa2v/$name/tile.h
            $NVCC $NVCC_FLAGS -gencode=arch=compute_90a,code=sm_90a -include /tmp/fa2v/$name/tile.h $extra -Xptxas -v \
                -c src/cuda/fa2_fwd_hdim$d.cu -o /tmp/fa2v/$name/hdim.o >/tmp/fa2v/$name/nvcc.log 2>&1 &&
                ar rcs /tmp/fa2v/$name/lib.a $(echo "$LIBOBJS" | grep -v "fa2_fwd_hdim$d.o") /tmp/fa2v/$name/hdim.o &&
                $CC -o /tmp/fa2v/$name/flashattn build/cli/*.o /tmp/fa2v/$name/lib.a -lm -fopenmp \
                    -L/usr/local/cuda/lib64 -Wl,-rpath,/usr/local/cuda/lib64 -lcudart -lcublas -lstdc++ \
                    >>/tmp/fa2v/$name/nvcc.log 2>&1 || { echo "variant $name failed to build:"; tail -5 /tmp/fa2v/$name/nvcc.log; }
        ) &
    done <<<"$VARIANTS"
}

if has build; then
    note "build"
    nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader | tee "$OUT/build.log"
    make -j16 build/flashattn build/tests/test_backends >>"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
    grep -E "spill|error" "$OUT/build.log" | sort | uniq | head -20
fi
has variants && build_variants  # in the background, on the CPU, while the tests run

if has test; then
    note "test_backends -b cuda,naive (FLASHATTN_KERNEL=fa2)"
    FLASHATTN_KERNEL=fa2 timeout 120 build/tests/test_backends -b cuda,naive >"$OUT/tests.log" 2>&1
    echo "test_backends rc=$?"
    grep -E "^(FAIL|ERROR)|summary" "$OUT/tests.log" | head -40
    note "extra checks"
    {
        for d in 64 128 256; do
            for c in --no-causal --causal; do
                timeout 60 build/flashattn check --backend cuda --kernel fa2 --batch 2 --heads 4 --seqlen 1024 --head-dim $d $c | tail -1
            done
        done
        timeout 60 build/flashattn check --backend cuda --kernel fa2 --batch 1 --heads 4 --heads-kv 1 --seqlen-q 777 --seqlen-k 3001 --head-dim 128 --causal | tail -1
        timeout 60 build/flashattn check --backend cuda --kernel fa2 --batch 3 --heads 4 --seqlen 1500 --head-dim 64 --window 200,50 --softcap 30 --alibi | tail -1
        timeout 60 build/flashattn check --backend cuda --kernel fa2 --batch 5 --heads 4 --seqlen 1000 --head-dim 192 --varlen --causal | tail -1
        timeout 60 build/flashattn check --backend naive --batch 2 --heads 4 --seqlen 300 --head-dim 128 --causal --bwd | tail -1
        timeout 60 build/flashattn check --backend naive --batch 4 --heads 4 --heads-kv 2 --seqlen 200 --head-dim 64 --varlen --bwd --softcap 5 --alibi | tail -1
        timeout 60 build/flashattn check --backend naive --dtype f32 --batch 2 --heads 4 --seqlen 200 --head-dim 80 --window 30,10 --bwd | tail -1
    } 2>&1 | tee "$OUT/checks.log"
fi

if has sanitize; then
    note "compute-sanitizer"
    {
        for tool in memcheck racecheck; do
            for args in "--head-dim 128 --seqlen-q 130 --seqlen-k 250 --causal --varlen"; do
                echo "== $tool $args"
                timeout 90 compute-sanitizer --tool $tool --print-limit 5 build/flashattn check --backend cuda --kernel fa2 --batch 2 --heads 2 $args 2>&1 | grep -E "ERROR SUMMARY|RACECHECK SUMMARY|check:|Invalid|Race|Error" | head -8
            done
        done
    } 2>&1 | tee "$OUT/sanitize.log"
fi

if has sweep; then
    note "forward sweep (paper shapes: 16k tokens, hidden 2048, bf16)"
    {
        for d in 64 128 256; do
            for c in --no-causal --causal; do
                for s in $SEQLENS; do
                    r=$(timeout 30 build/flashattn bench --backend cuda --kernel fa2 --batch $((16384 / s)) --heads $((2048 / d)) --seqlen $s --head-dim $d $c 2>&1 | grep -E "^cuda" | awk '{print $NF}')
                    printf "ours d=%-3s %-11s s=%-5s %8s TFLOP/s\n" $d $c $s "$r"
                done
            done
        done
    } 2>&1 | tee "$OUT/sweep.log"
fi

if has variants; then
    note "tile variants: timing"
    wait  # the variant builds started after the main build
    {
        while IFS= read -r line; do
            [ -n "$line" ] || continue
            name=${line%%:*}; rest=${line#*:}; d=${rest%%:*}
            regs=$(grep -E "Used [0-9]+ registers" /tmp/fa2v/$name/nvcc.log | head -1 | sed 's/.*Used \([0-9]*\) registers.*/\1/')
            spill=$(grep -E "spill stores" /tmp/fa2v/$name/nvcc.log | head -1 | sed 's/.*, \([0-9]*\) bytes spill stores.*/\1/')
            h=$((2048 / d))
            for c in --no-causal --causal; do
                for s in ${VARIANT_SEQLENS:-$SEQLENS}; do
                    b=$((16384 / s))
                    r=$(timeout 30 /tmp/fa2v/$name/flashattn bench --backend cuda --kernel fa2 --batch $b --heads $h --seqlen $s --head-dim $d $c --repeats 20 --warmup 5 2>&1 | grep -E "^cuda" | awk '{print $NF}')
                    chk=""
                    [ "$s" = "$(echo ${VARIANT_SEQLENS:-$SEQLENS} | cut -d' ' -f1)" ] && chk=$(timeout 30 /tmp/fa2v/$name/flashattn check --backend cuda --kernel fa2 --batch 1 --heads 2 --seqlen 700 --head-dim $d $c 2>&1 | tail -1 | cut -c1-11)
                    printf "%-16s d=%-3s %-11s s=%-5s regs=%-3s spill=%-4s %8s TFLOP/s  %s\n" $name $d $c $s "$regs" "${spill:-0}" "$r" "$chk"
                done
            done
        done <<<"$VARIANTS"
    } 2>&1 | tee "$OUT/variants.log"
fi

if has ncu; then
    note "ncu: ours vs PyTorch flash, d=128 and d=256, seqlen 4096, not causal"
    METRICS=sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active,sm__warps_active.avg.pct_of_peak_sustained_active,l1tex__data_pipe_lsu_wavefronts_mem_shared.avg.pct_of_peak_sustained_elapsed,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum,l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum,l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum,smsp__inst_executed.sum,sm__cycles_elapsed.avg,launch__registers_per_thread,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,smsp__average_warps_issue_stalled_barrier_per_issue_active.ratio,smsp__average_warps_issue_stalled_long_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_short_scoreboard_per_issue_active.ratio,smsp__average_warps_issue_stalled_mio_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_math_pipe_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_wait_per_issue_active.ratio,smsp__average_warps_issue_stalled_not_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_selected_per_issue_active.ratio,smsp__average_warps_issue_stalled_dispatch_stall_per_issue_active.ratio,smsp__average_warps_issue_stalled_lg_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_tex_throttle_per_issue_active.ratio,smsp__average_warps_issue_stalled_no_instruction_per_issue_active.ratio,smsp__average_warps_issue_stalled_sleeping_per_issue_active.ratio,smsp__average_warps_issue_stalled_membar_per_issue_active.ratio,smsp__average_warps_issue_stalled_branch_resolving_per_issue_active.ratio,smsp__average_warps_issue_stalled_drain_per_issue_active.ratio,smsp__average_warps_issue_stalled_imc_miss_per_issue_active.ratio,smsp__average_warps_issue_stalled_misc_per_issue_active.ratio
    cat >/tmp/torch_flash.py <<'PY'
import sys, torch, torch.nn.functional as F
from torch.nn.attention import sdpa_kernel, SDPBackend
d = int(sys.argv[1]); s = 4096; h = 2048 // d; b = 16384 // s
q, k, v = [torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3)]
with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
    for _ in range(3): F.scaled_dot_product_attention(q, k, v)
torch.cuda.synchronize()
PY
    {
        for d in ${NCU_DIMS:-128 256}; do
            echo "== ours d=$d"
            timeout 120 ncu --clock-control none -k regex:fa2_fwd_kernel --launch-skip 2 --launch-count 1 --metrics $METRICS \
                build/flashattn bench --backend cuda --kernel fa2 --batch 4 --heads $((2048 / d)) --seqlen 4096 --head-dim $d --no-causal --repeats 1 --warmup 2 2>&1 | grep -E "^\s+(sm__|smsp__|l1tex__|launch__)"
            echo "== torch flash d=$d"
            timeout 120 ncu --clock-control none -k regex:flash_fwd --launch-skip 2 --launch-count 1 --metrics $METRICS \
                python3 /tmp/torch_flash.py $d 2>&1 | grep -E "^\s+(sm__|smsp__|l1tex__|launch__)|flash_fwd_kernel" | cut -c1-160
        done
    } 2>&1 | tee "$OUT/ncu.log"
fi

if has peers; then
    note "peers"
    PYTHONUNBUFFERED=1 timeout 240 python3 bench/peer_bench.py --head-dims 64,128,256 --seqlens ${SEQLENS// /,} --causal both \
        --passes fwd --impls flash,cudnn 2>&1 | tee "$OUT/peers.log"
fi
note "done"
