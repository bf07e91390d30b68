# The batch loop's slot table (dgr/_slots.pyx). Pure C data and functions: no
# llama.cpp, no GIL, no Python objects.

from libc.stdint cimport int32_t, int64_t

from dgr._events cimport Event
from dgr._speculation cimport Drafting, Speculation

cdef enum SlotPhase:
    SLOT_FREE = 0
    SLOT_PREFILL = 1
    SLOT_DECODE = 2

cdef struct Slot:
    int phase
    int32_t * tokens           # the prompt (n_prompt), then the tokens generated (n_generated)
    int n_prompt
    int n_prefilled
    int n_generated
    int max_tokens
    int32_t last_token
    int credits                # tokens the session's reader can still take
    int finish_requested       # a FinishCode the node asked for (cancel, stop string)
    int n_logprobs
    bint ignore_eos
    bint keep_kv               # its sequence keeps its KV when it ends (a prefix cache entry)
    bint park_when_full        # parked, not ended, when the KV pool cannot place its rows
    int prompt_logprobs        # -1, or it scores its prompt tokens (with this many alternatives)
    int64_t order              # admission order: prefill goes oldest first
    Drafting drafting          # its speculation state (dgr/_speculation.pyx)


cdef class SlotTable:
    cdef Slot * slots
    cdef readonly int n_slots
    cdef char * eog                 # per vocabulary entry: ends generation
    cdef int n_vocab
    cdef int64_t next_order
    cdef readonly int max_draft         # draft tokens a session may verify in one step
    cdef readonly Speculation speculation   # the drafts' policy (one_call only), else None

    cdef int take_finish_requests(self, Event * out) noexcept nogil
    cdef int kv_valid(self, int s) noexcept nogil
    cdef int _finish(self, int s, int reason, int code, Event * out) noexcept nogil
