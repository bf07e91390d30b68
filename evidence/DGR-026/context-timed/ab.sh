#!/bin/bash
# A B A B in one session: A is /tmp/A, a git worktree at d5b2331 (the plan takes the
# decode-only step's time from any step of as many rows), B is /tmp/B at 0009cd1 (only
# one timed at the sessions' contexts now); their vendor/ trees are linked to the main
# checkout's, each built with `python3 setup.py build_ext --inplace`.
#   OUT=/tmp/p/ab1 LEVELS=8,16 ROUNDS=2 WORKLOADS="templated burst" ab.sh
#   OUT=/tmp/p/ab2 LEVELS=1 ROUNDS=2 ab.sh                  (every workload)
#   OUT=/tmp/p/ab3 LEVELS=16 ROUNDS=4 WORKLOADS="templated burst" ab.sh
# then ab_rounds.py A1=$OUT/A1 B1=$OUT/B1 A2=$OUT/A2 B2=$OUT/B2
mkdir -p $OUT
for run in A1 B1 A2 B2; do
  cd /tmp/${run:0:1}
  python -m dgr bench --cases speculation --spec-levels $LEVELS --spec-rounds $ROUNDS \
    --spec-servers "dgr off,dgr auto" ${WORKLOADS:+--spec-workloads "$WORKLOADS"} \
    --out $OUT/$run > $OUT/$run.log 2>&1
  echo "== $run ($(git -C /tmp/${run:0:1} log --format=%h -1)) $(date +%T)"
done
