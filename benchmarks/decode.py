"""The decode case of `python -m benchmarks`: steady decode at c = 1, 8 and 16,
dgr's defaults against llama-server's defaults from the pristine pin (its weight
repacking included), both up side by side, and how far each is from the memory
bound.

For each concurrency c both servers start with c slots (llama-server -np c, dgr
--max-running c) and a context of 1,024 cells per slot; dgr drafts nothing
(--speculation off: llama-server's defaults draft nothing either, and a
random-weight model's greedy loops would make dgr's n-gram drafts measure the
model rather than the step). Those are the only settings that differ from the
defaults. One warm-up request each; then each round sends c streaming greedy
completions of `n_new` tokens (ignore_eos, short prompts that no earlier request
began with) to one server and then to the other, the server that goes first
alternating by round. A round's decode tokens/s counts the tokens that arrive while
all c sessions decode (from the last session's first token to the first session's
last) over that window, so neither server's prompt prefill is in it: a server that
prefills the prompts in turns beside its first decoders (dgr, by --decode-stall)
and one that prefills them all in its first step (llama-server) are measured on the
same steps. How long the c first tokens took is reported beside it: the mean and
the longest time from request to first token.

The memory bound: a decode step reads every weight a token multiplies (all tensors
but the token embedding, which is read row by row, unless the output matrix shares
it), so at c = 1 the weights' bytes times tokens/s is the read rate the decode
reaches; reported over the machine's read bandwidth with as many cores, measured
here (numpy reductions over 1 GiB, one process a core).
"""

from __future__ import annotations

import multiprocessing
import statistics
import sys
import time

import httpx
import numpy as np
import trio

from benchmarks.completions import PROMPTS, stream_one
from benchmarks.levels import CTX_PER_SLOT
from benchmarks.servers import ServerProcess, free_port

LEVELS = (1, 8, 16)


def weight_bytes_per_token(model: str) -> int:
    """Bytes of the weights one decode step reads (see the module's docstring)."""
    import gguf  # a test and bench dependency; the runtime never parses models this way

    tensors = {t.name: int(t.n_bytes) for t in gguf.GGUFReader(model).tensors}
    tied = "output.weight" not in tensors
    return sum(n for name, n in tensors.items() if name != "token_embd.weight" or tied)


def _read_passes(size: int, repeats: int, barrier, results) -> None:
    data = np.ones(size // 4, dtype=np.float32)
    times = []
    for _ in range(repeats):
        barrier.wait()
        t0 = time.perf_counter()
        data.max()
        times.append(time.perf_counter() - t0)
    results.put(times)


def read_bandwidth(threads: int, size: int = 1 << 30, repeats: int = 5) -> float:
    """Bytes/s this machine reads with `threads` cores: the best of `repeats` passes
    in which `threads` processes (numpy holds the GIL in a reduction) each take
    max() over their own size / threads bytes of float32, started together; a
    pass lasts as long as its slowest process."""
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(threads), context.Queue()
    workers = [context.Process(target=_read_passes, args=(size // threads, repeats, barrier,
                                                          results)) for _ in range(threads)]
    for worker in workers:
        worker.start()
    times = [results.get() for _ in workers]
    for worker in workers:
        worker.join()
    return max(size / max(per_pass) for per_pass in zip(*times))


def servers(peers, model: str, c: int, threads: int, dgr_extra=()) -> dict:
    """dgr (with `dgr_extra` options) and llama-server with c slots, as their users
    start them otherwise."""
    ctx = str(c * CTX_PER_SLOT)
    dgr_port, peer_port = free_port(), free_port()
    return {
        "dgr": ServerProcess("dgr", [sys.executable, "-m", "dgr", "run", "--model", model,
                                     "--port", str(dgr_port), "--threads", str(threads),
                                     "--max-running", str(c), "--ctx", ctx,
                                     "--speculation", "off", "--log-level", "WARNING",
                                     *dgr_extra], dgr_port),
        "llama-server": ServerProcess("llama-server", [str(peers["llama-server"]), "-m", model,
                                                       "--port", str(peer_port), "-t", str(threads),
                                                       "-np", str(c), "-c", ctx], peer_port),
    }


async def _sessions(url: str, c: int, n_new: int, is_dgr: bool, tag: str) -> list[dict]:
    results: list[dict] = [{}] * c
    async with httpx.AsyncClient(timeout=3600) as client:
        async def one(i):
            prompt = f"{tag}.{i}: {PROMPTS[i % len(PROMPTS)]}"
            results[i] = await stream_one(client, url, prompt, n_new, is_dgr=is_dgr)

        async with trio.open_nursery() as nursery:
            for i in range(c):
                nursery.start_soon(one, i)
    return results


def figures(sessions: list[dict]) -> dict:
    """{"decode": tokens/s while all the sessions decode, "ttft_mean", "ttft_max":
    seconds from request to first token} of streamed sessions ({"sent", "stamps"}:
    stream_one's times)."""
    start = max(s["stamps"][0] for s in sessions)
    end = min(s["stamps"][-1] for s in sessions)
    tokens = sum(start < stamp <= end for s in sessions for stamp in s["stamps"])
    if end <= start or tokens == 0:
        raise ValueError("no window had all sessions decoding: ask for more tokens")
    ttfts = [s["stamps"][0] - s["sent"] for s in sessions]
    return {"decode": tokens / (end - start), "ttft_mean": statistics.fmean(ttfts),
            "ttft_max": max(ttfts)}


def decode_rate(url: str, c: int, n_new: int, is_dgr: bool, tag: str) -> dict:
    """figures() of c concurrent sessions (see the module's docstring), their prompts
    told apart by `tag`."""
    results = trio.run(_sessions, url, c, n_new, is_dgr, tag)
    if any(r.get("status") != 200 or len(r["stamps"]) < 2 for r in results):
        raise RuntimeError(f"a session failed at c = {c}: {[r.get('status') for r in results]}")
    return figures(results)


def run(peers, model: str, threads: int, levels=LEVELS, n_new: int = 64, rounds: int = 3,
        bar=None, dgr_extra=()) -> dict:
    """{"levels", "n_new", "weight_bytes", "read_bandwidth", "rounds": [{c: {server:
    decode_rate's figures}}]}; dgr started with `dgr_extra` options besides the case's."""
    result = {"levels": list(levels), "n_new": n_new, "threads": threads,
              "weight_bytes": weight_bytes_per_token(model),
              "read_bandwidth": read_bandwidth(threads),
              "rounds": [{} for _ in range(rounds)]}
    for c in levels:
        procs = servers(peers, model, c, threads, dgr_extra)
        with procs["dgr"] as dgr, procs["llama-server"] as peer:
            urls = {"dgr": dgr.url, "llama-server": peer.url}
            for name, url in urls.items():  # warm-up: first-call costs out of the rounds
                decode_rate(url, 1, 8, name == "dgr", "warm-up")
            for r in range(rounds):
                order = list(urls) if r % 2 == 0 else list(urls)[::-1]
                result["rounds"][r][c] = {name: decode_rate(urls[name], c, n_new,
                                                            name == "dgr", f"{c}.{r}")
                                          for name in order}
                if bar is not None:
                    bar.update()
    return result


def markdown(result: dict) -> list[str]:
    model = f", {result['model']}" if result.get("model") else ""
    bound = result["read_bandwidth"]
    lines = ["", f"## Steady decode (dgr vs llama-server's defaults){model}", "",
             f"Decode tokens/s of c concurrent sessions, {result['n_new']} tokens each, over "
             f"{len(result['rounds'])} alternating rounds; {result['threads']} threads. The "
             f"weights a step reads: {result['weight_bytes'] / 1e6:.0f} MB; this machine reads "
             f"{bound / 1e9:.1f} GB/s with {result['threads']} threads.", "",
             "| c | dgr (median) | llama-server (median) | dgr / llama-server (min / median / max) "
             "| dgr / llama-server of the read bandwidth | first token, mean / longest (s): dgr "
             "| llama-server |", "|---|---|---|---|---|---|---|"]
    for c in result["levels"]:
        per = [row[c] if c in row else row[str(c)] for row in result["rounds"]]
        ratios = sorted(p["dgr"]["decode"] / p["llama-server"]["decode"] for p in per)
        ours, peer = (statistics.median(p[name]["decode"] for p in per)
                      for name in ("dgr", "llama-server"))
        share = (f"{ours * result['weight_bytes'] / bound:.0%} / "
                 f"{peer * result['weight_bytes'] / bound:.0%}" if c == 1 else "")
        first = [f"{statistics.median(p[name]['ttft_mean'] for p in per):.2f} / "
                 f"{max(p[name]['ttft_max'] for p in per):.2f}" for name in ("dgr", "llama-server")]
        lines.append(f"| {c} | {ours:.1f} | {peer:.1f} | {ratios[0]:.3f} / "
                     f"{statistics.median(ratios):.3f} / {ratios[-1]:.3f} | {share} | "
                     f"{first[0]} | {first[1]} |")
    return lines
