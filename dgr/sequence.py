"""A session and every change of its state.

Phases: WAITING (queued, no slot) -> PREFILL (a slot and a KV reservation;
the batch loop decodes its prompt in chunks) -> DECODE (one row per step) ->
FINISHED (slot and KV released). A decoding session may be PARKED (its slot
taken back for a session that outranks it: its KV kept as a prefix, its sampler
state held by the batch loop) and then resumes (PREFILL again, from a prompt that
is its own followed by what it generated, nearly all of it restored). Admission
moves a session out to FINISHED and into PARKED, placement (dgr.placement) into
PREFILL with its slot, prefix and leader; the
step loop (dgr.loop) records prefill progress and tokens from the batch
loop's events and alone ends sessions (`finish`, first reason wins), after
which the slot is released before another session gets it. Every field
changes only through the methods below.
"""

from __future__ import annotations

import enum
from typing import TYPE_CHECKING, Optional

import attrs
import numpy as np

from dgr._codes import FinishCode
from dgr.spec import SessionSpec

if TYPE_CHECKING:
    from dgr.kv_tier import Prefix


class FinishReason(str, enum.Enum):
    """Why a session ended. Compares equal to its string (OpenAI's finish_reason);
    `code` is its number in the batch loop (dgr/_codes.pxd, FinishCode)."""

    STOP = "stop"            # an end-of-generation token or a stop string
    LENGTH = "length"        # max_tokens reached
    CANCELLED = "cancelled"  # the caller left, or the node shut down
    ERROR = "error"          # the model failed (see the session's error)

    __str__ = str.__str__
    __format__ = str.__format__

    @property
    def code(self) -> int:
        return _CODES[self]

    @classmethod
    def from_code(cls, code: int) -> "FinishReason":
        return _REASONS[code]


_CODES = {reason: FinishCode[f"FINISH_{reason.name}"] for reason in FinishReason}
_REASONS = {code: reason for reason, code in _CODES.items()}


class Phase(enum.Enum):
    WAITING = "waiting"
    PREFILL = "prefill"
    DECODE = "decode"
    PARKED = "parked"
    FINISHED = "finished"


@attrs.define(eq=False)
class Session:
    """One generation request, as admission, placement and the step loop see it:
    what it asks for (`spec`, fixed) and where it stands. The fields change only
    through the methods below; `leader` may be given at construction (the first
    sample of the same prompt)."""

    id: int
    spec: SessionSpec
    arrived_at: float = 0.0
    phase: Phase = Phase.WAITING
    slot: Optional[int] = None
    reuse_from: Optional[int] = None  # the slot whose sequence holds its first n_reused positions
    n_reused: int = 0
    restore: Optional[Prefix] = None  # a stored prefix (dgr.kv_tier) its first n_reused come from
    leader: Optional["Session"] = None  # a running session prefilling the prefix this one
    # shares (a sample of the same prompt, or a prompt arriving while it is computed)
    share_len: int = 0  # prompt positions to take from the leader once it has them
    n_prefilled: int = 0
    generated: list[int] = attrs.field(factory=list)
    # (log-probability, alternatives) of each prompt token but the first, when it
    # scores its prompt (SamplingParams.prompt_logprobs)
    prompt_scores: list[tuple[float, list[tuple[int, float]]]] = attrs.field(factory=list)
    finish_reason: Optional[FinishReason] = None
    error: Optional[str] = None
    first_token_at: Optional[float] = None
    last_token_at: Optional[float] = None
    # parking: times parked, the generated tokens its run prompt holds, and the batch
    # loop's entry (dgr._parked) its sampler state goes to when parked, held from its
    # start on a slot until it leaves
    parks: int = 0
    resumed_from: int = 0
    sampler_entry: Optional[int] = None
    prompt_reused: int = 0  # prompt tokens reused when it first started (usage)
    refused: Optional[str] = None  # admission's reason, where it refused it after admitting it
    # the prompt its slot runs: its own, followed by what it generated before it was
    # parked; an array for prefix matching
    run_prompt: list[int] = attrs.field(init=False)
    prompt_array: np.ndarray = attrs.field(init=False)

    @run_prompt.default
    def _run_prompt(self) -> list[int]:
        return self.spec.prompt

    @prompt_array.default
    def _prompt_array(self) -> np.ndarray:
        return np.asarray(self.spec.prompt, dtype=np.int32)

    @property
    def reserved_cells(self) -> int:
        """KV cells reserved while running: the whole prompt plus every new token."""
        return len(self.spec.prompt) + self.spec.params.max_tokens

    def kv_tokens(self, kept: int) -> list[int]:
        """The tokens of the first `kept` positions of this session's sequence: its
        prompt as far as prefilled, then what it generated and fed back."""
        return (self.run_prompt[:self.n_prefilled] + self.generated[self.resumed_from:])[:kept]

    @property
    def parked(self) -> bool:
        return self.phase is Phase.PARKED

    def run_spec(self) -> SessionSpec:
        """What its slot runs: its spec, or once parked, its run prompt and what is
        left of max_tokens and min_tokens (its prompt's scores are taken already; its
        sampler state, bans counted, comes back whole: dgr._parked)."""
        if not self.parks:
            return self.spec
        params = self.spec.params
        params = attrs.evolve(params, prompt_logprobs=None,
                              max_tokens=params.max_tokens - self.resumed_from,
                              min_tokens=max(0, params.min_tokens - self.resumed_from))
        return attrs.evolve(self.spec, prompt=self.run_prompt, params=params,
                            reports_progress=False)

    @property
    def done(self) -> bool:
        return self.finish_reason is not None

    def start(self, slot: int, reuse_from: Optional[int] = None, n_reused: int = 0,
              restore: Optional[Prefix] = None) -> None:
        """Admission gave the session a slot, and maybe a shared prefix of n_reused
        prompt positions whose KV slot `reuse_from`'s sequence holds, or a stored
        prefix to restore."""
        if not self.parks:
            self.prompt_reused = n_reused
        self.slot = slot
        self.reuse_from = reuse_from
        self.restore = restore
        self.n_reused = self.n_prefilled = n_reused
        self.phase = Phase.PREFILL

    def park(self) -> None:
        """Its slot is taken back: it waits to resume from its prompt and what it
        generated."""
        self.parks += 1
        self.resumed_from = len(self.generated)
        self.run_prompt = self.spec.prompt + self.generated
        self.prompt_array = np.asarray(self.run_prompt, dtype=np.int32)
        self.slot = self.reuse_from = self.restore = None
        self.phase = Phase.PARKED

    def follow(self, leader: Optional["Session"], share_len: int) -> None:
        """Placement: the session takes its first share_len prompt positions from
        `leader` once the leader has prefilled them (None: it follows nobody)."""
        self.leader, self.share_len = leader, share_len

    def share(self, reuse_from: int, n_reused: int) -> None:
        """Its leader has prefilled the shared prefix (or ended): take the first
        n_reused positions from slot `reuse_from`."""
        self.reuse_from = reuse_from if n_reused else None
        self.n_reused = self.n_prefilled = n_reused

    def record_score(self, logprob: float, top: list[tuple[int, float]]) -> None:
        """The batch loop scored the next prompt token."""
        self.prompt_scores.append((logprob, top))

    def record_prefill(self, end: int) -> None:
        """The batch loop prefilled the prompt up to position `end`."""
        self.n_prefilled = end

    def record_token(self, token: int, now: float) -> float:
        """Append a sampled token; returns the time since admission (first token)
        or since the previous token."""
        since = self.arrived_at if self.first_token_at is None else self.last_token_at
        if self.first_token_at is None:
            self.first_token_at = now
        self.last_token_at = now
        self.generated.append(token)
        self.phase = Phase.DECODE
        return now - since

    def finish(self, reason: FinishReason, error: Optional[str] = None) -> bool:
        """Mark the session finished; True when this call decided the reason."""
        if self.finish_reason is not None:
            return False
        self.finish_reason = FinishReason(reason)
        self.error = error
        return True

    def refuse(self, reason: str, detail: str) -> bool:
        """Admission takes back its queue place (dgr.admission.REASONS' `reason`): it
        ends cancelled, `detail` its error; True when this call decided its end."""
        if not self.finish(FinishReason.CANCELLED, detail):
            return False
        self.refused = reason
        return True

    def release(self) -> None:
        """Its queue place or slot is gone."""
        self.phase = Phase.FINISHED
