"""Weight repacking's cost and gain at the engine level: a random-weight model
written here in each weight type dgr repacks (dgr/weight_repack.py), loaded with
--weight-repack invariant and off, alternating, for a cold 512-token prompt and 64
single-row decode steps; prints the ratios (off / invariant time) with
min/median/max over the rounds.

    python benchmarks/weight_repack.py [--rounds 3] [--threads 2] [--folder DIR]

Models: a llama of n_embd 1024, 8 layers, 16 heads over 4 KV heads, n_ff 2816 (Q4_0
and IQ4_NL), and a qwen3moe of the same attention with 8 experts of 1024 rows, 2
per token (its experts MXFP4, its other weights Q8_0: llama.cpp's MXFP4_MOE).
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dgr import _engine, weight_repack  # noqa: E402
from dgr._step import step  # noqa: E402
from dgr.testmodel import quantize, write_test_model  # noqa: E402

SHAPE = dict(n_embd=1024, n_layer=8, n_head=16, n_head_kv=4)
MODELS = [("llama", "Q4_0", 2816), ("llama", "IQ4_NL", 2816), ("qwen3moe", "MXFP4_MOE", 1024)]
PROMPT = 512
DECODE = 64


def timed(model: str, repack: bool, threads: int) -> tuple[float, float]:
    """Seconds for the cold prompt and for the decode steps."""
    names = weight_repack.invariant_tensors(model, _engine.system_info()) if repack else []
    engine = _engine.Engine(model, n_ctx=1024, n_seq_max=1, n_batch=512, n_threads=threads,
                            repack=weight_repack.patterns(names))
    try:
        tokens = [5 + i % 300 for i in range(PROMPT)]
        start = time.perf_counter()
        step(engine, tokens, list(range(PROMPT)), [0] * PROMPT, [0] * (PROMPT - 1) + [1])
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        for i in range(DECODE):
            step(engine, [7 + i], [PROMPT + i], [0], [1])
        return prefill, time.perf_counter() - start
    finally:
        engine.close()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--folder", default="/tmp/dgr-weight-repack")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    print(f"{'model':<22} {'part':<18} {'off/invariant: min':>20} {'median':>7} {'max':>6}")
    for arch, kind, n_ff in MODELS:
        source = folder / f"{arch}-f32.gguf"
        if not source.exists():
            write_test_model(source, architecture=arch, n_ff=n_ff, **SHAPE)
        model = folder / f"{arch}-{kind}.gguf"
        if not model.exists():
            quantize(source, model, kind)
        ratios = {"prefill 512": [], "decode 64 x 1 row": []}
        for _ in range(args.rounds):
            off = timed(str(model), False, args.threads)
            on = timed(str(model), True, args.threads)
            ratios["prefill 512"].append(off[0] / on[0])
            ratios["decode 64 x 1 row"].append(off[1] / on[1])
        for part, got in ratios.items():
            print(f"{arch + ' ' + kind:<22} {part:<18} {min(got):>20.2f} "
                  f"{statistics.median(got):>7.2f} {max(got):>6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
