"""How a step's time grows with its rows: one session's rows at consecutive
positions (what a decode row and its drafts are), all output rows or only the
last, on the default model through dgr's engine (the patched libllama), median
of 15 steps each. Run: python3 evidence/DGR-026/rows_cost.py > rows-cost.txt"""
import time, numpy as np
from dgr import _engine
from dgr._step import step
from dgr.engine import resolve_model_path
eng = _engine.Engine(resolve_model_path(None), n_ctx=8192, n_seq_max=4, n_batch=512, kv_unified=True)
prompt = eng.tokenize("The quick brown fox jumps over the lazy dog. " * 20)
n = len(prompt)
step(eng, prompt, list(range(n)), [0]*n, [0]*(n-1)+[1])
pos = n
for want_rows in ((1,), (1,1), (1,1,1), (1,)*5, (1,)*9, (1,)*13, (1,)*17, (0,0,0,0,1), (0,)*8+(1,)):
    ts = []
    rows = len(want_rows)
    for rep in range(15):
        t = time.perf_counter()
        step(eng, prompt[:rows], list(range(pos, pos + rows)), [0]*rows, list(want_rows))
        ts.append(time.perf_counter() - t)
        pos += rows
    print(rows, "outputs", sum(want_rows), f"{np.median(ts)*1e3:.1f} ms")
