# cython: language_level=3, boundscheck=False, wraparound=False
"""LoRa adapters on the engine's model, each slot's own (patches 0018 and 0023).

llama.cpp lists the adapters it applies per sequence (llama_set_adapters_lora_seq) and
gives each sequence a scale of each (llama_set_adapter_lora_seq_scale); a row computes
the products of its own sequence's adapters only, the same steps whatever its batch, so
a listed adapter no row takes costs nothing. Here: the loaded adapters by index, the
scales each slot wants, and `apply`, which the batch loop runs between steps on the
engine thread: it lists the loaded adapters (a changed list makes llama.cpp reserve its
graph anew, so the list follows loads, not use), sets every slot's scales, and frees the
adapters unloaded.

Loading an adapter registers it on the model, which llama.cpp reads when it sizes a
graph: loads and frees hold the engine's model_lock, as llama_decode does.
"""

import os

from libc.stdlib cimport calloc, free

from dgr._backend cimport clear_log, error_lines
from dgr._llama cimport (llama_adapter_get_alora_n_invocation_tokens, llama_adapter_lora_free,
                        llama_adapter_lora_init, llama_set_adapter_lora_seq_scale,
                        llama_set_adapters_lora_seq)
from dgr._pthread cimport (pthread_cond_signal, pthread_mutex_lock, pthread_mutex_trylock,
                          pthread_mutex_unlock)

from dgr.errors import AdapterError


cdef class Adapters:
    """The adapters loaded on one engine (at most MAX_ADAPTERS) and each slot's scales."""

    def __cinit__(self):
        self.wanted = NULL

    def __init__(self, Engine engine, int n_slots):
        self.engine = engine
        self.n_slots = n_slots
        self.wanted = <float *> calloc(n_slots * MAX_ADAPTERS, sizeof(float))
        if self.wanted == NULL:
            raise MemoryError()

    def __dealloc__(self):
        # adapters still loaded go with the model (llama.cpp frees those registered on it)
        free(self.wanted)

    def load(self, path) -> int:
        """Load a LoRa GGUF file onto the model; its index. On any thread but the
        engine's; it waits for the llama_decode in flight. An AdapterError says why
        llama.cpp refused the file."""
        cdef bytes encoded = os.fsencode(path)
        cdef const char * cpath = encoded
        cdef llama_adapter_lora * adapter
        cdef int index = -1, i
        with nogil:
            pthread_mutex_lock(&self.engine.model_lock)
            clear_log()
            adapter = llama_adapter_lora_init(self.engine.model, cpath)
            pthread_mutex_unlock(&self.engine.model_lock)
        if adapter == NULL:
            raise AdapterError(f"llama.cpp refused the adapter {os.fspath(path)}: "
                               f"{error_lines() or 'no reason given'}")
        if llama_adapter_get_alora_n_invocation_tokens(adapter) > 0:
            self._free_adapter(adapter)
            raise AdapterError("activated LoRa adapters (alora invocation tokens) are not "
                               "supported")
        pthread_mutex_lock(self.loop_lock)
        for i in range(MAX_ADAPTERS):
            if self.loaded[i] == NULL:
                self.loaded[i] = adapter
                index = i
                self.dirty = True  # listed before the next step
                break
        pthread_mutex_unlock(self.loop_lock)
        if index < 0:
            self._free_adapter(adapter)
            raise AdapterError(f"{MAX_ADAPTERS} adapters are loaded, the most a node holds")
        return index

    cdef void _free_adapter(self, llama_adapter_lora * adapter) noexcept nogil:
        pthread_mutex_lock(&self.engine.model_lock)
        llama_adapter_lora_free(adapter)
        pthread_mutex_unlock(&self.engine.model_lock)

    def retire(self, int index):
        """The adapter at `index` is unloaded: no session wants it now or later. It is
        freed between steps (an idle loop wakes for it)."""
        if not 0 <= index < MAX_ADAPTERS:
            raise ValueError(f"adapter index {index} out of range")
        pthread_mutex_lock(self.loop_lock)
        self.retiring[index] = self.loaded[index] != NULL
        self.dirty = True
        pthread_cond_signal(self.loop_wake)
        pthread_mutex_unlock(self.loop_lock)

    def state(self) -> dict:
        """Loaded and listed indices, and how often the list changed."""
        pthread_mutex_lock(self.loop_lock)
        try:
            return {"loaded": [i for i in range(MAX_ADAPTERS) if self.loaded[i] != NULL],
                    "listed": [i for i in range(MAX_ADAPTERS) if self.listed[i]],
                    "relists": self.relists}
        finally:
            pthread_mutex_unlock(self.loop_lock)

    cdef void want(self, int slot, tuple adapters) except *:
        """The slot's scales from now: ((index, scale), ...); the others 0. Loop lock held."""
        cdef int index
        self.clear(slot)
        for index, scale in adapters:
            if not 0 <= index < MAX_ADAPTERS or self.loaded[index] == NULL:
                raise ValueError(f"no adapter is loaded at index {index}")
            self.wanted[slot * MAX_ADAPTERS + index] = scale
            self.dirty = True

    cdef void clear(self, int slot) noexcept nogil:
        """The slot wants no adapter (its session ended). Loop lock held."""
        cdef int i
        cdef float * row = self.wanted + slot * MAX_ADAPTERS
        for i in range(MAX_ADAPTERS):
            if row[i] != 0.0:
                row[i] = 0.0
                self.dirty = True

    cdef void apply(self) noexcept nogil:
        """Between steps, on the engine thread, loop lock held: the context lists
        the loaded adapters and every slot has its scales; adapters retiring are
        unlisted and freed."""
        cdef llama_adapter_lora * chosen[MAX_ADAPTERS]
        cdef int i, s, n = 0
        cdef bint need, changed = False
        if not self.dirty:
            return
        self.dirty = False
        for i in range(MAX_ADAPTERS):
            need = self.loaded[i] != NULL and not self.retiring[i]
            changed = changed or need != self.listed[i]
            self.listed[i] = need
            if need:
                chosen[n] = self.loaded[i]
                n += 1
        if changed:
            llama_set_adapters_lora_seq(self.engine.ctx, chosen, n)
            self.relists += 1
        for i in range(MAX_ADAPTERS):
            if self.listed[i]:
                for s in range(self.n_slots):
                    llama_set_adapter_lora_seq_scale(self.engine.ctx, self.loaded[i], s,
                                                     self.wanted[s * MAX_ADAPTERS + i])
            elif self.retiring[i]:
                # a load holds the model lock for as long as it reads its file: the free
                # waits for a later step rather than hold the loop's lock meanwhile
                if pthread_mutex_trylock(&self.engine.model_lock) != 0:
                    self.dirty = True
                    continue
                llama_adapter_lora_free(self.loaded[i])
                pthread_mutex_unlock(&self.engine.model_lock)
                self.loaded[i] = NULL
                self.retiring[i] = False
