"""A/B over HTTP: dgr with the batch loop yielding to Trio between steps
(--step-yield-ms Y) vs not (0), beside llama-server, alternating in one run.

    python3 evidence/DGR-014/ab/yield_ab.py --levels 1,4,16 --yields 0,5 --rounds 2
"""

import argparse
import os
import sys
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from benchmarks.concurrency import dgr_server, free_port, llama_server, run_level  # noqa: E402
from benchmarks.peers import ensure_peers  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--levels", default="1,4,16")
    parser.add_argument("--yields", default="0,5")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    model = resolve_model_path(None)
    peers = ensure_peers(log=lambda m: None)
    threads = os.cpu_count() or 2
    for rnd in range(args.rounds):
        for c in [int(x) for x in args.levels.split(",")]:
            with llama_server(peers["llama-server"], model, c, 2048, threads, free_port()) as srv:
                base = trio.run(run_level, srv.url, c, args.new_tokens, False)["gen_tok_s"]
            print(f"round {rnd} c={c} llama-server {base:.1f} tok/s", flush=True)
            for y in args.yields.split(","):
                with dgr_server(model, c, 2048, threads, free_port(),
                                extra=("--step-yield-ms", y)) as srv:
                    r = trio.run(run_level, srv.url, c, args.new_tokens, True)
                sp = r["step_ms_split"]
                print(f"round {rnd} c={c} dgr yield={y}ms {r['gen_tok_s']:.1f} tok/s "
                      f"({r['gen_tok_s'] / base:.2f}x server) step={sp['step']:.2f} "
                      f"decode={sp['decode']:.2f} outside={sp['outside_decode_pct']:.2f}%", flush=True)


if __name__ == "__main__":
    main()
