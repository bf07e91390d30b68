"""dgr.step_time: the node's model of its step times."""

import random

import pytest

from dgr._speculation import context_near
from dgr.step_time import FORGET, RESCALE_AT, Forgetting, RowTimes, StepTimeModel, attended


def test_attended_counts_the_cells_each_prefill_row_sees():
    assert attended([(0, 1)]) == 1 / 1024
    assert attended([(0, 4), (10, 12)]) == (1 + 2 + 3 + 4 + 11 + 12) / 1024


def test_the_fit_recovers_a_machines_step_times_and_follows_a_change():
    a, b, c, e = 0.020, 0.002, 0.0015, 0.0004
    rng = random.Random(5)
    model = StepTimeModel()
    assert model.coefficients() is None

    def step(scale=1.0):
        decoders = rng.randint(0, 8)
        start = rng.randint(0, 3000)
        chunks = [] if rng.random() < 0.4 else [(start, start + rng.randint(16, 256))]
        if not decoders and not chunks:
            return
        t = a + b * decoders + c * sum(e_ - s for s, e_ in chunks) + e * attended(chunks)
        model.observe(decoders, chunks, scale * t * (1 + rng.uniform(-0.02, 0.02)))

    for _ in range(40):
        step()
    assert model.coefficients() is not None
    for _ in range(300):
        step()
    fitted = model.coefficients()
    assert fitted == pytest.approx((a, b, c, e), rel=0.15)
    for _ in range(600):  # the machine slows down by half: the fit follows
        step(scale=1.5)
    assert model.coefficients() == pytest.approx((1.5 * a, 1.5 * b, 1.5 * c, 1.5 * e), rel=0.15)


def test_no_model_before_both_kinds_of_step_or_when_it_is_not_sane():
    model = StepTimeModel()
    for _ in range(50):
        model.observe(4, [], 0.02)
    assert model.coefficients() is None  # no step has prefilled yet
    for _ in range(50):
        model.observe(4, [(0, 64)], 0.01)  # prefilling made steps faster: no sane c
    assert model.coefficients() is None


def test_a_fit_is_handed_out_at_once_then_after_each_prefill_and_every_refit_steps():
    from dgr.step_time import REFIT_EVERY

    model = StepTimeModel()
    got = [model.observe(4, [], 0.02) for _ in range(5)]
    assert got == [None] * 5  # no step has prefilled yet
    assert model.observe(4, [(0, 64)], 0.06) is not None  # the first fit, at once
    got = [model.observe(4, [], 0.02) for _ in range(2 * REFIT_EVERY)]
    assert [i for i, fit in enumerate(got) if fit is not None] == [REFIT_EVERY - 1,
                                                                   2 * REFIT_EVERY - 1]
    assert model.report() == dict(zip("abce", got[-1]))
    # a long prompt's pieces: each step that prefilled is followed by a fit at once
    got = [model.observe(4, [(64 * i, 64 * i + 64)], 0.06 + 0.001 * i) for i in range(1, 6)]
    assert all(fit is not None for fit in got)
    assert model.observe(4, [], 0.02) is None


def test_a_fit_that_is_not_sane_is_tried_again_every_refit_steps():
    from dgr.step_time import REFIT_EVERY

    model = StepTimeModel()
    for _ in range(5):
        model.observe(4, [], 0.02)
    solves = []
    model.coefficients = lambda: solves.append(1)  # not sane: None
    model.observe(4, [(0, 64)], 0.01)
    for _ in range(2 * REFIT_EVERY):
        model.observe(4, [], 0.02)
    assert len(solves) == 3 and model.fitted is None


def test_row_times_give_each_group_of_rows_its_recent_mean_and_drop_groups_not_run():
    times = RowTimes()
    assert times.points() == []
    for _ in range(10):
        times.observe(1, 0.015, 300)
        times.observe(17, 0.140, 5000)
        times.observe(100, 0.500, 20_000)
        times.observe(120, 0.600, 21_000)  # the group of 64-127 rows, as 100
    (rows_1, seconds_1, cells_1), (rows_17, seconds_17, _), (rows_64, seconds_64, cells_64) = (
        times.points())
    assert (rows_1, seconds_1, cells_1) == pytest.approx((1, 0.015, 300))
    assert (rows_17, seconds_17) == pytest.approx((17, 0.140))  # counts up to 64 on their own
    assert (rows_64, seconds_64, cells_64) == pytest.approx((110, 0.550, 20_500), rel=0.01)
    times.observe(100_000, 1.0, 10**6)  # the last group holds the rest
    assert times.points()[-1][0] == 100_000
    for _ in range(400):  # only one-row steps since: the other group fades out
        times.observe(1, 0.016, 300)
    ((rows_1, seconds_1, _),) = times.points()
    assert (rows_1, seconds_1) == pytest.approx((1, 0.016), rel=0.01)


def test_row_times_forget_a_groups_steps_timed_at_far_other_contexts():
    """A step's time grows with the KV cells its rows attend: a step whose rows attend
    far more or fewer cells than its group's starts the group anew, one within
    an eighth (or 512 cells) joins it."""
    times = RowTimes()
    assert times.observe(16, 0.135, 10_000)  # the group's first step
    for _ in range(20):
        assert not times.observe(16, 0.135, 10_000)
    assert not times.observe(16, 0.130, 9_000)  # a tenth fewer: the same context
    assert times.observe(16, 0.110, 1_500)  # shorter contexts: timed anew
    assert times.points() == [(16, pytest.approx(0.110), pytest.approx(1_500))]
    assert not times.observe(16, 0.112, 1_900)  # within 512 cells
    assert times.observe(16, 0.120, 2_600)
    assert context_near(2_000, 1_500) and not context_near(2_600, 2_000)
    assert context_near(9_000, 10_000) and not context_near(8_700, 10_000)
    assert not context_near(0, -1)  # not timed at the sessions' contexts


def test_row_times_give_the_probed_shape_where_no_step_ran_lately_at_the_level_of_those_that_did():
    times = RowTimes()
    times.calibrate([(1, 0.015), (4, 0.040), (16, 0.090), (48, 0.240)])
    # before any step: the probes as they were timed, at none of the sessions' contexts
    probed = [(1, 0.015, -1), (4, 0.040, -1), (16, 0.090, -1), (48, 0.240, -1)]
    assert times.points() == [pytest.approx(point) for point in probed]
    for _ in range(10):  # the machine runs more slowly than when the node opened
        times.observe(1, 0.030, 100)
        times.observe(7, 0.130, 700)  # between the probes at 4 and 16 rows: 0.0525 probed
    points = {rows: (seconds, cells) for rows, seconds, cells in times.points()}
    level = (0.030 + 0.130) / (0.015 + 0.0525)  # weights alike: both seen as often
    assert points[1] == pytest.approx((0.030, 100)) and points[7] == pytest.approx((0.130, 700))
    assert points[4] == pytest.approx((0.040 * level, -1), rel=1e-2)
    assert points[48] == pytest.approx((0.240 * level, -1), rel=1e-2)
    assert sorted(points) == [1, 4, 7, 16, 48]


def test_forgetting_sums_stay_the_forgetting_weighted_ones_past_their_rescaling():
    sums = Forgetting([[0.0, 0.0]])
    expected = [0.0, 0.0]
    for n in range(30_000):  # past RESCALE_AT (about 23,000 steps)
        w = sums.next_step()
        assert w <= RESCALE_AT
        value = float(n % 7)
        sums.sums[0][0] += w
        sums.sums[0][1] += w * value
        expected = [FORGET * expected[0] + 1.0, FORGET * expected[1] + value]
    got = [v / sums.weight for v in sums.sums[0]]
    assert got == pytest.approx(expected, rel=1e-9)
    assert got[0] == pytest.approx(1 / (1 - FORGET), rel=1e-9)
