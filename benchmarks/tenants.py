"""The tenants case of `python -m benchmarks`: a batch tenant keeps c = 32 long
generations going while an interactive tenant sends a short streamed chat every
second. Per server and round: the chats' time to first token (p50, p99) against the
same chats on the idle server, how many were answered, dgr's mean step while loaded
(from its /metrics: the issue's bound is the idle p99 plus three of them), and the
batch tenant's tokens/s against the batch tenant alone.

dgr runs --scheduling-policy priority; the batch requests carry priority 1 and
user "batch", the chats priority 0 and user "chat" (the fields vLLM's clients send;
llama-server, run with its defaults, ignores them). Every request is greedy, so each
batch prompt's answer and each chat's answer are compared with the same request's
on the unloaded server: `bitwise` says whether all of them were the same.

Rounds alternate which server goes first. A phase sends for PHASE_S seconds: the
batch workers loop over the prompts, the interactive client starts a chat every
CHAT_EVERY_S (each waits at most CHAT_TIMEOUT_S for its first token).
"""

from __future__ import annotations

import json
import re
import statistics
import time

import httpx
import trio

from benchmarks.completions import PROMPTS, pct
from benchmarks.servers import dgr_server, free_port, llama_server

BATCH_C = 32
BATCH_TOKENS = 160
CHAT_TOKENS = 16
PHASE_S = 20.0
CHAT_EVERY_S = 1.0
CHAT_TIMEOUT_S = 60.0
CHATS = ["What is the capital of France?", "Name three primary colours.",
         "How many legs does a spider have?", "Say hello in Spanish.",
         "What is 12 times 12?", "Give me a synonym for happy."]


async def chat(client, url, question):
    """One streamed greedy chat: its time to first token (None: no token within
    CHAT_TIMEOUT_S, or refused) and its text."""
    body = {"messages": [{"role": "user", "content": question}], "max_tokens": CHAT_TOKENS,
            "temperature": 0, "stream": True, "priority": 0, "user": "chat"}
    sent = time.perf_counter()
    first, text = None, []
    with trio.move_on_after(CHAT_TIMEOUT_S):
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                await response.aread()
                return {"ttft": None, "text": None, "status": response.status_code}
            async for line in response.aiter_lines():
                if not line.startswith("data: ") or line == "data: [DONE]":
                    continue
                event = json.loads(line[6:])
                delta = (event.get("choices") or [{}])[0].get("delta") or {}
                if delta.get("content") or delta.get("reasoning_content"):
                    first = first or time.perf_counter()
                    text.append(delta.get("content") or "")
    return {"ttft": None if first is None else first - sent, "text": "".join(text),
            "status": 200}


async def batch_worker(client, url, worker, deadline, done):
    """Greedy completions of BATCH_TOKENS tokens, one after another until `deadline`;
    each finished one is (prompt index, text, tokens)."""
    i = worker
    while time.perf_counter() < deadline:
        body = {"prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": BATCH_TOKENS,
                "temperature": 0, "ignore_eos": True, "priority": 1, "user": "batch"}
        response = await client.post(url + "/v1/completions", json=body)
        if response.status_code == 200:
            answer = response.json()
            done.append((i % len(PROMPTS), answer["choices"][0]["text"],
                         answer["usage"]["completion_tokens"], time.perf_counter()))
        i += BATCH_C


async def step_seconds(client, url):
    """dgr's steps so far: (their count, their seconds), from /metrics; None elsewhere."""
    response = await client.get(url + "/metrics")
    found = dict(re.findall(r"^dgr_step_duration_seconds_(count|sum) (\S+)$", response.text,
                            re.MULTILINE))
    return (float(found["count"]), float(found["sum"])) if len(found) == 2 else None


async def phase(url, batch: bool, chats: bool) -> dict:
    """The batch tenant, the interactive one, or both, for PHASE_S seconds."""
    limits = httpx.Limits(max_connections=BATCH_C + 64, max_keepalive_connections=BATCH_C + 64)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        steps_before = await step_seconds(client, url)
        done, answers = [], []
        start = time.perf_counter()
        deadline = start + PHASE_S
        async with trio.open_nursery() as nursery:
            if batch:
                for worker in range(BATCH_C):
                    nursery.start_soon(batch_worker, client, url, worker, deadline, done)
                await trio.sleep(3.0)  # the batch sessions are decoding

            async def one(k):
                answers.append((k, await chat(client, url, CHATS[k % len(CHATS)])))

            if chats:
                k = 0
                while time.perf_counter() < deadline - 1:
                    nursery.start_soon(one, k)
                    k += 1
                    await trio.sleep(CHAT_EVERY_S)
        ended = max([t for *_, t in done], default=time.perf_counter())
        steps_after = await step_seconds(client, url)
    step_ms = (1000 * (steps_after[1] - steps_before[1]) / (steps_after[0] - steps_before[0])
               if steps_before and steps_after and steps_after[0] > steps_before[0] else None)
    ttfts = [a["ttft"] for _, a in answers if a["ttft"] is not None]
    return {"batch_tokens_per_s": sum(n for _, _, n, _ in done) / (ended - start)
            if done else 0.0,
            "batch_texts": [(p, t) for p, t, _, _ in done],
            "chats": len(answers), "answered": len(ttfts),
            "chat_texts": [(k % len(CHATS), a["text"]) for k, a in answers if a["ttft"]],
            "step_ms": step_ms,
            "ttft_p50_ms": 1000 * statistics.median(ttfts) if ttfts else None,
            "ttft_p99_ms": 1000 * pct(ttfts, 99) if ttfts else None}


def one_server(url) -> dict:
    """The three phases on one server, and its figures."""
    idle = trio.run(phase, url, False, True)
    alone = trio.run(phase, url, True, False)
    loaded = trio.run(phase, url, True, True)
    return figures(idle, alone, loaded)


def same(reference: list, loaded: list) -> bool:
    """Whether every (request, text) answered while loaded has the text of the same
    request unloaded, and each request gave one text throughout."""
    texts: dict = {}
    for key, text in reference + loaded:
        texts.setdefault(key, set()).add(text)
    known = {key for key, _ in reference}
    return all(key in known for key, _ in loaded) and all(len(t) == 1 for t in texts.values())


def figures(idle: dict, alone: dict, loaded: dict) -> dict:
    """The chats on the idle server and beside the batch tenant, the batch tenant
    alone and beside the chats: what a round reports of one server."""
    bitwise = (same(alone["batch_texts"], loaded["batch_texts"])
               and same(idle["chat_texts"], loaded["chat_texts"]))
    return {"idle_ttft_p50_ms": idle["ttft_p50_ms"], "idle_ttft_p99_ms": idle["ttft_p99_ms"],
            "chats": loaded["chats"], "answered": loaded["answered"],
            "ttft_p50_ms": loaded["ttft_p50_ms"], "ttft_p99_ms": loaded["ttft_p99_ms"],
            # dgr's mean step while loaded (its /metrics): the bound's three steps
            "loaded_step_ms": loaded.get("step_ms"),
            "batch_alone_tokens_per_s": alone["batch_tokens_per_s"],
            "batch_loaded_tokens_per_s": loaded["batch_tokens_per_s"],
            "batch_ratio": (loaded["batch_tokens_per_s"] / alone["batch_tokens_per_s"]
                            if alone["batch_tokens_per_s"] else None),
            "bitwise": bitwise}


def run(peers, model, threads, rounds: int, bar=None) -> dict:
    """{"rounds": [{server: one_server's figures}]}: dgr (priority policy) and
    llama-server (its defaults), alternating which goes first."""
    servers = {
        "dgr": lambda: dgr_server(model, BATCH_C, 512, threads, free_port(),
                                  ["--scheduling-policy", "priority"]),
        "llama-server": lambda: llama_server(peers["llama-server"], model, BATCH_C, 512,
                                             threads, free_port())}
    report = {"batch_c": BATCH_C, "batch_tokens": BATCH_TOKENS, "chat_tokens": CHAT_TOKENS,
              "phase_s": PHASE_S, "chat_every_s": CHAT_EVERY_S, "rounds": []}
    for r in range(rounds):
        figures = {}
        for name in (list(servers) if r % 2 == 0 else list(servers)[::-1]):
            with servers[name]() as srv:
                figures[name] = one_server(srv.url)
            if bar is not None:
                bar.update()
        report["rounds"].append(figures)
    return report


def markdown(report: dict) -> list[str]:
    """Markdown lines: each round's figures per server."""
    lines = ["", "## Tenants (a batch tenant at c = 32 and a chat a second)", "",
             f"Batch: {report['batch_c']} workers, greedy completions of "
             f"{report['batch_tokens']} tokens, priority 1; chats: {report['chat_tokens']} "
             f"tokens, priority 0, one every {report['chat_every_s']:g} s; "
             f"{report['phase_s']:g} s phases.", "",
             "| round | server | chats answered | idle TTFT p50 / p99 ms | loaded TTFT p50 / "
             "p99 ms | loaded step ms | batch tok/s alone / loaded (ratio) | bitwise |",
             "|---|---|---|---|---|---|---|---|"]

    def ms(x):
        return "-" if x is None else f"{x:.0f}"

    for r, figures in enumerate(report["rounds"], 1):
        for name, f in figures.items():
            ratio = "-" if f["batch_ratio"] is None else f"{f['batch_ratio']:.2f}"
            lines.append(f"| {r} | {name} | {f['answered']}/{f['chats']} | "
                         f"{ms(f['idle_ttft_p50_ms'])} / {ms(f['idle_ttft_p99_ms'])} | "
                         f"{ms(f['ttft_p50_ms'])} / {ms(f['ttft_p99_ms'])} | "
                         f"{ms(f.get('loaded_step_ms'))} | "
                         f"{f['batch_alone_tokens_per_s']:.1f} / "
                         f"{f['batch_loaded_tokens_per_s']:.1f} ({ratio}) | {f['bitwise']} |")
    return lines
