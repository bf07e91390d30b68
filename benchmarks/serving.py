"""The bench's serving-path case: dgr and llama-server on the tiny test model.

The tiny model (dgr.testmodel: 2 layers, 64 wide) decodes in well under a
millisecond a step, so the tokens per second a server hands out here are what
its serving path (HTTP, scheduling, detokenizing, streaming) can do: on a
large machine with a fast model, the ceiling of the whole node. c curl clients
at once, each one completion of N_NEW tokens (ignore_eos, greedy), streamed and
not; each round starts each server afresh for each c, dgr first; the ratio is
dgr / llama-server in the same round.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

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
            for line in out.decode().splitlines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    choices = json.loads(line[6:])["choices"]
                    tokens += bool(choices and choices[0].get("text"))
        else:
            tokens += json.loads(out)["usage"]["completion_tokens"]
    return tokens / elapsed


def run(servers: dict, levels: list[int], rounds: int) -> list[dict]:
    """servers: name -> (model path, c) -> a server context (dgr's first). Each
    round's {"c": ..., "streamed": ..., name: tok/s, ...} rows."""
    from dgr.testmodel import write_test_model

    model = str(write_test_model(Path(tempfile.mkdtemp()) / "tiny.gguf"))
    out = []
    for r in range(rounds):
        for c in levels:
            got = {}
            for name, start in servers.items():
                with start(model, c) as srv:
                    clients(srv.url, 1, True)  # warm up
                    got[name] = {stream: clients(srv.url, c, stream) for stream in (True, False)}
            for stream in (True, False):
                out.append({"round": r, "c": c, "streamed": stream,
                            **{name: got[name][stream] for name in servers}})
    return out


def markdown(rows: list[dict], ours: str = "dgr", peer: str = "llama-server") -> list[str]:
    lines = ["", "Serving path (tiny model, curl clients, 256 tokens each):", "",
             f"| round | c | streamed | {ours} tok/s | {peer} tok/s | ratio |",
             "|---|---|---|---|---|---|"]
    ratios: dict[tuple[int, bool], list[float]] = {}
    for row in rows:
        ratio = row[ours] / row[peer]
        ratios.setdefault((row["c"], row["streamed"]), []).append(ratio)
        lines.append(f"| {row['round']} | {row['c']} | {'yes' if row['streamed'] else 'no'} | "
                     f"{row[ours]:.0f} | {row[peer]:.0f} | {ratio:.2f} |")
    lines += ["", f"| c | streamed | {ours} / {peer}: median (min-max) |", "|---|---|---|"]
    for (c, stream), values in sorted(ratios.items()):
        lines.append(f"| {c} | {'yes' if stream else 'no'} | {statistics.median(values):.2f} "
                     f"({min(values):.2f}-{max(values):.2f}) |")
    return lines
