"""What values_draft costs a row (dgr._drafts.values_draft_for, through its list wrapper,
which converts the lists too): a prompt of N tokens that is a table of rows `| w | w | n |`
(w: one of 3,000 spaced words, drawn as word frequencies fall, each with a one-token twin;
n: a lone space and two digits), and an answer of 401 tokens that writes its first 40
rows as JSON objects; mean of 20 calls. Beside it, the same prompt with a 4-token
answer that writes no value (the prompt's cells built and the answer read, no match),
and with a 1-token answer (the wrapper alone: values_draft returns at once).

    PYTHONPATH=. python3 evidence/DGR-026/values/draft_cost.py
"""
import random
import time

from dgr._codes import WordKind
from dgr._drafts import context_draft_for, values_draft_for

random.seed(1)
VOCAB = 8000
kinds = bytearray(VOCAB)
twins = [[-1, -1, -1, -1] for _ in range(VOCAB)]
kinds[50] = WordKind.WORD_SPACE
for t in range(60, 70):
    kinds[t] = WordKind.WORD_PART          # digits
for t in range(1000, 4000):
    kinds[t] = WordKind.WORD_SPACED        # " word"
    kinds[t + 3000] = WordKind.WORD_PART   # "word"
    twins[t] = [1, t + 3000, -1, -1]
flat = [t for row in twins for t in row]
words = list(range(1000, 4000))
weights = [1.0 / rank for rank in range(1, 3001)]


def table(n):
    rows = []
    while sum(map(len, rows)) < n:
        a, b = random.choices(words, weights, k=2)
        rows.append([5, a, 5, b, 5, 50, random.choice(range(60, 70)), random.choice(range(60, 70)), 5, 6])
    return [t for row in rows for t in row][:n], rows


def answer(rows):
    out = [7]
    for row in rows[:40]:
        out += [1, 2, row[1] + 3000, 3, row[3] + 3000, 8, 50, row[6], row[7], 4]
    return out


def mean_us(draft, *args):
    started = time.perf_counter()
    for _ in range(20):
        draft(*args)
    return 1e6 * (time.perf_counter() - started) / 20


for n in (2000, 4096, 8000, 32000):
    prompt, rows = table(n)
    out = answer(rows)
    tokens = prompt + out
    values = mean_us(values_draft_for, tokens, len(prompt), kinds, flat, 16)
    cells = mean_us(values_draft_for, prompt + [7, 1, 2, 9], len(prompt), kinds, flat, 16)
    wrapper = mean_us(values_draft_for, prompt + [7], len(prompt), kinds, flat, 16)
    context = mean_us(context_draft_for, tokens, 16)
    print(f"{n:6} prompt tokens + {len(out)}: values {values:5.0f} us, a 4-token answer "
          f"{cells:5.0f} us, the wrapper alone {wrapper:5.0f} us; context {context:5.0f} us; "
          f"drafts {len(values_draft_for(tokens, len(prompt), kinds, flat, 16)[0])} tokens")
