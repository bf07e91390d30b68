"""Run 34's dgr auto node's history in process: a fresh node with the bench's settings, the
code edit at c = 16 with speculation off (the bench's warm-up), then WORKLOAD (the code edit
unless named) with auto at c = 1, 2, 4; per run what it drafted, the trust, the acceptance
per source and the row times after it, and its steps with no prefill by decode rows.
--with-off runs off at each c first (as one node serving both modes did before run 34).

    PYTHONPATH=. python3 evidence/DGR-026/c2_probe.py [WORKLOAD] [--with-off]
"""
import pathlib
import sys

import trio

import dgr
from dgr.engine import resolve_model_path

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from step_gain import by_rows, one_run  # noqa: E402

WITH_OFF = "--with-off" in sys.argv
W = sys.argv[1] if len(sys.argv) > 1 and not sys.argv[1].startswith("--") else "code edit"

async def main():
    config = dgr.NodeConfig(model_path=resolve_model_path(None), max_running=16, max_waiting=64,
                            n_ctx=16 * 2048)
    async with dgr.open_node(config) as node:
        await one_run(node, "code edit", "off", 90000, 16)
        for c in (1, 2, 4):
            if WITH_OFF:
                await one_run(node, W, "off", 1000 * c + 50, c)
            rate, steps, _ = await one_run(node, W, "auto", 1000 * c, c)
            spec = node._loop.batch.scheduler.speculation
            print(f"{W} c={c}: {rate:.1f} tok/s, {sum(s.draft_rows for s in steps)} draft rows, "
                  f"{len(steps)} steps, trust {spec.trust():.2f}, acceptance {spec.acceptance()}")
            print("   row times: " + ", ".join(f"({r:.1f}, {1e3*s:.1f})" for r, s, _ in node._loop.row_times.points()))
            for (rows, wd), cell in sorted(by_rows(steps).items()):
                n, tok, sec, drafts, p_tok, p_s = cell
                print(f"   rows {rows} drafts {wd}: {n} steps, {drafts/n:.1f} dr/step, {tok/n:.2f} tok/step, {1e3*sec/n:.1f} ms")
trio.run(main)
