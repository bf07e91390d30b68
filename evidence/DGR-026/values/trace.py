"""Offline replay of one saved greedy answer (../burst-replay/answers.json, user 0 of a
workload), as ../structure/trace.py, with the values source: at each step the draft of
at most K tokens that values_draft gives where its match is at least as long as
context_draft's, else context_draft's, else structure_draft's (the node's store left
out: the bench's table at c = 1 is the node's first), how many the answer keeps; no
policy: every draft verified whole. The word forms are the default model's
(Vocabulary.word_forms), the prompt's twins learnt first. Prints the steps with and
without the values source; `-v` also each step with it.

    PYTHONPATH=. python3 evidence/DGR-026/values/trace.py "table to JSON" 16 [-v]
"""
import json
import pathlib
import sys

from dgr._drafts import context_draft_for, structure_draft_for, values_draft_for
from dgr._engine import Engine
from dgr.engine import resolve_model_path

ANSWERS = json.loads((pathlib.Path(__file__).parents[1] / "burst-replay" / "answers.json").read_text())
engine = Engine(resolve_model_path(None), n_ctx=512, n_seq_max=1)
kinds, twins = engine.word_forms()
workload, k, verbose = sys.argv[1], int(sys.argv[2]), "-v" in sys.argv
prompt, out = ANSWERS[workload][2]
engine.learn_words(prompt)
kinds, twins = bytes(kinds), [int(t) for t in twins.ravel()]


def text(tokens):
    return "|".join(engine.token_to_piece(t).decode("utf-8", "replace") for t in tokens)


def context_match(tokens):
    """The length of context_draft's match (dgr/_drafts.pyx _find), 0 under 3."""
    best = 0
    for j in range(len(tokens) - 2, 1, -1):
        if tokens[j] == tokens[-1]:
            length = 1
            while length < 32 and length <= j and tokens[j - length] == tokens[-1 - length]:
                length += 1
            best = max(best, length)
    return best if best >= 3 else 0


def replay(with_values):
    steps, t = 0, 1  # the first token comes from the prompt's step
    while t < len(out):
        context = prompt + out[:t]
        draft, source = context_draft_for(context, k), "context"
        by_values, matched = (values_draft_for(context, len(prompt), kinds, twins, k)
                              if with_values else ([], 0))
        if by_values and matched >= context_match(context):
            draft, source = by_values, f"values {matched}"
        if not draft:
            draft, source = structure_draft_for(context, k), "structure"
        n = 0
        for drafted, token in zip(draft, out[t:]):
            if drafted != token:
                break
            n += 1
        if verbose and with_values:
            print(f"{t:3} {source:9} {text(draft)!r:72} kept {n}")
        t += n + 1
        steps += 1
    return steps


print(f"{workload}, K = {k}: {replay(False)} steps without the values source, "
      f"{replay(True)} with it, for {len(out) - 1} tokens")
