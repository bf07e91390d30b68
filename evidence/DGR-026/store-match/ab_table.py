"""Per (workload, c, A or B): each round's (auto / off, drafted, accepted) of the bench
runs ab.sh wrote into DIR (ab-A-1 ... ab-B-3).

    python3 ab_table.py DIR
"""
import collections
import json
import sys

rows=collections.defaultdict(list)
for v in "AB":
    for r in (1,2,3):
        try: b=json.load(open(f"{sys.argv[1]}/ab-{v}-{r}/bench.json"))
        except Exception: continue
        s=b['speculation']
        tok={}
        for x in s['rows']: tok[(x['workload'],x['c'],x['round'],x['server'])]=x['decode_tok_s']
        for a in s['acceptance']:
            k=(a['workload'],a['c'],a['round'])
            ratio=tok[k+('dgr auto',)]/tok[k+('dgr off',)]
            rows[(a['workload'],a['c'],v)].append((round(ratio,2),int(a['drafted']),int(a['accepted'])))
for k in sorted(rows):
    print(k, rows[k])
