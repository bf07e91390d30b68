#!/bin/bash
# A (289e334, in a worktree at /tmp/A: context, the node's store, then structure_draft) and
# B (the working tree: values_draft asked first) alternating, 3 runs each: the bench's
# speculation case, dgr's two nodes, c = 1, 2 and 4, the table and the code edit
OUT=${OUT:-/tmp/p/vab}   # the runs' folders and logs
for r in 1 2 3; do
  for v in A B; do
    d=/tmp/A; [ $v = B ] && d=/work/main
    cd $d
    echo "=== round $r $v $(date +%T)"
    python -m dgr bench --cases speculation --spec-levels 1,2,4 --spec-rounds 2 --spec-servers "dgr off,dgr auto" \
      --spec-workloads "table to JSON,code edit" --out $OUT/ab-$v-$r > $OUT/ab-$v-$r.log 2>&1
    python3 /work/main/evidence/DGR-026/per_round.py $OUT/ab-$v-$r/bench.json | cut -d'|' -f2-4 | sed 's/ *$//'
  done
done
