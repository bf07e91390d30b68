"""How fast any drafter that copies from text the node has seen could make the
templated burst at c = 1: an upper bound, for the target "1.5x llama-server".

A clairvoyant copier: at each step it drafts exactly the longest run of the answer's
next tokens that occurs in its sources anywhere (key 0) or after the context's last
1, 2 or 3 tokens (key 1-3: where a drafter keyed on its context's last tokens could
find it; dgr's context source matches 3 or more, its node store 4 or more), never
a rejected token, or any shorter run where that makes the answer sooner; the step
costs the time of a step of that many rows plus one. Its sources: the session's own
prompt and tokens so far, and the earlier user's prompt and answer (the one other
request the bench's c = 1 burst follows). The fastest schedule over the whole
answer is a dynamic program over positions. No real drafter does better: any
draft of copied text keeps at most that run, and every verified token costs its
row.

Step times: one session's steps of 1-16 rows (every row an output, as a decode row
and its drafts are) at the answer's context, through dgr's engine on the default
model, this machine, median of 15 each, with 2 threads as the bench's nodes. The
answers: the bench's own at c = 1 in rounds 0-3 (its timed user 1000 + 100 r and its
earlier user 1040 + 100 r), greedy, on a node with speculation off.

    PYTHONPATH=. python3 evidence/DGR-026/burst-bound/bound.py
"""
import statistics
import time

import trio

import dgr
from dgr._step import step  # noqa: E402
from benchmarks.speculation import BURST, EARLIER_USER, N_NEW, WORKLOADS
from dgr import _engine
from dgr._drafts import NgramStore, context_draft_for
from dgr.engine import resolve_model_path

ROWS = 16
ROUNDS = 4


async def answers():
    """[(timed prompt, its answer, earlier user's prompt + answer)] of the bench's c = 1
    burst, rounds 0 to ROUNDS - 1."""
    config = dgr.NodeConfig(model_path=resolve_model_path(None), max_running=1,
                            max_waiting=4, n_ctx=4096)
    pairs = []
    async with dgr.open_node(config) as node:
        async def answer(i):
            prompt = WORKLOADS[BURST](i)[0]
            params = dgr.SamplingParams(max_tokens=N_NEW, temperature=0.0, speculation="off",
                                        ignore_eos=True)
            out = []
            async with node.stream(prompt, params) as chunks:
                async for chunk in chunks:
                    if chunk.token_id is not None:
                        out.append(chunk.token_id)
            return list(node.tokenize(prompt)), out

        for r in range(ROUNDS):
            offset = 100 * r + 1000  # the bench's offset at c = 1
            earlier = await answer(offset + EARLIER_USER)
            timed = await answer(offset)
            pairs.append((timed[0], timed[1], earlier[0] + earlier[1]))
    return pairs


def step_times(prompt):
    """{rows: median seconds} of one session's steps at its prompt's context."""
    eng = _engine.Engine(resolve_model_path(None), n_ctx=4096, n_seq_max=1, n_batch=512,
                         n_threads=2)
    n = len(prompt)
    step(eng, prompt, list(range(n)), [0] * n, [0] * (n - 1) + [1])
    times = {}
    for rows in range(1, ROWS + 1):
        taken = []
        for _ in range(15):
            started = time.perf_counter()
            step(eng, prompt[:rows], list(range(n, n + rows)), [0] * rows, [1] * rows)
            taken.append(time.perf_counter() - started)
            eng.release(0)
            step(eng, prompt, list(range(n)), [0] * n, [0] * (n - 1) + [1])
        times[rows] = statistics.median(taken)
    eng.close()
    return times


def longest_copy(answer, t, sources, key, context):
    """The longest run answer[t:t + L] found in any source after `key` tokens equal
    to the context's last `key` (0: anywhere)."""
    best = 0
    for src in sources:
        for j in range(key, len(src)):
            if key and src[j - key:j] != context[len(context) - key:]:
                continue
            n = 0
            while t + n < len(answer) and j + n < len(src) and src[j + n] == answer[t + n]:
                n += 1
            best = max(best, n)
    return best


def fastest(prompt, answer, earlier, cost, key):
    """The clairvoyant copier's time for the answer's tokens after its first, and its
    steps, copying after a match of `key` tokens."""
    n = len(answer)
    runs = [longest_copy(answer, t, earlier + [prompt + answer[:t]], key, prompt + answer[:t])
            for t in range(n)]
    best = [0.0] * (n + 1)
    steps = [0] * (n + 1)
    for t in range(n - 1, 0, -1):
        options = []
        for d in range(0, min(runs[t], ROWS - 1) + 1):
            after = min(n, t + 1 + d)
            options.append((cost[1 + d] + best[after], steps[after] + 1))
        best[t], steps[t] = min(options)
    return best[1], steps[1]


def kept(draft, answer):
    n = 0
    for drafted, token in zip(draft, answer):
        if drafted != token:
            break
        n += 1
    return n


def with_dgr_sources(prompt, answer, earlier, cost, longest):
    """dgr's sources as an auto node asks them (its context first, else its store,
    which holds the earlier user's answer), drafts of at most `longest` tokens: the
    time for the answer's tokens after its first, and its steps. None: each draft
    (of at most 15) cut to the tokens the answer keeps (its length chosen knowing
    them, the fastest schedule as above); else every draft found verified whole,
    rejected rows paid."""
    store = NgramStore()
    store.add_output(earlier, len(earlier) - len(answer))
    n = len(answer)
    found = []
    for t in range(n):
        context = prompt + answer[:t]
        k = longest or ROWS - 1
        found.append(context_draft_for(context, k) or store.draft_for(context, k))
    if longest is None:
        best, steps = [0.0] * (n + 1), [0] * (n + 1)
        for t in range(n - 1, 0, -1):
            best[t], steps[t] = min(
                (cost[1 + d] + best[min(n, t + 1 + d)], steps[min(n, t + 1 + d)] + 1)
                for d in range(kept(found[t], answer[t:]) + 1))
        return best[1], steps[1]
    t, spent, steps = 1, 0.0, 0
    while t < n:
        spent += cost[1 + len(found[t])]
        t += kept(found[t], answer[t:]) + 1
        steps += 1
    return spent, steps


def main():
    pairs = trio.run(answers)
    cost = step_times(pairs[0][0] + pairs[0][1][:48])
    print("step time by rows (ms): " + ", ".join(f"{r}: {1e3 * s:.1f}" for r, s in cost.items()))
    for key in (0, 1, 2, 3):
        print(f"## copied after a match of {key} tokens")
        for r, (prompt, answer, earlier) in enumerate(pairs):
            plain = (len(answer) - 1) * cost[1]
            best, steps = fastest(prompt, answer, [earlier], cost, key)
            print(f"  round {r}: {len(answer) - 1} tokens; without drafts {1e3 * plain:.0f} ms; "
                  f"the clairvoyant copier {1e3 * best:.0f} ms in {steps} steps: at most "
                  f"{plain / best:.2f}x")
    for longest in (None, 1, 2, 3, 4, 5, 7, 11, 15):
        label = ("each draft's length chosen knowing what is kept" if longest is None else
                 f"every draft of at most {longest} verified whole")
        print(f"## dgr's sources (context, else node store), {label}")
        for r, (prompt, answer, earlier) in enumerate(pairs):
            plain = (len(answer) - 1) * cost[1]
            spent, steps = with_dgr_sources(prompt, answer, earlier, cost, longest)
            print(f"  round {r}: {1e3 * spent:.0f} ms in {steps} steps: {plain / spent:.2f}x")


if __name__ == "__main__":
    main()
