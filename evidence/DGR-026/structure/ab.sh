#!/bin/bash
# A (dbca817, in a worktree at /tmp/A: context, then the node's store) and B (the working
# tree: then structure_draft; a session's record per source) alternating, 3 runs each: the
# bench's speculation case, dgr's two nodes, c = 1 and 2, the table and the burst
OUT=${OUT:-/tmp/p/ab2}   # the runs' folders and logs
for r in 1 2 3; do
  for v in A B; do
    d=/tmp/A; [ $v = B ] && d=/work/main
    cd $d
    echo "=== round $r $v $(date +%T)"
    python -m dgr bench --cases speculation --spec-levels 1,2 --spec-rounds 2 --spec-servers "dgr off,dgr auto" \
      --spec-workloads "table to JSON,templated burst" --out $OUT/ab-$v-$r > $OUT/ab-$v-$r.log 2>&1
    python3 /work/main/evidence/DGR-026/per_round.py $OUT/ab-$v-$r/bench.json | cut -d'|' -f2-4 | sed 's/ *$//'
  done
done
