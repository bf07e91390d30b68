"""72 sessions at once vs each prompt alone, through dgr.open_node on the default model
(the check of tests/test_default_model.py::test_node_batching_matches_solo_past_63_sessions),
with flash attention's tiled path off (dgr's setting) or on for 64+ query rows:

    python evidence/DGR-021/past_63.py 0
    python evidence/DGR-021/past_63.py 1
"""

import os
import sys

import trio

import dgr
from benchmarks.batch_invariance import PROMPTS
from dgr.engine import resolve_model_path

# dgr sets GGML_CPU_FA_TILED=0 when imported; ggml reads it at the first flash attention,
# which comes after this line
os.environ["GGML_CPU_FA_TILED"] = sys.argv[1]


async def main():
    config = dgr.NodeConfig(model_path=str(resolve_model_path(None)), max_running=72, n_ctx=8192)
    greedy = dgr.SamplingParams(max_tokens=16, logprobs=2, ignore_eos=True)
    async with dgr.open_node(config) as node:
        alone = [await node.generate(p, greedy) for p in PROMPTS]
        together = [None] * 72

        async def run(i):
            together[i] = await node.generate(PROMPTS[i % 8], greedy)

        async with trio.open_nursery() as nursery:
            for i in range(72):
                nursery.start_soon(run, i)
    same_tokens = sum(t.token_ids == alone[i % 8].token_ids for i, t in enumerate(together))
    same_bits = sum(t.token_logprobs == alone[i % 8].token_logprobs and t.logprobs == alone[i % 8].logprobs
                    for i, t in enumerate(together))
    worst = max(abs(a - b) for i, t in enumerate(together)
                for a, b in zip(t.token_logprobs, alone[i % 8].token_logprobs))
    print(f"GGML_CPU_FA_TILED={sys.argv[1]}: 72 sessions at once vs alone: tokens equal {same_tokens}/72, "
          f"log-probabilities bitwise equal {same_bits}/72, max |diff| of chosen-token logprob {worst:.3g}")


trio.run(main)
