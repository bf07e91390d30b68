"""A step of one session's rows, every one an output row (a decode row and its drafts), at
1 to 65 rows, on the default model through dgr's engine, median of 7 steps each.
Run: PYTHONPATH=. python3 evidence/DGR-026/rows_cost_wide.py > evidence/DGR-026/rows-cost-wide.txt"""
import time, numpy as np
from dgr import _engine
from dgr._step import step
from dgr.engine import resolve_model_path
eng = _engine.Engine(resolve_model_path(None), n_ctx=8192, n_seq_max=4, n_batch=512, kv_unified=True)
prompt = eng.tokenize("The quick brown fox jumps over the lazy dog. " * 20)
n = len(prompt)
step(eng, prompt, list(range(n)), [0]*n, [0]*(n-1)+[1])
pos = n
for rows in (1, 2, 5, 9, 17, 25, 33, 49, 65):
    ts = []
    for rep in range(7):
        t = time.perf_counter()
        step(eng, prompt[:rows], list(range(pos, pos + rows)), [0]*rows, [1]*rows)
        ts.append(time.perf_counter() - t)
        pos += rows
    m = np.median(ts)*1e3
    print(rows, f"{m:.1f} ms", f"{m/rows:.2f} ms/row")
