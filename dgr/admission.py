"""Admission: admit, queue or reject a session against explicit budgets.

Budgets (docs/design.md):

- KV: a session reserves prompt + max_tokens cells when it starts running, so
  decode never runs out of KV mid-session. It starts only when its
  reservation fits in the free cells and a sequence slot is free. A session
  whose reservation exceeds the per-session context can never run and is
  rejected at once (`never_fits`).
- queue: at most `max_waiting` sessions and `max_waiting_tokens` prompt tokens
  wait for a slot. Beyond that a new session is rejected at once
  (`queue_full`, `queue_tokens_full`), never parked.
- health: once the node has failed for good (an RPC worker lost), every new
  session is rejected (`unhealthy`, saying why) until the node is restarted.
- weights and scratch are checked once, when the node starts (see Budgets.check_memory).
- prefix cache: which slot a starting session takes and what it shares is
  placement's (dgr.placement); cached prefixes are evicted when a starting
  session's reservation needs their cells, never counted against admission.

The waiting queue is strict FIFO: a session that does not fit blocks younger
ones, so a large request is never starved by a stream of small ones.
No I/O and no llama.cpp here.
"""

from __future__ import annotations

import collections
from typing import Optional

import attrs

from dgr.errors import AdmissionRejected, BudgetError
from dgr.placement import Placement
from dgr.sequence import Phase, Session

REASONS = ("never_fits", "queue_full", "queue_tokens_full", "draining", "unhealthy")


class Gate:
    """Whether a node takes new work, whatever its kind: open; draining (reason
    "draining"); or failed for good (reason "unhealthy", saying why)."""

    def __init__(self) -> None:
        self.draining = False
        self.failure: Optional[str] = None

    def start_draining(self) -> None:
        """Refuse all new work from now on."""
        self.draining = True

    def fail(self, why: str) -> None:
        """Refuse all new work from now on, saying why (the first reason stays)."""
        if self.failure is None:
            self.failure = why

    def check(self) -> None:
        """Raise AdmissionRejected unless the node takes new work."""
        if self.failure is not None:
            raise AdmissionRejected("unhealthy", self.failure)
        if self.draining:
            raise AdmissionRejected("draining", "the node is shutting down")


def check_queue(what: str, waiting: int, adding: int, max_waiting: int, waiting_tokens: int,
                adding_tokens: int, max_tokens: int) -> None:
    """Refuse work that would pass a node's queue bounds: `adding` more places beside
    the `waiting` (`what` waits: sessions, requests), or `adding_tokens` more tokens."""
    if waiting + adding > max_waiting:
        raise AdmissionRejected("queue_full", f"{waiting} {what} already wait"
                                + (f"; this request needs {adding} places" if adding > 1 else ""))
    if waiting_tokens + adding_tokens > max_tokens:
        raise AdmissionRejected(
            "queue_tokens_full",
            f"{waiting_tokens} input tokens already wait (limit {max_tokens})")


@attrs.frozen
class Budgets:
    kv_cells_total: int        # KV cells of the whole context
    kv_cells_per_session: int  # cells one session may use (n_ctx_seq)
    slots: int                 # sequence slots = max running sessions
    max_waiting: int
    max_waiting_tokens: int
    step_tokens: int           # rows per llama_decode (<= n_batch)
    step_outputs: int          # output (logits) rows per step: one per running session
    memory_bytes: int          # what weights + KV + scratch + the host KV tier may take
    cache_ram_bytes: int = 0   # the host KV tier's bound (dgr.kv_tier.HostTier)

    def check_memory(self, model_bytes: int, kv_bytes: int, scratch_bytes: int) -> None:
        """Refuse to start when the model, its buffers and the host KV tier do not
        fit the memory budget."""
        need = model_bytes + kv_bytes + scratch_bytes + self.cache_ram_bytes
        if model_bytes > self.memory_bytes:
            raise BudgetError(f"model weights take {model_bytes} bytes, more than the memory "
                              f"budget of {self.memory_bytes} bytes")
        if need > self.memory_bytes:
            raise BudgetError(f"weights ({model_bytes}) + KV ({kv_bytes}) + scratch ({scratch_bytes}) "
                              f"+ host KV tier ({self.cache_ram_bytes}) = {need} bytes exceed "
                              f"the memory budget of {self.memory_bytes} bytes")


@attrs.frozen
class Load:
    """Admission's state at one moment (what telemetry and a coordinator see)."""

    active: int
    waiting: int
    waiting_tokens: int
    reserved_cells: int
    free_cells: int
    free_slots: int
    draining: bool
    cached_cells: int = 0
    failure: Optional[str] = None


class Admission:
    """Tracks waiting and running sessions and the KV cells they reserve."""

    def __init__(self, budgets: Budgets, placement: Placement | None = None):
        self.budgets = budgets
        self.placement = placement or Placement(budgets.kv_cells_total)
        self.waiting: collections.deque[Session] = collections.deque()
        self.running: list[Session] = []
        self._waiting_tokens = 0
        self._reserved_cells = 0
        self._free_slots = list(range(budgets.slots - 1, -1, -1))
        self.gate = Gate()  # draining, or failed for good (an RPC worker lost)

    def load(self) -> Load:
        b = self.budgets
        return Load(active=len(self.running), waiting=len(self.waiting),
                    waiting_tokens=self._waiting_tokens, reserved_cells=self._reserved_cells,
                    free_cells=b.kv_cells_total - self._reserved_cells,
                    free_slots=len(self._free_slots), draining=self.gate.draining,
                    cached_cells=self.placement.cached_cells,
                    failure=self.gate.failure)

    def max_new_tokens(self, prompt_len: int, requested: int | None, default: int) -> int:
        """max_tokens for a session: as requested, else what its context leaves (capped)."""
        if requested is not None:
            return requested
        return max(1, min(default, self.budgets.kv_cells_per_session - prompt_len))

    def submit(self, session: Session) -> list[Session]:
        """Queue `session` or raise AdmissionRejected; never blocks. Returns the
        sessions that got a slot (see promote)."""
        return self.submit_group([session])

    def submit_group(self, sessions: list[Session]) -> list[Session]:
        """Queue all of `sessions` (the choices of one request) or none: raises
        AdmissionRejected if any could not be admitted beside the others. Returns
        the sessions that got a slot."""
        b = self.budgets
        self.gate.check()
        for session in sessions:
            if session.reserved_cells > b.kv_cells_per_session:
                raise AdmissionRejected(
                    "never_fits",
                    f"prompt ({len(session.spec.prompt)} tokens) + max_tokens "
                    f"({session.spec.params.max_tokens}) "
                    f"exceeds the per-session context of {b.kv_cells_per_session} tokens",
                    {"n_prompt_tokens": len(session.spec.prompt), "n_ctx": b.kv_cells_per_session})
        # how many start at once (in order, if nobody waits); the rest must fit the queue
        starting, slots, cells = 0, len(self._free_slots), self._reserved_cells
        if not self.waiting:
            for session in sessions:
                if slots == 0 or cells + session.reserved_cells > b.kv_cells_total:
                    break
                starting, slots, cells = starting + 1, slots - 1, cells + session.reserved_cells
        queued = sessions[starting:]
        check_queue("sessions", len(self.waiting), len(queued), b.max_waiting,
                    self._waiting_tokens, sum(len(s.spec.prompt) for s in queued),
                    b.max_waiting_tokens)
        for session in sessions:
            self.waiting.append(session)
            self._waiting_tokens += len(session.spec.prompt)
        return self.promote()

    def _fits(self, session: Session) -> bool:
        return (bool(self._free_slots)
                and self._reserved_cells + session.reserved_cells <= self.budgets.kv_cells_total)

    def promote(self) -> list[Session]:
        """Give waiting sessions a slot, oldest first, while they fit; returns them."""
        started = []
        while self.waiting and self._fits(self.waiting[0]):
            session = self.waiting.popleft()
            self._waiting_tokens -= len(session.spec.prompt)
            self._reserved_cells += session.reserved_cells
            slot = self.placement.place(session, self._free_slots, self._reserved_cells,
                                        self.running)
            self._free_slots.remove(slot)
            self.running.append(session)
            started.append(session)
        return started

    def release(self, session: Session) -> list[Session]:
        """Forget a finished session: free its queue place or its slot and KV
        (the batch loop has freed the cells). Returns the sessions promoted."""
        if session.phase is Phase.WAITING:
            self.waiting.remove(session)
            self._waiting_tokens -= len(session.spec.prompt)
        elif session in self.running:
            self.running.remove(session)
            self._reserved_cells -= session.reserved_cells
            self._free_slots.append(session.slot)
            self.placement.release(session)
        session.release()
        return self.promote()
