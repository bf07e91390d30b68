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

Who runs next (`Scheduling.policy`):

- fcfs: the waiting queue is strict FIFO: a session that does not fit blocks
  younger ones, so a large request is never starved by a stream of small ones.
- priority: the waiting session of the lowest priority value runs next; among
  equal priorities the tenant with the least virtual token counter
  (dgr.tenants), then a parked session, then the oldest; the one chosen blocks
  the others while it does not fit. A full queue refuses the lowest-priority
  waiting sessions (`preempted_from_queue`) rather than a newcomer that outranks
  them, and at equal priority the newest of the tenant holding the most places
  rather than a newcomer whose tenant holds fewer. A session that cannot start
  because decoders of a lower rank hold the slots or cells (a higher priority,
  or the same priority and a tenant more than `fair_drift` virtual tokens ahead)
  has the lowest-ranked of them parked: its KV stays as a prefix, its sampler
  state is held, and it resumes when it ranks first again, unchanged bitwise
  (docs/design.md). A running session whose rows the KV pool cannot place
  (its cells out of order and not movable) is parked the same way rather than
  ended, and resumes once another session has given its KV up.

Under both, a tenant at its own bound of running sessions waits without
blocking others, and a tenant past its queue or rate bound is refused
(`tenant_queue_full`, `tenant_rate`) while others are admitted.
No I/O and no llama.cpp here.
"""

from __future__ import annotations

import itertools
from typing import Optional

import attrs

from dgr.adapters import ADAPTERS_BUSY
from dgr.errors import AdmissionRejected, BudgetError
from dgr.placement import Placement
from dgr.sequence import Phase, Session
from dgr.tenants import Tenants

# a waiting session refused after admission, for a newcomer that outranks it
PREEMPTED_FROM_QUEUE = "preempted_from_queue"
REASONS = ("never_fits", "queue_full", "queue_tokens_full", "draining", "unhealthy",
           "tenant_queue_full", "tenant_rate", PREEMPTED_FROM_QUEUE, ADAPTERS_BUSY)
POLICIES = ("fcfs", "priority")


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
class Scheduling:
    """Who runs next, and when a running session is parked for another."""

    policy: str = "fcfs"       # POLICIES
    max_parked: int = 0        # sessions parked at once (the batch loop's sampler entries)
    max_parks: int = 3         # times one session may be parked
    # virtual tokens (dgr.tenants) a tenant may run ahead of a waiting one of the same
    # priority before one of its sessions is parked for it
    fair_drift: float = 8192.0


def parking_off(policy: str, memory: str) -> Optional[str]:
    """Why no running session is parked (None: they may be). A resumed session's
    tokens are computed again where no prefix of them is kept, which only an
    attention KV computes bitwise as it was decoded: a recurrent state is not."""
    if policy != "priority":
        return f"--scheduling-policy {policy}"
    if memory != "attention":
        return f"the model's {memory} state would be computed again otherwise than decoded"
    return None


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
    """Tracks waiting, running and parked sessions and the KV cells they reserve;
    decides who runs next and whom to park (`Scheduling`)."""

    def __init__(self, budgets: Budgets, placement: Placement | None = None,
                 scheduling: Scheduling = Scheduling(), tenants: Tenants | None = None):
        self.budgets = budgets
        self.placement = placement or Placement(budgets.kv_cells_total)
        self.scheduling = scheduling
        self.tenants = tenants if tenants is not None else Tenants()
        self.waiting: list[Session] = []  # in arrival order
        self.running: list[Session] = []
        self.parked: list[Session] = []   # their slots taken back, waiting to resume
        self.parking: list[Session] = []  # running, asked to park, their slots not back yet
        self._to_park: list[Session] = []  # decided, not yet taken by the step loop
        self._refused: list[Session] = []  # waiting sessions refused for an outranking one
        # parked because the KV pool could not place their rows: they wait for another
        # running session to give its KV up
        self._awaiting_room: list[Session] = []
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

    @property
    def may_park(self) -> bool:
        return self.scheduling.policy == "priority" and self.scheduling.max_parked > 0

    def may_park_again(self, session: Session) -> bool:
        """Whether `session` may be parked (once more) at all."""
        return (self.may_park and session.parks < self.scheduling.max_parks
                and not session.spec.scores_prompt)

    def park_when_full(self, session: Session) -> bool:
        """Whether `session`, running, whose rows the KV pool could not place, waits
        parked for room rather than ending with the error."""
        others = len(self.parked) + sum(s is not session for s in self.parking)
        return self.may_park_again(session) and others < self.scheduling.max_parked

    @property
    def admitted(self) -> list[Session]:
        """Every session admitted that has not left: waiting, parked and running."""
        return [*self.waiting, *self.parked, *self.running]

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
        """Queue all of `sessions` (the choices of one request, one requester) or
        none: raises AdmissionRejected if any could not be admitted beside the
        others. Returns the sessions that got a slot."""
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
        name = sessions[0].spec.requester.tenant
        tenant = self.tenants.get(name)
        # how many start at once (in order, if nobody waits); the rest must fit the queues
        starting, slots, cells, running = 0, len(self._free_slots), self._reserved_cells, 0
        if not self.waiting and not self.parked:
            bound = tenant.bounds.max_running
            for session in sessions:
                if (slots == 0 or cells + session.reserved_cells > b.kv_cells_total
                        or (bound is not None and tenant.running + running >= bound)):
                    break
                starting, slots, cells = starting + 1, slots - 1, cells + session.reserved_cells
                running += 1
        queued = sessions[starting:]
        refused = []
        self.tenants.arriving(name, self.running)
        try:
            self.tenants.check(name, queued)
            try:
                check_queue("sessions", len(self.waiting), len(queued), b.max_waiting,
                            self._waiting_tokens, sum(len(s.spec.prompt) for s in queued),
                            b.max_waiting_tokens)
            except AdmissionRejected:
                refused = self._outranked(queued)
        except AdmissionRejected:
            self.tenants.forget_idle(name)
            raise
        for session in refused:
            self._dequeue(session)
        self._refused += refused
        for session in sessions:
            self.waiting.append(session)
            self._waiting_tokens += len(session.spec.prompt)
            self.tenants.queued(session)
        return self.promote()

    def _outranked(self, queued: list[Session]) -> list[Session]:
        """Under the priority policy, the waiting sessions that make room for `queued`
        (new, of one requester): first those of a higher priority value, the lowest-
        ranked first (`_rank`); then, of its priority, the newest of the tenant holding
        the most places while it holds more than the newcomer's tenant would (one
        tenant's flood yields the queue to the others). Raises the queue's refusal
        again where those do not make room."""
        b = self.budgets
        count, tokens = len(self.waiting) + len(queued), (
            self._waiting_tokens + sum(len(s.spec.prompt) for s in queued))

        def full() -> bool:
            return count > b.max_waiting or tokens > b.max_waiting_tokens

        refused: list[Session] = []
        if self.scheduling.policy == "priority":
            requester = queued[0].spec.requester
            counters = self.tenants.counters(self.running)
            lower = sorted((s for s in self.waiting
                            if s.spec.requester.priority > requester.priority),
                           key=lambda s: self._rank(s, counters), reverse=True)
            places: dict[str, list[Session]] = {}
            for s in self.waiting:
                if s.spec.requester.priority == requester.priority:
                    places.setdefault(s.spec.requester.tenant, []).append(s)
            mine = len(places.pop(requester.tenant, [])) + len(queued)
            while full():
                if lower:
                    session = lower.pop(0)
                else:
                    most = max(places.values(), key=len, default=[])
                    if len(most) <= mine:
                        break
                    session = most.pop()
                refused.append(session)
                count, tokens = count - 1, tokens - len(session.spec.prompt)
        if full():
            check_queue("sessions", len(self.waiting), len(queued), b.max_waiting,
                        self._waiting_tokens, sum(len(s.spec.prompt) for s in queued),
                        b.max_waiting_tokens)
        return refused

    @staticmethod
    def _rank(session: Session, counters: dict[str, float]) -> tuple:
        """Where a session stands in the priority policy's order (lower runs first): its
        priority, its tenant's counter, whether it waits to resume, its arrival."""
        requester = session.spec.requester
        return (requester.priority, counters.get(requester.tenant, 0.0), not session.parked,
                session.id)

    def take_refused(self) -> list[Session]:
        """Waiting sessions refused for outranking newcomers since the last call:
        the node ends them (their requests answer 429, preempted_from_queue)."""
        refused, self._refused = self._refused, []
        return refused

    def take_parks(self) -> list[Session]:
        """Running sessions to park, decided since the last call (the step loop asks
        the batch loop to park them)."""
        parks, self._to_park = self._to_park, []
        return parks

    def _dequeue(self, session: Session) -> None:
        if session.parked:
            self.parked.remove(session)
            if session in self._awaiting_room:
                self._awaiting_room.remove(session)
        else:
            self.waiting.remove(session)
            self._waiting_tokens -= len(session.spec.prompt)
        self.tenants.dequeued(session, session.parked)

    def _fits(self, session: Session) -> bool:
        return (bool(self._free_slots)
                and self._reserved_cells + session.reserved_cells <= self.budgets.kv_cells_total)

    def _next(self) -> Optional[Session]:
        """The session that runs next (`Scheduling.policy`), of those whose tenants
        are under their bound of running sessions."""
        tenants = self.tenants
        eligible = (s for s in itertools.chain(self.parked, self.waiting)
                    if tenants.get(s.spec.requester.tenant).under_running_bound())
        if self.scheduling.policy == "fcfs":
            return next(eligible, None)
        counters = tenants.counters(self.running)
        return min(eligible, default=None, key=lambda s: self._rank(s, counters))

    def promote(self) -> list[Session]:
        """Give waiting and parked sessions a slot in the policy's order while they
        fit; park decoders the one that does not fit outranks. Returns those started."""
        started = []
        while (session := self._next()) is not None:
            if session in self._awaiting_room:
                break  # it blocks those it outranks, as one that does not fit does
            if not self._fits(session):
                self._park_for(session)
                break
            self._dequeue(session)
            self._reserved_cells += session.reserved_cells
            slot = self.placement.place(session, self._free_slots, self._reserved_cells,
                                        self.running)
            self._free_slots.remove(slot)
            self.running.append(session)
            self.tenants.started(session, resumed=session.parks > 0)
            started.append(session)
        return started

    def _park_for(self, waiting: Session) -> None:
        """Under the priority policy, park the lowest-ranked decoder `waiting`
        outranks, unless those already parking will make room for it."""
        sched = self.scheduling
        if sched.policy != "priority" or len(self.parked) + len(self.parking) >= sched.max_parked:
            return
        coming_cells = sum(s.reserved_cells for s in self.parking)
        if (len(self._free_slots) + len(self.parking) >= 1 and self._reserved_cells
                - coming_cells + waiting.reserved_cells <= self.budgets.kv_cells_total):
            return
        counters = self.tenants.counters(self.running)
        priority, tenant = waiting.spec.requester.priority, waiting.spec.requester.tenant

        def outranked(s: Session) -> bool:
            other = s.spec.requester
            return other.priority > priority or (
                other.priority == priority and other.tenant != tenant
                and counters[other.tenant] - counters[tenant] > sched.fair_drift)

        victims = [s for s in self.running if s.phase is Phase.DECODE and s not in self.parking
                   and self.may_park_again(s) and outranked(s)]
        if victims:
            victim = max(victims, key=lambda s: (s.spec.requester.priority,
                                                 counters[s.spec.requester.tenant], s.id))
            self.parking.append(victim)
            self._to_park.append(victim)

    def parked_now(self, session: Session, pool_full: bool = False) -> list[Session]:
        """The batch loop parked `session` (its slot and KV are free; placement has
        what its sequence keeps): it waits to resume. With pool_full (the KV pool
        could not place its rows) it resumes only once another running session has
        given its KV up, if any runs. Returns the sessions promoted."""
        self._stop_running(session)
        session.park()
        self.parked.append(session)
        self.tenants.queued(session, parked=True)
        if pool_full and self.running:
            self._awaiting_room.append(session)
        return self.promote()

    def release(self, session: Session) -> list[Session]:
        """Forget a finished session: free its queue place or its slot and KV
        (the batch loop has freed the cells). Returns the sessions promoted."""
        if session in self.waiting or session in self.parked:
            self._dequeue(session)
        elif session in self.running:
            self._stop_running(session)
        self.tenants.left(session)
        session.release()
        return self.promote()

    def _stop_running(self, session: Session) -> None:
        """A running session gives its slot and KV up (it leaves, or is parked):
        sessions parked for want of room may try again."""
        self._awaiting_room.clear()
        if session in self.parking:
            self.parking.remove(session)
        self.running.remove(session)
        self._reserved_cells -= session.reserved_cells
        self._free_slots.append(session.slot)
        self.placement.release(session)
        self.tenants.stopped(session, len(session.generated) - session.resumed_from)

    def statistics(self) -> dict:
        """The parked sessions and each tenant's queues, in use and in all."""
        return {"parked_sessions": {"used": len(self.parked) + len(self.parking),
                                    "capacity": self.scheduling.max_parked},
                **self.tenants.statistics()}
