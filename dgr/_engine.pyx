# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The dgr engine: one llama.cpp model and context, one reusable llama_batch,
the KV operations on each sequence slot, and the slots' sampling (dgr._sampling);
its vocabulary side (tokenize, detokenize, chat template) is dgr._vocab.

`run_call` fills the batch from arrays, runs `llama_decode` and samples every
output row with that row's slot sampler, all without the GIL; the batch loop
(dgr._batch) calls it and the KV operations through dgr/_engine.pxd, and
dgr._step.step calls it from Python (for tests and tools). The engine knows
nothing of Trio, HTTP or scheduling policy, and it is not thread-safe: one
caller at a time (the node's batch loop), but for the vocabulary's read-only
methods. `close` waits for tokenize calls in flight on other threads.
"""

import os
import time

import numpy as np

cimport numpy as cnp
from libc.stdint cimport int8_t, int32_t, uint8_t, uint32_t
from libc.stdlib cimport calloc, free, malloc

from dgr._backend cimport clear_log, error_lines, init_backend
from dgr._clock cimport monotonic
from dgr._codes cimport (DECODE_ABORTED, ENGINE_FAULT, FAULT_RAISE, MAX_DRAFT, MAX_LOGPROBS,
                        NO_LOGITS, WANT_LOGPROBS, WANT_SAMPLE, WORKER_LOST)
from dgr._llama cimport *
from dgr._model_load cimport load_model
from dgr._pthread cimport (pthread_mutex_destroy, pthread_mutex_init, pthread_mutex_lock,
                          pthread_mutex_unlock)
from dgr._sampling cimport Sampling
from dgr._vocab cimport Vocabulary

from dgr._backend import llama_log_text, system_info  # system_info: also the engine's
from dgr.errors import (ContextError, DecodeAborted, DecodeError, FatalDecodeError,
                        InvalidBatch, KVSlotUnavailable, WorkerLost)
from dgr.gguf_file import check_model_file
from dgr.llama_log import buffer_sizes, flash_attn
from dgr._rpc import connected_check
from dgr.rpc_placement import device_report

cnp.import_array()

cdef extern from "dgr_abort.h" nogil:
    bint dgr_abort_callback(void * data) noexcept
    void dgr_set_flag(int * flag, int value) noexcept


cdef class Engine(Vocabulary):
    """A llama.cpp model and context serving up to `n_seq_max` sequences.

    Sequence ids are slots 0..n_seq_max-1. Each slot has its own sampler chain
    (see `set_sampling`) and its own KV cells (`release` frees them).
    """


    def __cinit__(self):
        pthread_mutex_init(&self.model_lock, NULL)
        self.model = NULL
        self.ctx = NULL
        self.row_logits = NULL
        self.batch.token = NULL
        self.n_slots = 0
        self.n_rpc = 0
        self.rpc_endpoints = NULL
        self.fault_step = self.fault_slot = -1

    def __init__(self, model_path, *, int n_ctx=4096, int n_seq_max=8, int n_batch=512,
                 int n_ubatch=512, n_threads=None, bint kv_unified=False,
                 bint weight_repack=False, repack=(), rpc_servers=(), int rpc_layers=-1,
                 rpc_split=(), double rpc_timeout_s=0.0, int state_rollback=0):
        """Load `model_path` and create a context.

        rpc_servers: "host:port" of ggml RPC servers (`python -m dgr worker`); the
        last rpc_layers layers (-1: an even share for this machine and each
        worker) are placed on them, split evenly or by rpc_split (one share per
        worker device), the rest stay here. A worker that closes its connection,
        or does not answer within rpc_timeout_s (0: no limit), fails the step it
        was in and every later one (WorkerLost, or WORKER_LOST from a BatchLoop
        call).

        kv_unified=True: one pool of n_ctx cells that any slot may fill, each
        slot's cells kept in position order (patch 0004, LLAMA_KV_CACHE_ORDERED)
        and sliding-window layers given a full-size cache, so that a sequence
        never wraps around; kv_unified=False gives every slot its own
        n_ctx / n_seq_max cells. With weight_repack=False the CPU backend uses
        the same matmul kernels for a 1-row and an n-row step, but for the weights
        whose names match a pattern of `repack` (dgr.weight_repack), placed in
        llama.cpp's CPU_REPACK buffer type. These keep a sequence's logits
        independent of the others (docs/design.md), with the flash attention the
        context asks for. state_rollback: snapshots of each sequence's recurrent
        state, for rolling rejected drafts back where llama.cpp can.
        """
        init_backend()
        path = os.fspath(model_path)
        self.model_path = path
        check_model_file(path)
        if n_seq_max < 1 or n_batch < 1 or n_ubatch < 1 or n_ctx < 1:
            raise ContextError("n_ctx, n_seq_max, n_batch and n_ubatch must be positive")

        placement, repacked_bytes = load_model(path, weight_repack, repack, rpc_servers,
                                               rpc_layers, rpc_split, rpc_timeout_s, &self.model)

        cdef llama_context_params cparams = llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_seq_max = n_seq_max
        cparams.n_rs_seq = max(0, state_rollback)
        cparams.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED
        cparams.n_batch = n_batch
        cparams.n_ubatch = min(n_ubatch, n_batch)
        threads = int(n_threads) if n_threads else (os.cpu_count() or 1)
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.kv_unified = kv_unified
        cparams.swa_full = kv_unified
        cparams.no_perf = True
        cparams.abort_callback = dgr_abort_callback
        cparams.abort_callback_data = &self.abort_flag
        clear_log()
        # read by the KV cache's constructor only; restored so that other contexts in
        # the process (llama_cpp.Llama) keep llama.cpp's default placement
        ordered_before = os.environ.get("LLAMA_KV_CACHE_ORDERED")
        os.environ["LLAMA_KV_CACHE_ORDERED"] = "1" if kv_unified else "0"
        try:
            with nogil:
                self.ctx = llama_init_from_model(self.model, cparams)
        finally:
            if ordered_before is None:
                del os.environ["LLAMA_KV_CACHE_ORDERED"]
            else:
                os.environ["LLAMA_KV_CACHE_ORDERED"] = ordered_before
        if self.ctx == NULL:
            raise ContextError(f"cannot create a context for {path} "
                               f"(n_ctx={n_ctx}, n_seq_max={n_seq_max}, n_batch={n_batch}): "
                               f"{error_lines() or 'llama.cpp refused it'}")
        context_log = llama_log_text()
        sizes = buffer_sizes(context_log)

        self.vocab = llama_model_get_vocab(self.model)
        self.mem = llama_get_memory(self.ctx)
        self.vocab_size = llama_vocab_n_tokens(self.vocab)
        self.n_slots = llama_n_seq_max(self.ctx)
        self.batch_capacity = llama_n_batch(self.ctx)
        self.batch = llama_batch_init(self.batch_capacity, 0, 1)
        self.row_logits = <const float **> calloc(self.batch_capacity, sizeof(float *))
        if self.row_logits == NULL:
            raise MemoryError()
        # rows are sampled on llama.cpp's threads: scratch per thread
        self.sampling = Sampling()
        self.sampling.setup(self.vocab, self.n_slots, threads)
        if placement is not None:
            self.rpc_connected = <rpc_connected_fn> <size_t> connected_check()
            self.rpc_names = [d["endpoint"].encode() for d in placement["devices"]]
            self.rpc_endpoints = <const char **> malloc(len(self.rpc_names) * sizeof(char *))
            if self.rpc_endpoints == NULL:
                raise MemoryError()
            for i, name in enumerate(self.rpc_names):
                self.rpc_endpoints[i] = <const char *> name
            self.n_rpc = len(self.rpc_names)

        n_ctx_total = llama_n_ctx(self.ctx)
        memory = ("hybrid" if llama_model_is_hybrid(self.model) else
                  "recurrent" if llama_model_is_recurrent(self.model) else "attention")
        rollback = llama_n_rs_seq(self.ctx)
        self.info = {
            "path": path,
            "name": self.meta("general.name") or os.path.basename(path),
            "architecture": self.meta("general.architecture") or "",
            "description": self._desc(),
            "model_bytes": int(llama_model_size(self.model)),
            "n_params": int(llama_model_n_params(self.model)),
            "n_vocab": self.vocab_size,
            "n_ctx_train": llama_model_n_ctx_train(self.model),
            "n_layer": llama_model_n_layer(self.model),
            "n_embd": llama_model_n_embd(self.model),
            "n_swa": llama_model_n_swa(self.model),
            "n_ctx": n_ctx_total,
            "n_ctx_seq": llama_n_ctx_seq(self.ctx),
            "n_seq_max": self.n_slots,
            "n_batch": self.batch_capacity,
            "n_ubatch": llama_n_ubatch(self.ctx),
            "n_threads": threads,
            "kv_unified": bool(kv_unified),
            "weight_repack": "all" if weight_repack else "invariant" if repack else "off",
            "repacked_bytes": repacked_bytes,
            "kv_bytes": sizes["KV"],
            "kv_bytes_per_cell": sizes["KV"] // max(1, n_ctx_total),
            "memory": memory,  # its context in attention KV, recurrent state or both
            "state_bytes": sizes["RS"],
            "state_rollback": rollback,  # 0 where the architecture cannot roll back
            # draft tokens a session may verify in a step: those its KV can drop again
            "max_draft": MAX_DRAFT if memory == "attention" else min(MAX_DRAFT, rollback),
            "flash_attn": flash_attn(context_log),
            "compute_bytes": sizes["compute"],
            "output_bytes": sizes["output"],
            "logits_bytes_per_output": self.vocab_size * 4,
            "devices": device_report(placement, llama_model_n_layer(self.model)),
        }

    def __dealloc__(self):
        self._free()
        pthread_mutex_destroy(&self.model_lock)

    def close(self):
        """Free the context and model now rather than at garbage collection, once
        tokenize calls on other threads have left the vocabulary."""
        while self.tokenizing:
            time.sleep(0.001)
        self._free()

    cdef void _free(self) noexcept:
        if self.sampling is not None:
            self.sampling.release()
        free(self.row_logits)
        self.row_logits = NULL
        free(self.rpc_endpoints)
        self.rpc_endpoints = NULL
        self.n_rpc = 0
        if self.batch.token != NULL:
            llama_batch_free(self.batch)
            self.batch.token = NULL
        if self.ctx != NULL:
            llama_free(self.ctx)
            self.ctx = NULL
        if self.model != NULL:
            llama_model_free(self.model)
            self.model = NULL

    @property
    def is_open(self):
        return self.ctx != NULL

    @property
    def n_seq_max(self):
        return self.n_slots

    @property
    def n_batch(self):
        return self.batch_capacity

    @property
    def eog_tokens(self):
        """The vocabulary's end-of-generation tokens."""
        return self.sampling.eog_tokens

    # ---------------------------------------------------------------- slots

    def _check_slot(self, int slot):
        if slot < 0 or slot >= self.n_slots:
            raise ValueError(f"sequence slot {slot} out of range 0..{self.n_slots - 1}")


    def set_sampling(self, int slot, params):
        """Give `slot` a fresh sampler chain for SamplingParams `params`
        (dgr._sampling.Sampling.configure)."""
        self._check_slot(slot)
        self.sampling.configure(slot, params)

    def check_grammar(self, grammar):
        """None if llama.cpp parses the GBNF `grammar` (root rule "root"), else the
        reason from its log."""
        clear_log()
        cdef bytes text = grammar.encode()
        cdef llama_sampler * parsed = llama_sampler_init_grammar(self.vocab, text, b"root")
        if parsed != NULL:
            llama_sampler_free(parsed)
            return None
        return error_lines() or "llama.cpp could not parse the grammar"


    def release(self, int slot):
        """Free every KV cell of `slot` and reset its sampler."""
        self.check_open()
        self._check_slot(slot)
        self.end_slot(slot, 0)

    def truncate(self, int slot, int keep):
        """The slot's sequence keeps positions [0, keep): whether llama.cpp could cut
        it there (a recurrent state rolls back only as far as its snapshots reach)."""
        self.check_open()
        self._check_slot(slot)
        return self.kv_keep(slot, keep)

    def pos_max(self, int slot):
        """Largest position held in KV for `slot`, -1 when it holds none."""
        self.check_open()
        self._check_slot(slot)
        return self.kv_pos_max(slot)

    def cells_used(self):
        """KV cells held by all slots."""
        self.check_open()
        return self.kv_cells()

    # ---------------------------------------------------------------- abort and faults

    def request_abort(self):
        """Make a running (or the next) llama_decode return 2 at its next graph node."""
        dgr_set_flag(&self.abort_flag, 1)

    def clear_abort(self):
        dgr_set_flag(&self.abort_flag, 0)

    def inject_fault(self, int after_steps, int code, int slot=-1):
        """Test hook: the step after `after_steps` more steps reports `code`; with a
        `slot`, every call from then on holding a row of the slot's does, until its
        KV is freed (as llama.cpp refuses a batch with a sequence whose KV is
        inconsistent). Codes 1 and -1 skip llama_decode (llama.cpp leaves memory
        unchanged for them); 2 and codes below -1 run it and then fail, leaving the
        processed cells behind as llama.cpp does; FAULT_RAISE runs it and then
        raises RuntimeError without reconciling, like a bug in the engine would."""
        self.fault_step = self.steps_done + after_steps
        self.fault_code = code
        self.fault_slot = slot

    # ---------------------------------------------------------------- step

    cdef int run_call(self, int n, const int32_t * tok, const int32_t * pos, const int32_t * seq,
                      const int8_t * want, const int32_t * next_tok, int k,
                      int32_t * out_ids, float * out_lp,
                      int32_t * out_top, float * out_top_lp, int * bad_row,
                      double * times) noexcept nogil:
        """One llama_decode over n rows, then every row with want != 0 sampled with
        its slot's sampler (and, with WANT_LOGPROBS, its top-k log-probabilities, k
        apart in out_top*; a WANT_SCORE row reports those of next_tok[i] instead of
        sampling). Returns llama_decode's code (or an injected fault's);
        a row without logits ends sampling with its index in bad_row. times:
        batch fill, decode and sampling seconds. Shared by dgr._step.step and BatchLoop."""
        cdef int i, rc, injected = 0
        cdef double t0 = monotonic(), t1, t2
        if self.fault_step >= 0 and self.fault_slot < 0 and self.steps_done == self.fault_step:
            injected = self.fault_code
            self.fault_step = -1
        elif self.fault_step >= 0 and self.fault_slot >= 0 and self.steps_done >= self.fault_step:
            for i in range(n):
                if seq[i] == self.fault_slot:
                    injected = self.fault_code
                    break
        self.steps_done += 1
        for i in range(n):
            self.batch.token[i] = tok[i]
            self.batch.pos[i] = pos[i]
            self.batch.n_seq_id[i] = 1
            self.batch.seq_id[i][0] = seq[i]
            self.batch.logits[i] = 1 if want[i] != 0 else 0
        self.batch.n_tokens = n
        t1 = monotonic()
        if injected == 1 or injected == -1:
            rc = injected
        else:
            pthread_mutex_lock(&self.model_lock)
            rc = llama_decode(self.ctx, self.batch)
            pthread_mutex_unlock(&self.model_lock)
            if rc == 0 and injected != 0:
                rc = injected
        if rc == 0:
            self._resolve_logits(n, want)
        if self.n_rpc and (rc == 0 or rc < -1) and self._worker_lost(rc != 0):
            rc = WORKER_LOST
        t2 = monotonic()
        if rc == 0:
            self.sampling.sample_rows(n, self.row_logits, seq, want, next_tok, k, out_ids, out_lp,
                                      out_top, out_top_lp, bad_row)
        times[0] = t1 - t0
        times[1] = t2 - t1
        times[2] = monotonic() - t2
        return rc

    def workers_connected(self):
        """{endpoint: whether its connection is up} for the RPC workers (patch 0005)."""
        return {name.decode(): bool(self.rpc_connected(self.rpc_endpoints[i]))
                for i, name in enumerate(self.rpc_names or [])}

    cdef void _resolve_logits(self, int n, const int8_t * want) noexcept nogil:
        """Each output row's logits, in row_logits (NULL for the others). One
        llama_get_logits, so the context is synchronized once a call, not once a
        row (with RPC workers each is a round trip to ggml's dispatcher thread):
        llama.cpp keeps the output rows in the batch's order."""
        cdef float * logits = llama_get_logits(self.ctx)
        cdef int i, j = 0
        for i in range(n):
            self.row_logits[i] = NULL
            if want[i] != 0:
                if logits != NULL:
                    self.row_logits[i] = logits + <size_t> j * self.vocab_size
                j += 1

    cdef bint _worker_lost(self, bint synchronize) noexcept nogil:
        """Whether an RPC worker was lost during (or before) the last llama_decode:
        its results are then not the model's. The decode's graph computes on the
        workers are asynchronous: every command of the step has settled once the
        context is synchronized (by _resolve_logits after a decode that succeeded)."""
        cdef int i
        if synchronize:
            llama_synchronize(self.ctx)
        for i in range(self.n_rpc):
            if not self.rpc_connected(self.rpc_endpoints[i]):
                return True
        return False

    # ---------------------------------------------------------------- KV operations

    cdef bint kv_keep(self, int slot, int keep) noexcept nogil:
        """The slot's sequence keeps positions [0, keep) and drops the rest; False
        where llama.cpp cannot (a recurrent state rolled back further than its
        snapshots reach), the sequence then unchanged."""
        return llama_memory_seq_rm(self.mem, slot, keep, -1)

    cdef void kv_copy(self, int src, int dst, int n) noexcept nogil:
        """Slot dst's sequence holds exactly src's positions [0, n): in a unified
        cache the cells are shared, not copied."""
        llama_memory_seq_rm(self.mem, dst, -1, -1)
        llama_memory_seq_cp(self.mem, src, dst, 0, n)

    cdef bint kv_holds(self, int slot, int n) noexcept nogil:
        """Whether the slot's sequence holds exactly positions 0..n-1."""
        return (llama_memory_seq_pos_min(self.mem, slot) == 0
                and llama_memory_seq_pos_max(self.mem, slot) == n - 1)

    cdef int kv_pos_max(self, int slot) noexcept nogil:
        return llama_memory_seq_pos_max(self.mem, slot)

    cdef int kv_cells(self) noexcept nogil:
        """KV cells held by all slots (each holds a contiguous range of positions)."""
        cdef int total = 0, slot, hi
        for slot in range(self.n_slots):
            hi = llama_memory_seq_pos_max(self.mem, slot)
            if hi >= 0:
                total += hi - llama_memory_seq_pos_min(self.mem, slot) + 1
        return total

    cdef void end_slot(self, int slot, int keep) noexcept nogil:
        """The slot's session ended: its sequence keeps positions [0, keep) (a
        prefix cache entry) and its sampler chain is reset."""
        llama_memory_seq_rm(self.mem, slot, keep, -1)
        self.sampling.reset(slot)
        if slot == self.fault_slot and keep == 0:
            self.fault_slot = self.fault_step = -1

    cdef size_t kv_state_size(self, int slot) noexcept nogil:
        """Bytes of the slot's sequence state (its KV cells and their positions)."""
        return llama_state_seq_get_size(self.ctx, slot)

    cdef size_t kv_save(self, int slot, uint8_t * dst, size_t size) noexcept nogil:
        """The slot's sequence state into dst (bytes written; 0 on failure). With
        ordered cells it holds every cell of the sequence, SWA layers included
        (patch 0010), so it restores the very sequence."""
        return llama_state_seq_get_data(self.ctx, dst, size, slot)

    cdef bint kv_restore(self, int slot, const uint8_t * src, size_t size) noexcept nogil:
        """The slot's sequence becomes the saved state `src` (what it held is dropped);
        False if llama.cpp refused it (the sequence then holds nothing)."""
        if llama_state_seq_set_data(self.ctx, src, size, slot) == 0:
            llama_memory_seq_rm(self.mem, slot, -1, -1)
            return False
        return True

    def save_slot(self, int slot):
        """The slot's sequence state as bytes; only while no batch loop steps this
        engine (at shutdown, in tests)."""
        self.check_open()
        self._check_slot(slot)
        cdef size_t size = self.kv_state_size(slot)
        cdef bytearray out = bytearray(size)
        cdef uint8_t * dst = <uint8_t *> (<char *> out)
        with nogil:
            size = self.kv_save(slot, dst, size)
        if size == 0:
            raise ContextError(f"llama.cpp could not save slot {slot}'s state")
        return bytes(out[:size])

    def restore_slot(self, int slot, const unsigned char[::1] state):
        """The slot's sequence becomes `state` (from save_slot); only while no batch
        loop steps this engine. False if llama.cpp refused it."""
        self.check_open()
        self._check_slot(slot)
        cdef bint ok
        with nogil:
            ok = self.kv_restore(slot, &state[0], state.shape[0])
        return ok

    def slot_positions(self, int slot):
        """(lowest, highest) KV position the slot's sequence holds ((-1, -1): none)."""
        self.check_open()
        self._check_slot(slot)
        return (llama_memory_seq_pos_min(self.mem, slot), llama_memory_seq_pos_max(self.mem, slot))
