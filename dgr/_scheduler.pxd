# The batch loop's step policy and post-step update over its slot table
# (dgr/_scheduler.pyx; the table: dgr/_slots.pyx). Pure C data and functions: no
# llama.cpp, no GIL, no Python objects.

from libc.stdint cimport int32_t, int64_t

from dgr._codes cimport (SPECULATE_ALWAYS, SPECULATE_OFF, EV_DECODE, EV_FAILURE, EV_FINISH,
                        EV_PREFILL, EV_SCORE, EV_STEP, EV_TOKEN, FINISH_CANCELLED, FINISH_ERROR,
                        FINISH_LENGTH, FINISH_NONE, FINISH_PARKED, FINISH_STOP,
                        KV_MOVE_FAILED, MAX_LOGPROBS, MAX_STEP_DRAFTS,
                        MAX_DRAFT, MIN_PIECE, NO_LOGITS, SCORE_CHUNK)
from dgr._events cimport Event, StepFigures
from dgr._slots cimport SLOT_DECODE, SLOT_FREE, SLOT_PREFILL, Slot, SlotTable
from dgr._speculation cimport Drafting, DraftRow, Speculation

cdef class Scheduler(SlotTable):
    cdef readonly int token_budget
    cdef readonly int prefill_chunk
    cdef readonly int prefill_sessions
    cdef readonly bint one_call     # a step's rows run in one llama_decode
    cdef readonly double decode_stall   # while sessions decode: a step's time / a decode-only one's
    cdef bint time_known                # set_step_time gave the model below
    cdef double time_a, time_b, time_c, time_e
    cdef int prefill_cap                # the prefill rows the current plan allows
    # The plan of the current step: decode rows first (ascending slot), then chunks.
    cdef int n_decode
    cdef int * decode_slots
    cdef int n_draft_rows               # draft rows after the decode rows they verify
    cdef double cells                   # KV cells the decode and draft rows attend (speculating)
    cdef DraftRow * draft_rows          # per decode row: what the speculation policy sees
    cdef int n_chunks
    cdef int * chunk_slot
    cdef int * chunk_start
    cdef int * chunk_end
    cdef int * order_buf
    cdef int * slot_rc                  # per slot: the code of its refused call of its
                                        # own (refuse), until the update reads it
    cdef int refused_rc                 # the first such code of the step (0: none)

    cdef int max_step_events(self) noexcept nogil
    cdef int plan(self) noexcept nogil
    cdef int decode_rows(self) noexcept nogil
    cdef int _rows_within_stall(self, int position) noexcept nogil
    cdef int plan_rows(self) noexcept nogil
    cdef int chunk_offset(self, int c) noexcept nogil
    cdef int update(self, const int32_t * sampled, const int * call_rc, const float * chosen_lp,
                    const int32_t * top_ids, const float * top_lp, Event * out,
                    StepFigures * figures) noexcept nogil
    cdef int _failure(self, int code, Event * out) noexcept nogil
    cdef void refuse(self, int s, int code) noexcept nogil
    cdef int _end_refused(self, int s, int code, Event * out) noexcept nogil
    cdef int fail(self, int s, int code, Event * out) noexcept nogil
    cdef int _output(self, int s, int32_t token, float chosen_lp, const int32_t * top_ids,
                     const float * top_lp, Event * out, StepFigures * figures) noexcept nogil
    cdef int _verify(self, int s, int row, const int32_t * sampled, const float * chosen_lp,
                     const int32_t * top_ids, const float * top_lp, Event * decoded,
                     Event * out, StepFigures * figures) noexcept nogil
    cdef int _scores(self, int c, const float * chosen_lp, const int32_t * top_ids,
                     const float * top_lp, Event * out) noexcept nogil
