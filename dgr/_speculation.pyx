# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The speculation policy (Policy 3 of dgr/_scheduler.pyx): which decode rows of a
step carry draft rows, and the acceptance records it decides by.

A speculating decoder's row may be followed by draft rows, tokens guessed from its
own context (dgr/_drafts.pyx) or the node's recent outputs (dgr/_ngram_store.pyx),
which the step verifies. "auto": a draft token is taken only if the ones before it were, so at a
chance p that a token is accepted once the ones before it were, the j-th draft
row is expected to give p^j tokens. Each session's draft gets the length that
gives the step the most expected tokens per second, the step's time taken from
the decode steps the node measured by their output rows (dgr.step_time.RowTimes:
each count up to 64 on its own; where none ran lately, the steps timed as the node
opened, at the level of those that did), linear between them and past them at the mean
cost of a row from the first to the last (at most the model's time per decode
row): a step's time is not linear in its rows on a CPU (here a second row costs
about a one-row step and a 17th about two fifths of one; beside 15 other
decoders a 17th row costs a quarter of the step, and multiples of four cost less
than the counts around them), so a short draft may cost more than it gives
where a long one pays.

Expected tokens are counted at the node's trust: the "auto" drafts' tokens
accepted over those expected, recent steps weighing more. Where many sessions
draft on noisy estimates of p, those that draft are the ones whose p is
overestimated, and their drafts give less than expected (at c = 16); the trust
takes that back into the next plans. What the trust cannot take back is a draft
whose edge is smaller than the plan's error (in a draft's tokens, or in the step's
time: a count of rows last timed beside longer contexts reads slow): the step pays
its rows for nothing. So a session drafts only where its draft raises the step's
expected tokens per second by GAIN_MARGIN at least.

A step's time grows with the KV cells its rows attend, and while every step drafts,
the step without drafts is not timed at the sessions' contexts: its count of rows,
last timed beside longer contexts, reads slow and credits every draft with an edge
it lacks. So "auto" drafts only where a step of the decode rows' count was timed at
about the cells they attend now (`timed_at`); else the step runs without drafts and
so times it. That costs one step's drafts each time the sessions' contexts grow by
an eighth (or 512 cells). Past ROW_EXACT decode rows no step drafts: those counts
are not timed one by one.

A draft that speeds its own session makes every other session of the step wait
for a longer step. A session that drafts too is repaid at once where its own
expected tokens (at the trust) come no later than from as many steps without
drafts; one that does not draft is repaid later, as the decode rows the drafting
sessions no longer need leave the steps to come. So beside other sessions a
plan's drafts are kept only while each drafting session's step is at most its
1 + expected tokens times the step without drafts, and, where some session does
not draft, the time the drafts add to the step is at most what their expected
tokens will save it, each a decode row's cost (the mean cost of a row from one
decoder to the step's): no session's next tokens are expected later for
another's drafts. A plan that fails it loses drafts, a drafting session's that
are not repaid at once (the fewest expected first), else those that give least
for their rows, until it holds. (Throughput alone is not enough: in a burst of
sessions started together, those that drafted finished early and the rest later
than with no drafts at all. Nor is the later repayment alone: two sessions
quoting their prompts drafted nothing beside each other where a second decode
row costs little.)

Compute-bound steps (many decoders: the step's time grows by its one-row share
with each row) thus draft nothing (a row costs
at least the decode-only step's time over its rows plus one: until steps with
drafts tell a from b, a fit of one-decoder steps may not), and no step drafts
while sessions wait to prefill: a draft row would take compute their prompts
need first.

p is estimated from the session's record of the draft's source beside the
node's record of that source for matches as long as the draft's (optimistic before
there is any; a session's sources differ: a JSON list's keys follow its earlier
objects, its values seldom its prompt): tokens accepted over tokens accepted plus
drafts broken (a draft's tokens after the one rejected were never tried), recent steps
weighing more. The node's record is kept per class of match length (`_match_class`):
a quote's match of 16 tokens or more is taken whole, a phrase natural text repeats
seldom past its 3-token match, and a session's first drafts, before its own record
says otherwise, go by as long matches before it. A step
where a draft was found but not verified records whether the token the session
sampled was the draft's first (a shadow check, free), so a session learns its
chance while it does not draft: one that starts quoting its context drafts, longer
as its drafts are taken whole, and one whose drafts would fail pays for none.

A session drafts at most MAX_DRAFT tokens, no more than its credits and
max_tokens leave room for (so drafts never take KV beyond its reservation); a
step at most MAX_STEP_DRAFTS; "auto" none before the step time is modelled.
"always" drafts all its sources give, within those bounds, whatever they cost.

The scheduler owns the slots and hands the policy each decode row's speculation
state (`Drafting`), context and limit; the policy alone changes that state (from a
session's start, `begin`) and the records; the scheduler reads the drafts to fill
and verify the rows.
"""

from libc.math cimport fabs
from libc.stdint cimport int32_t, uint8_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, memset

from dgr._codes cimport (DRAFT_CONTEXT, DRAFT_NODE, DRAFT_SOURCES_END, DRAFT_STRUCTURE,
                         DRAFT_VALUES, MAX_STEP_DRAFTS, ROW_EXACT, ROW_GROUPS, SPECULATE_ALWAYS,
                         SPECULATE_AUTO, SPECULATE_OFF, TWIN_TOKENS)
from dgr._codes import DraftSource
from dgr._drafts cimport ValueScratch, context_draft, structure_draft, values_draft
from dgr._ngram_store cimport NgramStore

import numpy as np

cdef enum:
    PRIOR_WEIGHT = 2           # verified tokens a prior chance counts as (a source's for
                               # a session)
# A source's chance that a draft token is accepted, before its record says otherwise:
# optimistic, so that an auto node tries drafts and measures them (a record is kept
# only of verified drafts)
cdef double SOURCE_PRIOR = 0.8

# The trust (the share of a draft's expected tokens it is counted at) is the auto
# drafts' accepted tokens over their expected ones, beside TRUST_WEIGHT expected
# tokens at TRUST_PRIOR; what was recorded before weighs TRUST_FORGET a step, so
# a trust lowered under one load comes back when drafts stop (and are tried again)
cdef double TRUST_PRIOR = 0.9
cdef double TRUST_WEIGHT = 8.0
cdef double TRUST_FORGET = 0.99

# the least share by which a session's draft must raise its step's expected tokens per
# second (the module doc)
cdef double GAIN_MARGIN = 0.05

# A step's time holds for steps of as many output rows whose rows attend a number of
# KV cells within CONTEXT_SLACK of it, or within CONTEXT_FLOOR cells (where a row
# attends few, its own cost dominates the attention's)
cdef double CONTEXT_SLACK = 0.125
cdef double CONTEXT_FLOOR = 512.0

# per verifying step: how much a session's and the node's past acceptance still weighs
# (a session's: about its last ten steps with a draft found)
cdef double SLOT_FORGET = 0.9
cdef double SOURCE_FORGET = 0.99


cdef inline bint _near(double cells, double timed_cells) noexcept nogil:
    """A step whose rows attend `cells` KV cells in all takes about the time of one
    of as many rows timed at `timed_cells` (< 0: not timed at any)."""
    return timed_cells >= 0.0 and fabs(cells - timed_cells) <= max(
        CONTEXT_FLOOR, CONTEXT_SLACK * max(cells, timed_cells))


def context_near(double cells, double timed_cells):
    """Whether a step whose rows attend `cells` KV cells in all takes about the time
    of one of as many rows timed at `timed_cells` (the module doc; < 0: not timed)."""
    return _near(cells, timed_cells)


cdef inline int _match_class(int matched) noexcept nogil:
    """The class of a draft's match of `matched` tokens (3 to the draft sources'
    MATCH_MAX): 3, 4-7, 8-15, 16 or more. A longer match is followed further:
    quoting matches 16 tokens or more; a phrase that natural text repeats, or a JSON
    list's keys, 3 to 7."""
    return (matched >= 4) + (matched >= 8) + (matched >= 16)


cdef inline double _rate(Acceptance a, double prior) noexcept nogil:
    """A draft token's chance to be accepted once the ones before it were: the
    tokens accepted over those accepted and the drafts broken, beside PRIOR_WEIGHT
    tokens at `prior`."""
    return (a.accepted + PRIOR_WEIGHT * prior) / (a.accepted + a.broken + PRIOR_WEIGHT)


cdef inline double _trust(double accepted, double expected) noexcept nogil:
    """The auto drafts' accepted tokens over their expected ones, beside TRUST_WEIGHT
    expected tokens at TRUST_PRIOR."""
    return (accepted + TRUST_WEIGHT * TRUST_PRIOR) / (expected + TRUST_WEIGHT)


cdef inline void _record(Acceptance * a, int k, int accepted, double forget) noexcept nogil:
    """A draft of k tokens verified, the first `accepted` of them taken; what was
    recorded before weighs `forget`."""
    a.accepted = forget * a.accepted + accepted
    a.drafted = forget * a.drafted + k
    a.broken = forget * a.broken + (accepted < k)


cdef class Speculation:
    """The policy and its records for up to `n_rows_max` decode rows a step (the
    scheduler's slots)."""

    def __cinit__(self):
        self.found = NULL
        self.rate = NULL
        self.values = NULL
        self.kinds = NULL
        self.twins = NULL

    def __init__(self, int n_rows_max):
        self.found = <int *> calloc(n_rows_max, sizeof(int))
        self.rate = <double *> calloc(n_rows_max, sizeof(double))
        self.values = <ValueScratch *> calloc(1, sizeof(ValueScratch))
        if self.found == NULL or self.rate == NULL or self.values == NULL:
            raise MemoryError()
        self.store = NgramStore()

    def __dealloc__(self):
        free(self.found)
        free(self.rate)
        free(self.values)

    def set_word_forms(self, kinds, twins):
        """The vocabulary's word forms (Vocabulary.word_forms: the arrays themselves,
        whose twins learn_words fills in place), which the values source reads;
        without them it drafts nothing."""
        if not (isinstance(kinds, np.ndarray) and kinds.dtype == np.uint8 and kinds.ndim == 1
                and isinstance(twins, np.ndarray) and twins.dtype == np.int32
                and twins.shape == (kinds.shape[0], 1 + TWIN_TOKENS)
                and kinds.flags.c_contiguous and twins.flags.c_contiguous):
            raise ValueError("word forms are Vocabulary.word_forms' arrays")
        cdef const uint8_t[::1] kinds_view = kinds
        cdef const int32_t[:, ::1] twins_view = twins
        self.word_forms = (kinds, twins)
        self.kinds = &kinds_view[0]
        self.twins = &twins_view[0, 0]

    def acceptance(self):
        """Per DraftSource: (accepted, tried), forgetting-weighted, its match classes'
        summed."""
        cdef int src, c
        totals = {}
        for src in range(DRAFT_CONTEXT, DRAFT_SOURCES_END):
            records = [self.by_source[src][c] for c in range(MATCH_CLASSES)]
            totals[DraftSource(src)] = (sum(r["accepted"] for r in records),
                                        sum(r["drafted"] for r in records))
        return totals

    def trust(self):
        """The share of an "auto" draft's expected tokens the next plan counts (the
        module doc)."""
        return _trust(self.trust_accepted, self.trust_expected)

    def set_row_times(self, points):
        """Decode steps' (mean output rows, mean seconds, mean KV cells their rows
        attended in all; < 0 where not timed at the sessions' contexts), fewest rows
        first (dgr.step_time.RowTimes.points), for the next plans."""
        cdef int i
        points = [(float(rows), float(seconds), float(cells)) for rows, seconds, cells in points]
        if len(points) > ROW_GROUPS:
            raise ValueError(f"at most {ROW_GROUPS} row times")
        if not all(rows >= 1.0 and seconds > 0.0 for rows, seconds, _ in points) or any(
                later[0] <= earlier[0] for earlier, later in zip(points, points[1:])):
            raise ValueError("row times need rows >= 1, in increasing order, and seconds > 0")
        for i in range(len(points)):
            self.point_rows[i], self.point_s[i], self.point_cells[i] = points[i]
        self.n_points = len(points)

    cdef double timed_at(self, int rows, double cells) noexcept nogil:
        """The seconds of steps of `rows` output rows timed with their rows attending
        about `cells` KV cells (the module doc), or 0 where none was (past ROW_EXACT
        rows, steps are timed in groups of several counts, not by their count)."""
        cdef int i
        if rows > ROW_EXACT:
            return 0.0
        for i in range(self.n_points):
            if self.point_rows[i] == rows:
                return self.point_s[i] if _near(cells, self.point_cells[i]) else 0.0
        return 0.0

    cdef double step_seconds(self, double rows, double row_s) noexcept nogil:
        """A decode step's seconds at `rows` output rows: linear between the measured
        points (the plan has one: `timed_at`); below them at row_s a row; past them
        at the mean cost of a row from the first point to the last, if less (a CPU's
        step grows by less with each row: guessed low, a longer draft is tried and
        measured)."""
        cdef int i, m = self.n_points
        cdef double slope
        if rows <= self.point_rows[0]:
            return max(self.point_s[0] + row_s * (rows - self.point_rows[0]),
                       self.point_s[0] * rows / self.point_rows[0])
        for i in range(1, self.n_points):
            if rows <= self.point_rows[i]:
                return self.point_s[i - 1] + (self.point_s[i] - self.point_s[i - 1]) * (
                    rows - self.point_rows[i - 1]) / (self.point_rows[i] - self.point_rows[i - 1])
        slope = row_s
        if m > 1 and self.point_s[m - 1] > self.point_s[0]:
            # the mean cost of a row from the first point to the last: at least a row's
            # cost past them where it falls with rows (concave), and steadier than a
            # slope between neighbouring groups, whose means may lie a row apart
            # (many decoders, few drafts) with noise in their times
            slope = min(row_s, (self.point_s[m - 1] - self.point_s[0])
                        / (self.point_rows[m - 1] - self.point_rows[0]))
        return self.point_s[m - 1] + slope * (rows - self.point_rows[m - 1])

    cdef void begin(self, Drafting * d, int mode) noexcept nogil:
        """A session starts in the slot of `d`, speculating by `mode` (a Speculation
        code), with no record yet."""
        memset(d, 0, sizeof(Drafting))
        d.mode = mode

    cdef int plan(self, DraftRow * rows, int n_rows, int room, bint prefilling,
                  bint time_known, double time_b, double cells) noexcept nogil:
        """Give the rows' sessions their drafts (the module doc), at most `room` draft
        rows in all; the step-time model's cost of a decode row once `time_known`; none
        by "auto" while sessions wait to prefill (`prefilling`: their prompts come
        first) or where the decode rows, attending `cells` KV cells in all, were not
        timed at their context (`timed_at`: the plan's decode-only step time). Returns
        the draft rows given."""
        cdef int i, j, k, n_draft_rows = 0, n_always_rows, found, matched, values_matched
        cdef double expected, trusted, decode_only, row_s, gain, p_j, rate, best, undrafted
        cdef Drafting * d
        cdef double trust
        self.planned_tokens = 0.0
        self.planned_s = 0.0
        self.trust_accepted *= TRUST_FORGET
        self.trust_expected *= TRUST_FORGET
        trust = _trust(self.trust_accepted, self.trust_expected)
        for i in range(n_rows):
            d = rows[i].drafting
            d.n_draft = 0
            d.n_found = 0
            d.expected = 0.0
            self.found[i] = 0
            if d.mode == SPECULATE_OFF or (d.mode == SPECULATE_AUTO and not time_known):
                continue
            k = min(MAX_DRAFT, rows[i].limit)
            if k <= 0:
                continue
            d.source = DRAFT_CONTEXT
            self.found[i] = context_draft(rows[i].context, rows[i].n_context, k, d.draft,
                                          &matched)
            if self.kinds != NULL:
                # the prompt's values in the session's words, where as well matched
                found = values_draft(rows[i].context, rows[i].n_context, rows[i].n_prompt,
                                     self.kinds, self.twins, self.values, k, self.values_out,
                                     &values_matched)
                if found > 0 and values_matched >= matched:
                    d.source = DRAFT_VALUES
                    memcpy(d.draft, self.values_out, found * sizeof(int32_t))
                    self.found[i] = found
                    matched = values_matched
            if self.found[i] == 0:
                d.source = DRAFT_NODE
                self.found[i] = self.store.draft(rows[i].context, rows[i].n_context, k, d.draft,
                                                 &matched)
            if self.found[i] == 0:
                d.source = DRAFT_STRUCTURE
                self.found[i] = structure_draft(rows[i].context, rows[i].n_context, k, d.draft,
                                                &matched)
            d.n_found = self.found[i]
            d.match_class = _match_class(matched)
            self.rate[i] = _rate(d.record[d.source],
                                 _rate(self.by_source[d.source][d.match_class], SOURCE_PRIOR))
        room = min(room, MAX_STEP_DRAFTS)
        for i in range(n_rows):
            d = rows[i].drafting
            if d.mode == SPECULATE_ALWAYS:
                d.n_draft = max(0, min(self.found[i], room - n_draft_rows))
                n_draft_rows += d.n_draft
        n_always_rows = n_draft_rows
        if prefilling or not time_known:
            return n_draft_rows
        decode_only = self.timed_at(n_rows, cells)
        if decode_only <= 0.0:
            return n_draft_rows  # this step times the decode rows (the module doc)
        # auto: each session's draft gets the length that gives the step the most
        # expected tokens per second, with the drafts before it. Beyond the measured
        # steps a row costs the model's b, but at least the decode-only step's time
        # shared by one row more: where every step had the same rows (one decoder, no
        # drafts yet) the fit cannot tell a from b, and drafting is what tells them
        # apart. Then the plan keeps only drafts that slow no other session.
        row_s = max(time_b, decode_only / (n_rows + 1))
        trusted = n_rows
        for i in range(n_rows):
            d = rows[i].drafting
            k = min(self.found[i], room - n_draft_rows)
            if d.mode != SPECULATE_AUTO:
                continue
            # the j-th draft row gives a token only if the j - 1 before it were
            # accepted: p^j tokens expected (counted at the trust)
            undrafted = trusted / self.step_seconds(n_rows + n_draft_rows, row_s)
            best = undrafted
            gain = 0.0
            p_j = 1.0
            for j in range(1, k + 1):
                p_j *= self.rate[i]
                gain += p_j
                rate = (trusted + trust * gain) / self.step_seconds(
                    n_rows + n_draft_rows + j, row_s)
                if rate > best:
                    best, d.expected, d.n_draft = rate, gain, j
            if best < undrafted * (1.0 + GAIN_MARGIN):
                d.expected, d.n_draft = 0.0, 0
            trusted += trust * d.expected
            n_draft_rows += d.n_draft
        n_draft_rows = self.keep_repaid(rows, n_rows, n_draft_rows, n_always_rows, trust, row_s)
        expected = n_rows
        for i in range(n_rows):
            expected += rows[i].drafting.expected
        if expected > n_rows:
            self.planned_tokens = expected
            self.planned_s = self.step_seconds(n_rows + n_draft_rows, row_s)
        return n_draft_rows

    cdef int keep_repaid(self, DraftRow * rows, int n_rows, int n_draft_rows,
                         int n_always_rows, double trust, double row_s) noexcept nogil:
        """The plan's "auto" drafts, less those not repaid (the module doc): a drafting
        session's whose step exceeds its 1 + expected tokens' steps without drafts,
        the fewest expected first, else, where some session does not draft and the
        time the drafts add exceeds what their expected tokens will save it, those
        that give least for their rows. Returns the step's draft rows left."""
        cdef int i, fewest, unrepaid
        cdef double base_s, plan_s, row_cost, saved, value, fewest_value
        cdef bint waiting
        cdef Drafting * d
        if n_rows < 2:
            return n_draft_rows
        base_s = self.step_seconds(n_rows + n_always_rows, row_s)
        row_cost = (self.step_seconds(n_rows, row_s)
                    - self.step_seconds(1, row_s)) / (n_rows - 1)
        while n_draft_rows > n_always_rows:
            plan_s = self.step_seconds(n_rows + n_draft_rows, row_s)
            saved = 0.0
            waiting = False
            fewest = unrepaid = -1
            fewest_value = 0.0
            for i in range(n_rows):
                d = rows[i].drafting
                if d.expected <= 0.0:
                    waiting = True
                    continue
                saved += trust * d.expected * row_cost
                value = d.expected / d.n_draft
                if fewest < 0 or value < fewest_value:
                    fewest, fewest_value = i, value
                if plan_s > (1.0 + trust * d.expected) * base_s and (
                        unrepaid < 0 or d.expected < rows[unrepaid].drafting.expected):
                    unrepaid = i
            if unrepaid >= 0:
                fewest = unrepaid
            elif fewest < 0 or not waiting or plan_s - base_s <= saved:
                break
            d = rows[fewest].drafting
            n_draft_rows -= d.n_draft
            d.n_draft = 0
            d.expected = 0.0
        return n_draft_rows

    cdef void verified(self, Drafting * d, int accepted) noexcept nogil:
        """The step verified the session's d.n_draft drafts: the first `accepted` were."""
        _record(&d.record[d.source], d.n_draft, accepted, SLOT_FORGET)
        _record(&self.by_source[d.source][d.match_class], d.n_draft, accepted, SOURCE_FORGET)
        if d.expected > 0.0:
            self.trust_accepted += accepted
            self.trust_expected += d.expected

    cdef void shadowed(self, Drafting * d, bint taken) noexcept nogil:
        """The session's row was not followed by the draft found for it; its token
        was (taken) or was not that draft's first. A draft not verified costs
        nothing and tells as much of the session's chance as a verified one's
        first token: its record learns from it (its source's, kept of verified
        drafts, does not)."""
        _record(&d.record[d.source], 1, taken, SLOT_FORGET)

    cdef void finished(self, const int32_t * tokens, int n_prompt, int n) noexcept nogil:
        """A session ended with `n` tokens, its prompt's first: its output joins the store."""
        self.store.add(tokens, n_prompt, n)
