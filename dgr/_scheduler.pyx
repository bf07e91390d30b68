# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The batch loop's scheduler: the step policy and the post-step update over its
slot table (dgr/_slots.pyx: the sessions' slots, started, credited, asked to finish
and ended), in C without the GIL and without llama.cpp (dgr._batch.BatchLoop runs
them around each llama_decode; the tests drive them directly).

Policy (re-planned every step; sessions join and leave between steps):

1. Decode first. Every decoding slot whose reader can take one more token
   (credits > 0) gets exactly one row, in ascending slot order (llama.cpp
   evaluates out-of-order sequence ids in several ubatches). A slot without credits
   (slow reader) is skipped, so backpressure reaches the model step instead
   of memory.
2. Prefill fills what the token budget leaves, oldest session first, each
   session a piece from where its prefill stands (after a shared prefix) of
   whatever size the step has room for: a token's KV does not depend on the
   piece it was computed in (flash attention is row-invariant, patch
   0013). With no session decoding, the whole token budget. While sessions
   decode, the step's prefill rows are bounded so that its time stays within
   `decode_stall` times a decode-only step's, by the node's model of its own
   step times (set_step_time: a + b decode rows + c prefill rows + e cells
   the prefill rows attend, in 1,024s); until it has one (or with
   decode_stall 0), `prefill_chunk` rows. The oldest session's piece is at
   least MIN_PIECE tokens (a long prompt is never starved); a younger one's
   is not started below that, and never ahead of an older one that waits.
   A session scoring its prompt (prompt_logprobs) prefills SCORE_CHUNK tokens a
   chunk, every row an output row; one such chunk per step, so the logits of a
   step stay within SCORE_CHUNK rows more than its decode rows (a second
   scoring session waits, the others go on).
3. Drafts (speculation, unified pool only): a speculating decoder's row may be
   followed by draft rows, which the step verifies; which rows carry how many is
   the speculation policy's (dgr/_speculation.pyx), from what the token budget
   leaves beyond the decode rows and MIN_PIECE prefill rows, and the step-time
   model. A session drafts no more than its credits and max_tokens leave room
   for (so drafts never take KV beyond its reservation) and max_draft allows.
4. At most `prefill_sessions` chunks per step. With `one_call` (a unified KV
   pool) the whole step, decode rows and chunks, is one llama_decode: a row's
   results do not depend on the rows it shares a call with (the patch stack's
   row-invariant matmuls and flash attention). Otherwise (split KV, where
   llama.cpp would cut a mixed call into many equal-length ubatches) the decode
   rows run in one call and each chunk in a call of its own.

Bounds: rows per step <= token_budget; calls per step <= 1 + prefill_sessions;
events per step <= max_step_events().

Post-step update: a sampled token is appended to its slot; an end-of-generation
token (unless ignore_eos) ends the slot with FINISH_STOP and is not reported;
otherwise it is reported (EV_TOKEN, one credit spent) and the slot ends with
FINISH_LENGTH at max_tokens. A slot whose call failed, or whose own call was
refused (`refuse`), ends with FINISH_ERROR.
A decode row with drafts yields its sampled tokens in order while each equals
the draft the next row was fed (the sampler samples a draft row only then:
WANT_CHAIN), so the tokens, the sampler's state and its random draws are those
of decoding one token a step; the KV of the rows after the last accepted one
is dropped by the loop (kv_valid) before the next step.
A finish the node asked for (cancel, stop string) wins over a token sampled
meanwhile. An ended slot is FREE at once; the loop frees its KV before it
publishes the events, so the node reuses a slot only after its EV_FINISH.
"""

from libc.math cimport sqrt
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy

from dgr._events cimport event_record


cdef class Scheduler(SlotTable):
    """The step policy and post-step update of one batch loop, over its slot table
    (see the module doc)."""

    def __cinit__(self):
        self.decode_slots = self.chunk_slot = self.chunk_start = self.chunk_end = NULL
        self.order_buf = NULL
        self.draft_rows = NULL
        self.slot_rc = NULL

    def __init__(self, int n_slots, int token_budget, int prefill_chunk, int prefill_sessions,
                 int n_vocab, eog_tokens=(), bint one_call=False, double decode_stall=0.0,
                 int max_draft=MAX_DRAFT):
        if n_slots < 1 or prefill_chunk < 1 or prefill_sessions < 1 or n_vocab < 1:
            raise ValueError("n_slots, prefill_chunk, prefill_sessions and n_vocab must be positive")
        if token_budget <= n_slots or prefill_chunk > token_budget:
            raise ValueError("the token budget must exceed n_slots and hold one prefill chunk")
        SlotTable.__init__(self, n_slots, n_vocab, eog_tokens,
                           max_draft if one_call else 0)  # drafts need one call a step
        self.token_budget = token_budget
        self.prefill_chunk = prefill_chunk
        self.prefill_sessions = min(prefill_sessions, n_slots)
        self.one_call = one_call
        if decode_stall != 0.0 and decode_stall < 1.0:
            raise ValueError("decode_stall must be 0 (fixed pieces) or at least 1")
        self.decode_stall = decode_stall
        self.decode_slots = <int *> calloc(n_slots, sizeof(int))
        self.chunk_slot = <int *> calloc(n_slots, sizeof(int))
        self.chunk_start = <int *> calloc(n_slots, sizeof(int))
        self.chunk_end = <int *> calloc(n_slots, sizeof(int))
        self.order_buf = <int *> calloc(n_slots, sizeof(int))
        self.draft_rows = <DraftRow *> calloc(n_slots, sizeof(DraftRow))
        self.slot_rc = <int *> calloc(n_slots, sizeof(int))
        if (self.slot_rc == NULL or self.decode_slots == NULL or self.chunk_slot == NULL
                or self.chunk_start == NULL or self.chunk_end == NULL
                or self.order_buf == NULL or self.draft_rows == NULL):
            raise MemoryError()

    def __dealloc__(self):
        free(self.decode_slots)
        free(self.chunk_slot); free(self.chunk_start); free(self.chunk_end)
        free(self.order_buf); free(self.draft_rows); free(self.slot_rc)

    # ------------------------------------------------------------ the node's side

    def set_step_time(self, double a, double b, double c, double e):
        """The node's model of a step's seconds: a + b decode rows + c prefill rows
        + e cells the prefill rows attend (in 1,024s); c > 0, e >= 0 and a + b > 0
        (a model that is not is refused). Read by the next plans."""
        if not (c > 0.0 and e >= 0.0 and a + b > 0.0):
            raise ValueError("a step-time model needs c > 0, e >= 0 and a + b > 0")
        self.time_a, self.time_b, self.time_c, self.time_e = a, b, c, e
        self.time_known = True

    def set_word_forms(self, kinds, twins):
        """The vocabulary's word forms, for the values draft source
        (Speculation.set_word_forms)."""
        if self.speculation is not None:
            self.speculation.set_word_forms(kinds, twins)

    def set_row_times(self, points):
        """Decode steps' seconds by output rows, for the speculation policy
        (Speculation.set_row_times); without one, nothing to do."""
        if self.speculation is not None:
            self.speculation.set_row_times(points)

    @property
    def last_prefill_cap(self):
        """The prefill rows the last plan allowed."""
        return self.prefill_cap

    # ------------------------------------------------------------ for tests

    def plan_step(self):
        """Take finish requests and plan a step: (finish events, decode slots, chunks),
        chunks as (slot, start, end). The same calls the batch loop makes."""
        cdef Event * events = <Event *> malloc(self.max_step_events() * sizeof(Event))
        try:
            n = self.take_finish_requests(events)
            finished = [event_record(&events[i]) for i in range(n)]
        finally:
            free(events)
        self.plan()
        return (finished, [self.decode_slots[i] for i in range(self.n_decode)],
                [(self.chunk_slot[c], self.chunk_start[c], self.chunk_end[c])
                 for c in range(self.n_chunks)])

    def apply(self, sampled, call_rc=None):
        """Run the post-step update of the last plan with `sampled` tokens, one per
        row (-1 for rows without output) and each call's return code (default 0):
        with one_call a single call, else the decode rows' (if any) and each chunk's."""
        cdef int rows = self.plan_rows()
        if len(sampled) != rows:
            raise ValueError(f"the plan has {rows} rows (decode rows with their drafts, then "
                             f"chunks), got {len(sampled)} tokens")
        n_calls = ((1 if rows else 0) if self.one_call
                   else (1 if self.n_decode else 0) + self.n_chunks)
        call_rc = list(call_rc) if call_rc is not None else [0] * n_calls
        if len(call_rc) != n_calls:
            raise ValueError(f"the plan has {n_calls} calls")
        cdef int32_t * tok = <int32_t *> calloc(max(rows, 1), sizeof(int32_t))
        cdef int * rc = <int *> calloc(1 + self.n_chunks, sizeof(int))
        cdef float * lp = <float *> calloc(max(rows, 1), sizeof(float))
        cdef int32_t * top = <int32_t *> calloc(max(rows, 1) * MAX_LOGPROBS, sizeof(int32_t))
        cdef float * top_lp = <float *> calloc(max(rows, 1) * MAX_LOGPROBS, sizeof(float))
        cdef Event * events = <Event *> malloc(self.max_step_events() * sizeof(Event))
        cdef StepFigures figures
        try:
            for i in range(rows):
                tok[i] = sampled[i]
            offset = 0 if self.one_call or self.n_decode else 1
            for i, code in enumerate(call_rc):
                rc[i + offset] = code
            n = self.update(tok, rc, lp, top, top_lp, events, &figures)
            return [event_record(&events[i]) for i in range(n)]
        finally:
            free(tok); free(rc); free(lp); free(top); free(top_lp); free(events)

    # ------------------------------------------------------------ the loop's side (nogil)

    cdef int max_step_events(self) noexcept nogil:
        # decode rows + chunks + tokens + finishes + failed calls (and the refused
        # sessions') + the step record, one scoring chunk's scores, accepted drafts
        return 3 * self.n_slots + 2 * self.prefill_sessions + 3 + SCORE_CHUNK + MAX_STEP_DRAFTS

    cdef int plan(self) noexcept nogil:
        """Plan the next step (module doc, Policy); returns its rows."""
        cdef int s, i, j, start, end, left, n_waiting
        cdef Slot * sl
        self.n_decode = 0
        for s in range(self.n_slots):
            sl = &self.slots[s]
            if sl.phase == SLOT_DECODE and sl.credits > 0:
                self.decode_slots[self.n_decode] = s
                self.n_decode += 1
        # Prefilling slots, oldest first (insertion sort: a few dozen slots at most).
        n_waiting = 0
        for s in range(self.n_slots):
            if self.slots[s].phase == SLOT_PREFILL:
                j = n_waiting
                while j > 0 and self.slots[self.order_buf[j - 1]].order > self.slots[s].order:
                    self.order_buf[j] = self.order_buf[j - 1]
                    j -= 1
                self.order_buf[j] = s
                n_waiting += 1
        self.n_draft_rows = 0
        self.cells = 0.0  # the KV cells the decode rows attend, then the draft rows too
        if self.speculation is not None:
            for i in range(self.n_decode):
                sl = &self.slots[self.decode_slots[i]]
                self.draft_rows[i].drafting = &sl.drafting
                self.draft_rows[i].context = sl.tokens
                self.draft_rows[i].n_context = sl.n_prompt + sl.n_generated
                self.draft_rows[i].n_prompt = sl.n_prompt
                self.draft_rows[i].limit = min(self.max_draft, sl.credits - 1,
                                               sl.max_tokens - sl.n_generated - 1)
                self.cells += self.draft_rows[i].n_context
            self.n_draft_rows = self.speculation.plan(
                self.draft_rows, self.n_decode, self.token_budget - self.n_decode - MIN_PIECE,
                n_waiting > 0, self.time_known, self.time_b, self.cells)
            for i in range(self.n_decode):  # the context of the step's time (RowTimes)
                self.cells += self.draft_rows[i].drafting.n_draft * self.draft_rows[i].n_context
        left = self.token_budget - self.decode_rows()
        self.n_chunks = 0
        if n_waiting == 0:
            self.prefill_cap = 0
        elif self.n_decode == 0:
            self.prefill_cap = left
        elif self.time_known and self.decode_stall > 0.0:
            self.prefill_cap = self._rows_within_stall(self.slots[self.order_buf[0]].n_prefilled)
        else:
            self.prefill_cap = self.prefill_chunk
        cdef int cap = self.prefill_cap, want, piece
        cdef bint scoring = False  # a chunk scoring its rows is in the plan (at most one)
        for i in range(n_waiting):
            s = self.order_buf[i]
            sl = &self.slots[s]
            start = sl.n_prefilled
            want = sl.n_prompt - start
            if sl.credits <= 0 and sl.max_tokens > 0:
                # a resumed session whose reader has no room yet: its last row, which
                # samples, waits for a credit
                want -= 1
                if want <= 0:
                    continue
            if sl.prompt_logprobs >= 0:
                if scoring:
                    continue  # one scoring chunk a step; the sessions behind it go on
                want = min(want, min(SCORE_CHUNK, self.prefill_chunk))
            piece = min(want, min(cap, left))
            if piece < want and piece < MIN_PIECE:
                if self.n_chunks > 0:
                    break  # too small to start a younger session with
                piece = min(want, MIN_PIECE)
            if piece > left or piece <= 0 or self.n_chunks == self.prefill_sessions:
                break
            scoring = scoring or sl.prompt_logprobs >= 0
            self.chunk_slot[self.n_chunks] = s
            self.chunk_start[self.n_chunks] = start
            self.chunk_end[self.n_chunks] = start + piece
            self.n_chunks += 1
            left -= piece
            cap -= piece
        return self.token_budget - left

    cdef int decode_rows(self) noexcept nogil:
        """The plan's decode rows with their drafts (the rows before the chunks)."""
        return self.n_decode + self.n_draft_rows

    cdef int _rows_within_stall(self, int position) noexcept nogil:
        """The most prefill rows from `position` that keep the step's predicted time
        within decode_stall times the decode-only step's (at least MIN_PIECE, at
        most the token budget): the largest n with
        c n + e n (2 position + n + 1) / 2048 <= (decode_stall - 1) d,
        the rows at position.. attending position + 1.. cells, where d is the
        decode-only step's seconds at these output rows and contexts as the node
        timed them (Speculation.timed_at: a CPU's step is not linear in its rows;
        three decode rows may take about what eight do), else the fit's a + b n_decode."""
        cdef double decode_only = self.time_a + self.time_b * self.decode_rows()
        cdef double timed = 0.0
        if self.speculation is not None:
            timed = self.speculation.timed_at(self.decode_rows(), self.cells)
        if timed > 0.0:
            decode_only = timed
        cdef double room = (self.decode_stall - 1.0) * decode_only
        cdef double k1 = self.time_c + self.time_e * (2.0 * position + 1.0) / 2048.0
        cdef double k2 = self.time_e / 2048.0
        cdef double n
        if room <= 0.0:
            return MIN_PIECE
        n = room / k1 if k2 <= 0.0 else (sqrt(k1 * k1 + 4.0 * k2 * room) - k1) / (2.0 * k2)
        if n >= self.token_budget:
            return self.token_budget
        return max(MIN_PIECE, <int> n)

    cdef int plan_rows(self) noexcept nogil:
        return self.chunk_offset(self.n_chunks)

    cdef int chunk_offset(self, int c) noexcept nogil:
        """First row of chunk c (rows of chunk n_chunks: the plan's row count)."""
        cdef int row = self.decode_rows(), i
        for i in range(c):
            row += self.chunk_end[i] - self.chunk_start[i]
        return row

    cdef int update(self, const int32_t * sampled, const int * call_rc, const float * chosen_lp,
                    const int32_t * top_ids, const float * top_lp, Event * out,
                    StepFigures * figures) noexcept nogil:
        """Apply the planned step's results. call_rc[0]: the decode rows' call (with
        one_call: the step's one call, chunks included), call_rc[1 + c]: chunk c's
        (without one_call); sampled,
        chosen_lp: per row; top_*: per row, MAX_LOGPROBS apart. Returns the
        events written (the step record is the loop's)."""
        cdef int n = 0, i, c, s, row, last, rc, refused
        cdef bint reported = False  # with one_call, one failed call is one EV_FAILURE
        cdef Event * e
        figures.decode_rows = self.n_decode
        figures.draft_rows = self.n_draft_rows
        figures.cells = self.cells
        figures.planned_tokens = 0.0
        figures.planned_s = 0.0
        if self.speculation is not None:
            figures.planned_tokens = self.speculation.planned_tokens
            figures.planned_s = self.speculation.planned_s
        figures.prefill_rows = 0
        figures.generated = 0
        for i in range(self.n_decode):
            e = &out[n]
            e.kind = EV_DECODE
            e.slot = self.decode_slots[i]
            e.drafted = self.slots[e.slot].drafting.n_draft
            e.accepted = 0
            e.source = self.slots[e.slot].drafting.source if e.drafted else 0
            n += 1
        for c in range(self.n_chunks):
            e = &out[n]
            e.kind = EV_PREFILL
            e.slot = self.chunk_slot[c]
            e.start = self.chunk_start[c]
            e.end = self.chunk_end[c]
            n += 1
        if self.n_decode and call_rc[0] != 0:
            n += self._failure(call_rc[0], out + n)
            reported = self.one_call
        if self.refused_rc != 0:  # one EV_FAILURE for the sessions refused alone
            n += self._failure(self.refused_rc, out + n)
            self.refused_rc = 0
        row = 0
        for i in range(self.n_decode):
            s = self.decode_slots[i]
            rc = call_rc[0] if call_rc[0] != 0 else self.slot_rc[s]
            self.slot_rc[s] = 0
            if self.slots[s].phase == SLOT_FREE:
                pass
            elif rc != 0:
                n += self._end_refused(s, rc, out + n)
            else:
                n += self._verify(s, row, sampled, chosen_lp, top_ids, top_lp, &out[i],
                                  out + n, figures)
            row += 1 + self.slots[s].drafting.n_draft
        for c in range(self.n_chunks):
            s = self.chunk_slot[c]
            rc = call_rc[0 if self.one_call else 1 + c]
            refused, self.slot_rc[s] = self.slot_rc[s], 0
            if rc != 0 or refused != 0:
                if rc != 0 and not reported:
                    n += self._failure(rc, out + n)
                    reported = self.one_call
                if self.slots[s].phase != SLOT_FREE:
                    n += self._end_refused(s, rc or refused, out + n)
                continue
            figures.prefill_rows += self.chunk_end[c] - self.chunk_start[c]
            if self.slots[s].phase == SLOT_FREE:
                continue
            self.slots[s].n_prefilled = self.chunk_end[c]
            if self.slots[s].prompt_logprobs >= 0:
                n += self._scores(c, chosen_lp, top_ids, top_lp, out + n)
            if self.chunk_end[c] == self.slots[s].n_prompt:
                last = self.chunk_offset(c + 1) - 1
                if self.slots[s].max_tokens == 0:  # it only scored its prompt
                    n += self._finish(s, FINISH_LENGTH, 0, out + n)
                    continue
                self.slots[s].phase = SLOT_DECODE
                n += self._output(s, sampled[last], chosen_lp[last],
                                  top_ids + last * MAX_LOGPROBS, top_lp + last * MAX_LOGPROBS,
                                  out + n, figures)
        return n

    cdef int _verify(self, int s, int row, const int32_t * sampled, const float * chosen_lp,
                     const int32_t * top_ids, const float * top_lp, Event * decoded,
                     Event * out, StepFigures * figures) noexcept nogil:
        """Slot s's decode row (at `row`) and its drafts after it: its tokens, in
        order, while each is the draft the next row was fed; the acceptance
        figures in its EV_DECODE (`decoded`) and rates. Returns the events written."""
        cdef Slot * sl = &self.slots[s]
        cdef Drafting * d = &sl.drafting
        cdef int k = d.n_draft, j, n = 0, accepted = 0
        for j in range(k + 1):
            n += self._output(s, sampled[row + j], chosen_lp[row + j],
                              top_ids + (row + j) * MAX_LOGPROBS,
                              top_lp + (row + j) * MAX_LOGPROBS, out + n, figures)
            if sl.phase == SLOT_FREE or j == k or sampled[row + j] != d.draft[j]:
                break
            accepted += 1
        if k:
            decoded.accepted = accepted
            self.speculation.verified(d, accepted)
        elif d.n_found:
            self.speculation.shadowed(d, sampled[row] == d.draft[0])
        return n

    cdef int _scores(self, int c, const float * chosen_lp, const int32_t * top_ids,
                     const float * top_lp, Event * out) noexcept nogil:
        """Chunk c's scores: row p gave the log-probability of prompt token p + 1
        (the chunk's last prompt row, the sampled token's, gives none)."""
        cdef int s = self.chunk_slot[c], row = self.chunk_offset(c), p, n = 0
        cdef Slot * sl = &self.slots[s]
        for p in range(self.chunk_start[c], self.chunk_end[c]):
            if p + 1 < sl.n_prompt:
                out[n].kind = EV_SCORE
                out[n].slot = s
                out[n].start = p + 1
                out[n].token = sl.tokens[p + 1]
                out[n].logprob = chosen_lp[row]
                out[n].n_top = sl.prompt_logprobs
                memcpy(out[n].top_ids, top_ids + row * MAX_LOGPROBS,
                       sl.prompt_logprobs * sizeof(int32_t))
                memcpy(out[n].top_lp, top_lp + row * MAX_LOGPROBS,
                       sl.prompt_logprobs * sizeof(float))
                n += 1
            row += 1
        return n

    cdef int _failure(self, int code, Event * out) noexcept nogil:
        out.kind = EV_FAILURE
        out.code = code
        return 1

    cdef void refuse(self, int s, int code) noexcept nogil:
        """llama.cpp refused slot s's rows in a call of their own: the update ends it."""
        self.slot_rc[s] = code
        self.refused_rc = self.refused_rc or code

    cdef int _end_refused(self, int s, int code, Event * out) noexcept nogil:
        """Slot s's rows failed with `code`. A session the KV pool could not place
        (code 1, or KV_MOVE_FAILED: the pool is full or out of order) is parked where
        it may be: its KV kept as far as it is valid (none once a move failed), its
        sampler state moved aside. Any other ends with the error."""
        cdef int n
        if (code == 1 or code == KV_MOVE_FAILED) and self.slots[s].park_when_full:
            n = self._finish(s, FINISH_PARKED, code, out)
            if code == KV_MOVE_FAILED:
                out.kept = 0
            return n
        return self._finish(s, FINISH_ERROR, code, out)

    cdef int fail(self, int s, int code, Event * out) noexcept nogil:
        """End slot s with `code` after the update (the loop could not set its KV right)."""
        return 0 if self.slots[s].phase == SLOT_FREE else self._finish(s, FINISH_ERROR, code, out)

    cdef int _output(self, int s, int32_t token, float chosen_lp, const int32_t * top_ids,
                     const float * top_lp, Event * out, StepFigures * figures) noexcept nogil:
        """Append one sampled token to slot s and count it in the step's figures
        (an end-of-generation token ends the session and is not one); returns the
        events written."""
        cdef Slot * sl = &self.slots[s]
        if sl.finish_requested != FINISH_NONE and sl.finish_requested != FINISH_PARKED:
            # asked to end while the step ran: the token is not its; a session being
            # parked keeps it (its sampler has drawn it) and ends before its next row
            return self._finish(s, sl.finish_requested, 0, out)
        if token < 0 or token >= self.n_vocab:
            return self._finish(s, FINISH_ERROR, NO_LOGITS, out)
        sl.last_token = token
        if self.eog[token] and not sl.ignore_eos:
            return self._finish(s, FINISH_STOP, 0, out)
        sl.tokens[sl.n_prompt + sl.n_generated] = token
        sl.n_generated += 1  # the tokens reported: the node's Session.generated
        figures.generated += 1
        out.kind = EV_TOKEN
        out.slot = s
        out.token = token
        out.n_top = sl.n_logprobs
        if sl.n_logprobs:
            out.logprob = chosen_lp
            memcpy(out.top_ids, top_ids, sl.n_logprobs * sizeof(int32_t))
            memcpy(out.top_lp, top_lp, sl.n_logprobs * sizeof(float))
        sl.credits -= 1
        if sl.n_generated >= sl.max_tokens:
            return 1 + self._finish(s, FINISH_LENGTH, 0, out + 1)
        return 1
