"""A session's state as the admission, scheduler and batch loop see it."""

from __future__ import annotations

import enum
from typing import Callable, Optional

import attrs

from dgr.config import SamplingParams


class Phase(enum.Enum):
    WAITING = "waiting"    # admitted to the queue, no slot yet
    PREFILL = "prefill"    # has a slot and KV reservation; prompt chunks being decoded
    DECODE = "decode"      # generating, one row per step
    FINISHED = "finished"  # done; its slot and KV are released before the next step


@attrs.define(eq=False)
class Session:
    """One generation request. Only the batch loop's task mutates it, except
    `finish_reason`/`stop_requested`, which a cancelled or stopped session sets
    so that the loop releases it before the next step."""

    id: int
    prompt: list[int]
    params: SamplingParams
    max_tokens: int
    phase: Phase = Phase.WAITING
    slot: Optional[int] = None
    n_prefilled: int = 0
    generated: list[int] = attrs.field(factory=list)
    finish_reason: Optional[str] = None
    error: Optional[str] = None
    # True when the reader can take one more token now; the scheduler skips the
    # session otherwise (backpressure instead of buffering).
    reader_ready: Callable[[], bool] = lambda: True
    arrived_at: float = 0.0
    first_token_at: Optional[float] = None
    last_token_at: Optional[float] = None

    @property
    def reserved_cells(self) -> int:
        """KV cells reserved at admission: the whole prompt plus every new token."""
        return len(self.prompt) + self.max_tokens

    @property
    def n_past(self) -> int:
        """Positions already in (or being written to) this session's KV."""
        return self.n_prefilled + max(0, len(self.generated) - 1)

    @property
    def pending_token(self) -> int:
        """The last sampled token, which the next decode row feeds back."""
        return self.generated[-1]

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def finish(self, reason: str, error: Optional[str] = None) -> None:
        """Mark the session finished (first reason wins)."""
        if self.finish_reason is None:
            self.finish_reason = reason
            self.error = error
