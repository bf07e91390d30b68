# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The batch loop's slot table: each slot's session as the scheduler sees it (its
tokens, how far its prompt is prefilled, what it generated, its reader's credits,
a finish the node asked for, its speculation state), in C without the GIL. The
node's side starts a session in a free slot, credits it and asks it to finish; the
loop's side takes those finish requests and ends a slot (EV_FINISH, saying how much
of its KV stays). The step policy and the post-step update over the table are
dgr/_scheduler.pyx's (Scheduler extends SlotTable)."""

from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memset

from dgr._codes cimport (EV_FINISH, FINISH_ERROR, FINISH_NONE, FINISH_PARKED, MAX_DRAFT,
                         MAX_LOGPROBS)

from dgr.spec import SPECULATION_MODES


cdef class SlotTable:
    """n_slots slots over a vocabulary of n_vocab tokens, those of eog_tokens ending
    a session; with max_draft > 0 its sessions may speculate (a Speculation policy
    keeps their drafting state)."""

    def __cinit__(self):
        self.slots = NULL
        self.eog = NULL

    def __init__(self, int n_slots, int n_vocab, eog_tokens=(), int max_draft=0):
        self.n_slots = n_slots
        self.n_vocab = n_vocab
        self.slots = <Slot *> calloc(n_slots, sizeof(Slot))
        self.eog = <char *> calloc(n_vocab, 1)
        if self.slots == NULL or self.eog == NULL:
            raise MemoryError()
        self.max_draft = max(0, min(max_draft, MAX_DRAFT))
        self.speculation = Speculation(n_slots) if self.max_draft else None
        for t in eog_tokens:
            if 0 <= t < n_vocab:
                self.eog[t] = 1

    def __dealloc__(self):
        if self.slots != NULL:
            for s in range(self.n_slots):
                free(self.slots[s].tokens)
        free(self.slots)
        free(self.eog)

    # ------------------------------------------------------------ the node's side

    def start(self, int slot, spec, int credits=1, int n_reused=0, bint keep_kv=False,
              bint park_when_full=False):
        """Give a free slot the session its SessionSpec `spec` asks for (dgr.spec):
        prefill its prompt from position n_reused (the positions before it are in
        the slot's sequence: a shared prefix), then generate up to max_tokens,
        `credits` tokens ahead of its reader. With keep_kv its sequence keeps what
        it computed when it ends (but after an error): the finish event's `kept`
        positions. A session that scores its prompt reports each prompt token's
        log-probability (and prompt_logprobs alternatives) as EV_SCORE events,
        prefilling SCORE_CHUNK tokens a step from position 0, and may have
        max_tokens 0. With speculation on, its decode rows may carry drafts. With no
        credits (a resumed session whose reader has its tokens unread) it prefills
        all but its prompt's last row until it gets one. With park_when_full (never for
        one scoring its prompt: a resumed session scores none), rows llama.cpp finds
        no KV cells for (code 1, KV_MOVE_FAILED) park it (FINISH_PARKED with that
        code) instead of ending it."""
        params, prompt = spec.params, spec.prompt
        cdef int max_tokens = params.max_tokens, n_logprobs = params.logprobs
        cdef int prompt_logprobs = params.prompt_logprobs if spec.scores_prompt else -1
        cdef int speculate = SPECULATION_MODES[params.speculation]
        self._check(slot)
        if self.slots[slot].phase != SLOT_FREE:
            raise ValueError(f"slot {slot} is in use")
        cdef int n = len(prompt)
        if (n < 1 or max_tokens < (0 if prompt_logprobs >= 0 else 1) or credits < 0
                or not 0 <= n_logprobs <= MAX_LOGPROBS or prompt_logprobs > MAX_LOGPROBS):
            raise ValueError("a session needs a prompt, max_tokens >= 1 (0 when it scores its "
                             f"prompt), credits >= 0 and 0..{MAX_LOGPROBS} logprobs")
        if prompt_logprobs >= 0 and n_reused:
            raise ValueError("a session scoring its prompt computes all of it (n_reused 0)")
        if not 0 <= n_reused < n:
            raise ValueError(f"n_reused ({n_reused}) must lie before the prompt's last token")
        # room for what it generates: its drafts' context, the node's store
        cdef int32_t * copy = <int32_t *> malloc((<size_t> n + max_tokens) * sizeof(int32_t))
        if copy == NULL:
            raise MemoryError()
        for i in range(n):
            copy[i] = prompt[i]
        cdef Slot * sl = &self.slots[slot]
        sl.tokens = copy
        sl.n_prompt = n
        sl.n_prefilled = n_reused
        sl.n_generated = 0
        sl.max_tokens = max_tokens
        sl.last_token = -1
        sl.credits = credits
        sl.finish_requested = FINISH_NONE
        sl.n_logprobs = n_logprobs
        sl.ignore_eos = params.ignore_eos
        sl.keep_kv = keep_kv
        sl.park_when_full = park_when_full
        sl.prompt_logprobs = prompt_logprobs
        sl.order = self.next_order
        self.next_order += 1
        if self.speculation is not None:
            self.speculation.begin(&sl.drafting, speculate)
        else:
            memset(&sl.drafting, 0, sizeof(Drafting))  # SPECULATE_OFF: split KV never drafts
        sl.phase = SLOT_PREFILL

    def credit(self, int slot, int n=1):
        """The slot's reader took `n` tokens: it may be sent `n` more."""
        self._check(slot)
        if self.slots[slot].phase != SLOT_FREE:
            self.slots[slot].credits += n

    def request_finish(self, int slot, int reason):
        """End the slot before its next row (first request wins); True if this
        request is the one it ends by."""
        self._check(slot)
        if reason <= FINISH_NONE or reason > FINISH_PARKED:
            raise ValueError(f"not a finish reason code: {reason}")
        if self.slots[slot].phase != SLOT_FREE and self.slots[slot].finish_requested == FINISH_NONE:
            self.slots[slot].finish_requested = reason
            return True
        return False

    def slot_state(self, int slot):
        """(phase, n_prefilled, n_generated, credits) of a slot, for tests and diagnostics."""
        self._check(slot)
        cdef Slot * sl = &self.slots[slot]
        return sl.phase, sl.n_prefilled, sl.n_generated, sl.credits

    def _check(self, int slot):
        if not 0 <= slot < self.n_slots:
            raise ValueError(f"slot {slot} out of range 0..{self.n_slots - 1}")

    def planned_draft(self, int slot):
        """The draft tokens the last plan gave the slot's decode row."""
        self._check(slot)
        cdef Drafting * d = &self.slots[slot].drafting
        return [d.draft[i] for i in range(d.n_draft)]

    # ------------------------------------------------------------ the loop's side (nogil)

    cdef int take_finish_requests(self, Event * out) noexcept nogil:
        """End every slot the node asked to end; returns the events written."""
        cdef int s, n = 0
        for s in range(self.n_slots):
            if self.slots[s].phase != SLOT_FREE and self.slots[s].finish_requested != FINISH_NONE:
                n += self._finish(s, self.slots[s].finish_requested, 0, out + n)
        return n

    cdef int kv_valid(self, int s) noexcept nogil:
        """Positions [0, kv_valid) of slot s's sequence hold the KV of its tokens
        (the prompt, the generated tokens but the last); after a step, the rest
        (rejected drafts) are dropped."""
        return self.slots[s].n_prefilled + self.slots[s].n_generated - 1

    cdef int _finish(self, int s, int reason, int code, Event * out) noexcept nogil:
        cdef Slot * sl = &self.slots[s]
        out.kind = EV_FINISH
        out.slot = s
        out.reason = reason
        out.code = code
        # the KV that stays: the prompt as far as prefilled and the tokens fed back
        # (all generated but the last); nothing after an error
        out.kept = 0
        if sl.keep_kv and reason != FINISH_ERROR:
            out.kept = sl.n_prefilled + (sl.n_generated - 1 if sl.n_generated > 0 else 0)
        if self.speculation is not None and reason != FINISH_ERROR:
            self.speculation.finished(sl.tokens, sl.n_prompt, sl.n_prompt + sl.n_generated)
        free(sl.tokens)
        sl.tokens = NULL
        sl.phase = SLOT_FREE
        sl.finish_requested = FINISH_NONE
        return 1
