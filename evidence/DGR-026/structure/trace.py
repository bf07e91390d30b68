"""Offline replay of one saved greedy answer (../burst-replay/answers.json, user 0 of a
workload): at each step the draft of at most K tokens that context_draft gives, else
structure_draft (dgr._drafts; the node's store left out: the bench's table to JSON
at c = 1 is the node's first table), the tokens it drafted, how many the answer
keeps, and the step's tokens (the kept ones and the next). No policy: every draft
is verified whole. A third argument, `context`, leaves structure_draft out (the
sources before it).

    PYTHONPATH=. python3 evidence/DGR-026/structure/trace.py "table to JSON" 8 [context]
"""
import json
import pathlib
import sys

from llama_cpp import Llama

from dgr._drafts import context_draft_for, structure_draft_for
from dgr.engine import resolve_model_path

ANSWERS = json.loads((pathlib.Path(__file__).parents[1] / "burst-replay" / "answers.json").read_text())
vocab = Llama(resolve_model_path(None), vocab_only=True, verbose=False)


def text(tokens):
    return "".join(vocab.detokenize([t]).decode() + "|" for t in tokens)


def kept(draft, answer):
    n = 0
    for drafted, token in zip(draft, answer):
        if drafted != token:
            break
        n += 1
    return n


workload, k = sys.argv[1], int(sys.argv[2])
with_structure = sys.argv[3:] != ["context"]
prompt, out = ANSWERS[workload][2]
steps = 0
t = 1  # the first token comes from the prompt's step
while t < len(out):
    context = prompt + out[:t]
    draft, source = context_draft_for(context, k), "context"
    if not draft and with_structure:
        draft, source = structure_draft_for(context, k), "structure"
    n = kept(draft, out[t:])
    print(f"{t:3} {source:9} {text(draft)!r:60} kept {n}: {text(out[t:t + n + 1])!r}")
    t += n + 1
    steps += 1
print(f"{steps} steps for {len(out) - 1} tokens")
