"""The templated burst in process as the bench's auto node sees it (as
../draft-cap/burst_node_trace.py: the code edit's warm-up at c = 16 with
speculation off, then 2 rounds of c = 8 and 16, each after its earlier user),
every request at speculation MODE: the row times the plan reads as each burst
starts (mean output rows, ms) and the fit, then per burst its decode tok/s, the
draft rows, and its steps without prefill by output rows, decode and draft rows
together (steps, median ms).

    python evidence/DGR-026/row-context/trace_points.py auto|off
"""
import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "draft-cap"))

from burst_node_trace import burst, open_warmed_node  # noqa: E402


def row_times(node):
    return [(rows, round(1e3 * s)) for rows, s, _ in node._loop.row_times.points() if rows <= 40]


def print_row_times(node):
    print("  points at burst start:", row_times(node))
    print("  fit:", node._loop.step_time.report())


async def main():
    mode = sys.argv[1]
    async with open_warmed_node() as node:
        print("after warm-up points:", row_times(node))
        for r in range(2):
            for c in (8, 16):
                rate, steps = await burst(node, c, 100 * r + 1000 * c, mode, print_row_times)
                decode_only = {}
                for s in steps:
                    if not s.prefill:
                        decode_only.setdefault(len(s.decode) + s.draft_rows, []).append(
                            1e3 * s.duration_s)
                print(f"r{r} c={c} {mode}: {rate:.1f} tok/s, {len(steps)} steps, "
                      f"drafts {sum(s.draft_rows for s in steps)}")
                print("   decode-only step ms by rows:",
                      {rows: (len(ms), round(sorted(ms)[len(ms) // 2]))
                       for rows, ms in sorted(decode_only.items())})


trio.run(main)
