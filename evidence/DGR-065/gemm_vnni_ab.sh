#!/usr/bin/env bash
# Patch 0019's gain and cost: bench_kernels linked twice against the patch stack's static
# libraries (build/native-patched), once with x86's repack kernels as the stack builds them
# and once with patch 0019 taken out of that file, run alternating: Q4_K matmuls (k x rows:
# 2048 x 2048, and a 1B Llama's feed-forward 2048 x 8192 and 8192 x 2048) of 1, 16 and 512
# columns, as loaded (the stack's tiled kernel) and repacked (CPU_REPACK).
#   sh evidence/DGR-065/gemm_vnni_ab.sh [ROUNDS]
set -eu
cd "$(dirname "$0")/../.."
rounds=${1:-3}
out=${TMPDIR:-/tmp}/dgr-gemm-vnni
mkdir -p "$out"
src=vendor/llama.cpp-patched/ggml/src
lib=build/native-patched/llama
patch -s -R -o "$out/repack-without.cpp" "$src/ggml-cpu/arch/x86/repack.cpp" \
    < patches/0019-ggml-cpu-repack-q4_K-gemm-vnni.patch
cp "$src/ggml-cpu/arch/x86/repack.cpp" "$out/repack-with.cpp"
for build in with without; do
    g++ -O3 -DNDEBUG -std=gnu++17 -march=native -fopenmp -DGGML_USE_CPU_REPACK \
        -DGGML_USE_LLAMAFILE -DGGML_USE_OPENMP -D_GNU_SOURCE -D_XOPEN_SOURCE=600 \
        -iquote "$src/ggml-cpu/arch/x86" -I "$src" -I "$src/ggml-cpu" -I "$src/../include" \
        -c "$out/repack-$build.cpp" -o "$out/repack-$build.o" 2> "$out/build-$build.log"
    # the object given first defines the x86 kernels; the archive's copy is not pulled in
    g++ -O2 -std=c++17 -Wno-deprecated-declarations patches/native-tests/bench_kernels.cpp \
        "$out/repack-$build.o" -o "$out/bench-kernels-$build" -I "$src/../include" \
        "$lib/ggml/src/libggml.a" $(ls "$lib"/ggml/src/ggml-rpc/*.a 2>/dev/null) \
        "$lib/ggml/src/libggml-cpu.a" "$lib/ggml/src/libggml-base.a" -fopenmp -lpthread -ldl
done
for round in $(seq "$rounds"); do
    for build in with without; do
        for shape in 2048x2048 2048x8192 8192x2048; do
            "$out/bench-kernels-$build" 2 10 "mul_mat $shape q4_K" 2>/dev/null \
                | grep columns | sed "s/^/patch 0019 $build: /"
        done
    done
done
