# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The batch loop: steps every session of a node on the engine thread, without
the GIL and without waiting for Trio between steps. It reaches the engine (the
call, KV operations, sampling) only through dgr/_engine.pxd, the step policy only
through dgr/_scheduler.pxd, and the node only through its mailbox
(dgr/_mailbox.pxd).
"""

from libc.stdint cimport int8_t, int32_t, int64_t, uint64_t
from libc.stdlib cimport calloc, free
from libc.string cimport memcpy, memset
from posix.unistd cimport write

from dgr._codes cimport (ENGINE_FAULT, EV_FINISH, EV_STEP, FAULT_RAISE, FINISH_PARKED,
                        KV_MOVE_FAILED, MAX_LOGPROBS, STATE_ROLLBACK_FAILED, WANT_CHAIN,
                        WANT_LOGPROBS, WANT_SAMPLE, WANT_SCORE)
from dgr._clock cimport monotonic
from dgr._engine cimport Engine
from dgr._events cimport Event, StepFigures
from dgr._mailbox cimport Mailbox
from posix.time cimport CLOCK_REALTIME, clock_gettime, timespec

from dgr._pthread cimport (pthread_cond_broadcast, pthread_cond_timedwait, pthread_cond_wait,
                          pthread_mutex_lock, pthread_mutex_unlock)
from dgr._scheduler cimport SLOT_DECODE, Scheduler, Slot

# After a park the node asked for (its slot goes to a waiting session that outranks the
# parked one), how long the loop waits for that session's start before it plans the next
# step: the session joins the next step instead of the one after (a step is tens to
# hundreds of milliseconds; the node starts it within a few).
cdef long PARK_HANDOFF_NS = 20 * 1000 * 1000


cdef class BatchLoop(Mailbox):
    """The batch-assembly loop: steps every session of a node, on the engine
    thread, without the GIL and without waiting for Trio between steps; the node
    talks to it through its mailbox and event ring (dgr._mailbox.Mailbox).

    Each step (module doc of dgr._scheduler: plan, one llama_decode for the
    decode rows and one per prefill chunk, sampling, post-step update) appends
    its events to the ring. The loop keeps stepping while it has rows to run and
    room in the ring for one more step's events; a full ring (the node fell
    behind) stops it until the node drains, so nothing between the two grows
    without bound. Ended slots' KV cells are freed before their EV_FINISH is
    published, but for what a slot was told to keep (a prefix cache entry); the
    KV changes the node queued are applied between steps.
    """

    cdef Event * scratch            # the step's events, before they are published
    cdef int32_t * row_tok
    cdef int32_t * row_pos
    cdef int32_t * row_seq
    cdef int8_t * row_want
    cdef int32_t * row_next        # a scored row's next prompt token (WANT_SCORE), or the
                                   # draft the next row was fed (WANT_CHAIN)
    cdef int32_t * sampled
    cdef float * chosen_lp
    cdef int32_t * top_ids
    cdef float * top_lp
    cdef int * call_rc
    cdef int64_t steps
    cdef double mark

    def __cinit__(self):
        self.scratch = NULL
        self.row_tok = self.row_pos = self.row_seq = self.sampled = self.top_ids = NULL
        self.row_want = NULL
        self.row_next = NULL
        self.chosen_lp = self.top_lp = NULL
        self.call_rc = NULL

    def __init__(self, Engine engine, Scheduler scheduler, int wake_fd, int ring_steps=32):
        Mailbox.__init__(self, engine, scheduler, wake_fd, ring_steps)
        cdef int rows = scheduler.token_budget
        self.scratch = <Event *> calloc(self.step_cap, sizeof(Event))
        self.row_tok = <int32_t *> calloc(rows, sizeof(int32_t))
        self.row_pos = <int32_t *> calloc(rows, sizeof(int32_t))
        self.row_seq = <int32_t *> calloc(rows, sizeof(int32_t))
        self.row_want = <int8_t *> calloc(rows, sizeof(int8_t))
        self.row_next = <int32_t *> calloc(rows, sizeof(int32_t))
        self.sampled = <int32_t *> calloc(rows, sizeof(int32_t))
        self.chosen_lp = <float *> calloc(rows, sizeof(float))
        self.top_ids = <int32_t *> calloc(rows * MAX_LOGPROBS, sizeof(int32_t))
        self.top_lp = <float *> calloc(rows * MAX_LOGPROBS, sizeof(float))
        self.call_rc = <int *> calloc(1 + scheduler.n_slots, sizeof(int))
        if (self.scratch == NULL or self.row_tok == NULL
                or self.row_pos == NULL or self.row_seq == NULL or self.row_want == NULL
                or self.row_next == NULL
                or self.sampled == NULL or self.chosen_lp == NULL or self.top_ids == NULL
                or self.top_lp == NULL or self.call_rc == NULL):
            raise MemoryError()

    def __dealloc__(self):
        free(self.scratch)
        free(self.row_tok); free(self.row_pos); free(self.row_seq); free(self.row_want)
        free(self.row_next)
        free(self.sampled); free(self.chosen_lp); free(self.top_ids); free(self.top_lp)
        free(self.call_rc)

    def run(self):
        """Step until stop(); call it on the engine thread (the GIL is released throughout)."""
        with nogil:
            self._run()

    # ------------------------------------------------------------ the loop (nogil)

    cdef void _run(self) noexcept nogil:
        cdef int n_events, rows, n_ops
        cdef double mark
        pthread_mutex_lock(&self.lock)
        self.mark = monotonic()
        while not self.stopping:
            if self.ring_cap - self.ring_len < self.step_cap:
                self._wake_node()
                pthread_cond_wait(&self.wake, &self.lock)  # until the node drains
                self.mark = monotonic()
                continue
            n_ops = self.kv_ops.apply()
            self.adapters.apply()
            if n_ops:
                pthread_cond_broadcast(&self.ops_room)
            n_events = self.scheduler.take_finish_requests(self.scratch)
            if n_events:
                # a slot the node asked back (a finish, a park) is another session's
                # start: the node hears of it now (woken as this step's rows go to
                # llama.cpp), not after the step
                self._release_finished(n_events)
                mark = self.mark
                self._publish(n_events)
                self.mark = mark  # the step's time still counts from its start
                if self._parked_any(n_events) and self._await_start():
                    self.kv_ops.published += n_ops  # those applied above: the node hears next
                    self.mark = monotonic()
                    continue  # its KV operations are applied, then it is planned
            rows = self.scheduler.plan()
            if rows > 0:
                self._step()
                self.kv_ops.published += n_ops
                continue
            if n_ops:
                self.kv_ops.published += n_ops
                self._publish(0)
                continue
            if n_events:
                continue
            self._wake_node()
            pthread_cond_wait(&self.wake, &self.lock)
            self.mark = monotonic()
        self._wake_node()
        pthread_mutex_unlock(&self.lock)

    cdef bint _parked_any(self, int n_events) noexcept nogil:
        cdef int i
        for i in range(n_events):
            if self.scratch[i].kind == EV_FINISH and self.scratch[i].reason == FINISH_PARKED:
                return True
        return False

    cdef bint _await_start(self) noexcept nogil:
        """Wake the node for a park it asked for and wait, at most PARK_HANDOFF_NS, for a
        session to start (the one the park was for); True if one did."""
        cdef int64_t before = self.starts
        cdef timespec until
        clock_gettime(CLOCK_REALTIME, &until)
        until.tv_nsec += PARK_HANDOFF_NS
        if until.tv_nsec >= 1000000000:
            until.tv_sec += 1
            until.tv_nsec -= 1000000000
        self._wake_node()
        while self.starts == before and not self.stopping:
            if pthread_cond_timedwait(&self.wake, &self.lock, &until) != 0:
                break  # the time is up
        return self.starts != before

    cdef void _wake_node(self) noexcept nogil:
        """Wake the node's pump for the events published since it was last woken.
        Done where the lock is about to be let go (before a wait, or just after the
        next step's rows are filled), so the pump does not wake only to block on
        the lock while the next step is planned."""
        cdef uint64_t one = 1
        if self.wake_pending:
            self.wake_pending = False
            write(self.wake_fd, &one, sizeof(one))

    cdef void _step(self) noexcept nogil:
        """Run the planned step; entered and left with the lock held, which is
        released while llama.cpp runs."""
        cdef StepFigures figures
        cdef int n_events
        cdef double times[3]
        cdef double started = self.mark, unlocked, relocked, ended
        cdef double fill_s = 0.0, decode_s = 0.0, sample_s = 0.0
        cdef int rows = self.scheduler.plan_rows(), call, start, end, bad_row, rc, n_calls = 0
        memset(&figures, 0, sizeof(StepFigures))
        self._fill_rows()
        unlocked = monotonic()
        pthread_mutex_unlock(&self.lock)
        self._wake_node()
        # one_call: every row in call 0. Otherwise call 0: the decode rows (when there
        # are any); call 1 + c: chunk c, alone.
        for call in range(1 if self.scheduler.one_call else 1 + self.scheduler.n_chunks):
            start = 0 if call == 0 else self.scheduler.chunk_offset(call - 1)
            end = (rows if self.scheduler.one_call else
                   self.scheduler.decode_rows() if call == 0 else self.scheduler.chunk_offset(call))
            if end == start:
                continue
            rc = self._run_rows(start, end, times)
            n_calls += 1
            fill_s += times[0]
            decode_s += times[1]
            sample_s += times[2]
            if rc == 1 or rc == -1:
                # llama.cpp refused the call whole and left the memory as it was: each
                # session's rows again in a call of their own, so only the session it
                # refuses fails; rows are row-invariant, so the others' results are
                # those of the call they were planned in
                n_calls += self._isolate(start, end, times)
                fill_s += times[0]
                decode_s += times[1]
                sample_s += times[2]
                rc = 0
            self.call_rc[call] = rc
        relocked = monotonic()
        pthread_mutex_lock(&self.lock)
        n_events = self.scheduler.update(self.sampled, self.call_rc, self.chosen_lp, self.top_ids,
                                         self.top_lp, self.scratch, &figures)
        n_events += self._drop_rejected_drafts(self.scratch + n_events)
        self._release_finished(n_events)
        self.steps += 1
        figures.index = self.steps
        figures.rows = rows
        figures.calls = n_calls
        figures.plan_s = unlocked - started + fill_s
        figures.decode_s = decode_s
        figures.sample_s = sample_s
        ended = monotonic()
        figures.update_s = ended - relocked
        figures.total_s = ended - started
        figures.ended_at = ended
        self.scratch[n_events].kind = EV_STEP
        self.scratch[n_events].step = figures
        self._publish(n_events + 1)

    cdef int _run_rows(self, int start, int end, double * times) noexcept nogil:
        """Rows [start, end) in one call of the engine's, sampled; its code."""
        cdef int bad_row = -1
        cdef int rc = self.engine.run_call(
            end - start, self.row_tok + start, self.row_pos + start, self.row_seq + start,
            self.row_want + start, self.row_next + start, MAX_LOGPROBS, self.sampled + start,
            self.chosen_lp + start,
            self.top_ids + start * MAX_LOGPROBS, self.top_lp + start * MAX_LOGPROBS,
            &bad_row, times)
        if rc == FAULT_RAISE:
            rc = ENGINE_FAULT
        elif rc == 0 and bad_row >= 0:
            self.sampled[start + bad_row] = -1  # the scheduler ends that session
        return rc

    cdef int _isolate(self, int start, int end, double * times) noexcept nogil:
        """Rows [start, end), which llama.cpp refused as one call, a call per session
        (a session's rows lie together). A session that finds no KV cell after its own
        (code 1 in an ordered pool, patch 0015) is moved (KvOperations.move) and its
        rows run again; a session whose own call still fails is refused
        (Scheduler.refuse). Returns the calls run; times: their sums."""
        cdef int first = start, row, rc, s, calls = 0
        times[0] = times[1] = times[2] = 0.0
        for row in range(start + 1, end + 1):
            if row < end and self.row_seq[row] == self.row_seq[first]:
                continue
            s = self.row_seq[first]
            rc = self._run_timed(first, row, times)
            calls += 1
            if rc == 1 and self.scheduler.one_call:  # the unified, ordered pool: a move may fit it
                if self.kv_ops.move(s):
                    rc = self._run_timed(first, row, times)
                    calls += 1
                else:
                    rc = KV_MOVE_FAILED
            if rc != 0:
                self.scheduler.refuse(s, rc)
            first = row
        return calls

    cdef int _run_timed(self, int start, int end, double * times) noexcept nogil:
        """_run_rows, its seconds added to times."""
        cdef double each[3]
        cdef int rc = self._run_rows(start, end, each)
        times[0] += each[0]
        times[1] += each[1]
        times[2] += each[2]
        return rc

    cdef int _drop_rejected_drafts(self, Event * out) noexcept nogil:
        """A decoder still running after a step with drafts keeps the KV of its
        accepted ones only (an ended one's KV goes with _release_finished); one
        whose KV llama.cpp cannot cut back (a recurrent state past its snapshots)
        ends with STATE_ROLLBACK_FAILED. Returns the events written."""
        cdef int i, s, n = 0
        for i in range(self.scheduler.n_decode):
            s = self.scheduler.decode_slots[i]
            if (self.scheduler.slots[s].drafting.n_draft
                    and self.scheduler.slots[s].phase == SLOT_DECODE
                    and not self.engine.kv_keep(s, self.scheduler.kv_valid(s))):
                n += self.scheduler.fail(s, STATE_ROLLBACK_FAILED, out + n)
        return n

    cdef void _fill_rows(self) noexcept nogil:
        """The plan's rows from the slot table: decode rows, each followed by its
        drafts (chained: a draft row is sampled only if the row before it sampled
        its token), then each chunk."""
        cdef int i, j, c, s, row = 0, p, position
        cdef int8_t want
        cdef Slot * sl
        for i in range(self.scheduler.n_decode):
            s = self.scheduler.decode_slots[i]
            sl = &self.scheduler.slots[s]
            want = WANT_SAMPLE | (WANT_LOGPROBS if sl.n_logprobs else 0)
            position = sl.n_prefilled + sl.n_generated - 1
            for j in range(1 + sl.drafting.n_draft):
                self.row_tok[row] = sl.last_token if j == 0 else sl.drafting.draft[j - 1]
                self.row_pos[row] = position + j
                self.row_seq[row] = s
                self.row_want[row] = want
                if j < sl.drafting.n_draft:
                    self.row_want[row] = want | WANT_CHAIN
                    self.row_next[row] = sl.drafting.draft[j]
                row += 1
        for c in range(self.scheduler.n_chunks):
            s = self.scheduler.chunk_slot[c]
            sl = &self.scheduler.slots[s]
            for p in range(self.scheduler.chunk_start[c], self.scheduler.chunk_end[c]):
                self.row_tok[row] = sl.tokens[p]
                self.row_pos[row] = p
                self.row_seq[row] = s
                self.row_want[row] = 0
                if sl.prompt_logprobs >= 0 and p + 1 < sl.n_prompt:
                    self.row_want[row] = WANT_SCORE
                    self.row_next[row] = sl.tokens[p + 1]
                row += 1
            if self.scheduler.chunk_end[c] == sl.n_prompt and sl.max_tokens > 0:
                self.row_want[row - 1] = WANT_SAMPLE | (WANT_LOGPROBS if sl.n_logprobs else 0)

    cdef void _release_finished(self, int n_events) noexcept nogil:
        """Ended slots: their samplers reset (a parked session's moved to its entry
        first), their KV freed but for the positions the scheduler says they keep (a
        prefix cache entry), their adapters none."""
        cdef int i
        for i in range(n_events):
            if self.scratch[i].kind == EV_FINISH:
                if self.scratch[i].reason == FINISH_PARKED:
                    self.parked.park(self.scratch[i].slot,
                                     self.park_entry[self.scratch[i].slot])
                self.engine.end_slot(self.scratch[i].slot, self.scratch[i].kept)
                self.adapters.clear(self.scratch[i].slot)

    cdef void _publish(self, int n_events) noexcept nogil:
        """Append the scratch events to the ring and note the KV now held; the node is
        woken for them by _wake_node."""
        cdef int i, s
        for i in range(n_events):
            memcpy(&self.ring[(self.ring_head + self.ring_len) % self.ring_cap], &self.scratch[i],
                   sizeof(Event))
            self.ring_len += 1
        for s in range(self.scheduler.n_slots):
            self.pos_max_now[s] = self.engine.kv_pos_max(s)
        self.cells_used_now = self.engine.kv_cells()
        self.wake_pending = True
        self.mark = monotonic()
