"""What a decode step of the same rows costs beside longer or shorter contexts: a
node (16 slots of 2,048 cells, `--speculation auto`, every request `off`, so no
step drafts) runs five workloads of the speculation bench at c = 16 then 8;
per step its output rows, whether it prefilled, its seconds, the KV cells held
after it (BatchLoop.cells_used) and the cells its decode rows' own sequences
hold. Written to cells.json; fit.py reads it.

    python evidence/DGR-026/row-context/row_context.py OUT.json
"""

import json
import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import dgr  # noqa: E402
from benchmarks.speculation import N_NEW, WORKLOADS  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402

RUNS = [(w, c) for w in ("code edit", "templated burst", "natural text", "quoting summary",
                         "templated burst") for c in (16, 8)]


async def one(node, prompt):
    params = dgr.SamplingParams(max_tokens=N_NEW, temperature=0.0, speculation="off",
                                ignore_eos=True)
    async with node.stream(prompt, params) as chunks:
        async for _ in chunks:
            pass


async def main(out):
    config = dgr.NodeConfig(model_path=resolve_model_path(None), max_running=16,
                            n_ctx=16 * 2048, speculation="auto")
    steps = []
    async with dgr.open_node(config) as node:
        loop = node._loop
        ended = loop._on_step_ended

        def record(event, now):
            figures = event.figures
            prefilled = bool(loop._step_prefill)
            decoded = set(loop._step_decode)
            own = sum(loop.batch.pos_max(slot) + 1 for slot, session in loop._by_slot.items()
                      if session.id in decoded)
            ended(event, now)
            steps.append({"rows": figures["decode_rows"] + figures["draft_rows"],
                          "prefilled": prefilled, "seconds": figures["total_s"],
                          "cells": loop.batch.cells_used, "own_cells": own})

        loop._handlers = {kind: record if handler == ended else handler
                          for kind, handler in loop._handlers.items()}
        for n, (workload, c) in enumerate(RUNS):
            first = len(steps)
            async with trio.open_nursery() as nursery:
                for i in range(c):
                    nursery.start_soon(one, node, WORKLOADS[workload](10_000 * n + i)[0])
            for step in steps[first:]:
                step["run"] = f"{workload} c={c}"
            print(f"{workload} c={c}: {len(steps) - first} steps", flush=True)
    Path(out).write_text(json.dumps(steps))


trio.run(main, sys.argv[1])
