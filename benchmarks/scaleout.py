"""The scaleout case of `python -m benchmarks`: two dgr nodes behind a router that
users run (smg, vllm-router), conversations of several turns through it.

For each router and policy (cache_aware, round_robin) in one run: C conversations,
each with a system prompt of its own (~800 tokens) and `turns` short user turns,
the conversations concurrent and each one's turns in order, non-streamed, greedy,
through the official `openai` client without client retries. Reported: how many
later turns (turn 2 on) landed on the node of the conversation's first turn, the
share of the later turns' prompt tokens that came from the prefix cache
(`usage.prompt_tokens_details.cached_tokens`), the run's time and the requests
that failed. Then, with the cache-aware policy, the same run with one node killed
(SIGKILL) and with one node drained (`POST /v1/dgr/drain`) after the first
turns: the requests lost and the run's time.
"""

from __future__ import annotations

import random
import shutil
import signal
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx

from benchmarks.servers import ServerProcess, free_port

ROUTERS = ("smg", "vllm-router")
WORDS = ("river stone market window garden letter silver morning engine lantern harbor "
         "orchard candle meadow thunder copper ribbon valley compass feather").split()


def _system_prompt(conversation: int, words: int = 600) -> str:
    rng = random.Random(conversation)
    return (f"Conversation {conversation}. You are a careful assistant. Background: "
            + " ".join(rng.choice(WORDS) for _ in range(words)))


def router_binary(name: str) -> str | None:
    here = Path(sys.executable).parent / name
    return str(here) if here.exists() else shutil.which(name)


def _router(name: str, workers: list[str], policy: str) -> ServerProcess:
    port = free_port()
    argv = [router_binary(name), *(["launch"] if name == "smg" else []), "--worker-urls",
            *workers, "--policy", policy, "--host", "127.0.0.1", "--port", str(port)]
    return ServerProcess(name, argv, port)


def _conversation(base: str, model: str, conversation: int, turns: int, nodes: dict,
                  after_first, new_tokens: int) -> list[dict]:
    import openai

    client = openai.OpenAI(base_url=base + "/v1", api_key="unused", max_retries=0, timeout=300)
    messages = [{"role": "system", "content": _system_prompt(conversation)}]
    out = []
    for turn in range(turns):
        if turn == 1:
            after_first()
        messages.append({"role": "user", "content": f"Question {turn + 1}: name one thing."})
        try:
            reply = client.chat.completions.create(model=model, messages=messages,
                                                   max_tokens=new_tokens, temperature=0)
        except Exception as exc:  # what the client saw
            out.append({"turn": turn, "failed": f"{type(exc).__name__}: {str(exc)[:120]}"})
            messages.append({"role": "assistant", "content": "(no answer)"})
            continue
        details = reply.usage.prompt_tokens_details
        out.append({"turn": turn, "prompt_tokens": reply.usage.prompt_tokens,
                    "cached": (details.cached_tokens or 0) if details else 0,
                    "node": nodes.get(reply.id)})
        messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    return out


def run(model: str, threads: int, conversations: int = 6, turns: int = 3,
        new_tokens: int = 8, routers=ROUTERS, bar=None) -> dict:
    """{"runs": [{router, policy, event, time_s, later_same_node, cached_share, failed}]}."""
    from benchmarks.servers import dgr_server

    results = []
    for router in routers:
        if router_binary(router) is None:
            results.append({"router": router, "skipped": "not installed"})
            continue
        for policy, event in (("cache_aware", None), ("round_robin", None),
                              ("cache_aware", "kill"), ("cache_aware", "drain")):
            nodes = [dgr_server(model, 4, 4096, max(1, threads // 2), free_port(),
                                extra=["--grace", "120"]) for _ in range(2)]
            with nodes[0] as a, nodes[1] as b:
                with _router(router, [a.url, b.url], policy) as front:
                    listed = httpx.get(front.url + "/v1/models", timeout=10).json()
                    model_id = listed["data"][0]["id"]
                    fired = []

                    def after_first():
                        # the first conversation to reach its second turn kills or
                        # drains node b, once
                        if event and not fired:
                            fired.append(time.monotonic())
                            if event == "kill":
                                b.proc.send_signal(signal.SIGKILL)
                            else:
                                httpx.post(b.url + "/v1/dgr/drain", timeout=10)

                    start = time.monotonic()
                    with ThreadPoolExecutor(conversations) as pool:
                        runs = list(pool.map(lambda c: _conversation(
                            front.url, model_id, c, turns, {}, after_first, new_tokens),
                            range(conversations)))
                    elapsed = time.monotonic() - start
            later = [t for conv in runs for t in conv if t["turn"] > 0 and "failed" not in t]
            prompt = sum(t["prompt_tokens"] for t in later)
            results.append({
                "router": router, "policy": policy, "event": event, "time_s": elapsed,
                "requests": sum(len(conv) for conv in runs),
                "failed": [t["failed"] for conv in runs for t in conv if "failed" in t],
                "cached_share": sum(t["cached"] for t in later) / prompt if prompt else 0.0,
            })
            if bar is not None:
                bar.update()
    return {"conversations": conversations, "turns": turns, "runs": results}


def markdown(result: dict) -> list[str]:
    lines = ["", "## Scale-out: two nodes behind a router", "",
             f"{result['conversations']} conversations x {result['turns']} turns (a ~800-token "
             "system prompt each), non-streamed, no client retries:", "",
             "| router | policy | event | requests | failed | later turns' prompt tokens "
             "cached | time s |", "|---|---|---|---|---|---|---|"]
    for r in result["runs"]:
        if "skipped" in r:
            lines.append(f"| {r['router']} | - | - | - | - | {r['skipped']} | - |")
            continue
        lines.append(f"| {r['router']} | {r['policy']} | {r['event'] or '-'} | {r['requests']} | "
                     f"{len(r['failed'])} | {r['cached_share']:.0%} | {r['time_s']:.1f} |")
    return lines
