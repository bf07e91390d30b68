# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The batch loop's mailbox and event ring: the node's side of the loop
(dgr._batch.BatchLoop extends Mailbox with the loop itself). Every call here holds
the GIL and the loop's mutex for microseconds at most."""

from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy

from dgr._codes cimport FINISH_CANCELLED, FINISH_PARKED
from dgr._parked cimport ParkedSamplers
from dgr._events cimport event_record
from dgr._kv_ops cimport OP_RESTORE, OP_SAVE
from dgr._pthread cimport (pthread_cond_broadcast, pthread_cond_destroy, pthread_cond_init,
                          pthread_cond_signal, pthread_cond_wait, pthread_mutex_destroy,
                          pthread_mutex_init, pthread_mutex_lock, pthread_mutex_unlock)


cdef class Mailbox:
    """How the node talks to its batch loop: a mailbox and an event ring, both under
    one mutex.

    - the node's requests (`start`, `credit`, `request_finish`, `stop`) change
      the slot table and wake the loop when it idles;
    - each step appends its events to a bounded ring (ring_steps steps' worth) and
      writes to `wake_fd` (an eventfd the node's Trio task waits on); `drain`
      takes them.

    KV changes the node asks for (a start that reuses cells of another slot's
    sequence or restores a saved state, a save, an eviction) are queued in a
    dgr._kv_ops.KvOperations and applied by the loop between steps; a save's
    bytes wait there until the node takes them (`take_saved`), within a bound
    of bytes (`set_save_bound`).
    """

    def __cinit__(self):
        self.sync_ready = False
        self.ring = NULL
        self.pos_max_now = NULL
        self.park_entry = NULL

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
        self.ring = <Event *> calloc(self.ring_cap, sizeof(Event))
        self.pos_max_now = <int *> malloc(scheduler.n_slots * sizeof(int))
        self.park_entry = <int *> calloc(scheduler.n_slots, sizeof(int))
        if self.ring == NULL or self.pos_max_now == NULL or self.park_entry == NULL:
            raise MemoryError()
        for s in range(scheduler.n_slots):
            self.pos_max_now[s] = -1
            self.park_entry[s] = -1
        self.kv_ops = KvOperations(engine, scheduler)
        self.parked = ParkedSamplers(engine.sampling, 0)
        self.adapters = Adapters(engine, scheduler.n_slots)
        self.adapters.loop_lock = &self.lock
        self.adapters.loop_wake = &self.wake
        pthread_mutex_init(&self.lock, NULL)
        pthread_cond_init(&self.wake, NULL)
        pthread_cond_init(&self.ops_room, NULL)
        self.sync_ready = True

    def __dealloc__(self):
        if self.sync_ready:
            pthread_cond_destroy(&self.wake)
            pthread_cond_destroy(&self.ops_room)
            pthread_mutex_destroy(&self.lock)
        free(self.ring)
        free(self.pos_max_now)
        free(self.park_entry)

    # ------------------------------------------------------------ the node's side (GIL held)

    def start(self, int slot, spec, *, int credits=1, int reuse_from=-1, int n_reused=0,
              bint keep_kv=False, bytes restore=None, int sampler_entry=-1,
              bint resume=False, bint park_when_full=False):
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
        entry); otherwise it is freed.

        `sampler_entry` (dgr._parked) is where the slot's sampler state goes when the
        session is parked: at `request_park`, or, with park_when_full, when llama.cpp
        finds no KV cells for its rows. With `resume`, the session was parked: its
        sampler state comes back from that entry, and its prompt is its own and
        what it generated."""
        if restore is not None and not (n_reused and len(restore)):
            raise ValueError("a restored state needs n_reused >= 1 and bytes")
        if restore is None and n_reused and not 0 <= reuse_from < self.scheduler.n_slots:
            raise ValueError(f"reuse_from {reuse_from} is not a slot")
        # The loop leaves a free slot's sampler alone, so it is set outside the lock.
        if resume and sampler_entry < 0:
            raise ValueError("a resumed session needs the sampler entry it parked into")
        if park_when_full and sampler_entry < 0:
            raise ValueError("a session parked when the pool is full needs a sampler entry")
        if resume:
            self.parked.resume(sampler_entry, slot)
        else:
            self.engine.sampling.configure(slot, spec.params)
        if spec.params.speculation != "off":
            self.engine.learn_words(spec.prompt)  # the values draft source's twins
        pthread_mutex_lock(&self.lock)
        try:
            self.adapters.want(slot, spec.adapter_scales)
            self.scheduler.start(slot, spec, credits, n_reused, keep_kv, park_when_full)
            self.park_entry[slot] = sampler_entry
            self.starts += 1
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

    def set_parked_entries(self, int n):
        """Room for n parked sessions' sampler states (before any session starts)."""
        self.parked = ParkedSamplers(self.engine.sampling, n)

    def drop_parked(self, int entry):
        """Free a parked entry's sampler state: its session left while parked (or
        while asked to park). The loop touches an entry only while it parks into it,
        before its EV_FINISH, which the node has seen by then."""
        self.parked.drop(entry)

    def request_park(self, int slot):
        """Park the slot's session before its next row: an EV_FINISH with reason
        FINISH_PARKED follows (unless the slot ends otherwise first), its KV kept as
        any ended slot's and its sampler state moved to the sampler entry it started
        with (dgr._parked; `start` with resume takes it back)."""
        pthread_mutex_lock(&self.lock)
        try:
            if self.park_entry[slot] < 0:
                raise ValueError(f"slot {slot}'s session has no sampler entry to park into")
            self.scheduler.request_finish(slot, FINISH_PARKED)
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
