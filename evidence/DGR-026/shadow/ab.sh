#!/bin/bash
# A (f095604, in a worktree at /tmp/A: a shadow told whether the step's token was the found
# draft's first) and B (the working tree: the found draft followed over the tokens sampled
# next) alternating, 3 runs each: the bench's speculation case, dgr's two nodes, c = 1, 2
# and 4, the code edit, the quoting summary and natural text
OUT=${OUT:-/tmp/p/sab}   # the runs' folders and logs
for r in 1 2 3; do
  for v in A B; do
    d=/tmp/A; [ $v = B ] && d=/work/main
    cd $d
    echo "=== round $r $v $(date +%T)"
    python -m dgr bench --cases speculation --spec-levels 1,2,4 --spec-rounds 2 --spec-servers "dgr off,dgr auto" \
      --spec-workloads "code edit,quoting summary,natural text" --out $OUT/ab-$v-$r > $OUT/ab-$v-$r.log 2>&1
    python3 /work/main/evidence/DGR-026/per_round.py $OUT/ab-$v-$r/bench.json | cut -d'|' -f2-4 | sed 's/ *$//'
  done
done
