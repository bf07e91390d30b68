# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The KV changes a batch loop applies between steps, in order, since llama.cpp's
KV cache may only change on its thread: a start's reuse of another sequence's
cells or of a saved state, an eviction, a save. A save's bytes wait here until
the node takes them, within a bound of bytes: a save beyond it is dropped (the
tiers are a cache; nothing waits on a save).

Not locked on its own: dgr._batch.BatchLoop calls it under its lock, and waits
for room when the queue is full.
"""

from libc.stdint cimport int64_t, uint8_t
from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy

from dgr._clock cimport monotonic
from dgr._scheduler cimport SLOT_PREFILL


cdef class SavesTaken:
    """Saves handed to the node: (ticket, bytes or None) records, built once the
    loop's lock is let go."""

    def __cinit__(self):
        self.ticket = NULL
        self.data = NULL
        self.size = NULL

    def __dealloc__(self):
        if self.data != NULL:
            for i in range(self.n):
                free(self.data[i])
        free(self.ticket); free(self.data); free(self.size)

    def records(self):
        return [(self.ticket[i], None if self.data[i] == NULL
                 else (<char *> self.data[i])[:self.size[i]]) for i in range(self.n)]


cdef class KvOperations:
    """A bounded queue of KV operations and the saves held for the node."""

    def __cinit__(self):
        self.op_slot = self.op_src = self.op_keep = NULL
        self.op_state = NULL
        self.op_state_len = NULL
        self.saved_ticket = NULL
        self.saved_data = NULL
        self.saved_len = NULL

    def __init__(self, Engine engine, Scheduler scheduler):
        self.engine = engine
        self.scheduler = scheduler
        # a start and an eviction or two per slot between two loop iterations; more
        # waits for the loop
        self.capacity = 4 * scheduler.n_slots + 4
        self.op_slot = <int *> calloc(self.capacity, sizeof(int))
        self.op_src = <int *> calloc(self.capacity, sizeof(int))
        self.op_keep = <int *> calloc(self.capacity, sizeof(int))
        self.op_state = <const uint8_t **> calloc(self.capacity, sizeof(uint8_t *))
        self.op_state_len = <size_t *> calloc(self.capacity, sizeof(size_t))
        self.saved_ticket = <int64_t *> calloc(self.capacity, sizeof(int64_t))
        self.saved_data = <uint8_t **> calloc(self.capacity, sizeof(uint8_t *))
        self.saved_len = <size_t *> calloc(self.capacity, sizeof(size_t))
        if (self.op_slot == NULL or self.op_src == NULL or self.op_keep == NULL
                or self.op_state == NULL or self.op_state_len == NULL
                or self.saved_ticket == NULL or self.saved_data == NULL
                or self.saved_len == NULL):
            raise MemoryError()
        self.states = {}

    def __dealloc__(self):
        free(self.op_slot); free(self.op_src); free(self.op_keep)
        free(self.op_state); free(self.op_state_len)
        if self.saved_data != NULL:
            for i in range(self.n_saved):
                free(self.saved_data[i])
        free(self.saved_ticket); free(self.saved_data); free(self.saved_len)

    cdef bint full(self) noexcept nogil:
        return self.n_ops == self.capacity

    cdef void push(self, int slot, int src, int keep, bytes state) except *:
        """Queue an operation (there is room): a slot's sequence keeps positions
        [0, keep) of src's (see apply), or a save (src OP_SAVE)."""
        cdef int i = self.n_ops
        self.op_slot[i] = slot
        self.op_src[i] = src
        self.op_keep[i] = keep
        self.op_state[i] = NULL
        self.op_state_len[i] = 0
        self.n_ops += 1
        self.queued += 1
        if state is not None:
            self.states[self.queued] = state
            self.op_state[i] = <const uint8_t *> (<const char *> state)
            self.op_state_len[i] = len(state)

    cdef int apply(self) noexcept nogil:
        """The queued operations, in order: a slot's sequence keeps positions
        [0, keep) of its own (src == slot), of another slot's (src: copied, which
        in a unified cache only adds the sequence to those cells), of a saved
        state (OP_RESTORE) or nothing (src == -1, keep == 0: an eviction); or
        what it holds is saved (OP_SAVE). Returns how many were applied."""
        cdef int i, s, src, keep, n
        cdef int64_t first = self.queued - self.n_ops
        for i in range(self.n_ops):
            s, src, keep = self.op_slot[i], self.op_src[i], self.op_keep[i]
            if src == OP_SAVE:
                self._save(s, first + i + 1)
                continue
            if src == OP_RESTORE:
                self._restore(s, self.op_state[i], self.op_state_len[i])
                self.engine.kv_keep(s, keep)
            elif src >= 0 and src != s:
                self.engine.kv_copy(src, s, keep)
            else:
                self.engine.kv_keep(s, keep)
            if keep > 0 and not self.engine.kv_holds(s, keep):
                # the sequence lacks positions the node counted on (a bug, never expected):
                # prefill the whole prompt rather than compute on missing KV
                self.engine.kv_keep(s, 0)
                if self.scheduler.slots[s].phase == SLOT_PREFILL:
                    self.scheduler.slots[s].n_prefilled = 0
        n, self.n_ops = self.n_ops, 0
        return n

    cdef void _save(self, int slot, int64_t ticket) noexcept nogil:
        """The slot's state into a buffer the node takes (take_saves); dropped (bytes
        NULL) when it would pass the save bound or llama.cpp cannot save it."""
        cdef double t0 = monotonic()
        cdef size_t size = self.engine.kv_state_size(slot)
        cdef uint8_t * data = NULL
        if self.n_saved == self.capacity:
            # the node has not taken the saves before it: this one is dropped (a
            # ticket take_saves' count has passed without its bytes is forgotten)
            self.saves_dropped += 1
            return
        if size and self.saved_bytes + size <= self.save_bound:
            data = <uint8_t *> malloc(size)
        if data != NULL:
            size = self.engine.kv_save(slot, data, size)
            if size == 0:
                free(data)
                data = NULL
        if data == NULL:
            self.saves_dropped += 1
            size = 0
        else:
            self.saves += 1
            self.saved_bytes += size
        self.saved_ticket[self.n_saved] = ticket
        self.saved_data[self.n_saved] = data
        self.saved_len[self.n_saved] = size
        self.n_saved += 1
        self.save_s += monotonic() - t0

    cdef void _restore(self, int slot, const uint8_t * state, size_t size) noexcept nogil:
        cdef double t0 = monotonic()
        if self.engine.kv_restore(slot, state, size):
            self.restores += 1
        else:
            self.restores_failed += 1
        self.restore_s += monotonic() - t0

    cdef bint move(self, int slot) noexcept nogil:
        """The slot's sequence saved, removed and restored: in an ordered pool the
        restore places it anew, in the lowest cells that keep it in order, so cells
        that ended sessions freed below it serve it again. Its bits are unchanged (the
        same KV, in the same order). False if llama.cpp could not (the sequence then
        holds what it held if the save failed, else nothing)."""
        cdef double t0 = monotonic()
        cdef size_t size = self.engine.kv_state_size(slot)
        cdef uint8_t * data = <uint8_t *> malloc(size) if size else NULL
        cdef bint moved = False
        if data != NULL:
            size = self.engine.kv_save(slot, data, size)
            moved = size != 0 and self.engine.kv_restore(slot, data, size)
            free(data)
        self.moves += 1
        self.moves_failed += not moved
        self.move_s += monotonic() - t0
        return moved

    cdef SavesTaken take_saves(self):
        """The saves done so far, handed over (their buffers go with them), with the
        count of operations published; the states of restores published are let go."""
        cdef SavesTaken taken = SavesTaken()
        cdef int n = self.n_saved
        taken.done = self.published
        taken.ticket = <int64_t *> malloc(max(n, 1) * sizeof(int64_t))
        taken.data = <uint8_t **> malloc(max(n, 1) * sizeof(uint8_t *))
        taken.size = <size_t *> malloc(max(n, 1) * sizeof(size_t))
        if taken.ticket == NULL or taken.data == NULL or taken.size == NULL:
            raise MemoryError()
        memcpy(taken.ticket, self.saved_ticket, n * sizeof(int64_t))
        memcpy(taken.data, self.saved_data, n * sizeof(uint8_t *))
        memcpy(taken.size, self.saved_len, n * sizeof(size_t))
        taken.n = n
        self.n_saved = 0
        self.saved_bytes = 0
        for ticket in [t for t in self.states if t <= taken.done]:
            del self.states[ticket]
        return taken

    def figures(self):
        """Saves, restores and moves done: counts, seconds and drops."""
        return {"saves": self.saves, "saves_dropped": self.saves_dropped,
                "save_s": self.save_s, "restores": self.restores,
                "restores_failed": self.restores_failed, "restore_s": self.restore_s,
                "moves": self.moves, "moves_failed": self.moves_failed, "move_s": self.move_s}

    def statistics(self):
        """Its bounds in use: the queued operations, the saves held (entries, bytes)."""
        return {"kv_operations": {"used": self.n_ops, "capacity": self.capacity},
                "saves_held": {"used": self.n_saved, "capacity": self.capacity,
                               "bytes": self.saved_bytes, "bytes_bound": self.save_bound}}
