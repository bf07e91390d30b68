"""The node's model of its own step times, which bounds prefill beside decoders.

A step's seconds (plan, llama_decode, sampling, update: StepFigures.total_s) are
fitted as

    t = a + b * decode_rows + c * prefill_rows + e * attended / 1024

where `attended` is the KV cells the prefill rows attend (a row at position p
attends p + 1 cells; decode rows' attention is in a and b, their contexts
change slowly). Least squares over the node's recent steps, older steps
weighing less (FORGET per step: about the last hundred steps count), so the
fit follows the machine's load and the sessions' contexts. The scheduler
(dgr/_scheduler.pyx, Policy) solves it for the prefill rows that keep a step
within `decode_stall` times a decode-only one.

A model is given only once both kinds of step have been seen (decode-only
steps fix a and b, steps that prefill c and e) and it is sane (c > 0, e >= 0,
a decode-only step taking time); until then the scheduler prefills
`prefill_chunk` rows a step beside decoders.
"""

from __future__ import annotations

from typing import Optional

import numpy as np

FORGET = 0.99
# weight of each kind of step seen before a model is given (about 8 steps each)
MIN_WEIGHT = 8 * FORGET ** 8


def attended(chunks) -> float:
    """Cells the rows of prefill chunks [(start, end), ...] attend, in 1,024s."""
    return sum((end - start) * (start + end + 1) / 2 for start, end in chunks) / 1024


class StepTimeModel:
    def __init__(self):
        self._xtx = np.zeros((4, 4))
        self._xty = np.zeros(4)
        self._decode_only = 0.0  # forgetting-weighted counts of each kind of step
        self._prefilling = 0.0

    def observe(self, decode_rows: int, chunks, seconds: float) -> None:
        """One step: its decode rows, its prefill chunks [(start, end), ...], its time."""
        prefill_rows = sum(end - start for start, end in chunks)
        if decode_rows == 0 and prefill_rows == 0:
            return
        x = np.array([1.0, decode_rows, prefill_rows, attended(chunks)])
        self._xtx = FORGET * self._xtx + np.outer(x, x)
        self._xty = FORGET * self._xty + x * seconds
        self._decode_only *= FORGET
        self._prefilling *= FORGET
        if prefill_rows:
            self._prefilling += 1.0
        elif decode_rows:
            self._decode_only += 1.0

    def coefficients(self) -> Optional[tuple[float, float, float, float]]:
        """(a, b, c, e), or None before both kinds of step were seen or while the
        fit is not sane. Without attention-heavy steps e is not identifiable, and
        a negative e is fitted again without it."""
        if self._decode_only < MIN_WEIGHT or self._prefilling < MIN_WEIGHT:
            return None
        ridge = 1e-9 * np.trace(self._xtx) * np.eye(4)
        try:
            w = np.linalg.solve(self._xtx + ridge, self._xty)
            if w[3] < 0:
                w3 = np.linalg.solve(self._xtx[:3, :3] + ridge[:3, :3], self._xty[:3])
                w = np.append(w3, 0.0)
        except np.linalg.LinAlgError:
            return None
        a, b, c, e = (float(v) for v in w)
        if not (c > 0 and e >= 0 and a + b > 0):
            return None
        return a, b, c, e
