# Draft tokens for exact speculative decoding, without a second model
# (dgr/_drafts.pyx). Pure C: no llama.cpp, no GIL, no Python objects.

from libc.stdint cimport int32_t, int64_t, uint8_t, uint32_t

from dgr._codes cimport MAX_DRAFT, TWIN_TOKENS

cdef enum:
    # text repeats its phrases (a module's functions, a report's sentences): a match of
    # a few tokens is often in the wrong place, the longest one in the place being
    # quoted (llama.cpp's ngram-simple looks up the last 12 tokens)
    MATCH_MAX = 32
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


cdef struct Places:
    # the places where the session's last tokens occurred before, met most recent first
    int length          # how many tokens the best one matches
    int64_t best        # the longest, the most recent of those as long
    int64_t other       # the next one as long as the best, or -1


cdef inline void _no_places(Places * places) noexcept nogil:
    places.length = 0
    places.best = places.other = -1


cdef inline bint _meet(Places * places, int length, int64_t at) noexcept nogil:
    """The place `at` matches `length` tokens: it is the best if longer than the best
    so far, the other if as long and there is none yet. Returns whether the search
    is done (a best and an other of MATCH_MAX tokens: no older place changes the
    draft)."""
    if length > places.length:
        places.length, places.best, places.other = length, at, -1
    elif length == places.length and places.other < 0:
        places.other = at
        return length == MATCH_MAX
    return False
