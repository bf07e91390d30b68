#!/bin/bash
# The templated burst at c = 8 and 16, dgr off and auto (HEAD, worktree /tmp/A), 8 rounds
# in one run: whether its c = 16 cell of run 38 (0.979 of off, rounds 0.92-1.49) is
# drafting's cost or this machine's drift
OUT=${OUT:-/tmp/p/cap}
cd /tmp/A
python -m dgr bench --cases speculation --spec-levels 8,16 --spec-rounds 8 \
  --spec-servers "dgr off,dgr auto" --spec-workloads "templated burst" \
  --out $OUT/burst-load > $OUT/burst-load.log 2>&1
python3 /work/main/evidence/DGR-026/per_round.py $OUT/burst-load/bench.json
