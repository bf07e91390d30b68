"""perf over 20 steps of one session's 49 rows (every one an output row) on the default
model through dgr's engine:
    perf record -F 499 -g -o OUT.data -- python3 evidence/DGR-026/wide_step_profile.py
    perf report -i OUT.data --no-children -g none --sort dso,sym
(the model load is in the samples too, about a tenth)."""
import time, numpy as np
from dgr import _engine
from dgr.engine import resolve_model_path
eng = _engine.Engine(resolve_model_path(None), n_ctx=8192, n_seq_max=4, n_batch=512, kv_unified=True)
prompt = eng.tokenize("The quick brown fox jumps over the lazy dog. " * 20)
n = len(prompt)
eng.step(prompt, list(range(n)), [0]*n, [0]*(n-1)+[1])
pos = n
rows = 49
t = time.perf_counter()
for rep in range(20):
    eng.step(prompt[:rows], list(range(pos, pos + rows)), [0]*rows, [1]*rows)
    pos += rows
print((time.perf_counter()-t)/20*1e3, "ms a 49-row step")
