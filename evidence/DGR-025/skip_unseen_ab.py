"""A/B of two llama-cpp-python wheels that differ by one patch, alternating: patch 0009
(flash attention skips runs of unseen cells: A with 0001-0008, B with 0001-0009),
patch 0011 (a KQ mask row visits only its sequence's cells: A with 0001-0010, B with
0001-0011), patch 0012 (ordered cells fill blocks: A with 0001-0011, B with
0001-0012) and 0009's runs of 32 (A: 0009 skipping runs of 8, B: runs of 32 then 8).

Two llama-cpp-python wheels built from the pinned tree are installed in turn (pip, seconds: both are in the wheel
cache) and each round measures, in a fresh process for each wheel:

- tiny: the tiny test model, 64 sessions at once in a 32,768-cell pool, 256
  tokens each (greedy, ignore_eos): mean seconds of a decode-only step;
- long: the default model, 16 sessions with distinct ~600-token prompts in one
  pool, 64 tokens each: mean seconds of a decode-only step;
- short: the default model, 1 session, 64 tokens: mean seconds of a step;

and a digest of every session's tokens and log-probabilities, which must be the
same under both wheels (bitwise).

    python evidence/DGR-025/skip_unseen_ab.py WHEEL_A WHEEL_B [--rounds 4]
"""

import argparse
import hashlib
import json
import statistics
import subprocess
import sys

ONE = r"""
import hashlib, json, statistics, sys, tempfile, trio, dgr
from pathlib import Path
from dgr.engine import resolve_model_path
from dgr.testmodel import write_test_model

def decode_only(node):
    return statistics.mean(s.duration_s for s in node.steps if s.decode and not s.prefill)

async def case(model, n, prompts, n_new, ctx):
    config = dgr.NodeConfig(model_path=model, max_running=n, max_waiting=0, n_ctx=ctx,
                            prefill_sessions_per_step=min(n, 16))
    params = dgr.SamplingParams(max_tokens=n_new, ignore_eos=True, logprobs=1)
    async with dgr.open_node(config) as node:
        results = [None] * n
        async with trio.open_nursery() as nursery:
            async def one(i):
                results[i] = await node.generate(prompts[i], params)
            for i in range(n):
                nursery.start_soon(one, i)
        digest = hashlib.sha256(json.dumps([(r.token_ids, r.token_logprobs) for r in results]).encode()).hexdigest()[:16]
        return decode_only(node), digest

tiny = str(write_test_model(Path(tempfile.mkdtemp()) / "tiny.gguf"))
default = resolve_model_path(None)
base = "The committee reviewed the annual report on regional water supplies, noting changes in rainfall, reservoir levels and demand. "
long_prompts = [f"Report {i}. " + base * 30 for i in range(16)]
out = {}
out["tiny"] = trio.run(case, tiny, 64, [f"Story {i}: once upon a time" for i in range(64)], 256, 32768)
out["long"] = trio.run(case, default, 16, long_prompts, 64, 16 * 1200)
out["short"] = trio.run(case, default, 1, ["The history of the Roman Empire begins with"], 64, 1024)
print(json.dumps(out))
"""

parser = argparse.ArgumentParser()
parser.add_argument("a")
parser.add_argument("b")
parser.add_argument("--rounds", type=int, default=4)
args = parser.parse_args()
cases = ("tiny", "long", "short")
ratios = {c: [] for c in cases}
digests = {}
print("| round | wheel | " + " | ".join(f"{c}: decode-only step ms" for c in cases) + " |")
print("|---|---|" + "---|" * len(cases))
for r in range(args.rounds):
    got = {}
    for name, wheel in (("A", args.a), ("B", args.b)):
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps",
                        "--force-reinstall", wheel], check=True, capture_output=True)
        run = subprocess.run([sys.executable, "-c", ONE], capture_output=True, text=True,
                             check=True)
        got[name] = json.loads(run.stdout.strip().splitlines()[-1])
        for c in cases:
            digests.setdefault(c, set()).add(got[name][c][1])
        print(f"| {r} | {name} | " + " | ".join(f"{1000 * got[name][c][0]:.2f}" for c in cases)
              + " |", flush=True)
    for c in cases:
        ratios[c].append(got["A"][c][0] / got["B"][c][0])
print()
print("| case | A / B step time (B faster above 1): median | min | max | outputs bitwise equal |")
print("|---|---|---|---|---|")
for c in cases:
    v = ratios[c]
    print(f"| {c} | {statistics.median(v):.3f} | {min(v):.3f} | {max(v):.3f} | "
          f"{'yes' if len(digests[c]) == 1 else 'NO: ' + ', '.join(sorted(digests[c]))} |")
