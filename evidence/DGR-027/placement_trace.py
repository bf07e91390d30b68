"""Which KV operations placement sends, and what each turn computes, on the kv_tier
bench's workload at a small scale: N conversations (more than the 16 slots) of a
WORDS-word document taking TURNS turns in order, on the default model, in-process.

    python evidence/DGR-027/placement_trace.py 20 600 2

Per request: the ops (Save / Evict / Start with the slot, the conversation whose
tokens they hold, the prefix reused and whether it is restored), the prompt tokens
computed, and the conversations whose entries the host tier then holds.
"""

import sys
from pathlib import Path

import numpy as np
import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import dgr  # noqa: E402
from benchmarks.kv_tier import document, question  # noqa: E402
from dgr.placement import Evict, Save  # noqa: E402

N, WORDS, TURNS = (int(x) for x in sys.argv[1:4])


async def main():
    config = dgr.NodeConfig(model_path=None, max_running=16, max_waiting=64, n_ctx=16 * 2048)
    async with dgr.open_node(config) as node:
        registry = node.telemetry.registry
        placement = node._admission.placement
        heads = [np.asarray(node.tokenize(document(i, WORDS))[:60], dtype=np.int32)
                 for i in range(N)]

        def conversation(tokens):
            tokens = np.asarray(tokens, dtype=np.int32)
            return next((i for i, h in enumerate(heads)
                         if len(tokens) >= 60 and (tokens[:60] == h).all()), None)

        take_ops = placement.take_ops

        def traced():
            ops = take_ops()
            for op in ops:
                if isinstance(op, Save):
                    print(f"    Save slot {op.slot} (conversation {conversation(op.tokens)}, "
                          f"{len(op.tokens)} tokens)")
                elif isinstance(op, Evict):
                    print(f"    Evict slot {op.slot}")
                else:
                    s = op.session
                    source = "restored" if s.restore is not None else f"from slot {s.reuse_from}"
                    print(f"    Start slot {s.slot} (conversation {conversation(s.prompt)}, "
                          f"{s.n_reused} tokens {source})")
            return ops

        placement.take_ops = traced
        histories = [document(i, WORDS) for i in range(N)]
        for turn in range(TURNS):
            for i in range(N):
                prompt = histories[i] + question(i, turn)
                print(f"turn {turn} conversation {i}")
                before = registry.get_sample_value("dgr_prefill_tokens_total")
                result = await node.generate(prompt, dgr.SamplingParams(
                    max_tokens=16, temperature=0.0, ignore_eos=True))
                computed = registry.get_sample_value("dgr_prefill_tokens_total") - before
                held = sorted(conversation(e.tokens) for e in node.tiers.host.entries())
                print(f"  computed {computed:.0f} tokens; host tier holds conversations {held}")
                histories[i] = prompt + result.text
        print("restores", registry.get_sample_value("dgr_kv_tier_restores_total"),
              "prompt tokens computed", registry.get_sample_value("dgr_prefill_tokens_total"))


trio.run(main)
