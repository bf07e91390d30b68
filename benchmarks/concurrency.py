"""`python -m dgr bench`: dgr side by side with its peers, in one run.

For each concurrency c: c streaming sessions with fixed prompts, greedy,
N new tokens each (ignore_eos), against dgr's HTTP server and llama-server
(-np c) from the same pinned llama.cpp, driven identically over HTTP; and
llama-cpp-python's `Llama` one request at a time (what Python users embed
today). llama-batched-bench gives the pure-decode ceiling; it runs built from
the pristine pin and from the patched one, alternating, to show what dgr's
patch stack costs at each batch size. Every level runs --rounds rounds, both
servers afresh each round, with each round's ratio reported. A serving-path
case (benchmarks/serving.py) runs the tiny test model, whose steps cost next to
nothing. A mixed-load case measures decoder stalls while a long prompt
prefills, at several --decode-stall values; a prefix case (benchmarks/shared_prefix.py)
measures shared system prompts and a multi-turn chat with and without dgr's
prefix cache, and against llama-server's prompt caching; a grammar case
(benchmarks/grammar.py) whether a JSON-schema-constrained session slows others;
a speculation case (benchmarks/speculation.py) exact speculative decoding on
quoting and natural workloads against llama-server with and without its
n-gram speculation.

Reported: aggregate generated tokens/s, prefill tokens/s, TTFT and inter-token
latency p50/p99, dgr's batch occupancy, KV pressure and queue depth (scraped
from /metrics), rejections, the saturation point, dgr/peer ratios, and a
batch-vs-solo corruption check (tokens and log-probabilities, bitwise).
Output: JSON, Markdown and a PNG plot.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import httpx
import trio

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import grammar as grammar_case  # noqa: E402
from benchmarks import serving, shared_prefix  # noqa: E402
from benchmarks import kv_tier as kv_tier_case  # noqa: E402
from benchmarks import speculation as speculation_case  # noqa: E402
from benchmarks.peers import ensure_peers  # noqa: E402
from dgr.consistency import Verdict  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402
from dgr.telemetry import STEP_PHASES  # noqa: E402

PROMPTS = [
    "The history of the Roman Empire begins with",
    "Write a short story about a robot who learns to paint.",
    "Explain how a refrigerator works, step by step:",
    "def quicksort(items):\n    \"\"\"Sort a list.\"\"\"\n",
    "The most important inventions of the 20th century were",
    "Once upon a time, in a kingdom by the sea, there lived",
    "Here is a recipe for a simple tomato soup:",
    "The theory of evolution by natural selection states that",
]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pct(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


class ServerProcess:
    def __init__(self, name, argv, port, log=None):
        self.name, self.argv, self.port, self.log = name, argv, port, log
        self.url = f"http://127.0.0.1:{port}"
        self.proc = None

    def __enter__(self):
        out = open(self.log, "wb") if self.log else subprocess.DEVNULL
        self.proc = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT)
        if self.log:
            out.close()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.argv}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        raise RuntimeError(f"{self.name} did not become healthy")

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def dgr_server(model, c, ctx_per_slot, threads, port, extra=(), log=None):
    return ServerProcess("dgr", [sys.executable, "-m", "dgr", "run", "--model", model,
                                 "--port", str(port), "--max-running", str(c),
                                 "--max-waiting", str(4 * c), "--ctx", str(c * ctx_per_slot),
                                 "--threads", str(threads), "--log-level", "WARNING", *extra],
                         port, log)


# Weight repacking off for the llama.cpp peers, as in dgr (weight_repack=False): on CPUs
# with AMX the pinned build's AMX repacked matmul crashes (SIGSEGV seen here in
# ggml_backend_amx_mul_mat), and elsewhere repacking makes 1-row and n-row steps differ.
NO_REPACK = ["--no-repack"]
# llama-server's batch in the speculation case: 16 slots, each its sampled token and up
# to 64 drafts (ngram-mod's most)
SPEC_PEER_BATCH = 2048


def llama_server(binary, model, c, ctx_per_slot, threads, port, log=None):
    return ServerProcess("llama-server", [str(binary), "-m", model, "--port", str(port),
                                          "-np", str(c), "-c", str(c * ctx_per_slot),
                                          "-t", str(threads), "-b", "512", "-ub", "512",
                                          *NO_REPACK], port, log)


def completion_body(prompt, n_new, is_dgr, stream):
    """A greedy completion of n_new tokens (ignore_eos). llama-server is asked not to
    reuse a cached prompt (its `cache_prompt`; dgr refuses fields it does not
    implement, and its prefix cache shares what prompts have in common, here no more
    than their first few tokens)."""
    body = {"prompt": prompt, "max_tokens": n_new, "temperature": 0, "ignore_eos": True,
            "stream": stream}
    if not is_dgr:
        body["cache_prompt"] = False
    return body


async def stream_one(client, url, prompt, n_new, logprobs=0, is_dgr=True):
    """One streaming completion (completion_body): token timestamps, text pieces,
    tokens (with logprobs)."""
    body = completion_body(prompt, n_new, is_dgr, stream=True)
    if logprobs:
        body["logprobs"] = logprobs
    sent = time.perf_counter()
    stamps, texts, tokens, gaps, logprobs = [], [], [], [], []
    status = None
    async with client.stream("POST", url + "/v1/completions", json=body) as response:
        status = response.status_code
        if status != 200:
            await response.aread()
            return {"status": status}
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            if not event.get("choices"):
                continue
            choice = event["choices"][0]
            if choice.get("text"):
                stamps.append(time.perf_counter())
                texts.append(choice["text"])
            lp = choice.get("logprobs")
            if lp and lp.get("tokens"):
                tokens.extend(lp["tokens"])
                logprobs.extend(lp.get("token_logprobs") or [])
                for top in lp.get("top_logprobs") or []:
                    values = sorted(top.values(), reverse=True)
                    gaps.append(values[0] - values[1] if len(values) > 1 else float("inf"))
    return {"status": status, "sent": sent, "stamps": stamps, "text": "".join(texts),
            "tokens": tokens, "gaps": gaps, "logprobs": logprobs}


async def whole_one(client, url, prompt, n_new, is_dgr=True):
    """One completion, not streamed (completion_body): its status and tokens."""
    response = await client.post(url + "/v1/completions",
                                 json=completion_body(prompt, n_new, is_dgr, stream=False))
    if response.status_code != 200:
        return {"status": response.status_code}
    return {"status": 200, "generated": response.json()["usage"]["completion_tokens"]}


async def scrape(client, url, stats, stop, interval=0.5):
    """Poll dgr's /metrics for peaks of occupancy, KV pressure and queue depth.
    Rarely: rendering and parsing the metrics costs CPU on the 2 cores the
    servers share, and llama-server is not polled (polling every 50 ms made
    dgr's llama_decode 22.0-22.3 ms instead of 20.4-20.9 ms at c=1 here)."""
    names = {"dgr_batch_occupancy_ratio": "occupancy", "dgr_kv_pressure_ratio": "kv_pressure",
             "dgr_queue_sessions": "queue_depth"}
    while not stop.is_set():
        try:
            text = (await client.get(url + "/metrics")).text
        except httpx.HTTPError:
            break
        for line in text.splitlines():
            name, _, value = line.partition(" ")
            if name in names:
                key = names[name]
                stats[key] = max(stats.get(key, 0.0), float(value))
        await trio.sleep(interval)


def metric_value(text, name):
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


async def run_level(url, c, n_new, is_dgr, streamed=True):
    """c greedy completions of n_new tokens at once (streamed: with each token's time,
    for TTFT and inter-token latency; else only their tokens a second)."""
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=64)) as client:
        results = [None] * c
        stats: dict = {}
        stop = trio.Event()
        before = (await client.get(url + "/metrics")).text if is_dgr else ""
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            if is_dgr:
                nursery.start_soon(scrape, client, url, stats, stop)

            async def one(i):
                results[i] = await (stream_one if streamed else whole_one)(
                    client, url, PROMPTS[i % len(PROMPTS)], n_new, is_dgr=is_dgr)

            async with trio.open_nursery() as sessions:
                for i in range(c):
                    sessions.start_soon(one, i)
            # Before the scraper's sleep ends: waiting for it added up to 0.5 s to
            # dgr's elapsed time (and to no peer's) until DGR-014.
            elapsed = time.perf_counter() - started
            stop.set()
            nursery.cancel_scope.cancel()
        after = (await client.get(url + "/metrics")).text if is_dgr else ""
    ok = [r for r in results if r["status"] == 200]
    generated = sum(len(r["stamps"]) if streamed else r["generated"] for r in ok)
    ttft = [r["stamps"][0] - r["sent"] for r in ok if streamed and r["stamps"]]
    itl = [b - a for r in ok if streamed for a, b in zip(r["stamps"], r["stamps"][1:])]
    out = {"concurrency": c, "gen_tok_s": generated / elapsed, "elapsed_s": elapsed,
           "generated": generated, "rejected": len(results) - len(ok),
           "ttft_p50_ms": 1000 * pct(ttft, 50), "ttft_p99_ms": 1000 * pct(ttft, 99),
           "itl_p50_ms": 1000 * pct(itl, 50), "itl_p99_ms": 1000 * pct(itl, 99)}
    if is_dgr:
        rows = metric_value(after, "dgr_batch_rows_sum") - metric_value(before, "dgr_batch_rows_sum")
        steps = metric_value(after, "dgr_batch_rows_count") - metric_value(before, "dgr_batch_rows_count")
        budget = metric_value(after, "dgr_batch_token_budget")
        prefill = (metric_value(after, "dgr_prefill_tokens_total")
                   - metric_value(before, "dgr_prefill_tokens_total"))
        split = {}
        for phase in STEP_PHASES:
            name = f'dgr_step_phase_seconds_total{{phase="{phase}"}}'
            split[phase] = 1000 * (metric_value(after, name) - metric_value(before, name)) / max(steps, 1)
        split["step"] = 1000 * (metric_value(after, "dgr_step_duration_seconds_sum")
                                - metric_value(before, "dgr_step_duration_seconds_sum")) / max(steps, 1)
        # The loop's overhead: everything in a step but llama_decode.
        split["outside_decode_pct"] = (100 * (split["step"] - split["decode"]) / split["step"]
                                       if split["step"] else 0.0)
        out |= {"step_ms_split": split,
                "prefill_tok_s": prefill / elapsed,
                "mean_occupancy": rows / steps / budget if steps else 0.0,
                "peak_occupancy": stats.get("occupancy", 0.0),
                "peak_kv_pressure": stats.get("kv_pressure", 0.0),
                "peak_queue_depth": stats.get("queue_depth", 0.0)}
    return out


async def corruption_check(url, n_new, c):
    """Each of c prompts alone (with top-2 logprobs), then all c together:
    tokens by the correctness bar, and log-probabilities compared bitwise."""
    prompts = [PROMPTS[i % len(PROMPTS)] + ("" if i < len(PROMPTS) else f" ({i})") for i in range(c)]
    async with httpx.AsyncClient(timeout=600) as client:
        solo = [await stream_one(client, url, p, n_new, logprobs=2) for p in prompts]
        together = [None] * c

        async def one(i):
            together[i] = await stream_one(client, url, prompts[i], n_new, logprobs=2)

        async with trio.open_nursery() as nursery:
            for i in range(c):
                nursery.start_soon(one, i)
    verdict = Verdict()
    for i, (a, b) in enumerate(zip(solo, together)):
        verdict.add(i, a["tokens"], a["gaps"], b["tokens"])
    result = verdict.as_dict()
    result["concurrency"] = c
    result["logprobs_bitwise_equal"] = sum(a["logprobs"] == b["logprobs"] and len(a["logprobs"]) > 0
                                           for a, b in zip(solo, together))
    return result


async def mixed_load(url, long_prompt, is_dgr, n_decoders=4):
    """n decoders stream; then a long prompt arrives. Decoder gaps while it prefills."""
    async with httpx.AsyncClient(timeout=600) as client:
        decoders = [None] * n_decoders
        long_result = {}
        async with trio.open_nursery() as nursery:
            async def decoder(i):
                decoders[i] = await stream_one(client, url, PROMPTS[i], 160, is_dgr=is_dgr)

            for i in range(n_decoders):
                nursery.start_soon(decoder, i)
            await trio.sleep(3.0)  # decoders are past their prefill and streaming
            long_result.update(await stream_one(client, url, long_prompt, 4, is_dgr=is_dgr))
    window = (long_result["sent"], long_result["stamps"][0])
    # gaps between the steps that gave a decoder tokens: a step's accepted drafts come
    # in one write, whose tokens a gap between tokens would count as gaps of ~0
    steps = [[t for i, t in enumerate(d["stamps"]) if i == 0 or t - d["stamps"][i - 1] > 1e-3]
             for d in decoders]
    gaps = [b - a for times in steps for a, b in zip(times, times[1:])
            if window[0] <= b <= window[1] + 1e-3]
    all_gaps = [b - a for times in steps for a, b in zip(times, times[1:])]
    return {"long_prompt_ttft_ms": 1000 * (window[1] - window[0]),
            "gap_median_ms": 1000 * statistics.median(all_gaps),
            "gap_worst_during_prefill_ms": 1000 * max(gaps) if gaps else None,
            "gap_median_during_prefill_ms": 1000 * statistics.median(gaps) if gaps else None}


def llama_without_repack(model, threads):
    """llama_cpp.Llama with weight repacking off, like the other peers (NO_REPACK):
    Llama has no parameter for it, so its model-parameter defaults are wrapped."""
    import llama_cpp.llama_cpp as lowlevel
    from llama_cpp import Llama

    defaults = lowlevel.llama_model_default_params

    def no_repack():
        params = defaults()
        params.use_extra_bufts = False
        return params

    lowlevel.llama_model_default_params = no_repack
    try:
        return Llama(model_path=model, n_ctx=2048, n_threads=threads, verbose=False)
    finally:
        lowlevel.llama_model_default_params = defaults


def llama_cpp_python_level(llm, c, n_new):
    """What Python users embed today: llama_cpp.Llama, one request at a time."""
    generated, ttft, itl = 0, [], []
    started = time.perf_counter()
    for i in range(c):
        llm.reset()
        sent = time.perf_counter()
        stamps = []
        for part in llm.create_completion(PROMPTS[i % len(PROMPTS)], max_tokens=n_new,
                                          temperature=0.0, stream=True):
            if part["choices"][0]["text"]:
                stamps.append(time.perf_counter())
        generated += len(stamps)
        if stamps:
            ttft.append(stamps[0] - sent)
        itl += [b - a for a, b in zip(stamps, stamps[1:])]
    elapsed = time.perf_counter() - started
    return {"concurrency": c, "gen_tok_s": generated / elapsed, "generated": generated,
            "ttft_p50_ms": 1000 * pct(ttft, 50), "ttft_p99_ms": 1000 * pct(ttft, 99),
            "itl_p50_ms": 1000 * pct(itl, 50), "itl_p99_ms": 1000 * pct(itl, 99)}


def engine_decode_rate(model, levels, n_new, threads):
    """dgr's engine alone, in this process: decode tokens/s with c rows per step
    (dgr's default split KV, no repacking), to compare with batched-bench's
    ceiling without HTTP, Python serving work or the client sharing the CPU."""
    from dgr import _engine

    engine = _engine.Engine(model, n_ctx=max(levels) * 512, n_seq_max=max(levels), n_batch=512,
                           n_ubatch=512, n_threads=threads)
    rates = {}
    prompt = list(engine.tokenize(PROMPTS[0]))
    for c in levels:
        for slot in range(c):
            engine.release(slot)
            engine.step(prompt, list(range(len(prompt))), [slot] * len(prompt),
                        [0] * (len(prompt) - 1) + [1])
        tokens, positions = [prompt[-1]] * c, [len(prompt)] * c
        started = time.perf_counter()
        for _ in range(n_new):
            sampled, *_ = engine.step(tokens, positions, list(range(c)), [1] * c)
            tokens, positions = sampled.tolist(), [p + 1 for p in positions]
        rates[str(c)] = c * n_new / (time.perf_counter() - started)
        for slot in range(c):
            engine.release(slot)
    engine.close()
    return rates


def batched_bench(binary, model, levels, n_new, threads, n_prompt=64, env=None):
    """{batch size: (prompt tokens/s, generated tokens/s)} from llama-batched-bench
    (`env`: variables added to its environment)."""
    n_ctx = max(levels) * max(512, n_prompt + n_new)
    out = subprocess.run([str(binary), "-m", model, "-c", str(n_ctx), "-b", "512",
                          "-ub", "512", "-npp", str(n_prompt), "-ntg", str(n_new),
                          "-npl", ",".join(map(str, levels)), "-t", str(threads), *NO_REPACK],
                         capture_output=True, text=True, check=True,
                         env={**os.environ, **(env or {})}).stdout
    rates = {}
    for line in out.splitlines():
        cells = [x.strip() for x in line.strip().strip("|").split("|")]
        if len(cells) >= 10 and cells[2].isdigit():
            rates[int(cells[2])] = (float(cells[5]), float(cells[7]))  # S_PP t/s, S_TG t/s
    return rates


def patch_cost(pristine, patched, model, levels, n_new, threads, n_prompt=64, rounds=3):
    """llama-batched-bench from the pristine and the patched pin, the patched one
    also as dgr runs it (every flash-attention row on the one-row path, patch
    0008), alternating (the machine drifts by 10-30 % within a run): the best of
    `rounds` runs of each, per batch size."""
    best = {"pristine": {}, "patched": {}, "patched_one_row": {}, "n_prompt": n_prompt,
            "n_new": n_new}
    variants = (("pristine", pristine, None), ("patched", patched, None),
                ("patched_one_row", patched, {"GGML_CPU_FA_TILED": "0"}))
    for _ in range(rounds):
        for name, binary, env in variants:
            for c, (pp, tg) in batched_bench(binary, model, levels, n_new, threads, n_prompt,
                                             env).items():
                old = best[name].get(str(c), (0.0, 0.0))
                best[name][str(c)] = (max(old[0], pp), max(old[1], tg))
    return best


def saturation(levels: list[dict]) -> int | None:
    """The concurrency after which every further doubling adds less than 10 %
    throughput (None: the last measured doubling still added 10 % or more)."""
    by_c = {r["concurrency"]: r["gen_tok_s"] for r in levels}
    saturated = None
    for c in sorted(by_c, reverse=True):
        if 2 * c not in by_c:
            continue
        if by_c[2 * c] >= 1.10 * by_c[c]:
            break
        saturated = c
    return saturated


def markdown_patch_cost(cost, rounds) -> list[str]:
    lines = ["", f"llama-batched-bench, patched pin vs pristine pin, {cost['n_prompt']}-token "
             f"prompts + {cost['n_new']} new tokens (best of {rounds} alternating runs; "
             "PP = prompt processing, TG = generation, tokens/s):", "",
             "| batch | pristine PP | patched PP | PP ratio | pristine TG | patched TG | TG ratio |",
             "|---|---|---|---|---|---|---|"]
    for c in sorted((k for k in cost["pristine"]), key=int):
        (pp0, tg0), (pp1, tg1) = cost["pristine"][c], cost["patched"][c]
        lines.append(f"| {c} | {pp0:.1f} | {pp1:.1f} | {pp1 / pp0:.3f} | {tg0:.1f} | {tg1:.1f} | "
                     f"{tg1 / tg0:.3f} |")
    if cost.get("patched_one_row"):
        lines += ["", "The patched pin as dgr runs it (GGML_CPU_FA_TILED=0: every flash-attention "
                  "row on the one-row path, patch 0008), against the pristine pin:", "",
                  "| batch | PP | PP ratio | TG | TG ratio |", "|---|---|---|---|---|"]
        for c in sorted((k for k in cost["pristine"]), key=int):
            (pp0, tg0), (pp2, tg2) = cost["pristine"][c], cost["patched_one_row"][c]
            lines.append(f"| {c} | {pp2:.1f} | {pp2 / pp0:.3f} | {tg2:.1f} | {tg2 / tg0:.3f} |")
    return lines


def markdown(report) -> str:
    lines = markdown_levels(report) if report["dgr"] else []
    m = report.get("mixed_load")
    if m:
        lines.append("")
        lines.append("| mixed load | long prompt TTFT ms | decoder gap median ms | median during prefill ms "
                     "| worst during prefill ms | worst / median |")
        lines.append("|---|---|---|---|---|---|")
        for name, row in m.items():
            worst = row["gap_worst_during_prefill_ms"]
            lines.append(f"| {name} | {row['long_prompt_ttft_ms']:.0f} | {row['gap_median_ms']:.0f} | "
                         f"{row['gap_median_during_prefill_ms'] or 0:.0f} | {worst or 0:.0f} | "
                         f"{(worst or 0) / row['gap_median_ms']:.1f} |")
    if report.get("serving"):
        lines.extend(serving.markdown(report["serving"], "dgr", "llama-server"))
    p = report.get("prefix")
    if p:
        lines.extend(markdown_prefix(p))
    if report.get("grammar"):
        lines.extend(grammar_case.markdown(report["grammar"]))
    if report.get("speculation"):
        lines.extend(speculation_case.markdown(report["speculation"]))
    if report.get("kv_tier"):
        lines.extend(kv_tier_case.markdown(report["kv_tier"]))
    return "\n".join(lines) + "\n"


def _prefix_row(name, row, base) -> str:
    if "error" in row:
        return f"| {name} | failed: {row['error']} (exit code {row['exit_code']}, log {row['log']}) | | | | |"
    ratio = (f"{row['ttft_p50_ms'] / base['ttft_p50_ms']:.2f}" if "ttft_p50_ms" in base else "–")
    computed = row["prompt_tokens_computed"]
    return (f"| {name} | {row['ttft_p50_ms']:.0f} | {row['ttft_p99_ms']:.0f} | {ratio} | "
            f"{row['gen_tok_s']:.1f} | {computed if computed is not None else 'not reported'} |")


def markdown_prefix(p) -> list[str]:
    base = p["llama-server"]
    lines = ["", "Shared prefix, burst: a ~1,500-token system prompt seen once, then 16 sessions "
             "at once with their own questions (32 new tokens each).", "",
             "| server | TTFT p50 ms | TTFT p99 ms | TTFT p50 / llama-server | gen tok/s | "
             "prompt tokens computed |", "|---|---|---|---|---|---|"]
    for name, row in p.items():
        lines.append(_prefix_row(name, row["burst"], base["burst"]))
    lines += ["", "Shared prefix, cold burst: the same 16 sessions with nothing cached (the "
              "system prompt arrives with them).", "",
              "| server | TTFT p50 ms | TTFT p99 ms | TTFT p50 / llama-server | gen tok/s | "
              "prompt tokens computed |", "|---|---|---|---|---|---|"]
    for name, row in p.items():
        lines.append(_prefix_row(name, row["cold_burst"], base["cold_burst"]))
    lines += ["", "Shared prefix, 8-turn chat resending its history (48 new tokens per turn).", "",
              "| server | TTFT p50 ms | TTFT per turn ms | prompt tokens computed |", "|---|---|---|---|"]
    for name, row in p.items():
        c = row["chat"]
        if "error" in c:
            lines.append(f"| {name} | failed: {c['error']} | | |")
            continue
        lines.append(f"| {name} | {c['ttft_p50_ms']:.0f} | "
                     + ", ".join(f"{t:.0f}" for t in c["ttft_ms_per_turn"])
                     + f" | {c['prompt_tokens_computed'] if c['prompt_tokens_computed'] is not None else 'not reported'} |")
    return lines


def markdown_level_rounds(rows: list[dict]) -> list[str]:
    """Each round's dgr / llama-server ratio at each c, and their median, min, max."""
    ratios: dict[int, list[float]] = {}
    for row in rows:
        ratios.setdefault(row["c"], []).append(row["dgr"] / row["llama_server"])
    n = max(len(values) for values in ratios.values())
    lines = ["", "dgr / llama-server by round (each round both servers afresh at each c):",
             "", "| c | " + " | ".join(f"round {i}" for i in range(n))
             + " | median | min | max |", "|---|" + "---|" * (n + 3)]
    for c, values in ratios.items():
        lines.append(f"| {c} | " + " | ".join(f"{v:.3f}" for v in values)
                     + f" | {statistics.median(values):.3f} | {min(values):.3f} | "
                       f"{max(values):.3f} |")
    return lines


def markdown_levels(report) -> list[str]:
    lines = ["| c | dgr tok/s | llama-server tok/s | dgr/server | Llama tok/s | dgr/Llama | "
             "batched-bench ceiling | dgr/ceiling | dgr TTFT p50/p99 ms | dgr ITL p50/p99 ms | "
             "server ITL p50/p99 ms | mean/peak occupancy | peak KV | peak queue | rejected |",
             "|" + "---|" * 15]
    server = {r["concurrency"]: r for r in report["llama_server"]}
    llama = {r["concurrency"]: r for r in report["llama_cpp_python"]}
    ceiling = report["batched_bench_ceiling"]
    for r in report["dgr"]:
        c = r["concurrency"]
        s, py, ceil = server.get(c), llama.get(c), ceiling.get(str(c), ceiling.get(c))
        lines.append(
            f"| {c} | {r['gen_tok_s']:.1f} | {s['gen_tok_s']:.1f} | {r['gen_tok_s'] / s['gen_tok_s']:.2f} | "
            + (f"{py['gen_tok_s']:.1f} | {r['gen_tok_s'] / py['gen_tok_s']:.2f} | " if py else "– | – | ")
            + (f"{ceil:.1f} | {r['gen_tok_s'] / ceil:.2f} | " if ceil else "– | – | ")
            + f"{r['ttft_p50_ms']:.0f}/{r['ttft_p99_ms']:.0f} | {r['itl_p50_ms']:.0f}/{r['itl_p99_ms']:.0f} | "
            f"{s['itl_p50_ms']:.0f}/{s['itl_p99_ms']:.0f} | {r['mean_occupancy']:.3f}/{r['peak_occupancy']:.3f} | "
            f"{r['peak_kv_pressure']:.2f} | {r['peak_queue_depth']:.0f} | {r['rejected']} |")
    if report.get("level_rounds"):
        lines.extend(markdown_level_rounds(report["level_rounds"]))
    for cost in (report.get("patch_cost"), report.get("patch_cost_long")):
        if cost:
            lines.extend(markdown_patch_cost(cost, 3))
    lines.append("")
    lines.append("Engine alone (in-process decode, no HTTP) vs the ceiling: " + ", ".join(
        f"c={c}: {rate:.1f} tok/s ({rate / ceiling[c]:.2f}x)" if c in ceiling else f"c={c}: {rate:.1f}"
        for c, rate in report["engine_decode"].items()) + ".")
    lines.append("")
    lines.append("dgr step time split, mean ms per step of the batch loop (plan = mailbox, "
                 "finish requests, policy, batch fill; update = post-step update, KV release, "
                 "publishing events; step = from the previous step's end, or the loop's "
                 "wake-up, to this one's events published; outside = share of step time not "
                 "in llama_decode):")
    lines.append("")
    lines.append("| c | plan | decode | sample | update | step | outside llama_decode |")
    lines.append("|---|---|---|---|---|---|---|")
    for r in report["dgr"]:
        sp = r["step_ms_split"]
        lines.append(f"| {r['concurrency']} | " + " | ".join(
            f"{sp[k]:.3f}" for k in (*STEP_PHASES, "step"))
            + f" | {sp['outside_decode_pct']:.2f} % |")
    lines.append("")
    top = max(report["levels"])

    def sat(c):
        return f"c = {c}" if c is not None else f"not reached up to c = {top}"

    lines.append(f"Saturation (the c after which every doubling adds < 10 % throughput): "
                 f"dgr {sat(report['saturation']['dgr'])}, "
                 + f"llama-server {sat(report['saturation']['llama_server'])}.")
    for v in report.get("corruption", []):
        lines.append(f"Corruption check, dgr ({v['concurrency']} prompts at c={v['concurrency']}, "
                     f"batch vs solo, greedy): identical tokens {v['identical']}, near-tie "
                     f"divergences {v['near_tie']}, unexplained {v['unexplained']}, "
                     f"log-probabilities bitwise equal {v['logprobs_bitwise_equal']} of {v['concurrency']}.")
    return lines


def plot(report, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4))
    for key, label in (("dgr", "dgr"), ("llama_server", "llama-server"),
                       ("llama_cpp_python", "llama-cpp-python Llama")):
        rows = report.get(key)
        if not rows:
            continue
        a.plot([r["concurrency"] for r in rows], [r["gen_tok_s"] for r in rows], "o-", label=label)
        if key != "llama_cpp_python":
            b.plot([r["concurrency"] for r in rows], [r["itl_p99_ms"] for r in rows], "o-", label=label)
    ceiling = report["batched_bench_ceiling"]
    if ceiling:
        xs = sorted(int(k) for k in ceiling)
        a.plot(xs, [ceiling[str(x)] if str(x) in ceiling else ceiling[x] for x in xs], "k--",
               label="batched-bench ceiling")
    for ax, title in ((a, "aggregate generated tokens/s"), (b, "inter-token latency p99 (ms)")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent sessions")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m dgr bench", description=__doc__.split("\n")[0])
    parser.add_argument("--model", default=None, help="GGUF model (default: Gemma 3 270M Q4_K_M)")
    parser.add_argument("--levels", default="1,2,4,8,16,32", help="concurrency levels")
    parser.add_argument("--new-tokens", type=int, default=64, help="tokens generated per session")
    parser.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "out"), help="output folder")
    parser.add_argument("--kv-conversations", type=int, default=48,
                        help="conversations of the kv_tier case (more than the pool holds)")
    parser.add_argument("--kv-words", type=int, default=900,
                        help="words of each kv_tier conversation's document (~2,000 tokens)")
    parser.add_argument("--kv-turns", type=int, default=4, help="turns of each conversation")
    parser.add_argument("--kv-restore-sizes", default="256,1000,4000,16000",
                        help="prefix sizes of the restore vs recompute measurement")
    parser.add_argument("--kv-servers", default="dgr no tier,dgr host,dgr disk restart,"
                        "llama-server", help="servers of the kv_tier case")
    parser.add_argument("--cases", default="levels,serving,mixed,prefix,grammar,speculation,kv_tier",
                        help="cases to run: levels (dgr vs peers at each c, patch cost, "
                             "corruption check), serving (the serving path: the tiny model, "
                             "c = 1, 16, 64, streamed and not), mixed (mixed load), prefix "
                             "(shared prefixes), grammar (8 sessions beside a JSON-schema one "
                             "vs a sampled one), speculation (quoting and natural workloads, "
                             "dgr off/auto vs llama-server without and with n-gram drafts)")
    parser.add_argument("--spec-levels", default="1,2,4,8,16",
                        help="concurrency levels of the speculation case")
    parser.add_argument("--spec-rounds", type=int, default=1,
                        help="rounds of the speculation case (each runs every server)")
    parser.add_argument("--spec-servers", default=",".join(speculation_case.SERVERS),
                        help="servers of the speculation case")
    parser.add_argument("--spec-workloads", default=",".join(speculation_case.WORKLOADS),
                        help="workloads of the speculation case")
    parser.add_argument("--rounds", type=int, default=4,
                        help="alternating rounds of dgr and llama-server at each c (levels and "
                             "serving cases): each round's ratio, their median, min and max")
    parser.add_argument("--skip-mixed", action="store_true", help="skip the mixed-load case")
    parser.add_argument("--mixed-stalls", default="3,6,0",
                        help="dgr --decode-stall values tried in the mixed-load case (dgr's "
                             "default is 3; 0: fixed --prefill-chunk pieces)")
    parser.add_argument("--render-only", action="store_true",
                        help="re-render bench.md and bench.png from OUT/bench.json, run nothing")
    args = parser.parse_args(argv)
    for option, chosen, known in (
            ("--spec-workloads", args.spec_workloads, speculation_case.WORKLOADS),
            ("--spec-servers", args.spec_servers, speculation_case.SERVERS)):
        unknown = set(chosen.split(",")) - set(known)
        if unknown:
            parser.error(f"{option}: unknown {sorted(unknown)}; the speculation case has "
                         f"{', '.join(known)}")
    if (speculation_case.BURST in args.spec_workloads.split(",")
            and max(map(int, args.spec_levels.split(","))) >= speculation_case.EARLIER_USER):
        parser.error(f"--spec-levels: the {speculation_case.BURST}'s levels stay below "
                     f"{speculation_case.EARLIER_USER}, its earlier user's number")
    if args.render_only:
        out = Path(args.out)
        report = json.loads((out / "bench.json").read_text())
        report["saturation"] = {key: saturation(report[key])
                                for key in ("dgr", "llama_server") if key in report}
        (out / "bench.json").write_text(json.dumps(report, indent=2))
        (out / "bench.md").write_text(markdown(report))
        if report["dgr"]:  # the levels case's figures, as a run plots them
            plot(report, out / "bench.png")
        print(markdown(report))
        return 0
    from tqdm import tqdm

    model = resolve_model_path(args.model)
    cases = set(args.cases.split(","))
    if args.skip_mixed:
        cases.discard("mixed")
    levels = [int(x) for x in args.levels.split(",")] if "levels" in cases else []
    peers = ensure_peers(log=lambda m: print(m, file=sys.stderr), batched_bench="levels" in cases)
    ctx_per_slot = 1024
    report: dict = {"model": model, "levels": levels, "new_tokens": args.new_tokens,
                    "threads": args.threads, "dgr": [], "llama_server": [],
                    "llama_cpp_python": [], "corruption": []}
    long_prompt = " ".join(["The committee reviewed the annual report on regional water supplies, "
                            "noting changes in rainfall, reservoir levels and demand."] * 60)
    checked = sorted({c for c in levels if c >= 8} & {8, max(levels, default=0)})
    mixed_stalls = [float(x) for x in args.mixed_stalls.split(",")]
    steps = (args.rounds * 2 * len(levels) + len(levels) + (2 if levels else 0) + len(checked)
             + (1 if "serving" in cases else 0)
             + (1 + len(mixed_stalls) if "mixed" in cases else 0) + (3 if "prefix" in cases else 0)
             + (1 if "grammar" in cases else 0) + (1 if "speculation" in cases else 0)
             + (1 if "kv_tier" in cases else 0))
    with tqdm(total=steps, desc="bench", unit="run") as bar:
        if levels:
            run_levels(report, peers, model, levels, checked, ctx_per_slot, args, bar)
        if "serving" in cases:
            servers = {"dgr": lambda m, c: dgr_server(m, c, 512, args.threads, free_port()),
                       "llama-server": lambda m, c: llama_server(
                           peers["llama-server"], m, c, 512, args.threads, free_port())}
            report["serving"] = serving.run(servers, [1, 16, 64], args.rounds)
            bar.update()
        if "mixed" in cases:
            report["mixed_load"] = {}
            for stall in mixed_stalls:
                with dgr_server(model, 5, 2048, args.threads, free_port(),
                                ["--decode-stall", str(stall)]) as srv:
                    report["mixed_load"][f"dgr, --decode-stall {stall:g}"] = trio.run(
                        mixed_load, srv.url, long_prompt, True)
                    bar.update()
            with llama_server(peers["llama-server"], model, 5, 2048, args.threads, free_port()) as srv:
                report["mixed_load"]["llama-server"] = trio.run(mixed_load, srv.url, long_prompt, False)
                bar.update()
        if "prefix" in cases:
            report["prefix"] = {}
            # 4,096 cells per session: the chat reaches ~2,100 tokens of history
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)
            servers = [("dgr, prefix cache", lambda log: dgr_server(
                            model, 16, 4096, args.threads, free_port(), log=log)),
                       ("dgr, no prefix cache", lambda log: dgr_server(
                            model, 16, 4096, args.threads, free_port(), ["--no-prefix-cache"], log)),
                       ("llama-server", lambda log: llama_server(
                            peers["llama-server"], model, 16, 4096, args.threads, free_port(), log))]
            workloads = [("cold_burst", lambda url, is_dgr: shared_prefix.burst(url, is_dgr, warm=False)),
                         ("burst", shared_prefix.burst), ("chat", shared_prefix.chat)]
            for name, start in servers:
                log = out / f"prefix-{name.replace(', ', '-').replace(' ', '-')}.log"
                report["prefix"][name] = {}
                with start(log) as srv:
                    is_dgr = name.startswith("dgr")
                    # the cold burst first: nothing of the system prompt is cached yet
                    for workload, run in workloads:
                        try:
                            result = trio.run(run, srv.url, is_dgr)
                        except Exception as exc:  # a server that fails is reported, not hidden
                            result = {"error": f"{type(exc).__name__}: {exc}"[:300],
                                      "exit_code": srv.proc.poll(), "log": str(log)}
                        report["prefix"][name][workload] = result
                bar.update()
        if "grammar" in cases:
            report["grammar"] = grammar_case.run(model, args.threads)
            bar.update()
        if "speculation" in cases:
            out = Path(args.out)
            out.mkdir(parents=True, exist_ok=True)

            def ls(*extra):
                def start(log):
                    server = llama_server(peers["llama-server"], model, 16, 2048, args.threads,
                                          free_port(), log=out / f"spec-{log}.log")
                    # its batch holds 16 slots' drafts (at -b 512 the n-gram modes abort
                    # at c = 16: "batch must be large enough to hold the sampled and
                    # draft tokens"); its ubatches stay 512 (the later -b is the one
                    # llama-server takes)
                    server.argv += ["-b", str(SPEC_PEER_BATCH), *extra]
                    return server
                return start, False

            def dgr(mode):
                return (lambda log: dgr_server(model, 16, 2048, args.threads, free_port(),
                                               ["--speculation", mode],
                                               log=out / f"spec-{log}.log"), True)
            servers = {speculation_case.OFF: dgr("off"), speculation_case.AUTO: dgr("auto"),
                       "llama-server": ls(),
                       "llama-server ngram-mod": ls("--spec-type", "ngram-mod"),
                       "llama-server ngram-simple": ls("--spec-type", "ngram-simple")}
            chosen = args.spec_servers.split(",")
            report["speculation"] = speculation_case.run(
                {name: servers[name] for name in chosen},
                [int(x) for x in args.spec_levels.split(",")], args.spec_rounds,
                args.spec_workloads.split(","))
            bar.update()
        if "kv_tier" in cases:
            report["kv_tier"] = run_kv_tier(peers, model, args)
            bar.update()
    report["saturation"] = {"dgr": saturation(report["dgr"]),
                            "llama_server": saturation(report["llama_server"])}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=2))
    table = markdown(report)
    (out / "bench.md").write_text(table)
    if report["dgr"]:
        plot(report, out / "bench.png")
    print(table)
    print(f"wrote results to {out}")
    return 0


def run_kv_tier(peers, model, args) -> dict:
    """The kv_tier case (benchmarks/kv_tier.py): 16 slots and a 32,768-cell pool for
    dgr, llama-server with -np 16 and 4,096 cells a slot and its --cache-ram default."""
    import tempfile

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    cache_dir = tempfile.mkdtemp(prefix="dgr-kv-bench-")

    def dgr(*extra):
        return lambda log: dgr_server(model, 16, 2048, args.threads, free_port(), list(extra),
                                      log=out / f"kv-{log.replace(' ', '-')}.log")

    servers = {"dgr no tier": (dgr("--cache-ram", "0"), True, False),
               "dgr host": (dgr(), True, False),
               "dgr disk restart": (dgr("--cache-dir", cache_dir), True, True),
               "llama-server": (lambda log: llama_server(
                   peers["llama-server"], model, 16, 4096, args.threads, free_port(),
                   log=out / f"kv-{log.replace(' ', '-')}.log"), False, False)}
    chosen = {name: servers[name] for name in args.kv_servers.split(",") if name}
    report = {"conversations": args.kv_conversations, "words": args.kv_words,
              "turns": args.kv_turns,
              "rotate": kv_tier_case.run_rotate(chosen, args.kv_conversations, args.kv_words,
                                                args.kv_turns, 16)}
    sizes = [int(x) for x in args.kv_restore_sizes.split(",") if x]
    if sizes:
        report["restore"] = trio.run(kv_tier_case.restore_vs_recompute, model, sizes,
                                     args.threads)
    return report


def run_levels(report, peers, model, levels, checked, ctx_per_slot, args, bar) -> None:
    """dgr and its peers at each concurrency level, the patches' cost, corruption checks."""
    report["patch_cost"] = patch_cost(peers["llama-batched-bench"],
                                      peers["llama-batched-bench-patched"], model, levels,
                                      args.new_tokens, args.threads)
    report["batched_bench_ceiling"] = {c: tg for c, (pp, tg) in report["patch_cost"]["pristine"].items()}
    # contexts past 512 cells: the flash-attention patch's reduction
    report["patch_cost_long"] = patch_cost(peers["llama-batched-bench"],
                                           peers["llama-batched-bench-patched"], model, [1, 4],
                                           32, args.threads, n_prompt=2048)
    bar.update()
    report["engine_decode"] = engine_decode_rate(model, levels, args.new_tokens, args.threads)
    bar.update()
    # Rounds alternate dgr and llama-server at each c, each started afresh; the first
    # round's figures fill the tables, every round's ratio the rounds table.
    report["level_rounds"] = []
    for r in range(args.rounds):
        for c in levels:
            with dgr_server(model, c, ctx_per_slot, args.threads, free_port()) as srv:
                ours = trio.run(run_level, srv.url, c, args.new_tokens, True)
                bar.set_postfix(c=c, dgr=f"{ours['gen_tok_s']:.0f}")
                bar.update()
                if r == 0 and c in checked:
                    report["corruption"].append(
                        trio.run(corruption_check, srv.url, args.new_tokens, c))
                    bar.update()
            with llama_server(peers["llama-server"], model, c, ctx_per_slot, args.threads,
                              free_port()) as srv:
                theirs = trio.run(run_level, srv.url, c, args.new_tokens, False)
                bar.update()
            if r == 0:
                report["dgr"].append(ours)
                report["llama_server"].append(theirs)
            report["level_rounds"].append({"round": r, "c": c, "dgr": ours["gen_tok_s"],
                                           "llama_server": theirs["gen_tok_s"]})
    llm = llama_without_repack(model, args.threads)
    for c in levels:
        report["llama_cpp_python"].append(llama_cpp_python_level(llm, c, args.new_tokens))
        bar.update()
    del llm


if __name__ == "__main__":
    sys.exit(main())
