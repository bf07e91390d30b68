"""Offline replay of answers.json: each user after the two earlier ones decodes its
greedy answer again, a step at a time, drafting at most K tokens a step from its
own context (dgr._drafts.context_draft), the node's store of the users before it
(NgramStore), or both (one asked first, the other where it finds nothing), or an
oracle that takes whichever draft the answer keeps more of; a step yields the
draft's tokens the answer keeps, plus one. Printed: steps / draft tokens for the
answer's tokens after its first (95), per user and K. Every draft is verified
(no policy), so this counts what the sources could give, not their cost.

    PYTHONPATH=. python3 evidence/DGR-026/burst-replay/replay.py
"""
import json
import pathlib

from dgr._drafts import NgramStore, context_draft_for

ANSWERS = json.loads((pathlib.Path(__file__).parent / "answers.json").read_text())
STRATEGIES = ("context", "store", "context first", "store first", "oracle")


def kept(draft, answer):
    n = 0
    for drafted, token in zip(draft, answer):
        if drafted != token:
            break
        n += 1
    return n


def replay(prompt, out, store, k, strategy):
    t = 1  # the first token comes from the prompt's step
    steps = drafted = 0
    while t < len(out):
        context = prompt + out[:t]
        by_context = context_draft_for(context, k) if strategy != "store" else []
        by_store = store.draft_for(context, k) if strategy != "context" else []
        draft = {"context": by_context, "store": by_store,
                 "context first": by_context or by_store, "store first": by_store or by_context,
                 "oracle": max(by_context, by_store, key=lambda d: kept(d, out[t:]))}[strategy]
        drafted += len(draft)
        t += kept(draft, out[t:]) + 1
        steps += 1
    return steps, drafted


for workload, users in ANSWERS.items():
    print(f"## {workload}")
    store = NgramStore()
    for user, (prompt, out) in enumerate(users):
        if user >= 2:
            for k in (3, 7, 15):
                print(f"  user {user - 2}, K = {k}: " + ", ".join(
                    f"{s} {'/'.join(map(str, replay(prompt, out, store, k, s)))}"
                    for s in STRATEGIES))
        store.add_output(prompt + out, len(prompt))
