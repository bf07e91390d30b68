"""Two builds of dgr, both --speculation auto, paired as paired/paired.py pairs off and
auto: both nodes up at once (the bench's settings: 16 slots of 2,048 cells, 2 threads,
its warm-up), each cell run on one and then the other back to back, which first
alternating by round and cell; the bench's prompts and measure.

    python evidence/DGR-026/realign/paired_builds.py A_ROOT B_ROOT OUT ROUNDS LEVELS WORKLOADS
    e.g. paired_builds.py /tmp/A /work/main /tmp/p/ab 16 1,2 "templated burst"

A_ROOT and B_ROOT are checkouts with their extensions built in place; each node runs
`python -m dgr` from its root. Prints each round's B / A per cell and, per cell, the
median, geometric mean and the geometric mean's 95 % interval from a bootstrap over
rounds; writes every run's figures to OUT/paired.json."""

import json
import math
import os
import pathlib
import random
import statistics
import subprocess
import sys

import trio

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3]))

from benchmarks import speculation as spec  # noqa: E402
from benchmarks.servers import dgr_server, free_port  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402

roots = {"A": pathlib.Path(sys.argv[1]), "B": pathlib.Path(sys.argv[2])}
out = pathlib.Path(sys.argv[3])
rounds = int(sys.argv[4])
levels = [int(x) for x in sys.argv[5].split(",")]
workloads = sys.argv[6].split(",")
out.mkdir(parents=True, exist_ok=True)
model = resolve_model_path(None)
for name, root in roots.items():
    head = subprocess.run(["git", "-C", str(root), "log", "--format=%h", "-1"],
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", str(root), "status", "--short", "dgr"],
                           capture_output=True, text=True).stdout.strip()
    print(f"{name}: {root} at {head}{' with changes to dgr/' if dirty else ''}")


def started(name):
    """The node of build `name`, started from its root."""
    here = os.getcwd()
    os.chdir(roots[name])
    try:
        srv = dgr_server(model, 16, 2048, 2, free_port(), ["--speculation", "auto"],
                         log=out / f"{name}.log")
        srv.__enter__()
        return srv
    finally:
        os.chdir(here)


rows = []
nodes = {}
try:
    for name in roots:
        nodes[name] = started(name)
    for srv in nodes.values():  # the bench's warm-up, untimed
        trio.run(spec.run_level, srv.url, next(iter(spec.WORKLOADS)), max(levels), True,
                 {"speculation": "off"}, 90_000)
    for r in range(rounds):
        for cell, (workload, c) in enumerate((w, c) for w in workloads for c in levels):
            offset = 100 * r + 1000 * c
            order = ["A", "B"] if (r + cell) % 2 == 0 else ["B", "A"]
            got, row = {}, {}
            for name in order:
                before = spec._spec_counts(nodes[name].url)
                res = trio.run(spec.run_level, nodes[name].url, workload, c, True, None, offset)
                after = spec._spec_counts(nodes[name].url)
                got[name] = res
                row[name] = {"round": r, "workload": workload, "c": c, "build": name,
                             "first": name == order[0], "decode_tok_s": res["decode_tok_s"],
                             "wall_tok_s": res["wall_tok_s"], "drafted": after[0] - before[0],
                             "accepted": after[1] - before[1]}
            same = got["A"]["texts"] == got["B"]["texts"]
            for name in order:
                rows.append(row[name] | {"equal": same})
            print(f"round {r} {workload} c={c} ({order[0]} first): A "
                  f"{got['A']['decode_tok_s']:.1f} B {got['B']['decode_tok_s']:.1f} ratio "
                  f"{got['B']['decode_tok_s'] / got['A']['decode_tok_s']:.3f} drafted/accepted "
                  f"A {row['A']['drafted']:.0f}/{row['A']['accepted']:.0f} "
                  f"B {row['B']['drafted']:.0f}/{row['B']['accepted']:.0f} equal {same}",
                  flush=True)
finally:
    for srv in nodes.values():
        srv.__exit__(None, None, None)
(out / "paired.json").write_text(json.dumps(rows, indent=1))

rng = random.Random(0)
print("\n| workload | c | rounds | median B/A | geometric mean | 95 % interval (bootstrap) | "
      "drafted, accepted A | B | A = B |")
print("|---|---|---|---|---|---|---|---|---|")
for workload in workloads:
    for c in levels:
        pairs = {}
        for row in rows:
            if row["workload"] == workload and row["c"] == c:
                pairs.setdefault(row["round"], {})[row["build"]] = row
        logs = [math.log(p["B"]["decode_tok_s"] / p["A"]["decode_tok_s"])
                for p in pairs.values()]
        means = sorted(statistics.fmean(rng.choices(logs, k=len(logs))) for _ in range(10_000))
        counts = {name: (sum(p[name]["drafted"] for p in pairs.values()),
                         sum(p[name]["accepted"] for p in pairs.values())) for name in roots}
        print(f"| {workload} | {c} | {len(logs)} | {math.exp(statistics.median(logs)):.3f} | "
              f"{math.exp(statistics.fmean(logs)):.3f} | {math.exp(means[250]):.3f}-"
              f"{math.exp(means[9750]):.3f} | {counts['A'][0]:.0f}, {counts['A'][1]:.0f} | "
              f"{counts['B'][0]:.0f}, {counts['B'][1]:.0f} | "
              f"{all(p['A']['equal'] for p in pairs.values())} |")
