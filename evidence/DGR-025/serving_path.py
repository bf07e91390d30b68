"""The bench's serving-path case alone (benchmarks/serving.py), its rounds as Markdown.

    python evidence/DGR-025/serving_path.py [--rounds 4] [--levels 1,16,64]
"""

import argparse
import os
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
args = parser.parse_args()
threads = os.cpu_count() or 2
peers = ensure_peers(log=lambda m: print(m, file=sys.stderr), batched_bench=False)
servers = {"dgr": lambda model, c: dgr_server(model, c, 512, threads, free_port()),
           "llama-server": lambda model, c: llama_server(peers["llama-server"], model, c, 512,
                                                         threads, free_port())}
rows = serving.run(servers, [int(x) for x in args.levels.split(",")], args.rounds)
print("\n".join(serving.markdown(rows)))
