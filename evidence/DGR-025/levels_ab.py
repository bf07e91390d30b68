"""dgr's defaults against llama-server's at each concurrency, alternating, rounds.

The bench's levels case (benchmarks/concurrency.run_level: c streaming greedy
completions of N tokens over HTTP, default model), each round starting each
server afresh for each c, dgr then llama-server; per-round ratios (dgr /
llama-server tokens per second) and their median, min and max.

    python evidence/DGR-025/levels_ab.py [--rounds 4] [--levels 1,2,4,8,16,32] [--new-tokens 48]
        [--not-streamed] [--also=--no-sched-batch]

--also: a second dgr in every round, started with these arguments beside the defaults.
"""

import argparse
import os
import statistics
import sys
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.concurrency import dgr_server, free_port, llama_server, run_level  # noqa: E402
from benchmarks.peers import ensure_peers  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=4)
parser.add_argument("--levels", default="1,2,4,8,16,32")
parser.add_argument("--new-tokens", type=int, default=48)
parser.add_argument("--not-streamed", action="store_true")
parser.add_argument("--also", help="arguments of a second dgr run in every round")
args = parser.parse_args()
levels = [int(x) for x in args.levels.split(",")]
model = resolve_model_path(None)
threads = os.cpu_count() or 2
peers = ensure_peers(log=lambda m: print(m, file=sys.stderr), batched_bench=False)
variants = {"dgr": ()} | ({f"dgr {args.also}": tuple(args.also.split())} if args.also else {})
ratios: dict[tuple[str, int], list[float]] = {(v, c): [] for v in variants for c in levels}
streamed = not args.not_streamed
print(f"{args.new_tokens} tokens a completion, {'streamed' if streamed else 'not streamed'}")
print()
print("| round | c | dgr | dgr tok/s | llama-server tok/s | ratio | dgr outside llama_decode |")
print("|---|---|---|---|---|---|---|")
for r in range(args.rounds):
    for c in levels:
        ours = {}
        for name, extra in variants.items():
            with dgr_server(model, c, 1024, threads, free_port(), extra=extra) as srv:
                ours[name] = trio.run(run_level, srv.url, c, args.new_tokens, True, streamed)
        with llama_server(peers["llama-server"], model, c, 1024, threads, free_port()) as srv:
            theirs = trio.run(run_level, srv.url, c, args.new_tokens, False, streamed)
        for name, got in ours.items():
            ratio = got["gen_tok_s"] / theirs["gen_tok_s"]
            ratios[(name, c)].append(ratio)
            print(f"| {r} | {c} | {name} | {got['gen_tok_s']:.1f} | {theirs['gen_tok_s']:.1f} | "
                  f"{ratio:.3f} | {got['step_ms_split']['outside_decode_pct']:.1f} % |", flush=True)
print()
print("| c | dgr | dgr / llama-server: median | min | max |")
print("|---|---|---|---|---|")
for (name, c), values in ratios.items():
    print(f"| {c} | {name} | {statistics.median(values):.3f} | {min(values):.3f} | "
          f"{max(values):.3f} |")
