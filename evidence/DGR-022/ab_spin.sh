#!/bin/bash
# Alternate GOMP_SPINCOUNT settings (how long an OpenMP thread spins at a barrier before
# it sleeps) for a c=1 client, 3 x 128 streamed tokens per run; prints tokens/s.
HERE=$(cd "$(dirname "$0")" && pwd); cd "$HERE/../.."
for r in 1 2 3; do
  for sc in unset 30000 3000 300; do
    if [ $sc = unset ]; then env -u GOMP_SPINCOUNT python -m dgr run --port 8311 > /tmp/srv.log 2>&1 &
    else GOMP_SPINCOUNT=$sc python -m dgr run --port 8311 > /tmp/srv.log 2>&1 & fi
    sleep 1; until grep -q "serving" /tmp/srv.log; do sleep 1; done
    python evidence/DGR-021/c1_client.py http://127.0.0.1:8311 1 >/dev/null
    out=$(python evidence/DGR-021/c1_client.py http://127.0.0.1:8311 3 | awk '{s+=$4} END {printf "%.2f", 3*128/s}')
    echo "round $r GOMP_SPINCOUNT=$sc tok/s $out"
    pkill -f "dgr run --port 8311"; sleep 2
  done
done
