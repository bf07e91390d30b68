"""An embedding node: embedding and reranking models served with bounded admission.

A node whose model is an encoder (non-causal attention: BERT and its kin), or that
is started with --embeddings (or --rerank), serves vectors rather than text, as
llama-server does with --embeddings. A generation model given --pooling alone serves
both: an embedding node beside its generation node, on the same loaded weights, whose
steps take turns with the batch loop's (dgr._embed: the engine's model lock). A
request is a list of inputs (token ids); each input is computed whole in one step,
and a step packs as many waiting inputs, oldest first, as its token budget and input
slots hold (dgr._embed.Embedder.run, one llama_decode on the engine thread). A step's
token states are pooled here, input by input, in an order that does not depend on
what shared the step, so a vector is bitwise the same whoever else the node serves.

Bounds (the generation node's reasons and HTTP statuses): an input longer than a
step holds, or than the model's position table, is `never_fits`; at most
max_running + max_waiting requests are in the node (`queue_full`); the tokens
waiting are bounded (`queue_tokens_full`); a draining node refuses (`draining`).
"""

from __future__ import annotations

import collections
import contextlib
import time
from typing import AsyncIterator, Optional, Sequence

import attrs
import numpy as np
import trio

from dgr import gguf_file, kernel_coverage
from dgr._backend import system_info
from dgr._embed import Embedder
from dgr.admission import Gate, check_queue
from dgr.config import NodeConfig
from dgr.embedding_telemetry import EmbeddingTelemetry
from dgr.engine import EngineThread, resolve_model_path
from dgr.errors import AdmissionRejected, BudgetError, DgrError, InvalidRequest, ModelLoadError
from dgr.pooling import pool
from dgr.serving import ServingNode

# inputs one request may carry (OpenAI's limit for /v1/embeddings)
MAX_INPUTS = 2048
# an embedding step's token budget, unless --ctx sets it: the model's context within
# these bounds. A step packs inputs only up to it: each input's attention is its own, but
# llama.cpp's attention mask spans the step's tokens squared, so a step of many thousand
# tokens costs more than its inputs one by one
STEP_TOKENS = (1024, 8192)
# the waiting tokens an embedding node holds at least: this many steps' worth
MIN_QUEUE_STEPS = 16


def _metadata(config: NodeConfig) -> tuple[dict, str]:
    """The model's GGUF metadata and architecture (ModelLoadError, saying why, for a
    file that is not there or not a GGUF model)."""
    path = resolve_model_path(config.model_path)
    gguf_file.check_model_file(path)
    try:
        metadata, _ = gguf_file.header(path)
    except ValueError as exc:
        raise ModelLoadError(f"cannot load model {path}: {exc}") from None
    return metadata, metadata.get("general.architecture", "")


def serves_embeddings(config: NodeConfig) -> bool:
    """Whether the node for `config` is an embedding node: --embeddings, --rerank, or
    a model without causal attention (an encoder, which cannot generate)."""
    if config.embeddings or config.rerank:
        return True
    metadata, arch = _metadata(config)
    return metadata.get(f"{arch}.attention.causal", True) is False


def load_embedder(config: NodeConfig, beside=None) -> Embedder:
    """The model in an embedding context sized by the config (blocking). Beside a
    generation node (dgr.node.Node), the context is on that node's model, its step is
    STEP_TOKENS[0] tokens, and it fits in what the node's budget leaves."""
    if beside is not None and config.rpc_workers:
        raise DgrError("embeddings beside generation run on this machine's weights alone, not "
                       "with --rpc workers' layers: serve them from a node of their own")
    metadata, arch = _metadata(config)
    trained = int(metadata.get(f"{arch}.context_length", STEP_TOKENS[0]))
    step_tokens = (STEP_TOKENS[0] if beside is not None else
                   config.n_ctx or min(max(trained, STEP_TOKENS[0]), STEP_TOKENS[1]))
    embedder = Embedder(resolve_model_path(config.model_path), step_tokens=step_tokens,
                        max_inputs=config.max_running,
                        pooling="rank" if config.rerank else config.pooling,
                        n_threads=config.n_threads,
                        beside=beside.open_engine() if beside is not None else None)
    info = embedder.info
    held, what = ((beside.engine_info["budgeted_bytes"], "the generation node")
                  if beside is not None else (info["model_bytes"], "weights"))
    need = held + info["kv_bytes"] + info["compute_bytes"] + info["output_bytes"]
    if need > config.memory_budget:
        embedder.close()
        raise BudgetError(f"{what} ({held}) + KV ({info['kv_bytes']}) + scratch "
                          f"({info['compute_bytes'] + info['output_bytes']}) = {need} bytes "
                          f"exceed the memory budget of {config.memory_budget} bytes; a smaller "
                          + ("--ctx or --cache-ram leaves more" if beside is not None else
                             "--ctx (the step's tokens) takes less"))
    return embedder


@attrs.define(eq=False)
class EmbedRequest:
    """One request's inputs and, as steps compute them, its outputs."""

    kind: str                      # "embedding" or "rerank"
    inputs: list[list[int]]
    outputs: list = attrs.Factory(list)
    left: int = 0                  # inputs not yet computed
    error: Optional[BaseException] = None
    done: trio.Event = attrs.Factory(trio.Event)
    queued_at: float = attrs.Factory(time.perf_counter)

    def __attrs_post_init__(self) -> None:
        self.outputs = [None] * len(self.inputs)
        self.left = len(self.inputs)


class EmbeddingNode(ServingNode):
    """A running embedding or reranking node (dgr.serving.ServingNode). Get one with
    `open_embedding_node(config)`."""

    def __init__(self, config: NodeConfig, embedder, thread: EngineThread,
                 invariance: Optional[dict] = None) -> None:
        """`invariance`: the coverage report of the generation node whose weights the
        embedder shares (the same kernels); by default this model's own."""
        self.config = config
        self._embedder = embedder
        self._thread = thread
        info = embedder.info
        # the pair layout of a reranker's inputs, if the model has one (rerank_inputs)
        self._rerank_template = embedder.rerank_template()
        self.pooling = info["pooling"]
        self.max_input_tokens = info["max_input_tokens"]
        self.step_tokens = info["step_tokens"]
        self.max_requests = config.max_running + config.max_waiting
        self.max_waiting_tokens = max(config.max_waiting_tokens,
                                      MIN_QUEUE_STEPS * self.step_tokens)
        self._queue: collections.deque = collections.deque()  # (request, index), oldest first
        self._waiting_tokens = 0
        self._requests: set[EmbedRequest] = set()
        self._wake = trio.Event()
        super().__init__(Gate(), trio.lowlevel.ParkingLot())  # unparked as a request leaves
        self.steps_done = 0
        self.telemetry = EmbeddingTelemetry(self)
        self.invariance = invariance or kernel_coverage.report(
            info["path"], frozenset(), info | {"weight_repack": "off", "memory": "attention"},
            system_info())

    # ------------------------------------------------------------------ facts

    @property
    def engine_info(self) -> dict:
        return dict(self._embedder.info)

    @property
    def task(self) -> str:
        """"rerank" for a reranker (pooling rank), else "embedding"."""
        return "rerank" if self.pooling == "rank" else "embedding"

    @property
    def waiting_sessions(self) -> int:
        """Requests admitted whose inputs are not all computed (each waits for its
        steps: nothing here runs between steps)."""
        return len(self._requests)

    in_flight = waiting_sessions

    def model_meta(self) -> dict:
        """What /v1/models says of the model."""
        info = self._embedder.info
        return {"architecture": info["architecture"], "n_params": info["n_params"],
                "n_vocab": info["n_vocab"], "n_ctx_train": info["n_ctx_train"],
                "task": self.task, "pooling": self.pooling, "n_embd": info["n_embd"],
                "max_input_tokens": self.max_input_tokens}

    def statistics(self) -> dict:
        """Each bound in use and in all."""
        return {"requests": {"used": len(self._requests), "capacity": self.max_requests},
                "waiting_tokens": {"used": self._waiting_tokens,
                                   "capacity": self.max_waiting_tokens},
                "waiting_inputs": {"used": len(self._queue), "capacity": None},
                "step_tokens": {"used": None, "capacity": self.step_tokens},
                "step_inputs": {"used": None, "capacity": self._embedder.info["max_inputs"]}}

    def report(self) -> dict:
        """The embedding node's part of the capability report (the generation node's
        shape, with the embedding model's task, pooling and dimension)."""
        info = self._embedder.info
        t = self.telemetry
        return {
            "model": {"name": info["name"], "path": info["path"],
                      "architecture": info["architecture"], "n_params": info["n_params"],
                      "model_bytes": info["model_bytes"], "n_vocab": info["n_vocab"],
                      "n_ctx_train": info["n_ctx_train"], "task": self.task,
                      "pooling": self.pooling, "model_pooling": info["model_pooling"],
                      "n_embd": info["n_embd"], "n_labels": info["n_labels"],
                      "causal_attention": info["causal"],
                      "shares_weights": info["shares_weights"]},
            "engine": {"n_threads": info["n_threads"], "flash_attn": info["flash_attn"],
                       "compute_bytes": info["compute_bytes"], "kv_bytes": info["kv_bytes"]},
            "budgets": {"max_input_tokens": self.max_input_tokens,
                        "step_tokens": self.step_tokens, "max_inputs_per_request": MAX_INPUTS,
                        "max_requests": self.max_requests,
                        "max_waiting_tokens": self.max_waiting_tokens},
            "load": {"requests": len(self._requests), "waiting_inputs": len(self._queue),
                     "steps": self.steps_done},
            "served": {kind: {what: int(t.registry.get_sample_value(
                f"dgr_embedding_{what}_total", {"kind": kind}) or 0)
                for what in ("inputs", "tokens")} for kind in ("embedding", "rerank")},
            # whether the patch stack's row-invariance covers the model's weight types and
            # architecture on this CPU (dgr.kernel_coverage), the pooling being dgr's
            "invariance": self.invariance,
        }

    # ------------------------------------------------------------------ vocabulary

    def _vocabulary(self):
        return self._embedder

    def rerank_inputs(self, query: str, documents: Sequence[str]) -> list[list[int]]:
        """Each (query, document) pair as one input, as llama-server lays it out: the
        model's "rerank" template with {query} and {document} filled in (special tokens
        parsed), or else [bos] query [eos] [sep] document [eos], each as the vocabulary
        adds them (blocking: it tokenizes)."""
        if self._rerank_template is not None:
            return [self.tokenize(self._rerank_template.replace("{query}", query)
                                  .replace("{document}", document),
                                  add_special=False, parse_special=True)
                    for document in documents]
        bos, eos, sep, add_bos, add_eos, add_sep = self._embedder.special_tokens()
        head = ([bos] if add_bos else []) + self.tokenize(query, add_special=False) + \
            ([eos] if add_eos else []) + ([sep] if add_sep else [])
        return [head + self.tokenize(document, add_special=False) + ([eos] if add_eos else [])
                for document in documents]

    # ------------------------------------------------------------------ requests

    async def embed(self, inputs: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Each input's vector (float32, n_embd) as the node pools; with pooling none,
        each input's token vectors (tokens x n_embd); for a reranker, each input's
        scores (n_labels)."""
        return await self._serve("rerank" if self.task == "rerank" else "embedding", inputs)

    async def _serve(self, kind: str, inputs: Sequence[Sequence[int]]) -> list[np.ndarray]:
        try:
            request = self._admit(kind, inputs)
        except AdmissionRejected as exc:
            self.telemetry.rejected.labels(exc.reason).inc()
            raise
        self.telemetry.admitted.inc()
        try:
            await request.done.wait()
        finally:
            if not request.done.is_set():  # cancelled: its inputs leave the queue
                self._forget(request)
                self.telemetry.answered(request, "cancelled")
        if request.error is not None:
            self.telemetry.answered(request, "error")
            raise request.error
        self.telemetry.answered(request, "ok")
        return request.outputs

    def _admit(self, kind: str, inputs: Sequence[Sequence[int]]) -> EmbedRequest:
        self.gate.check()
        if not inputs:
            raise InvalidRequest("a request needs at least one input")
        if len(inputs) > MAX_INPUTS:
            raise InvalidRequest(f"a request holds at most {MAX_INPUTS} inputs, "
                                 f"not {len(inputs)}")
        n_vocab = self._embedder.n_vocab
        checked = []
        for i, ids in enumerate(inputs):
            if not all(isinstance(t, (int, np.integer)) and not isinstance(t, bool)
                       for t in ids):
                raise InvalidRequest(f"input {i} must be token ids (integers)")
            ids = [int(t) for t in ids]
            if not ids:
                raise InvalidRequest(f"input {i} is empty")
            if any(not 0 <= t < n_vocab for t in ids):
                raise InvalidRequest(f"input {i} holds a token id outside the vocabulary "
                                     f"(0..{n_vocab - 1})")
            if len(ids) > self.max_input_tokens:
                raise AdmissionRejected(
                    "never_fits", f"input {i} is too large: {len(ids)} tokens; an input holds "
                    f"at most {self.max_input_tokens}",
                    {"n_prompt_tokens": len(ids), "n_ctx": self.max_input_tokens})
            checked.append(ids)
        tokens = sum(len(ids) for ids in checked)
        if tokens > self.max_waiting_tokens:
            raise AdmissionRejected(
                "never_fits", f"the request's {tokens} tokens exceed what may wait "
                f"({self.max_waiting_tokens})", {"n_prompt_tokens": tokens,
                                                 "n_ctx": self.max_waiting_tokens})
        check_queue("requests", len(self._requests), 1, self.max_requests,
                    self._waiting_tokens, tokens, self.max_waiting_tokens)
        request = EmbedRequest(kind, checked)
        self._requests.add(request)
        self._queue.extend((request, i) for i in range(len(checked)))
        self._waiting_tokens += tokens
        self._wake.set()
        return request

    def _forget(self, request: EmbedRequest) -> None:
        """A request that ends: its waiting inputs, if any (it ends early), leave the
        queue; a drain waiting for the node to empty wakes."""
        self._requests.discard(request)
        self._departures.unpark_all()
        if request.left == 0:  # all computed: none waits
            return
        kept = collections.deque()
        for item in self._queue:
            if item[0] is request:
                self._waiting_tokens -= len(request.inputs[item[1]])
            else:
                kept.append(item)
        self._queue = kept

    def _finish(self, request: EmbedRequest, error: Optional[BaseException] = None) -> None:
        if error is not None and request.error is None:
            request.error = error
        self._forget(request)
        request.done.set()

    # ------------------------------------------------------------------ the step loop

    def _pack(self) -> list[tuple[EmbedRequest, int]]:
        """The oldest waiting inputs that one step holds."""
        taken, tokens = [], 0
        max_inputs = self._embedder.info["max_inputs"]
        while self._queue and len(taken) < max_inputs:
            request, i = self._queue[0]
            n = len(request.inputs[i])
            if tokens + n > self.step_tokens:
                break
            self._queue.popleft()
            taken.append((request, i))
            tokens += n
        self._waiting_tokens -= tokens
        return taken

    async def run(self) -> None:
        """Steps while inputs wait, until the node closes."""
        while True:
            await self._wake.wait()
            taken = self._pack()
            if not taken:
                self._wake = trio.Event()
                continue
            await self._step(taken)

    async def _step(self, taken: list[tuple[EmbedRequest, int]]) -> None:
        """One call for `taken`; if llama.cpp refuses it, each request's inputs in a
        call of their own, so that only a request whose own inputs fail fails."""
        started = time.perf_counter()
        try:
            rows = await self._run_call(taken)
        except DgrError as exc:
            if len({request for request, _ in taken}) == 1:
                self._finish(taken[0][0], exc)
                return
            for request in {request: None for request, _ in taken}:
                await self._step([item for item in taken if item[0] is request])
            return
        self.telemetry.step_seconds.observe(time.perf_counter() - started)
        self._deliver(taken, rows)

    async def _run_call(self, taken: list[tuple[EmbedRequest, int]]) -> np.ndarray:
        inputs = [request.inputs[i] for request, i in taken]
        tokens = np.fromiter((t for ids in inputs for t in ids), dtype=np.int32)
        lengths = np.array([len(ids) for ids in inputs], dtype=np.int32)
        rows = await self._thread.run(self._embedder.run, tokens, lengths)
        self.steps_done += 1
        self.telemetry.steps.inc()
        return rows

    def _deliver(self, taken: list[tuple[EmbedRequest, int]], rows: np.ndarray) -> None:
        """Each input's output from the step's rows, pooled input by input."""
        offset = 0
        for k, (request, i) in enumerate(taken):
            n = len(request.inputs[i])
            if self.pooling == "rank":
                output = rows[k].copy()
            else:
                output = pool(rows[offset:offset + n], self.pooling)
                offset += n
            self.telemetry.inputs.labels(request.kind).inc()
            self.telemetry.tokens.labels(request.kind).inc(n)
            if request.done.is_set():
                continue
            request.outputs[i] = output
            request.left -= 1
            if request.left == 0:
                self._finish(request)

    # ------------------------------------------------------------------ lifetime

    def _shutdown(self) -> None:
        self.gate.start_draining()
        error = AdmissionRejected("draining", "the node shut down")
        for request in list(self._requests):
            self._finish(request, error)


@contextlib.asynccontextmanager
async def open_embedding_node(config: NodeConfig, beside=None) -> AsyncIterator[EmbeddingNode]:
    """Load the model in an embedding context (on the model of `beside`, a generation
    node, which must outlive it), start the step loop and yield the node. Leaving the
    block refuses the requests in the node, waits for a step in flight and frees the
    context (and the model it loaded)."""
    thread = EngineThread()
    try:
        embedder = await thread.run(load_embedder, config, beside)
        try:
            async with trio.open_nursery() as nursery:
                node = EmbeddingNode(config, embedder, thread,
                                     beside.engine_info["invariance"] if beside else None)
                nursery.start_soon(node.run)
                try:
                    yield node
                finally:
                    node._shutdown()
                    nursery.cancel_scope.cancel()
        finally:
            embedder.close()
    finally:
        thread.join()
