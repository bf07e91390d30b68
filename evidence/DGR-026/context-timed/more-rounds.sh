#!/bin/bash
# The templated burst at c = 8 and 16 on main at d5f62e9 (B and the 64-row guard), two
# runs of 3 rounds, dgr off and auto on nodes of their own:
#   OUT=/tmp/p/more bash evidence/DGR-026/context-timed/more-rounds.sh
mkdir -p $OUT
for run in M1 M2; do
  python -m dgr bench --cases speculation --spec-levels 8,16 --spec-rounds 3 \
    --spec-servers "dgr off,dgr auto" --spec-workloads "templated burst" \
    --out $OUT/$run > $OUT/$run.log 2>&1
  echo "== $run $(date +%T)"
done
