"""The levels case's dgr side (benchmarks/levels.py run_level: c streaming greedy
sessions of N tokens, aggregate generated tokens/s) from two checkouts of dgr,
alternating by round, each node started afresh: does a change cost throughput?

    .venv/bin/python evidence/DGR-066/levels_ab.py BEFORE_TREE AFTER_TREE [--rounds 4]

Each tree is a checkout with its Cython modules built (a git worktree of the
earlier commit with the built modules copied in, when its .pyx files are the
same); the default model.
"""

import argparse
import statistics
import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from benchmarks.levels import CTX_PER_SLOT, run_level  # noqa: E402
from benchmarks.servers import ServerProcess, free_port  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402

LEVELS = (1, 8, 16)
N_NEW = 64


def node(tree: str, model: str, c: int) -> ServerProcess:
    port = free_port()
    boot = f"import sys, runpy; sys.path.insert(0, {tree!r}); runpy.run_module('dgr', run_name='__main__')"
    return ServerProcess(f"dgr {tree}", [sys.executable, "-c", boot, "run", "--model", model,
                                         "--port", str(port), "--max-running", str(c),
                                         "--max-waiting", str(4 * c),
                                         "--ctx", str(c * CTX_PER_SLOT), "--threads", "2",
                                         "--log-level", "WARNING"], port)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("before")
    parser.add_argument("after")
    parser.add_argument("--rounds", type=int, default=4)
    args = parser.parse_args()
    model = resolve_model_path(None)
    rates = {(name, c): [] for name in ("before", "after") for c in LEVELS}
    for r in range(args.rounds):
        for c in LEVELS:
            order = [("before", args.before), ("after", args.after)]
            for name, tree in (order if r % 2 == 0 else order[::-1]):
                with node(tree, model, c) as server:
                    trio.run(run_level, server.url, c, 8, True)  # warm-up
                    rate = trio.run(run_level, server.url, c, N_NEW, True)["gen_tok_s"]
                rates[name, c].append(rate)
                print(f"round {r} c={c} {name}: {rate:.1f} tokens/s", flush=True)
    print(f"\ndefault model, {N_NEW} tokens a session, {args.rounds} alternating rounds, 2 threads")
    print("| c | before (median) | after (median) | after / before (min / median / max) |")
    print("|---|---|---|---|")
    for c in LEVELS:
        ratios = sorted(a / b for a, b in zip(rates["after", c], rates["before", c]))
        print(f"| {c} | {statistics.median(rates['before', c]):.1f} | "
              f"{statistics.median(rates['after', c]):.1f} | {ratios[0]:.3f} / "
              f"{statistics.median(ratios):.3f} / {ratios[-1]:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
