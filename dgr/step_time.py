"""The node's model of its own step times, which bounds prefill beside decoders.

A step's seconds (plan, llama_decode, sampling, update: StepFigures.total_s) are
fitted as

    t = a + b * decode_rows + c * prefill_rows + e * attended / 1024

where decode rows include the draft rows verified beside them (speculation:
each is one more output row at a context's end), and `attended` is the KV
cells the prefill rows attend (a row at position p
attends p + 1 cells; decode rows' attention is in a and b, their contexts
change slowly). Least squares over the node's recent steps, older steps
weighing less (FORGET per step: about the last hundred steps count), so the
fit follows the machine's load and the sessions' contexts. The sums are
`Forgetting` sums: a step adds only to those it changes, in plain floats (this
runs on the Trio thread for every step). The scheduler
(dgr/_scheduler.pyx, Policy) solves it for the prefill rows that keep a step
within `decode_stall` times a decode-only one.

A model is given as soon as both kinds of step have been seen (a few
decode-only steps fix a and b, one step that prefilled gives c; e needs a few
steps at different positions and is 0 until then) and while it is sane (c > 0,
e >= 0, a decode-only step taking time); until then the scheduler prefills
`prefill_chunk` rows a step beside decoders. It is solved again after every
step that prefilled and every REFIT_EVERY other steps, sane or not.

Beside the fit, the decode steps' seconds by their output rows (RowTimes): a
step's time is not linear in its rows on a CPU (two rows may cost about two
one-row steps and a 17th a fraction of one; and with many decoders, rows in
multiples of four cost less than the counts around them), and that decides how
long a draft pays (dgr/_speculation.pyx). A node only runs the rows its drafts
give, and a draft's length is chosen by what its rows cost: the steps the node
timed as it opened (dgr.engine.measure_row_times) give the curve's shape where
it has run no step lately, at the level of the steps it ran.
"""

from __future__ import annotations

import bisect
from typing import Optional

import numpy as np

from dgr._codes import ROW_EXACT, ROW_GROUPS
from dgr._speculation import context_near

FORGET = 0.99
# forgetting-weighted steps seen before a model is given: decode-only ones (a, b),
# ones that prefilled (c), and ones that prefilled for the attention term (e)
MIN_DECODE_ONLY = 3 * FORGET ** 3
MIN_PREFILLING = 0.5
MIN_FOR_ATTENTION = 4 * FORGET ** 4
# decode-only steps between two fits once there is one (each step weighs little in the
# fit, by FORGET); a step that prefilled is followed by a fit at once
REFIT_EVERY = 16
# RowTimes: the forgetting-weighted steps a group of rows needs to be given
MIN_ROW_WEIGHT = 0.5
# Forgetting: the weight of a step at which the sums are brought back to weight 1
# (FORGET**-n reaches it after about 23,000 steps, far below a float's range)
RESCALE_AT = 1e100


def attended(chunks) -> float:
    """Cells the rows of prefill chunks [(start, end), ...] attend, in 1,024s."""
    return sum((end - start) * (start + end + 1) / 2 for start, end in chunks) / 1024


class Forgetting:
    """Forgetting-weighted sums (FORGET a step) that a step need not rescale: the
    n-th step adds at weight FORGET**-n (`weight`, after `next_step`), so a sum
    over `weight` is its forgetting-weighted value. The sums are brought back to
    weight 1 long before they could overflow."""

    def __init__(self, sums: list[list[float]]):
        self.sums = sums  # lists of floats, all kept at the same weight
        self.weight = 1.0

    def next_step(self) -> float:
        """The weight of the step being added."""
        self.weight /= FORGET
        if self.weight > RESCALE_AT:
            for values in self.sums:
                values[:] = [v / self.weight for v in values]
            self.weight = 1.0
        return self.weight


class StepTimeModel:
    """The fit (module doc), updated by every step the node runs."""

    def __init__(self):
        # x'x (4 x 4, row after row), x'y, and the decode-only and prefilling steps
        self._xtx = [0.0] * 16
        self._xty = [0.0] * 4
        self._counts = [0.0, 0.0]
        self._sums = Forgetting([self._xtx, self._xty, self._counts])
        self.fitted: Optional[tuple[float, float, float, float]] = None  # the last fit
        self._since_fit = 0  # steps since the last solve
        self._solved = False  # a solve was tried (sane or not)

    def observe(self, decode_rows: int, chunks, seconds: float) -> Optional[tuple]:
        """One step: its decode rows, its prefill chunks [(start, end), ...], its
        time. Returns a new fit when one is due, else None: the model is solved as
        soon as both kinds of step were seen, then after every step that prefilled
        (a long prompt's pieces beside decoders follow the attention term as their
        positions grow) and every REFIT_EVERY other steps, sane or not: a solve
        each decode-only step would be work on the Trio thread's step path that a
        fit moving little a step does not need."""
        prefill_rows = sum(end - start for start, end in chunks)
        if decode_rows == 0 and prefill_rows == 0:
            return None
        w = self._sums.next_step()
        xtx, xty = self._xtx, self._xty
        # a decode-only step's x is (1, decode_rows, 0, 0): only its first two terms add
        x = (1.0, decode_rows, prefill_rows, attended(chunks)) if prefill_rows else (
            1.0, decode_rows)
        for i, xi in enumerate(x):
            wxi = w * xi
            xty[i] += wxi * seconds
            for j, xj in enumerate(x):
                xtx[4 * i + j] += wxi * xj
        self._counts[1 if prefill_rows else 0] += w
        self._since_fit += 1
        if not self._seen_both() or (self._solved and self._since_fit < REFIT_EVERY
                                     and not prefill_rows):
            return None
        self._solved, self._since_fit = True, 0
        fit = self.coefficients()
        if fit is not None:
            self.fitted = fit
        return fit

    def _seen_both(self) -> bool:
        decode_only, prefilling = (n / self._sums.weight for n in self._counts)
        return decode_only >= MIN_DECODE_ONLY and prefilling >= MIN_PREFILLING

    def coefficients(self) -> Optional[tuple[float, float, float, float]]:
        """(a, b, c, e), or None before both kinds of step were seen or while the
        fit is not sane. e is fitted once a few steps prefilled, and a negative e
        (positions too alike to tell it from c) is fitted again as 0."""
        if not self._seen_both():
            return None
        # the sums at any common weight give the same solution (the ridge is relative)
        xtx = np.array(self._xtx).reshape(4, 4)
        xty = np.array(self._xty)
        ridge = 1e-9 * np.trace(xtx) * np.eye(4)
        try:
            w = None
            if self._counts[1] / self._sums.weight >= MIN_FOR_ATTENTION:
                w = np.linalg.solve(xtx + ridge, xty)
            if w is None or w[3] < 0:
                w = np.append(np.linalg.solve(xtx[:3, :3] + ridge[:3, :3], xty[:3]), 0.0)
        except np.linalg.LinAlgError:
            return None
        a, b, c, e = (float(v) for v in w)
        if not (c > 0 and e >= 0 and a + b > 0):
            return None
        return a, b, c, e

    def report(self) -> Optional[dict]:
        """The last fit by name (seconds), or None."""
        return None if self.fitted is None else dict(zip(("a", "b", "c", "e"), self.fitted))


class RowTimes:
    """Decode steps' seconds by their output rows (decode and draft rows; steps
    that prefill are left out): per group of rows (ROW_GROUPS: each count up to
    ROW_EXACT, then one per power of two), the forgetting-weighted means of the
    steps' rows, seconds and KV cells their rows attended (FORGET a step, as the
    fit), so a group the node has not run lately drops out and is guessed again.
    A group's steps timed at cells far from a new step's (dgr._speculation.context_near)
    are forgotten at once: a step's time grows with the cells its rows attend, and the
    speculation policy drafts only beside a decode-only time of the sessions'
    contexts now."""

    def __init__(self):
        # per group: the steps, their rows, seconds and cells
        self._weight = [0.0] * ROW_GROUPS
        self._rows = [0.0] * ROW_GROUPS
        self._seconds = [0.0] * ROW_GROUPS
        self._cells = [0.0] * ROW_GROUPS
        self._sums = Forgetting([self._weight, self._rows, self._seconds, self._cells])
        # the probes, fewest rows first: their rows, seconds and groups
        self._probed_rows: list[float] = []
        self._probed_s: list[float] = []
        self._probed_groups: list[int] = []

    def calibrate(self, probes) -> None:
        """Steps of (rows, seconds) timed on their own (dgr.engine.measure_row_times):
        the shape of the step time for the row counts the node has not run lately."""
        probed = sorted((float(rows), float(seconds)) for rows, seconds in probes)
        self._probed_rows = [rows for rows, _ in probed]
        self._probed_s = [seconds for _, seconds in probed]
        self._probed_groups = [self._group(int(rows)) for rows in self._probed_rows]

    def _probed_seconds(self, rows: float) -> float:
        """The probes' seconds at `rows`: linear between them, in proportion to the
        rows beyond them (plain floats: this runs on the Trio thread after every
        step with drafts)."""
        xs, ys = self._probed_rows, self._probed_s
        if rows <= xs[0]:
            return ys[0] * rows / xs[0]
        if rows >= xs[-1]:
            return ys[-1] * rows / xs[-1]
        i = bisect.bisect_right(xs, rows)
        return ys[i - 1] + (ys[i] - ys[i - 1]) * (rows - xs[i - 1]) / (xs[i] - xs[i - 1])

    def observe(self, rows: int, seconds: float, cells: float) -> bool:
        """One decode step (no prefill rows) of `rows` output rows attending `cells`
        KV cells in all. Returns whether its group's times start anew with it (the
        class doc)."""
        w = self._sums.next_step()
        group = self._group(rows)
        weight = self._weight[group]
        anew = weight == 0.0 or not context_near(cells, self._cells[group] / weight)
        if anew:
            for sums in self._sums.sums:
                sums[group] = 0.0
        self._weight[group] += w
        self._rows[group] += w * rows
        self._seconds[group] += w * seconds
        self._cells[group] += w * cells
        return anew

    def points(self) -> list[tuple[float, float, float]]:
        """(mean rows, mean seconds, mean cells) of each group seen lately, and the
        probes of the groups not seen lately at the level of those seen (their
        seconds over the probes' at the same rows, by weight; cells -1: not timed at
        the sessions' contexts), fewest rows first."""
        weight, rows, seconds, cells = self._sums.sums
        least = MIN_ROW_WEIGHT * self._sums.weight
        seen = {g: None for g, w in enumerate(weight) if w >= least}  # ordered, a set
        # mean rows to a millionth of a row: a group of one count gives that count
        out = [(round(rows[g] / weight[g], 6), seconds[g] / weight[g], cells[g] / weight[g])
               for g in seen]
        if not self._probed_rows:
            return out
        level = 1.0
        if out:
            level = sum(seconds[g] for g in seen) / sum(
                weight[g] * self._probed_seconds(rows[g] / weight[g]) for g in seen)
        out += [(r, s * level, -1.0) for r, s, group in
                zip(self._probed_rows, self._probed_s, self._probed_groups) if group not in seen]
        return sorted(out)

    @staticmethod
    def _group(rows: int) -> int:
        """The group of a step of `rows` output rows (the class doc)."""
        if rows <= ROW_EXACT:
            return rows - 1
        return min(ROW_EXACT + rows.bit_length() - ROW_EXACT.bit_length(), ROW_GROUPS - 1)
