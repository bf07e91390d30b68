"""The Trio side of the batch loop, and the one place where sessions end.

Data flows one way round:

    placement's KV operations, finish requests --(bounded channel)--> feeder task
    feeder task --start / finish / evict--> BatchLoop (dgr/_batch.pyx, engine thread, no GIL)
    readers (dgr.stream.SessionStream) --credit--> BatchLoop
    BatchLoop --events (bounded ring) + eventfd--> pump task
    pump task --> session state (dgr.sequence), placement, telemetry, and each
                  session's chunks (dgr.reply: text, stop strings) to its reader

The BatchLoop plans, decodes, samples and updates the slot table step after
step without waiting for Trio (dgr/_scheduler.pyx has the policy and the
post-step update). Trio sees each step's events as they come and never sits
between two steps: a reader's readiness travels as credits (one per token it
took), so a slow reader's slot is skipped in C, not buffered in Python.
Credits go to the BatchLoop directly (they need no order with the other
requests), and the pump writes a session's chunks itself: a Trio task switch
per token is the largest cost Python adds to a token.

KV operations (saves, starts, evictions) are sent in the order placement decided
them, in the same synchronous step as the decision (`_send_ops`): no later
placement can give away a slot an earlier start copies from before that start
is queued.

A save's bytes come back through the pump (`_take_saved`) and go into the KV
tiers (dgr.kv_tiers): placement decides what is saved and restored, the loop
only carries the bytes.

A slot belongs to the BatchLoop from its start until the pump has seen its
finish event, whose KV cells are free by then (but for what it keeps for the
prefix cache); only then does admission hand the slot to another session.
"""

from __future__ import annotations

import collections
import contextlib
import os
import time
from typing import Callable, NamedTuple, Optional

import attrs
import trio

from dgr import _batch, _engine, _scheduler
from dgr._codes import DECODE_ABORTED, WORKER_LOST, FinishCode
from dgr.admission import Admission
from dgr.engine import EngineThread
from dgr.errors import decode_error
from dgr.events import (STEP_HISTORY, CallFailed, Decoded, Finished, Prefilled, Sampled, Scored,
                        StepEnded, StepRecord)
from dgr.kv_tier import Prefix
from dgr.placement import Evict, Save, Start
from dgr.reply import Reply
from dgr.sequence import FinishReason, Phase, Session
from dgr.step_time import RowTimes, StepTimeModel
from dgr.telemetry import Telemetry


@attrs.frozen
class StepSettings:
    """How the batch loop fills a step (dgr/_scheduler.pyx, Policy); built once."""

    token_budget: int        # rows per step (<= n_batch)
    prefill_chunk: int       # prefill rows a step beside decoders, until steps are timed
    decode_stall: float      # beside decoders: a step's time / a decode-only one's (0: off)
    prefill_sessions: int    # chunks per step


class Finish(NamedTuple):
    """End `session`'s slot before its next row (or its queue place)."""

    session: Session


class Park(NamedTuple):
    """Take `session`'s slot back before its next row; it resumes later
    (dgr.admission decides whom, dgr.sequence says how it resumes)."""

    session: Session


class Mark(NamedTuple):
    """Set `fed` once every request sent before it has reached the BatchLoop."""

    fed: trio.Event


def failure_message(code: int) -> str:
    return f"the model failed: {decode_error(code)}"


class StepLoop:
    """Runs admitted sessions through a BatchLoop, reports back to them, and
    alone ends them."""

    def __init__(self, batch, wake_fd: int, settings: StepSettings, admission: Admission,
                 telemetry: Telemetry, max_sessions: int, n_slots: int,
                 workers_connected: Callable[[], dict[str, bool]], tiers=None):
        """`batch`: a BatchLoop (or a stand-in with its methods, in tests) that
        writes `wake_fd`, an eventfd this loop owns, when it publishes events."""
        self.settings = settings
        self.batch = batch
        self._wake_fd = wake_fd
        self._workers_connected = workers_connected
        self.steps: collections.deque[StepRecord] = collections.deque(maxlen=STEP_HISTORY)
        self.step_time = StepTimeModel()  # fitted from every step; bounds prefill beside decoders
        self.row_times = RowTimes()  # decode steps' seconds by rows; how long a draft pays
        self._admission = admission
        self._placement = admission.placement
        self._telemetry = telemetry
        # Bounded by construction: per session one start and one finish, per slot an
        # eviction and a park, and a flush's mark are in flight.
        self._requests, self._incoming = trio.open_memory_channel(
            2 * max_sessions + 2 * n_slots + 1)
        self._n_slots = n_slots
        self._by_slot: dict[int, Session] = {}
        self._on_engine: set[int] = set()  # ids of sessions whose start reached the BatchLoop
        self._replies: dict[Session, Reply] = {}
        self._published: list[tuple[int, trio.Event]] = []  # KV op counts awaited (flush, restores)
        self._tiers = tiers  # dgr.kv_tiers.Tiers, or None: nothing is saved
        # the batch loop's entries for parked sessions' sampler states not in use: a
        # session holds one from its start on a slot until it leaves, so at most one
        # per slot and one per parked session are taken
        max_parked = admission.scheduling.max_parked
        entries = max_parked + n_slots if max_parked else 0
        self._sampler_entries = list(range(entries - 1, -1, -1))
        batch.set_parked_entries(entries)
        self.adapters = None  # dgr.adapters.AdapterTable: a retiring session releases its own
        self._saving: dict[int, object] = {}  # save ticket -> the tokens saved
        self._ops_seen = 0  # kv_ops_published when saves were last taken
        self._restore_fed = 0  # kv_ops_queued once the last restoring start was fed
        self._closing = False
        self.stopped = False  # the BatchLoop's run has returned: the engine is idle
        self._step_decode: list[int] = []
        # the drain's token latencies, observed together after it (telemetry.StepHistogram)
        self._first_latencies: list[float] = []
        self._next_latencies: list[float] = []
        self._step_prefill: list[tuple[int, int, int]] = []
        self.departures = trio.lowlevel.ParkingLot()  # woken whenever a session leaves
        self._handlers = {Sampled: self._on_sampled, Decoded: self._on_decoded,
                          Prefilled: self._on_prefilled, Scored: self._on_scored,
                          Finished: self._on_finished,
                          CallFailed: self._on_call_failed, StepEnded: self._on_step_ended}

    @classmethod
    def for_engine(cls, engine: _engine.Engine, settings: StepSettings, admission: Admission,
                   telemetry: Telemetry, max_sessions: int, tiers=None) -> "StepLoop":
        """A step loop over a BatchLoop that steps `engine` with these settings."""
        wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        scheduler = _scheduler.Scheduler(engine.n_seq_max, settings.token_budget,
                                         settings.prefill_chunk, settings.prefill_sessions,
                                         engine.n_vocab, engine.eog_tokens,
                                         one_call=engine.info["kv_unified"],
                                         decode_stall=settings.decode_stall,
                                         max_draft=engine.info["max_draft"])
        scheduler.set_word_forms(*engine.word_forms())
        batch = _batch.BatchLoop(engine, scheduler, wake_fd)
        if tiers is not None:
            batch.set_save_bound(tiers.host.max_bytes)
        return cls(batch, wake_fd, settings, admission, telemetry, max_sessions,
                   engine.n_seq_max, engine.workers_connected, tiers)

    # ------------------------------------------------------------ requests (any Trio task)

    def admit(self, replies: dict[Session, Reply]) -> None:
        """Sessions passed admission (the writing ends of their streams); the KV
        operations placement decided for them go to the BatchLoop now."""
        self._replies.update(replies)
        self._send_ops()

    def credit(self, session: Session) -> None:
        """The session's reader took a token: it may be sent one more. Straight
        to the BatchLoop (a credit needs no order with other requests): a slot that
        is not the session's (ended, or handed on) gets none."""
        slot = session.slot
        if slot is not None and self._by_slot.get(slot) is session:
            self.batch.credit(slot)

    def slot_sessions(self) -> list[Optional[Session]]:
        """The session on each slot, None where it is free."""
        return [self._by_slot.get(slot) for slot in range(self._n_slots)]

    def statistics(self) -> dict:
        """Every bound between the sessions and the batch loop, in use and in all: the
        request channel into the loop, the loop's own (BatchLoop.statistics), and the
        readers' chunk channels (their sum)."""
        requests = self._requests.statistics()
        readers = [reply.statistics() for reply in self._replies.values()]
        return {"requests": {"used": requests.current_buffer_used,
                             "capacity": requests.max_buffer_size},
                **self.batch.statistics(),
                "reply_chunks": {"used": sum(r.current_buffer_used for r in readers),
                                 "capacity": sum(r.max_buffer_size for r in readers),
                                 "readers": len(readers)}}

    def end(self, session: Session, reason: FinishReason, error: str | None = None) -> None:
        """Finish the session (first reason wins) and free its queue place or slot."""
        if session.finish(reason, error):
            self._requests.send_nowait(Finish(session))

    def refuse(self, session: Session, reason: str, detail: str) -> None:
        """Admission took a waiting session's place back (`reason`, dgr.admission):
        it ends, its reader told why."""
        if session.refuse(reason, detail):
            self._requests.send_nowait(Finish(session))

    def shutdown(self) -> None:
        """End every session as cancelled and stop the BatchLoop after (an aborted)
        step in flight."""
        self._closing = True
        for session in self._admission.admitted:
            if session.finish(FinishReason.CANCELLED):
                self._telemetry.record_finish(session.finish_reason)
        for session, reply in self._replies.items():  # readers get their end now
            reply.finish(session.finish_reason or FinishReason.CANCELLED, session.error)
        self._replies.clear()
        self.batch.stop()

    async def flush_cache(self, save: bool = False) -> None:
        """Evict every cached prefix (running sessions keep what they share; with
        `save` the entries go to the host tier); returns once the BatchLoop has
        published the KV without them."""
        self._placement.flush(save)
        self._send_ops()
        await self._ops_applied()

    async def save_to_host(self, slot: int) -> None:
        """Save a cached slot's entry into the host tier (it stays in the pool);
        returns once the BatchLoop has saved it and the tier has it."""
        self._placement.save(slot)
        self._send_ops()
        await self._ops_applied()
        self._take_saved()

    async def _ops_applied(self) -> None:
        """Until every KV operation sent so far is applied and published."""
        fed = trio.Event()
        await self._requests.send(Mark(fed))
        await fed.wait()
        await self._until_published(self.batch.kv_ops_queued)

    async def _until_published(self, n_ops: int) -> None:
        """Until the BatchLoop has applied and published its first `n_ops` KV operations."""
        if self.batch.kv_ops_published >= n_ops:
            return
        published = trio.Event()
        self._published.append((n_ops, published))
        self._check_published()
        await published.wait()

    def _send_ops(self) -> None:
        for op in self._placement.take_ops():
            self._requests.send_nowait(op)
            if isinstance(op, Evict):
                self._telemetry.prefix_evictions.inc()
        for session in self._admission.take_parks():
            self._requests.send_nowait(Park(session))

    def _take_saved(self) -> None:
        """The saves the BatchLoop has made since last asked, into the tiers."""
        done, saved = self.batch.take_saved()
        self._ops_seen = done
        self._tiers.loop_figures(self.batch.tier_figures)
        for ticket, state in saved:
            tokens = self._saving.pop(ticket, None)
            if tokens is not None and state is not None:
                self._tiers.saved(Prefix(tokens, state))
        for ticket in [t for t in self._saving if t <= done]:
            del self._saving[ticket]  # dropped by the loop (its save bound)

    def _check_published(self) -> None:
        done = self.batch.kv_ops_published
        for target, event in [w for w in self._published if w[0] <= done]:
            self._published.remove((target, event))
            event.set()

    # ------------------------------------------------------------ tasks

    async def run(self, engine_thread: EngineThread) -> None:
        """The feeder and pump tasks, and the BatchLoop on the engine thread."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._feed)
                nursery.start_soon(self._pump)
                await engine_thread.run(self.batch.run)
                self.stopped = True
                nursery.cancel_scope.cancel()
        finally:
            os.close(self._wake_fd)

    async def _feed(self) -> None:
        """Requests into the BatchLoop's mailbox, a burst at a time. A start that
        restores a stored prefix is fed once the restore fed before it has been
        applied: the loop applies KV operations between two steps, so decoders
        wait for one restore at most between two steps, however many arrive at
        once."""
        async for request in self._incoming:
            while True:
                if type(request) is Start and request.session.restore is not None:
                    await self._until_published(self._restore_fed)
                    self._feed_one(request)
                    self._restore_fed = self.batch.kv_ops_queued
                else:
                    self._feed_one(request)
                try:
                    request = self._incoming.receive_nowait()
                except trio.WouldBlock:
                    break

    def _feed_one(self, request) -> None:
        if type(request) is Evict:
            self.batch.evict(request.slot)
        elif type(request) is Save:
            self._saving[self.batch.save(request.slot)] = request.tokens
        elif type(request) is Mark:
            request.fed.set()
        elif type(request) is Start:
            self._start_on_loop(request.session)
        elif type(request) is Park:
            session = request.session
            if (not session.done and session.slot is not None
                    and self._by_slot.get(session.slot) is session):
                self.batch.request_park(session.slot)
        else:
            session = request.session
            if session.slot is not None and self._by_slot.get(session.slot) is session:
                self.batch.request_finish(session.slot, session.finish_reason.code)
            elif (session.phase in (Phase.WAITING, Phase.PARKED)
                  or self._placement.unhold(session)):
                self._retire(session)

    def _start_on_loop(self, session: Session) -> None:
        if session.done:  # cancelled before its first step: no work for it
            self._retire(session)
            return
        self._by_slot[session.slot] = session
        self._on_engine.add(session.id)
        reply = self._replies[session]
        if session.sampler_entry is None and self._sampler_entries:
            session.sampler_entry = self._sampler_entries.pop()
        entry = session.sampler_entry
        self.batch.start(session.slot, session.run_spec(), credits=reply.credits_left(),
                         reuse_from=-1 if session.reuse_from is None else session.reuse_from,
                         n_reused=session.n_reused,
                         keep_kv=self._placement.cache is not None,
                         restore=None if session.restore is None else session.restore.state,
                         sampler_entry=-1 if entry is None else entry, resume=session.parks > 0,
                         park_when_full=entry is not None
                         and self._admission.may_park_again(session))
        self._placement.started(session)
        if session.parks:
            self._telemetry.resumes.inc()
        elif session.spec.reports_progress:
            reply.started(session.n_reused)
            reply.progress(session.n_reused, time.monotonic())
        if session.restore is not None:
            self._tiers.restored(session.n_reused)
        elif session.n_reused:
            self._telemetry.record_prefix_reuse(session.n_reused)

    async def _pump(self) -> None:
        """The BatchLoop's events into sessions, placement, telemetry and readers' chunks."""
        handlers = self._handlers
        while True:
            await trio.lowlevel.wait_readable(self._wake_fd)
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_fd, 8)
            events = self.batch.drain()
            now = time.monotonic()
            for event in events:
                handlers[type(event)](event, now)
            self._telemetry.ttft.observe_all(self._first_latencies)
            self._telemetry.itl.observe_all(self._next_latencies)
            self._first_latencies.clear()
            self._next_latencies.clear()
            if self._published:
                self._check_published()
            if self._tiers is not None and self.batch.kv_ops_published != self._ops_seen:
                self._take_saved()

    # ------------------------------------------------------------ events

    def _on_sampled(self, event: Sampled, now: float) -> None:
        session = self._by_slot[event.slot]
        latency = session.record_token(event.token, now)
        if len(session.generated) == 1:
            self._first_latencies.append(latency)
            self._telemetry.tenants.first_token(session, latency)
        else:
            self._next_latencies.append(latency)
        if not session.done:
            self._replies[session].token(event.token, event.logprob, event.top)

    def _on_decoded(self, event: Decoded, now: float) -> None:
        self._step_decode.append(self._by_slot[event.slot].id)
        if event.drafted:
            self._telemetry.record_drafts(event.source, event.drafted, event.accepted)

    def _on_scored(self, event: Scored, now: float) -> None:
        self._by_slot[event.slot].record_score(event.logprob, event.top)

    def _on_prefilled(self, event: Prefilled, now: float) -> None:
        session = self._by_slot[event.slot]
        session.record_prefill(event.end)
        if session.spec.reports_progress:
            self._replies[session].progress(event.end, now)
        self._placement.prefilled(session, event.end)
        self._send_ops()
        self._step_prefill.append((session.id, event.start, event.end))

    def _on_finished(self, event: Finished, now: float) -> None:
        session = self._by_slot.pop(event.slot)
        self._placement.finished(session, event.kept)
        parked = event.reason == FinishCode.FINISH_PARKED
        if parked and not session.done and (  # asked for, or for KV cells (a code)
                not event.code or self._admission.park_when_full(session)):
            self._admission.parked_now(session, pool_full=event.code != 0)
            self._telemetry.record_park(session.spec.requester, event.code != 0)
            self._send_ops()
            return
        if self._closing and event.code == DECODE_ABORTED:  # the abort that stopped the loop
            session.finish(FinishReason.CANCELLED)
        elif event.code:  # an error, or KV cells not found for one parked its last time
            session.finish(FinishReason.ERROR, failure_message(event.code))
        elif not parked:  # (one that ended while being parked has its reason)
            session.finish(FinishReason.from_code(event.reason))
        self._retire(session)

    def _on_call_failed(self, event: CallFailed, now: float) -> None:
        self._telemetry.step_failures.labels(str(event.code)).inc()
        if event.code == WORKER_LOST:
            lost = [e for e, up in self._workers_connected().items() if not up]
            self._fail_node(f"RPC worker {', '.join(lost) or '?'} lost (connection closed, "
                            "reset or timed out): the node serves nothing until it is "
                            "restarted with its workers up")

    def _on_step_ended(self, event: StepEnded, now: float) -> None:
        if self._admission.waiting and self._admission.may_park:
            # the step moved the tenants' counters: a waiting tenant may now be far
            # enough behind to have a decoder parked for it
            self._admission.promote()
            self._send_ops()
        figures = event.figures
        budget = self.settings.token_budget
        self._telemetry.record_step(figures, budget)
        self.steps.append(StepRecord(figures.index, tuple(self._step_decode),
                                     tuple(self._step_prefill), figures.rows, budget,
                                     figures.total_s, figures.draft_rows,
                                     figures.generated,
                                     (figures.planned_tokens, figures.planned_s)))
        chunks = [(start, end) for _, start, end in self._step_prefill]
        self._step_decode, self._step_prefill = [], []
        # a draft row costs what a decode row does: both are output rows at a context's end
        output_rows = figures.decode_rows + figures.draft_rows
        anew = False
        if output_rows and not chunks:
            anew = self.row_times.observe(output_rows, figures.total_s, figures.cells)
        model = self.step_time.observe(output_rows, chunks, figures.total_s)
        if model is not None:
            self.batch.set_step_time(*model)
        # a step with drafts may have run a row count the policy guessed, and a step
        # may have timed its rows at the sessions' contexts now, which the policy
        # drafts beside: the next plans see its time at once, not at the next fit
        if model is not None or figures.draft_rows or anew:
            self.batch.set_row_times(self.row_times.points())

    def _fail_node(self, why: str) -> None:
        """The engine can run no step any more (an RPC worker is lost: every
        session's KV there is gone): refuse new sessions and end every admitted
        one with the error, running or waiting."""
        if self._admission.gate.failure is not None:
            return
        self._admission.gate.fail(why)
        self._telemetry.healthy.set(0)
        for session in self._admission.admitted:
            self.end(session, FinishReason.ERROR, why)

    def _retire(self, session: Session) -> None:
        """A finished session leaves: its place goes to the next ones, its reader
        gets the end. One path retires each session (its start reaching the feeder
        after it ended, its finish request while it waits or is held, or the
        BatchLoop's finish event)."""
        self._placement.retired(session, reached_loop=session.id in self._on_engine)
        self._on_engine.discard(session.id)
        if session.sampler_entry is not None:  # freed of what it holds if it left parked
            self.batch.drop_parked(session.sampler_entry)
            self._sampler_entries.append(session.sampler_entry)
            session.sampler_entry = None
        self._admission.release(session)
        if self.adapters is not None:
            self.adapters.release(session.spec, len(session.generated))
        self._send_ops()
        self._telemetry.record_finish(session.finish_reason)
        self._telemetry.tenants.left(session)
        reply = self._replies.pop(session, None)
        if reply is not None:
            reply.finish(session.finish_reason, session.error)
        self.departures.unpark_all()
