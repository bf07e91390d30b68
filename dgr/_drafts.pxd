# Draft tokens for exact speculative decoding, without a second model
# (dgr/_drafts.pyx). Pure C: no llama.cpp, no GIL, no Python objects.

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t

from dgr._codes cimport MAX_DRAFT, TWIN_TOKENS

cdef enum:
    # values_draft: the prompt's last tokens whose words it knows, a word's most tokens,
    # and the session's last tokens it reads (a list's objects repeat close by)
    VALUE_PROMPT_REACH = 8192
    VALUE_TOKENS_MAX = 8
    VALUE_REACH = 1024
    VALUE_BUCKETS = 16384      # a power of two, twice VALUE_PROMPT_REACH
    VALUE_FORMS = TWIN_TOKENS * VALUE_PROMPT_REACH   # a cell's form: its tokens, a twin's
    VALUE_CHAIN_MAX = 64       # cells of one bucket tried for a value
    VALUE = -1                 # "a value", in the session's tokens as read

cdef struct ValueScratch:
    # values_draft's working memory (~260 KiB), one per caller
    int n_cells
    int form_start[VALUE_PROMPT_REACH]   # per cell: where its form starts in forms
    int form_length[VALUE_PROMPT_REACH]  # its form's tokens
    int32_t forms[VALUE_FORMS]       # the cells as the session writes them
    int chain[VALUE_PROMPT_REACH]    # the next cell of its bucket, or -1
    int bucket[VALUE_BUCKETS]        # per bucket: its first cell, or -1
    int32_t read[VALUE_REACH]        # the session's tokens read, VALUE for each value
    int32_t drafted[MAX_DRAFT]       # the draft read

cdef int context_draft(const int32_t * tokens, int n, int max_draft, int32_t * out,
                       int * matched) noexcept nogil
cdef int structure_draft(const int32_t * tokens, int n, int max_draft, int32_t * out,
                         int * matched) noexcept nogil
cdef int values_draft(const int32_t * tokens, int n, int n_prompt, const uint8_t * kinds,
                      const int32_t * twins, ValueScratch * v, int max_draft, int32_t * out,
                      int * matched) noexcept nogil


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
