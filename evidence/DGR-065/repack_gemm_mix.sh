#!/usr/bin/env bash
# Where the repacked Q4_K GEMM loses at prompt widths: bench_kernels (built against the
# patch stack's static libraries, build/native-patched) times a 2048 x 2048 Q4_K matmul
# of 512 columns as loaded and repacked (CPU_REPACK), alternating, then perf counts the
# integer dot-product instructions in the kernel each takes.
#   sh evidence/DGR-065/repack_gemm_mix.sh [ROUNDS]
set -eu
cd "$(dirname "$0")/../.."
rounds=${1:-3}
out=${TMPDIR:-/tmp}/dgr-repack-gemm
mkdir -p "$out"
lib=build/native-patched/llama
g++ -O2 -std=c++17 -Wno-deprecated-declarations patches/native-tests/bench_kernels.cpp \
    -o "$out/bench-kernels" -I vendor/llama.cpp-patched/ggml/include "$lib/ggml/src/libggml.a" \
    $(ls "$lib"/ggml/src/ggml-rpc/*.a 2>/dev/null) "$lib/ggml/src/libggml-cpu.a" \
    "$lib/ggml/src/libggml-base.a" -fopenmp -lpthread -ldl
for round in $(seq "$rounds"); do
    for placed in "CPU       " "CPU_REPACK"; do
        "$out/bench-kernels" 2 3 "2048x2048 q4_K   $placed 512" 2>/dev/null | grep columns
    done
done
for placed in "CPU       " "CPU_REPACK"; do
    perf record -q -o "$out/perf.data" "$out/bench-kernels" 2 3 "2048x2048 q4_K   $placed 512" \
        >/dev/null 2>&1
    kernel=$(perf report -i "$out/perf.data" --no-children --sort symbol 2>/dev/null \
        | grep -E "gemm|tiled_run" | head -1 | sed 's/.*\] //; s/  .*//')
    counts=$(perf annotate -i "$out/perf.data" --stdio -s "$kernel" 2>/dev/null \
        | grep -oE "vpdpbusd|vpmaddubsw|vpmaddwd" | sort | uniq -c | tr -s ' \n' ' ')
    echo "$placed: $kernel:${counts% }"
done
