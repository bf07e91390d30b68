# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Engine.step: one checked batch through the engine's call, for tests and tools
(the node's batch loop calls Engine.run_call itself, dgr/_batch.pyx)."""

import numpy as np

cimport numpy as cnp
from libc.stdint cimport int8_t, int32_t

from dgr._codes cimport FAULT_RAISE, MAX_LOGPROBS, WANT_LOGPROBS, WANT_SAMPLE
from dgr._engine cimport Engine
from dgr._llama cimport llama_memory_seq_pos_max

from dgr.errors import DecodeError, InvalidBatch, decode_error

cnp.import_array()


def step(Engine engine, tokens, positions, seq_ids, want, int n_logprobs=0):
    """Decode one batch on `engine` and sample its output rows.

    tokens, positions, seq_ids: int32 arrays, one entry per row.
    want: int8 array; 0 = no output, WANT_SAMPLE = sample this row with the
    row's slot sampler, WANT_SAMPLE | WANT_LOGPROBS = also report the top
    `n_logprobs` log-probabilities (from the raw logits) and the sampled
    token's log-probability.

    Returns (sampled, top_ids, top_logprobs, sampled_logprobs): sampled is
    int32[n] with -1 for rows without output; the others are None unless
    n_logprobs > 0, then int32[n, k], float32[n, k] and float32[n].

    Each slot's rows must continue its KV: positions start at pos_max + 1
    and increase by one. On failure the KV memory is put back as it was
    before the step and a DecodeError subclass (or InvalidBatch) is raised.
    """
    engine.check_open()
    cdef const int32_t[::1] tok = np.ascontiguousarray(tokens, dtype=np.int32)
    cdef const int32_t[::1] pos = np.ascontiguousarray(positions, dtype=np.int32)
    cdef const int32_t[::1] seq = np.ascontiguousarray(seq_ids, dtype=np.int32)
    cdef const int8_t[::1] wnt = np.ascontiguousarray(want, dtype=np.int8)
    cdef int n = tok.shape[0]
    if pos.shape[0] != n or seq.shape[0] != n or wnt.shape[0] != n:
        raise InvalidBatch("tokens, positions, seq_ids and want must have the same length")
    if n == 0:
        raise InvalidBatch("empty batch")
    if n > engine.batch_capacity:
        raise InvalidBatch(f"{n} rows exceed n_batch={engine.batch_capacity}")
    if n_logprobs < 0 or n_logprobs > MAX_LOGPROBS:
        raise InvalidBatch(f"n_logprobs must be within 0..{MAX_LOGPROBS}")

    cdef int i, s
    cdef cnp.ndarray[int32_t, ndim=1] next_pos = np.full(engine.n_slots, -2, dtype=np.int32)
    cdef cnp.ndarray[int32_t, ndim=1] pos_before = np.full(engine.n_slots, -2, dtype=np.int32)
    for i in range(n):
        if tok[i] < 0 or tok[i] >= engine.vocab_size:
            raise InvalidBatch(f"row {i}: token id {tok[i]} out of vocabulary (n_vocab={engine.vocab_size})")
        s = seq[i]
        if s < 0 or s >= engine.n_slots:
            raise InvalidBatch(f"row {i}: sequence id {s} out of range 0..{engine.n_slots - 1}")
        if wnt[i] < 0 or wnt[i] > (WANT_SAMPLE | WANT_LOGPROBS):
            raise InvalidBatch(f"row {i}: want flag {wnt[i]} is not "
                               f"0..{WANT_SAMPLE | WANT_LOGPROBS}")
        if next_pos[s] == -2:
            pos_before[s] = llama_memory_seq_pos_max(engine.mem, s)
            next_pos[s] = pos_before[s] + 1
        if pos[i] != next_pos[s]:
            raise InvalidBatch(f"row {i}: sequence {s} position {pos[i]} does not continue its KV "
                               f"(expected {next_pos[s]})")
        next_pos[s] += 1

    cdef int k = n_logprobs
    cdef cnp.ndarray[int32_t, ndim=1] sampled = np.full(n, -1, dtype=np.int32)
    cdef cnp.ndarray[int32_t, ndim=2] top_ids = np.zeros((n, max(k, 1)), dtype=np.int32)
    cdef cnp.ndarray[float, ndim=2] top_lp = np.zeros((n, max(k, 1)), dtype=np.float32)
    cdef cnp.ndarray[float, ndim=1] sampled_lp = np.zeros(n, dtype=np.float32)
    cdef int rc
    cdef int bad_row = -1
    cdef double times[3]
    with nogil:
        rc = engine.run_call(n, &tok[0], &pos[0], &seq[0], &wnt[0], NULL, k,
                           <int32_t *> sampled.data, <float *> sampled_lp.data,
                           <int32_t *> top_ids.data, <float *> top_lp.data, &bad_row, times)

    if rc == FAULT_RAISE:
        raise RuntimeError("injected engine fault after llama_decode")
    if rc != 0:
        # llama.cpp keeps the ubatches it processed before an abort or a fatal
        # error; drop them so every slot is back where the step found it
        for s in range(engine.n_slots):
            if pos_before[s] != -2:
                engine.kv_keep(s, pos_before[s] + 1)
        raise decode_error(rc)
    if bad_row >= 0:
        raise DecodeError(f"no logits for output row {bad_row}")
    if k == 0:
        return sampled, None, None, None
    return sampled, top_ids, top_lp, sampled_lp
