"""dgr against dgr: does a change cost throughput? The levels case's dgr side
(benchmarks/levels.py run_level: c streaming greedy sessions of N tokens, aggregate
generated tokens/s) from two checkouts, alternating by round, each node started
afresh; prints each round and a table of medians with after / before as
min / median / max over the rounds.

    .venv/bin/python -m benchmarks.ab BEFORE_TREE AFTER_TREE [--rounds 4] [--model M]

A tree is a checkout with its Cython modules built (for an earlier commit whose .pyx
files are the same: a git worktree with this checkout's built modules copied in).
"""

from __future__ import annotations

import argparse
import statistics
import sys

import trio

from benchmarks.levels import CTX_PER_SLOT, run_level
from benchmarks.servers import ServerProcess, free_port
from dgr.engine import resolve_model_path


def node(tree: str, model: str, c: int, threads: int) -> ServerProcess:
    """`python -m dgr run` with `tree` first on the module path."""
    port = free_port()
    boot = (f"import sys, runpy; sys.path.insert(0, {tree!r}); "
            "runpy.run_module('dgr', run_name='__main__', alter_sys=True)")
    return ServerProcess(f"dgr ({tree})", [sys.executable, "-c", boot, "run", "--model", model,
                                           "--port", str(port), "--max-running", str(c),
                                           "--max-waiting", str(4 * c),
                                           "--ctx", str(c * CTX_PER_SLOT),
                                           "--threads", str(threads), "--log-level", "WARNING"],
                         port)


def run(trees: dict[str, str], model: str, levels, n_new: int, rounds: int, threads: int,
        log=print) -> dict:
    """{(name, c): [tokens/s of each round]} of each named tree."""
    rates = {(name, c): [] for name in trees for c in levels}
    for r in range(rounds):
        for c in levels:
            order = list(trees) if r % 2 == 0 else list(trees)[::-1]
            for name in order:
                with node(trees[name], model, c, threads) as server:
                    trio.run(run_level, server.url, c, min(8, n_new), True)  # warm-up
                    rate = trio.run(run_level, server.url, c, n_new, True)["gen_tok_s"]
                rates[name, c].append(rate)
                log(f"round {r} c={c} {name}: {rate:.1f} tokens/s")
    return rates


def table(rates: dict, levels, before: str = "before", after: str = "after") -> list[str]:
    lines = [f"| c | {before} (median) | {after} (median) | {after} / {before} "
             "(min / median / max) |", "|---|---|---|---|"]
    for c in levels:
        ratios = sorted(a / b for a, b in zip(rates[after, c], rates[before, c]))
        lines.append(f"| {c} | {statistics.median(rates[before, c]):.1f} | "
                     f"{statistics.median(rates[after, c]):.1f} | {ratios[0]:.3f} / "
                     f"{statistics.median(ratios):.3f} / {ratios[-1]:.3f} |")
    return lines


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--model", default=None, help="GGUF model (default: the default model)")
    parser.add_argument("--levels", default="1,8,16")
    parser.add_argument("--tokens", type=int, default=64, help="tokens generated per session")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.levels.split(",")]
    rates = run({"before": args.before, "after": args.after}, resolve_model_path(args.model),
                levels, args.tokens, args.rounds, args.threads)
    print(f"\n{args.model or 'default model'}, {args.tokens} tokens a session, "
          f"{args.rounds} alternating rounds, {args.threads} threads")
    print("\n".join(table(rates, levels)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
