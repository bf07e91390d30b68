"""One session's steps of 1-64 output rows at a 300-token context through dgr's engine
(default model, 2 threads), the counts in alternating order, median of 9: whether
drafts past 48 (MAX_DRAFT) would make a whole quote's tokens cheaper.

    PYTHONPATH=. python3 evidence/DGR-026/wide_rows_c1.py
"""
import statistics
import time

from dgr import _engine
from dgr.engine import resolve_model_path

eng = _engine.Engine(resolve_model_path(None), n_ctx=4096, n_seq_max=1, n_batch=512,
                     n_threads=2)
prompt = [(7 * i) % 5000 + 100 for i in range(300)]
n = len(prompt)
eng.step(prompt, list(range(n)), [0] * n, [0] * (n - 1) + [1])
counts = (1, 16, 32, 33, 48, 49, 56, 64)
times = {r: [] for r in counts}
for rep in range(9):
    for rows in (counts if rep % 2 == 0 else counts[::-1]):
        started = time.perf_counter()
        eng.step(prompt[:rows], list(range(n, n + rows)), [0] * rows, [1] * rows)
        times[rows].append(time.perf_counter() - started)
        eng.release(0)
        eng.step(prompt, list(range(n)), [0] * n, [0] * (n - 1) + [1])
for r in counts:
    m = statistics.median(times[r])
    print(f"{r} rows: {1e3 * m:.1f} ms, {1e3 * m / r:.2f} ms/row")
eng.close()
