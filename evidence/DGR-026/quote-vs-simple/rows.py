"""Every run's tok/s in a bench.json of the speculation case: round, workload, server,
decode and wall tok/s, first-token seconds.

    python3 evidence/DGR-026/quote-vs-simple/rows.py BENCH_JSON
"""
import json, sys
for r in json.load(open(sys.argv[1]))["speculation"]["rows"]:
    print(r["round"], r["workload"], r["server"], f"decode {r['decode_tok_s']:.1f}",
          f"wall {r['wall_tok_s']:.1f}", "first_s", [round(x, 2) for x in r["first_s"]])
