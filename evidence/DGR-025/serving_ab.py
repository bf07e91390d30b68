"""The bench's serving-path case (benchmarks/serving.py) with a second dgr, the
package as committed at a revision (snapshot.sh), in the same rounds:

    sh evidence/DGR-025/snapshot.sh /tmp/dgr-A HEAD
    python evidence/DGR-025/serving_ab.py --before /tmp/dgr-A [--rounds 4] [--levels 1,16,64]

Each round starts dgr (this tree), dgr-A and llama-server afresh, in turn.
"""

import argparse
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchmarks import serving  # noqa: E402
from benchmarks.concurrency import dgr_server, free_port, llama_server  # noqa: E402
from benchmarks.peers import ensure_peers  # noqa: E402
from snapshot_server import snapshot_server  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--before", required=True, help="a snapshot.sh copy of the package")
parser.add_argument("--rounds", type=int, default=4)
parser.add_argument("--levels", default="1,16,64")
args = parser.parse_args()
threads = os.cpu_count() or 2
peers = ensure_peers(log=lambda m: print(m, file=sys.stderr), batched_bench=False)
servers = {"dgr": lambda model, c: dgr_server(model, c, 512, threads, free_port()),
           "dgr-A": lambda model, c: snapshot_server(args.before, model, c, threads),
           "llama-server": lambda model, c: llama_server(peers["llama-server"], model, c, 512,
                                                         threads, free_port())}
rows = serving.run(servers, [int(x) for x in args.levels.split(",")], args.rounds)
print("\n".join(serving.markdown(rows, "dgr", "dgr-A")))
print("\n".join(serving.markdown(rows, "dgr", "llama-server")))
print("\n".join(serving.markdown(rows, "dgr-A", "llama-server")))
