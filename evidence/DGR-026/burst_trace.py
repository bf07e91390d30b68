"""The bench's templated burst in process (default model, greedy, 96 tokens each,
benchmarks/speculation.py's prompts), c = 8 then 16 on one node as the bench runs
them, speculation off and auto alternating, 2 rounds: per run the decode tok/s as
the bench counts it, the steps and their summed time, when each session got its
last token (seconds from the first session's first); for auto, every step with
drafts (decode + draft rows, tokens, what the policy planned: tokens and ms, and
what it took), the node's trust and row times after the run.

    python evidence/DGR-026/burst_trace.py
"""

import sys
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import dgr  # noqa: E402
from benchmarks.speculation import N_NEW, WORKLOADS  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402


async def one_run(node, c, mode, offset):
    build = WORKLOADS["templated burst"]
    stamps = [[] for _ in range(c)]

    async def one(i):
        prompt, _ = build(offset + i)
        params = dgr.SamplingParams(max_tokens=N_NEW, temperature=0.0, speculation=mode,
                                    ignore_eos=True)
        async with node.stream(prompt, params) as chunks:
            async for chunk in chunks:
                if chunk.token_id is not None:
                    stamps[i].append(time.perf_counter())

    first_step = node.steps[-1].index if node.steps else -1
    async with trio.open_nursery() as nursery:
        for i in range(c):
            nursery.start_soon(one, i)
    steps = [s for s in node.steps if s.index > first_step]
    start = min(s[0] for s in stamps)
    lasts = sorted(round(s[-1] - start, 1) for s in stamps)
    return sum(len(s) - 1 for s in stamps) / (lasts[-1]), steps, lasts


async def main():
    config = dgr.NodeConfig(model_path=resolve_model_path(None), max_running=16,
                            max_waiting=64, n_ctx=16 * 2048)
    async with dgr.open_node(config) as node:
        await one_run(node, 16, "off", 90000)  # warm up, as the bench does
        for r in range(2):
            for c in (8, 16):
                order = ("off", "auto") if r % 2 == 0 else ("auto", "off")
                for k, mode in enumerate(order):
                    offset = 1000 * r + 100 * k + 10000 * c
                    rate, steps, lasts = await one_run(node, c, mode, offset)
                    print(f"r{r} c={c} {mode}: {rate:.1f} tok/s, {len(steps)} steps, "
                          f"{sum(s.duration_s for s in steps):.2f} s; last tokens at {lasts}")
                    if mode != "auto":
                        continue
                    for s in steps:
                        if s.draft_rows:
                            print(f"   step {s.index}: rows {len(s.decode)}+{s.draft_rows}, "
                                  f"{s.generated} tokens (planned {s.planned[0]:.1f}), "
                                  f"planned {1e3 * s.planned[1]:.0f} ms, took "
                                  f"{1e3 * s.duration_s:.0f} ms")
                    spec = node._loop.batch.scheduler.speculation
                    points = node._loop.row_times.points()
                    print(f"   trust {spec.trust():.2f}; row times (rows, ms) " + ", ".join(
                        f"({rows:.1f}, {1e3 * sec:.0f})" for rows, sec, _ in points))


trio.run(main)
