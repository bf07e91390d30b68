"""Per-thread CPU of a server process, and the machine's idle cores, over three loads
of the serving-path workload (benchmarks/serving.py: the tiny model, C curl clients
x 256 tokens): each thread's cores and microseconds of CPU a token.

    python evidence/DGR-025/threads_cpu.py C streamed|plain dgr|llama-server [THREADS]
"""

import glob
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import serving  # noqa: E402
from benchmarks.concurrency import dgr_server, free_port, llama_server  # noqa: E402
from benchmarks.peers import ensure_peers  # noqa: E402
from dgr.testmodel import write_test_model  # noqa: E402

HZ = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[str, float]:
    """tid:name -> CPU seconds (user + system)."""
    out = {}
    for task in glob.glob(f"/proc/{pid}/task/*"):
        try:
            fields = open(task + "/stat").read().rsplit(")", 1)[1].split()
            name = open(task + "/comm").read().strip()
        except OSError:
            continue
        out[f"{task.rsplit('/', 1)[1]}:{name}"] = (int(fields[11]) + int(fields[12])) / HZ
    return out


def machine() -> tuple[float, float]:
    """(idle, all) CPU seconds of the machine."""
    ticks = [int(x) for x in open("/proc/stat").readline().split()[1:]]
    return ticks[3] / HZ, sum(ticks) / HZ


c, stream, which = int(sys.argv[1]), sys.argv[2] == "streamed", sys.argv[3]
threads = int(sys.argv[4]) if len(sys.argv) > 4 else 2
model = str(write_test_model(Path(tempfile.mkdtemp()) / "tiny.gguf"))
if which == "dgr":
    server = dgr_server(model, c, 512, threads, free_port())
else:
    binary = ensure_peers(log=lambda m: None, batched_bench=False)["llama-server"]
    server = llama_server(binary, model, c, 512, threads, free_port())
with server as srv:
    serving.clients(srv.url, 1, True)  # warm up
    for _ in range(3):
        before, (idle0, all0) = thread_cpu(srv.proc.pid), machine()
        started = time.perf_counter()
        rate = serving.clients(srv.url, c, stream)
        wall = time.perf_counter() - started
        after, (idle1, all1) = thread_cpu(srv.proc.pid), machine()
        tokens = rate * wall
        print(f"{which}: {rate:.0f} tok/s, {wall:.3f} s; machine idle {(idle1 - idle0) / wall:.2f}"
              f" of {(all1 - all0) / wall:.2f} cores")
        used = {k: after[k] - before.get(k, 0.0) for k in after}
        for name, cpu in sorted(used.items(), key=lambda kv: -kv[1]):
            if cpu > 0.02:
                print(f"   {name:28s} {cpu / wall:.2f} cores {cpu / tokens * 1e6:4.0f} us/token")
        total = sum(used.values())
        print(f"   {'process':28s} {total / wall:.2f} cores {total / tokens * 1e6:4.0f} us/token")
