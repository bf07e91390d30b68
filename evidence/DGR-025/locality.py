"""Does where a session's cells lie cost a decode step? 64 sessions of the tiny test
model in one unified 32,768-cell pool (dgr's engine, no node), each at ~270 cells,
time 32 decode steps of all 64 in two layouts, alternating:

- interleaved: the 64 decode 256 tokens together, so (with patch 0004's placement)
  each holds one cell in every 64 of the range;
- per session: each prefills a 261-token prompt alone, so its cells are adjacent.

Run under a wheel without patch 0012 (with it, decoding together fills blocks).

    python evidence/DGR-025/locality.py
"""

import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dgr import _engine  # noqa: E402  (ordered cells for a unified pool, as the node)
from dgr.testmodel import write_test_model  # noqa: E402

C = 64
tiny = str(write_test_model(Path(tempfile.mkdtemp()) / "tiny.gguf"))
engine = _engine.Engine(tiny, n_ctx=C * 512, n_seq_max=C, n_batch=512, n_ubatch=512,
                        n_threads=2, kv_unified=True)
short = list(engine.tokenize("Once upon a time"))
long = (short * 60)[:256 + len(short)]


def steps(tokens, positions, n):
    started = time.perf_counter()
    for _ in range(n):
        sampled, *_ = engine.step(tokens, positions, list(range(C)), [1] * C)
        tokens, positions = sampled.tolist(), [p + 1 for p in positions]
    return 1000 * (time.perf_counter() - started) / n, tokens, positions


def prefill_each(prompt):
    for slot in range(C):
        engine.release(slot)
    for slot in range(C):
        engine.step(prompt, list(range(len(prompt))), [slot] * len(prompt),
                    [0] * (len(prompt) - 1) + [1])


for _ in range(6):
    prefill_each(short)
    _, tokens, positions = steps([short[-1]] * C, [len(short)] * C, 256)
    interleaved, *_ = steps(tokens, positions, 32)
    prefill_each(long)
    adjacent, *_ = steps([long[-1]] * C, [len(long)] * C, 32)
    print(f"ms per step at ~{len(long)} cells a session: interleaved {interleaved:.2f}, "
          f"per session {adjacent:.2f}, ratio {interleaved / adjacent:.2f}", flush=True)
engine.close()
