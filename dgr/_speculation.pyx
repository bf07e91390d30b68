# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The speculation policy (Policy 3 of dgr/_scheduler.pyx): which decode rows of a
step carry draft rows, and the acceptance records it decides by.

A speculating decoder's row may be followed by draft rows, tokens guessed from its
own context or the node's recent outputs (dgr/_drafts.pyx), which the step
verifies. "auto": a session's draft goes in as far as its rows pay: its j-th
row gives a token only if the rows before it were accepted, so at a share f of
the session's drafts accepted it is expected to give f^j tokens, and it goes in
while f^j T > b N for a step of N expected tokens and predicted time T, b the
model's time per decode row (a draft row is one more such row). A session that
has not drafted yet (f at its source's prior) tries a short draft; one whose
drafts are taken drafts long ones; one whose drafts fail stops drafting. Compute-bound steps (many decoders: T near b N) thus
draft nothing (b is at least the decode-only step's time over its rows plus one:
until steps with drafts tell a from b, a fit of one-decoder steps may not). f is
the session's record (recent verifications weighing more, fading while it does
not draft) beside its source's node-wide one, optimistic before there is any. A
session drafts at most MAX_DRAFT tokens, no more than its credits and max_tokens
leave room for (so drafts never take KV beyond its reservation); a step at most
MAX_STEP_DRAFTS; "auto" none before the step time is modelled. "always" drafts
all its sources give, within those bounds, whatever they cost.

The scheduler owns the slots and hands the policy each decode row's speculation
state (`Drafting`), context and limit; the policy alone changes that state (from a
session's start, `begin`) and the records; the scheduler reads the drafts to fill
and verify the rows.
"""

from libc.stdint cimport int32_t
from libc.stdlib cimport calloc, free
from libc.string cimport memset

from dgr._codes cimport (DRAFT_CONTEXT, DRAFT_NODE, MAX_STEP_DRAFTS, SPECULATE_ALWAYS,
                         SPECULATE_AUTO, SPECULATE_OFF)
from dgr._drafts cimport NgramStore, context_draft

cdef enum:
    PRIOR_WEIGHT = 2           # drafts a prior share counts as (a source's for a session)
# A source's share of drafts accepted before its record says otherwise: optimistic,
# so that an auto node tries drafts and measures them (a record is kept only of
# verified drafts)
cdef double SOURCE_PRIOR = 0.8

# per verifying step: how much a session's and the node's past acceptance still weighs
cdef double SLOT_FORGET = 0.7
cdef double SOURCE_FORGET = 0.99


cdef inline double _rate(Acceptance a, double prior) noexcept nogil:
    """The share of drafts accepted, beside PRIOR_WEIGHT drafts at `prior`."""
    return (a.accepted + PRIOR_WEIGHT * prior) / (a.drafted + PRIOR_WEIGHT)


cdef inline void _record(Acceptance * a, int k, int accepted, double forget) noexcept nogil:
    """k drafts verified, the first `accepted` of them taken (k = 0: the record
    only fades)."""
    a.accepted = forget * a.accepted + accepted
    a.drafted = forget * a.drafted + k


cdef class Speculation:
    """The policy and its records for up to `n_rows_max` decode rows a step (the
    scheduler's slots)."""

    def __cinit__(self):
        self.found = NULL
        self.rate = NULL

    def __init__(self, int n_rows_max):
        self.found = <int *> calloc(n_rows_max, sizeof(int))
        self.rate = <double *> calloc(n_rows_max, sizeof(double))
        if self.found == NULL or self.rate == NULL:
            raise MemoryError()
        self.store = NgramStore()

    def __dealloc__(self):
        free(self.found)
        free(self.rate)

    def acceptance(self):
        """Per draft source ("context", "node"): (accepted, tried), forgetting-weighted."""
        cdef Acceptance a
        out = {}
        for name, src in (("context", <int> DRAFT_CONTEXT), ("node", <int> DRAFT_NODE)):
            a = self.by_source[src]
            out[name] = (a.accepted, a.drafted)
        return out

    cdef void begin(self, Drafting * d, int mode) noexcept nogil:
        """A session starts in the slot of `d`, speculating by `mode` (a Speculation
        code), with no record yet."""
        memset(d, 0, sizeof(Drafting))
        d.mode = mode

    cdef int plan(self, DraftRow * rows, int n_rows, int room, bint time_known,
                  double time_a, double time_b) noexcept nogil:
        """Give the rows' sessions their drafts (the module doc), at most `room` draft
        rows in all; the step-time model a + b decode rows once `time_known`.
        Returns the draft rows given."""
        cdef int i, k, n_draft_rows = 0
        cdef double expected, seconds, decode_only, row_s, gain
        cdef Drafting * d
        for i in range(n_rows):
            d = rows[i].drafting
            d.n_draft = 0
            self.found[i] = 0
            if d.mode == SPECULATE_OFF or (d.mode == SPECULATE_AUTO and not time_known):
                continue
            k = min(MAX_DRAFT, rows[i].limit)
            if k <= 0:
                continue
            d.source = DRAFT_CONTEXT
            self.found[i] = context_draft(rows[i].context, rows[i].n_context, k, d.draft)
            if self.found[i] == 0:
                d.source = DRAFT_NODE
                self.found[i] = self.store.draft(rows[i].context, rows[i].n_context, k, d.draft)
            self.rate[i] = _rate(d.record, _rate(self.by_source[d.source], SOURCE_PRIOR))
        room = min(room, MAX_STEP_DRAFTS)
        for i in range(n_rows):
            d = rows[i].drafting
            if d.mode == SPECULATE_ALWAYS:
                d.n_draft = max(0, min(self.found[i], room - n_draft_rows))
                n_draft_rows += d.n_draft
        if not time_known:
            return n_draft_rows
        # auto: a session's draft rows go in while each one's expected tokens make
        # the step's expected tokens per second higher, with the ones before. A row
        # costs the model's b, but at least the decode-only step's time shared by one
        # row more: where every step had the same rows (one decoder, no drafts yet)
        # the fit cannot tell a from b, and drafting is what tells them apart.
        decode_only = time_a + time_b * n_rows
        if decode_only <= 0.0:
            return n_draft_rows
        row_s = max(time_b, decode_only / (n_rows + 1))
        expected = n_rows
        seconds = decode_only + row_s * n_draft_rows
        for i in range(n_rows):
            d = rows[i].drafting
            k = min(self.found[i], room - n_draft_rows)
            if d.mode != SPECULATE_AUTO:
                continue
            # the j-th draft row gives a token only if the j - 1 before it were accepted:
            # at a share f accepted, f^j tokens expected; rows go in while that beats
            # the step's tokens per second
            gain = self.rate[i]
            while d.n_draft < k and gain * seconds > row_s * expected:
                d.n_draft += 1
                expected += gain
                seconds += row_s
                gain *= self.rate[i]
            n_draft_rows += d.n_draft
        # a session's record fades while it does not draft, back to its source's
        # rates: what kept it from drafting is tried again
        for i in range(n_rows):
            d = rows[i].drafting
            if d.mode == SPECULATE_AUTO and self.found[i] and not d.n_draft:
                _record(&d.record, 0, 0, SLOT_FORGET)
        return n_draft_rows

    cdef void verified(self, Drafting * d, int accepted) noexcept nogil:
        """The step verified the session's d.n_draft drafts: the first `accepted` were."""
        _record(&d.record, d.n_draft, accepted, SLOT_FORGET)
        _record(&self.by_source[d.source], d.n_draft, accepted, SOURCE_FORGET)

    cdef void finished(self, const int32_t * tokens, int n_prompt, int n) noexcept nogil:
        """A session ended with `n` tokens, its prompt's first: its output joins the store."""
        self.store.add(tokens, n_prompt, n)
