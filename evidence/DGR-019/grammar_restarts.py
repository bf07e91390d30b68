import sys, json, time, trio
sys.path.insert(0, "/work/main")
import dgr
from benchmarks.grammar import SCHEMA, PROMPTS
from dgr.engine import resolve_model_path
from llama_cpp.llama_grammar import json_schema_to_gbnf
g = json_schema_to_gbnf(json.dumps(SCHEMA))
m = resolve_model_path(None)

async def run(grammar):
    config = dgr.NodeConfig(model_path=m, n_ctx=8192, n_threads=2)
    lens = []
    async with dgr.open_node(config) as node:
        await node.generate("warm up", dgr.SamplingParams(max_tokens=4))
        async with trio.open_nursery() as nursery:
            async def ninth():
                while True:
                    r = await node.generate("List many fruits as JSON:", dgr.SamplingParams(
                        max_tokens=400, temperature=0.7, grammar=grammar))
                    lens.append((len(r.token_ids), r.finish_reason))
            nursery.start_soon(ninth)
            await trio.sleep(0.5)
            t = time.monotonic()
            async with trio.open_nursery() as s:
                for p in PROMPTS:
                    s.start_soon(node.generate, p, dgr.SamplingParams(max_tokens=96, ignore_eos=True))
            el = time.monotonic() - t
            nursery.cancel_scope.cancel()
    return 8*96/el, lens
for grammar in (None, g):
    rate, lens = trio.run(run, grammar)
    print("grammar" if grammar else "sampled", f"{rate:.1f} tok/s", "9th runs:", lens)
