#!/usr/bin/env bash
# encoder_step.cpp built against llama.cpp's own static libraries (vendor/build-peers:
# what llama-server runs) and against dgr's patched ones (build/native-patched: the
# native tests' build of the patch stack), then run alternating on one model, for each
# input length in N (a comma-separated list).
#   sh evidence/DGR-068/encoder_step.sh MODEL [N] [ROUNDS]
set -eu
cd "$(dirname "$0")/../.."
model=$1; n=${2:-512}; rounds=${3:-3}
out=${TMPDIR:-/tmp}/dgr-encoder-step
mkdir -p "$out"
build() {  # name tree libdir-root
    g++ -O2 -std=c++17 evidence/DGR-068/encoder_step.cpp -o "$out/$1" \
        -I "$2/include" -I "$2/ggml/include" \
        "$3/src/libllama.a" "$3/ggml/src/libggml.a" $(ls "$3"/ggml/src/ggml-rpc/*.a 2>/dev/null) \
        "$3/ggml/src/libggml-cpu.a" "$3/ggml/src/libggml-base.a" -fopenmp -lpthread -ldl
}
build pristine vendor/llama.cpp vendor/build-peers
build patched vendor/llama.cpp-patched build/native-patched/llama
for round in $(seq "$rounds"); do
    for build in pristine patched; do
        for length in $(echo "$n" | tr ',' ' '); do
            printf '%s: ' "$build"; "$out/$build" "$model" "$length" 10 2
        done
    done
done
