"""The bench's speculation workloads (benchmarks/speculation.py: greedy, 96 tokens, c
sessions at once) in process on the default model, from two copies of the package
alternating, each run on a fresh node: per workload, auto first (so the node's
store holds no answer of that workload yet), then off. Decode tok/s as the bench
counts it (step_gain.one_run), auto's steps and draft rows.

    sh evidence/DGR-025/snapshot.sh /tmp/dgr-A REV   (while this checkout's compiled modules are REV's)
    python evidence/DGR-026/drafts_ab.py --before /tmp/dgr-A [--c 1] [--rounds 4] [--workloads ...]
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


async def one_node(c: int, workloads: list[str]) -> dict:
    import dgr
    from dgr.engine import resolve_model_path
    from step_gain import one_run

    config = dgr.NodeConfig(model_path=resolve_model_path(None), max_running=c,
                            max_waiting=4 * c, n_ctx=c * 1024)
    runs = {}
    async with dgr.open_node(config) as node:
        for k, workload in enumerate(workloads):
            runs[workload] = {}
            for j, mode in enumerate(("auto", "off")):
                rate, steps, _ = await one_run(node, workload, mode, 100 * (2 * k + j), c)
                runs[workload][mode] = [rate, len(steps), sum(s.draft_rows for s in steps)]
    return {"dgr": dgr.__file__, "runs": runs}


parser = argparse.ArgumentParser()
parser.add_argument("--before", help="a snapshot.sh copy of the package (tree A)")
parser.add_argument("--c", type=int, default=1)
parser.add_argument("--rounds", type=int, default=4)
parser.add_argument("--workloads", nargs="*",
                    default=["table to JSON", "natural text", "code edit", "quoting summary"])
parser.add_argument("--one", action="store_true", help="one fresh node, this process")
args = parser.parse_args()

if args.one:
    import trio

    sys.path.insert(0, str(HERE))
    print(json.dumps(trio.run(one_node, args.c, args.workloads)))
    sys.exit(0)

trees = {"A": f"{args.before}{os.pathsep}{ROOT}", "B (this tree)": str(ROOT)}
got = {tree: {w: [] for w in args.workloads} for tree in trees}
print(f"c = {args.c}; per run: auto tok/s (steps, draft rows), off tok/s, auto / off")
print()
print("| round | tree | workload | auto | off | auto / off |")
print("|---|---|---|---|---|---|")
for r in range(args.rounds):
    for tree in (list(trees) if r % 2 == 0 else list(trees)[::-1]):
        out = subprocess.run(
            [sys.executable, __file__, "--one", "--c", str(args.c), "--workloads", *args.workloads],
            capture_output=True, text=True, cwd=ROOT, check=True,
            env=dict(os.environ, PYTHONPATH=trees[tree])).stdout.splitlines()[-1]
        result = json.loads(out)
        assert result["dgr"].startswith(trees[tree].split(os.pathsep)[0]), result["dgr"]
        for workload, modes in result["runs"].items():
            (auto, steps, drafts), (off, _, _) = modes["auto"], modes["off"]
            got[tree][workload].append((auto, off))
            print(f"| {r} | {tree} | {workload} | {auto:.1f} ({steps}, {drafts}) | {off:.1f} | "
                  f"{auto / off:.2f} |", flush=True)
print()
print("| workload | tree | auto / off: median (min-max) | auto tok/s: median |")
print("|---|---|---|---|")
for workload in args.workloads:
    for tree in trees:
        ratios = [a / o for a, o in got[tree][workload]]
        print(f"| {workload} | {tree} | {statistics.median(ratios):.2f} ({min(ratios):.2f}-"
              f"{max(ratios):.2f}) | {statistics.median(a for a, _ in got[tree][workload]):.1f} |")
