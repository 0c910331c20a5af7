#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Builds dev/hopper/fa3_dev (the FA3 bring-up / check / timing driver) and libfa3dev.so (the FA3 forward behind
# a C entry point, for dev/hopper/compare.py) into ${1:-build/dev-hopper}, compiling the FA3 sources directly
# for sm_90a, in parallel.
set -eu -o pipefail
cd "$(dirname "$0")/../.."
B=${1:-build/dev-hopper}
mkdir -p "$B"
NVCC=${NVCC:-nvcc}
FLAGS="-O3 -std=c++17 -Iinclude -Isrc -lineinfo -DFA_WITH_CUDA -DFA_TUNING -gencode=arch=compute_90a,code=sm_90a -Xptxas --warn-on-spills"
pids=()
LIB="fa3_fwd fa3_fwd_hdim64 fa3_fwd_hdim128 fa3_fwd_hdim256 fa3_fp8_fwd_hdim64 fa3_fp8_fwd_hdim128 fa3_fp8_fwd_hdim256 tensor_map"
for f in $LIB; do
    $NVCC $FLAGS -Xcompiler -fPIC -c "src/cuda/$f.cu" -o "$B/$f.o" &
    pids+=($!)
done
for f in fa3_dev fa3_shim; do
    $NVCC $FLAGS -Xcompiler -fopenmp,-fPIC -c "dev/hopper/$f.cu" -o "$B/$f.o" &
    pids+=($!)
done
for p in "${pids[@]}"; do wait "$p"; done
OBJS=$(for f in $LIB; do echo "$B/$f.o"; done)
$NVCC -gencode=arch=compute_90a,code=sm_90a -Xcompiler -fopenmp -o "$B/fa3_dev" $OBJS "$B/fa3_dev.o" -lcudart
$NVCC -gencode=arch=compute_90a,code=sm_90a -shared -o "$B/libfa3dev.so" $OBJS "$B/fa3_shim.o" -lcudart
echo "built $B/fa3_dev $B/libfa3dev.so"
