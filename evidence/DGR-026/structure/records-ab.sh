#!/bin/bash
# A (d144248, in a worktree at /tmp/B: a session's acceptance record per source) and B (the
# working tree then, not kept: p from the session's record of the source, beside its record
# of all its drafts, beside the source's node-wide one) alternating, 2 runs each: the bench's
# speculation case, dgr's two nodes, c = 1 and 2
OUT=${OUT:-/tmp/p/ab3}   # the runs' folders and logs
for r in 1 2; do
  for v in A B; do
    d=/tmp/B; [ $v = B ] && d=/work/main
    cd $d
    echo "=== round $r $v $(date +%T)"
    python -m dgr bench --cases speculation --spec-levels 1,2 --spec-rounds 2 --spec-servers "dgr off,dgr auto" \
      --spec-workloads "code edit,quoting summary,table to JSON,templated burst" --out $OUT/ab-$v-$r > $OUT/ab-$v-$r.log 2>&1
    python3 /work/main/evidence/DGR-026/per_round.py $OUT/ab-$v-$r/bench.json | cut -d'|' -f2-4 | sed 's/ *$//'
  done
done
