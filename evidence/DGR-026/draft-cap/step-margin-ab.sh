#!/bin/bash
# A (92837c2, the per-session margin, a worktree at /tmp/A) and B (/work/main: the margin on
# the step's drafts together as well) alternating, 2 runs each: the speculation case with
# dgr's two nodes at c = 16, the templated burst and natural text, 2 rounds a run
OUT=${OUT:-/tmp/p/step-margin}
mkdir -p $OUT
for r in 1 2; do
  for v in A B; do
    d=/tmp/A; [ $v = B ] && d=/work/main
    cd $d
    echo "=== run $r $v $(date +%T)"
    python -m dgr bench --cases speculation --spec-levels 16 --spec-rounds 2 \
      --spec-servers "dgr off,dgr auto" --spec-workloads "templated burst,natural text" \
      --out $OUT/$v-$r > $OUT/$v-$r.log 2>&1
    python3 /work/main/evidence/DGR-026/per_round.py $OUT/$v-$r/bench.json
    awk 'NF==0 && n>0 {exit} /^\| (templated|natural)/ {print; n++}' $OUT/$v-$r/bench.md
  done
done
