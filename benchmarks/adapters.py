"""The adapters case of `python -m benchmarks`: many LoRa adapters in one node, dgr
against llama-server from the same pin with the same adapter files.

`ADAPTERS` random adapters of rank `RANK` on the model's attention weights (written
by dgr.testmodel.write_lora) are served by both: dgr as models a0..a7 (`--lora
aI=FILE`), llama-server with `--lora FILE ... --lora-init-without-apply` (none
applied unless a request's `lora` asks). Both run c = 16 slots, as their users start
them otherwise (dgr --speculation off: a random adapter's greedy loops would measure
drafts, not adapters). Each round sends, to one server and then the other (the
first alternating by round), two workloads of 16 streaming greedy completions of
`n_new` tokens:

- mixed: two sessions on each adapter (dgr: `model`; llama-server: `lora: [{"id": i,
  "scale": 1}]`), aggregate tokens/s from the first request to the last token.
  llama-server batches only the sessions that share an adapter set;
- one adapter: all 16 on adapter 0, and all 16 on the base model: decode tokens/s
  while all 16 decode (benchmarks.decode.figures), so the adapter's cost per step.
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

ADAPTERS = 8
RANK = 16
TARGETS = ("attn_q", "attn_k", "attn_v", "attn_output")
C = 16


def write_adapters(model: str, folder: Path) -> list[str]:
    from dgr import testmodel

    paths = []
    for i in range(ADAPTERS):
        path = folder / f"a{i}.gguf"
        testmodel.write_lora(model, path, rank=RANK, targets=TARGETS, alpha=RANK, seed=i)
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


def run(peers, model: str, threads: int, n_new: int = 64, rounds: int = 3, bar=None) -> dict:
    """{"adapters", "rank", "n_new", "rounds": [{"mixed": {server: tokens/s}, "one":
    {server: decode tokens/s}, "base": {server: decode tokens/s}}]}."""
    mixed = [i // 2 for i in range(C)]
    result = {"adapters": ADAPTERS, "rank": RANK, "targets": list(TARGETS), "n_new": n_new,
              "threads": threads, "rounds": []}
    with tempfile.TemporaryDirectory() as folder:
        adapters = write_adapters(model, Path(folder))
        procs = servers(peers, model, adapters, threads)
        with procs["dgr"] as dgr, procs["llama-server"] as peer:
            urls = {"dgr": dgr.url, "llama-server": peer.url}
            for name, url in urls.items():  # warm-up: first-call costs out of the rounds
                trio.run(_sessions, url, name, [0, None], 8, "warm-up")
            for r in range(rounds):
                order = list(urls) if r % 2 == 0 else list(urls)[::-1]
                row = {"mixed": {}, "one": {}, "base": {}}
                for name in order:
                    row["mixed"][name] = aggregate(
                        trio.run(_sessions, urls[name], name, mixed, n_new, f"m{r}"))
                    for key, on in (("one", 0), ("base", None))[::1 if r % 2 == 0 else -1]:
                        row[key][name] = figures(trio.run(
                            _sessions, urls[name], name, [on] * C, n_new, f"{key}{r}"))["decode"]
                result["rounds"].append(row)
                if bar is not None:
                    bar.update()
    return result


def _spread(values: list) -> str:
    values = sorted(values)
    return f"{values[0]:.3f} / {statistics.median(values):.3f} / {values[-1]:.3f}"


def markdown(result: dict) -> list[str]:
    rounds = result["rounds"]
    lines = ["", "## Adapters (dgr vs llama-server, the same adapter files)", "",
             f"{result['adapters']} random LoRa adapters of rank {result['rank']} on "
             f"{', '.join(result['targets'])}; c = {C}, {result['n_new']} tokens a session, "
             f"{len(rounds)} alternating rounds, {result['threads']} threads.", "",
             "| workload | dgr tok/s (median) | llama-server tok/s (median) | dgr / llama-server "
             "(min / median / max) |", "|---|---|---|---|"]
    for key, label in (("mixed", "two sessions on each adapter (aggregate)"),
                       ("one", "all on one adapter (decode)"), ("base", "all on the base "
                                                                       "model (decode)")):
        ours = [row[key]["dgr"] for row in rounds]
        peer = [row[key]["llama-server"] for row in rounds]
        lines.append(f"| {label} | {statistics.median(ours):.1f} | "
                     f"{statistics.median(peer):.1f} | "
                     f"{_spread([a / b for a, b in zip(ours, peer)])} |")
    costs = [row["one"][name] / row["base"][name] for row in rounds
             for name in ("dgr",)]
    peer_costs = [row["one"]["llama-server"] / row["base"]["llama-server"] for row in rounds]
    lines += ["", f"One adapter against the base model, decode tokens/s ratio (min / median / "
              f"max): dgr {_spread(costs)}, llama-server {_spread(peer_costs)}."]
    return lines
