# cython: language_level=3
"""Decoding the batch loop's C events (dgr/_events.pxd) into dgr.events' records."""

from dgr._codes cimport EV_DECODE, EV_FAILURE, EV_FINISH, EV_PREFILL, EV_SCORE, EV_TOKEN

from dgr import events
from dgr.events import CallFailed, Decoded, Finished, Prefilled, Sampled, Scored, StepEnded


cdef object event_record(const Event * e):
    """The typed record of one event (dgr.events)."""
    cdef int j
    if e.kind == EV_TOKEN:
        if e.n_top == 0:
            return Sampled(e.slot, e.token)
        return Sampled(e.slot, e.token, e.logprob,
                       [(e.top_ids[j], e.top_lp[j]) for j in range(e.n_top)])
    if e.kind == EV_DECODE:
        return Decoded(e.slot, e.drafted, e.accepted, e.source)
    if e.kind == EV_PREFILL:
        return Prefilled(e.slot, e.start, e.end)
    if e.kind == EV_FINISH:
        return Finished(e.slot, e.reason, e.code, e.kept)
    if e.kind == EV_SCORE:
        return Scored(e.slot, e.start, e.token, e.logprob,
                      [(e.top_ids[j], e.top_lp[j]) for j in range(e.n_top)])
    if e.kind == EV_FAILURE:
        return CallFailed(e.code)
    return StepEnded(events.StepFigures(**e.step))  # the C struct's fields, by name
