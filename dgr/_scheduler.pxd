# The batch loop's slot table, step policy and post-step update (dgr/_scheduler.pyx).
# Pure C data and functions: no llama.cpp, no GIL, no Python objects.

from libc.stdint cimport int32_t, int64_t

cdef enum:
    MAX_LOGPROBS = 20          # SamplingParams.logprobs is at most 20

cdef enum SlotPhase:
    SLOT_FREE = 0
    SLOT_PREFILL = 1
    SLOT_DECODE = 2

# dgr.sequence.FinishReason reads these through dgr._scheduler.FINISH_CODES.
cdef enum FinishCode:
    FINISH_NONE = 0
    FINISH_STOP = 1            # an end-of-generation token (or a stop string, seen by the node)
    FINISH_LENGTH = 2
    FINISH_CANCELLED = 3
    FINISH_ERROR = 4

# The error code of a row that llama.cpp gave no logits for.
cdef enum:
    NO_LOGITS = -1001

cdef enum EventKind:
    EV_DECODE = 1              # `slot` had a decode row in the step
    EV_PREFILL = 2             # `slot` prefilled prompt positions [start, end)
    EV_TOKEN = 3               # `slot` sampled `token` (logprob, top when it asked)
    EV_FINISH = 4              # `slot` ended with `reason` (`code`: llama_decode's); its KV is free
    EV_FAILURE = 5             # a llama_decode call of the step failed with `code`
    EV_STEP = 6                # the step ended; `step` holds its figures

cdef struct Slot:
    int phase
    int32_t * prompt
    int n_prompt
    int n_prefilled
    int n_generated
    int max_tokens
    int32_t last_token
    int credits                # tokens the session's reader can still take
    int finish_requested       # a FinishCode the node asked for (cancel, stop string)
    int n_logprobs
    bint ignore_eos
    int64_t order              # admission order: prefill goes oldest first

cdef struct StepFigures:
    int64_t index
    int rows
    int decode_rows
    int prefill_rows           # rows of chunks whose call succeeded
    int generated
    int calls
    double plan_s              # mailbox, finish requests, policy, batch fill
    double decode_s            # inside llama_decode
    double sample_s            # sampling and log-probabilities
    double update_s            # post-step update, KV release, publishing
    double total_s             # from the step's start to its events being published
    double ended_at            # CLOCK_MONOTONIC (= Python's time.monotonic())

cdef struct Event:
    int kind
    int slot
    int32_t token
    int start
    int end
    int reason
    int code
    float logprob
    int n_top
    int32_t top_ids[MAX_LOGPROBS]
    float top_lp[MAX_LOGPROBS]
    StepFigures step


cdef class Scheduler:
    cdef Slot * slots
    cdef readonly int n_slots
    cdef readonly int token_budget
    cdef readonly int prefill_chunk
    cdef readonly int prefill_sessions
    cdef readonly bint one_call     # a step's rows run in one llama_decode
    cdef char * eog                 # per vocabulary entry: ends generation
    cdef int n_vocab
    cdef int64_t next_order
    # The plan of the current step: decode rows first (ascending slot), then chunks.
    cdef int n_decode
    cdef int * decode_slots
    cdef int n_chunks
    cdef int * chunk_slot
    cdef int * chunk_start
    cdef int * chunk_end
    cdef int * order_buf

    cdef int max_step_events(self) noexcept nogil
    cdef int take_finish_requests(self, Event * out) noexcept nogil
    cdef int plan(self) noexcept nogil
    cdef int plan_rows(self) noexcept nogil
    cdef int chunk_offset(self, int c) noexcept nogil
    cdef int update(self, const int32_t * sampled, const int * call_rc, const float * chosen_lp,
                    const int32_t * top_ids, const float * top_lp, Event * out,
                    StepFigures * figures) noexcept nogil
    cdef int _failure(self, int code, Event * out) noexcept nogil
    cdef int _output(self, int s, int32_t token, float chosen_lp, const int32_t * top_ids,
                     const float * top_lp, Event * out) noexcept nogil
    cdef int _finish(self, int s, int reason, int code, Event * out) noexcept nogil


cdef tuple event_tuple(const Event * e)
