"""One input at a time: an input of n tokens through each server's /v1/embeddings (the
best of 4 after a warm-up), and through dgr's embedding context alone (Embedder.run,
no HTTP), on the bench's two encoder shapes (benchmarks/embeddings.py, Q8_0).

    .venv/bin/python evidence/DGR-068/one_input.py
"""

import sys
import tempfile
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
from benchmarks import embeddings  # noqa: E402
from benchmarks.peers import ensure_peers  # noqa: E402
from benchmarks.servers import ServerProcess, free_port  # noqa: E402
from dgr._embed import Embedder  # noqa: E402

LENGTHS = (16, 64, 512)


def best(call, repeats=4) -> float:
    call()
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        call()
        times.append(time.perf_counter() - started)
    return min(times) * 1000


def main() -> None:
    peers = ensure_peers(batched_bench=False)
    with tempfile.TemporaryDirectory() as folder:
        for name in embeddings.SHAPES:
            model = embeddings.write_model(Path(folder), name)
            ids = {n: [5 + (i % 300) for i in range(n)] for n in LENGTHS}
            engine = Embedder(model, step_tokens=1024, max_inputs=32, n_threads=2)
            for n in LENGTHS:
                tokens = np.array(ids[n], dtype=np.int32)
                ms = best(lambda: engine.run(tokens, np.array([n], dtype=np.int32)))
                print(f"{name}: {n:3d} tokens, dgr's context alone: {ms:6.1f} ms")
            engine.close()
            for server, argv in (
                    ("llama-server", [str(peers["llama-server"]), "-m", model, "-t", "2",
                                      "--embeddings", "--pooling", "mean"]),
                    ("dgr", [sys.executable, "-m", "dgr", "run", "--model", model,
                             "--threads", "2", "--log-level", "WARNING"])):
                port = free_port()
                with ServerProcess(server, argv + ["--port", str(port)], port) as proc:
                    for n in LENGTHS:
                        ms = best(lambda: httpx.post(proc.url + "/v1/embeddings",
                                                     json={"input": ids[n]}, timeout=60))
                        print(f"{name}: {n:3d} tokens, {server} over HTTP: {ms:6.1f} ms")


if __name__ == "__main__":
    main()
