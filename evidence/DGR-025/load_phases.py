"""Where a serving-path load's time goes, phase by phase: the tiny model, 64 curl
clients x 256 tokens, not streamed (benchmarks/serving.py), against a dgr server
whose steps, admissions and retirements are traced (traced_server.py), then
against llama-server; each server's threads' CPU sampled from /proc every 50 ms.

A load has three phases: the clients arriving (the bench starts 64 curl
processes one after another), all decoding, and the sessions ending (staggered,
as they arrived). Printed per dgr load: each phase's length, its steps and their
mean time and rows, and each thread's CPU in it; for both servers, each thread's
CPU by 50 ms bin (cores; the clock ticks at 100 Hz, so a bin reads in steps of
0.2).

    python evidence/DGR-025/load_phases.py [--loads 3]
"""

import argparse
import json
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from benchmarks import serving  # noqa: E402
from benchmarks.concurrency import ServerProcess, free_port, llama_server  # noqa: E402
from benchmarks.peers import ensure_peers  # noqa: E402
from dgr.testmodel import write_test_model  # noqa: E402

C = 64
TICK = os.sysconf("SC_CLK_TCK")


def thread_ticks(pid: int) -> dict[int, int]:
    """Each thread's user + system clock ticks so far."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            fields = open(f"/proc/{pid}/task/{tid}/stat").read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        out[int(tid)] = int(fields[11]) + int(fields[12])
    return out


def sampled_load(srv) -> tuple[float, float, float, list]:
    """One load with the server's threads sampled: (start, end, tok/s, samples)."""
    samples, stop = [], threading.Event()

    def watch():
        while not stop.is_set():
            samples.append((time.monotonic(), thread_ticks(srv.proc.pid)))
            time.sleep(0.05)

    watcher = threading.Thread(target=watch)
    watcher.start()
    started = time.monotonic()
    rate = serving.clients(srv.url, C, False)
    ended = time.monotonic()
    stop.set()
    watcher.join()
    return started, ended, rate, samples


def busy_threads(samples: list) -> list[int]:
    first, last = samples[0][1], samples[-1][1]
    return [t for t in sorted(last) if last[t] - first.get(t, 0) > 2]


def thread_name(pid: int, tid: int) -> str:
    return "main" if tid == pid else f"t{tid}"


def cores(samples: list, tid: int, a: float, b: float) -> float:
    """The thread's CPU between monotonic times a and b, in cores (nearest samples)."""
    inside = [s for s in samples if a <= s[0] <= b]
    if len(inside) < 2:
        return float("nan")
    (ta, ca), (tb, cb) = inside[0], inside[-1]
    return (cb.get(tid, 0) - ca.get(tid, 0)) / TICK / (tb - ta)


def print_bins(pid: int, started: float, samples: list) -> None:
    tids = busy_threads(samples)
    print("  bin (s from the load's start) | " + " | ".join(thread_name(pid, t) for t in tids))
    for (ta, a), (tb, b) in zip(samples, samples[1:]):
        print(f"  {ta - started:5.2f} | " + " | ".join(
            f"{(b.get(t, 0) - a.get(t, 0)) / TICK / (tb - ta):.2f}" for t in tids))


def dgr_phases(pid, started, ended, samples, trace) -> None:
    steps = [s for s in trace["steps"] if started <= s[0] <= ended]
    admitted = [a[0] for a in trace["admitted"] if started <= a[0] <= ended]
    retired = [r for r in trace["retired"] if started <= r <= ended]
    bounds = [("clients arriving", started, max(admitted)),
              ("all decoding", max(admitted), min(retired)),
              ("sessions ending", min(retired), ended)]
    tids = busy_threads(samples)
    print("  | phase | s | steps | mean step ms | mean rows | "
          + " | ".join(f"{thread_name(pid, t)} cores" for t in tids) + " |")
    print("  |---|---|---|---|---|" + "---|" * len(tids))
    for name, a, b in bounds:
        inside = [s for s in steps if a < s[0] <= b]
        mean_ms = statistics.mean(s[1] for s in inside) * 1e3 if inside else float("nan")
        rows = statistics.mean(s[2] for s in inside) if inside else float("nan")
        print(f"  | {name} | {b - a:.3f} | {len(inside)} | {mean_ms:.2f} | {rows:.1f} | "
              + " | ".join(f"{cores(samples, t, a, b):.2f}" for t in tids) + " |")
    slow = sorted(steps, key=lambda s: -s[1])[:3]
    print("  slowest steps (s from start, ms, rows, decode rows): "
          + "; ".join(f"{s[0] - started:.3f}, {s[1] * 1e3:.1f}, {s[2]}, {s[3]}" for s in slow))


parser = argparse.ArgumentParser()
parser.add_argument("--loads", type=int, default=3)
args = parser.parse_args()
peers = ensure_peers(log=lambda m: print(m, file=sys.stderr), batched_bench=False)
model = str(write_test_model(Path(tempfile.mkdtemp()) / "tiny.gguf"))
trace_path = Path(tempfile.mkdtemp()) / "trace.json"
port = free_port()
argv = [sys.executable, str(HERE / "traced_server.py"), str(trace_path), "--", "run",
        "--model", model, "--port", str(port), "--max-running", str(C),
        "--max-waiting", str(4 * C), "--ctx", str(C * 512), "--threads", "2",
        "--log-level", "WARNING"]
loads = []
with ServerProcess("dgr", argv, port) as srv:
    serving.clients(srv.url, 1, True)  # warm up
    for _ in range(args.loads):
        loads.append(sampled_load(srv))
    pid = srv.proc.pid
trace = json.loads(trace_path.read_text())
for i, (started, ended, rate, samples) in enumerate(loads):
    print(f"\ndgr, load {i}: {rate:.0f} tok/s, {ended - started:.3f} s")
    dgr_phases(pid, started, ended, samples, trace)
    print()
    print_bins(pid, started, samples)
with llama_server(peers["llama-server"], model, C, 512, 2, free_port()) as srv:
    serving.clients(srv.url, 1, True)
    for i in range(args.loads):
        started, ended, rate, samples = sampled_load(srv)
        print(f"\nllama-server, load {i}: {rate:.0f} tok/s, {ended - started:.3f} s")
        print_bins(srv.proc.pid, started, samples)
