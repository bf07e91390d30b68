"""dgr auto's and ngram-simple's decode tok/s (median of a run's rounds) per workload, from
the A/B's runs (ab.sh's folders).

    python3 tok_s.py /tmp/p/cap
"""
import json
import statistics
import sys

for v in "AB":
    for r in (1, 2, 3):
        rows = json.load(open(f"{sys.argv[1]}/{v}-{r}/bench.json"))["speculation"]["rows"]
        out = []
        for w in ("code edit", "quoting summary", "templated burst"):
            a = [x["decode_tok_s"] for x in rows if x["workload"] == w and x["server"] == "dgr auto"]
            s = [x["decode_tok_s"] for x in rows
                 if x["workload"] == w and x["server"] == "llama-server ngram-simple"]
            out.append(f"{w}: auto {statistics.median(a):.1f} simple {statistics.median(s):.1f}")
        print(v, r, " | ".join(out))
