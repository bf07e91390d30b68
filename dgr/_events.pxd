# The batch loop's events in C (dgr/_scheduler.pyx writes them, dgr/_batch.pyx
# publishes them) and their decoding into dgr.events' typed records.

from libc.stdint cimport int32_t, int64_t

from dgr._codes cimport MAX_LOGPROBS

cdef struct StepFigures:
    int64_t index
    int rows
    int decode_rows            # sessions with a decode row
    int draft_rows             # draft rows verified beside those
    double cells               # KV cells those rows attend in all, where speculating (else 0)
    double planned_tokens      # the speculation policy's expectation, when it gave
    double planned_s           # "auto" drafts (else 0): tokens, step seconds
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
    int kept                   # EV_FINISH: positions [0, kept) stay in its sequence
    int drafted                # EV_DECODE: draft rows verified, and how many were accepted
    int accepted
    int source                 # EV_DECODE: the drafts' DraftSource
    float logprob
    int n_top
    int32_t top_ids[MAX_LOGPROBS]
    float top_lp[MAX_LOGPROBS]
    StepFigures step

cdef object event_record(const Event * e)
