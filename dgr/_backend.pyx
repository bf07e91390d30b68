# cython: language_level=3
"""llama.cpp's process-wide state: its backends, initialized once, and its log,
kept in one buffer (dgr/csrc/dgr_log.c) whose error lines explain what llama.cpp
refused. The engine (dgr._engine) and the RPC side (dgr._rpc) both start here."""

import os

from dgr._llama cimport *

cdef extern from "dgr_log.h" nogil:
    int dgr_log_echo
    void dgr_log_sink(ggml_log_level level, const char * text, void * user_data) noexcept
    void dgr_log_clear() noexcept
    size_t dgr_log_copy(char * out, size_t cap) noexcept

cdef bint _backend_ready = False


cdef void init_backend() except *:
    """llama.cpp's backends and dgr's log sink, once per process."""
    global _backend_ready, dgr_log_echo
    if not _backend_ready:
        dgr_log_echo = 1 if os.environ.get("DGR_LLAMA_LOG") else 0
        llama_log_set(dgr_log_sink, NULL)
        llama_backend_init()
        _backend_ready = True


cdef void clear_log() noexcept nogil:
    """Forget the log so far (before a call whose log lines are read)."""
    dgr_log_clear()


def llama_log_text():
    """The most recent llama.cpp log text, debug lines left out (up to 256 KiB)."""
    cdef bytes buf = bytes(1 << 18)
    cdef size_t n = dgr_log_copy(buf, len(buf))
    return buf[:n].decode("utf-8", "replace")


cdef str error_lines(int limit=4):
    """The last error lines of llama.cpp's log, joined."""
    lines = [line.strip() for line in llama_log_text().splitlines()
             if "error" in line.lower() or "failed" in line.lower() or "invalid" in line.lower()]
    return "; ".join(lines[-limit:])


def system_info():
    """llama.cpp's system info: the CPU features its kernels use."""
    init_backend()
    return llama_print_system_info().decode("utf-8", "replace")
