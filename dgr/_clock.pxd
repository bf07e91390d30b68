# The engine thread's clock: CLOCK_MONOTONIC in seconds (= Python's time.monotonic()).

from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec


cdef inline double monotonic() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9
