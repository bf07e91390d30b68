"""What auto's draft search costs a decode row: the context, structure and node-store
lookups (dgr/_drafts.pyx) through their Python wrappers, on a templated-burst prompt
and a letter after it (134 tokens of the default model's vocabulary), mean of 2,000
calls each, the store empty.

    python3 evidence/DGR-026/draft-cap/search_cost.py
"""
import sys
import time
from pathlib import Path

import llama_cpp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from benchmarks.speculation import WORKLOADS  # noqa: E402
from dgr import _drafts  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402

vocab = llama_cpp.Llama(model_path=str(resolve_model_path(None)), vocab_only=True, verbose=False)
prompt, _ = WORKLOADS["templated burst"](3)
text = prompt + (" We are sorry for the delay. Your order was shipped on Monday and should "
                 "arrive within three business days. If it does not arrive, please reply to "
                 "this email and we will send a replacement. Kind regards, the support "
                 "team.") * 2
tokens = np.array(vocab.tokenize(text.encode(), add_bos=True), dtype=np.int32)
store = _drafts.NgramStore()
print("tokens", len(tokens))
for name, lookup in [("context", lambda: _drafts.context_draft_for(tokens)),
                     ("structure", lambda: _drafts.structure_draft_for(tokens)),
                     ("node store", lambda: store.draft_for(tokens))]:
    lookup()
    started = time.perf_counter()
    for _ in range(2000):
        lookup()
    print(f"{name}: {(time.perf_counter() - started) / 2000 * 1e6:.1f} us a call")
