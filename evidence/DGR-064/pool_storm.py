"""Issue 64, part 2: the randomized storm of tests/test_pool_storm.py (8 running, 24
requests: shared system prompts, continuations resent as token ids, staggered
arrivals, 20-120 new tokens, cancellations), seeds 11-15, on the tiny test model in a
1,024-cell pool, or with --default-model on the default model in a 2,048-cell pool
(--cells N: N cells instead).
Prints per seed the sessions that completed, how many equal their solo runs bit for
bit, and the sequences the node moved to cells in order (patch 0015), with their
seconds.

    .venv/bin/python evidence/DGR-064/pool_storm.py [--default-model] [--cells N]
"""

import sys
from pathlib import Path

import trio

import dgr
from dgr.engine import resolve_model_path
from dgr.testmodel import write_test_model
from dgr.invariance import first_difference

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from test_pool_storm import POOL, run_storm, storm_plan  # noqa: E402


async def main() -> None:
    default = "--default-model" in sys.argv
    model = (resolve_model_path(None) if default
             else str(write_test_model(Path("/tmp") / "dgr-storm-tiny.gguf")))
    pool = POOL | ({"n_ctx": 2048, "n_batch": 512, "n_ubatch": 512} if default else {})
    if "--cells" in sys.argv:
        pool["n_ctx"] = int(sys.argv[sys.argv.index("--cells") + 1])
    print(f"{'default model' if default else 'tiny model'}, {pool['n_ctx']} cells")
    print("seed  completed  bitwise  moved  move failed  move s")
    for seed in (11, 12, 13, 14, 15):
        plan = storm_plan(seed)

        def params_for(request):
            return dgr.SamplingParams(max_tokens=request["max_tokens"], ignore_eos=True,
                                      logprobs=2)

        async with dgr.open_node(dgr.NodeConfig(model_path=model, **pool)) as node:
            results, prompts = await run_storm(node, plan, params_for)
            moves = node._loop.batch.tier_figures
        big = dgr.NodeConfig(model_path=model, **(pool | {"n_ctx": 8192}), prefix_cache=False)
        equal = 0
        async with dgr.open_node(big) as alone:
            for i, result in results.items():
                solo = await alone.generate(prompts[i], params_for(plan[i]))
                equal += first_difference(solo, result) is None
        print(f"{seed:4}  {len(results):9}  {equal:7}  {moves['moves']:5}  "
              f"{moves['moves_failed']:11}  {moves['move_s']:6.3f}")


if __name__ == "__main__":
    trio.run(main)
