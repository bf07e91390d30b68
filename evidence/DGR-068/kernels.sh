#!/usr/bin/env bash
# patches/native-tests/bench_kernels.cpp built against llama.cpp's own static libraries
# (vendor/build-peers: what llama-server runs) and against the patch stack's
# (build/native-patched: the native tests' build), then run alternating with any further
# bench-kernels binaries given (one built from an earlier stack, say), on the flash
# attention cases named by FILTERS.
#   sh evidence/DGR-068/kernels.sh [ROUNDS] [BINARY...]
set -eu
cd "$(dirname "$0")/../.."
rounds=${1:-3}; shift || true
out=${TMPDIR:-/tmp}/dgr-bench-kernels
mkdir -p "$out"
build() {  # name tree libdir-root
    g++ -O2 -std=c++17 -Wno-deprecated-declarations patches/native-tests/bench_kernels.cpp \
        -o "$out/$1" -I "$2/ggml/include" "$3/ggml/src/libggml.a" \
        $(ls "$3"/ggml/src/ggml-rpc/*.a 2>/dev/null) "$3/ggml/src/libggml-cpu.a" \
        "$3/ggml/src/libggml-base.a" -fopenmp -lpthread -ldl
}
build llama.cpp vendor/llama.cpp vendor/build-peers
build stack vendor/llama.cpp-patched build/native-patched/llama
FILTERS=${FILTERS:-"non-causal|prompt chunk of 512 rows, kv"}
for round in $(seq "$rounds"); do
    for bin in "$out/llama.cpp" "$out/stack" "$@"; do
        echo "== round $round: $(basename "$bin")"
        IFS='|'; for f in $FILTERS; do "$bin" 2 3 "$f"; done; unset IFS
    done
done
