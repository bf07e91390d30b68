"""Issue 64, part 2: the randomized storm of tests/test_pool_storm.py on a 1,024-cell
pool (8 running, 24 requests: shared system prompts, continuations resent as token
ids, staggered arrivals, 20-120 new tokens, cancellations), seeds 11-15. Prints per
seed the sessions that completed, how many equal their solo runs bit for bit, and the
sequences the node moved to cells in order (patch 0015), with their seconds.

    .venv/bin/python evidence/DGR-064/pool_storm.py
"""

import sys
from pathlib import Path

import trio

import dgr
from dgr.testmodel import write_test_model
from dgr.invariance import first_difference

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from test_pool_storm import POOL, run_storm, storm_plan  # noqa: E402


async def main() -> None:
    model = str(write_test_model(Path("/tmp") / "dgr-storm-tiny.gguf"))
    print("seed  completed  bitwise  moved  move failed  move s")
    for seed in (11, 12, 13, 14, 15):
        plan = storm_plan(seed)

        def params_for(request):
            return dgr.SamplingParams(max_tokens=request["max_tokens"], ignore_eos=True,
                                      logprobs=2)

        async with dgr.open_node(dgr.NodeConfig(model_path=model, **POOL)) as node:
            results, prompts = await run_storm(node, plan, params_for)
            moves = node._loop.batch.tier_figures
        big = dgr.NodeConfig(model_path=model, **(POOL | {"n_ctx": 8192}), prefix_cache=False)
        equal = 0
        async with dgr.open_node(big) as alone:
            for i, result in results.items():
                solo = await alone.generate(prompts[i], params_for(plan[i]))
                equal += first_difference(solo, result) is None
        print(f"{seed:4}  {len(results):9}  {equal:7}  {moves['moves']:5}  "
              f"{moves['moves_failed']:11}  {moves['move_s']:6.3f}")


if __name__ == "__main__":
    trio.run(main)
