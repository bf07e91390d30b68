"""Whether a node opened with `--speculation auto` decodes more slowly than one opened
with `off` when no request drafts: nodes as the bench's (16 slots of 2,048 cells),
opened in turn off, auto, off, auto, ...; each serves one untimed burst of the
templated reply at c = 16, then the same bursts as every other node (each after its
earlier user, untimed), every request `speculation: off`. Decode tok/s as the bench
counts it, per burst.

    python evidence/DGR-026/context-timed/node_level.py [PAIRS]
"""

import statistics
import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "draft-cap"))

from burst_node_trace import burst  # noqa: E402

import dgr  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402

OFFSETS = (16_000, 16_100, 16_200)


async def main(pairs):
    rates = {"off": [], "auto": []}
    for n in range(pairs):
        for node_mode in ("off", "auto") if n % 2 == 0 else ("auto", "off"):
            config = dgr.NodeConfig(model_path=resolve_model_path(None), max_running=16,
                                    n_ctx=16 * 2048, speculation=node_mode)
            async with dgr.open_node(config) as node:
                await burst(node, 16, 15_000, "off")  # untimed
                got = [(await burst(node, 16, offset, "off"))[0] for offset in OFFSETS]
            rates[node_mode].append(got)
            print(f"pair {n} node {node_mode:4s}: " + ", ".join(f"{r:6.1f}" for r in got)
                  + " tok/s", flush=True)
    for node_mode, runs in rates.items():
        print(f"{node_mode:4s} node, median of its bursts: "
              f"{statistics.median(r for run in runs for r in run):.1f} tok/s")


if __name__ == "__main__":
    trio.run(main, int(sys.argv[1]) if len(sys.argv) > 1 else 2)
