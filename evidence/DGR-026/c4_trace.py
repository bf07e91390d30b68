"""WORKLOAD at c sessions in process (the code edit at c = 4 unless named): a fresh node
with the bench's dgr settings, the bench's warm-up (the code edit at c = 16, speculation
off), then the workload with auto and with off; per step of the auto run its decode rows,
prefill tokens, draft rows, tokens, the plan's expectation and its time; after it the
node's trust, acceptance per source and row times.

    PYTHONPATH=. python3 evidence/DGR-026/c4_trace.py ["code edit" 4]
"""
import pathlib
import sys

import trio

import dgr
from dgr.engine import resolve_model_path

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from step_gain import one_run  # noqa: E402

W = sys.argv[1] if len(sys.argv) > 1 else "code edit"
C = int(sys.argv[2]) if len(sys.argv) > 2 else 4


async def main():
    config = dgr.NodeConfig(model_path=resolve_model_path(None), max_running=16, max_waiting=64,
                            n_ctx=16 * 2048)
    async with dgr.open_node(config) as node:
        await one_run(node, "code edit", "off", 90000, 16)
        for mode in ("auto", "off"):
            rate, steps, _ = await one_run(node, W, mode, 1000 * C + (50 if mode == "off" else 0), C)
            print(f"{W} c={C} {mode}: {rate:.1f} tok/s, {len(steps)} steps")
            if mode != "auto":
                continue
            for s in steps:
                print(f"  decode {len(s.decode)} prefill {sum(e - b for _, b, e in s.prefill)} "
                      f"drafts {s.draft_rows} tokens {s.generated} planned {s.planned[0]:.1f} / "
                      f"{1e3 * s.planned[1]:.0f} ms, took {1e3 * s.duration_s:.0f} ms")
            spec = node._loop.batch.scheduler.speculation
            print(f"  trust {spec.trust():.2f}; acceptance {spec.acceptance()}")
            print("  row times (rows, ms): " + ", ".join(
                f"({r:.1f}, {1e3 * t:.1f})" for r, t, _ in node._loop.row_times.points()))


trio.run(main)
