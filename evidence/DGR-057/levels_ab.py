"""The levels case before and after a change, alternating: dgr at one commit (a
checkout built in place: BEFORE) against this checkout, each round starting each
server afresh for each c, which goes first alternating by round and c.

    git worktree add /tmp/dgr-before REV && ln -s $PWD/vendor/llama.cpp /tmp/dgr-before/vendor/
    (cd /tmp/dgr-before && .venv/bin/python setup.py build_ext --inplace)   # this venv's python
    python evidence/DGR-057/levels_ab.py /tmp/dgr-before [--rounds 4] [--levels 1,8,32]

Prints each round's tokens/s and after / before, then per c the median, min and max.
"""

import argparse
import os
import statistics
import sys
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.levels import run_level  # noqa: E402
from benchmarks.servers import ServerProcess, dgr_server, free_port  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402

# `python -m dgr` from another checkout: the editable install's finder (ahead of
# sys.path) taken out, that checkout first on the path
RUN_FROM = ("import runpy, sys; sys.meta_path[:] = [f for f in sys.meta_path "
            "if 'editable' not in getattr(f, '__module__', '')]; "
            "sys.path.insert(0, {dir!r}); runpy.run_module('dgr', run_name='__main__')")


def server(tree, model, c, threads):
    srv = dgr_server(model, c, 1024, threads, free_port())
    if tree is None:
        return srv
    return ServerProcess("dgr-before", [sys.executable, "-c", RUN_FROM.format(dir=tree),
                                        *srv.argv[3:]], srv.port)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("before")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--levels", default="1,8,32")
    parser.add_argument("--new-tokens", type=int, default=48)
    args = parser.parse_args()
    levels = [int(x) for x in args.levels.split(",")]
    model = resolve_model_path(None)
    threads = os.cpu_count() or 2
    ratios = {c: [] for c in levels}
    print("| round | c | before tok/s | after tok/s | after / before |")
    print("|---|---|---|---|---|")
    for r in range(args.rounds):
        for i, c in enumerate(levels):
            order = [args.before, None] if (r + i) % 2 == 0 else [None, args.before]
            got = {}
            for tree in order:
                with server(tree, model, c, threads) as srv:
                    got[tree] = trio.run(run_level, srv.url, c, args.new_tokens, True, True)
            before, after = got[args.before]["gen_tok_s"], got[None]["gen_tok_s"]
            ratios[c].append(after / before)
            print(f"| {r} | {c} | {before:.1f} | {after:.1f} | {after / before:.3f} |", flush=True)
    print()
    print("| c | after / before: median | min | max |")
    print("|---|---|---|---|")
    for c, values in ratios.items():
        print(f"| {c} | {statistics.median(values):.3f} | {min(values):.3f} | {max(values):.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
