"""Where speculation's gain goes at c sessions: the bench's speculation workloads
(benchmarks/speculation.py, greedy, 96 tokens each, c at once) in process on the
default model, speculation off and auto alternating on one node, rounds; per run,
from the node's step records:

- decode tok/s as the bench counts it (tokens after each session's first, from the
  first session's first token to the last one's last), measured in process;
- the steps with no prefill by their decode rows, those with drafts apart: steps,
  draft rows, tokens and seconds a step (with what the speculation policy planned
  for them: StepRecord.planned), tokens per second of step time;
- the node's trust and row times after the run.

    PYTHONPATH=. python3 evidence/DGR-026/step_gain.py [--c 16] [--rounds 2] [--workloads ...]
"""

import argparse
import collections
import statistics
import time

import trio

import dgr
from benchmarks.speculation import N_NEW, WORKLOADS
from dgr.engine import resolve_model_path



async def one_run(node, workload, mode, offset, c):
    """c sessions of `workload` at once: decode tok/s as the bench counts it, the step
    records of the run, and (first token, last token) times."""
    build = WORKLOADS[workload]
    stamps = [[] for _ in range(c)]

    async def one(i):
        prompt, extra = build(offset + i)
        params = dgr.SamplingParams(max_tokens=N_NEW, temperature=0.0, speculation=mode,
                                    ignore_eos="grammar" not in extra, **extra)
        async with node.stream(prompt, params) as chunks:
            async for chunk in chunks:
                if chunk.token_id is not None:
                    stamps[i].append(time.perf_counter())

    first_step = node.steps[-1].index if node.steps else -1
    async with trio.open_nursery() as nursery:
        for i in range(c):
            nursery.start_soon(one, i)
    steps = [s for s in node.steps if s.index > first_step]
    firsts = [s[0] for s in stamps if s]
    lasts = [s[-1] for s in stamps if s]
    tokens = sum(max(0, len(s) - 1) for s in stamps)
    return tokens / (max(lasts) - min(firsts)), steps, (min(firsts), max(lasts))


def by_rows(steps):
    """Steps with no prefill, by (decode rows, with drafts): [steps, tokens, seconds,
    draft rows, planned tokens, planned seconds]."""
    out = collections.defaultdict(lambda: [0, 0, 0.0, 0, 0.0, 0.0])
    for s in steps:
        if s.prefill:
            continue
        cell = out[(len(s.decode), s.draft_rows > 0)]
        for k, v in enumerate((1, s.generated, s.duration_s, s.draft_rows, *s.planned)):
            cell[k] += v
    return out


async def main():
    config = dgr.NodeConfig(model_path=resolve_model_path(None), max_running=args.c,
                            max_waiting=4 * args.c, n_ctx=args.c * 1024)
    rates = collections.defaultdict(list)
    async with dgr.open_node(config) as node:
        for r in range(args.rounds):
            for workload in args.workloads:
                order = ("off", "auto") if r % 2 == 0 else ("auto", "off")
                for k, mode in enumerate(order):
                    rate, steps, _ = await one_run(node, workload, mode, 1000 * r + 100 * k,
                                                   args.c)
                    rates[(workload, mode)].append(rate)
                    step_s = sum(s.duration_s for s in steps)
                    drafted = sum(s.draft_rows for s in steps)
                    generated = sum(s.generated for s in steps)
                    print(f"\n## round {r}, {workload}, {mode}: decode {rate:.1f} tok/s; "
                          f"{len(steps)} steps, {step_s:.2f} s in steps, {drafted} draft rows, "
                          f"{generated} tokens")
                    print("| decode rows | drafts | steps | draft rows/step | tokens/step "
                          "(planned) | ms/step (planned) | tok/s of step time |")
                    print("|---|---|---|---|---|---|---|")
                    for (rows, with_drafts), cell in sorted(by_rows(steps).items()):
                        n, tok, sec, drafts, p_tok, p_s = cell
                        if n >= 3:
                            print(f"| {rows} | {'yes' if with_drafts else 'no'} | {n} | "
                                  f"{drafts / n:.1f} | {tok / n:.2f} ({p_tok / n:.2f}) | "
                                  f"{1e3 * sec / n:.1f} ({1e3 * p_s / n:.1f}) | {tok / sec:.1f} |")
                    spec = node._loop.batch.scheduler.speculation
                    print(f"trust after it: {spec.trust():.2f}")
                    print("row times after it (rows, ms): " + ", ".join(
                        f"({rows:.1f}, {1e3 * sec:.1f})" for rows, sec, _ in node._loop.row_times.points()))
    print("\n| workload | auto / off per round | median |")
    print("|---|---|---|")
    for workload in args.workloads:
        ratios = [a / o for a, o in zip(rates[(workload, "auto")], rates[(workload, "off")])]
        print(f"| {workload} | {', '.join(f'{x:.2f}' for x in ratios)} | "
              f"{statistics.median(ratios):.2f} |")


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--c", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--workloads", nargs="*", default=list(WORKLOADS))
    args = parser.parse_args()
    trio.run(main)
