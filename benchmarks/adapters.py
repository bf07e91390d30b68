"""The adapters case of `python -m benchmarks`: many LoRa adapters in one node, dgr
against llama-server from the same pin with the same adapter files.

`ADAPTERS` random adapters of rank `RANK` (written by dgr.testmodel.write_lora) are
served by both: dgr as models a0..a31 (`--lora aI=FILE`, --max-loras 32), llama-server
with `--lora FILE ... --lora-init-without-apply` (none applied unless a request's
`lora` asks). On the default model they adapt the attention weights; on the `llama`
model (`--adapters-model llama`: a random Llama of n_embd 512 and 4 layers in Q8_0)
all seven layer weights. Both run `C` slots, as their users start them otherwise
(dgr --speculation off: a random adapter's greedy loops would measure drafts, not
adapters). Each round sends, to one server and then the other (the first alternating
by round), four workloads of streaming greedy completions of `n_new` tokens:

- mixed: two sessions on each of 8 adapters (dgr: `model`; llama-server: `lora: [{"id":
  i, "scale": 1}]`); llama-server batches only the sessions that share an adapter set;
- spread: one session on each of the 32 adapters;
- one: 16 sessions on adapter 0; base: 16 on the base model.

Each workload's aggregate tokens/s (from the first request to the last token) and, for
one and base, decode tokens/s while all 16 decode (benchmarks.decode.figures): the
adapter's cost per step.
"""

from __future__ import annotations

import statistics
import sys
import tempfile
from pathlib import Path

import httpx
import trio

from benchmarks.completions import PROMPTS, stream_one
from benchmarks.decode import figures
from benchmarks.levels import CTX_PER_SLOT
from benchmarks.servers import ServerProcess, free_port

ADAPTERS = 32
RANK = 16
ATTENTION = ("attn_q", "attn_k", "attn_v", "attn_output")
ALL_SEVEN = ATTENTION + ("ffn_gate", "ffn_up", "ffn_down")
C = 32
# the random Llama of --adapters-model llama
LLAMA = dict(architecture="llama", n_embd=512, n_layer=4, n_head=8, n_head_kv=8, n_ff=2048)
# each workload's sessions: the adapter of each (None: the base model)
WORKLOADS = {"mixed": [i // 2 for i in range(16)], "spread": list(range(32)),
             "one": [0] * 16, "base": [None] * 16}


def llama_model(folder: Path) -> str:
    """LLAMA in Q8_0 in `folder` (F32 written, then llama.cpp's quantizer)."""
    from dgr.testmodel import quantize, write_test_model

    source = write_test_model(folder / "llama-512-f32.gguf", **LLAMA)
    target = folder / "llama-512-q8_0.gguf"
    quantize(source, target, "Q8_0")
    source.unlink()
    return str(target)


def write_adapters(model: str, folder: Path, targets) -> list[str]:
    from dgr import testmodel

    paths = []
    for i in range(ADAPTERS):
        path = folder / f"a{i}.gguf"
        testmodel.write_lora(model, path, rank=RANK, targets=targets, alpha=RANK, seed=i)
        paths.append(str(path))
    return paths


def servers(peers, model: str, adapters: list[str], threads: int) -> dict:
    ctx = str(C * CTX_PER_SLOT)
    dgr_port, peer_port = free_port(), free_port()
    loras = [arg for i, path in enumerate(adapters) for arg in ("--lora", f"a{i}={path}")]
    peer_loras = [arg for path in adapters for arg in ("--lora", path)]
    return {
        "dgr": ServerProcess("dgr", [sys.executable, "-m", "dgr", "run", "--model", model,
                                     "--port", str(dgr_port), "--threads", str(threads),
                                     "--max-running", str(C), "--ctx", ctx,
                                     "--speculation", "off", "--log-level", "WARNING",
                                     "--max-loras", str(ADAPTERS), *loras], dgr_port),
        "llama-server": ServerProcess("llama-server", [
            str(peers["llama-server"]), "-m", model, "--port", str(peer_port), "-t",
            str(threads), "-np", str(C), "-c", ctx, *peer_loras, "--lora-init-without-apply"],
            peer_port),
    }


def adapter_fields(server: str, adapter) -> dict:
    """The body fields that put a session on adapter `adapter` (None: the base model)."""
    if adapter is None:
        return {}
    if server == "dgr":
        return {"model": f"a{adapter}"}
    return {"lora": [{"id": adapter, "scale": 1.0}]}


async def _sessions(url: str, server: str, adapters: list, n_new: int, tag: str) -> list:
    results: list = [None] * len(adapters)
    async with httpx.AsyncClient(timeout=3600) as client:
        async def one(i):
            prompt = f"{tag}.{i}: {PROMPTS[i % len(PROMPTS)]}"
            results[i] = await stream_one(client, url, prompt, n_new, is_dgr=server == "dgr",
                                          extra=adapter_fields(server, adapters[i]))

        async with trio.open_nursery() as nursery:
            for i in range(len(adapters)):
                nursery.start_soon(one, i)
    if any(r.get("status") != 200 or len(r["stamps"]) < 2 for r in results):
        raise RuntimeError(f"a session failed on {server}: {[r.get('status') for r in results]}")
    return results


def aggregate(sessions: list) -> float:
    """Tokens/s of the sessions from the first request sent to the last token."""
    start = min(s["sent"] for s in sessions)
    end = max(s["stamps"][-1] for s in sessions)
    return sum(len(s["stamps"]) for s in sessions) / (end - start)


def run(peers, model: str, threads: int, n_new: int = 64, rounds: int = 3, bar=None,
        which: str = "default") -> dict:
    """{"adapters", "rank", "targets", "model", "n_new", "rounds": [{workload: {server:
    {"aggregate": tokens/s, "decode": tokens/s (one and base)}}}]}."""
    result = {"adapters": ADAPTERS, "rank": RANK, "n_new": n_new, "threads": threads,
              "rounds": []}
    with tempfile.TemporaryDirectory() as folder:
        if which == "llama":
            model = llama_model(Path(folder))
            result |= {"model": "random Llama, n_embd 512, 4 layers, Q8_0",
                       "targets": list(ALL_SEVEN)}
        else:
            result |= {"model": "the default model", "targets": list(ATTENTION)}
        adapters = write_adapters(model, Path(folder), result["targets"])
        procs = servers(peers, model, adapters, threads)
        with procs["dgr"] as dgr, procs["llama-server"] as peer:
            urls = {"dgr": dgr.url, "llama-server": peer.url}
            for name, url in urls.items():  # warm-up: first-call costs out of the rounds
                trio.run(_sessions, url, name, [0, None], 8, "warm-up")
            for r in range(rounds):
                order = list(urls) if r % 2 == 0 else list(urls)[::-1]
                row = {key: {} for key in WORKLOADS}
                for name in order:
                    for key in list(WORKLOADS)[::1 if r % 2 == 0 else -1]:
                        sessions = trio.run(_sessions, urls[name], name, WORKLOADS[key], n_new,
                                            f"{key}{r}")
                        row[key][name] = {"aggregate": aggregate(sessions)}
                        if key in ("one", "base"):
                            row[key][name]["decode"] = figures(sessions)["decode"]
                result["rounds"].append(row)
                if bar is not None:
                    bar.update()
    return result


def _spread(values: list) -> str:
    values = sorted(values)
    return f"{values[0]:.3f} / {statistics.median(values):.3f} / {values[-1]:.3f}"


def markdown(result: dict) -> list[str]:
    rounds = result["rounds"]

    def values(key, name, figure="aggregate"):
        return [row[key][name][figure] for row in rounds]

    lines = ["", f"## Adapters on {result['model']} (dgr vs llama-server, the same adapter "
             "files)", "",
             f"{result['adapters']} random LoRa adapters of rank {result['rank']} on "
             f"{', '.join(result['targets'])}; {C} slots, {result['n_new']} tokens a session, "
             f"{len(rounds)} alternating rounds, {result['threads']} threads.", "",
             "| workload | dgr tok/s (median) | llama-server tok/s (median) | dgr / llama-server "
             "(min / median / max) |", "|---|---|---|---|"]
    for key, figure, label in (
            ("mixed", "aggregate", "8 adapters x 2 sessions (aggregate)"),
            ("spread", "aggregate", "32 adapters x 1 session (aggregate)"),
            ("one", "aggregate", "16 sessions on one adapter (aggregate)"),
            ("base", "aggregate", "16 sessions on the base model (aggregate)"),
            ("one", "decode", "16 sessions on one adapter (decode)"),
            ("base", "decode", "16 sessions on the base model (decode)")):
        ours, peer = values(key, "dgr", figure), values(key, "llama-server", figure)
        lines.append(f"| {label} | {statistics.median(ours):.1f} | "
                     f"{statistics.median(peer):.1f} | "
                     f"{_spread([a / b for a, b in zip(ours, peer)])} |")
    lines.append("")
    for name in ("dgr", "llama-server"):
        one = [a / b for a, b in zip(values("one", name, "decode"), values("base", name, "decode"))]
        mixed = [a / b for a, b in zip(values("mixed", name), values("base", name))]
        lines.append(f"- {name} against itself on the base model (min / median / max): one "
                     f"adapter's decode {_spread(one)}; 8 x 2 aggregate {_spread(mixed)}.")
    return lines
