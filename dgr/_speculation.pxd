# The speculation policy: which decode rows carry drafts, and the acceptance records
# it learns from (dgr/_speculation.pyx). Pure C: no llama.cpp, no GIL.

from libc.stdint cimport int32_t

from dgr._codes cimport MAX_DRAFT
from dgr._drafts cimport NgramStore

cdef struct Acceptance:
    # draft tokens accepted of those verified, recent verifications weighing more
    double accepted
    double drafted

cdef struct Drafting:
    # a session's speculation state, in its scheduler slot
    int mode                   # Speculation: may its decode rows carry drafts
    int n_draft                # draft rows planned for the current step
    int source                 # DraftSource of those drafts
    int32_t draft[MAX_DRAFT]
    Acceptance record          # its drafts' record

cdef struct DraftRow:
    # a decode row, as the policy sees it
    Drafting * drafting
    const int32_t * context    # the session's tokens so far (prompt, then generated)
    int n_context
    int limit                  # drafts its credits and max_tokens leave room for

cdef class Speculation:
    cdef readonly NgramStore store      # recent sessions' outputs, a draft source
    cdef Acceptance by_source[3]        # per DraftSource: the node's record
    cdef int * found                    # per row of the current plan: draft tokens found
    cdef double * rate                  # per row: the share of its drafts expected accepted

    cdef void begin(self, Drafting * d, int mode) noexcept nogil
    cdef int plan(self, DraftRow * rows, int n_rows, int room, bint time_known,
                  double time_a, double time_b) noexcept nogil
    cdef void verified(self, Drafting * d, int accepted) noexcept nogil
    cdef void finished(self, const int32_t * tokens, int n_prompt, int n) noexcept nogil
