# The speculation policy: which decode rows carry drafts, and the acceptance records
# it learns from (dgr/_speculation.pyx). Pure C: no llama.cpp, no GIL.

from libc.stdint cimport int32_t, uint8_t

from dgr._codes cimport DRAFT_SOURCES_END, MAX_DRAFT, ROW_GROUPS
from dgr._drafts cimport ValueScratch
from dgr._ngram_store cimport NgramStore

cdef enum:
    # the classes of a draft's match by its length (_speculation.pyx, _match_class), by
    # which the node keeps its record of a source
    MATCH_CLASSES = 4

cdef struct Acceptance:
    # verified drafts, recent verifications weighing more: their tokens accepted, their
    # tokens, and the drafts not accepted whole (each stopped at a rejected token)
    double accepted
    double drafted
    double broken

cdef struct Drafting:
    # a session's speculation state, in its scheduler slot
    int mode                   # Speculation: may its decode rows carry drafts
    int n_draft                # draft rows planned for the current step
    int n_found                # draft tokens its sources gave for it (in draft)
    int source                 # DraftSource of those drafts
    int match_class            # the class of the match they follow (MATCH_CLASSES)
    double expected            # "auto": the tokens its planned drafts are expected to
                               # give (at its chance, before the node's trust), else 0
    int32_t draft[MAX_DRAFT]
    Acceptance record[DRAFT_SOURCES_END]  # its drafts' record, per DraftSource

cdef struct DraftRow:
    # a decode row, as the policy sees it
    Drafting * drafting
    const int32_t * context    # the session's tokens so far (prompt, then generated)
    int n_context
    int n_prompt               # the prompt's tokens, the first of them
    int limit                  # drafts its credits and max_tokens leave room for

cdef class Speculation:
    cdef readonly NgramStore store      # recent sessions' outputs, a draft source
    # per DraftSource and match class: the node's record
    cdef Acceptance by_source[DRAFT_SOURCES_END][MATCH_CLASSES]
    cdef int * found                    # per row of the current plan: draft tokens found
    cdef double * rate                  # per row: a draft token's chance to be accepted
                                        # once the ones before it were
    # the values source's vocabulary (Vocabulary.word_forms, held in word_forms; NULL
    # before set_word_forms), working memory, and draft
    cdef object word_forms
    cdef const uint8_t * kinds
    cdef const int32_t * twins
    cdef ValueScratch * values
    cdef int32_t values_out[MAX_DRAFT]
    # decode steps' seconds by output rows, measured (dgr.step_time.RowTimes), and
    # the KV cells their rows attended (< 0: not timed at the sessions' contexts)
    cdef int n_points
    cdef double point_rows[ROW_GROUPS]
    cdef double point_s[ROW_GROUPS]
    cdef double point_cells[ROW_GROUPS]
    # "auto" drafts verified, recent ones weighing more: tokens accepted, tokens
    # their chances expected (the trust: module doc)
    cdef double trust_accepted
    cdef double trust_expected
    # the last plan's expectation for its step ("auto" drafts given; else 0): tokens
    # (a draft's counted at its chance, before the trust) and seconds
    cdef readonly double planned_tokens
    cdef readonly double planned_s

    cdef double step_seconds(self, double rows, double row_s) noexcept nogil

    cdef double timed_at(self, int rows, double cells) noexcept nogil
    cdef void begin(self, Drafting * d, int mode) noexcept nogil
    cdef int plan(self, DraftRow * rows, int n_rows, int room, bint prefilling,
                  bint time_known, double time_b, double cells) noexcept nogil
    cdef int keep_repaid(self, DraftRow * rows, int n_rows, int n_draft_rows,
                         int n_always_rows, double trust, double row_s) noexcept nogil
    cdef void verified(self, Drafting * d, int accepted) noexcept nogil
    cdef void shadowed(self, Drafting * d, bint taken) noexcept nogil
    cdef void finished(self, const int32_t * tokens, int n_prompt, int n) noexcept nogil
