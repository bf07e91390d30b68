"""What a draft search costs a row: context_draft_for and structure_draft_for (dgr._drafts,
each through its list wrapper, which converts the list too) over contexts of N random
tokens drawn as word frequencies fall (1/rank over 5,000 ids), mean of 20 calls; the
last column with the most frequent token last (structure_draft's most places).

    PYTHONPATH=. python3 evidence/DGR-026/structure/draft_cost.py
"""
import random
import time

from dgr._drafts import context_draft_for, structure_draft_for

random.seed(1)
ids = list(range(1, 5000))
weights = [1.0 / rank for rank in range(1, 5000)]


def mean_us(draft, tokens):
    started = time.perf_counter()
    for _ in range(20):
        draft(tokens, 16)
    return 1e6 * (time.perf_counter() - started) / 20


for n in (2000, 4096, 8000, 32000):
    tokens = random.choices(ids, weights, k=n)
    context, structure = mean_us(context_draft_for, tokens), mean_us(structure_draft_for, tokens)
    tokens[-1] = 1
    print(f"{n:6} tokens: context {context:5.0f} us, structure {structure:5.0f} us, "
          f"structure with the most frequent token last {mean_us(structure_draft_for, tokens):5.0f} us")
