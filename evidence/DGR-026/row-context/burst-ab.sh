#!/bin/bash
# The templated burst at c = 8 and 16, dgr off and auto, 2 rounds per run: A (8ca697c, a
# count of rows at its mean seconds whatever the cells held) and B (de22498, a step's rows
# plus their attention of the cells held), alternating A B A B in one session. /tmp/A and
# /tmp/B are git worktrees at those commits, their vendor/ trees linked to the main
# checkout's, each built with `python3 setup.py build_ext --inplace`
OUT=${OUT:-/tmp/p/rc}
mkdir -p $OUT
for run in A1 B1 A2 B2; do
  cd /tmp/${run:0:1}
  python -m dgr bench --cases speculation --spec-levels 8,16 --spec-rounds 2 \
    --spec-servers "dgr off,dgr auto" --spec-workloads "templated burst" \
    --out $OUT/$run > $OUT/$run.log 2>&1
  echo "== $run ($(git -C /tmp/${run:0:1} log --format=%h -1))"
  python3 /work/main/evidence/DGR-026/per_round.py $OUT/$run/bench.json
done
