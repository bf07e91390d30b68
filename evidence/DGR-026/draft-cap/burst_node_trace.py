"""The templated burst in process as the bench's auto node sees it: a fresh node
(`--speculation auto`, 16 slots of 2,048 cells), the bench's untimed warm-up (its
first workload's prompts, the code edit's, at c = 16, speculation off), then for each of 2 rounds c = 8 and 16,
each after its earlier user's request (untimed). Per run the decode tok/s as the bench
counts it and every step with drafts: decode + draft rows, tokens, what the policy
planned (tokens and ms) and what the step took.

    python evidence/DGR-026/draft-cap/burst_node_trace.py
"""

import sys
import time
from contextlib import asynccontextmanager
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import dgr  # noqa: E402
from benchmarks.speculation import EARLIER_USER, N_NEW, WORKLOADS  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402

BUILD = WORKLOADS["templated burst"]


async def one(node, i, mode, stamps, build=BUILD):
    prompt, _ = build(i)
    params = dgr.SamplingParams(max_tokens=N_NEW, temperature=0.0, speculation=mode,
                                ignore_eos=True)
    async with node.stream(prompt, params) as chunks:
        async for chunk in chunks:
            if chunk.token_id is not None:
                stamps.append(time.perf_counter())


async def burst(node, c, offset, mode="auto", started=None):
    """c sessions after their earlier user's request (`started(node)` called between):
    decode tok/s as the bench counts it, and the node's steps from the first one's."""
    await one(node, offset + EARLIER_USER, mode, [])
    if started is not None:
        started(node)
    stamps = [[] for _ in range(c)]
    first_step = node.steps[-1].index if node.steps else -1
    async with trio.open_nursery() as nursery:
        for i in range(c):
            nursery.start_soon(one, node, offset + i, mode, stamps[i])
    steps = [s for s in node.steps if s.index > first_step]
    span = max(s[-1] for s in stamps) - min(s[0] for s in stamps)
    return sum(len(s) - 1 for s in stamps) / span, steps


@asynccontextmanager
async def open_warmed_node():
    """A fresh auto node as the bench's (16 slots of 2,048 cells), once it has served
    the bench's untimed warm-up: 16 code-edit prompts at once, speculation off."""
    config = dgr.NodeConfig(model_path=resolve_model_path(None), max_running=16,
                            n_ctx=16 * 2048, speculation="auto")
    async with dgr.open_node(config) as node:
        async with trio.open_nursery() as nursery:
            for i in range(16):
                nursery.start_soon(one, node, 90_000 + i, "off", [], WORKLOADS["code edit"])
        yield node


async def main():
    async with open_warmed_node() as node:
        for r in range(2):
            for c in (8, 16):
                rate, steps = await burst(node, c, 100 * r + 1000 * c)
                drafted = [s for s in steps if s.draft_rows]
                print(f"r{r} c={c}: {rate:.1f} tok/s, {len(steps)} steps, "
                      f"{sum(s.duration_s for s in steps):.2f} s, {len(drafted)} with drafts, "
                      f"draft rows {sum(s.draft_rows for s in drafted)}")
                for s in drafted:
                    print(f"   step {s.index}: rows {len(s.decode)}+{s.draft_rows}, "
                          f"{s.generated} tokens (planned {s.planned[0]:.1f}), planned "
                          f"{1e3 * s.planned[1]:.0f} ms, took {1e3 * s.duration_s:.0f} ms")


if __name__ == "__main__":
    trio.run(main)
