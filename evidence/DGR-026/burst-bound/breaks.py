"""Where dgr's drafts of the burst at c = 1 break: bound.py's answers (the bench's
c = 1 burst, rounds 0-3) replayed with dgr's sources (its context first, else its
node store holding the earlier user's answer), drafts of at most 15 verified
whole; per draft its source, length and the tokens kept, and at a break the
drafted token against the answer's.

    PYTHONPATH=. python3 evidence/DGR-026/burst-bound/breaks.py
"""
import sys
from pathlib import Path

import trio

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bound import answers, kept  # noqa: E402
from dgr import _engine  # noqa: E402
from dgr._drafts import NgramStore, context_draft_for  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402

engine = _engine.Engine(resolve_model_path(None), n_ctx=512, n_seq_max=1, n_batch=512)
for r, (prompt, answer, earlier) in enumerate(trio.run(answers)):
    store = NgramStore()
    store.add_output(earlier, len(earlier) - len(answer))
    print(f"## round {r}: {engine.detokenize(answer)!r}")
    t = 1
    while t < len(answer):
        context = prompt + answer[:t]
        draft, source = context_draft_for(context, 15), "context"
        if not draft:
            draft, source = store.draft_for(context, 15), "store"
        n = kept(draft, answer[t:])
        if draft:
            broke = (f"; broke at {engine.detokenize([draft[n]])!r} for "
                     f"{engine.detokenize([answer[t + n]])!r}"
                     if n < len(draft) and t + n < len(answer) else "")
            print(f"  token {t}: {source} drafted {len(draft)}, kept {n}{broke}")
        t += n + 1
engine.close()
