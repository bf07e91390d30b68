# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The batch loop: steps every session of a node on the engine thread, without
the GIL and without waiting for Trio between steps. It reaches the engine (the
call, KV operations, sampling) only through dgr/_engine.pxd and the step policy
only through dgr/_scheduler.pxd.
"""

from libc.stdint cimport int8_t, int32_t, int64_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy, memset
from posix.unistd cimport write

from dgr._codes cimport (ENGINE_FAULT, EV_FINISH, EV_STEP, FAULT_RAISE, FINISH_CANCELLED,
                        KV_MOVE_FAILED, MAX_LOGPROBS, STATE_ROLLBACK_FAILED,
                        WANT_CHAIN, WANT_LOGPROBS, WANT_SAMPLE, WANT_SCORE)
from dgr._adapters cimport Adapters
from dgr._clock cimport monotonic
from dgr._engine cimport Engine
from dgr._events cimport Event, StepFigures, event_record
from dgr._kv_ops cimport OP_RESTORE, OP_SAVE, KvOperations
from dgr._pthread cimport (pthread_cond_broadcast, pthread_cond_destroy, pthread_cond_init,
                          pthread_cond_signal, pthread_cond_t, pthread_cond_wait,
                          pthread_mutex_destroy, pthread_mutex_init, pthread_mutex_lock,
                          pthread_mutex_t, pthread_mutex_unlock)
from dgr._scheduler cimport SLOT_DECODE, Scheduler, Slot


cdef class BatchLoop:
    """The batch-assembly loop: steps every session of a node, on the engine
    thread, without the GIL and without waiting for Trio between steps.

    The node talks to it through a mailbox and an event ring, both under one
    mutex held only for microseconds:

    - the node's requests (`start`, `credit`, `request_finish`, `stop`) change
      the slot table and wake the loop when it idles;
    - each step (module doc of dgr._scheduler: plan, one llama_decode for the
      decode rows and one per prefill chunk, sampling, post-step update)
      appends its events to a bounded ring and writes to `wake_fd` (an
      eventfd the node's Trio task waits on); `drain` takes them.

    The loop keeps stepping while it has rows to run and room in the ring for
    one more step's events; a full ring (the node fell behind) stops it until
    the node drains, so nothing between the two grows without bound. Ended
    slots' KV cells are freed before their EV_FINISH is published, but for
    what a slot was told to keep (a prefix cache entry).

    KV changes the node asks for (a start that reuses cells of another slot's
    sequence or restores a saved state, a save, an eviction) are queued in a
    dgr._kv_ops.KvOperations and applied by the loop between steps; a save's
    bytes wait there until the node takes them (`take_saved`), within a bound
    of bytes (`set_save_bound`).
    """

    cdef Engine engine
    cdef readonly Scheduler scheduler
    cdef pthread_mutex_t lock
    cdef pthread_cond_t wake
    cdef pthread_cond_t ops_room
    cdef bint stopping
    cdef bint sync_ready
    cdef bint wake_pending          # events published that the node has not been woken for
    cdef int wake_fd
    cdef Event * ring
    cdef int ring_cap, ring_head, ring_len
    cdef Event * scratch
    cdef int step_cap
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
    cdef int cells_used_now
    cdef int * pos_max_now
    cdef KvOperations kv_ops
    cdef readonly Adapters adapters  # the LoRa adapters each slot applies

    def __cinit__(self):
        self.sync_ready = False
        self.ring = self.scratch = NULL
        self.row_tok = self.row_pos = self.row_seq = self.sampled = self.top_ids = NULL
        self.row_want = NULL
        self.row_next = NULL
        self.chosen_lp = self.top_lp = NULL
        self.call_rc = self.pos_max_now = NULL

    def __init__(self, Engine engine, Scheduler scheduler, int wake_fd, int ring_steps=32):
        engine.check_open()
        if scheduler.n_slots != engine.n_slots or scheduler.token_budget > engine.batch_capacity:
            raise ValueError("the scheduler's slots and token budget must fit the engine's "
                             f"({engine.n_slots} slots, n_batch {engine.batch_capacity})")
        self.engine = engine
        self.scheduler = scheduler
        self.wake_fd = wake_fd
        self.step_cap = scheduler.max_step_events()
        self.ring_cap = ring_steps * self.step_cap
        cdef int rows = scheduler.token_budget
        self.ring = <Event *> calloc(self.ring_cap, sizeof(Event))
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
        self.pos_max_now = <int *> malloc(scheduler.n_slots * sizeof(int))
        self.kv_ops = KvOperations(engine, scheduler)
        self.adapters = Adapters(engine, scheduler.n_slots)
        self.adapters.loop_lock = &self.lock
        self.adapters.loop_wake = &self.wake
        if (self.ring == NULL or self.scratch == NULL or self.row_tok == NULL
                or self.row_pos == NULL or self.row_seq == NULL or self.row_want == NULL
                or self.row_next == NULL
                or self.sampled == NULL or self.chosen_lp == NULL or self.top_ids == NULL
                or self.top_lp == NULL or self.call_rc == NULL or self.pos_max_now == NULL):
            raise MemoryError()
        for s in range(scheduler.n_slots):
            self.pos_max_now[s] = -1
        pthread_mutex_init(&self.lock, NULL)
        pthread_cond_init(&self.wake, NULL)
        pthread_cond_init(&self.ops_room, NULL)
        self.sync_ready = True

    def __dealloc__(self):
        if self.sync_ready:
            pthread_cond_destroy(&self.wake)
            pthread_cond_destroy(&self.ops_room)
            pthread_mutex_destroy(&self.lock)
        free(self.ring); free(self.scratch)
        free(self.row_tok); free(self.row_pos); free(self.row_seq); free(self.row_want)
        free(self.row_next)
        free(self.sampled); free(self.chosen_lp); free(self.top_ids); free(self.top_lp)
        free(self.call_rc); free(self.pos_max_now)

    # ------------------------------------------------------------ the node's side (GIL held)

    def start(self, int slot, spec, *, int credits=1, int reuse_from=-1, int n_reused=0,
              bint keep_kv=False, bytes restore=None):
        """Run a session on a free slot (one whose EV_FINISH the node has seen), as
        its SessionSpec `spec` asks (dgr.spec): its prompt and its sampling
        parameters, max_tokens and speculation mode among them.

        The slot's sequence first drops what it holds (a cache entry), but for
        the KV of prompt positions [0, n_reused) taken from slot `reuse_from`'s
        sequence (its own when reuse_from == slot): a shared prefix, which the
        session then does not prefill. With `restore` (a state from `save` or
        dgr.kv_tier, of a sequence whose tokens begin with the prompt's first
        n_reused) the sequence becomes that state, cut to [0, n_reused), instead;
        if llama.cpp refuses it, the session prefills its whole prompt. With
        keep_kv, when the session ends (but with an error) its sequence keeps its
        KV: the prompt it prefilled and the tokens it fed back (a prefix cache
        entry); otherwise it is freed."""
        if restore is not None and not (n_reused and len(restore)):
            raise ValueError("a restored state needs n_reused >= 1 and bytes")
        if restore is None and n_reused and not 0 <= reuse_from < self.scheduler.n_slots:
            raise ValueError(f"reuse_from {reuse_from} is not a slot")
        # The loop leaves a free slot's sampler alone, so it is set outside the lock.
        self.engine.sampling.configure(slot, spec.params)
        if spec.params.speculation != "off":
            self.engine.learn_words(spec.prompt)  # the values draft source's twins
        pthread_mutex_lock(&self.lock)
        try:
            self.adapters.want(slot, spec.adapter_scales)
            self.scheduler.start(slot, spec, credits, n_reused, keep_kv)
            if restore is not None:
                self._queue_kv_op(slot, OP_RESTORE, n_reused, restore)
            else:
                self._queue_kv_op(slot, reuse_from if n_reused else -1, n_reused)
            pthread_cond_signal(&self.wake)
        finally:
            pthread_mutex_unlock(&self.lock)

    def evict(self, int slot):
        """Drop what a free slot's sequence holds (a prefix cache entry)."""
        if not 0 <= slot < self.scheduler.n_slots:
            raise ValueError(f"slot {slot} out of range")
        pthread_mutex_lock(&self.lock)
        try:
            self._queue_kv_op(slot, -1, 0)
            pthread_cond_signal(&self.wake)
        finally:
            pthread_mutex_unlock(&self.lock)

    def save(self, int slot):
        """Save what a free slot's sequence holds (it keeps it); returns the save's
        ticket, which `take_saved` gives with its bytes once the loop has saved it."""
        if not 0 <= slot < self.scheduler.n_slots:
            raise ValueError(f"slot {slot} out of range")
        pthread_mutex_lock(&self.lock)
        try:
            self._queue_kv_op(slot, OP_SAVE, 0)
            pthread_cond_signal(&self.wake)
            return self.kv_ops.queued
        finally:
            pthread_mutex_unlock(&self.lock)

    def set_save_bound(self, size_t nbytes):
        """Bytes of saves the loop may hold for the node; a save beyond them is dropped."""
        pthread_mutex_lock(&self.lock)
        self.kv_ops.save_bound = nbytes
        pthread_mutex_unlock(&self.lock)

    def take_saved(self):
        """(ops applied, [(ticket, bytes)]): the saves done since the last call (a
        dropped or failed save has bytes None or is left out: no save with a ticket
        up to `ops applied` comes later); the states of restores applied are let go."""
        pthread_mutex_lock(&self.lock)
        try:
            taken = self.kv_ops.take_saves()
        finally:
            pthread_mutex_unlock(&self.lock)
        return taken.done, taken.records()

    @property
    def tier_figures(self):
        """Saves, restores and moves done by the loop: counts, seconds and drops."""
        pthread_mutex_lock(&self.lock)
        try:
            return self.kv_ops.figures()
        finally:
            pthread_mutex_unlock(&self.lock)

    cdef void _queue_kv_op(self, int slot, int src, int keep, bytes state=None) except *:
        """Queue a KV change (lock held). A full queue (sessions started and cancelled
        faster than one step) waits for the loop to apply it."""
        while self.kv_ops.full() and not self.stopping:
            pthread_cond_signal(&self.wake)
            pthread_cond_wait(&self.ops_room, &self.lock)
        if self.kv_ops.full():
            raise RuntimeError("the batch loop stopped with KV changes queued")
        self.kv_ops.push(slot, src, keep, state)

    def statistics(self):
        """Its bounds in use, as Trio's channels report theirs: the event ring (events
        published, not yet drained), the queued KV operations, the saves held for the
        node (entries and bytes)."""
        pthread_mutex_lock(&self.lock)
        try:
            return {"event_ring": {"used": self.ring_len, "capacity": self.ring_cap},
                    **self.kv_ops.statistics()}
        finally:
            pthread_mutex_unlock(&self.lock)

    @property
    def kv_ops_queued(self):
        """KV changes asked for so far (starts and evictions)."""
        return self.kv_ops.queued

    @property
    def kv_ops_published(self):
        """KV changes applied by the loop and published (cells_used, pos_max show them)."""
        return self.kv_ops.published

    def set_step_time(self, double a, double b, double c, double e):
        """The node's model of its step times (dgr.step_time), for the scheduler's
        next plans (Scheduler.set_step_time)."""
        pthread_mutex_lock(&self.lock)
        try:
            self.scheduler.set_step_time(a, b, c, e)
        finally:
            pthread_mutex_unlock(&self.lock)

    def set_row_times(self, points):
        """Decode steps' seconds by output rows (dgr.step_time.RowTimes), for the
        speculation policy's next plans (Scheduler.set_row_times)."""
        pthread_mutex_lock(&self.lock)
        try:
            self.scheduler.set_row_times(points)
        finally:
            pthread_mutex_unlock(&self.lock)

    def credit(self, int slot, int n=1):
        """The slot's reader took n tokens; it may be sent n more."""
        pthread_mutex_lock(&self.lock)
        try:
            self.scheduler.credit(slot, n)
            pthread_cond_signal(&self.wake)
        finally:
            pthread_mutex_unlock(&self.lock)

    def request_finish(self, int slot, int reason=FINISH_CANCELLED):
        """End the slot before its next row; an EV_FINISH follows."""
        pthread_mutex_lock(&self.lock)
        try:
            self.scheduler.request_finish(slot, reason)
            pthread_cond_signal(&self.wake)
        finally:
            pthread_mutex_unlock(&self.lock)

    def stop(self):
        """Make run() return: after the step in flight, which the abort flag cuts short."""
        self.engine.request_abort()
        pthread_mutex_lock(&self.lock)
        self.stopping = True
        pthread_cond_signal(&self.wake)
        pthread_cond_broadcast(&self.ops_room)
        pthread_mutex_unlock(&self.lock)

    def drain(self):
        """The events published since the last drain, oldest first (as tuples, see
        typed records: dgr.events)."""
        cdef int n, i, first
        cdef Event * taken
        pthread_mutex_lock(&self.lock)
        n = self.ring_len
        taken = <Event *> malloc(max(n, 1) * sizeof(Event))
        if taken != NULL:
            for i in range(n):
                memcpy(&taken[i], &self.ring[(self.ring_head + i) % self.ring_cap], sizeof(Event))
            self.ring_head = (self.ring_head + n) % self.ring_cap
            self.ring_len = 0
            pthread_cond_signal(&self.wake)
        pthread_mutex_unlock(&self.lock)
        if taken == NULL:
            raise MemoryError()
        try:
            return [event_record(&taken[i]) for i in range(n)]
        finally:
            free(taken)

    @property
    def cells_used(self):
        """KV cells holding tokens after the last published step."""
        return self.cells_used_now

    def pos_max(self, int slot):
        """The slot's largest KV position after the last published step (-1: none)."""
        if not 0 <= slot < self.scheduler.n_slots:
            raise ValueError(f"slot {slot} out of range")
        return self.pos_max_now[slot]

    def run(self):
        """Step until stop(); call it on the engine thread (the GIL is released throughout)."""
        with nogil:
            self._run()

    # ------------------------------------------------------------ the loop (nogil)

    cdef void _run(self) noexcept nogil:
        cdef int n_events, rows, n_ops
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
            rows = self.scheduler.plan()
            if rows > 0:
                self._step(n_events)
                self.kv_ops.published += n_ops
                continue
            if n_events or n_ops:
                self._release_finished(n_events)
                self.kv_ops.published += n_ops
                self._publish(n_events)
                continue
            self._wake_node()
            pthread_cond_wait(&self.wake, &self.lock)
            self.mark = monotonic()
        self._wake_node()
        pthread_mutex_unlock(&self.lock)

    cdef void _wake_node(self) noexcept nogil:
        """Wake the node's pump for the events published since it was last woken.
        Done where the lock is about to be let go (before a wait, or just after the
        next step's rows are filled), so the pump does not wake only to block on
        the lock while the next step is planned."""
        cdef uint64_t one = 1
        if self.wake_pending:
            self.wake_pending = False
            write(self.wake_fd, &one, sizeof(one))

    cdef void _step(self, int n_events) noexcept nogil:
        """Run the planned step; entered and left with the lock held, which is
        released while llama.cpp runs."""
        cdef StepFigures figures
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
        n_events += self.scheduler.update(self.sampled, self.call_rc, self.chosen_lp, self.top_ids,
                              self.top_lp, self.scratch + n_events, &figures)
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
        """Ended slots: their samplers reset, their KV freed but for the positions
        the scheduler says they keep (a prefix cache entry), their adapters none."""
        cdef int i
        for i in range(n_events):
            if self.scratch[i].kind == EV_FINISH:
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
