# llama.cpp's process-wide state (dgr/_backend.pyx): its backends and its log.

cdef void init_backend() except *
cdef void clear_log() noexcept nogil
cdef str error_lines(int limit=*)
