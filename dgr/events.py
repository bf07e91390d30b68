"""The batch loop's events as typed records, one class per kind (dgr/_codes.pxd,
EventKind). `BatchLoop.drain` decodes each C event into one of these once; the
step loop (dgr/loop.py) dispatches on the class. Slotted and not frozen, so
that making one per token costs little; nobody changes them. And the record of
what one step did (`StepRecord`), which the step loop keeps a bounded history of."""

from __future__ import annotations

from typing import Optional

import attrs

record = attrs.define(slots=True, eq=True, repr=True)


@record
class Decoded:
    """`slot` had a decode row in the step, and `drafted` draft rows after it, of
    which `accepted` were (DraftSource `source`: dgr._codes)."""

    slot: int
    drafted: int = 0
    accepted: int = 0
    source: int = 0


@record
class Prefilled:
    """`slot` prefilled prompt positions [start, end)."""

    slot: int
    start: int
    end: int


@record
class Sampled:
    """`slot` sampled `token`; `logprob` and `top` ((token, logprob) best first)
    when the session asked for log-probabilities, else None."""

    slot: int
    token: int
    logprob: Optional[float] = None
    top: Optional[list[tuple[int, float]]] = None


@record
class Scored:
    """`slot`'s prompt token `token` at `position` has log-probability `logprob`
    given the tokens before it; `top`: the best alternatives (a session scoring
    its prompt: SamplingParams.prompt_logprobs)."""

    slot: int
    position: int
    token: int
    logprob: float
    top: list[tuple[int, float]]


@record
class Finished:
    """`slot` ended with FinishCode `reason` (`code`: the failed call's, else 0).
    Its KV is free but for positions [0, kept): a prefix cache entry."""

    slot: int
    reason: int
    code: int = 0
    kept: int = 0


@record
class CallFailed:
    """A llama_decode call of the step failed with `code`."""

    code: int


@attrs.frozen
class StepFigures:
    """What one step did and cost: dgr/_scheduler.pxd's StepFigures, field for field."""

    index: int
    rows: int
    decode_rows: int      # sessions with a decode row
    draft_rows: int       # draft rows verified beside those
    cells: float          # KV cells those rows attend in all, where speculating (else 0)
    planned_tokens: float  # the speculation policy's expectation, when it gave "auto"
    planned_s: float      # drafts (else 0): tokens, step seconds
    prefill_rows: int     # rows of chunks whose call succeeded
    generated: int
    calls: int
    plan_s: float         # mailbox, finish requests, policy, batch fill
    decode_s: float       # inside llama_decode
    sample_s: float       # sampling and log-probabilities
    update_s: float       # post-step update, KV release, publishing
    total_s: float        # from the step's start to its events being published
    ended_at: float       # time.monotonic()


@record
class StepEnded:
    """The step ended."""

    figures: StepFigures


# Steps kept in `StepLoop.steps` (tests and diagnostics): a few hundred bytes each
# at a few dozen sessions, so the history stays well under a megabyte.
STEP_HISTORY = 1024


@attrs.frozen
class StepRecord:
    """What one step did (kept for tests and diagnostics, bounded)."""

    index: int
    decode: tuple[int, ...]                    # session ids with a decode row
    prefill: tuple[tuple[int, int, int], ...]  # (session id, start, end)
    rows: int
    budget: int
    duration_s: float
    draft_rows: int                            # draft rows verified beside the decode rows
    generated: int                             # tokens the step gave its sessions
    planned: tuple[float, float]               # speculation's expected (tokens, seconds), or 0s
