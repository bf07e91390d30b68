"""Per workload and c, from bench.json files of the speculation case with dgr's two
nodes: the median over rounds of auto / off (decode tok/s, wall tok/s) and of the
last session's first token (seconds from the requests), auto and off.

    python3 summary.py RUN/bench.json [...]
"""
import json
import statistics
import sys

for path in sys.argv[1:]:
    rows = json.load(open(path))["speculation"]["rows"]
    cells = {}
    for row in rows:
        cells.setdefault((row["workload"], row["c"], row["round"]), {})[row["server"]] = row
    out = {}
    for (workload, c, r), by in cells.items():
        if "dgr auto" in by and "dgr off" in by:
            auto, off = by["dgr auto"], by["dgr off"]
            out.setdefault((workload, c), []).append(
                (auto["decode_tok_s"] / off["decode_tok_s"], auto["wall_tok_s"] / off["wall_tok_s"],
                 max(auto["first_s"]), max(off["first_s"])))
    print(path)
    print("| workload | c | decode auto/off | wall auto/off | last first token auto, off s |")
    print("|---|---|---|---|---|")
    for (workload, c), values in out.items():
        med = [statistics.median(v[i] for v in values) for i in range(4)]
        print(f"| {workload} | {c} | {med[0]:.2f} | {med[1]:.2f} | {med[2]:.2f}, {med[3]:.2f} |")
