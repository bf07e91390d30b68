# LoRa adapters on the engine's model, applied per sequence (dgr/_adapters.pyx). The
# batch loop sets each slot's adapters at its start, clears them at its end and applies
# the table between steps, all under its own lock.

from dgr._codes cimport MAX_ADAPTERS
from dgr._engine cimport Engine
from dgr._llama cimport llama_adapter_lora
from dgr._pthread cimport pthread_cond_t, pthread_mutex_t


cdef class Adapters:
    cdef Engine engine
    cdef pthread_mutex_t * loop_lock  # the batch loop's: guards every table below
    cdef pthread_cond_t * loop_wake   # the batch loop's: an idle loop wakes to free one
    cdef int n_slots
    cdef llama_adapter_lora * loaded[MAX_ADAPTERS]  # by index; NULL: a free entry
    cdef bint retiring[MAX_ADAPTERS]  # unloaded: freed once no longer listed
    cdef bint listed[MAX_ADAPTERS]    # in the context's per-sequence list
    cdef float * wanted               # [slot * MAX_ADAPTERS + index]: the slot's scale
    cdef bint dirty                   # wanted or retiring changed since the last apply
    cdef readonly long long relists   # times the context's list changed

    cdef void _free_adapter(self, llama_adapter_lora * adapter) noexcept nogil
    cdef void want(self, int slot, tuple adapters) except *
    cdef void clear(self, int slot) noexcept nogil
    cdef void apply(self) noexcept nogil
