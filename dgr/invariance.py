"""`python -m dgr check-invariance`: does a model give a session the same tokens and
log-probabilities alone, beside other sessions and from the prefix cache, on this CPU?

Each prompt runs alone on a node that shares nothing (the bits to match); then all of
them at once, arriving staggered so that prefill chunks land in other sessions' decode
steps; then all again, each taking its prompt's KV from the prefix cache. Every
session's tokens and log-probabilities (its token's and the top 2) must equal its solo
run's bit for bit; the first difference is reported with where it arose.
"""

from __future__ import annotations

import attrs
import trio

from dgr.config import NodeConfig
from dgr.node import open_node
from dgr.config import SamplingParams

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


async def check(config: NodeConfig, prompts=PROMPTS, n_new: int = 32,
                stagger_s: float = 0.05) -> dict:
    """{"sessions", "bitwise": bool, "runs": {run: [first_difference per session]},
    "cached_tokens", "drafted", "rejected" (draft tokens verified beside the others),
    "coverage" (what the node claims: dgr.kernel_coverage)}."""
    greedy = SamplingParams(max_tokens=n_new, logprobs=2, ignore_eos=True)
    async with open_node(attrs.evolve(config, prefix_cache=False)) as fresh:
        solo = [await fresh.generate(p, greedy) for p in prompts]
    async with open_node(config) as node:
        runs = {"concurrent": await all_at_once(node, prompts, greedy, stagger_s)}
        runs["cached"] = await all_at_once(node, prompts, greedy, stagger_s)
        cached_tokens = sum(r.cached_tokens for r in runs["cached"])
        capabilities = node.capabilities()
        sources = capabilities["speculation"]["sources"].values()
        drafted = sum(source["drafted"] for source in sources)
        rejected = drafted - sum(source["accepted"] for source in sources)
    report = {"sessions": len(prompts), "tokens": n_new, "cached_tokens": cached_tokens,
              "drafted": drafted, "rejected": rejected,
              # what the node claims for this model here (dgr.kernel_coverage)
              "coverage": capabilities["invariance"],
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
                 f"{report['drafted']} draft tokens verified, {report['rejected']} rejected)")
    lines.append("verdict: " + ("bitwise invariant" if report["bitwise"] else "NOT invariant"))
    coverage = report["coverage"]
    if coverage["covered"]:
        lines.append("the node claims the invariance for this model on this CPU "
                     f"({coverage['cpu']})")
    else:
        lines.append("the node does not claim the invariance for this model here: "
                     + "; ".join(coverage["why_not"]))
    return "\n".join(lines)
