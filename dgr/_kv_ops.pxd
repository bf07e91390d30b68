# The KV changes a batch loop applies between steps, and the saves it holds for
# the node (dgr/_kv_ops.pyx).

from libc.stdint cimport int64_t, uint8_t

from dgr._engine cimport Engine
from dgr._scheduler cimport Scheduler

# An operation's source beyond slots (see KvOperations.apply)
cdef enum:
    OP_SAVE = -2
    OP_RESTORE = -3


cdef class SavesTaken:
    cdef int64_t done
    cdef int n
    cdef int64_t * ticket
    cdef uint8_t ** data
    cdef size_t * size


cdef class KvOperations:
    cdef Engine engine
    cdef Scheduler scheduler
    cdef int capacity
    cdef int n_ops                  # queued, not applied yet
    cdef int * op_slot
    cdef int * op_src
    cdef int * op_keep
    cdef const uint8_t ** op_state  # OP_RESTORE: the state's bytes (held alive in `states`)
    cdef size_t * op_state_len
    cdef dict states                # ticket -> bytes of a queued restore, until applied
    cdef int64_t queued             # asked for so far; an operation's ticket is its number
    cdef int64_t published          # applied and published with a step's events
    cdef int n_saved                # saves done that the node has not taken yet
    cdef int64_t * saved_ticket
    cdef uint8_t ** saved_data
    cdef size_t * saved_len
    cdef size_t saved_bytes, save_bound
    cdef int64_t saves, saves_dropped, restores, restores_failed
    cdef double save_s, restore_s
    cdef int64_t moves, moves_failed   # sequences moved to cells in order (move)
    cdef double move_s

    cdef bint full(self) noexcept nogil
    cdef void push(self, int slot, int src, int keep, bytes state) except *
    cdef int apply(self) noexcept nogil
    cdef void _save(self, int slot, int64_t ticket) noexcept nogil
    cdef void _restore(self, int slot, const uint8_t * state, size_t size) noexcept nogil
    cdef bint move(self, int slot) noexcept nogil
    cdef SavesTaken take_saves(self)
