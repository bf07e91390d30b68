"""`python -m dgr run` with every step's figures, admission and retirement timed
(time.monotonic), written as JSON to OUT when the server exits (SIGTERM: the
graceful shutdown returns and atexit runs). For load_phases.py.

    python evidence/DGR-025/traced_server.py OUT.json -- run --model ... (dgr run's arguments)
"""

import atexit
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from dgr import loop  # noqa: E402
from dgr.cli import main  # noqa: E402

out = sys.argv[1]
sys.argv = ["dgr"] + sys.argv[3:]
trace = {"steps": [], "admitted": [], "retired": []}
PHASES = ("plan_s", "decode_s", "sample_s", "update_s")


def traced(method, record):
    def wrapper(self, *args):
        record(*args)
        return method(self, *args)
    return wrapper


loop.StepLoop._on_step_ended = traced(
    loop.StepLoop._on_step_ended,
    lambda event, now: trace["steps"].append(
        [time.monotonic(), event.figures["total_s"], event.figures["rows"],
         event.figures["decode_rows"], *(event.figures[p] for p in PHASES)]))
loop.StepLoop.admit = traced(
    loop.StepLoop.admit, lambda replies: trace["admitted"].append([time.monotonic(), len(replies)]))
loop.StepLoop._retire = traced(
    loop.StepLoop._retire, lambda session: trace["retired"].append(time.monotonic()))
atexit.register(lambda: Path(out).write_text(json.dumps(trace)))
main()
