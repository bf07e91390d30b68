"""Where a step's time goes in the templated burst at c = 16, dgr auto beside dgr off,
in process: the bench's warmed auto node (burst_node_trace.open_warmed_node), then per
round the same 16 prompts (after their earlier user, not counted) once with speculation
off and once auto (the order alternating by round). Per burst: decode tok/s as the
bench counts it, the steps, the draft rows, and the mean ms per step of the step's
phases (plan: mailbox, finish requests, the speculation policy with its draft search,
batch fill; decode: inside llama_decode; sample; update).

    python evidence/DGR-026/context-timed/phase_split.py [ROUNDS]
"""

import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "draft-cap"))

from burst_node_trace import burst, open_warmed_node  # noqa: E402

from dgr.telemetry import STEP_PHASES  # noqa: E402


async def main(rounds):
    async with open_warmed_node() as node:
        totals = node._loop._telemetry.step_totals
        for r in range(rounds):
            for mode in ("off", "auto") if r % 2 == 0 else ("auto", "off"):
                before = []  # the totals once the earlier user is served
                rate, steps = await burst(node, 16, 100 * r + 16_000, mode, lambda _: (
                    before.extend((dict(totals.phase_s), totals.steps))))
                n = totals.steps - before[1]
                ms = {p: 1e3 * (totals.phase_s[p] - before[0][p]) / n for p in STEP_PHASES}
                print(f"r{r} {mode:4s}: {rate:6.1f} tok/s, {len(steps)} steps, draft rows "
                      f"{sum(s.draft_rows for s in steps):3d}; ms per step: "
                      + ", ".join(f"{p} {v:6.2f}" for p, v in ms.items()), flush=True)


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 4)
