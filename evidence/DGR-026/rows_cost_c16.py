"""A decode step's time by its output rows beside many decoders: 18 sessions with a
~150-token context each on the default model through dgr's engine; steps of 16
one-row sessions, with one more session or draft rows added, and steps of 8 to 64
rows (one row per session for up to 18, the rest as one session's draft rows),
median of the repeats.
Run: PYTHONPATH=. python3 evidence/DGR-026/rows_cost_c16.py > evidence/DGR-026/rows-cost-c16.txt"""
import time

import numpy as np

from dgr import _engine
from dgr._step import step
from dgr.engine import resolve_model_path

eng = _engine.Engine(resolve_model_path(None), n_ctx=16384, n_seq_max=20, n_batch=512,
                     kv_unified=True)
prompt = eng.tokenize("The quick brown fox jumps over the lazy dog. " * 15)
n = len(prompt)
for s in range(18):
    step(eng, prompt, list(range(n)), [s] * n, [0] * (n - 1) + [1])
pos = [n] * 18


def step(rows_per_seq):
    """One step of rows_per_seq[s] rows of session s at its context's end; seconds."""
    toks, ps, ss = [], [], []
    for s, r in enumerate(rows_per_seq):
        for j in range(r):
            toks.append(prompt[j])
            ps.append(pos[s] + j)
            ss.append(s)
    t = time.perf_counter()
    step(eng, toks, ps, ss, [1] * len(toks))
    dt = time.perf_counter() - t
    for s, r in enumerate(rows_per_seq):
        pos[s] += r
    return dt


shapes = {"16 sessions": [1] * 16, "17 sessions": [1] * 17, "18 sessions": [1] * 18,
          "16 sessions, 1 draft row": [2] + [1] * 15,
          "16 sessions, 2 draft rows (one session)": [3] + [1] * 15,
          "16 sessions, 2 draft rows (two sessions)": [2, 2] + [1] * 14,
          "16 sessions, 8 draft rows (one session)": [9] + [1] * 15,
          "16 sessions, 16 draft rows (one each)": [2] * 16}
res = {k: [] for k in shapes}
for rep in range(9):
    for k, v in shapes.items():
        res[k].append(step(v))
for k, v in res.items():
    print(f"{k}: {np.median(v) * 1e3:.1f} ms ({sum(shapes[k])} rows)")
print("rows: ms")
fine = {r: [] for r in list(range(8, 41)) + [48, 56, 64]}
for rep in range(5):
    for r in fine:
        seqs = [1] * min(r, 18)
        seqs[0] += r - len(seqs)
        fine[r].append(step(seqs))
for r, v in fine.items():
    print(f"{r}: {np.median(v) * 1e3:.1f}")
