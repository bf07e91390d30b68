"""ab.sh's four speculation runs side by side: per workload and c, auto / off (median
of each run's two rounds) for A's runs 1, 2 and B's, and the last session's first
token (seconds, median of the rounds), auto then off, for A's run 1 and B's run 1.

    python3 table.py OUT    (ab.sh's OUT: ab-A-1/bench.json ...)
"""
import json
import statistics
import sys

out = sys.argv[1]


def cells(path):
    rows = json.load(open(path))["speculation"]["rows"]
    by = {}
    for row in rows:
        by.setdefault((row["workload"], row["c"], row["round"]), {})[row["server"]] = row
    res = {}
    for (w, c, r), s in by.items():
        a, o = s["dgr auto"], s["dgr off"]
        res.setdefault((w, c), []).append((a["decode_tok_s"] / o["decode_tok_s"],
                                           max(a["first_s"]), max(o["first_s"])))
    return {k: [statistics.median(x[i] for x in v) for i in range(3)] for k, v in res.items()}


runs = {name: cells(f"{out}/ab-{name}/bench.json") for name in ("A-1", "A-2", "B-1", "B-2")}
print("| workload | c | A auto / off | B auto / off | last first token A (auto, off) s "
      "| B (auto, off) s |")
print("|---|---|---|---|---|---|")
for (w, c) in runs["A-1"]:
    a = [runs[n][(w, c)] for n in ("A-1", "A-2")]
    b = [runs[n][(w, c)] for n in ("B-1", "B-2")]
    print(f"| {w} | {c} | {a[0][0]:.2f}, {a[1][0]:.2f} | {b[0][0]:.2f}, {b[1][0]:.2f} | "
          f"{a[0][1]:.1f}, {a[0][2]:.1f} | {b[0][1]:.1f}, {b[0][2]:.1f} |")
