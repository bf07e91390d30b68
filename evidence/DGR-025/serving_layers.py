"""Where the serving path's tokens go, layer by layer: the tiny model's 64 sessions x 256
greedy tokens (ignore_eos) through
  1. dgr's engine alone (one Python `Engine.step` call a step, engine_c64.py's loop),
  2. an in-process node (`dgr.open_node`, 64 `Node.generate` calls: the pump, the
     readers, no HTTP), with its Trio thread's CPU a token,
  3. dgr's server (`python -m dgr run`, 64 curl clients, not streamed),
  4. llama-server (the same clients),
alternating, each round in that order.

    python evidence/DGR-025/serving_layers.py [--rounds 3]
"""

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import dgr  # noqa: E402
from benchmarks import serving  # noqa: E402
from benchmarks.concurrency import dgr_server, free_port, llama_server  # noqa: E402
from benchmarks.peers import ensure_peers  # noqa: E402
from dgr.testmodel import write_test_model  # noqa: E402
from engine_c64 import C, engine_rate  # noqa: E402

N_NEW = serving.N_NEW


def node_rate(model: str, c: int, threads: int) -> tuple[float, float]:
    """Tokens per second of c `Node.generate` calls at once, and the Trio thread's CPU
    microseconds a token over them (a first load warms the node)."""
    async def main():
        cfg = dgr.NodeConfig(model_path=model, max_running=c, max_waiting=4 * c,
                             n_ctx=c * 512, n_threads=threads)
        params = dgr.SamplingParams(max_tokens=N_NEW, temperature=0, ignore_eos=True)
        async with dgr.open_node(cfg) as node:
            await node.generate("Once upon a time", params)
            started, cpu = time.perf_counter(), time.thread_time()
            async with trio.open_nursery() as nursery:
                for _ in range(c):
                    nursery.start_soon(node.generate, "Once upon a time", params)
            return (c * N_NEW / (time.perf_counter() - started),
                    (time.thread_time() - cpu) / (c * N_NEW) * 1e6)

    return trio.run(main)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    c, threads = C, os.cpu_count() or 2
    peers = ensure_peers(log=lambda m: print(m, file=sys.stderr), batched_bench=False)
    model = str(write_test_model(Path(tempfile.mkdtemp()) / "tiny.gguf"))
    names = ["engine alone", "in-process node", "dgr server", "llama-server"]
    rows = []
    print(f"c = {c}, {N_NEW} tokens each, not streamed; tok/s")
    print()
    print("| round | " + " | ".join(names) + " | node's Trio thread us/token |")
    print("|---|---|---|---|---|---|")
    for r in range(args.rounds):
        engine = engine_rate(model, True)
        node, trio_us = node_rate(model, c, threads)
        with dgr_server(model, c, 512, threads, free_port()) as srv:
            serving.clients(srv.url, 1, True)  # warm up
            server = serving.clients(srv.url, c, False)
        with llama_server(peers["llama-server"], model, c, 512, threads, free_port()) as srv:
            serving.clients(srv.url, 1, True)
            peer = serving.clients(srv.url, c, False)
        rows.append((engine, node, server, peer))
        print(f"| {r} | {engine:.0f} | {node:.0f} | {server:.0f} | {peer:.0f} | {trio_us:.1f} |",
              flush=True)
    print()
    print("| layer | / llama-server: median (min-max) | / the layer above: median (min-max) |")
    print("|---|---|---|")
    for i, name in enumerate(names[:3]):
        to_peer = sorted(row[i] / row[3] for row in rows)
        above = sorted(row[i] / row[i - 1] for row in rows) if i else None
        print(f"| {name} | {statistics.median(to_peer):.2f} ({to_peer[0]:.2f}-{to_peer[-1]:.2f}) | "
              + ("-" if above is None else
                 f"{statistics.median(above):.2f} ({above[0]:.2f}-{above[-1]:.2f})") + " |")
