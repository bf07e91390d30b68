#!/bin/bash
# A (HEAD in a worktree at /tmp/A: auto drafts nothing while a prompt waits) and B (the
# working tree: beside waiting prompts, rows more likely taken than not, their time out
# of the prompts' share of the decode-stall bound) alternating, 2 runs each: the
# bench's mixed-load case, and its speculation case with dgr's two nodes, the code edit
# and natural text at c = 4 and 16, 2 rounds a run
OUT=${OUT:-/tmp/p/bound}   # the runs' folders and logs
for r in 1 2; do
  for v in A B; do
    d=/tmp/A; [ $v = B ] && d=/work/main
    cd $d
    echo "=== run $r $v $(date +%T)"
    python -m dgr bench --cases mixed --mixed-stalls 3 --out $OUT/mixed-$v-$r > $OUT/mixed-$v-$r.log 2>&1
    grep "^| \(mixed\|dgr\|llama\)" $OUT/mixed-$v-$r/bench.md
    python -m dgr bench --cases speculation --spec-levels 4,16 --spec-rounds 2 \
      --spec-servers "dgr off,dgr auto" --spec-workloads "code edit,natural text" \
      --out $OUT/ab-$v-$r > $OUT/ab-$v-$r.log 2>&1
    python3 /work/main/evidence/DGR-026/beside-prompts/summary.py $OUT/ab-$v-$r/bench.json
  done
done
