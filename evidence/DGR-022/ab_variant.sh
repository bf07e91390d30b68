#!/bin/bash
# Alternate server variants (run_variant.py) for a c=1 client (4 x 128 streamed tokens):
# tokens/s, the Trio thread's CPU (user + system) per token from /proc, and the share of
# step time outside llama_decode from the node's step-phase metrics.
#   ROUNDS=4 VARIANTS="base pin" bash ab_variant.sh
HERE=$(cd "$(dirname "$0")" && pwd); cd "$HERE/../.."
m() { curl -s http://127.0.0.1:8311/metrics | awk -v k="$1" 'index($0,k)==1 {print $2}'; }
for r in $(seq 1 ${ROUNDS:-3}); do
  for v in $VARIANTS; do
    rm -f /tmp/dgr-serving
    python "$HERE/run_variant.py" $v > /tmp/srv.log 2>&1 &
    sleep 1; until grep -q "serving" /tmp/srv.log; do sleep 1; done; touch /tmp/dgr-serving; sleep 1.5
    PID=$(pgrep -f "run_variant.py" | head -1)
    python evidence/DGR-021/c1_client.py http://127.0.0.1:8311 1 >/dev/null
    t0=$(awk '{print $14+$15}' /proc/$PID/task/$PID/stat); d0=$(m 'dgr_step_phase_seconds_total{phase="decode"}'); s0=$(m dgr_step_duration_seconds_sum)
    out=$(python evidence/DGR-021/c1_client.py http://127.0.0.1:8311 4 | awk '{s+=$4} END {printf "%.2f", 4*128/s}')
    t1=$(awk '{print $14+$15}' /proc/$PID/task/$PID/stat); d1=$(m 'dgr_step_phase_seconds_total{phase="decode"}'); s1=$(m dgr_step_duration_seconds_sum)
    echo "round $r $v tok/s $out main-thread ms/token $(echo "($t1-$t0)*10/516" | bc -l | cut -c1-5) outside-decode $(echo "100*(1-($d1-$d0)/($s1-$s0))" | bc -l | cut -c1-5) %"
    pkill -f "run_variant.py"; sleep 2
  done
done
