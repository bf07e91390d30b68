# The batch loop's mailbox and event ring: the node's side of the loop
# (dgr/_mailbox.pyx; the loop itself, dgr/_batch.pyx, extends it).

from libc.stdint cimport int64_t

from dgr._adapters cimport Adapters
from dgr._engine cimport Engine
from dgr._events cimport Event
from dgr._kv_ops cimport KvOperations
from dgr._parked cimport ParkedSamplers
from dgr._pthread cimport pthread_cond_t, pthread_mutex_t
from dgr._scheduler cimport Scheduler


cdef class Mailbox:
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
    cdef int step_cap               # a step's most events
    cdef int cells_used_now         # the KV as the last published step left it
    cdef int64_t starts             # sessions started so far (a park's handoff awaits one)
    cdef int * pos_max_now
    cdef int * park_entry            # per slot: where its session's sampler state goes when
                                     # it is parked (-1: none)
    cdef ParkedSamplers parked       # parked sessions' sampler states (`set_parked_entries`)
    cdef KvOperations kv_ops
    cdef readonly Adapters adapters  # the LoRa adapters each slot applies

    cdef void _queue_kv_op(self, int slot, int src, int keep, bytes state=*) except *
