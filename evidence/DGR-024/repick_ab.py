"""A/B of how a pick the grammar rejects is redone: two checkouts, alternating.

Each round runs, in one subprocess per checkout (A first, then B), the grammar
case's tool-call row (benchmarks/grammar.py): 8 greedy sessions beside a sampled
9th session, then beside a 9th under a tool call's grammar (tool_choice
"required", temperature 0.7), and prints each ratio.

    python evidence/DGR-024/repick_ab.py A_CHECKOUT B_CHECKOUT [--rounds 4]
"""

import argparse
import json
import statistics
import subprocess
import sys

ONE = """
import json, os, sys, trio
from benchmarks import grammar
from dgr import tools
from dgr.engine import resolve_model_path
model = resolve_model_path(None)
spec = tools.ToolSpec((grammar.TOOL,), "required", False)
prompt = tools.system_prompt(spec) + "\\n" + grammar.NINTH
sampled, _ = trio.run(grammar.eight_beside, model, os.cpu_count(), None, 96)
called, ended = trio.run(grammar.eight_beside, model, os.cpu_count(), tools.grammar(spec), 96,
                         prompt)
print(json.dumps({"sampled": sampled, "tool_call": called, "ended": ended}))
"""

parser = argparse.ArgumentParser()
parser.add_argument("a")
parser.add_argument("b")
parser.add_argument("--rounds", type=int, default=4)
args = parser.parse_args()
ratios = {"A": [], "B": []}
print("| round | checkout | beside sampled tok/s | beside tool call tok/s | ratio |")
print("|---|---|---|---|---|")
for r in range(args.rounds):
    for name, tree in (("A", args.a), ("B", args.b)):
        out = subprocess.run([sys.executable, "-c", ONE], cwd=tree, env={"PYTHONPATH": tree},
                             capture_output=True, text=True, check=True)
        got = json.loads(out.stdout.strip().splitlines()[-1])
        ratio = got["tool_call"] / got["sampled"]
        ratios[name].append(ratio)
        print(f"| {r} | {name} | {got['sampled']:.1f} | {got['tool_call']:.1f} | {ratio:.3f} |",
              flush=True)
for name, values in ratios.items():
    print(f"{name}: median {statistics.median(values):.3f}, "
          f"min {min(values):.3f}, max {max(values):.3f}")
