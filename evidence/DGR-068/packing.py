"""What packing inputs into one step buys: the same inputs through dgr's embedding
context (Embedder.run) one at a time, and k at a time, on the bench's bge-small-shaped
encoder (benchmarks/embeddings.py, Q8_0), twice.

    .venv/bin/python evidence/DGR-068/packing.py
"""

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks import embeddings  # noqa: E402
from dgr._embed import Embedder  # noqa: E402


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        engine = Embedder(embeddings.write_model(Path(folder), "bge-small"), step_tokens=4096,
                          max_inputs=64, n_threads=2)

        def run(group) -> float:
            started = time.perf_counter()
            engine.run(np.concatenate(group), np.array([len(g) for g in group], dtype=np.int32))
            return time.perf_counter() - started

        workloads = {"32 inputs of 16 tokens": [16] * 32,
                     "24 inputs of 16-512 tokens": list(embeddings.LENGTHS) * 4}
        for label, lengths in workloads.items():
            inputs = [np.array([5 + (i * 7 + j) % 300 for j in range(n)], dtype=np.int32)
                      for i, n in enumerate(lengths)]
            run(inputs[:2])
            for _ in range(2):
                cells = [f"one at a time {1000 * sum(run([x]) for x in inputs):.0f} ms"]
                for k in (6, len(inputs)):
                    ms = 1000 * sum(run(inputs[i:i + k]) for i in range(0, len(inputs), k))
                    cells.append(f"{k} a step {ms:.0f} ms")
                print(f"{label} ({sum(lengths)} tokens): " + ", ".join(cells))


if __name__ == "__main__":
    main()
