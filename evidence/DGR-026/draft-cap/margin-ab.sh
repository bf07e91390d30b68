#!/bin/bash
# A (a worktree of the commit before the margin at /tmp/A) and B (the margin, /work/main)
# one after the other, the speculation case with dgr's two nodes at c = 8 and 16, the
# templated burst, the quoting summary, the code edit and natural text, 2 rounds each
OUT=${OUT:-/tmp/p/margin}
mkdir -p $OUT
for v in A B; do
  d=/tmp/A; [ $v = B ] && d=/work/main
  cd $d
  echo "=== $v $(git log --oneline -1 | cut -c1-60) $(date +%T)"
  python -m dgr bench --cases speculation --spec-levels 8,16 --spec-rounds 2 \
    --spec-servers "dgr off,dgr auto" \
    --spec-workloads "templated burst,quoting summary,code edit,natural text" \
    --out $OUT/$v > $OUT/$v.log 2>&1
  python3 /work/main/evidence/DGR-026/per_round.py $OUT/$v/bench.json
done
