#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# tests/cpu_simd.sh BUILD - the CPU kernels' run-time choice of instruction set (src/cpu/cpu_dispatch.c). The
# build's `flashattn info` must name the widest level this processor's /proc/cpuinfo flags allow; then, for every
# narrower level, FLASHATTN_CPU_SIMD=<level> must switch to it and the CPU tests must pass there (make test-c
# has run them at the widest); a value that names no level must make CPU calls fail, naming the variable. A
# build without the run-time choice (NATIVE=1, not x86-64) has one level: it is reported and nothing else runs.
# The objects of the levels below the widest are checked for instructions the processors they are for lack.
# One PASS/FAIL line per check, then "cpu-simd: N passed, M failed".
#   tests/cpu_simd.sh --widest   prints the widest level alone (make test-wheel compares the wheel's with it).

# The levels this processor runs, widest first, from the flags each needs as the kernel names them in
# /proc/cpuinfo (see CPU_ISA_FLAGS_* in the Makefile).
flags=" $(sed -n 's/^flags[[:space:]]*: //p' /proc/cpuinfo 2>/dev/null | head -n 1) "
has() { for f in "$@"; do case $flags in *" $f "*) ;; *) return 1 ;; esac; done; }
levels=portable
has avx2 fma f16c && levels="avx2 $levels"
has avx2 fma f16c avx512f avx512bw avx512dq avx512vl && levels="avx512 $levels"
has avx2 fma f16c avx512f avx512bw avx512dq avx512vl avx512_bf16 && levels="avx512bf16 $levels"
has avx2 fma f16c avx512f avx512bw avx512dq avx512vl avx512_bf16 amx_bf16 amx_tile && levels="amx $levels"
widest=${levels%% *}
if [ "$1" = --widest ]; then
    echo "$widest"
    exit 0
fi

build=${1:?usage: tests/cpu_simd.sh path/to/build}
fa=$build/flashattn
pass=0 fail=0
ok() { echo "PASS  $1"; pass=$((pass + 1)); }
bad() { echo "FAIL  $1"; fail=$((fail + 1)); }

simd_line() { FLASHATTN_CPU_SIMD=$1 "$fa" info | sed -n 's/^cpu simd: //p'; }
line=$(simd_line "")
case $line in
*"chosen at run time"*) ;;
*)
    echo "cpu-simd: this build has one level ($line): nothing to choose"
    echo "cpu-simd: 0 passed, 0 failed"
    exit 0
    ;;
esac

case $line in
"$widest "*) ok "the default level is $widest, the widest this CPU runs ($line)" ;;
*) bad "the default level: '$line', expected $widest (the widest of: $levels)" ;;
esac

for level in ${levels#"$widest"}; do
    case $(simd_line "$level") in
    "$level "*) ok "FLASHATTN_CPU_SIMD=$level is the level in use" ;;
    *)
        bad "FLASHATTN_CPU_SIMD=$level: info says '$(simd_line "$level")'"
        continue
        ;;
    esac
    for t in "test_backends -b cpu" test_kvcache test_nonfinite test_api test_alloc; do
        if FLASHATTN_CPU_SIMD=$level "$build"/tests/$t > "$build/cpu_simd_$level.log" 2>&1; then
            ok "FLASHATTN_CPU_SIMD=$level $t: $(tail -n 1 "$build/cpu_simd_$level.log")"
        else
            bad "FLASHATTN_CPU_SIMD=$level $t:"
            grep -E '^FAIL|failed' "$build/cpu_simd_$level.log" | tail -n 20
        fi
    done
done

for level in amx avx512bf16 avx512; do
    case " $levels " in
    *" $level "*) ;;
    *)
        case $(simd_line $level) in
        "$widest "*) ok "FLASHATTN_CPU_SIMD=$level on a CPU without it gives $widest" ;;
        *) bad "FLASHATTN_CPU_SIMD=$level on a CPU without it: info says '$(simd_line $level)'" ;;
        esac
        ;;
    esac
done

# What runs before the choice, or on any x86-64, holds no AVX instruction (VEX and EVEX mnemonics start with v),
# the AVX2 level no AVX-512 register, the AVX-512 level no bf16 dot product (vdpbf16ps, vcvtne2ps2bf16,
# vcvtneps2bf16) and the AVX-512 BF16 level no AMX instruction: on an older processor they would stop the
# program (SIGILL).
if command -v objdump > /dev/null; then
    insns() { objdump -d --no-show-raw-insn "$1" | awk -F '\t' 'NF >= 2 { print $2 }'; }
    for o in "$build"/src/*.o "$build"/src/reference/*.o "$build"/src/cpu/dispatch/*.o "$build"/src/cpu/portable/*.o; do
        n=$(insns "$o" | grep -c '^v')
        if [ "$n" -eq 0 ]; then ok "${o#"$build"/}: no AVX instruction"; else bad "${o#"$build"/}: $n AVX instructions"; fi
    done
    for o in "$build"/src/cpu/avx2/*.o; do
        n=$(insns "$o" | grep -Ec 'zmm|%k[0-7]')
        if [ "$n" -eq 0 ]; then ok "${o#"$build"/}: no AVX-512 register"; else bad "${o#"$build"/}: $n AVX-512 uses"; fi
    done
    for o in "$build"/src/cpu/avx512/*.o; do
        n=$(insns "$o" | grep -Ec '^v[a-z0-9]*bf16')
        if [ "$n" -eq 0 ]; then ok "${o#"$build"/}: no bf16 instruction"; else bad "${o#"$build"/}: $n bf16 instructions"; fi
    done
    for o in "$build"/src/cpu/avx512bf16/*.o; do
        n=$(insns "$o" | grep -Ec '^(tile|tdp|ldtilecfg|sttilecfg)')
        if [ "$n" -eq 0 ]; then ok "${o#"$build"/}: no AMX instruction"; else bad "${o#"$build"/}: $n AMX instructions"; fi
    done
    n=$(insns "$build"/src/cpu/amx/cpu_fwd.o | grep -c tdpbf16ps)
    if [ "$n" -gt 0 ]; then ok "src/cpu/amx/cpu_fwd.o: $n tdpbf16ps"; else bad "src/cpu/amx/cpu_fwd.o: no tdpbf16ps"; fi
    n=$(insns "$build"/src/cpu/avx512bf16/cpu_fwd.o | grep -c vdpbf16ps)
    if [ "$n" -gt 0 ]; then ok "src/cpu/avx512bf16/cpu_fwd.o: $n vdpbf16ps"; else bad "src/cpu/avx512bf16/cpu_fwd.o: no vdpbf16ps"; fi
else
    echo "skip  the instruction checks of the objects (no objdump)"
fi

out=$(FLASHATTN_CPU_SIMD=avx3 "$fa" check --backend cpu --batch 1 --heads 1 --seqlen 16 --head-dim 16 2>&1)
case $out in
*"FLASHATTN_CPU_SIMD=avx3 is not"*) ok "FLASHATTN_CPU_SIMD=avx3 (no such level) fails the call, naming it" ;;
*) bad "FLASHATTN_CPU_SIMD=avx3: expected an error naming the variable, got: $(echo "$out" | tail -n 2)" ;;
esac

echo "cpu-simd: $pass passed, $fail failed"
[ "$fail" -eq 0 ]
