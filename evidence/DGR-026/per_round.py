"""Per-round ratios of a speculation bench run (its bench.json), with their median,
min and max: dgr auto / dgr off, / llama-server, / llama-server's better n-gram mode
(decode tok/s, the servers of the same round).

    python evidence/DGR-026/per_round.py evidence/DGR-026/run11/bench.json
"""
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.speculation import AUTO, OFF  # noqa: E402

result = json.load(open(sys.argv[1]))["speculation"]
cells: dict = {}
for row in result["rows"]:
    cells.setdefault((row["workload"], row["c"], row["round"]), {})[row["server"]] = row["decode_tok_s"]
peers = {"off": OFF, "llama-server": "llama-server"}
print("| workload | c | auto / off | auto / llama-server | auto / better n-gram |")
print("|---|---|---|---|---|")
for workload, c in dict.fromkeys((w, c) for w, c, _ in cells):
    ratios: dict = {"off": [], "llama-server": [], "n-gram": []}
    for (w, cc, r), v in sorted(cells.items()):
        if (w, cc) != (workload, c) or not v.get(AUTO):
            continue
        for key, server in peers.items():
            if v.get(server):
                ratios[key].append(v[AUTO] / v[server])
        ngram = [t for s, t in v.items() if s.startswith("llama-server ") and t]
        if ngram:
            ratios["n-gram"].append(v[AUTO] / max(ngram))

    def show(values):
        if not values:
            return "-"
        rounds = ", ".join(f"{x:.2f}" for x in values)
        return f"{statistics.median(values):.2f} ({rounds})"

    print(f"| {workload} | {c} | {show(ratios['off'])} | {show(ratios['llama-server'])} | "
          f"{show(ratios['n-gram'])} |")
