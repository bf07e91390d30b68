"""DGR-021's past-63 check again, arranged so that 64+ *decode* rows share a call: 72
sessions (8 prompts x 9) admitted in one tick as token ids, 16 prefills a step, vs each
prompt alone; prints the most decode rows and rows of any step, then the verdict.
With flash attention's tiled path off (dgr's setting) or on for 64+ query rows:

    python evidence/DGR-022/past_63_decode_rows.py 0
    python evidence/DGR-022/past_63_decode_rows.py 1
"""

import os
import sys

import trio

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import dgr  # noqa: E402
from benchmarks.batch_invariance import PROMPTS  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402

# dgr sets GGML_CPU_FA_TILED=0 when imported; ggml reads it at the first flash attention
os.environ["GGML_CPU_FA_TILED"] = sys.argv[1]


async def main():
    config = dgr.NodeConfig(model_path=str(resolve_model_path(None)), max_running=72,
                            n_ctx=8192, prefill_sessions_per_step=16)
    greedy = dgr.SamplingParams(max_tokens=16, logprobs=2, ignore_eos=True)
    async with dgr.open_node(config) as node:
        alone = [await node.generate(p, greedy) for p in PROMPTS]
        ids = [node.tokenize(p) for p in PROMPTS]
        first = len(node.steps)
        together = [None] * 72

        async def run(i):
            together[i] = await node.generate(ids[i % 8], greedy)

        async with trio.open_nursery() as nursery:
            for i in range(72):
                nursery.start_soon(run, i)
        steps = list(node.steps)[first:]
    same_tokens = sum(t.token_ids == alone[i % 8].token_ids for i, t in enumerate(together))
    same_bits = sum(t.token_logprobs == alone[i % 8].token_logprobs and t.logprobs == alone[i % 8].logprobs
                    for i, t in enumerate(together))
    print(f"GGML_CPU_FA_TILED={sys.argv[1]}: most decode rows in a step "
          f"{max(len(r.decode) for r in steps)}, most rows {max(r.rows for r in steps)}, "
          f"steps with 64+ decode rows {sum(len(r.decode) >= 64 for r in steps)}; "
          f"tokens equal {same_tokens}/72, log-probabilities bitwise equal {same_bits}/72")


trio.run(main)
