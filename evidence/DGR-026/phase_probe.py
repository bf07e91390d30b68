"""The step phases of speculation off and auto at c sessions, in process on the default
model (the bench's speculation workloads, greedy, 96 tokens each, c at once, off and
auto alternating on one node): per run, the steps with no prefill and no draft rows
and every decode row taken (c), their mean plan, llama_decode, sampling and update
milliseconds, from the step figures (dgr/_scheduler.pxd, StepFigures).

    PYTHONPATH=. python3 evidence/DGR-026/phase_probe.py [--c 8] [--rounds 3] [--workloads ...]
"""

import argparse
import statistics
import sys
from pathlib import Path

import step_gain
import trio

import dgr
from dgr.engine import resolve_model_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "DGR-025"))
from step_figures import seen as figures_seen  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--c", type=int, default=8)
parser.add_argument("--rounds", type=int, default=3)
parser.add_argument("--workloads", nargs="*", default=["table to JSON"])
args = parser.parse_args()
PHASES = ("plan", "decode", "sample", "update")


async def one_run(node, workload, mode, offset):
    """step_gain's run, with the step figures it published."""
    figures_seen.clear()
    rate, _, _ = await step_gain.one_run(node, workload, mode, offset, args.c)
    return rate, list(figures_seen)


async def main():
    config = dgr.NodeConfig(model_path=resolve_model_path(None), max_running=args.c,
                            max_waiting=4 * args.c, n_ctx=args.c * 1024)
    means = {"off": [], "auto": []}
    print(f"c = {args.c}; steps with {args.c} decode rows, no prefill, no drafts: "
          "mean ms a step")
    print()
    print("| round | workload | mode | decode tok/s | steps (all) | such steps | "
          + " | ".join(PHASES) + " | total |")
    print("|---|---|---|---|---|---|" + "---|" * (len(PHASES) + 1))
    async with dgr.open_node(config) as node:
        for r in range(args.rounds):
            for workload in args.workloads:
                order = ("off", "auto") if r % 2 == 0 else ("auto", "off")
                for k, mode in enumerate(order):
                    rate, figures = await one_run(node, workload, mode, 1000 * r + 100 * k)
                    plain = [f for f in figures if f["prefill_rows"] == 0
                             and f["draft_rows"] == 0 and f["decode_rows"] == args.c]
                    ms = [1e3 * statistics.fmean(f[f"{p}_s"] for f in plain) for p in PHASES]
                    total = 1e3 * statistics.fmean(f["total_s"] for f in plain)
                    means[mode].append(ms + [total])
                    print(f"| {r} | {workload} | {mode} | {rate:.1f} | {len(figures)} | "
                          f"{len(plain)} | " + " | ".join(f"{v:.2f}" for v in ms)
                          + f" | {total:.2f} |", flush=True)
    print()
    for mode, rows in means.items():
        print(f"{mode}: median over runs " + ", ".join(
            f"{name} {statistics.median(r[i] for r in rows):.2f}"
            for i, name in enumerate((*PHASES, "total"))) + " ms")


trio.run(main)
