"""The rate windows behind /capabilities' rates and the 429 Retry-After: bounded
buckets, counts leave the window as time passes."""

import attrs

from dgr.events import StepFigures
from dgr.telemetry import RateWindow, Telemetry


def test_a_rate_window_sums_the_last_window_and_forgets_older_counts():
    window = RateWindow(10.0, 2, buckets=10)
    for t in range(100):  # many adds into few buckets: memory stays the buckets'
        window.add(1000.0 + t * 0.05, 1, 2)
    assert window.totals(1005.0) == ([100, 200], 1000.0)
    assert window.totals(1009.9)[0] == [100, 200]
    assert window.totals(1013.5)[0] == [20, 40]  # only the bucket of 1004-1005 remains
    assert window.totals(1030.0) == ([0, 0], 1030.0)
    window.add(1030.0, 5, 0)
    assert window.totals(1030.5) == ([5, 0], 1030.0)


def test_drain_rate_counts_sessions_ended_in_the_last_minute():
    telemetry = Telemetry()
    assert telemetry.drain_rate() == 0.0
    for _ in range(30):
        telemetry.record_finish("stop")
    assert telemetry.drain_rate() == 30.0  # within one second: divided by at least 1 s


def test_a_step_histogram_counts_as_prometheus_client_does():
    """StepHistogram (a step's observations at once, or one) exposes what
    prometheus_client's Histogram gives for the same values: bounds inclusive,
    cumulative, sum, count."""
    from prometheus_client import CollectorRegistry, Histogram

    from dgr.telemetry import StepHistogram

    buckets = (0.005, 0.01, 1.0)
    values = [0.001, 0.005, 0.0051, 0.01, 0.5, 100.0]
    ours, theirs = CollectorRegistry(), CollectorRegistry()
    batched = StepHistogram("lat_seconds", "doc", buckets)
    ours.register(batched)
    reference = Histogram("lat_seconds", "doc", buckets=buckets, registry=theirs)
    batched.observe_all(values[:2])
    batched.observe_all([])
    batched.observe_all(values[2:-1])
    batched.observe(values[-1])
    for v in values:
        reference.observe(v)
    samples = {(s.name, tuple(s.labels.items())): s.value
               for m in ours.collect() for s in m.samples}
    expected = {(s.name, tuple(s.labels.items())): s.value
                for m in theirs.collect() for s in m.samples if not s.name.endswith("_created")}
    assert samples == expected


def test_step_figures_are_summed_and_exposed_under_their_metric_names():
    telemetry = Telemetry()
    step = StepFigures(index=0, rows=32, decode_rows=2, draft_rows=0, cells=0.0,
                       planned_tokens=0.0, planned_s=0.0, prefill_rows=30, generated=3, calls=1,
                       plan_s=0.001, decode_s=0.02, sample_s=0.002, update_s=0.0005,
                       total_s=0.024, ended_at=0.0)
    telemetry.record_step(step, budget=64)
    telemetry.record_step(attrs.evolve(step, prefill_rows=0, draft_rows=4, generated=5),
                          budget=64)
    value = telemetry.registry.get_sample_value
    assert value("dgr_steps_total") == 2 and value("dgr_spec_steps_total") == 1
    assert value("dgr_prefill_tokens_total") == 30
    assert value("dgr_decode_tokens_total") == 4 and value("dgr_generated_tokens_total") == 8
    assert value("dgr_step_phase_seconds_total", {"phase": "decode"}) == 0.04
    assert value("dgr_batch_occupancy_ratio") == 6 / 64
    assert value("dgr_batch_rows_count") == 2 and value("dgr_batch_rows_sum") == 38
    assert value("dgr_step_duration_seconds_sum") == 0.048
