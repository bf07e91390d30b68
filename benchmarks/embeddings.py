"""The embeddings case of `python -m benchmarks`: an embedding model served by dgr and
by `llama-server --embeddings` from the same pin, the same file, side by side.

The models: random-weight BERT-style encoders of bge-small's shape (384 wide, 12
layers, 12 heads of 32, feed-forward 1,536, 512 positions) and bge-base's (768 wide,
heads of 64, feed-forward 3,072), Q8_0 by llama.cpp's quantizer, mean pooling; written
by dgr.testmodel. Both servers run as their users start them
for embeddings: dgr on the model alone (an encoder makes an embedding node),
llama-server with `--embeddings --pooling mean` and its defaults otherwise.

Each round, for each c in LEVELS, sends the same INPUTS texts of 16 to 512 tokens
(their lengths cycle through LENGTHS) from c clients, one input a request, to one
server and then the other (the first alternating by round): inputs/s from the first
request to the last answer. Every answer is checked (200, one vector of the model's
width).
"""

from __future__ import annotations

import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio

from benchmarks.servers import ServerProcess, free_port

LEVELS = (1, 8, 32)
LENGTHS = (16, 32, 64, 128, 256, 512)
INPUTS = 96
SHAPES = {"bge-small": dict(n_embd=384, n_layer=12, n_head=12, n_ff=1536, n_ctx_train=512),
          "bge-base": dict(n_embd=768, n_layer=12, n_head=12, n_ff=3072, n_ctx_train=512)}
_WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike "
          "november oscar papa quebec romeo sierra tango uniform victor whiskey xray").split()


def write_model(folder: Path, name: str) -> str:
    from dgr import testmodel

    source = testmodel.write_encoder_model(folder / f"{name}-shape-f32.gguf", **SHAPES[name])
    return str(testmodel.quantize(source, folder / f"{name}-shape-q8_0.gguf", "Q8_0"))


def texts() -> list[str]:
    """INPUTS texts, the i-th about LENGTHS[i % 6] tokens long (the test vocabulary
    takes about a token a character) and different from every other."""
    out = []
    for i in range(INPUTS):
        words, size = [f"{i}"], 0
        while size < LENGTHS[i % len(LENGTHS)] - 2:
            word = _WORDS[(i * 7 + len(words)) % len(_WORDS)]
            words.append(word)
            size += len(word) + 1
        out.append(" ".join(words)[:LENGTHS[i % len(LENGTHS)] - 2])
    return out


async def _serve_all(url: str, inputs: list[str], c: int, width: int) -> float:
    """Inputs/s of `inputs` sent by c clients, one a request."""
    queue = list(range(len(inputs)))[::-1]
    failures = []
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=c)) as client:
        async def worker():
            while queue:
                i = queue.pop()
                got = await client.post(url + "/v1/embeddings", json={"input": inputs[i]})
                if got.status_code != 200 or len(got.json()["data"][0]["embedding"]) != width:
                    failures.append((i, got.status_code, got.text[:200]))

        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for _ in range(c):
                nursery.start_soon(worker)
        elapsed = time.perf_counter() - started
    if failures:
        raise RuntimeError(f"{len(failures)} inputs failed, first: {failures[0]}")
    return len(inputs) / elapsed


def run(peers, threads: int, rounds: int = 3, bar=None) -> dict:
    """{"levels", "inputs", "lengths", "threads", "models": [{"name", "shape", "rounds":
    [{c: {server: inputs/s}}]}]}."""
    result = {"levels": list(LEVELS), "inputs": INPUTS, "lengths": list(LENGTHS),
              "threads": threads, "models": []}
    inputs = texts()
    with tempfile.TemporaryDirectory() as folder:
        for name, shape in SHAPES.items():
            model = write_model(Path(folder), name)
            runs = {"name": name, "shape": shape, "rounds": []}
            result["models"].append(runs)
            with _servers(peers, model, threads) as urls:
                for url in urls.values():  # warm-up: first-call costs out of the rounds
                    trio.run(_serve_all, url, inputs[:8], 4, shape["n_embd"])
                for r in range(rounds):
                    order = list(urls) if r % 2 == 0 else list(urls)[::-1]
                    runs["rounds"].append({c: {server: trio.run(_serve_all, urls[server], inputs,
                                                                 c, shape["n_embd"])
                                               for server in order} for c in LEVELS})
                    if bar is not None:
                        bar.update()
    return result


@contextlib.contextmanager
def _servers(peers, model: str, threads: int):
    dgr_port, peer_port = free_port(), free_port()
    dgr = ServerProcess("dgr", [sys.executable, "-m", "dgr", "run", "--model", model, "--port",
                                str(dgr_port), "--threads", str(threads), "--log-level",
                                "WARNING"], dgr_port)
    peer = ServerProcess("llama-server", [
        str(peers["llama-server"]), "-m", model, "--port", str(peer_port), "-t", str(threads),
        "--embeddings", "--pooling", "mean"], peer_port)
    with dgr, peer:
        yield {"dgr": dgr.url, "llama-server": peer.url}


def _spread(values: list) -> str:
    values = sorted(values)
    return f"{values[0]:.3f} / {statistics.median(values):.3f} / {values[-1]:.3f}"


def markdown(result: dict) -> list[str]:
    lines = ["", "## Embeddings (dgr vs llama-server --embeddings, the same file)", "",
             f"Random BERT-style encoders (Q8_0), mean pooling; {result['inputs']} inputs of "
             f"{min(result['lengths'])}-{max(result['lengths'])} tokens, one a request, from c "
             f"clients; alternating rounds, {result['threads']} threads.", "",
             "| model | c | dgr inputs/s (median) | llama-server inputs/s (median) | "
             "dgr / llama-server (min / median / max) |", "|---|---|---|---|---|"]
    for runs in result["models"]:
        rounds = runs["rounds"]
        shape = runs["shape"]
        label = (f"{runs['name']} shape ({shape['n_embd']} wide, heads of "
                 f"{shape['n_embd'] // shape['n_head']}), {len(rounds)} rounds")
        for c in result["levels"]:
            key = c if c in rounds[0] else str(c)  # a report read back from JSON
            ours = [row[key]["dgr"] for row in rounds]
            peer = [row[key]["llama-server"] for row in rounds]
            lines.append(f"| {label} | {c} | {statistics.median(ours):.1f} | "
                         f"{statistics.median(peer):.1f} | "
                         f"{_spread([a / b for a, b in zip(ours, peer)])} |")
    return lines
