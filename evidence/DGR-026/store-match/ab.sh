#!/bin/bash
# A (HEAD 3e3037b: the 4-gram store, last place followed) and B (the longest match, cut
# where answers disagree) alternating: the bench's speculation case, dgr only
set -e
OUT=${OUT:-/tmp/p}   # the runs' folders and logs
for r in 1 2 3; do
  for v in A B; do
    d=/tmp/A; [ $v = B ] && d=/work/main
    cd $d
    echo "=== round $r $v $(date +%T)"
    python -m dgr bench --cases speculation --spec-levels 1,2,4 --spec-rounds 2 --spec-servers dgr \
      --spec-workloads "templated burst,table to JSON" --out $OUT/ab-$v-$r > $OUT/ab-$v-$r.log 2>&1
    python3 /work/main/evidence/DGR-026/per_round.py $OUT/ab-$v-$r/bench.json | cut -d'|' -f2-4 | sed 's/ *$//'
  done
done
