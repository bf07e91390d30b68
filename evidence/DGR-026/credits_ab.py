"""Drafts cut by the reader's credits: the bench's quoting workloads (greedy, 96
tokens, c = 1) in process on the default model, on fresh nodes whose reply_buffer
alternates between two values by round, each node first running every workload
untimed (so that its step-time model has measured steps with drafts, as a bench
server's has after its first workloads); per run, auto's decode tok/s as the bench
counts it and its steps' output rows (a decode row and its drafts), off's tok/s.

A step is planned while the reader still holds the last step's tokens, so a session
with credits for one full step (a decode row and MAX_DRAFT drafts) drafts the next
step only as far as the credits it has back by then.

    PYTHONPATH=. python3 evidence/DGR-026/credits_ab.py [--buffers 64 98] [--rounds 4]
"""

import argparse
import statistics
import sys
from pathlib import Path

import trio

import dgr
from dgr.engine import resolve_model_path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_gain import one_run  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--buffers", type=int, nargs=2, default=[64, 98])
parser.add_argument("--rounds", type=int, default=4)
parser.add_argument("--workloads", nargs="*", default=["quoting summary", "code edit"])
args = parser.parse_args()


async def one_node(buffer: int, r: int, rates: dict) -> None:
    config = dgr.NodeConfig(model_path=resolve_model_path(None), max_running=1,
                            max_waiting=4, n_ctx=1024, reply_buffer=buffer)
    async with dgr.open_node(config) as node:
        for k, workload in enumerate(args.workloads):  # untimed: the step times measured
            await one_run(node, workload, "auto", 1000 * r + 100 * k + 500, 1)
        for k, workload in enumerate(args.workloads):
            off, _, _ = await one_run(node, workload, "off", 1000 * r + 100 * k, 1)
            auto, steps, _ = await one_run(node, workload, "auto", 1000 * r + 100 * k + 50, 1)
            rows = [1 + s.draft_rows for s in steps if not s.prefill]
            rates[(workload, buffer)].append(auto / off)
            print(f"| {r} | {buffer} | {workload} | {auto:.1f} | {rows} | {off:.1f} "
                  f"| {auto / off:.2f} |", flush=True)


rates = {(w, b): [] for w in args.workloads for b in args.buffers}
print("| round | reply_buffer | workload | auto tok/s | auto's steps: rows | off tok/s "
      "| auto / off |")
print("|---|---|---|---|---|---|---|")
for r in range(args.rounds):
    for buffer in args.buffers if r % 2 == 0 else args.buffers[::-1]:
        trio.run(one_node, buffer, r, rates)
print()
print("| workload | reply_buffer | auto / off: median (min-max) |")
print("|---|---|---|")
for (workload, buffer), v in rates.items():
    print(f"| {workload} | {buffer} | {statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f}) |")
