"""The serving-path case (benchmarks/serving.py) with dgr under several OpenMP
environments, alternating in each round with llama-server: how long the idle
OpenMP worker spins (libgomp's GOMP_SPINCOUNT, OMP_WAIT_POLICY) against the
CPU the node's Python thread needs on the same cores.

    python evidence/DGR-025/spin_ab.py [--rounds 4] [--levels 1,16,64]
        [--variant NAME=VAR=VALUE[,VAR=VALUE]]...
"""

import argparse
import contextlib
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import serving  # noqa: E402
from benchmarks.concurrency import dgr_server, free_port, llama_server  # noqa: E402
from benchmarks.peers import ensure_peers  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=4)
parser.add_argument("--levels", default="1,16,64")
parser.add_argument("--variant", action="append", default=[])
args = parser.parse_args()
threads = os.cpu_count() or 2
peers = ensure_peers(log=lambda m: print(m, file=sys.stderr), batched_bench=False)


@contextlib.contextmanager
def started_with(env, server):
    """The server started with `env` added to this process's environment."""
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        srv = server.__enter__()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    try:
        yield srv
    finally:
        server.__exit__(None, None, None)


variants = {"dgr": {}}
for spec in args.variant:
    name, _, pairs = spec.partition("=")
    variants[name] = dict(pair.split("=", 1) for pair in pairs.split(","))
servers = {name: (lambda env: lambda model, c: started_with(
               env, dgr_server(model, c, 512, threads, free_port())))(env)
           for name, env in variants.items()}
servers["llama-server"] = lambda model, c: llama_server(peers["llama-server"], model, c, 512,
                                                        threads, free_port())
rows = serving.run(servers, [int(x) for x in args.levels.split(",")], args.rounds)
print("variants:", variants)
for name in variants:
    print("\n".join(serving.markdown(rows, ours=name)))
print("\n| c | streamed | " + " | ".join(f"{n} / dgr" for n in variants if n != "dgr") + " |")
print("|---|---|" + "---|" * (len(variants) - 1))
for c in sorted({r["c"] for r in rows}):
    for stream in (True, False):
        cells = []
        for name in variants:
            if name == "dgr":
                continue
            ratios = [r[name] / r["dgr"] for r in rows if r["c"] == c and r["streamed"] == stream]
            cells.append(f"{statistics.median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})")
        print(f"| {c} | {'yes' if stream else 'no'} | " + " | ".join(cells) + " |")
