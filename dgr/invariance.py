"""`python -m dgr check-invariance`: does a model give a session the same tokens and
log-probabilities alone, beside other sessions and from the prefix cache, on this CPU?

Each prompt runs alone on a node that shares nothing (the bits to match); then all of
them at once, arriving staggered so that prefill chunks land in other sessions' decode
steps; then all again, each taking its prompt's KV from the prefix cache; then all at
once on a node whose pool holds little more than their reservations, drafting
whenever it can (speculation "always"). Every session's tokens and log-probabilities
(its token's and the top 2) must equal its solo run's bit for bit; the first
difference is reported with where it arose. The command's prompts (CHECK_PROMPTS) are
16, one of them past 2,000 tokens on common tokenizers.
"""

from __future__ import annotations

import attrs
import trio

from dgr.config import NodeConfig
from dgr.node import open_node
from dgr.spec import SamplingParams

PROMPTS = (
    "The history of the printing press begins",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Ingredients: two eggs, a cup of flour, half a cup of milk. Method:",
    "Q: What is the boiling point of water at sea level?\nA:",
    "Once upon a time, in a village between two rivers, there lived",
    "SELECT name, count(*) FROM orders GROUP BY name ORDER BY",
    "Dear committee, I am writing to apply for the position of",
    "The three laws of thermodynamics state that",
)
# about 11,000 characters: past 2,000 tokens on the tokenizers of common models
LONG_PROMPT = "Minutes of the harbour board, read into the record: " + " ".join(
    f"Item {i}: the {w} was inspected, found in order, and its keeper thanked."
    for i, w in enumerate(["lighthouse", "crane", "dock", "warehouse", "ferry", "pier",
                           "slipway", "bollard", "tugboat", "signal mast"] * 16))
# `python -m dgr check-invariance`: 16 sessions, one of them long
CHECK_PROMPTS = PROMPTS + tuple(p + " Again, briefly:" for p in PROMPTS[:7]) + (LONG_PROMPT,)
# cells a nearly full pool holds beyond the sessions' reservations
POOL_SLACK = 256


async def all_at_once(node, prompts, params, stagger_s=0.0):
    """Results of prompts[i] run together, session i arriving i * stagger_s seconds
    after the first; `params` is one SamplingParams or one per prompt."""
    per_prompt = params if isinstance(params, list) else [params] * len(prompts)
    results = [None] * len(prompts)

    async def run(i):
        await trio.sleep(i * stagger_s)
        results[i] = await node.generate(prompts[i], per_prompt[i])

    async with trio.open_nursery() as nursery:
        for i in range(len(prompts)):
            nursery.start_soon(run, i)
    return results


def first_difference(solo, other) -> dict | None:
    """Where `other` first departs from `solo`: a token, or a log-probability of the
    same token (its own or the top 2's), with both values; None if bitwise equal."""
    for i, (a, b) in enumerate(zip(solo.token_ids, other.token_ids)):
        if a != b:
            return {"position": i, "what": "token", "solo": a, "other": b}
        if solo.token_logprobs[i] != other.token_logprobs[i] or solo.logprobs[i] != other.logprobs[i]:
            return {"position": i, "what": "logprob", "solo": solo.token_logprobs[i],
                    "other": other.token_logprobs[i]}
    if len(solo.token_ids) != len(other.token_ids):
        n = min(len(solo.token_ids), len(other.token_ids))
        return {"position": n, "what": "length", "solo": len(solo.token_ids),
                "other": len(other.token_ids)}
    return None


def _drafts(node) -> tuple[int, int]:
    """Draft tokens the node verified and rejected so far."""
    sources = node.capabilities()["speculation"]["sources"].values()
    drafted = sum(source["drafted"] for source in sources)
    return drafted, drafted - sum(source["accepted"] for source in sources)


async def check(config: NodeConfig, prompts=PROMPTS, n_new: int = 32,
                stagger_s: float = 0.05) -> dict:
    """{"sessions", "bitwise": bool, "runs": {run: [first_difference per session]},
    "cached_tokens", "drafted", "rejected" (draft tokens verified beside the others),
    "longest_prompt" (tokens), "pool_cells" (the nearly full pool's, for "reserved"
    cells), "coverage" (what the node claims: dgr.kernel_coverage)}."""
    greedy = SamplingParams(max_tokens=n_new, logprobs=2, ignore_eos=True)
    async with open_node(attrs.evolve(config, prefix_cache=False)) as fresh:
        solo = [await fresh.generate(p, greedy) for p in prompts]
    reserved = sum(r.prompt_tokens for r in solo) + n_new * len(prompts)
    async with open_node(config) as node:
        runs = {"concurrent": await all_at_once(node, prompts, greedy, stagger_s)}
        runs["cached"] = await all_at_once(node, prompts, greedy, stagger_s)
        cached_tokens = sum(r.cached_tokens for r in runs["cached"])
        coverage = node.capabilities()["invariance"]
        drafted, rejected = _drafts(node)
    pool = attrs.evolve(config, n_ctx=-(-reserved // 256) * 256 + POOL_SLACK,
                        max_running=max(config.max_running, len(prompts)), speculation="always")
    async with open_node(pool) as node:
        runs["full pool, drafting"] = await all_at_once(node, prompts, greedy, stagger_s)
        drafted, rejected = (a + b for a, b in zip((drafted, rejected), _drafts(node)))
    report = {"sessions": len(prompts), "tokens": n_new, "cached_tokens": cached_tokens,
              "drafted": drafted, "rejected": rejected,
              "longest_prompt": max(r.prompt_tokens for r in solo),
              "pool_cells": pool.n_ctx, "reserved": reserved,
              # what the node claims for this model here (dgr.kernel_coverage)
              "coverage": coverage,
              "runs": {name: [first_difference(a, b) for a, b in zip(solo, results)]
                       for name, results in runs.items()}}
    report["bitwise"] = all(d is None for diffs in report["runs"].values() for d in diffs)
    return report


def describe(report: dict) -> str:
    lines = []
    for name, diffs in report["runs"].items():
        bad = [(i, d) for i, d in enumerate(diffs) if d is not None]
        lines.append(f"{name}: {report['sessions'] - len(bad)} of {report['sessions']} sessions "
                     "bitwise equal to their solo runs")
        for i, d in bad[:1]:
            lines.append(f"  first difference: session {i}, token {d['position']}, {d['what']} "
                         f"{d['solo']!r} alone vs {d['other']!r}")
    lines.append(f"({report['cached_tokens']} prompt tokens came from the prefix cache; "
                 f"{report['drafted']} draft tokens verified, {report['rejected']} rejected; "
                 f"the longest prompt {report['longest_prompt']} tokens; the full pool "
                 f"{report['pool_cells']} cells for {report['reserved']} reserved)")
    lines.append("verdict: " + ("bitwise invariant" if report["bitwise"] else "NOT invariant"))
    coverage = report["coverage"]
    if coverage["covered"]:
        lines.append("the node claims the invariance for this model on this CPU "
                     f"({coverage['cpu']})")
    else:
        lines.append("the node does not claim the invariance for this model here: "
                     + "; ".join(coverage["why_not"]))
    return "\n".join(lines)
