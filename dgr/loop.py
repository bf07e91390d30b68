"""The Trio side of the batch loop.

Data flows one way round:

    session tasks, admission --requests (bounded channel)--> feeder task
    feeder task --start / finish / evict--> BatchLoop (dgr/_batch.pyx, engine thread, no GIL)
    session tasks --credit--> BatchLoop
    BatchLoop --events (bounded ring) + eventfd--> pump task
    pump task --> session state (dgr.sequence), telemetry, each session's token channel

The BatchLoop plans, decodes, samples and updates the slot table step after
step without waiting for Trio (dgr/_scheduler.pyx has the policy and the
post-step update). Trio sees each step's events as they come and never sits
between two steps: a reader's readiness travels as credits (one per token it
took), so a slow reader's slot is skipped in C, not buffered in Python.
Credits go to the BatchLoop directly (they need no order with the other
requests, and a Trio task switch per token is the largest cost Python adds
to a token).

A slot belongs to the BatchLoop from its start until the pump has seen its
EV_FINISH, whose KV cells are free by then; only then does admission hand
the slot to another session.
"""

from __future__ import annotations

import collections
import contextlib
import os
import time

import attrs
import trio

from dgr import _batch, _scheduler
from dgr.admission import Admission
from dgr.config import seed32
from dgr.engine import EngineThread
from dgr.sequence import FinishReason, Phase, Session
from dgr.stream import TokenEvent
from dgr.telemetry import Telemetry


@attrs.frozen
class StepSettings:
    """How the batch loop fills a step (dgr/_scheduler.pyx, Policy); built once."""

    token_budget: int        # rows per step (<= n_batch)
    prefill_chunk: int       # prompt tokens per chunk; boundaries are its multiples
    prefill_sessions: int    # chunks per step, each in a llama_decode call of its own
    reply_buffer: int        # tokens a reader may hold unread (its credits)


@attrs.frozen
class StepRecord:
    """What one step did (kept for tests and diagnostics, bounded)."""

    index: int
    decode: tuple[int, ...]                    # session ids with a decode row
    prefill: tuple[tuple[int, int, int], ...]  # (session id, start, end)
    rows: int
    budget: int
    duration_s: float


_START, _FINISH, _EVICT, _MARK = range(4)


def failure_message(code: int) -> str:
    if code == _batch.ENGINE_FAULT:
        return "the model failed: the engine raised during a step (code -1000)"
    if code == _scheduler.NO_LOGITS_CODE:
        return "the model failed: llama.cpp gave no logits for an output row"
    return f"the model failed: {_batch._decode_error(code)}"


class StepLoop:
    """Runs admitted sessions through a BatchLoop and reports back to them."""

    def __init__(self, engine: _batch.Engine, settings: StepSettings, admission: Admission,
                 telemetry: Telemetry, max_sessions: int):
        self.settings = settings
        self._engine = engine
        self.steps: collections.deque[StepRecord] = collections.deque(maxlen=4096)
        self._admission = admission
        self._telemetry = telemetry
        self._wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        scheduler = _scheduler.Scheduler(engine.n_seq_max, settings.token_budget,
                                         settings.prefill_chunk, settings.prefill_sessions,
                                         engine.n_vocab, engine.eog_tokens,
                                         one_call=engine.info["kv_unified"])
        self.batch = _batch.BatchLoop(engine, scheduler, self._wake_fd)
        # Bounded by construction: per session one start and one finish, per slot an
        # eviction, and a flush's mark are in flight.
        self._requests, self._incoming = trio.open_memory_channel(
            2 * max_sessions + engine.n_seq_max + 1)
        self._cache = admission.prefix_cache
        self._by_slot: dict[int, Session] = {}
        self._on_engine: set[int] = set()  # ids of sessions whose start reached the BatchLoop
        self._held: dict[int, list[Session]] = {}  # leader id -> choices waiting for its prefill
        self._outboxes: dict[Session, trio.MemorySendChannel] = {}
        self._closing = False
        self._step_decode: list[int] = []
        self._step_prefill: list[tuple[int, int, int]] = []

    # ------------------------------------------------------------ requests (any Trio task)

    def admit(self, outboxes: dict[Session, trio.MemorySendChannel],
              started: list[Session]) -> None:
        """Sessions passed admission (their token channels); `started` got slots with them."""
        self._outboxes.update(outboxes)
        self._start(started)

    def credit(self, session: Session) -> None:
        """The session's task took a token: its reader may be sent one more. Straight
        to the BatchLoop (a credit needs no order with other requests): a slot that
        is not the session's (ended, or handed on) gets none."""
        slot = session.slot
        if slot is not None and self._by_slot.get(slot) is session:
            self.batch.credit(slot)

    def end(self, session: Session, reason: FinishReason) -> None:
        """Finish the session (first reason wins) and free its queue place or slot."""
        if session.finish(reason):
            self._requests.send_nowait((_FINISH, session))

    def stop(self) -> None:
        """Shutdown: stop the BatchLoop after (an aborted) step in flight."""
        self._closing = True
        self.batch.stop()

    def _start(self, sessions: list[Session]) -> None:
        # KV changes travel in the order admission decided them: a flush's evictions,
        # then for each session the evictions its placement made, then its start
        evictions = self._admission.take_evictions()
        self._evict([slot for slot, owner in evictions if owner is None])
        for session in sessions:
            self._evict([slot for slot, owner in evictions if owner is session])
            if self._waits_for_leader(session):
                self._held.setdefault(session.leader.id, []).append(session)
            else:
                self._requests.send_nowait((_START, session))

    def _evict(self, slots: list[int]) -> None:
        for slot in slots:
            self._requests.send_nowait((_EVICT, slot))
            self._telemetry.prefix_evictions.inc()

    def _waits_for_leader(self, session: Session) -> bool:
        """A session with a leader (admission: a running session prefilling chunks it
        shares) waits, its slot and KV reserved, until the leader has them."""
        leader = session.leader
        return (leader is not None and not leader.done and leader.phase is not Phase.FINISHED
                and leader.n_prefilled < session.share_len)

    def _release_followers(self, leader: Session, ended: bool = False) -> None:
        """Start the sessions waiting for `leader` that it has prefilled enough for
        (all of them when it ended), sharing what it prefilled, or, if a slot (the
        leader's ended one among them) now holds more of their prompt, that."""
        waiting = self._held.pop(leader.id, [])
        for session in waiting:
            if not ended and leader.n_prefilled < session.share_len:
                self._held.setdefault(leader.id, []).append(session)
                continue
            source, n = leader.slot, 0 if ended else session.share_len
            holder, cached = self._cache.match(session.prompt_array)
            if cached > n:
                source, n = holder, cached
            if n:
                session.share(source, n)
                self._cache.assign(session.slot, session.prompt[:n])
            self._requests.send_nowait((_START, session))

    def _unhold(self, session: Session) -> bool:
        held = self._held.get(session.leader.id, []) if session.leader is not None else []
        if session in held:
            held.remove(session)
            return True
        return False

    async def flush_cache(self) -> None:
        """Evict every cached prefix (running sessions keep what they share); returns
        once the BatchLoop has published the KV without them."""
        self._admission.flush_cache()
        self._start([])
        fed = trio.Event()  # set by the feeder once it has queued the evictions before it
        await self._requests.send((_MARK, fed))
        await fed.wait()
        target = self.batch.kv_ops_queued
        while self.batch.kv_ops_published < target:
            await trio.sleep(0.001)

    # ------------------------------------------------------------ tasks

    async def run(self, engine_thread: EngineThread) -> None:
        """The feeder and pump tasks, and the BatchLoop on the engine thread."""
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._feed)
                nursery.start_soon(self._pump)
                await engine_thread.run(self.batch.run)
                nursery.cancel_scope.cancel()
        finally:
            os.close(self._wake_fd)

    async def _feed(self) -> None:
        """Requests into the BatchLoop's mailbox, a burst at a time."""
        async for kind, item in self._incoming:
            while True:
                self._feed_one(kind, item)
                try:
                    kind, item = self._incoming.receive_nowait()
                except trio.WouldBlock:
                    break

    def _feed_one(self, kind: int, item) -> None:
        batch = self.batch
        if kind == _EVICT:  # `item` is a slot
            batch.evict(item)
            return
        if kind == _MARK:  # `item` is an event: everything sent before it is fed
            item.set()
            return
        session = item
        slot = session.slot
        owned = slot is not None and self._by_slot.get(slot) is session
        if kind == _START:
            if session.done:  # cancelled before its first step: no work for it
                self._retire(session)
            else:
                self._by_slot[slot] = session
                self._on_engine.add(session.id)
                p = session.params
                batch.start(slot, session.prompt, session.max_tokens,
                            n_logprobs=p.logprobs, ignore_eos=p.ignore_eos,
                            credits=self.settings.reply_buffer, temperature=p.temperature,
                            top_k=p.top_k, top_p=p.top_p, min_p=p.min_p,
                            seed=seed32(p.seed or 0), logit_bias=p.sampler_bias(),
                            repeat_last_n=p.repeat_last_n, repeat_penalty=p.repeat_penalty,
                            frequency_penalty=p.frequency_penalty,
                            presence_penalty=p.presence_penalty, grammar=p.grammar,
                            min_tokens=p.min_tokens, stop_token_ids=p.stop_token_ids,
                            reuse_from=-1 if session.reuse_from is None else session.reuse_from,
                            n_reused=session.n_reused,
                            keep_kv=self._cache is not None)
                if self._cache is not None:
                    self._cache.activate(slot)
                if session.n_reused:
                    self._telemetry.prefix_hits.inc()
                    self._telemetry.prefix_tokens_reused.inc(session.n_reused)
        elif owned:
            batch.request_finish(slot, session.finish_reason.code)
        elif session.phase is Phase.WAITING or self._unhold(session):
            self._retire(session)

    async def _pump(self) -> None:
        """The BatchLoop's events into sessions, telemetry and token channels."""
        while True:
            await trio.lowlevel.wait_readable(self._wake_fd)
            with contextlib.suppress(BlockingIOError):
                os.read(self._wake_fd, 8)
            events = self.batch.drain()
            now = time.monotonic()
            for event in events:
                self._apply(event, now)

    # ------------------------------------------------------------ events

    def _apply(self, event: tuple, now: float) -> None:
        kind, slot = event[0], event[1]
        if kind == _scheduler.EVENT_TOKEN:
            session = self._by_slot[slot]
            latency = session.record_token(event[2], now)
            (self._telemetry.ttft if len(session.generated) == 1 else self._telemetry.itl
             ).observe(latency)
            if not session.done:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    self._outboxes[session].send_nowait(TokenEvent(event[2], event[3], event[4]))
        elif kind == _scheduler.EVENT_DECODE:
            self._step_decode.append(self._by_slot[slot].id)
        elif kind == _scheduler.EVENT_PREFILL:
            session = self._by_slot[slot]
            session.record_prefill(event[3])
            if self._cache is not None:
                self._cache.hold(slot, session.prompt[:event[3]])
                if session.id in self._held:
                    self._release_followers(session)
            self._step_prefill.append((session.id, event[2], event[3]))
        elif kind == _scheduler.EVENT_FINISH:
            session = self._by_slot.pop(slot)
            reason, code = FinishReason.from_code(event[2]), event[3]
            if reason is FinishReason.ERROR:
                if self._closing and code == 2:
                    session.finish(FinishReason.CANCELLED)
                else:
                    session.finish(reason, failure_message(code))
            else:
                session.finish(reason)
            if self._cache is not None:
                # the BatchLoop kept what the sequence holds, but after an error
                self._cache.hold(slot, [] if reason is FinishReason.ERROR else session.kv_tokens())
            self._retire(session)
        elif kind == _scheduler.EVENT_FAILURE:
            code = event[1]
            self._telemetry.step_failures.labels(str(code)).inc()
            if code == _batch.WORKER_LOST:
                lost = [e for e, up in self._engine.workers_connected().items() if not up]
                self._fail_node(f"RPC worker {', '.join(lost) or '?'} lost (connection closed, "
                                "reset or timed out): the node serves nothing until it is "
                                "restarted with its workers up")
        else:
            figures = event[1]
            self._record_step(figures)

    def _fail_node(self, why: str) -> None:
        """The engine can run no step any more (an RPC worker is lost: every
        session's KV there is gone): refuse new sessions and end every admitted
        one with the error, running or waiting."""
        if self._admission.failure is not None:
            return
        self._admission.fail(why)
        self._telemetry.healthy.set(0)
        for session in [*self._admission.running, *self._admission.waiting]:
            if session.finish(FinishReason.ERROR, why):
                self._requests.send_nowait((_FINISH, session))

    def _record_step(self, figures: dict) -> None:
        budget = self.settings.token_budget
        self._telemetry.record_step(figures, budget)
        self.steps.append(StepRecord(figures["index"], tuple(self._step_decode),
                                     tuple(self._step_prefill), figures["rows"], budget,
                                     figures["total_s"]))
        self._step_decode, self._step_prefill = [], []

    def _retire(self, session: Session) -> None:
        """A finished session leaves: its place goes to the next ones, its reader
        gets the end. One path retires each session (its start reaching the feeder
        after it ended, its finish request while it waits or is held, or the
        BatchLoop's finish event); the check keeps a second call harmless."""
        if session.phase is Phase.FINISHED:
            return
        if (self._cache is not None and session.phase is Phase.PREFILL
                and session.id not in self._on_engine):
            # admission counted on a prefix in its slot that the BatchLoop never set up
            self._cache.drop(session.slot)
            self._requests.send_nowait((_EVICT, session.slot))
        self._on_engine.discard(session.id)
        if session.id in self._held:
            self._release_followers(session, ended=True)
        self._start(self._admission.release(session))
        self._telemetry.record_finish(session.finish_reason)
        outbox = self._outboxes.pop(session, None)
        if outbox is not None:
            with contextlib.suppress(trio.WouldBlock, trio.BrokenResourceError,
                                     trio.ClosedResourceError):
                outbox.send_nowait(TokenEvent(finish_reason=session.finish_reason,
                                              error=session.error))
            outbox.close()
