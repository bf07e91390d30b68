"""How a context draft's tokens fare by the length of the match it follows, per workload:
each workload's greedy answer (default model, speculation off, 96 tokens,
benchmarks/speculation.py's prompts numbered 1000 and 1100, c = 1), and at each of its
tokens the draft `context_draft` gives from the prompt and the tokens before it (at most
16), set against the tokens the session wrote next. Per workload and match length
(3, 4-7, 8-15, 16-32 tokens): drafts found, their first token's share taken, and the
chance a token is taken once the ones before it were (tokens taken over tokens taken plus
drafts broken, as dgr/_speculation.pyx estimates it).

    python evidence/DGR-026/natural-c1/match_length.py
"""

import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

import dgr  # noqa: E402
from benchmarks.speculation import N_NEW, WORKLOADS  # noqa: E402
from dgr import _drafts  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402

CLASSES = ((3, 3), (4, 7), (8, 15), (16, 32))


def match_length(tokens):
    """The longest L <= 32 such that tokens[-L:] occurs earlier in tokens."""
    best = 0
    n = len(tokens)
    for length in range(3, min(32, n - 1) + 1):
        key = tokens[n - length:]
        if any(tokens[s:s + length] == key for s in range(0, n - length)):
            best = length
        else:
            break
    return best


async def main():
    config = dgr.NodeConfig(model_path=resolve_model_path(None), max_running=16,
                            max_waiting=64, n_ctx=16 * 2048)
    async with dgr.open_node(config) as node:
        for workload, build in WORKLOADS.items():
            stats = {c: [0, 0, 0, 0] for c in CLASSES}  # found, first taken, taken, broken
            for number in (1000, 1100):
                prompt, extra = build(number)
                params = dgr.SamplingParams(max_tokens=N_NEW, temperature=0.0, speculation="off",
                                            ignore_eos="grammar" not in extra, **extra)
                out = []
                async with node.stream(prompt, params) as chunks:
                    async for chunk in chunks:
                        if chunk.token_id is not None:
                            out.append(chunk.token_id)
                context = node.tokenize(prompt)
                for t in range(len(out)):
                    tokens = context + out[:t]
                    draft = _drafts.context_draft_for(tokens, 16)
                    if not draft:
                        continue
                    length = match_length(tokens)
                    cls = next(c for c in CLASSES if c[0] <= length <= c[1])
                    taken = 0
                    while taken < len(draft) and t + taken < len(out) and (
                            draft[taken] == out[t + taken]):
                        taken += 1
                    s = stats[cls]
                    s[0] += 1
                    s[1] += taken > 0
                    s[2] += taken
                    s[3] += taken < len(draft)
            for (lo, hi), (found, first, taken, broken) in stats.items():
                if found:
                    print(f"{workload:16s} match {lo:2d}-{hi:2d}: {found:3d} drafts, first taken "
                          f"{first / found:.2f}, chance a token {taken / (taken + broken):.2f}")


trio.run(main)
