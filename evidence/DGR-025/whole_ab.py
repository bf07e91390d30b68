"""An in-process node (serving_layers.node_rate: the tiny model's 64 `Node.generate`
calls x 256 tokens, no HTTP) from two copies of the package, alternating: tokens per
second and the Trio thread's CPU a token, each the best of 3 loads in one process.

    sh evidence/DGR-025/snapshot.sh /tmp/dgr-A REV
    python evidence/DGR-025/whole_ab.py --before /tmp/dgr-A [--rounds 6]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
# dgr is imported first, from PYTHONPATH: serving_layers puts this checkout on sys.path
PROBE = f"""
import json, sys, tempfile
from pathlib import Path
import dgr
assert dgr.__file__.startswith(sys.argv[1]), dgr.__file__
sys.path.insert(0, {str(HERE)!r})
from serving_layers import node_rate
from engine_c64 import C
from dgr.testmodel import write_test_model
model = str(write_test_model(Path(tempfile.mkdtemp()) / "tiny.gguf"))
print(json.dumps(max(node_rate(model, C, 2) for _ in range(3))))
"""

parser = argparse.ArgumentParser()
parser.add_argument("--before", required=True, help="a snapshot.sh copy of the package")
parser.add_argument("--rounds", type=int, default=6)
args = parser.parse_args()
trees = {"A": args.before, "B (this tree)": str(ROOT)}
got = {name: [] for name in trees}
print("| round | tree | tok/s | Trio thread us/token |")
print("|---|---|---|---|")
for r in range(args.rounds):
    for name, path in trees.items():
        # run in the copy's folder: `-c` puts the working folder first on sys.path
        out = subprocess.run([sys.executable, "-c", PROBE, path], check=True, capture_output=True,
                             text=True, cwd=path, env={**os.environ, "PYTHONPATH": path}).stdout
        rate, trio_us = json.loads(out.splitlines()[-1])
        got[name].append((rate, trio_us))
        print(f"| {r} | {name} | {rate:.0f} | {trio_us:.1f} |", flush=True)
ratios = sorted(b[0] / a[0] for a, b in zip(*got.values()))
print()
print(f"B / A tok/s: median {statistics.median(ratios):.3f} ({ratios[0]:.3f}-{ratios[-1]:.3f})")
for name, rows in got.items():
    print(f"{name}: Trio thread us/token median {statistics.median(u for _, u in rows):.1f}")
