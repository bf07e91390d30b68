"""The serving path alone: dgr and llama-server on the tiny test model.

The tiny model (dgr.testmodel: 2 layers, 64 wide) decodes in well under a
millisecond a step, so the tokens per second a server hands out here are what
its serving path (HTTP, scheduling, detokenizing, streaming) can do. c curl
clients at once, each one completion of 256 tokens (ignore_eos, greedy),
streamed or not; each round starts each server afresh, dgr first, then
llama-server; the ratio is dgr / llama-server in the same round.

    python evidence/DGR-025/serving_path.py [--rounds 4] [--levels 1,16,64]
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks.concurrency import dgr_server, free_port, llama_server  # noqa: E402
from benchmarks.peers import ensure_peers  # noqa: E402
from dgr.testmodel import write_test_model  # noqa: E402

N_NEW = 256


def clients(url: str, c: int, stream: bool) -> float:
    """c curl clients at once; the tokens per second they received together."""
    body = json.dumps({"prompt": "Once upon a time", "max_tokens": N_NEW, "temperature": 0,
                       "ignore_eos": True, "stream": stream})
    argv = ["curl", "-s", "-N", "-H", "Content-Type: application/json", "-d", body,
            url + "/v1/completions"]
    started = time.perf_counter()
    procs = [subprocess.Popen(argv, stdout=subprocess.PIPE) for _ in range(c)]
    outs = [p.communicate()[0] for p in procs]
    elapsed = time.perf_counter() - started
    tokens = 0
    for out in outs:
        if stream:
            events = [line[6:] for line in out.decode().splitlines()
                      if line.startswith("data: ") and line != "data: [DONE]"]
            tokens += sum(1 for e in events if json.loads(e)["choices"]
                          and json.loads(e)["choices"][0].get("text"))
        else:
            tokens += json.loads(out)["usage"]["completion_tokens"]
    return tokens / elapsed


parser = argparse.ArgumentParser()
parser.add_argument("--rounds", type=int, default=4)
parser.add_argument("--levels", default="1,16,64")
args = parser.parse_args()
levels = [int(x) for x in args.levels.split(",")]
threads = os.cpu_count() or 2
peers = ensure_peers(log=lambda m: print(m, file=sys.stderr), batched_bench=False)
model = str(write_test_model(Path(tempfile.mkdtemp()) / "tiny.gguf"))
ratios: dict[tuple[int, bool], list[float]] = {}
print("| round | c | streamed | dgr tok/s | llama-server tok/s | ratio |")
print("|---|---|---|---|---|---|")
for r in range(args.rounds):
    for c in levels:
        got = {}
        for name in ("dgr", "llama-server"):
            start = (dgr_server(model, c, 512, threads, free_port()) if name == "dgr" else
                     llama_server(peers["llama-server"], model, c, 512, threads, free_port()))
            with start as srv:
                clients(srv.url, 1, True)  # warm up
                got[name] = {stream: clients(srv.url, c, stream) for stream in (True, False)}
        for stream in (True, False):
            ratio = got["dgr"][stream] / got["llama-server"][stream]
            ratios.setdefault((c, stream), []).append(ratio)
            print(f"| {r} | {c} | {'yes' if stream else 'no'} | {got['dgr'][stream]:.0f} | "
                  f"{got['llama-server'][stream]:.0f} | {ratio:.2f} |", flush=True)
print()
print("| c | streamed | dgr / llama-server: median (min-max) |")
print("|---|---|---|")
for (c, stream), values in sorted(ratios.items()):
    print(f"| {c} | {'yes' if stream else 'no'} | {statistics.median(values):.2f} "
          f"({min(values):.2f}-{max(values):.2f}) |")
