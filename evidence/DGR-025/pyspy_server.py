"""py-spy (400 Hz, --nonblocking: the server is not paused to be sampled) of a dgr
server over the serving-path load (benchmarks/serving.py: the tiny model, 64 curl
clients x 256 tokens, streamed or not, 4 loads after a warm-up); the raw samples go to
RAW, then pyspy_aggregate.py sums them per thread and function. Needs py-spy
(pip install py-spy).

    python evidence/DGR-025/pyspy_server.py streamed|plain RAW
    python evidence/DGR-025/pyspy_aggregate.py RAW 60
"""

import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import serving  # noqa: E402
from benchmarks.concurrency import dgr_server, free_port  # noqa: E402
from dgr.testmodel import write_test_model  # noqa: E402

streamed, raw = sys.argv[1] == "streamed", sys.argv[2]
model = str(write_test_model(Path(tempfile.mkdtemp()) / "tiny.gguf"))
with dgr_server(model, 64, 512, 2, free_port()) as srv:
    serving.clients(srv.url, 1, True)  # warm up
    spy = subprocess.Popen(["py-spy", "record", "-f", "raw", "-r", "400", "--nonblocking",
                            "--threads", "-o", raw, "-p", str(srv.proc.pid)],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    time.sleep(1.0)  # py-spy attached
    for _ in range(4):
        print(f"{serving.clients(srv.url, 64, streamed):.0f} tok/s", flush=True)
    spy.send_signal(2)
    spy.wait()
