"""One bench round's c = 1 matrix in process, as trace.py runs it (prompt number 1000,
speculation auto after the warm-up's code edit off): per workload its steps and their
summed seconds; for the code edit and the quoting summary every step, for the others each
step with drafts (draft rows, tokens given, tokens planned, ms taken).

    python evidence/DGR-026/natural-c1/quoting_trace.py
"""

import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import dgr  # noqa: E402
from benchmarks.speculation import WORKLOADS  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402
from trace import one  # noqa: E402


async def main():
    config = dgr.NodeConfig(model_path=resolve_model_path(None), max_running=16,
                            max_waiting=64, n_ctx=16 * 2048)
    async with dgr.open_node(config) as node:
        await one(node, "code edit", 90000, "off")
        for workload in WORKLOADS:
            steps, _ = await one(node, workload, 1000, "auto")
            print(workload, len(steps), f"{sum(s.duration_s for s in steps):.3f} s")
            n = 0
            for s in steps:
                n += s.generated
                if workload in ("code edit", "quoting summary") or s.draft_rows:
                    print(f"   step {s.index} (at {n - s.generated}): {s.draft_rows} rows, "
                          f"{s.generated} tok, planned {s.planned[0]:.2f}, "
                          f"{1e3 * s.duration_s:.0f} ms")


trio.run(main)
