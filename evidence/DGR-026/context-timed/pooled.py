"""Every round of the templated burst in this folder's runs, pooled per tree: auto / off
per round (decode tok/s), their count, median, min and max, at c = 8 and 16. "before"
is A (d5b2331) of ab1 and ab3; "context-timed" is B (0009cd1) of ab1 and ab3 and the
runs of more-rounds.sh (d5f62e9). ab3 ran c = 16 only.

    python evidence/DGR-026/context-timed/pooled.py   (from the repository root)
"""

import json
import statistics
from pathlib import Path

HERE = Path(__file__).parent
TREES = {"before": ["ab1/A1", "ab1/A2", "ab3/A1", "ab3/A2"],
         "context-timed": ["ab1/B1", "ab1/B2", "ab3/B1", "ab3/B2", "more/M1", "more/M2"]}


def ratios(run, c):
    rows = json.loads((HERE / run / "bench.json").read_text())["speculation"]["rows"]
    rate = {(r["round"], r["server"]): r["decode_tok_s"] for r in rows
            if r["workload"] == "templated burst" and r["c"] == c}
    return [rate[r, "dgr auto"] / rate[r, "dgr off"] for r in sorted({r for r, _ in rate})]


for c in (8, 16):
    for tree, runs in TREES.items():
        values = [v for run in runs for v in ratios(run, c)]
        print(f"c = {c:2d} {tree:13s}: {len(values):2d} rounds, median "
              f"{statistics.median(values):.3f}, {min(values):.3f}-{max(values):.3f}")
