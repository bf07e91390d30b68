# The vocabulary side of an engine (dgr/_vocab.pyx); dgr._engine.Engine extends it.

from dgr._llama cimport llama_model, llama_vocab


cdef class Vocabulary:
    cdef llama_model * model
    cdef const llama_vocab * vocab
    cdef int vocab_size
    cdef int tokenizing             # tokenize calls running without the GIL (close waits)
    cdef object word_kinds          # word_forms' arrays (None before its first call)
    cdef object word_twins

    cdef void check_open(self) except *
