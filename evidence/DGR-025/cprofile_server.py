"""cProfile of a dgr server's Trio thread over the serving-path load (the tiny model, 64
curl clients x 256 tokens, not streamed, 3 loads after a warm-up). The server loads a
sitecustomize.py from a temporary folder that starts the profiler on SIGUSR2 and
writes its report (by own time, then cumulative) on SIGUSR1. cProfile counts wall
time: a call during which the thread was preempted counts the preemption too.

    python evidence/DGR-025/cprofile_server.py OUT.txt
"""

import os
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from benchmarks import serving  # noqa: E402
from benchmarks.concurrency import dgr_server, free_port  # noqa: E402
from dgr.testmodel import write_test_model  # noqa: E402

HOOK = '''
import os
if os.environ.get("DGR_CPROFILE"):
    import cProfile, io, pstats, signal
    profile = cProfile.Profile()

    def report(*_):
        profile.disable()
        out = io.StringIO()
        pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(45)
        pstats.Stats(profile, stream=out).sort_stats("cumulative").print_stats(60)
        open(os.environ["DGR_CPROFILE"], "w").write(out.getvalue())

    signal.signal(signal.SIGUSR2, lambda *_: profile.enable())
    signal.signal(signal.SIGUSR1, report)
'''

out = Path(sys.argv[1]).resolve()
hook_dir = tempfile.mkdtemp()
Path(hook_dir, "sitecustomize.py").write_text(HOOK)
os.environ["DGR_CPROFILE"] = str(out)
os.environ["PYTHONPATH"] = os.pathsep.join([hook_dir, str(ROOT)])
model = str(write_test_model(Path(tempfile.mkdtemp()) / "tiny.gguf"))
with dgr_server(model, 64, 512, 2, free_port()) as srv:
    serving.clients(srv.url, 1, True)  # warm up
    os.kill(srv.proc.pid, signal.SIGUSR2)
    time.sleep(0.2)
    for _ in range(3):
        print(f"{serving.clients(srv.url, 64, False):.0f} tok/s", flush=True)
    os.kill(srv.proc.pid, signal.SIGUSR1)
    time.sleep(1)
print(f"report: {out}")
