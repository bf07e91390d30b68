#!/bin/sh
# Patch 0017's cost: x86's repacked Q4_K GEMV with the patch (build/native-patched, from
# `python scripts/native_tests.py`) against the pristine one (compiled here from
# vendor/llama.cpp, its symbol renamed), one thread, 2048-wide rows, 200 calls a case,
# 3 alternating rounds. Run from the repository root.
set -e
tmp=$(mktemp -d)
src=vendor/llama.cpp/ggml/src
c++ -DGGML_USE_CPU_REPACK -D_GNU_SOURCE -I$src/.. -I$src -I$src/ggml-cpu -I$src/../include \
    -O3 -DNDEBUG -std=gnu++17 -march=native -fopenmp -c $src/ggml-cpu/arch/x86/repack.cpp -o $tmp/old.o
objcopy --redefine-sym ggml_gemv_q4_K_8x8_q8_K=old_gemv_q4_K -G old_gemv_q4_K $tmp/old.o $tmp/old2.o
lib=build/native-patched/llama/ggml/src
g++ -O2 -march=native evidence/DGR-065/gemv_cost.cpp $tmp/old2.o $lib/libggml-cpu.a $lib/libggml-base.a \
    -lpthread -fopenmp -o $tmp/gemv_cost
$tmp/gemv_cost
rm -rf $tmp
