"""CPU time per token handed out, per server, on the serving-path workload
(benchmarks/serving.py: the tiny model, c curl clients x 256 tokens): the
server's main thread (for dgr, the Trio thread: every Python step of a token)
and the whole process, read from /proc before and after each load. Wall-clock
rates on this machine drift 10-30 % between rounds; CPU time per token does not
depend on what else the machine is doing as much.

    sh evidence/DGR-025/snapshot.sh /tmp/dgr-A HEAD
    python evidence/DGR-025/cpu_per_token.py --before /tmp/dgr-A [--rounds 4] [--levels 16,64]
"""

import argparse
import os
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from benchmarks import serving  # noqa: E402
from benchmarks.concurrency import dgr_server, free_port, llama_server  # noqa: E402
from benchmarks.peers import ensure_peers  # noqa: E402
from snapshot_server import snapshot_server  # noqa: E402
from dgr.testmodel import write_test_model  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--before", help="a snapshot.sh copy of the package (dgr-A)")
parser.add_argument("--rounds", type=int, default=4)
parser.add_argument("--levels", default="16,64")
args = parser.parse_args()
threads = os.cpu_count() or 2
peers = ensure_peers(log=lambda m: print(m, file=sys.stderr), batched_bench=False)
TICK = os.sysconf("SC_CLK_TCK")


def cpu_s(path: str) -> float:
    """utime + stime of /proc/.../stat, in seconds."""
    fields = Path(path).read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


servers = {"dgr": lambda model, c: dgr_server(model, c, 512, threads, free_port())}
if args.before:
    servers["dgr-A"] = lambda model, c: snapshot_server(args.before, model, c, threads)
servers["llama-server"] = lambda model, c: llama_server(peers["llama-server"], model, c, 512,
                                                        threads, free_port())
model = str(write_test_model(Path(tempfile.mkdtemp()) / "tiny.gguf"))
rows = []
for r in range(args.rounds):
    for c in [int(x) for x in args.levels.split(",")]:
        for name, start in servers.items():
            with start(model, c) as srv:
                pid = srv.proc.pid
                serving.clients(srv.url, 1, True)  # warm up
                for stream in (True, False):
                    main0, proc0 = cpu_s(f"/proc/{pid}/task/{pid}/stat"), cpu_s(f"/proc/{pid}/stat")
                    rate = serving.clients(srv.url, c, stream)
                    main1, proc1 = cpu_s(f"/proc/{pid}/task/{pid}/stat"), cpu_s(f"/proc/{pid}/stat")
                    tokens = c * serving.N_NEW
                    rows.append((r, c, stream, name, rate, 1e6 * (main1 - main0) / tokens,
                                 1e6 * (proc1 - proc0) / tokens))
                    print(*rows[-1], flush=True, file=sys.stderr)

print("| round | c | streamed | server | tok/s | main thread CPU us/token | process CPU us/token |")
print("|---|---|---|---|---|---|---|")
for r, c, stream, name, rate, main, proc in rows:
    print(f"| {r} | {c} | {'yes' if stream else 'no'} | {name} | {rate:.0f} | {main:.1f} | {proc:.1f} |")
print()
print("| c | streamed | server | tok/s median | main thread us/token median (min-max) | process us/token median |")
print("|---|---|---|---|---|---|")
for c in [int(x) for x in args.levels.split(",")]:
    for stream in (True, False):
        for name in servers:
            sel = [row for row in rows if row[1] == c and row[2] == stream and row[3] == name]
            mains = [row[5] for row in sel]
            print(f"| {c} | {'yes' if stream else 'no'} | {name} | "
                  f"{statistics.median(row[4] for row in sel):.0f} | "
                  f"{statistics.median(mains):.1f} ({min(mains):.1f}-{max(mains):.1f}) | "
                  f"{statistics.median(row[6] for row in sel):.1f} |")
