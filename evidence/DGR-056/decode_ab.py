"""Decode A/B: dgr's node on the default model with the kernels before patch 0013/0014
(the previous wheel's libraries, every flash-attention row on the one-row path) and
after, alternating by round, each run in a fresh process.

    python evidence/DGR-056/decode_ab.py OLD_LIB_DIR [rounds] [levels] [speculation]

OLD_LIB_DIR: llama_cpp/lib of an environment holding the previous build (dgr's
extensions find libllama through RUNPATH, which LD_LIBRARY_PATH overrides). Each run
opens a node, warms it with one session, then runs c sessions at once (64 new tokens
each, greedy, ignore_eos) and prints generated tokens/s; the report gives new / old
per level as min / median / max over the rounds. Speculation (default "off") drafts
from the text generated so far: the two builds round differently, generate different
text and so draft differently, which measures the text rather than the kernels.
"""

import json
import os
import statistics
import subprocess
import sys

WORKER = r'''
import json, sys, time, trio, dgr
c = int(sys.argv[1])
async def main():
    cfg = dgr.NodeConfig(model_path=None, max_running=max(c, 1), n_ctx=max(4096, 512 * c),
                         speculation=sys.argv[2])
    params = dgr.SamplingParams(max_tokens=64, temperature=0.0, ignore_eos=True)
    prompts = [f"Session {i} writes about the history of {topic}:" for i, topic in
               enumerate(["rivers", "bridges", "printing", "clocks"] * 8)][:c]
    async with dgr.open_node(cfg) as node:
        await node.generate("Warm up", dgr.SamplingParams(max_tokens=8))
        t0 = time.perf_counter()
        async with trio.open_nursery() as n:
            for p in prompts:
                n.start_soon(node.generate, p, params)
        print(json.dumps({"c": c, "tok_s": 64 * c / (time.perf_counter() - t0)}))
trio.run(main)
'''


def run(c: int, old_lib: str | None, speculation: str) -> float:
    env = dict(os.environ)
    if old_lib:
        env["LD_LIBRARY_PATH"] = old_lib
        env["GGML_CPU_FA_TILED"] = "0"  # how dgr ran the previous stack
    out = subprocess.run([sys.executable, "-c", WORKER, str(c), speculation], env=env, check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["tok_s"]


def main() -> None:
    old_lib = sys.argv[1]
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 4
    levels = [int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "1,4,16,32").split(",")]
    speculation = sys.argv[4] if len(sys.argv) > 4 else "off"
    rows = {c: [] for c in levels}
    for r in range(rounds):
        for c in levels:
            order = [("old", old_lib), ("new", None)]
            if r % 2:
                order.reverse()
            got = {name: run(c, lib, speculation) for name, lib in order}
            rows[c].append(got)
            print(f"round {r} c={c}: old {got['old']:.1f} tok/s, new {got['new']:.1f} tok/s, "
                  f"new/old {got['new'] / got['old']:.3f}", flush=True)
    print("\n| c | old tok/s (median) | new tok/s (median) | new / old (min / median / max) |")
    print("|---|---|---|---|")
    for c, got in rows.items():
        ratios = sorted(g["new"] / g["old"] for g in got)
        print(f"| {c} | {statistics.median(g['old'] for g in got):.1f} | "
              f"{statistics.median(g['new'] for g in got):.1f} | {ratios[0]:.3f} / "
              f"{statistics.median(ratios):.3f} / {ratios[-1]:.3f} |")


if __name__ == "__main__":
    main()
