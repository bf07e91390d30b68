"""The node: the public API of one model served to many sessions.

    node.stream()/generate() -> admission (admit / queue / reject, at once)
                             -> the step loop (dgr/loop.py): a Cython batch loop
                                steps every running session without the GIL
    the step loop's pump     -> each token: detokenize, stop strings (dgr/reply.py)
                             -> the session's chunk channel (bounded) -> caller,
                                who hands a credit back per token taken

All tasks live in the node's nursery: leaving `open_node` cancels them, ends
every session with finish_reason "cancelled", stops the batch loop (cutting
a step in flight short through llama.cpp's abort flag) and joins the engine
thread.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import itertools
import random
import time
from typing import AsyncIterator, Optional, Sequence, Union

import attrs
import numpy as np
import trio

from dgr import _engine, capabilities
from dgr.adapters import AdapterTable, adapter_files
from dgr.admission import PREEMPTED_FROM_QUEUE, Admission, Budgets, Scheduling, parking_off
from dgr.config import NodeConfig
from dgr.chat import ChatRenderer
from dgr.engine import EngineThread, load_engine, python_yields
from dgr.errors import AdmissionRejected, GenerationFailed, InvalidRequest, NodeClosed
from dgr.kv_tier import MIN_RESTORE_TOKENS, HostTier
from dgr.kv_tiers import NodePrefixes, Tiers
from dgr.loop import StepLoop, StepSettings
from dgr.reasoning import ThinkingSwitch
from dgr.placement import Placement
from dgr.prefix_cache import PrefixCache, prefix_cache_off
from dgr.reply import PROGRESS_SLOTS, Reply
from dgr.rpc_stats import RpcLinks
from dgr.sequence import FinishReason, Session
from dgr.serving import ServingNode
from dgr.spec import Requester, SamplingParams, SessionSpec
from dgr.stream import GenerationResult, SessionStream
from dgr.telemetry import Telemetry
from dgr.tenants import Tenants, read_keys

log = logging.getLogger("dgr.node")
Prompt = Union[str, Sequence[int]]


def _no_credit() -> None:
    """A whole answer's reader hands back no credits: its session has them all."""


class Node(ServingNode):
    """A running generation node (dgr.serving.ServingNode). Get one with
    `open_node(config)`."""

    task = "generation"

    def __init__(self, config: NodeConfig, engine: _engine.Engine, budgets: Budgets,
                 nursery: trio.Nursery, row_probes: list[tuple[int, float]], chat: ChatRenderer):
        self.config = config
        self.budgets = budgets
        self.telemetry = Telemetry()
        self._engine = engine
        self._nursery = nursery
        self.prefix_cache_off = prefix_cache_off(config, engine.info)
        cache = (PrefixCache(min_follow=config.prefill_chunk)
                 if self.prefix_cache_off is None else None)
        # the KV tiers beyond the pool (dgr.kv_tiers): prefix cache entries leaving it
        self.tiers = (Tiers(HostTier(budgets.cache_ram_bytes), self.telemetry,
                            min_restore=MIN_RESTORE_TOKENS)
                      if cache is not None and budgets.cache_ram_bytes and not config.rpc_workers
                      else None)
        self.parking_off = parking_off(config.scheduling_policy, engine.info["memory"])
        tenants = Tenants(read_keys(config.api_keys).values() if config.api_keys else ())
        scheduling = Scheduling(config.scheduling_policy,
                                max_parked=0 if self.parking_off else config.max_running,
                                max_parks=config.max_parks, fair_drift=config.fair_drift)
        self._admission = Admission(budgets, Placement(
            budgets.kv_cells_total, cache, self.tiers.host if self.tiers else None,
            MIN_RESTORE_TOKENS), scheduling, tenants)
        settings = StepSettings(token_budget=budgets.step_tokens,
                                prefill_chunk=config.prefill_chunk,
                                decode_stall=config.decode_stall,
                                prefill_sessions=config.prefill_sessions_per_step)
        self._loop = StepLoop.for_engine(engine, settings, self._admission, self.telemetry,
                                         config.max_running + config.max_waiting, self.tiers)
        super().__init__(self._admission.gate, self._loop.departures)
        self.adapters = AdapterTable.for_node(
            self._loop.batch.adapters, engine.info, config,
            lambda: budgets.memory_bytes - engine.info["budgeted_bytes"] - self.adapters.nbytes)
        self._loop.adapters = self.adapters
        self.prefixes = NodePrefixes(self.tiers, self._loop, self._admission.placement, engine)
        self.telemetry.watch_adapters(self.adapters)
        # the steps timed as the engine opened: what a long draft costs before one ran
        self._loop.row_times.calibrate(row_probes)
        self._ids = itertools.count(1)
        self._closing = False
        self.telemetry.kv_cells_total.set(budgets.kv_cells_total)
        self.telemetry.watch(self._admission.load, lambda: self._loop.batch.cells_used,
                             budgets.kv_cells_total)
        self.telemetry.batch_token_budget.set(budgets.step_tokens)
        self.telemetry.tenants.watch(tenants.listed, self._sessions_by_state)
        self._chat = chat
        self.tool_format = self._chat.tool_format  # the template's (dgr.tool_formats)
        self._rpc_links = RpcLinks(config.rpc_workers) if config.rpc_workers else None
        self._rpc_at_start = {}  # the links' figures once loaded: the weights sent are not steps'
        if self._rpc_links is not None:
            self.telemetry.watch_rpc(self._rpc_links)
            self._rpc_at_start = self._rpc_links.figures()

    @property
    def steps(self):
        """The last steps the batch loop ran (StepRecord, up to dgr.events.STEP_HISTORY)."""
        return self._loop.steps

    # ------------------------------------------------------------------ public API

    @property
    def engine_info(self) -> dict:
        return dict(self._engine.info)

    def model_meta(self) -> dict:
        """What /v1/models says of the model."""
        info = self._engine.info
        return {"architecture": info["architecture"], "n_params": info["n_params"],
                "n_ctx_per_session": self.budgets.kv_cells_per_session, "n_vocab": info["n_vocab"]}

    @property
    def eog_tokens(self) -> list[int]:
        """The vocabulary's end-of-generation tokens."""
        return list(self.open_engine().eog_tokens)

    def open_engine(self):
        """The engine (its vocabulary; its model, for an embedding node beside it);
        NodeClosed once the node has shut down (the model is freed then)."""
        if not self._engine.is_open:
            raise NodeClosed("the node is shut down")
        return self._engine

    def _vocabulary(self):
        return self.open_engine()

    def chat_prompt(self, messages: list[dict], tools, add_generation_prompt: bool,
                    continue_final: bool, thinking: ThinkingSwitch) -> str:
        """The prompt of a chat (dgr.chat.ChatRenderer.prompt)."""
        self.open_engine()
        return self._chat.prompt(messages, tools, add_generation_prompt, continue_final,
                                 thinking)

    def chat_template(self) -> str | None:
        """The chat template prompts are rendered with (configured, or the model's)."""
        self.open_engine()
        return self._chat.source

    @contextlib.asynccontextmanager
    async def stream(self, prompt: Prompt, params: Optional[SamplingParams] = None,
                     whole: bool = False, progress: bool = False,
                     requester: Requester = Requester()) -> AsyncIterator[SessionStream]:
        """Admit a session and stream its chunks.

        Raises AdmissionRejected at once when admission refuses it. Leaving the
        block before the stream ends cancels the session: it gets no row after
        the step in flight, and its KV is freed before its slot is reused.

        `whole`: the caller wants the whole answer, not its pieces as they come
        (a non-streamed request): the chunks arrive together at the end, and
        the session never waits for its reader (dgr.reply). `progress`: a streamed
        session's chunks report its prompt's prefill as it goes (Chunk.progress;
        a report the reader has not made room for is dropped). `requester`: the
        tenant it counts against and its priority (dgr.admission's policy).
        """
        async with self.stream_group([prompt], params, whole=whole, progress=progress,
                                     requester=requester) as streams:
            yield streams[0]

    @contextlib.asynccontextmanager
    async def stream_group(self, prompts: list[Prompt], params: Optional[SamplingParams] = None,
                           n: int = 1, whole: bool = False, progress: bool = False,
                           requester: Requester = Requester()
                           ) -> AsyncIterator[list[SessionStream]]:
        """n sessions per prompt, admitted together or rejected together (one
        request's choices), streamed separately: choice i * n + j is sample j of
        prompt i. Samples of one prompt share its prefill: the first prefills, the
        others wait for it and take its KV. With a seed, sample j uses seed + j.
        `whole`, `progress` and `requester` as in `stream`."""
        if not prompts or n < 1:
            raise InvalidRequest("a group needs at least one prompt and n >= 1")
        params = params or SamplingParams()
        prompt_ids = [await self.tokenize_off_loop(p) if isinstance(p, str) else self._checked_ids(p)
                      for p in prompts]
        # an adapter the request names is loaded (if it is a known one) and kept until
        # its sessions hold it
        async with self.adapters.held(params.model, params.lora):
            sessions = []
            for ids in prompt_ids:
                first = None
                for j in range(n):
                    session = self._new_session(ids, params, requester, j, leader=first,
                                                progress=progress and not whole)
                    first = first or session
                    sessions.append(session)
            opened = await self._open_sessions(sessions, whole)
        try:
            yield [SessionStream(session, chunks, _no_credit if whole
                                 else functools.partial(self._loop.credit, session))
                   for session, chunks in opened]
        finally:
            for session, chunks in opened:
                self._loop.end(session, FinishReason.CANCELLED)
                chunks.close()

    def cancel(self, stream: SessionStream) -> None:
        """End a stream's session now, its block still open (its reader reads on to
        the final chunk): as leaving the block does."""
        self._loop.end(stream.session, FinishReason.CANCELLED)

    async def generate(self, prompt: Prompt, params: Optional[SamplingParams] = None,
                       requester: Requester = Requester()) -> GenerationResult:
        """Run a session to its end and return the whole result."""
        params = params or SamplingParams()
        async with self.stream(prompt, params, whole=True, requester=requester) as chunks:
            got = await chunks.read_all()
            if chunks.session.refused is not None:
                raise AdmissionRejected(chunks.session.refused, chunks.error)
            if chunks.finish_reason is FinishReason.ERROR:
                raise GenerationFailed(f"generation failed: {chunks.error}")
            tokens = [chunk for chunk in got if chunk.token_id is not None]
            return GenerationResult(
                text="".join(chunk.text for chunk in got),
                token_ids=[chunk.token_id for chunk in tokens],
                finish_reason=chunks.finish_reason, prompt_tokens=chunks.prompt_tokens,
                logprobs=[c.top_logprobs for c in tokens] if params.logprobs else None,
                token_logprobs=[c.logprob for c in tokens] if params.logprobs else None,
                cached_tokens=chunks.cached_tokens)

    def statistics(self) -> dict:
        """The node's bounds in use and in all: the admission queue, then the step
        loop's (StepLoop.statistics). Also under /capabilities' "bounds"."""
        load = self._admission.load()
        b = self.budgets
        return {"waiting_sessions": {"used": load.waiting, "capacity": b.max_waiting},
                "waiting_tokens": {"used": load.waiting_tokens,
                                   "capacity": b.max_waiting_tokens},
                "slots": {"used": b.slots - load.free_slots, "capacity": b.slots},
                "kv_cells_reserved": {"used": load.reserved_cells,
                                      "capacity": b.kv_cells_total},
                **self._admission.statistics(), **self._loop.statistics()}

    def router_load(self) -> dict:
        """The node's load as routers read it (dgr.doors.routers): plain figures,
        cheap enough for a poll a second (the capability report reads the metrics
        registry several times)."""
        load = self._admission.load()
        total = self.budgets.kv_cells_total
        used = self._loop.batch.cells_used
        prefilled = self.telemetry.step_totals.tokens["prefill"]
        return {"running": load.active, "waiting": load.waiting,
                "waiting_tokens": load.waiting_tokens, "kv_cells_used": used,
                "kv_cells_total": total, "kv_usage": used / total if total else 0.0,
                "prompt_tokens": self.telemetry.tokens_reused + prefilled,
                "prompt_tokens_cached": self.telemetry.tokens_reused,
                "decode_tokens_per_s": self.telemetry.recent_rates()["decode_tokens_per_s"]}

    def speculation_mode(self, requested: Optional[str] = None) -> str:
        """A session's speculation mode (NodeConfig.session_speculation), "off" where
        the model's KV cannot drop rejected drafts (engine info's max_draft 0: a
        recurrent state without llama.cpp's rollback)."""
        if not self._engine.info["max_draft"]:
            return "off"
        return self.config.session_speculation(requested)

    def slots(self) -> list[dict]:
        """Each slot's state as llama-server's GET /slots shows it: its context, whether
        it drafts and runs a session, and that session's token counts (never its text)."""
        speculative = self.speculation_mode() != "off"
        states = []
        for slot, session in enumerate(self._loop.slot_sessions()):
            state = {"id": slot, "n_ctx": self.budgets.kv_cells_per_session,
                     "speculative": speculative, "is_processing": session is not None}
            if session is not None:
                state |= {"id_task": session.id, "n_prompt_tokens": len(session.spec.prompt),
                          "n_prompt_tokens_processed": session.n_prefilled - session.n_reused,
                          "n_prompt_tokens_cache": session.n_reused,
                          "next_token": [{"has_next_token": not session.done,
                                          "n_remain": (session.spec.params.max_tokens
                                                       - len(session.generated)),
                                          "n_decoded": len(session.generated)}]}
            states.append(state)
        return states

    def report(self) -> dict:
        """The generation node's part of the capability report (dgr.capabilities)."""
        links = self._rpc_links.figures() if self._rpc_links is not None else {}
        steps = self.telemetry.step_totals.steps
        devices = capabilities.device_list(self._engine.info["devices"], links,
                                           self._rpc_at_start, self._engine.workers_connected(),
                                           steps)
        info, load, telemetry = self._engine.info, self._admission.load(), self.telemetry
        return {
            "model": capabilities.model_facts(info, self.budgets, self.tool_format.name),
            "engine": capabilities.engine_facts(info),
            "devices": devices,
            "budgets": capabilities.budget_facts(info, self.config, self.budgets,
                                                 self._loop.step_time.report()),
            "load": capabilities.live_load(load, self._loop.batch.cells_used, telemetry),
            # whether the patch stack's row-invariance covers the model's weight types
            # (dgr.kernel_coverage); `python -m dgr check-invariance` checks it on this CPU
            "invariance": info["invariance"],
            "speculation": capabilities.speculation_facts(self.speculation_mode(), info,
                                                          telemetry),
            "prefix_cache": capabilities.prefix_cache_facts(self.prefix_cache_off, load,
                                                            telemetry),
            "kv_tiers": capabilities.kv_tier_facts(
                self.tiers.report() if self.tiers is not None else None, telemetry),
            "adapters": self.adapters.facts(),
            "scheduling": capabilities.scheduling_facts(self._admission, self.parking_off,
                                                        telemetry),
        }

    async def flush_prefix_cache(self, tiers: Sequence[str] = ("pool", "host", "disk")) -> None:
        """Empty the named tiers of stored prefixes: "pool" evicts every cached
        prompt prefix (running sessions keep what they use; into the host tier
        when "host" is not flushed too), "host" and "disk" empty those tiers."""
        await self.prefixes.flush(tiers)

    async def export_prefix(self, token_ids: Sequence[int]) -> Optional[bytes]:
        """A blob (dgr.kv_tier's format) of the longest prefix of `token_ids` this
        node holds, in its pool's cache, host memory or on disk, whose tokens all
        begin `token_ids` (so it carries nothing of another conversation); None
        if it holds none. Another node with the same key imports it."""
        tokens = np.asarray(self._checked_ids(token_ids), dtype=np.int32)
        return await self.prefixes.export(tokens)

    async def import_prefix(self, blob: bytes) -> int:
        """A prefix blob (from export_prefix, here or on another node with the same
        key) into the host tier, to be used as any stored prefix; returns its token
        count. InvalidRequest if it is not one this node may restore (checksum,
        key, format, size)."""
        return await self.prefixes.import_blob(blob)

    async def kv_cells_in_use(self) -> int:
        """KV cells holding tokens after the batch loop's last published step
        (llama.cpp's count, taken between steps)."""
        await trio.lowlevel.checkpoint()
        return self._loop.batch.cells_used

    def _sessions_by_state(self) -> dict[str, list[Session]]:
        a = self._admission
        return {"running": a.running, "waiting": a.waiting, "parked": a.parked}

    @property
    def active_sessions(self) -> int:
        return len(self._admission.running)

    @property
    def waiting_sessions(self) -> int:
        return len(self._admission.waiting)

    @property
    def in_flight(self) -> int:
        """Sessions admitted that have not ended: running, waiting or parked."""
        return len(self._admission.admitted)

    # ------------------------------------------------------------------ sessions

    def _checked_ids(self, prompt: Sequence[int]) -> list[int]:
        """A prompt given as token ids, each within the vocabulary."""
        prompt_ids = [int(t) for t in prompt]
        if any(not 0 <= t < self._engine.n_vocab for t in prompt_ids):
            raise InvalidRequest(f"prompt token ids must be within 0..{self._engine.n_vocab - 1}")
        return prompt_ids

    def _new_session(self, prompt_ids: list[int], params: SamplingParams, requester: Requester,
                     sample: int = 0, leader: Optional[Session] = None,
                     progress: bool = False) -> Session:
        """Sample `sample` of a prompt, its params resolved for the node: its
        max_tokens and speculation mode, and its seed (the request's plus the
        sample's index, or a fresh one where it samples without one)."""
        if self._closing:
            raise NodeClosed("the node is shut down")
        if not prompt_ids:
            raise InvalidRequest("the prompt is empty")
        if params.grammar is not None:
            problem = self._engine.check_grammar(params.grammar)
            if problem is not None:
                raise InvalidRequest(f"invalid grammar: {problem}")
        if any(token >= self._engine.n_vocab for token, _ in params.logit_bias):
            raise InvalidRequest(f"logit_bias token ids must be within 0..{self._engine.n_vocab - 1}")
        if any(token >= self._engine.n_vocab for token in params.stop_token_ids):
            raise InvalidRequest(f"stop_token_ids must be within 0..{self._engine.n_vocab - 1}")
        seed = (params.seed + sample if params.seed is not None
                else random.getrandbits(32) if params.temperature > 0 else None)
        resolved = attrs.evolve(
            params, seed=seed, speculation=self.speculation_mode(params.speculation),
            max_tokens=self._admission.max_new_tokens(len(prompt_ids), params.max_tokens,
                                                      self.config.default_max_tokens))
        spec = SessionSpec(prompt=prompt_ids, params=resolved, reports_progress=progress,
                           adapters=self.adapters.resolve(params.model, params.lora),
                           requester=requester)
        return Session(id=next(self._ids), spec=spec, arrived_at=time.monotonic(), leader=leader)

    async def _open_sessions(self, sessions: list[Session], whole: bool):
        """Admit `sessions` together; returns (session, chunk channel) for each
        (`whole` as in `stream`).

        Admission's decisions reach the step loop in the order admission made them,
        with no checkpoint in between: a session placed to copy a cached prefix
        from a slot has its start queued before any later placement can give
        that slot to another session."""
        await trio.lowlevel.checkpoint_if_cancelled()  # a caller gone already costs no work
        if self.tiers is not None and self.tiers.disk is not None:
            for session in sessions:
                if session.leader is None and not session.spec.adapters:
                    _, n_pool = self._admission.placement.cache.match(session.prompt_array)
                    await self.tiers.prefetch(session.prompt_array, n_pool)
        opened, replies = [], {}
        for session in sessions:
            # The reader's credits bound the token chunks unread; the final one always fits
            # (a whole answer's chunks come as one list).
            # (A session that only scores its prompt has max_tokens 0, and a credit.)
            credits = max(session.spec.params.max_tokens, 1) if whole else self.config.reply_buffer
            room = credits + 1 + (PROGRESS_SLOTS if session.spec.reports_progress else 0)
            chunk_send, chunk_recv = trio.open_memory_channel(1 if whole else room)
            pieces = (self._engine.token_to_piece if session.spec.params.skip_special_tokens
                      else functools.partial(self._engine.token_to_piece, special=True))
            replies[session] = Reply(session, chunk_send, pieces,
                                     functools.partial(self._loop.end, session), credits, whole)
            opened.append((session, chunk_recv))
        self.adapters.acquire([session.spec for session in sessions])
        try:
            self._admission.submit_group(sessions)
        except AdmissionRejected as exc:
            for session in sessions:
                self.adapters.release(session.spec)
            self.telemetry.rejected.labels(exc.reason).inc()
            self.telemetry.tenants.refused(sessions[0].spec.requester, exc.reason)
            raise
        self.telemetry.admitted.inc(len(sessions))
        self._loop.admit(replies)
        for refused in self._admission.take_refused():
            self._loop.refuse(refused, PREEMPTED_FROM_QUEUE, "a session that outranks it took "
                              "its place in the full queue")
            self.telemetry.rejected.labels(PREEMPTED_FROM_QUEUE).inc()
            self.telemetry.tenants.refused(refused.spec.requester, PREEMPTED_FROM_QUEUE)
        return opened

    def _shutdown(self) -> None:
        """End every session as cancelled and stop the batch loop at once."""
        self._closing = True
        self.gate.start_draining()
        self._loop.shutdown()
        self._nursery.cancel_scope.cancel()


@contextlib.asynccontextmanager
async def open_node(config: NodeConfig) -> AsyncIterator[Node]:
    """Load the model, start the step loop, and yield the node.

    Leaving the block ends all sessions (finish_reason "cancelled"), stops the
    batch loop (a step in flight is aborted through llama.cpp's abort
    callback), joins the engine thread and frees the model. While it is open, the
    calling thread is scheduled SCHED_BATCH (NodeConfig.sched_batch)."""
    engine_thread = EngineThread()
    node = None
    try:
        with python_yields(config.sched_batch):
            engine, budgets, row_probes = await engine_thread.run(load_engine, config)
            try:
                chat = ChatRenderer(engine, config)  # a template that cannot render stops here
                async with trio.open_nursery() as nursery:
                    node = Node(config, engine, budgets, nursery, row_probes, chat)
                    for file in adapter_files(config):
                        await node.adapters.load(file.name, file.path, file.scale,
                                                 file.global_scale)
                    if node.tiers is not None and config.cache_dir is not None:
                        await node.prefixes.open_disk(config.cache_dir, config.cache_disk_bytes)
                        nursery.start_soon(node.tiers.run)
                    nursery.start_soon(node._loop.run, engine_thread)
                    try:
                        yield node
                    finally:
                        node._shutdown()
            finally:
                # the batch loop has returned (it ran in the nursery): the engine is idle
                if node is not None and node.tiers is not None and node.tiers.disk is not None \
                        and node._loop.stopped:
                    node.prefixes.persist()
                engine.close()
    finally:
        engine_thread.join()
