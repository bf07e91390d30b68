# The node's store of recent sessions' outputs, a draft source (dgr/_ngram_store.pyx).
# Pure C: no llama.cpp, no GIL, no Python objects.

from libc.stdint cimport int32_t, int64_t, uint32_t


cdef class NgramStore:
    cdef int32_t * ring             # recent sessions' tokens, -1 between two sessions
    cdef uint32_t * chain           # per ring token: how far back its n-gram's bucket
                                    # was followed before (0: not since the ring held it)
    cdef int64_t * table            # per bucket: absolute ring index after an n-gram, or -1
    cdef int64_t written            # tokens appended so far
    cdef readonly int ring_size
    cdef readonly int table_size

    cdef void add(self, const int32_t * tokens, int n_prompt, int n) noexcept nogil
    cdef int match(self, int64_t at, const int32_t * tokens, int n) noexcept nogil
    cdef int draft(self, const int32_t * tokens, int n, int max_draft, int32_t * out,
                   int * matched) noexcept nogil
