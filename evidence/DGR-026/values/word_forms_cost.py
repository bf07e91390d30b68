"""What the values source's vocabulary costs: Vocabulary.word_forms on the default model
(one pass over its 262,144 tokens' pieces), then learn_words over this README's first
20,000 characters, tokenized (every new word a tokenize call), and again (all learnt).

    PYTHONPATH=. python3 evidence/DGR-026/values/word_forms_cost.py
"""
import pathlib
import time

from dgr._engine import Engine
from dgr.engine import resolve_model_path

engine = Engine(resolve_model_path(None), n_ctx=512, n_seq_max=1)
started = time.perf_counter()
engine.word_forms()
print(f"word_forms: {1e3 * (time.perf_counter() - started):.1f} ms for {engine.n_vocab} tokens")
text = (pathlib.Path(__file__).parents[3] / "README.md").read_text()[:20000]
tokens = engine.tokenize(text)
for label in ("learn_words", "again"):
    started = time.perf_counter()
    engine.learn_words(tokens)
    print(f"{label}: {1e3 * (time.perf_counter() - started):.1f} ms for {len(tokens)} tokens")
