"""perf over a dgr node serving the serving-path workload (benchmarks/serving.py:
the tiny model, 64 curl clients x 256 tokens, not streamed, again and again) for 6 s.

    python evidence/DGR-025/perf_c64.py OUT.data
    perf report -i OUT.data --no-children -g none --sort pid,dso
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

out = sys.argv[1]
model = str(write_test_model(Path(tempfile.mkdtemp()) / "tiny.gguf"))
with dgr_server(model, 64, 512, 2, free_port()) as srv:
    serving.clients(srv.url, 1, True)  # warm up
    perf = subprocess.Popen(["perf", "record", "-g", "-F", "999", "-p", str(srv.proc.pid),
                             "-o", out, "--", "sleep", "6"])
    started = time.time()
    while time.time() - started < 6.5:
        serving.clients(srv.url, 64, False)
    perf.wait()
