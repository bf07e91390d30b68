#!/bin/bash
# A (3cfba44, in a worktree at /tmp/A: auto drafts nothing while a prompt waits) and
# B (the working tree: beside waiting prompts, rows more likely taken than not)
# alternating, 2 runs each: the bench's speculation case, dgr's two nodes, c = 2-16;
# and its mixed-load case (4 greedy decoders, dgr at its defaults, a long prompt after 3 s)
OUT=${OUT:-/tmp/p/bp}   # the runs' folders and logs
for r in 1 2; do
  for v in A B; do
    d=/tmp/A; [ $v = B ] && d=/work/main
    cd $d
    echo "=== run $r $v $(date +%T)"
    python -m dgr bench --cases speculation --spec-levels 2,4,8,16 --spec-rounds 2 \
      --spec-servers "dgr off,dgr auto" \
      --spec-workloads "code edit,quoting summary,table to JSON,natural text" \
      --out $OUT/ab-$v-$r > $OUT/ab-$v-$r.log 2>&1
    python3 /work/main/evidence/DGR-026/beside-prompts/summary.py $OUT/ab-$v-$r/bench.json
    python -m dgr bench --cases mixed --mixed-stalls 3 --out $OUT/mixed-$v-$r > $OUT/mixed-$v-$r.log 2>&1
    grep "^| \(mixed\|dgr\|llama\)" $OUT/mixed-$v-$r/bench.md
  done
done
