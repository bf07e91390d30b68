"""Does a draft copied from another answer break where that answer's own choice was
close? The bench's c = 1 burst of rounds 0-3 (bound.py's prompts), each answer
generated with its tokens' top-2 log-probabilities (greedy, speculation off). The
timed answer is replayed with a copier like dgr's sources: the longest match of 3-32
tokens of its context in its own context, else of 4-32 in the earlier user's prompt
and answer, the most recent among as long, at most K tokens. A copied answer token
carries its margin there (its log-probability less the runner-up's; prompt tokens
none, counted sure). Printed:

- the margins of the copied tokens kept and of those at a break;
- the speed-up at bound.py's step times when each draft stops before its first
  token of margin below m (or whole), for K = 3, 5, 7, 15.

    PYTHONPATH=. python3 evidence/DGR-026/burst-bound/confidence.py
"""
import statistics
import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

import dgr  # noqa: E402
from benchmarks.speculation import BURST, EARLIER_USER, N_NEW, WORKLOADS  # noqa: E402
from bound import ROUNDS, kept, step_times  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402

SURE = float("inf")


async def answers():
    """[(timed prompt, answer, answer's margins, earlier prompt + answer, its margins)]"""
    config = dgr.NodeConfig(model_path=resolve_model_path(None), max_running=1,
                            max_waiting=4, n_ctx=4096)
    out = []
    async with dgr.open_node(config) as node:
        async def answer(i):
            prompt = WORKLOADS[BURST](i)[0]
            params = dgr.SamplingParams(max_tokens=N_NEW, temperature=0.0, speculation="off",
                                        ignore_eos=True, logprobs=2)
            tokens, margins = [], []
            async with node.stream(prompt, params) as chunks:
                async for chunk in chunks:
                    if chunk.token_id is not None:
                        tokens.append(chunk.token_id)
                        second = [lp for token, lp in chunk.top_logprobs
                                  if token != chunk.token_id]
                        margins.append(chunk.logprob - max(second) if second else SURE)
            return list(node.tokenize(prompt)), tokens, margins

        for r in range(ROUNDS):
            offset = 100 * r + 1000
            e_prompt, e_answer, e_margins = await answer(offset + EARLIER_USER)
            prompt, tokens, margins = await answer(offset)
            out.append((prompt, tokens, margins, e_prompt + e_answer,
                        [SURE] * len(e_prompt) + e_margins))
    return out


def locate(text, context, least):
    """Where the longest match (least..32 tokens) of context's end in text ends, the
    most recent among as long (-1: none)."""
    best_len, best_at = 0, -1
    n = len(context)
    for j in range(least, len(text)):
        length = 0
        while (length < 32 and length < j and length < n
               and text[j - 1 - length] == context[n - 1 - length]):
            length += 1
        if length >= least and length >= best_len:
            best_len, best_at = length, j
    return best_at


def copy(text, margins, context, least, k):
    """The longest match (least..32 tokens) of context's end in text, the most recent
    among as long: the next k tokens of text and their margins."""
    best_at = locate(text, context, least)
    if best_at < 0:
        return [], []
    return text[best_at:best_at + k], margins[best_at:best_at + k]


def replay(prompt, answer, margins, earlier, e_margins, cost, k, least_margin, record=None):
    t, spent = 1, 0.0
    while t < len(answer):
        own = prompt + answer[:t]
        own_margins = [SURE] * len(prompt) + margins[:t]
        draft, dm = copy(own, own_margins, own, 3, k)
        if not draft:
            draft, dm = copy(earlier, e_margins, own, 4, k)
        whole = len(draft)
        for i, m in enumerate(dm):
            if m < least_margin:
                draft = draft[:i]
                break
        n = kept(draft, answer[t:])
        if record is not None and whole:
            record.append((dm[:n], dm[n] if n < len(dm) else None))
        spent += cost[1 + len(draft)]
        t += n + 1
    return spent


def main():
    pairs = trio.run(answers)
    cost = step_times(pairs[0][0] + pairs[0][1][:48])
    kept_margins, broke_margins = [], []
    for prompt, answer, margins, earlier, e_margins in pairs:
        record = []
        replay(prompt, answer, margins, earlier, e_margins, cost, 15, -SURE, record)
        for kept_m, broke_m in record:
            kept_margins += [m for m in kept_m if m != SURE]
            if broke_m is not None and broke_m != SURE:
                broke_margins.append(broke_m)
    print(f"copied tokens kept: {len(kept_margins)}, margin median "
          f"{statistics.median(kept_margins):.2f}, below 1: "
          f"{sum(m < 1 for m in kept_margins)}")
    print(f"copied tokens at a break: {len(broke_margins)}, margin median "
          f"{statistics.median(broke_margins):.2f}, below 1: "
          f"{sum(m < 1 for m in broke_margins)}")
    for k in (3, 5, 7, 15):
        for least in (-SURE, 0.5, 1.0, 2.0, 3.0):
            speedups = [(len(a) - 1) * cost[1] / replay(p, a, m, e, em, cost, k, least)
                        for p, a, m, e, em in pairs]
            label = "whole" if least == -SURE else f"margin >= {least}"
            print(f"K = {k}, {label}: " + ", ".join(f"{x:.2f}" for x in speedups))


if __name__ == "__main__":
    main()
