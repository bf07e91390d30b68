"""What llama.cpp's tokenizer takes for the bench's system prompt repeated 1, 4 and 16
times (Engine.tokenize on the default model, one run each)."""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from benchmarks.shared_prefix import SYSTEM_PROMPT  # noqa: E402
from dgr import _batch  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402

e = _batch.Engine(str(resolve_model_path(None)), n_ctx=1024, n_seq_max=1)
for mult in (1, 4, 16):
    text = (SYSTEM_PROMPT + " ") * mult
    t0 = time.perf_counter(); ids = e.tokenize(text); t1 = time.perf_counter()
    print(f"{len(ids)} tokens: {1e3*(t1-t0):.1f} ms")
e.close()
