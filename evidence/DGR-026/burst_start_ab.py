"""burst_start.py's bursts (the bench's "table to JSON", c at once, in process, default
model) from two checkouts, alternating: per round and tree, each run's steps and
seconds (a node's first run is before its step-time fit, so it is left out of the
medians).

    git worktree add /tmp/dgr-old REV && (cd /tmp/dgr-old && python3 setup.py build_ext --inplace)
    python3 evidence/DGR-026/burst_start_ab.py --before /tmp/dgr-old [--rounds 3] [--c 8]
"""

import argparse
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]

parser = argparse.ArgumentParser()
parser.add_argument("--before", required=True, help="a built checkout of the earlier tree")
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--c", type=int, default=8)
parser.add_argument("--runs", type=int, default=4)
args = parser.parse_args()
trees = {"before": args.before, "this tree": str(ROOT)}
fitted = {name: [] for name in trees}
print("| round | tree | steps a run | seconds a run |")
print("|---|---|---|---|")
for r in range(args.rounds):
    for name, path in trees.items():
        out = subprocess.run([sys.executable, str(HERE / "burst_start.py"), "--c", str(args.c),
                              "--runs", str(args.runs)], check=True, capture_output=True,
                             text=True, cwd=path, env={**os.environ, "PYTHONPATH": path}).stdout
        runs = [(int(n), float(s)) for n, s in re.findall(r"run \d+: (\d+) steps, ([\d.]+) s", out)]
        fitted[name] += runs[1:]
        print(f"| {r} | {name} | {', '.join(str(n) for n, _ in runs)} | "
              f"{', '.join(f'{s:.2f}' for _, s in runs)} |", flush=True)
print()
for name, runs in fitted.items():
    print(f"{name}, runs after the first: median {statistics.median(n for n, _ in runs)} steps, "
          f"{statistics.median(s for _, s in runs):.2f} s")
