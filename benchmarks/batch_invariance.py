"""Batch-vs-solo greedy tokens at the engine level, for each KV layout and repacking,
and how many decode rows one llama_decode call may hold before a row's logits change.

    python benchmarks/batch_invariance.py [--model PATH] [--new-tokens 32] [--with-repack]

Part 1, for unified/split KV (and weight repacking on/off with --with-repack:
on CPUs with AMX the pinned llama.cpp's AMX repacked matmul crashes): 8 prompts decoded
alone (recording the solo top-2 log-probability gaps), then together (8 decode
rows per call), once with all prompts prefilled in one step and once with
each prompt prefilled in its own step. Prints identical / near-tie /
unexplained counts (dgr.consistency).

Part 2, dgr's defaults: one sequence decoded with k-1 others of different
prompt lengths in the same llama_decode, k = 2..32; prints the largest
difference of its top-2 log-probabilities from the solo decode over 16 steps
(0 everywhere with the patch stack; up to 0.37 from 8 rows on without it).
"""

import argparse
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from dgr import _engine  # noqa: E402
from dgr._step import step  # noqa: E402
from dgr.consistency import Verdict  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402

PROMPTS = ["The capital of France is", "Write a haiku about the sea:", "def fibonacci(n):",
           "Once upon a time, in a small village,", "The three laws of thermodynamics are",
           "Translate to German: good morning, my friend.", "List five prime numbers:",
           "Water boils at"]


def solo(engine, prompt, n_new):
    engine.release(0)
    n = len(prompt)
    sampled, _, top, _ = step(engine, prompt, list(range(n)), [0] * n, [0] * (n - 1) + [3], 2)
    tokens, gaps, pos = [int(sampled[-1])], [float(top[-1, 0] - top[-1, 1])], n
    while len(tokens) < n_new:
        sampled, _, top, _ = step(engine, [tokens[-1]], [pos], [0], [3], 2)
        tokens.append(int(sampled[0]))
        gaps.append(float(top[0, 0] - top[0, 1]))
        pos += 1
    engine.release(0)
    return tokens, gaps


def together(engine, prompts, n_new, one_step_prefill):
    for slot in range(len(prompts)):
        engine.release(slot)
    outs = []
    if one_step_prefill:
        rows = ([], [], [], [])
        for slot, p in enumerate(prompts):
            n = len(p)
            for acc, part in zip(rows, (p, range(n), [slot] * n, [0] * (n - 1) + [1])):
                acc.extend(part)
        sampled, *_ = step(engine, *rows)
        outs = [[int(sampled[e])] for e in np.cumsum([len(p) for p in prompts]) - 1]
    else:
        for slot, p in enumerate(prompts):
            n = len(p)
            sampled, *_ = step(engine, p, list(range(n)), [slot] * n, [0] * (n - 1) + [1])
            outs.append([int(sampled[-1])])
    pos = [len(p) for p in prompts]
    slots = list(range(len(prompts)))
    for _ in range(n_new - 1):
        sampled, *_ = step(engine, [o[-1] for o in outs], pos, slots, [1] * len(slots))
        for slot in slots:
            outs[slot].append(int(sampled[slot]))
            pos[slot] += 1
    return outs


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--with-repack", action="store_true",
                        help="also weight_repack=True (segfaults on AMX CPUs with the pinned llama.cpp)")
    args = parser.parse_args(argv)
    model = resolve_model_path(args.model)
    for unified in (False, True):
        for repack in (False, True) if args.with_repack else (False,):
            engine = _engine.Engine(model, n_ctx=4096, n_seq_max=8, n_batch=512, n_ubatch=512,
                                   kv_unified=unified, weight_repack=repack)
            prompts = [list(engine.tokenize(p)) for p in PROMPTS]
            reference = [solo(engine, p, args.new_tokens) for p in prompts]
            for one_step in (True, False):
                verdict = Verdict()
                for i, ((tokens, gaps), batched) in enumerate(
                        zip(reference, together(engine, prompts, args.new_tokens, one_step))):
                    verdict.add(i, tokens, gaps, batched)
                print(f"kv_unified={unified} weight_repack={repack} "
                      f"prefill={'one step for all' if one_step else 'one step each'}: "
                      f"identical {verdict.identical}, near-tie {verdict.near_tie}, "
                      f"unexplained {verdict.unexplained}", flush=True)
            engine.close()


def rows_per_call(model, steps=16):
    engine = _engine.Engine(model, n_ctx=32768, n_seq_max=32, n_batch=512, n_ubatch=512)
    texts = PROMPTS + ["A much longer prompt about nothing in particular. " * 12, "Hi",
                       "def f(x):\n    return x", "Zz"]
    texts = [f"{t} ({i})" if i >= len(texts) else t for i, t in enumerate(texts * 3)][:32]
    prompts = [list(engine.tokenize(t)) for t in texts]

    def run(k):
        for slot in range(32):
            engine.release(slot)
        seqs = prompts[:k]
        for slot, p in enumerate(seqs):
            step(engine, p, list(range(len(p))), [slot] * len(p), [0] * (len(p) - 1) + [1])
        positions, top = [len(p) for p in seqs], []
        for _ in range(steps):
            _, _, lp, _ = step(engine, [5] * k, positions, list(range(k)), [3] * k, 2)
            top.append(lp[0].copy())
            positions = [x + 1 for x in positions]
        return np.array(top)

    solo = run(1)
    for k in range(2, 33):
        print(f"{k} decode rows in one call: max |logprob - solo| of row 0 = "
              f"{np.abs(run(k) - solo).max():.3g}", flush=True)
    engine.close()


if __name__ == "__main__":
    main()
    rows_per_call(resolve_model_path(None))
