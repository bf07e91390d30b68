# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The embedding engine: a llama.cpp model and a context that outputs hidden states
rather than logits, for embedding and reranking models (dgr.embedding serves it).

`run` takes whole inputs packed one after another, each its own sequence from
position 0, and runs them in one llama_decode without the GIL. The context pools
nothing (pooling "none"): `run` returns every token's hidden state, and the caller
pools each input's rows itself, in an order that does not depend on what else was
in the call. A reranker's context pools as the model says ("rank": the first
token's state, llama.cpp's row selection, through its classifier head), and `run`
returns each input's scores. A token's state does not depend on the other inputs
in the call: attention sees only its own input (flash attention skips the others'
masked cells) and the matmuls are row-invariant (the patch stack).

An encoder (non-causal attention, no KV cache) computes a call in one ubatch, so
n_ubatch is the step's token budget; a decoder's call runs in ubatches of 512 tokens
and its cells are cleared after it.

Beside a generation engine (`beside`), the embedder borrows the engine's model (the
weights are loaded once) and takes the engine's model lock around each llama_decode,
so its calls and the batch loop's steps run one at a time, each with every thread.
Not thread-safe: one caller at a time, but for the vocabulary's read-only methods.
"""

import os
import time

import numpy as np

cimport numpy as cnp
from libc.stdint cimport int32_t
from libc.string cimport memcpy

from dgr._backend cimport clear_log, error_lines, init_backend
from dgr._engine cimport Engine
from dgr._llama cimport *
from dgr._pthread cimport pthread_mutex_lock, pthread_mutex_unlock
from dgr._vocab cimport Vocabulary

from dgr._backend import llama_log_text
from dgr.errors import ContextError, DecodeError, ModelLoadError
from dgr.gguf_file import POOLING, POOLING_NAMES, check_model_file, header
from dgr.llama_log import buffer_sizes, flash_attn

cnp.import_array()


cdef class Embedder(Vocabulary):
    """A model and its embedding context (see the module doc)."""

    cdef llama_context * ctx
    cdef llama_memory_t mem
    cdef llama_batch batch
    cdef int capacity
    cdef int max_inputs
    cdef int n_out
    cdef bint ranks
    cdef Engine beside              # whose model (and model lock) this borrows; None: its own
    cdef readonly dict info

    def __cinit__(self):
        self.model = NULL
        self.ctx = NULL
        self.batch.token = NULL

    def __init__(self, model_path, *, int step_tokens=4096, int max_inputs=64,
                 pooling=None, n_threads=None, Engine beside=None):
        """Load `model_path` (or, `beside` a generation engine, borrow its model) and make
        a context for calls of up to `step_tokens` tokens in `max_inputs` inputs.
        `pooling` (a POOLING name) overrides the model's."""
        init_backend()
        path = os.fspath(model_path)
        check_model_file(path)
        if step_tokens < 1 or max_inputs < 1:
            raise ContextError("step_tokens and max_inputs must be positive")
        if pooling is not None and pooling not in POOLING:
            raise ContextError(f"pooling must be one of {', '.join(POOLING)}, not {pooling!r}")
        cdef llama_model_params mparams = llama_model_default_params()
        mparams.n_gpu_layers = 0
        mparams.use_extra_bufts = False
        cdef bytes bpath = path.encode()
        cdef const char * cpath = bpath
        if beside is not None:
            beside.check_open()
            self.beside = beside
            self.model = beside.model
        else:
            clear_log()
            with nogil:
                self.model = llama_model_load_from_file(cpath, mparams)
        if self.model == NULL:
            raise ModelLoadError(f"cannot load model {path}: "
                                 f"{error_lines() or 'llama.cpp refused it'}")
        self.vocab = llama_model_get_vocab(self.model)
        self.vocab_size = llama_vocab_n_tokens(self.vocab)
        arch = self.meta("general.architecture") or ""
        declared = self.meta(f"{arch}.pooling_type")
        model_pooling = POOLING_NAMES.get(int(declared), "none") if declared else "none"
        chosen = pooling or model_pooling
        self.ranks = chosen == "rank"
        if self.ranks and not any(name.startswith("cls.") for name, _, _ in header(path)[1]):
            self._free()
            raise ContextError(f"{path} has no classifier head: it cannot rank (pooling rank)")
        causal = (self.meta(f"{arch}.attention.causal") or "true") != "false"

        cdef llama_context_params cparams = llama_context_default_params()
        cparams.n_ctx = step_tokens
        cparams.n_batch = step_tokens
        # an encoder's call is one ubatch; a decoder's is split into ubatches of 512 (its
        # KV keeps what earlier ones computed), which bounds the logits llama.cpp computes
        # for every token beside its state
        cparams.n_ubatch = min(step_tokens, 512) if causal else step_tokens
        cparams.n_seq_max = max_inputs
        cparams.kv_unified = True
        # sliding-window layers keep every cell (as the generation engine's unified pool):
        # a window's cells are never reused mid-call, so an input's cells stay in order
        cparams.swa_full = True
        cparams.flash_attn_type = LLAMA_FLASH_ATTN_TYPE_ENABLED
        cparams.embeddings = True
        cparams.pooling_type = POOLING["rank"] if self.ranks else POOLING["none"]
        threads = int(n_threads) if n_threads else (os.cpu_count() or 1)
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.no_perf = True
        clear_log()
        with nogil:
            self.ctx = llama_init_from_model(self.model, cparams)
        if self.ctx == NULL:
            message = error_lines() or "llama.cpp refused it"
            self._free()
            raise ContextError(f"cannot make an embedding context for {path}: {message}")
        context_log = llama_log_text()
        self.mem = llama_get_memory(self.ctx)
        self.capacity = step_tokens
        self.max_inputs = llama_n_seq_max(self.ctx)
        self.n_out = (llama_model_n_cls_out(self.model) if self.ranks
                      else llama_model_n_embd_out(self.model))
        self.batch = llama_batch_init(step_tokens, 0, 1)
        sizes = buffer_sizes(context_log)
        n_ctx_train = llama_model_n_ctx_train(self.model)
        self.info = {
            "path": path,
            "name": self.meta("general.name") or os.path.basename(path),
            "architecture": arch,
            "model_bytes": int(llama_model_size(self.model)),
            "shares_weights": beside is not None,
            "n_params": int(llama_model_n_params(self.model)),
            "n_vocab": self.vocab_size,
            "n_ctx_train": n_ctx_train,
            "n_embd": self.n_out if not self.ranks else llama_model_n_embd_out(self.model),
            "n_labels": self.n_out if self.ranks else 0,
            "pooling": chosen,
            "model_pooling": model_pooling,
            "causal": causal,
            # an input's longest: what a call holds, and an encoder's position table
            "max_input_tokens": min(step_tokens, n_ctx_train) if not causal else step_tokens,
            "step_tokens": step_tokens,
            "max_inputs": self.max_inputs,
            "n_threads": threads,
            "flash_attn": flash_attn(context_log),
            "kv_bytes": sizes["KV"],
            "compute_bytes": sizes["compute"],
            "output_bytes": sizes["output"],
        }

    def __dealloc__(self):
        self._free()

    def close(self):
        """Free the context and the model (unless borrowed) now, once tokenize calls on
        other threads have left the vocabulary."""
        while self.tokenizing:
            time.sleep(0.001)
        self._free()

    cdef void _free(self) noexcept:
        if self.batch.token != NULL:
            llama_batch_free(self.batch)
            self.batch.token = NULL
        if self.ctx != NULL:
            llama_free(self.ctx)
            self.ctx = NULL
        if self.model != NULL and self.beside is None:
            llama_model_free(self.model)
        self.model = NULL
        self.beside = None

    @property
    def is_open(self):
        return self.ctx != NULL

    def special_tokens(self):
        """(bos, eos or else sep, sep, add bos, add eos, add sep): what a rerank pair's
        tokens are joined with, as llama-server joins them."""
        self.check_open()
        eos = llama_vocab_eos(self.vocab)
        return (llama_vocab_bos(self.vocab), eos if eos >= 0 else llama_vocab_sep(self.vocab),
                llama_vocab_sep(self.vocab), llama_vocab_get_add_bos(self.vocab),
                llama_vocab_get_add_eos(self.vocab), llama_vocab_get_add_sep(self.vocab))

    def rerank_template(self):
        """The model's "rerank" template (its {query} and {document} filled in lay out a
        pair), or None."""
        self.check_open()
        cdef const char * tmpl = llama_model_chat_template(self.model, b"rerank")
        return None if tmpl == NULL else tmpl.decode("utf-8", "replace")

    def run(self, const int32_t[::1] tokens, const int32_t[::1] lengths):
        """Inputs of `lengths` tokens, one after another in `tokens`, in one call:
        every token's hidden state as a (tokens, n_embd) float32 array, or for a
        reranker each input's scores as (inputs, n_labels)."""
        self.check_open()
        cdef int n = tokens.shape[0], n_inputs = lengths.shape[0], i, j, row = 0, rc
        if n < 1 or n > self.capacity or n_inputs < 1 or n_inputs > self.max_inputs:
            raise DecodeError(f"a call holds 1..{self.capacity} tokens in 1..{self.max_inputs} "
                              f"inputs, not {n} in {n_inputs}")
        for i in range(n_inputs):
            if lengths[i] < 1:
                raise DecodeError("every input needs a token")
            for j in range(lengths[i]):
                if row >= n:
                    raise DecodeError("the lengths add up to more than the tokens")
                if not 0 <= tokens[row] < self.vocab_size:
                    raise DecodeError(f"token id {tokens[row]} is out of the vocabulary")
                self.batch.token[row] = tokens[row]
                self.batch.pos[row] = j
                self.batch.n_seq_id[row] = 1
                self.batch.seq_id[row][0] = i
                self.batch.logits[row] = 1
                row += 1
        if row != n:
            raise DecodeError("the lengths add up to fewer than the tokens")
        self.batch.n_tokens = n
        cdef cnp.ndarray[cnp.float32_t, ndim=2] out = np.empty(
            (n_inputs if self.ranks else n, self.n_out), dtype=np.float32)
        cdef float * dst = <float *> out.data
        cdef const float * src
        cdef bint missing = False
        cdef Engine beside = self.beside
        with nogil:
            if beside is not None:
                pthread_mutex_lock(&beside.model_lock)
            rc = llama_decode(self.ctx, self.batch)
            if beside is not None:
                pthread_mutex_unlock(&beside.model_lock)
            if rc == 0:
                for i in range(n_inputs if self.ranks else n):
                    src = (llama_get_embeddings_seq(self.ctx, i) if self.ranks
                           else llama_get_embeddings_ith(self.ctx, i))
                    if src == NULL:
                        missing = True
                        break
                    memcpy(dst + <size_t> i * self.n_out, src, self.n_out * sizeof(float))
            if self.mem != NULL:
                llama_memory_clear(self.mem, True)
        if rc != 0:
            raise DecodeError(f"llama_decode failed ({rc}): {error_lines() or 'no reason logged'}")
        if missing:
            raise DecodeError("llama.cpp gave no embeddings for the call")
        return out
