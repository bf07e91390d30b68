#!/bin/bash
# A (HEAD in a worktree at /tmp/A: at most 48 drafts a session, 48 a step) and B (a
# worktree at /tmp/B: 96 and 96) alternating, 3 runs each: the speculation case at c = 1,
# dgr auto beside llama-server's two n-gram modes, the three quoting workloads whose
# drafts are taken whole or nearly, 3 rounds a run
OUT=${OUT:-/tmp/p/cap}   # the runs' folders and logs
mkdir -p $OUT
for r in 1 2 3; do
  for v in A B; do
    cd /tmp/$v
    echo "=== run $r $v $(date +%T)"
    python -m dgr bench --cases speculation --spec-levels 1 --spec-rounds 3 \
      --spec-servers "dgr auto,llama-server ngram-mod,llama-server ngram-simple" \
      --spec-workloads "code edit,quoting summary,templated burst" \
      --out $OUT/$v-$r > $OUT/$v-$r.log 2>&1
    python3 /work/main/evidence/DGR-026/per_round.py $OUT/$v-$r/bench.json
  done
done
