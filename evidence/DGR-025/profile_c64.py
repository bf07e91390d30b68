"""perf or py-spy over a dgr node serving the serving-path workload
(benchmarks/serving.py: the tiny model, 64 curl clients x 256 tokens, not
streamed, again and again) for 6 s.

    python evidence/DGR-025/profile_c64.py perf OUT.data
    perf report -i OUT.data --no-children -g none --sort pid,dso
    python evidence/DGR-025/profile_c64.py py-spy OUT.raw
    python evidence/DGR-025/pyspy_aggregate.py OUT.raw 60
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

tool, out = sys.argv[1], sys.argv[2]
model = str(write_test_model(Path(tempfile.mkdtemp()) / "tiny.gguf"))
with dgr_server(model, 64, 512, 2, free_port()) as srv:
    serving.clients(srv.url, 1, True)  # warm up
    pid = str(srv.proc.pid)
    argv = (["perf", "record", "-g", "-F", "999", "-p", pid, "-o", out, "--", "sleep", "6"]
            if tool == "perf" else
            ["py-spy", "record", "-p", pid, "-d", "6", "-r", "250", "-f", "raw", "-o", out])
    profiler = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    started = time.time()
    while time.time() - started < 6.5:
        serving.clients(srv.url, 64, False)
    profiler.wait()
