"""`python -m dgr run --port 8311` with one variant applied (for ab_variant.sh):

- base: as shipped;
- nometrics: the per-step and per-token Prometheus updates made no-ops (what they cost);
- pin: once the model is loaded, the engine thread alone on CPU 0 and the Trio (main)
  thread on CPU 1 beside OpenMP's worker (where the Python work lands).
"""
import os
import sys
import threading
import time

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, ROOT)
variant = sys.argv[1]

import dgr.telemetry as telemetry  # noqa: E402


def pin_later(ready_file):
    while True:
        time.sleep(0.5)
        engine = [t for t in threading.enumerate() if t.name == "dgr-engine"]
        if engine and os.path.exists(ready_file):
            break
    os.sched_setaffinity(engine[0].native_id, {0})
    os.sched_setaffinity(os.getpid(), {1})
    print("pinned engine", engine[0].native_id, "main", os.getpid(), flush=True)


if variant == "nometrics":
    class _NoHistogram:
        def observe(self, value):
            pass

    telemetry.Telemetry.record_step = lambda self, figures, budget: None
    _init = telemetry.Telemetry.__init__

    def _init_without_itl(self, *args, **kwargs):
        _init(self, *args, **kwargs)
        self.itl = _NoHistogram()

    telemetry.Telemetry.__init__ = _init_without_itl
elif variant == "pin":
    threading.Thread(target=pin_later, args=("/tmp/dgr-serving",), daemon=True).start()

from dgr.cli import main  # noqa: E402

sys.exit(main(["run", "--port", "8311"]))
