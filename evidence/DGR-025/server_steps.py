"""Where a dgr server's steps go on the serving-path load (the tiny model, 64 curl
clients x 256 tokens, not streamed): per load, the steps and their mean phases from
the server's /metrics, beside the same engine stepping 64 sessions alone (engine_c64:
one Python `Engine.step` a step, nothing else running), alternating.

    python evidence/DGR-025/server_steps.py [--rounds 3]
"""

import argparse
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from benchmarks import serving  # noqa: E402
from benchmarks.concurrency import dgr_server, free_port  # noqa: E402
from dgr.testmodel import write_test_model  # noqa: E402
from engine_c64 import C, N_NEW, engine_rate  # noqa: E402

PHASES = ("plan", "decode", "sample", "update")


def step_figures(url: str) -> dict[str, float]:
    wanted = ("dgr_steps_total", "dgr_batch_rows_sum", "dgr_step_phase_seconds_total")
    out = {}
    for line in urllib.request.urlopen(url + "/metrics").read().decode().splitlines():
        if line.startswith(wanted):
            name, value = line.rsplit(" ", 1)
            out[name] = float(value)
    return out


parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=3)
args = parser.parse_args()
model = str(write_test_model(Path(tempfile.mkdtemp()) / "tiny.gguf"))
print(f"c = {C}, {N_NEW} tokens each, not streamed")
print()
print("| round | engine alone: tok/s, ms a step | server: tok/s | steps | rows a step | "
      + " | ".join(f"{p} ms a step" for p in PHASES) + " |")
print("|---|---|---|---|---|" + "---|" * len(PHASES))
for r in range(args.rounds):
    alone = engine_rate(model, True)
    with dgr_server(model, C, 512, 2, free_port()) as srv:
        serving.clients(srv.url, 1, True)  # warm up
        before = step_figures(srv.url)
        rate = serving.clients(srv.url, C, False)
        time.sleep(0.2)  # the last steps' events reach /metrics
        after = step_figures(srv.url)
    d = {k: after[k] - before.get(k, 0.0) for k in after}
    steps = d["dgr_steps_total"]
    phases = [d[f'dgr_step_phase_seconds_total{{phase="{p}"}}'] * 1e3 / steps for p in PHASES]
    print(f"| {r} | {alone:.0f}, {C * 1e3 / alone:.2f} | {rate:.0f} | {steps:.0f} | "
          f"{d['dgr_batch_rows_sum'] / steps:.1f} | " + " | ".join(f"{p:.2f}" for p in phases)
          + " |", flush=True)
