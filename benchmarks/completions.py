"""The completions the levels and mixed-load cases send (greedy, ignore_eos, the same
body for dgr and llama-server) and the percentile their latencies are read by."""

from __future__ import annotations

import json
import time

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


def pct(values, q):
    if not values:
        return float("nan")
    values = sorted(values)
    return values[min(len(values) - 1, int(round(q / 100 * (len(values) - 1))))]


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


async def stream_one(client, url, prompt, n_new, logprobs=0, is_dgr=True, extra=None):
    """One streaming completion (completion_body, with `extra` fields): token
    timestamps, text pieces, tokens (with logprobs)."""
    body = completion_body(prompt, n_new, is_dgr, stream=True) | (extra or {})
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
