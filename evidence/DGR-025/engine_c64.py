"""The serving-path workload's decode without the server: 64 sessions of the tiny test
model decode 256 tokens together, in dgr's engine (one unified pool, dgr's default,
and split KV), one Python `Engine.step` call a step, against the pristine
`llama-batched-bench` (64 sequences, 8-token prompts, 256 generated), alternating.

    python evidence/DGR-025/engine_c64.py [--rounds 4]
"""

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.concurrency import batched_bench  # noqa: E402
from benchmarks.peers import ensure_peers  # noqa: E402
from dgr import _engine  # noqa: E402
from dgr.testmodel import write_test_model  # noqa: E402

C, N_NEW = 64, 256


def engine_rate(model: str, unified: bool) -> float:
    engine = _engine.Engine(model, n_ctx=C * 512, n_seq_max=C, n_batch=512, n_ubatch=512,
                            n_threads=2, kv_unified=unified)
    prompt = list(engine.tokenize("Once upon a time"))
    for slot in range(C):
        engine.step(prompt, list(range(len(prompt))), [slot] * len(prompt),
                    [0] * (len(prompt) - 1) + [1])
    tokens, positions = [prompt[-1]] * C, [len(prompt)] * C
    started = time.perf_counter()
    for _ in range(N_NEW):
        sampled, *_ = engine.step(tokens, positions, list(range(C)), [1] * C)
        tokens, positions = sampled.tolist(), [p + 1 for p in positions]
    rate = C * N_NEW / (time.perf_counter() - started)
    engine.close()
    return rate


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    bench = ensure_peers(log=lambda m: print(m, file=sys.stderr))["llama-batched-bench"]
    model = str(write_test_model(Path(tempfile.mkdtemp()) / "tiny.gguf"))
    rows = []
    print("| round | dgr engine, unified pool tok/s | dgr engine, split KV tok/s | "
          "llama-batched-bench tok/s |")
    print("|---|---|---|---|")
    for r in range(args.rounds):
        unified, split = engine_rate(model, True), engine_rate(model, False)
        peer = batched_bench(bench, model, [C], N_NEW, 2, n_prompt=8)[C][1]
        rows.append((unified, split, peer))
        print(f"| {r} | {unified:.0f} | {split:.0f} | {peer:.0f} |", flush=True)
    for i, name in ((0, "unified pool"), (1, "split KV")):
        ratios = sorted(row[i] / row[2] for row in rows)
        print(f"dgr engine, {name} / llama-batched-bench: median {statistics.median(ratios):.2f} "
              f"({ratios[0]:.2f}-{ratios[-1]:.2f})")
