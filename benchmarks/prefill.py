"""The prefill case of `python -m benchmarks`: cold prompts at c = 1, dgr's defaults
against llama-server's defaults from the pristine pin, both up side by side. dgr's
host tier is off (--cache-ram 0): the earlier requests' prompts fill the pool, and
saving the one a request evicts (up to 32k tokens of KV) would land in that request's
time; the kv_tier case measures that tier. On CPUs with AMX, llama-server's weight
repacking is off (its default crashes there, benchmarks/servers.py); the report says
which ran.

Each round sends every prompt length to both servers, one request at a time, the
server that goes first alternating by round. A prompt is token ids drawn from the
vocabulary's ordinary range, its first id unique to the request, so neither server
finds any of it cached. A request asks for one token; the prompt's tokens/s are its
length over the request's time (the prefill and one decode step). Reported per length:
each server's median over the rounds and dgr / llama-server as min / median / max of
the rounds' ratios."""

from __future__ import annotations

import random
import statistics
import sys
import time
from pathlib import Path

import httpx

from benchmarks.servers import PEER_REPACK, PEER_REPACK_OFF, ServerProcess, free_port

LENGTHS = (512, 2048, 8192)
# token ids of ordinary text pieces in the default model's vocabulary (Gemma 3: the
# control and special tokens lie below 108 and at the top)
ID_RANGE = (1000, 30000)
# ... and in dgr.testmodel's 370-token vocabulary (its control tokens lie below 10)
TEST_ID_RANGE = (10, 370)
# a full-attention model of realistic shape: a random-weight Llama of about 1B
# parameters (every layer attends the whole context), in Q4_K_M
LLAMA_1B = dict(architecture="llama", n_embd=2048, n_layer=16, n_head=32, n_head_kv=8, n_ff=8192,
                n_ctx_train=32768)


def llama_1b(folder) -> str:
    """The Q4_K_M GGUF of LLAMA_1B in `folder`, written (F32, then llama.cpp's
    quantizer) unless it is there."""
    from dgr.testmodel import quantize, write_test_model

    target = Path(folder) / "llama-1b-random-q4_k_m.gguf"
    if not target.exists():
        source = write_test_model(Path(folder) / "llama-1b-random-f32.gguf", **LLAMA_1B)
        quantize(source, target, "Q4_K_M")
        source.unlink()
    return str(target)


def prompt(length: int, request: int, id_range=ID_RANGE) -> list[int]:
    """`length` token ids, the first one unique to `request` (< 300 requests)."""
    rng = random.Random(request)
    return [id_range[0] + request] + [rng.randrange(*id_range) for _ in range(length - 1)]


def timed(url: str, ids: list[int]) -> float:
    """Seconds for a 1-token completion of `ids`."""
    t0 = time.perf_counter()
    r = httpx.post(url + "/v1/completions", timeout=3600,
                   json={"prompt": ids, "max_tokens": 1, "temperature": 0})
    elapsed = time.perf_counter() - t0
    r.raise_for_status()
    return elapsed


def servers(peers, model: str, threads: int, lengths, dgr_extra=()) -> dict:
    """The two servers as their users start them (but for the module's two settings,
    and dgr's `dgr_extra` options); dgr's queue bound on waiting prompt tokens (16,384 by
    default) raised only as far as the longest prompt needs."""
    longest = max(lengths)
    extra = ["--cache-ram", "0", *dgr_extra]
    if longest > 16384:
        extra += ["--max-waiting-tokens", str(longest)]
    dgr_port, peer_port = free_port(), free_port()
    return {
        "dgr": ServerProcess("dgr", [sys.executable, "-m", "dgr", "run", "--model", model,
                                     "--port", str(dgr_port), "--threads", str(threads),
                                     "--log-level", "WARNING", *extra], dgr_port),
        "llama-server": ServerProcess("llama-server", [str(peers["llama-server"]), "-m", model,
                                                       "--port", str(peer_port),
                                                       "-t", str(threads), *PEER_REPACK],
                                        peer_port),
    }


def run(peers, model: str, threads: int, lengths=LENGTHS, rounds: int = 3, bar=None,
        id_range=ID_RANGE, dgr_extra=()) -> dict:
    """{"lengths", "rounds": [{length: {server: tokens/s}}]}; prompts drawn from
    `id_range` of the model's vocabulary; dgr started with `dgr_extra` options."""
    procs = servers(peers, model, threads, lengths, dgr_extra)
    result = {"lengths": list(lengths), "rounds": [], "peer_repack_off": PEER_REPACK_OFF}
    with procs["dgr"] as dgr, procs["llama-server"] as peer:
        urls = {"dgr": dgr.url, "llama-server": peer.url}
        request = 0
        for name, url in urls.items():  # warm-up: first-call costs out of the rounds
            timed(url, prompt(64, 299 - len(name), id_range))
        for r in range(rounds):
            order = list(urls) if r % 2 == 0 else list(urls)[::-1]
            row = {}
            for length in lengths:
                row[length] = {}
                for name in order:
                    request += 1
                    row[length][name] = length / timed(urls[name], prompt(length, request, id_range))
            result["rounds"].append(row)
            if bar is not None:
                bar.update()
    return result


def markdown(result: dict) -> list[str]:
    model = f", {result['model']}" if result.get("model") else ""
    peer = "llama-server, no repack" if result.get("peer_repack_off") else "llama-server's defaults"
    lines = ["", f"## Cold prefill at c = 1 (dgr, no host tier, vs {peer}){model}", "",
             f"Prompt tokens/s over {len(result['rounds'])} alternating rounds (a 1-token "
             "completion of a prompt nothing is cached of):", "",
             "| prompt tokens | dgr (median) | llama-server (median) | dgr / llama-server "
             "(min / median / max) |", "|---|---|---|---|"]
    for length in result["lengths"]:
        per = [row[length] if length in row else row[str(length)] for row in result["rounds"]]
        ratios = sorted(p["dgr"] / p["llama-server"] for p in per)
        lines.append(f"| {length} | {statistics.median(p['dgr'] for p in per):.0f} | "
                     f"{statistics.median(p['llama-server'] for p in per):.0f} | "
                     f"{ratios[0]:.3f} / {statistics.median(ratios):.3f} / {ratios[-1]:.3f} |")
    return lines
