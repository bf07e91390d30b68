"""How a burst of the bench's "table to JSON" requests starts, in process on the default
model: c `Node.generate` calls at once (greedy, 96 tokens, speculation off), runs one
after another on one node; per run the steps and seconds, the first steps (decode
rows, prefill pieces' rows, ms) and the last ones (decode rows, ms).

    PYTHONPATH=. python3 evidence/DGR-026/burst_start.py [--c 8] [--runs 3]
"""

import argparse
import time

import trio

import dgr
from benchmarks.speculation import N_NEW, WORKLOADS
from dgr.engine import resolve_model_path

parser = argparse.ArgumentParser()
parser.add_argument("--c", type=int, default=8)
parser.add_argument("--runs", type=int, default=3)
args = parser.parse_args()


async def main():
    config = dgr.NodeConfig(model_path=resolve_model_path(None), max_running=args.c,
                            max_waiting=4 * args.c, n_ctx=args.c * 1024)
    async with dgr.open_node(config) as node:
        for run in range(args.runs):
            first = node.steps[-1].index if node.steps else -1

            async def one(i):
                prompt, extra = WORKLOADS["table to JSON"](100 * run + i)
                await node.generate(prompt, dgr.SamplingParams(
                    max_tokens=N_NEW, temperature=0.0, speculation="off", **extra))

            started = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for i in range(args.c):
                    nursery.start_soon(one, i)
            elapsed = time.perf_counter() - started
            steps = [s for s in node.steps if s.index > first]
            print(f"run {run}: {len(steps)} steps, {elapsed:.2f} s")
            print("  first:", [(len(s.decode), [end - start for _, start, end in s.prefill],
                                round(s.duration_s * 1e3)) for s in steps[:10]])
            print("  last:", [(len(s.decode), round(s.duration_s * 1e3)) for s in steps[-6:]])


trio.run(main)
