"""0008's cost on decode steps of 64+ rows of one stream (possible since the 63-session cap
was lifted): the patched llama-batched-bench with GGML_CPU_FA_TILED=0 (dgr's setting, every
row on the one-row path) vs unset (64+ rows take the tiled path), 64-token prompts, 32 new
tokens, batch 32, 64 and 72, one unified KV stream (`-kvu`, as dgr runs; with a stream per
sequence every decode row is alone in its stream), best of 3 alternating runs.

    python evidence/DGR-021/decode_64_plus.py
"""

from benchmarks.concurrency import batched_bench
from benchmarks.peers import ensure_peers
from dgr.engine import resolve_model_path

binary = ensure_peers()["llama-batched-bench-patched"]
model = str(resolve_model_path(None))
best = {"unset": {}, "0": {}}
unified = {"LLAMA_ARG_KV_UNIFIED": "1"}
for _ in range(3):
    for name, env in (("unset", unified), ("0", {**unified, "GGML_CPU_FA_TILED": "0"})):
        for c, (pp, tg) in batched_bench(binary, model, [32, 64, 72], 32, 2, 64, env).items():
            old = best[name].get(c, (0.0, 0.0))
            best[name][c] = (max(old[0], pp), max(old[1], tg))
print("| batch | PP unset | PP =0 | ratio | TG unset | TG =0 | ratio |")
print("|---|---|---|---|---|---|---|")
for c in sorted(best["unset"]):
    (pp1, tg1), (pp0, tg0) = best["unset"][c], best["0"][c]
    print(f"| {c} | {pp1:.1f} | {pp0:.1f} | {pp0 / pp1:.3f} | {tg1:.1f} | {tg0:.1f} | {tg0 / tg1:.3f} |")
