"""Q4_K weights repacked (llama.cpp's CPU_REPACK layout, patch 0017) or as loaded (the
tiled kernel, its narrow path for decode: patch 0018), one engine each, alternating: a
cold 512-token prompt and 48 single-row decode steps per round. Prints each side's
tokens/s and the ratios (repacked / as loaded) as min / median / max over the rounds.

    .venv/bin/python evidence/DGR-065/repack_ab.py MODEL.gguf [--rounds 6]

The repacked side is --weight-repack decode, the other --weight-repack invariant (both
keep dgr's other repacking: Q4_0, IQ4_NL, MXFP4 layer weights)."""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dgr import _engine, gguf_file, weight_repack  # noqa: E402

PROMPT = 512
DECODE = 48


def engine(model: str, q4_k: bool) -> _engine.Engine:
    names = set(weight_repack.invariant_tensors(model, _engine.system_info(), "decode"))
    kinds = {name: kind for name, kind, _ in gguf_file.tensors(model)}
    if not q4_k:
        names = {name for name in names if kinds[name] != "Q4_K"}
    return _engine.Engine(model, n_ctx=2048, n_seq_max=1, n_batch=512, n_threads=2,
                          repack=weight_repack.patterns(sorted(names)))


def round_trip(e: _engine.Engine) -> tuple[float, float]:
    """Prompt tokens/s and decode tokens/s of slot 0, from position 0."""
    tokens = [5 + i % 300 for i in range(PROMPT)]
    positions = list(range(PROMPT))
    t0 = time.perf_counter()
    e.step(tokens, positions, [0] * PROMPT, [0] * (PROMPT - 1) + [1])
    prefill = PROMPT / (time.perf_counter() - t0)
    t0 = time.perf_counter()
    for i in range(DECODE):
        e.step([7 + i], [PROMPT + i], [0], [1])
    return prefill, DECODE / (time.perf_counter() - t0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--rounds", type=int, default=6)
    args = parser.parse_args()
    engines = {"as loaded": engine(args.model, False), "Q4_K repacked": engine(args.model, True)}
    rates = {name: [] for name in engines}
    for r in range(args.rounds):
        order = list(engines) if r % 2 == 0 else list(engines)[::-1]
        for name in order:
            engines[name].release(0)  # a cold prompt: the slot's cells freed
            rates[name].append(round_trip(engines[name]))
    print(f"{Path(args.model).name}, {args.rounds} alternating rounds, 2 threads")
    for i, part in enumerate(("prefill 512 tokens/s", f"decode {DECODE} x 1 row tokens/s")):
        for name, got in rates.items():
            values = [g[i] for g in got]
            print(f"  {part:<30} {name:<14} median {statistics.median(values):7.1f}  "
                  f"(min {min(values):.1f}, max {max(values):.1f})")
        ratios = sorted(a[i] / b[i] for a, b in zip(rates["Q4_K repacked"], rates["as loaded"]))
        print(f"  {part:<30} repacked / as loaded: {ratios[0]:.3f} / "
              f"{statistics.median(ratios):.3f} / {ratios[-1]:.3f}")
    for e in engines.values():
        e.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
