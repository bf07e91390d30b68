#!/bin/bash
# The margin (e5ea15e, /work/main) at c = 1, 2 and 4: the speculation case with dgr's two
# nodes, the code edit, the templated burst and natural text, 2 rounds
OUT=${OUT:-/tmp/p/margin}
cd /work/main
python -m dgr bench --cases speculation --spec-levels 1,2,4 --spec-rounds 2 \
  --spec-servers "dgr off,dgr auto" --spec-workloads "code edit,templated burst,natural text" \
  --out $OUT/low-c > $OUT/low-c.log 2>&1
python3 /work/main/evidence/DGR-026/per_round.py $OUT/low-c/bench.json
