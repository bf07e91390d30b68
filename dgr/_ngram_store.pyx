# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""`NgramStore`: the node's recent sessions' outputs (each with the prompt tokens
just before it), so sessions that write the same structure (the same JSON shape, a
templated answer) draft from each other, as suffix decoding does, by the drafts'
rule (dgr/_drafts.pyx): the longest match of NODE_NGRAM..MATCH_MAX tokens, the most
recent among equals, as far as the next as long agrees. A ring of RING_TOKENS
tokens; a hash table of TABLE_BUCKETS entries from each NODE_NGRAM tokens to where
they were last followed, and per ring token how far back its bucket was followed
before (a hash chain, as LZ77 compressors keep), walked for at most CHAIN_MAX
places: 4 MiB + 2 MiB + 4 MiB, the oldest overwritten first; a place whose n-gram
was overwritten or collided is checked against the ring and ignored. Where the
store holds many answers of one template, the place most recently followed is
often another user's words where this one's differ; the longest match, cut where
answers disagree, drafts fewer tokens that fail.
"""

from libc.stdint cimport uint64_t
from libc.stdlib cimport free, malloc

from dgr._codes cimport MAX_DRAFT
from dgr._drafts cimport MATCH_MAX, Places, _meet, _no_places

from dgr._drafts import _int32

cdef enum:
    NODE_NGRAM = 4
    RING_TOKENS = 1 << 20
    TABLE_BUCKETS = 1 << 18
    CHAIN_MAX = 64


cdef inline uint64_t _key(const int32_t * gram) noexcept nogil:
    cdef uint64_t h = 1469598103934665603ULL
    cdef int i
    for i in range(NODE_NGRAM):
        h = (h ^ <uint64_t> <uint32_t> gram[i]) * 1099511628211ULL
    return h ^ (h >> 29)


cdef class NgramStore:
    """Recent sessions' tokens and where each NODE_NGRAM of them was followed
    (module doc); bounded: RING_TOKENS tokens, TABLE_BUCKETS buckets."""

    def __cinit__(self):
        self.ring_size = RING_TOKENS
        self.table_size = TABLE_BUCKETS
        self.ring = <int32_t *> malloc(RING_TOKENS * sizeof(int32_t))
        self.chain = <uint32_t *> malloc(RING_TOKENS * sizeof(uint32_t))
        self.table = <int64_t *> malloc(TABLE_BUCKETS * sizeof(int64_t))
        if self.ring == NULL or self.chain == NULL or self.table == NULL:
            raise MemoryError()
        cdef int i
        for i in range(TABLE_BUCKETS):
            self.table[i] = -1
        self.written = 0

    def __dealloc__(self):
        free(self.ring)
        free(self.chain)
        free(self.table)

    cdef void add(self, const int32_t * tokens, int n_prompt, int n) noexcept nogil:
        """Append one session's output, tokens[n_prompt:n], with the NODE_NGRAM prompt
        tokens before it (then a separator), each NODE_NGRAM of them noted as
        followed by the next."""
        cdef int i
        cdef int64_t * bucket
        cdef int64_t before
        if n <= n_prompt:
            return
        if n_prompt > NODE_NGRAM:
            tokens += n_prompt - NODE_NGRAM
            n -= n_prompt - NODE_NGRAM
        for i in range(n):
            self.chain[self.written & (RING_TOKENS - 1)] = 0
            if i >= NODE_NGRAM:
                bucket = &self.table[_key(tokens + i - NODE_NGRAM) & (TABLE_BUCKETS - 1)]
                before = self.written - bucket[0]
                if bucket[0] >= 0 and before < RING_TOKENS:
                    self.chain[self.written & (RING_TOKENS - 1)] = <uint32_t> before
                bucket[0] = self.written
            self.ring[self.written & (RING_TOKENS - 1)] = tokens[i]
            self.written += 1
        self.chain[self.written & (RING_TOKENS - 1)] = 0
        self.ring[self.written & (RING_TOKENS - 1)] = -1
        self.written += 1

    cdef int match(self, int64_t at, const int32_t * tokens, int n) noexcept nogil:
        """How many tokens before ring index `at` (still in the ring) equal the last
        of tokens[:n], up to MATCH_MAX."""
        cdef int length = 0
        cdef int64_t oldest = self.written - RING_TOKENS + MAX_DRAFT
        while (length < MATCH_MAX and length < n and at - 1 - length >= oldest
               and self.ring[(at - 1 - length) & (RING_TOKENS - 1)] == tokens[n - 1 - length]):
            length += 1
        return length

    cdef int draft(self, const int32_t * tokens, int n, int max_draft, int32_t * out,
                   int * matched) noexcept nogil:
        """Up to max_draft tokens that followed the longest (then most recent) match
        of tokens[n - L:n] in the store, NODE_NGRAM <= L <= MATCH_MAX, into out, as
        far as the next match as long agrees; returns how many, L in `matched`."""
        cdef int count = 0, steps = 0
        cdef int64_t at
        cdef uint32_t before
        cdef int32_t token
        cdef Places places
        matched[0] = 0
        if n < NODE_NGRAM or max_draft <= 0:
            return 0
        _no_places(&places)
        at = self.table[_key(tokens + n - NODE_NGRAM) & (TABLE_BUCKETS - 1)]
        # each place further back is older: stop at one the ring no longer holds whole
        while (at >= NODE_NGRAM and steps < CHAIN_MAX
               and self.written - (at - NODE_NGRAM) <= RING_TOKENS - MAX_DRAFT):
            if _meet(&places, self.match(at, tokens, n), at):
                break
            before = self.chain[at & (RING_TOKENS - 1)]
            if before == 0:
                break
            at -= before
            steps += 1
        if places.length < NODE_NGRAM:
            return 0
        matched[0] = places.length
        while count < max_draft and places.best + count < self.written:
            token = self.ring[(places.best + count) & (RING_TOKENS - 1)]
            if token < 0 or (places.other >= 0 and token != self.ring[
                    (places.other + count) & (RING_TOKENS - 1)]):
                break
            out[count] = token
            count += 1
        return count

    # ------------------------------------------------------------ for tests

    def add_output(self, tokens, int n_prompt):
        """add() over a list of token ids (prompt, then output), for tests."""
        cdef int32_t[:] view = _int32(tokens)
        if len(tokens):
            self.add(&view[0], n_prompt, len(tokens))

    def draft_for(self, tokens, int max_draft=MAX_DRAFT):
        cdef int32_t out[MAX_DRAFT]
        cdef int32_t[:] view = _int32(tokens)
        cdef int matched
        if not len(tokens):
            return []
        cdef int n = self.draft(&view[0], len(tokens), min(max_draft, MAX_DRAFT), out, &matched)
        return [out[i] for i in range(n)]
