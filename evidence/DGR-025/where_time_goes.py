"""Where a token's time goes: the figures DGR-025's README quotes about the serving
path and c = 1, each printed here (run it under each wheel to compare).

1. The tiny model, 64 curl clients at once, 256 tokens each, not streamed, with
   the unified pool (dgr's default) and with split KV (--no-kv-unified): tokens
   per second, and the node's own mean llama_decode time per step (/metrics).
2. The default model, one session, 256 tokens streamed: wall time per token and
   the node's mean plan / decode / sample / update per step.
3. llama-server, the same request: its own `predicted_per_token_ms`.

    python evidence/DGR-025/where_time_goes.py
"""

import json
import os
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import serving  # noqa: E402
from benchmarks.concurrency import dgr_server, free_port, llama_server  # noqa: E402
from benchmarks.peers import ensure_peers  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402
from dgr.testmodel import write_test_model  # noqa: E402

PHASES = ("plan", "decode", "sample", "update")


def metrics(url: str) -> dict:
    out = {}
    for line in httpx.get(url + "/metrics").text.splitlines():
        if line.startswith("dgr_steps_total "):
            out["steps"] = float(line.split()[1])
        for phase in PHASES:
            if line.startswith(f'dgr_step_phase_seconds_total{{phase="{phase}"}}'):
                out[phase] = float(line.split()[1])
    return out


def per_step(before: dict, after: dict) -> dict:
    steps = after["steps"] - before["steps"]
    return {p: round(1000 * (after[p] - before[p]) / steps, 3) for p in PHASES} | {
        "steps": steps}


threads = os.cpu_count() or 2
peers = ensure_peers(log=lambda m: print(m, file=sys.stderr), batched_bench=False)
tiny = str(write_test_model(Path(tempfile.mkdtemp()) / "tiny.gguf"))
for name, extra in (("unified pool", []), ("split KV", ["--no-kv-unified"])):
    with dgr_server(tiny, 64, 512, threads, free_port(), extra) as srv:
        serving.clients(srv.url, 64, False)  # warm up
        before = metrics(srv.url)
        rate = serving.clients(srv.url, 64, False)
        print(f"tiny, c=64, not streamed, {name}: {rate:.0f} tok/s; ms per step "
              f"{per_step(before, metrics(srv.url))}")
default = resolve_model_path(None)
body = {"prompt": "The history of the Roman Empire begins with", "max_tokens": 256,
        "temperature": 0, "ignore_eos": True, "stream": True}
with dgr_server(default, 1, 1024, threads, free_port()) as srv:
    httpx.post(srv.url + "/v1/completions", json=body | {"stream": False}, timeout=120)
    before = metrics(srv.url)
    started = time.perf_counter()
    with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=120) as r:
        for _ in r.iter_lines():
            pass
    wall = time.perf_counter() - started
    print(f"default model, c=1, 256 tokens streamed: {1000 * wall / 256:.2f} ms a token "
          f"(wall); ms per step {per_step(before, metrics(srv.url))}")
with llama_server(peers["llama-server"], default, 1, 1024, threads, free_port()) as srv:
    for _ in range(3):
        got = httpx.post(srv.url + "/completion", json={
            "prompt": body["prompt"], "n_predict": 256, "temperature": 0, "ignore_eos": True,
            "cache_prompt": False}, timeout=120).json()
        print(f"llama-server, c=1, 256 tokens: predicted_per_token_ms "
              f"{got['timings']['predicted_per_token_ms']:.2f}")
