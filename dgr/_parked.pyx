# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Parked sessions' sampler states. A session parked for one that outranks it
(dgr.admission) gives its slot up; its slot's whole sampler state (the llama.cpp
chain with its random state, the grammar, the bans and the tokens counted for
min_tokens) moves into an entry here, and moves back into whichever slot it
resumes on: the session draws exactly what it would have drawn unparked.

The batch loop parks into an entry (`park`, without the GIL, as it ends the slot,
before its EV_FINISH is published); the node resumes from it (`resume`, before the
start that resumes the session reaches the loop) or frees it (`drop`). The node
hands out the entries, so no two sessions share one."""

from libc.stdlib cimport calloc, free, malloc
from libc.string cimport memcpy

from dgr._llama cimport llama_sampler_free


cdef class ParkedSamplers:
    """n entries over `sampling`'s slots."""

    def __cinit__(self, Sampling sampling not None, int n):
        self.sampling = sampling
        if n <= 0:
            return
        self.entries = <ParkedSampler *> calloc(n, sizeof(ParkedSampler))
        self.bans = <llama_logit_bias *> malloc(
            <size_t> n * sampling.ban_stride * sizeof(llama_logit_bias))
        if self.entries == NULL or self.bans == NULL:
            free(self.entries)
            free(self.bans)
            self.entries = NULL
            self.bans = NULL
            raise MemoryError()
        self.n_entries = n

    def __dealloc__(self):
        for entry in range(self.n_entries):
            self.drop(entry)
        free(self.entries)
        free(self.bans)

    cdef void park(self, int slot, int entry) noexcept nogil:
        """The slot's session is parked: its sampler state moves to `entry`; the slot
        holds none until it is configured again."""
        cdef ParkedSampler * p = &self.entries[entry]
        cdef int stride = self.sampling.ban_stride
        p.chain, p.grammar = self.sampling.chains[slot], self.sampling.grammars[slot]
        p.greedy, p.repick = self.sampling.greedy[slot], self.sampling.repick[slot]
        p.n_bans = self.sampling.n_bans[slot]
        p.n_bans_always = self.sampling.n_bans_always[slot]
        p.ban_until, p.sampled_n = self.sampling.ban_until[slot], self.sampling.sampled_n[slot]
        memcpy(self.bans + entry * stride, self.sampling.bans + slot * stride,
               stride * sizeof(llama_logit_bias))
        self.sampling.chains[slot] = NULL
        self.sampling.grammars[slot] = NULL

    def resume(self, int entry, int slot):
        """The session parked in `entry` resumes on `slot` (free): its sampler state
        becomes the slot's, as it was."""
        cdef Sampling s = self.sampling
        if not 0 <= entry < self.n_entries or self.entries[entry].chain == NULL:
            raise ValueError(f"parked entry {entry} holds no sampler state")
        if not 0 <= slot < s.n_slots:
            raise ValueError(f"sequence slot {slot} out of range 0..{s.n_slots - 1}")
        cdef ParkedSampler * p = &self.entries[entry]
        if s.chains[slot] != NULL:
            llama_sampler_free(s.chains[slot])
        if s.grammars[slot] != NULL:
            llama_sampler_free(s.grammars[slot])
        s.chains[slot], s.grammars[slot] = p.chain, p.grammar
        s.greedy[slot], s.repick[slot] = p.greedy, p.repick
        s.n_bans[slot], s.n_bans_always[slot] = p.n_bans, p.n_bans_always
        s.ban_until[slot], s.sampled_n[slot] = p.ban_until, p.sampled_n
        memcpy(s.bans + slot * s.ban_stride, self.bans + entry * s.ban_stride,
               s.ban_stride * sizeof(llama_logit_bias))
        p.chain = p.grammar = NULL

    def drop(self, int entry):
        """Free what `entry` holds (its session left parked, or before it parked)."""
        if not 0 <= entry < self.n_entries:
            return
        cdef ParkedSampler * p = &self.entries[entry]
        if p.chain != NULL:
            llama_sampler_free(p.chain)
        if p.grammar != NULL:
            llama_sampler_free(p.grammar)
        p.chain = p.grammar = NULL
