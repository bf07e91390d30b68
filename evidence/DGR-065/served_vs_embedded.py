"""Where a served session's decode goes: one session of 64 greedy tokens (no drafts),
4 rounds, from dgr's HTTP server (benchmarks/decode.py's server and stream) and from
the same node embedded in this process (dgr.open_node), one after the other, same
model and options.

    .venv/bin/python evidence/DGR-065/served_vs_embedded.py MODEL.gguf [--weight-repack MODE]
"""

import argparse
import sys
import time
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import dgr  # noqa: E402
from benchmarks import decode  # noqa: E402
from benchmarks.peers import ensure_peers  # noqa: E402

ROUNDS = 4
N_NEW = 64


async def embedded(model: str, mode: str) -> list[float]:
    config = dgr.NodeConfig(model_path=model, max_running=1, n_ctx=decode.CTX_PER_SLOT,
                            n_threads=2, speculation="off", weight_repack=mode)
    rates = []
    async with dgr.open_node(config) as node:
        for r in range(ROUNDS):
            stamps = []
            params = dgr.SamplingParams(max_tokens=N_NEW, temperature=0.0, ignore_eos=True)
            async with node.stream(f"e{r}: Once upon a time", params) as chunks:
                async for chunk in chunks:
                    if chunk.token_id is not None:
                        stamps.append(time.perf_counter())
            rates.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
    return rates


def served(model: str, mode: str) -> list[float]:
    peers = ensure_peers(log=lambda m: print(m, file=sys.stderr), batched_bench=False)
    procs = decode.servers(peers, model, 1, 2, ["--weight-repack", mode])
    with procs["dgr"] as node:
        decode.decode_rate(node.url, 1, 8, True, "warm-up")
        return [decode.decode_rate(node.url, 1, N_NEW, True, f"s{r}")["decode"] for r in range(ROUNDS)]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("model")
    parser.add_argument("--weight-repack", default="invariant")
    args = parser.parse_args()
    for name, rates in (("served", served(args.model, args.weight_repack)),
                        ("embedded", trio.run(embedded, args.model, args.weight_repack))):
        print(f"{name:<9} --weight-repack {args.weight_repack}: decode tokens/s "
              + ", ".join(f"{rate:.1f}" for rate in rates), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
