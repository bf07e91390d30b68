"""One dgr server (the bench's: --max-running 16, 1,024 cells a slot, 2 threads), the
bench's speculation workload at c = 16 run several times in the order given, each
run's decode tok/s (as the bench counts it) and when its sessions' first and last
tokens came (seconds from the requests being sent).

    python3 evidence/DGR-026/fresh_node_order.py "code edit" off,off,auto,off
"""
import statistics
import sys
from pathlib import Path

import trio

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.concurrency import dgr_server, free_port  # noqa: E402
from benchmarks.speculation import run_level  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402

workload, modes = sys.argv[1], sys.argv[2].split(",")
with dgr_server(resolve_model_path(None), 16, 1024, 2, free_port()) as server:
    for k, mode in enumerate(modes):
        out = trio.run(run_level, server.url, workload, 16, True, {"speculation": mode},
                       50 * k + 3000)
        firsts, lasts = out["first_s"], out["last_s"]
        print(f"r0 {mode}: {out['decode_tok_s']:.1f} tok/s; first tokens at {firsts[0]:.1f}.."
              f"{firsts[-1]:.1f} s (median {statistics.median(firsts):.1f}); last tokens "
              f"{lasts[0]:.1f}..{lasts[-1]:.1f}", flush=True)
