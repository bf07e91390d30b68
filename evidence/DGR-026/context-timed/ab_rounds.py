"""Round by round, per run of an A/B: dgr auto's decode tok/s over dgr off's and the
tokens auto drafted, per workload, c and round (the same round of two runs has the same
prompts and the same order of the two nodes), then each run's median.

    python evidence/DGR-026/context-timed/ab_rounds.py A1=DIR B1=DIR ...
"""

import json
import statistics
import sys
from pathlib import Path

runs = {}
for arg in sys.argv[1:]:
    name, path = arg.split("=", 1)
    result = json.loads((Path(path) / "bench.json").read_text())["speculation"]
    rate = {(r["workload"], r["c"], r["round"], r["server"]): r["decode_tok_s"]
            for r in result["rows"]}
    drafted = {(a["workload"], a["c"], a["round"]): a["drafted"] for a in result["acceptance"]}
    runs[name] = {key: (rate[(*key, "dgr auto")] / rate[(*key, "dgr off")], tokens)
                  for key, tokens in drafted.items()}
keys = sorted({key for cells in runs.values() for key in cells})
print("| workload | c | round | " + " | ".join(runs) + " |")
print("|---|---|---|" + "---|" * len(runs))
for key in keys:
    cells = [runs[name].get(key) for name in runs]
    shown = [f"{ratio:.3f} ({tokens:.0f})" if ratio is not None else "-"
             for ratio, tokens in (c if c else (None, None) for c in cells)]
    print(f"| {key[0]} | {key[1]} | {key[2]} | " + " | ".join(shown) + " |")
print()
print("auto / off (tokens drafted), per run: median of its rounds per workload and c")
for workload, c in dict.fromkeys((w, c) for w, c, _ in keys):
    line = []
    for name, cells in runs.items():
        ratios = [v[0] for k, v in cells.items() if k[:2] == (workload, c)]
        if ratios:
            line.append(f"{name} {statistics.median(ratios):.3f}")
    print(f"{workload} c={c}: " + ", ".join(line))
