# Parked sessions' sampler states (dgr/_parked.pyx): what a slot's sampling held,
# kept while its session waits to resume on another slot.

from dgr._llama cimport llama_logit_bias, llama_sampler
from dgr._sampling cimport Sampling


cdef struct ParkedSampler:
    llama_sampler * chain               # the chain and its random state, as the slot had them
    llama_sampler * grammar
    char greedy
    char repick
    int n_bans
    int n_bans_always
    int ban_until
    int sampled_n


cdef class ParkedSamplers:
    cdef Sampling sampling
    cdef ParkedSampler * entries
    cdef llama_logit_bias * bans        # each entry's bans, sampling.ban_stride apart
    cdef readonly int n_entries

    cdef void park(self, int slot, int entry) noexcept nogil
