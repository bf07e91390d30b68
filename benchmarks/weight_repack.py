"""Weight repacking's cost and gain at the engine level: a random-weight model
written here in each weight type dgr repacks (dgr/weight_repack.py), loaded with
--weight-repack off and invariant, alternating, for a cold 512-token prompt and 64
single-row decode steps; prints the ratios (off / invariant time) with
min/median/max over the rounds. With --q4-k MODEL, also MODEL (a Q4_K_M GGUF) with
its Q4_K weights as loaded and repacked ("decode"; "invariant" repacks them too on
CPUs with AVX-512 VNNI).

    python benchmarks/weight_repack.py [--rounds 3] [--threads 2] [--folder DIR]
                                       [--q4-k MODEL [--only-q4-k]]

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

from dgr import _engine, gguf_file, weight_repack  # noqa: E402
from dgr._step import step  # noqa: E402
from dgr.testmodel import quantize, write_test_model  # noqa: E402

SHAPE = dict(n_embd=1024, n_layer=8, n_head=16, n_head_kv=4)
MODELS = [("llama", "Q4_0", 2816), ("llama", "IQ4_NL", 2816), ("qwen3moe", "MXFP4_MOE", 1024)]
PROMPT = 512
DECODE = 64


# the "decode" mode's choice without its Q4_K weights
Q4_K_AS_LOADED = "Q4_K as loaded"


def repacked(model: str, mode: str) -> list[str]:
    """The weights --weight-repack `mode` repacks (or Q4_K_AS_LOADED's)."""
    if mode == "off":
        return []
    names = weight_repack.invariant_tensors(
        model, _engine.system_info(), "decode" if mode == Q4_K_AS_LOADED else mode)
    if mode == Q4_K_AS_LOADED:
        kinds = {name: kind for name, kind, _ in gguf_file.tensors(model)}
        names = [name for name in names if kinds[name] != "Q4_K"]
    return names


def timed(model: str, mode: str, threads: int, prompt: int = PROMPT,
          decode: int = DECODE) -> tuple[float, float]:
    """Seconds for the cold prompt and for the decode steps, with the weights
    `mode` repacks."""
    names = repacked(model, mode)
    engine = _engine.Engine(model, n_ctx=max(1024, 2 * (prompt + decode)), n_seq_max=1,
                            n_batch=512, n_threads=threads, repack=weight_repack.patterns(names))
    try:
        tokens = [5 + i % 300 for i in range(prompt)]
        start = time.perf_counter()
        for at in range(0, prompt, 512):  # the prompt in batches of n_batch rows
            rows = tokens[at:at + 512]
            step(engine, rows, list(range(at, at + len(rows))), [0] * len(rows),
                 [0] * (len(rows) - 1) + [int(at + len(rows) == prompt)])
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        for i in range(decode):
            step(engine, [7 + i], [prompt + i], [0], [1])
        return prefill, time.perf_counter() - start
    finally:
        engine.close()


def compare(label: str, model: str, slow: str, fast: str, args) -> list[str]:
    """Lines of `label`: the ratios (`slow` mode's time / `fast` mode's) of the prompt
    and of the decode steps, min / median / max over the rounds, alternating."""
    ratios = {f"prefill {args.prompt}": [], f"decode {args.decode} x 1 row": []}
    for r in range(args.rounds):
        times = {}
        for mode in ((slow, fast) if r % 2 == 0 else (fast, slow)):
            times[mode] = timed(model, mode, args.threads, args.prompt, args.decode)
        for i, part in enumerate(ratios):
            ratios[part].append(times[slow][i] / times[fast][i])
    return [f"{label:<22} {part:<18} {slow + '/' + fast:>20}: {min(got):.2f} "
            f"{statistics.median(got):>7.2f} {max(got):>6.2f}" for part, got in ratios.items()]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--folder", default="/tmp/dgr-weight-repack")
    parser.add_argument("--prompt", type=int, default=PROMPT, help="prompt tokens")
    parser.add_argument("--decode", type=int, default=DECODE, help="single-row decode steps")
    parser.add_argument("--q4-k", default=None, help="a Q4_K_M GGUF: Q4_K as loaded and repacked")
    parser.add_argument("--only-q4-k", action="store_true", help="only the --q4-k model")
    args = parser.parse_args(argv)
    folder = Path(args.folder)
    folder.mkdir(parents=True, exist_ok=True)
    print(f"{'model':<22} {'part':<18} {'time ratio':>20}: min  median    max")
    for arch, kind, n_ff in ([] if args.only_q4_k else MODELS):
        source = folder / f"{arch}-f32.gguf"
        if not source.exists():
            write_test_model(source, architecture=arch, n_ff=n_ff, **SHAPE)
        model = folder / f"{arch}-{kind}.gguf"
        if not model.exists():
            quantize(source, model, kind)
        print("\n".join(compare(f"{arch} {kind}", str(model), "off", "invariant", args)),
              flush=True)
    if args.q4_k:
        print("\n".join(compare(Path(args.q4_k).name[:22], args.q4_k, Q4_K_AS_LOADED,
                                "decode", args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
