"""The step loop (dgr/loop.py) against a stand-in batch loop: what reaches the
loop and in which order, how its events end sessions, without a model."""

import contextlib
import functools
import os
import threading

import numpy as np
import pytest
import trio

from dgr._codes import WORKER_LOST, FinishCode
from dgr.admission import Admission, Budgets, Scheduling
from dgr.spec import Requester, SamplingParams
from dgr.engine import EngineThread
from dgr.events import CallFailed, Finished, Prefilled, Sampled, StepEnded, StepFigures
from dgr.kv_tier import MIN_RESTORE_TOKENS, HostTier, Prefix
from dgr.kv_tiers import Tiers
from dgr.loop import StepLoop, StepSettings
from dgr.placement import Placement
from dgr.prefix_cache import PrefixCache
from dgr.reply import Reply
from dgr.sequence import FinishReason, Phase, Session
from dgr.spec import SessionSpec
from dgr.telemetry import Telemetry

SLOTS = 2


class FakeBatch:
    """BatchLoop's methods, recording the calls; `publish` plays a step's events."""

    def __init__(self, wake_fd):
        self.wake_fd = wake_fd
        self.calls = []
        self.kv_ops_queued = self.kv_ops_published = self.cells_used = 0
        self.restores = 0
        self.park_when_full = {}
        self.tier_figures = {"restores": 0, "restores_failed": 0, "restore_s": 0.0,
                             "save_s": 0.0, "saves_dropped": 0}
        self._events = []
        self._stopped = threading.Event()

    def start(self, slot, spec, *, credits, reuse_from, n_reused, keep_kv, restore,
              sampler_entry=-1, resume=False, park_when_full=False):
        self.calls.append(("start", slot, reuse_from, n_reused)
                          + ((("resume", sampler_entry, spec.prompt, spec.params.max_tokens,
                               credits),) if resume else ()))
        self.park_when_full[slot] = park_when_full
        self.restores += restore is not None
        self.kv_ops_queued += 1

    def evict(self, slot):
        self.calls.append(("evict", slot))
        self.kv_ops_queued += 1

    def credit(self, slot, n=1):
        pass

    def set_step_time(self, a, b, c, e):
        self.calls.append(("step_time", a, b, c, e))

    def set_row_times(self, points):
        self.calls.append(("row_times", tuple(points)))

    def request_finish(self, slot, reason):
        self.calls.append(("finish", slot, reason))

    def set_parked_entries(self, n):
        self.parked_entries = n

    def request_park(self, slot):
        self.calls.append(("park", slot))

    def drop_parked(self, entry):
        self.calls.append(("drop", entry))

    def stop(self):
        self._stopped.set()

    def run(self):
        self._stopped.wait()

    def take_saved(self):
        return self.kv_ops_published, []

    def drain(self):
        events, self._events = self._events, []
        return events

    def publish(self, *events):
        self._events.extend(events)
        self.kv_ops_published = self.kv_ops_queued
        os.eventfd_write(self.wake_fd, 1)


@contextlib.asynccontextmanager
async def step_loop(cache=True, host=None, scheduling=Scheduling()):
    """A step loop over a FakeBatch; with `host` (a HostTier) stored prefixes of at
    least MIN_RESTORE_TOKENS tokens are restored."""
    budgets = Budgets(kv_cells_total=1000, kv_cells_per_session=1000, slots=SLOTS,
                      max_waiting=4, max_waiting_tokens=1000, step_tokens=64,
                      step_outputs=SLOTS, memory_bytes=1)
    admission = Admission(budgets, Placement(1000, PrefixCache(16) if cache else None,
                                             host, MIN_RESTORE_TOKENS), scheduling)
    wake_fd = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
    batch = FakeBatch(wake_fd)
    telemetry = Telemetry()
    tiers = Tiers(host, telemetry) if host is not None else None
    loop = StepLoop(batch, wake_fd, StepSettings(64, 16, 2.5, 2), admission, telemetry,
                    max_sessions=6, n_slots=SLOTS, workers_connected=lambda: {"w:1": False},
                    tiers=tiers)
    thread = EngineThread()
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(loop.run, thread)
            try:
                yield loop, admission, batch
            finally:
                loop.shutdown()
    finally:
        thread.join()


def admit(loop, admission, *prompts, priority=0):
    params = SamplingParams(max_tokens=4, speculation="off")
    first = 1 + max((s.id for s in admission.admitted), default=0)
    sessions = [Session(id=first + i, spec=SessionSpec(list(p), params,
                                                       requester=Requester("t", priority)))
                for i, p in enumerate(prompts)]
    admission.submit_group(sessions)
    channels = {s: trio.open_memory_channel(8) for s in sessions}
    loop.admit({s: Reply(s, send, lambda token: b"t%d " % token,
                         functools.partial(loop.end, s), credits=4)
                for s, (send, _) in channels.items()})
    return sessions, {s: recv for s, (_, recv) in channels.items()}


async def settle():
    for _ in range(20):
        await trio.sleep(0)


async def test_a_session_runs_from_start_to_its_finish_event():
    async with step_loop() as (loop, admission, batch):
        (session,), tokens = admit(loop, admission, range(10))
        await settle()
        assert batch.calls == [("start", session.slot, -1, 0)]
        batch.publish(Prefilled(session.slot, 0, 10), Sampled(session.slot, 42),
                      Sampled(session.slot, 43),
                      Finished(session.slot, FinishCode.FINISH_LENGTH, 0, kept=11))
        with trio.fail_after(5):
            got = [await tokens[session].receive() for _ in range(3)]
        assert [c.token_id for c in got[:2]] == [42, 43] and got[2].finish_reason == "length"
        assert "".join(c.text for c in got) == "t42 t43 "
        assert session.phase is Phase.FINISHED and admission.load().free_slots == SLOTS
        # the slot keeps the prompt and the token fed back: a prefix cache entry
        assert admission.placement.cache.cached_cells == 11


async def test_restoring_starts_reach_the_loop_one_between_two_steps():
    """Sessions restoring stored prefixes arrive together: each restoring start waits
    until the one before it has been applied, so a step waits for one restore at most."""
    host = HostTier(10**6)
    prompts = [list(range(100 * i, 100 * i + 60)) for i in (1, 2)]
    for p in prompts:
        host.put(Prefix(np.array(p[:50], dtype=np.int32), b"state"))
    async with step_loop(host=host) as (loop, admission, batch):
        sessions, _ = admit(loop, admission, *prompts)
        await settle()
        assert all(s.restore is not None and s.n_reused == 50 for s in sessions)
        assert [c[0] for c in batch.calls] == ["start"] and batch.restores == 1
        batch.publish()  # the loop applied the first restore and stepped
        await settle()
        assert [c[0] for c in batch.calls] == ["start", "start"] and batch.restores == 2


async def test_a_session_ended_before_its_start_is_fed_costs_no_engine_work():
    async with step_loop() as (loop, admission, batch):
        (session,), tokens = admit(loop, admission, range(10))
        loop.end(session, FinishReason.CANCELLED)  # before the feeder ran
        with trio.fail_after(5):
            end = await tokens[session].receive()
        assert end.finish_reason == "cancelled"
        await settle()
        # no start; the slot's sequence is emptied (it may hold an entry placement
        # counted as gone)
        assert batch.calls == [("evict", session.slot)]
        assert admission.load().free_slots == SLOTS and admission.load().active == 0


async def test_a_running_session_is_ended_through_the_loop():
    async with step_loop() as (loop, admission, batch):
        (session,), tokens = admit(loop, admission, range(10))
        await settle()
        loop.end(session, FinishReason.STOP)
        await settle()
        assert batch.calls[-1] == ("finish", session.slot, FinishReason.STOP.code)
        assert session.phase is Phase.PREFILL  # its slot is the loop's until the event
        batch.publish(Finished(session.slot, FinishCode.FINISH_CANCELLED))
        with trio.fail_after(5):
            end = await tokens[session].receive()
        assert end.finish_reason == "stop"  # the first reason wins
        assert session.phase is Phase.FINISHED


async def test_starts_follow_in_admission_order_and_queued_ones_start_on_a_finish():
    async with step_loop(cache=False) as (loop, admission, batch):
        sessions, tokens = admit(loop, admission, range(5), range(100, 105), range(200, 205))
        await settle()
        first, second, third = sessions
        assert batch.calls == [("start", first.slot, -1, 0), ("start", second.slot, -1, 0)]
        assert third.phase is Phase.WAITING
        batch.publish(Finished(first.slot, FinishCode.FINISH_LENGTH))
        await settle()
        assert batch.calls[-1] == ("start", first.slot, -1, 0) and third.slot == first.slot


async def test_a_lost_worker_ends_every_session_and_fails_the_node():
    async with step_loop() as (loop, admission, batch):
        sessions, tokens = admit(loop, admission, range(5), range(100, 105), range(200, 205))
        await settle()
        batch.publish(CallFailed(WORKER_LOST))
        await settle()
        assert admission.gate.failure is not None and "w:1" in admission.gate.failure
        assert all(s.finish_reason == "error" and "w:1" in s.error for s in sessions)
        waiting = sessions[2]
        assert waiting.phase is Phase.FINISHED  # queued: retired at once
        running = [s.slot for s in sessions[:2]]
        assert sorted(c[1] for c in batch.calls if c[0] == "finish") == sorted(running)


async def test_a_flush_returns_once_the_loop_published_the_evictions():
    async with step_loop() as (loop, admission, batch):
        (session,), tokens = admit(loop, admission, range(10))
        await settle()
        batch.publish(Prefilled(session.slot, 0, 10), Sampled(session.slot, 1),
                      Finished(session.slot, FinishCode.FINISH_LENGTH, 0, kept=10))
        await settle()
        assert admission.placement.cache.cached_cells == 10
        done = trio.Event()

        async def flush():
            await loop.flush_cache()
            done.set()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(flush)
            await settle()
            assert batch.calls[-1] == ("evict", session.slot) and not done.is_set()
            batch.publish()
            with trio.fail_after(5):
                await done.wait()
        assert admission.load().cached_cells == 0


def _step(index, decode_rows, prefill_rows, seconds, draft_rows=0, cells=40.0):
    return StepEnded(StepFigures(
        index=index, rows=decode_rows + draft_rows + prefill_rows, decode_rows=decode_rows,
        draft_rows=draft_rows, cells=cells, planned_tokens=0.0, planned_s=0.0,
        prefill_rows=prefill_rows, generated=decode_rows, calls=1, plan_s=0.0, decode_s=seconds,
        sample_s=0.0, update_s=0.0, total_s=seconds, ended_at=0.0))


async def test_the_steps_the_loop_runs_fit_the_model_that_bounds_prefill():
    """Every step's figures feed the step-time model; once it has seen decode-only
    steps and a step that prefilled, the loop hands the fit to the batch loop, with
    the decode steps' seconds by rows (steps that prefilled left out)."""
    async with step_loop() as (loop, admission, batch):
        (session,), _ = admit(loop, admission, range(40))
        await settle()
        for i in range(4):  # decode-only steps: 20 ms
            batch.publish(_step(i, 2, 0, 0.020))
        await settle()
        assert not [c for c in batch.calls if c[0] == "step_time"]
        batch.publish(Prefilled(session.slot, 0, 32), _step(4, 2, 32, 0.052))
        await settle()
        fits = [c[1:] for c in batch.calls if c[0] == "step_time"]
        assert fits and loop.step_time.report() is not None
        a, b, c, e = fits[-1]
        assert a + 2 * b == pytest.approx(0.020, rel=0.05)
        assert c == pytest.approx(0.001, rel=0.1) and e == 0.0
        row_times = [c[1] for c in batch.calls if c[0] == "row_times"]
        assert row_times[-1] == ((2, pytest.approx(0.020), 40.0),)


async def test_a_step_with_drafts_hands_its_row_times_over_at_once():
    """The speculation policy guesses the time of a row count no step ran lately;
    a step with drafts that ran it corrects the guess for the next plans, without
    waiting for the fit's next refit."""
    async with step_loop() as (loop, admission, batch):
        (session,), _ = admit(loop, admission, range(40))
        await settle()
        batch.publish(_step(0, 1, 0, 0.020), Prefilled(session.slot, 0, 32),
                      _step(1, 1, 32, 0.052))
        await settle()
        handed = len([c for c in batch.calls if c[0] == "row_times"])
        batch.publish(_step(2, 1, 0, 0.300, draft_rows=47))
        await settle()
        row_times = [c[1] for c in batch.calls if c[0] == "row_times"]
        assert len(row_times) == handed + 1
        assert (48, pytest.approx(0.300), 40.0) in row_times[-1]


async def test_a_step_that_times_its_rows_anew_hands_its_row_times_over_at_once():
    """The speculation policy drafts only beside a decode-only step timed at the
    sessions' contexts now: a step that times its count of rows at a new context (or
    for the first time) corrects the policy's times at once; one more of the same
    context waits for the next fit."""
    async with step_loop() as (loop, admission, batch):
        admit(loop, admission, range(40))
        await settle()

        def handed():
            return [c[1] for c in batch.calls if c[0] == "row_times"]

        batch.publish(_step(0, 4, 0, 0.060, cells=9000))
        await settle()
        assert handed()[-1] == ((4, pytest.approx(0.060), 9000.0),)
        batch.publish(_step(1, 4, 0, 0.060, cells=9100))
        await settle()
        assert len(handed()) == 1
        batch.publish(_step(2, 4, 0, 0.045, cells=1200))
        await settle()
        assert len(handed()) == 2 and handed()[-1] == ((4, pytest.approx(0.045), 1200.0),)


async def test_a_parked_session_gives_its_slot_up_and_resumes_from_what_it_generated():
    async with step_loop(scheduling=Scheduling("priority", max_parked=2)) as (
            loop, admission, batch):
        (low1, low2), tokens = admit(loop, admission, range(10), range(20, 30), priority=1)
        await settle()
        batch.publish(Prefilled(low1.slot, 0, 10), Sampled(low1.slot, 5),
                      Prefilled(low2.slot, 0, 10), Sampled(low2.slot, 6), Sampled(low2.slot, 7))
        with trio.fail_after(5):
            assert (await tokens[low2].receive()).token_id == 6
        await settle()
        (high,), _ = admit(loop, admission, range(40, 45), priority=0)
        await settle()
        slot, entry = low2.slot, low2.sampler_entry
        assert batch.calls[-1] == ("park", slot)
        assert high.phase is Phase.WAITING
        batch.publish(Finished(slot, FinishCode.FINISH_PARKED, 0, kept=11))
        await settle()
        assert low2.phase is Phase.PARKED and high.slot == slot
        assert batch.calls[-1][:2] == ("start", slot)
        batch.publish(Prefilled(slot, 0, 5), Sampled(slot, 9),
                      Finished(slot, FinishCode.FINISH_STOP, 0, kept=5))
        await settle()
        # it resumes from its prompt and both tokens, 2 to go, with its reader's credits
        # less the token it has not read; the session that took its slot cut its KV (no
        # host tier here to save it to): it computes them again
        start = batch.calls[-1]
        assert start[:4] == ("start", slot, -1, 0)
        assert start[4] == ("resume", entry, list(range(20, 30)) + [6, 7], 2, 3)
        assert low2.sampler_entry == entry and low2.phase is Phase.PREFILL
        batch.publish(Prefilled(slot, 0, 12), Sampled(slot, 8),
                      Finished(slot, FinishCode.FINISH_STOP, 0, kept=13))
        with trio.fail_after(5):
            got = [await tokens[low2].receive() for _ in range(3)]
        assert [c.token_id for c in got] == [7, 8, None] and got[-1].finish_reason == "stop"
        assert low2.generated == [6, 7, 8] and low2.parks == 1


async def test_a_session_cancelled_while_parked_leaves_and_its_sampler_state_is_freed():
    async with step_loop(scheduling=Scheduling("priority", max_parked=2)) as (
            loop, admission, batch):
        (low1, low2), tokens = admit(loop, admission, range(10), range(20, 30), priority=1)
        await settle()
        batch.publish(Sampled(low1.slot, 5), Sampled(low2.slot, 6))
        await settle()
        admit(loop, admission, range(40, 45), priority=0)
        await settle()
        slot, entry = low2.slot, low2.sampler_entry
        batch.publish(Finished(slot, FinishCode.FINISH_PARKED, 0, kept=10))
        await settle()
        loop.end(low2, FinishReason.CANCELLED)
        await settle()
        assert batch.calls[-1] == ("drop", entry) and low2 not in admission.admitted
        assert low2.phase is Phase.FINISHED and low2.sampler_entry is None


async def test_a_session_the_pool_cannot_place_is_parked_until_another_gives_its_kv_up():
    """Rows the KV pool found no cells for park their session (FINISH_PARKED with
    the code) rather than end it: it waits, ahead of newer arrivals, for a running
    session to leave, then resumes from what it generated."""
    async with step_loop(scheduling=Scheduling("priority", max_parked=2)) as (
            loop, admission, batch):
        (first, second), tokens = admit(loop, admission, range(10), range(20, 30))
        await settle()
        assert batch.park_when_full == {first.slot: True, second.slot: True}
        batch.publish(Sampled(first.slot, 5), Sampled(second.slot, 6))
        await settle()
        slot, entry = second.slot, second.sampler_entry
        (newer,), _ = admit(loop, admission, range(40, 45))
        batch.publish(Finished(slot, FinishCode.FINISH_PARKED, 1, kept=10))
        await settle()
        # the slot it left stays free: the pool had no cells for it, and nobody left
        assert second.phase is Phase.PARKED and newer.phase is Phase.WAITING
        assert admission.load().free_slots == 1
        registry = loop._telemetry.registry
        assert registry.get_sample_value("dgr_pool_full_parks_total") == 1
        assert registry.get_sample_value("dgr_parks_total") == 1
        batch.publish(Finished(first.slot, FinishCode.FINISH_STOP, 0, kept=11))
        await settle()
        starts = [c for c in batch.calls if c[0] == "start"][-2:]
        # it resumes first, then the newer session takes the other slot
        assert starts[0][4] == ("resume", entry, list(range(20, 30)) + [6], 3, 3)
        assert starts[1][:2] == ("start", newer.slot) and len(starts[1]) == 4
        assert second.phase is Phase.PREFILL and newer.phase is Phase.PREFILL


async def test_a_session_the_pool_cannot_place_ends_with_the_error_past_its_parks():
    async with step_loop(scheduling=Scheduling("priority", max_parked=2, max_parks=1)) as (
            loop, admission, batch):
        (first, second), tokens = admit(loop, admission, range(10), range(20, 30))
        await settle()
        batch.publish(Sampled(second.slot, 6), Finished(second.slot,
                                                        FinishCode.FINISH_PARKED, 1, kept=10))
        await settle()
        assert second.phase is Phase.PARKED  # first still runs: it waits for room
        batch.publish(Finished(first.slot, FinishCode.FINISH_STOP, 0, kept=10))
        await settle()
        assert second.phase is Phase.PREFILL
        assert batch.park_when_full[second.slot] is False  # parked max_parks times
        batch.publish(Finished(second.slot, FinishCode.FINISH_PARKED, 1, kept=10))
        await settle()
        assert second.finish_reason is FinishReason.ERROR and second not in admission.admitted
        with trio.fail_after(5):
            got = [await tokens[second].receive() for _ in range(2)]
        assert got[0].token_id == 6 and got[-1].finish_reason == "error"
