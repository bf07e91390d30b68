# c=1 over HTTP: dgr with OpenMP's default wait policy vs OMP_WAIT_POLICY=$1 (passive or
# active), alternating, one server process per round, 4 x 128 streamed tokens each:
#   bash evidence/DGR-021/ab_omp_wait.sh passive
cd "$(dirname "$0")/../.."
for round in 1 2 3; do
 for mode in default "$1"; do
  if [ "$mode" = default ]; then unset OMP_WAIT_POLICY; else export OMP_WAIT_POLICY="$1"; fi
  python -m dgr run --port 8313 --max-running 16 > /tmp/dgr-ab.log 2>&1 &
  for i in $(seq 90); do grep -q "serving" /tmp/dgr-ab.log && break; sleep 1; done
  python evidence/DGR-021/c1_client.py http://127.0.0.1:8313 1 >/dev/null
  echo "round $round $mode: $(python evidence/DGR-021/c1_client.py http://127.0.0.1:8313 4 | awk '{s+=$4} END {print 512/s " tok/s"}')"
  pkill -f "dgr run --port 8313"; sleep 3
 done
done
