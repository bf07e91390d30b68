"""The workload of DGR-021's past-63 check (72 sessions, 8 prompts x 9, defaults but
max_running=72, after each prompt alone): the most decode rows and rows of any step,
with text prompts and with token ids."""
import os, sys, trio
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
import dgr
from benchmarks.batch_invariance import PROMPTS
from dgr.engine import resolve_model_path
async def main():
    config = dgr.NodeConfig(model_path=str(resolve_model_path(None)), max_running=72, n_ctx=8192)
    greedy = dgr.SamplingParams(max_tokens=16, logprobs=2, ignore_eos=True)
    async with dgr.open_node(config) as node:
        alone = [await node.generate(p, greedy) for p in PROMPTS]
        n0 = len(node.steps)
        for mode in ("text", "ids"):
            prompts = PROMPTS * 9 if mode == "text" else [node.tokenize(p) for p in PROMPTS] * 9
            n0 = len(node.steps)
            async with trio.open_nursery() as n:
                for p in prompts:
                    n.start_soon(node.generate, p, greedy)
            st = list(node.steps)[n0:]; print(mode, "max decode rows", max(len(r.decode) for r in st), "max rows", max(r.rows for r in st), "steps with >= 64 rows", sum(r.rows >= 64 for r in st))
trio.run(main)
