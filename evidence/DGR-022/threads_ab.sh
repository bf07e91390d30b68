#!/bin/bash
# c=1 with llama.cpp on 2 threads vs 1 (is a one-row decode bound by memory, leaving a
# core to Python?); 3 x 128 streamed tokens per run, seconds per completion.
HERE=$(cd "$(dirname "$0")" && pwd); cd "$HERE/../.."
for r in 1 2; do for t in 2 1; do
  python -m dgr run --port 8311 --threads $t > /tmp/srv.log 2>&1 & sleep 1
  until grep -q "serving" /tmp/srv.log; do sleep 1; done
  python evidence/DGR-021/c1_client.py http://127.0.0.1:8311 1 >/dev/null
  echo "threads=$t"; python evidence/DGR-021/c1_client.py http://127.0.0.1:8311 3
  pkill -f "dgr run --port 8311"; sleep 2
done; done
