"""Where the bench's decode span goes at c > 1: the speculation workloads
(benchmarks/speculation.py: greedy, 96 tokens, c sessions at once) in process on
the default model, two speculation modes (off and auto unless told), from the
node's step records. The bench's decode tok/s counts the tokens after each
session's first over the span from the first session's first token to the last
session's last; this splits that span into the steps that also prefilled a prompt
and those that only decoded, says when the last session's first token came, and
gives the time of all the run's steps (the prompts' whole prefill too).

    PYTHONPATH=. python3 evidence/DGR-026/span_split.py [--c 4] [--rounds 2] \
        [--workloads ...] [--modes off auto]
"""

import argparse
import sys
from pathlib import Path

import trio

import dgr
from dgr.engine import resolve_model_path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from step_gain import one_run  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--c", type=int, default=4)
parser.add_argument("--rounds", type=int, default=2)
parser.add_argument("--workloads", nargs="*", default=["quoting summary", "code edit"])
parser.add_argument("--modes", nargs=2, default=["off", "auto"],
                    help="two speculation modes, alternating which goes first by round")
args = parser.parse_args()


async def main():
    config = dgr.NodeConfig(model_path=resolve_model_path(None), max_running=args.c,
                            max_waiting=4 * args.c, n_ctx=args.c * 1024)
    print(f"c = {args.c}; span: first session's first token to the last one's last")
    print()
    print("| round | workload | mode | decode tok/s | span s | steps with prefill in it: "
          "n, s | decode-only steps: n, s, draft rows | last first token at (s into span) "
          "| all steps s |")
    print("|---|---|---|---|---|---|---|---|---|")
    async with dgr.open_node(config) as node:
        for k, workload in enumerate(args.workloads):  # untimed: the step times measured
            await one_run(node, workload, "auto", 9000 + 100 * k, args.c)
        for r in range(args.rounds):
            for k, workload in enumerate(args.workloads):
                for j, mode in enumerate(args.modes if r % 2 == 0 else args.modes[::-1]):
                    rate, steps, (first, last) = await one_run(
                        node, workload, mode, 1000 * r + 100 * k + 50 * j, args.c)
                    # the span opens as the first step that gave a token ends, and
                    # closes as the last one does (step ends, gaps between steps left out)
                    given = [i for i, s in enumerate(steps) if s.generated]
                    inside = steps[given[0] + 1:given[-1] + 1]
                    pre = [s for s in inside if s.prefill]
                    dec = [s for s in inside if not s.prefill]
                    last_pre = max((i for i, s in enumerate(inside) if s.prefill), default=-1)
                    last_first = sum(s.duration_s for s in inside[:last_pre + 1])
                    print(f"| {r} | {workload} | {mode} | {rate:.1f} | {last - first:.2f} | "
                          f"{len(pre)}, {sum(s.duration_s for s in pre):.2f} | {len(dec)}, "
                          f"{sum(s.duration_s for s in dec):.2f}, "
                          f"{sum(s.draft_rows for s in dec)} | {last_first:.2f} | "
                          f"{sum(s.duration_s for s in steps):.2f} |", flush=True)


trio.run(main)
