"""The part of a step outside every phase (between the loop letting its lock go for
llama.cpp and taking it back, around the calls: where the pump's wake-up lands), in
process on the default model at c = 1: 3 greedy completions of 48 tokens a run,
speculation off, on nodes with sched_batch on and off alternating; per run the step
phases and what the step's time holds beyond them, from the step figures.

    PYTHONPATH=. python3 evidence/DGR-025/step_gap.py [--rounds 2]
"""

import argparse

import trio

import dgr
from benchmarks.concurrency import PROMPTS
from dgr.engine import resolve_model_path
from step_figures import seen as figures_seen

PHASES = ("plan", "decode", "sample", "update")


async def run(sched_batch: bool) -> str:
    config = dgr.NodeConfig(model_path=resolve_model_path(None), max_running=4,
                            max_waiting=16, n_ctx=8192, sched_batch=sched_batch)
    async with dgr.open_node(config) as node:
        await node.generate(PROMPTS[0], dgr.SamplingParams(max_tokens=4, temperature=0))
        figures_seen.clear()
        for i in range(3):
            await node.generate(f"{PROMPTS[i % len(PROMPTS)]} {i}", dgr.SamplingParams(
                max_tokens=48, temperature=0, ignore_eos=True, speculation="off"))
    n = len(figures_seen)
    total = sum(f["total_s"] for f in figures_seen)
    phases = {p: sum(f[f"{p}_s"] for f in figures_seen) for p in PHASES}
    beyond = total - sum(phases.values())
    return (f"{n} | " + " | ".join(f"{1e3 * v / n:.3f}" for v in phases.values())
            + f" | {1e3 * beyond / n:.3f} | {1e3 * total / n:.2f} | "
            f"{100 * (total - phases['decode']) / total:.2f} % |")


parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=2)
args = parser.parse_args()
print("ms a step; outside: everything but llama_decode, as the bench counts it")
print()
print("| round | sched_batch | steps | " + " | ".join(PHASES) + " | beyond the phases | step | "
      "outside llama_decode |")
print("|---|---|---|" + "---|" * (len(PHASES) + 3))
for r in range(args.rounds):
    for sched_batch in (False, True) if r % 2 == 0 else (True, False):
        print(f"| {r} | {'on' if sched_batch else 'off'} | {trio.run(run, sched_batch)}",
              flush=True)
