"""Shared-prefix workloads for `python -m benchmarks` (the prefix case).

- burst: one request warms the cache with a ~1,500-token system prompt, then 16
  sessions arrive at once, each the system prompt + its own question (streamed,
  greedy, 32 new tokens): TTFT p50/p99, aggregate generated tokens/s, prompt
  tokens the server computed. Cold burst: the same without the warm-up request.
- chat: one conversation of 8 turns over /v1/chat/completions, each turn
  resending the whole history (system prompt, questions, answers): TTFT per
  turn, prompt tokens computed.

Run against dgr with its prefix cache, dgr with --no-prefix-cache, and
llama-server with its own prompt caching as documented (per-slot prompt reuse,
`cache_prompt` on, and the host-memory prompt cache `--cache-ram`, on by
default in the pinned build), all driven identically over HTTP.

Prompt tokens computed: dgr's dgr_prefill_tokens_total (from /metrics);
llama-server's `timings.prompt_n` of each response when it reports one.
"""

from __future__ import annotations

import json
import statistics
import time

import httpx
import trio

from benchmarks.completions import pct
from benchmarks.servers import dgr_server, free_port, llama_server

TOPICS = ["rivers", "mountains", "trains", "bread", "clocks", "bees", "ships", "glass",
          "maps", "salt", "kites", "tea", "bridges", "owls", "paper", "wool"]

SYSTEM_PROMPT = " ".join(
    f"Rule {i}: when a user asks about {TOPICS[i % 16]}, answer in plain words, cite the "
    f"relevant section ({i}), and keep the answer short and friendly." for i in range(60))

QUESTIONS = [f"Question {i}: what should a beginner know first about {t}?"
             for i, t in enumerate(TOPICS)]


def http_client() -> httpx.AsyncClient:
    """A connection per request, for every server alike: llama-server (cpp-httplib) at
    times closed a kept-alive connection under the client's next request ("Server
    disconnected without sending a response": the chat's 8th turn in DGR-020; in DGR-022
    one of two kept-alive chats and 3 of 4 rounds of a kept-alive c=1 client)."""
    return httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_keepalive_connections=0))


async def prefill_counter(client, url, is_dgr) -> float | None:
    if not is_dgr:
        return None
    text = (await client.get(url + "/metrics")).text
    for line in text.splitlines():
        if line.startswith("dgr_prefill_tokens_total "):
            return float(line.split()[1])
    return None


async def stream(client, url, path, body):
    """One streamed request: (TTFT seconds, pieces seen, prompt tokens the server
    computed or None, text)."""
    body = dict(body, stream=True, temperature=0, max_tokens=body.get("max_tokens", 32))
    sent = time.perf_counter()
    first, pieces, prompt_n, texts = None, 0, None, []
    async with client.stream("POST", url + path, json=body) as response:
        if response.status_code != 200:
            await response.aread()
            raise RuntimeError(f"{url}{path}: {response.status_code} {response.text[:200]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event = json.loads(line[6:])
            timings = event.get("timings")
            if timings and "prompt_n" in timings:
                prompt_n = timings["prompt_n"]
            for choice in event.get("choices") or []:
                piece = choice.get("text") or (choice.get("delta") or {}).get("content")
                if piece:
                    pieces += 1
                    texts.append(piece)
                    if first is None:
                        first = time.perf_counter() - sent
    return first, pieces, prompt_n, "".join(texts)


async def burst(url, is_dgr, n=16, n_new=32, warm=True):
    async with http_client() as client:
        if warm:
            await stream(client, url, "/v1/completions",
                         {"prompt": SYSTEM_PROMPT + "\nWarm-up: say hello.", "max_tokens": 4})
        before = await prefill_counter(client, url, is_dgr)
        results = [None] * n
        started = time.perf_counter()

        tag = "" if warm else "(cold) "

        async def one(i):
            results[i] = await stream(client, url, "/v1/completions",
                                      {"prompt": SYSTEM_PROMPT + "\n" + tag + QUESTIONS[i],
                                       "max_tokens": n_new, "ignore_eos": True})

        async with trio.open_nursery() as nursery:
            for i in range(n):
                nursery.start_soon(one, i)
        elapsed = time.perf_counter() - started
        after = await prefill_counter(client, url, is_dgr)
    ttft = [r[0] for r in results]
    reported = [r[2] for r in results]
    computed = (after - before if is_dgr else
                (sum(reported) if all(p is not None for p in reported) else None))
    return {"sessions": n, "ttft_p50_ms": 1000 * pct(ttft, 50), "ttft_p99_ms": 1000 * pct(ttft, 99),
            "gen_tok_s": sum(r[1] for r in results) / elapsed,
            "prompt_tokens_computed": computed}


async def chat(url, is_dgr, turns=8, n_new=48):
    messages = [{"role": "system", "content": SYSTEM_PROMPT}]
    per_turn = []
    async with http_client() as client:
        before = await prefill_counter(client, url, is_dgr)
        reported = []
        for t in range(turns):
            messages.append({"role": "user", "content": QUESTIONS[t]})
            ttft, _, prompt_n, answer = await stream(client, url, "/v1/chat/completions",
                                                     {"messages": messages, "max_tokens": n_new})
            per_turn.append(1000 * ttft)
            reported.append(prompt_n)
            messages.append({"role": "assistant", "content": answer})
        after = await prefill_counter(client, url, is_dgr)
    computed = (after - before if is_dgr else
                (sum(reported) if all(p is not None for p in reported) else None))
    return {"turns": turns, "ttft_ms_per_turn": per_turn,
            "ttft_p50_ms": statistics.median(per_turn),
            "prompt_tokens_computed": computed}


def run(peers, model, threads, out, bar) -> dict:
    """{server: {workload: result}} for dgr with and without its prefix cache and
    llama-server, 4,096 cells per session (the chat reaches ~2,100 tokens of history);
    each server's log in `out`. A server that fails is reported, not hidden."""
    servers = [("dgr, prefix cache", lambda log: dgr_server(
                    model, 16, 4096, threads, free_port(), log=log)),
               ("dgr, no prefix cache", lambda log: dgr_server(
                    model, 16, 4096, threads, free_port(), ["--no-prefix-cache"], log)),
               ("llama-server", lambda log: llama_server(
                    peers["llama-server"], model, 16, 4096, threads, free_port(), log))]
    # the cold burst first: nothing of the system prompt is cached yet
    workloads = [("cold_burst", lambda url, is_dgr: burst(url, is_dgr, warm=False)),
                 ("burst", burst), ("chat", chat)]
    report = {}
    for name, start in servers:
        log = out / f"prefix-{name.replace(', ', '-').replace(' ', '-')}.log"
        report[name] = {}
        with start(log) as srv:
            is_dgr = name.startswith("dgr")
            for workload, run_workload in workloads:
                try:
                    result = trio.run(run_workload, srv.url, is_dgr)
                except Exception as exc:
                    result = {"error": f"{type(exc).__name__}: {exc}"[:300],
                              "exit_code": srv.proc.poll(), "log": str(log)}
                report[name][workload] = result
        bar.update()
    return report


def _prefix_row(name, row, base) -> str:
    if "error" in row:
        return f"| {name} | failed: {row['error']} (exit code {row['exit_code']}, log {row['log']}) | | | | |"
    ratio = (f"{row['ttft_p50_ms'] / base['ttft_p50_ms']:.2f}" if "ttft_p50_ms" in base else "–")
    computed = row["prompt_tokens_computed"]
    return (f"| {name} | {row['ttft_p50_ms']:.0f} | {row['ttft_p99_ms']:.0f} | {ratio} | "
            f"{row['gen_tok_s']:.1f} | {computed if computed is not None else 'not reported'} |")


def markdown(p) -> list[str]:
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
