"""Microseconds of the Trio thread's work per step that does not depend on the
step's tokens (dgr.loop.StepLoop._on_step_ended): the step-time fit, the row
times, the step's telemetry. Each timed alone (timeit, best of 5), in the package
on PYTHONPATH, so two trees compare side by side:

    sh evidence/DGR-025/snapshot.sh /tmp/dgr-A HEAD
    PYTHONPATH=/tmp/dgr-A python evidence/DGR-025/step_path_costs.py
    PYTHONPATH=. python evidence/DGR-025/step_path_costs.py
"""

import timeit

import dgr
from dgr.step_time import RowTimes, StepTimeModel
from dgr.telemetry import Telemetry

N = 20_000
FIGURES = {"index": 1, "rows": 16, "calls": 1, "plan_s": 0.001, "decode_s": 0.05,
           "sample_s": 0.001, "update_s": 0.0001, "total_s": 0.052, "prefill_rows": 0,
           "decode_rows": 16, "draft_rows": 0, "generated": 16, "planned_tokens": 0.0,
           "planned_s": 0.0, "ended_at": 0.0}


def best_us(call, number=N):
    return 1e6 * min(timeit.repeat(call, number=number, repeat=5)) / number


model, rows, telemetry = StepTimeModel(), RowTimes(), Telemetry()
for i in range(50):
    model.observe(16, [(0, 100)] if i % 5 == 0 else [], 0.05)
    rows.observe(16 + i % 3, 0.05)
print(f"dgr from {dgr.__file__}")
print(f"StepTimeModel.observe, decode-only step: {best_us(lambda: model.observe(16, [], 0.05)):.2f} us")
print(f"StepTimeModel.observe, a prefill chunk:  "
      f"{best_us(lambda: model.observe(16, [(100, 164)], 0.05)):.2f} us")
print(f"RowTimes.observe:                        {best_us(lambda: rows.observe(16, 0.05)):.2f} us")
print(f"RowTimes.points (every REFIT_EVERY steps): {best_us(rows.points, 2000):.2f} us")
print(f"Telemetry.record_step:                   "
      f"{best_us(lambda: telemetry.record_step(FIGURES, 512)):.2f} us")
