# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""The dgr engine: one llama.cpp model and context, one reusable llama_batch,
one sampler chain per sequence slot.

`Engine.step` fills the batch from arrays, runs `llama_decode` and samples every
output row with that row's slot sampler, all without the GIL. The engine knows
nothing of Trio, HTTP or scheduling policy, and it is not thread-safe: one
caller at a time (the node's batch loop), but for the methods that only read
the vocabulary (tokenize, detokenize, token_to_piece, the chat template), which
the node calls beside the loop as llama-server's HTTP threads do beside its
decode loop. `tokenize` runs without the GIL, on any thread; `close` waits for it.
"""

import os
import re
import time

import numpy as np

cimport numpy as cnp
from libc.math cimport expf, logf, INFINITY
from libc.stdint cimport int8_t, int32_t, int64_t, uint32_t, uint64_t
from libc.stdlib cimport calloc, free, malloc
from cython.parallel cimport prange, threadid
from libc.string cimport memcpy, memset
from posix.time cimport CLOCK_MONOTONIC, clock_gettime, timespec
from posix.unistd cimport write

from dgr._llama cimport *
from dgr._scheduler cimport (EV_FINISH, EV_STEP, FINISH_CANCELLED, FINISH_ERROR, MAX_LOGPROBS,
                             SLOT_PREFILL, Event, Scheduler, Slot, StepFigures, event_tuple)
from dgr.errors import (ContextError, DecodeAborted, DecodeError, FatalDecodeError,
                        InvalidBatch, KVSlotUnavailable, ModelLoadError, WorkerLost)

cnp.import_array()

cdef extern from "<pthread.h>" nogil:
    ctypedef struct pthread_mutex_t:
        pass
    ctypedef struct pthread_cond_t:
        pass
    int pthread_mutex_init(pthread_mutex_t * mutex, void * attr)
    int pthread_mutex_destroy(pthread_mutex_t * mutex)
    int pthread_mutex_lock(pthread_mutex_t * mutex)
    int pthread_mutex_unlock(pthread_mutex_t * mutex)
    int pthread_cond_init(pthread_cond_t * cond, void * attr)
    int pthread_cond_destroy(pthread_cond_t * cond)
    int pthread_cond_wait(pthread_cond_t * cond, pthread_mutex_t * mutex)
    int pthread_cond_signal(pthread_cond_t * cond)
    int pthread_cond_broadcast(pthread_cond_t * cond)

cdef extern from *:
    """
    #include <pthread.h>
    #include <stdio.h>
    #include <string.h>
    #include "ggml-backend-impl.h"  /* the device struct (the pinned tree's), for dgr_cpu_offering */

    /* llama.cpp logs through one process-wide callback. dgr keeps the recent
       text in a buffer: model loading errors and buffer sizes are read from it. */
    #define DGR_LOG_CAP (1 << 18)
    static char dgr_log_buf[DGR_LOG_CAP];
    static size_t dgr_log_len = 0;
    static int dgr_log_echo = 0;
    static pthread_mutex_t dgr_log_lock = PTHREAD_MUTEX_INITIALIZER;

    static void dgr_log_sink(enum ggml_log_level level, const char *text, void *user_data) {
        (void)user_data;
        size_t n = strlen(text);
        if (dgr_log_echo) fputs(text, stderr);
        /* Debug chatter would push out the lines dgr reads (buffer sizes, errors). */
        if (level == GGML_LOG_LEVEL_DEBUG) return;
        pthread_mutex_lock(&dgr_log_lock);
        if (n >= DGR_LOG_CAP / 2) { text += n - DGR_LOG_CAP / 2 + 1; n = DGR_LOG_CAP / 2 - 1; }
        if (dgr_log_len + n >= DGR_LOG_CAP) {
            size_t keep = DGR_LOG_CAP / 2 - 1;
            if (keep > dgr_log_len) keep = dgr_log_len;
            memmove(dgr_log_buf, dgr_log_buf + dgr_log_len - keep, keep);
            dgr_log_len = keep;
        }
        memcpy(dgr_log_buf + dgr_log_len, text, n);
        dgr_log_len += n;
        dgr_log_buf[dgr_log_len] = 0;
        pthread_mutex_unlock(&dgr_log_lock);
    }

    static void dgr_log_clear(void) {
        pthread_mutex_lock(&dgr_log_lock);
        dgr_log_len = 0;
        dgr_log_buf[0] = 0;
        pthread_mutex_unlock(&dgr_log_lock);
    }

    static size_t dgr_log_copy(char *out, size_t cap) {
        pthread_mutex_lock(&dgr_log_lock);
        size_t n = dgr_log_len < cap - 1 ? dgr_log_len : cap - 1;
        memcpy(out, dgr_log_buf + dgr_log_len - n, n);
        out[n] = 0;
        pthread_mutex_unlock(&dgr_log_lock);
        return n;
    }

    /* A worker's CPU device that reports at most dgr_offered bytes of memory to RPC
       clients (`dgr worker --mem`, as llama.cpp's rpc-server -m did): a copy of the CPU
       device with get_memory/get_props clamped, whose backends name it as their device
       (the RPC server asks a backend's device for its memory). */
    static size_t dgr_offered = 0;
    static ggml_backend_dev_t dgr_cpu = NULL;
    static struct ggml_backend_device dgr_offered_dev;

    static void dgr_offered_memory(ggml_backend_dev_t dev, size_t *free, size_t *total) {
        (void)dev;
        dgr_cpu->iface.get_memory(dgr_cpu, free, total);
        if (*total > dgr_offered) *total = dgr_offered;
        if (*free > dgr_offered) *free = dgr_offered;
    }
    static void dgr_offered_props(ggml_backend_dev_t dev, struct ggml_backend_dev_props *props) {
        dgr_cpu->iface.get_props(dgr_cpu, props);
        dgr_offered_memory(dev, &props->memory_free, &props->memory_total);
    }
    static ggml_backend_t dgr_offered_init(ggml_backend_dev_t dev, const char *params) {
        (void)dev;
        ggml_backend_t backend = dgr_cpu->iface.init_backend(dgr_cpu, params);
        if (backend != NULL) backend->device = &dgr_offered_dev;
        return backend;
    }
    static ggml_backend_dev_t dgr_cpu_offering(size_t bytes) {
        dgr_cpu = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU);
        if (bytes == 0 || dgr_cpu == NULL) return dgr_cpu;
        dgr_offered = bytes;
        dgr_offered_dev = *dgr_cpu;
        dgr_offered_dev.iface.get_memory = dgr_offered_memory;
        dgr_offered_dev.iface.get_props = dgr_offered_props;
        dgr_offered_dev.iface.init_backend = dgr_offered_init;
        return &dgr_offered_dev;
    }

    static bool dgr_abort_callback(void *data) {
        return __atomic_load_n((int *)data, __ATOMIC_RELAXED) != 0;
    }
    static void dgr_set_flag(int *flag, int value) { __atomic_store_n(flag, value, __ATOMIC_RELAXED); }

    /* Greedy sampling: the index of the first largest logit (-1 when none exceeds -inf),
       one pass over a 262k-entry row per output row, so it is vectorized where AVX2 is. */
    static int dgr_argmax_from(const float *x, int from, int n, int best, float best_value) {
        for (int i = from; i < n; i++) {
            if (x[i] > best_value) { best_value = x[i]; best = i; }
        }
        return best;
    }
    #if defined(__x86_64__) && defined(__GNUC__)
    #include <immintrin.h>
    /* Four independent (value, index) accumulators: one blend chain per
       accumulator would otherwise bound the loop by its latency, not by memory. */
    __attribute__((target("avx2")))
    static int dgr_argmax_avx2(const float *x, int n) {
        __m256 best[4];
        __m256i best_i[4], idx[4];
        for (int a = 0; a < 4; a++) {
            best[a] = _mm256_set1_ps(-INFINITY);
            best_i[a] = _mm256_set1_epi32(-1);
            idx[a] = _mm256_add_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7),
                                      _mm256_set1_epi32(8 * a));
        }
        const __m256i step = _mm256_set1_epi32(32);
        int i = 0;
        for (; i + 32 <= n; i += 32) {
            for (int a = 0; a < 4; a++) {
                const __m256 v = _mm256_loadu_ps(x + i + 8 * a);
                const __m256 gt = _mm256_cmp_ps(v, best[a], _CMP_GT_OQ);  /* strict: a lane keeps its first maximum */
                best[a] = _mm256_blendv_ps(best[a], v, gt);
                best_i[a] = _mm256_castps_si256(_mm256_blendv_ps(_mm256_castsi256_ps(best_i[a]),
                                                                 _mm256_castsi256_ps(idx[a]), gt));
                idx[a] = _mm256_add_epi32(idx[a], step);
            }
        }
        float vals[32];
        int ids[32];
        for (int a = 0; a < 4; a++) {
            _mm256_storeu_ps(vals + 8 * a, best[a]);
            _mm256_storeu_si256((__m256i *) (ids + 8 * a), best_i[a]);
        }
        int b = -1;
        float bv = -INFINITY;
        for (int l = 0; l < 32; l++) {  /* the largest value; among equal ones the first index */
            if (ids[l] >= 0 && (vals[l] > bv || (vals[l] == bv && ids[l] < b))) { bv = vals[l]; b = ids[l]; }
        }
        return dgr_argmax_from(x, i, n, b, bv);
    }
    #endif
    static int dgr_argmax(const float *x, int n) {
    #if defined(__x86_64__) && defined(__GNUC__)
        if (__builtin_cpu_supports("avx2")) return dgr_argmax_avx2(x, n);
    #endif
        return dgr_argmax_from(x, 0, n, -1, -INFINITY);
    }
    """
    void dgr_log_sink(ggml_log_level level, const char * text, void * user_data) noexcept nogil
    void dgr_log_clear() noexcept nogil
    size_t dgr_log_copy(char * out, size_t cap) noexcept nogil
    int dgr_log_echo
    bint dgr_abort_callback(void * data) noexcept nogil
    ggml_backend_dev_t dgr_cpu_offering(size_t bytes) noexcept nogil
    void dgr_set_flag(int * flag, int value) noexcept nogil
    int dgr_argmax(const float * x, int n) noexcept nogil

cdef enum:
    WANT_SAMPLE_C = 1        # flags of the `want` array passed to step()
    WANT_LOGPROBS_C = 2
    FAULT_RAISE_C = 1000     # inject_fault code: raise a RuntimeError after llama_decode ran
    ENGINE_FAULT_C = -1000   # a batch loop's code for a call that raised (FAULT_RAISE)
    WORKER_LOST_C = -1001    # a call whose RPC worker was lost (closed, reset, timed out)
    MAX_STOP_IDS = 64        # stop token ids per session (SamplingParams.stop_token_ids)
WANT_SAMPLE = WANT_SAMPLE_C
WANT_LOGPROBS = WANT_LOGPROBS_C
FAULT_RAISE = FAULT_RAISE_C
ENGINE_FAULT = ENGINE_FAULT_C
WORKER_LOST = WORKER_LOST_C

cdef bint _backend_ready = False


cdef inline double _now() noexcept nogil:
    cdef timespec ts
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return ts.tv_sec + ts.tv_nsec * 1e-9


cdef void _init_backend():
    global _backend_ready
    if not _backend_ready:
        global dgr_log_echo
        dgr_log_echo = 1 if os.environ.get("DGR_LLAMA_LOG") else 0
        llama_log_set(dgr_log_sink, NULL)
        llama_backend_init()
        _backend_ready = True


def llama_log_text():
    """The most recent llama.cpp log text, debug lines left out (up to 256 KiB)."""
    cdef bytes buf = bytes(1 << 18)
    cdef size_t n = dgr_log_copy(buf, len(buf))
    return buf[:n].decode("utf-8", "replace")


def system_info():
    _init_backend()
    return llama_print_system_info().decode("utf-8", "replace")


# Every flash-attention row on the one-row path (patch 0008): a token's KV is then the
# same whether it was prefilled in a chunk of any size or decoded, so the prefix cache
# may share any prefix, generated tokens included. ggml reads it once per process, at
# the first flash attention: set when dgr is imported, before any (llama_cpp.Llama in
# the same process takes the same path).
os.environ["GGML_CPU_FA_TILED"] = "0"

_MIB = re.compile(r"(KV|compute|output) buffer size =\s*([0-9.]+) MiB")


# the output layer's tensors (a tied output is the token embedding, duplicated)
cdef const char * _OUTPUT_TENSORS = b"^(output|output_norm|token_embd)\\."


cdef void * _rpc_proc(const char * name) except NULL:
    """An entry point of ggml's RPC backend (ggml-rpc.h), or ModelLoadError."""
    _init_backend()
    cdef ggml_backend_reg_t reg = ggml_backend_reg_by_name(b"RPC")
    if reg == NULL:
        raise ModelLoadError("this llama.cpp build has no RPC backend (build it with "
                             "-DGGML_RPC=ON: scripts/build_llama.py does)")
    cdef void * fn = ggml_backend_reg_get_proc_address(reg, name)
    if fn == NULL:
        raise ModelLoadError(f"the RPC backend lacks {name.decode()}")
    return fn


def _check_worker(endpoint, timeout_s=5.0):
    """ggml's RPC client aborts the process when it cannot connect or its handshake
    fails: try both first (connect, HELLO, the answer's protocol version), each
    within timeout_s. A worker that accepts but does not answer is hung, or busy
    with another node (it serves one connection at a time)."""
    import socket
    import struct

    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ModelLoadError(f"RPC worker {endpoint!r} is not host:port")
    try:
        sock = socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s)
    except OSError as exc:
        raise ModelLoadError(f"RPC worker {endpoint} is not reachable: {exc}") from None
    # HELLO (command 14) with empty transport capabilities; the answer: its size, then
    # major, minor, patch, padding and the capabilities (ggml-rpc.cpp, rpc_msg_hello_*)
    caps = 24
    with sock:
        try:
            sock.sendall(bytes([14]) + struct.pack("<Q", caps) + bytes(caps))
            answer = b""
            while len(answer) < 8 + 4 + caps:
                more = sock.recv(8 + 4 + caps - len(answer))
                if not more:
                    break
                answer += more
        except OSError:
            answer = None
    if answer is None or len(answer) < 8 + 4:
        raise ModelLoadError(f"RPC worker {endpoint} accepted the connection but did not answer "
                             f"ggml's handshake within {timeout_s:g} s (hung, or serving "
                             f"another node)")
    major, minor = answer[8], answer[9]
    if major != RPC_PROTO_MAJOR_VERSION or minor > RPC_PROTO_MINOR_VERSION:
        raise ModelLoadError(f"RPC worker {endpoint} speaks ggml RPC protocol {major}.{minor}; "
                             f"this node speaks {RPC_PROTO_MAJOR_VERSION}.{RPC_PROTO_MINOR_VERSION}")


cdef int _n_layer(bytes path) except -1:
    """The model's layer count from its metadata ({arch}.block_count), read by a
    vocabulary-only load (which leaves llama_model_n_layer at 0)."""
    cdef llama_model_params params = llama_model_default_params()
    params.vocab_only = True
    cdef const char * cpath = path
    cdef llama_model * probe
    with nogil:
        probe = llama_model_load_from_file(cpath, params)
    if probe == NULL:
        raise ModelLoadError(f"cannot read the model's metadata: "
                             f"{_error_lines(llama_log_text()) or 'llama.cpp refused it'}")
    cdef char buf[256]
    cdef int n = llama_model_meta_val_str(probe, b"general.architecture", buf, sizeof(buf))
    arch = buf[:n].decode() if n > 0 else ""
    key = f"{arch}.block_count".encode()
    n = llama_model_meta_val_str(probe, key, buf, sizeof(buf))
    llama_model_free(probe)
    if n <= 0 or not buf[:n].isdigit():
        raise ModelLoadError(f"the model's metadata has no {key.decode()}")
    return int(buf[:n])


def _layer_shares(int offloaded, int n_devices, weights=()):
    """Repeating layers per device, `offloaded` split in proportion to `weights`
    (default: evenly); the remainder goes to the largest fractions, the first
    devices on a tie."""
    weights = list(weights) or [1.0] * n_devices
    total = sum(weights)
    exact = [offloaded * w / total for w in weights]
    shares = [int(x) for x in exact]
    by_fraction = sorted(range(n_devices), key=lambda j: (shares[j] - exact[j], j))
    for j in by_fraction[:offloaded - sum(shares)]:
        shares[j] += 1
    return shares


def _rpc_placement(path, list servers, int rpc_layers, split=()):
    """Connect to the RPC workers and place layers on them: None without workers,
    else {"offloaded": repeating layers on workers, "devices": [{endpoint, name,
    handle, free_bytes, total_bytes, layers}]}; the output layer stays here
    (Engine); `split`: the devices' shares of the offloaded layers (default:
    even). A worker that is down, or one with less free memory than its share
    of the weights (about: the file size per layer), is a ModelLoadError."""
    if not servers:
        return None
    cdef rpc_add_server_fn add_server = <rpc_add_server_fn> _rpc_proc(
        b"ggml_backend_rpc_add_server")
    cdef ggml_backend_reg_t reg
    cdef ggml_backend_dev_t dev
    cdef size_t free_b, total_b
    cdef bytes endpoint
    cdef const char * c_endpoint
    devices = []
    for server in servers:
        _check_worker(server)
        endpoint = server.encode()
        c_endpoint = endpoint
        # network round trips: without the GIL, so other threads (a Trio loop) run
        with nogil:
            reg = add_server(c_endpoint)
        if reg == NULL:
            raise ModelLoadError(f"RPC worker {server}: llama.cpp could not add it")
        for i in range(ggml_backend_reg_dev_count(reg)):
            dev = ggml_backend_reg_dev_get(reg, i)
            with nogil:
                ggml_backend_dev_memory(dev, &free_b, &total_b)
            devices.append({"endpoint": server, "name": ggml_backend_dev_name(dev).decode(),
                            "description": ggml_backend_dev_description(dev).decode(),
                            "handle": <size_t> dev, "free_bytes": free_b,
                            "total_bytes": total_b})
    n_layer = _n_layer(os.fsencode(path))
    offloaded = rpc_layers if rpc_layers >= 0 else n_layer * len(devices) // (len(devices) + 1)
    if offloaded > n_layer:
        raise ModelLoadError(f"rpc_layers ({offloaded}) exceeds the model's {n_layer} layers")
    if split and len(split) != len(devices):
        raise ModelLoadError(f"rpc_tensor_split has {len(split)} shares for {len(devices)} "
                             f"RPC devices")
    weights = os.path.getsize(path)
    shares = _layer_shares(offloaded, len(devices), split)
    for j, (device, layers) in enumerate(zip(devices, shares)):
        device["layers"] = layers
        # llama.cpp offloads the output unit with the last layers; Engine keeps it here
        device["output"] = offloaded > 0 and j == len(devices) - 1
        need = weights * layers // (n_layer + 1)
        if need > device["free_bytes"]:
            raise ModelLoadError(
                f"RPC worker {device['endpoint']} has {device['free_bytes'] >> 20} MiB free; "
                f"its {layers} layers need about {need >> 20} MiB")
    return {"offloaded": offloaded, "devices": devices}


def _device_report(placement, int n_layer):
    """Where the layers are, for the capability report."""
    local = {"name": "CPU", "endpoint": None, "layers": n_layer}
    if placement is None:
        return [local]
    local["layers"] = n_layer - placement["offloaded"]
    return [local] + [{k: v for k, v in d.items() if k not in ("handle", "output")}
                      for d in placement["devices"]]


def serve_rpc(str endpoint, int n_threads, cache_dir=None, size_t mem_bytes=0):
    """Serve this machine's CPU backend to ggml RPC clients (llama.cpp's
    rpc-server, in this process so that it runs dgr's patched kernels). Blocks
    until the process ends; returns only if it cannot listen. mem_bytes > 0:
    report at most that much memory to nodes (which place layers within it)."""
    cdef rpc_start_server_fn start = <rpc_start_server_fn> _rpc_proc(
        b"ggml_backend_rpc_start_server")
    cdef ggml_backend_dev_t dev = dgr_cpu_offering(mem_bytes)
    cdef bytes c_endpoint = endpoint.encode()
    cdef bytes c_cache = os.fsencode(cache_dir) if cache_dir else b""
    cdef const char * ep = c_endpoint
    cdef const char * cache = NULL
    if cache_dir:
        cache = c_cache
    cdef size_t threads = n_threads
    with nogil:
        start(ep, cache, threads, 1, &dev)


def _buffer_sizes(log_text):
    """Sum the buffer sizes llama.cpp logged while creating a context."""
    sizes = {"KV": 0, "compute": 0, "output": 0}
    for kind, mib in _MIB.findall(log_text):
        sizes[kind] += int(float(mib) * 1024 * 1024)
    return sizes


def _error_lines(log_text, limit=4):
    lines = [line.strip() for line in log_text.splitlines()
             if "error" in line.lower() or "failed" in line.lower() or "invalid" in line.lower()]
    return "; ".join(lines[-limit:])


cdef class Engine:
    """A llama.cpp model and context serving up to `n_seq_max` sequences.

    Sequence ids are slots 0..n_seq_max-1. Each slot has its own sampler chain
    (see `set_sampling`) and its own KV cells (`release` frees them).
    """

    cdef llama_model * model
    cdef llama_context * ctx
    cdef const llama_vocab * vocab
    cdef llama_memory_t mem
    cdef llama_batch batch
    cdef llama_sampler ** samplers
    cdef llama_sampler ** grammars  # per slot: the grammar sampler, outside the chain (or NULL)
    cdef llama_token_data * candidates  # per sampling thread: one row's vocabulary (chain rows)
    cdef const float ** row_logits      # per batch row: its logits, resolved before sampling
    cdef int sample_threads
    cdef int tokenizing  # tokenize calls running without the GIL (close waits for them)
    cdef int abort_flag
    cdef int n_slots
    cdef int batch_capacity
    cdef int vocab_size
    cdef llama_logit_bias * eog_bias   # end-of-generation tokens, bias -inf
    cdef int n_eog
    cdef float * eog_saved      # per sampling thread: banned logits while a greedy row is sampled
    # per slot, n_eog + MAX_STOP_IDS entries apart: its end-of-generation tokens, then its
    # stop token ids (bias -inf); all of its n_bans are banned until it has sampled
    # ban_until (min_tokens) tokens, the first n_bans_always (ignore_eos) ever after
    cdef llama_logit_bias * bans
    cdef int * n_bans
    cdef int * n_bans_always
    cdef int * ban_until
    cdef int * sampled_n          # per slot: tokens sampled since set_sampling
    cdef char * greedy_slot     # per slot: pure greedy, sampled by argmax in C
    cdef long long steps_done
    # RPC workers holding layers: their endpoints (C strings into rpc_names) and
    # patch 0005's check, asked after every llama_decode
    cdef int n_rpc
    cdef const char ** rpc_endpoints
    cdef list rpc_names
    cdef rpc_connected_fn rpc_connected
    cdef long long fault_step
    cdef int fault_code
    cdef readonly dict info
    cdef readonly str model_path

    def __cinit__(self):
        self.model = NULL
        self.ctx = NULL
        self.samplers = NULL
        self.grammars = NULL
        self.candidates = NULL
        self.row_logits = NULL
        self.sample_threads = 1
        self.eog_bias = NULL
        self.eog_saved = NULL
        self.greedy_slot = NULL
        self.bans = NULL
        self.n_bans = self.n_bans_always = self.ban_until = self.sampled_n = NULL
        self.batch.token = NULL
        self.n_slots = 0
        self.n_rpc = 0
        self.rpc_endpoints = NULL
        self.fault_step = -1

    def __init__(self, model_path, *, int n_ctx=4096, int n_seq_max=8, int n_batch=512,
                 int n_ubatch=512, n_threads=None, bint kv_unified=False,
                 bint weight_repack=False, rpc_servers=(), int rpc_layers=-1,
                 rpc_split=(), double rpc_timeout_s=0.0):
        """Load `model_path` and create a context.

        rpc_servers: "host:port" of ggml RPC servers (`python -m dgr worker`); the
        last rpc_layers layers (-1: an even share for this machine and each
        worker) are placed on them, split evenly or by rpc_split (one share per
        worker device), the rest stay here. A worker that closes its connection,
        or does not answer within rpc_timeout_s (0: no limit), fails the step it
        was in and every later one (WorkerLost, or WORKER_LOST from a BatchLoop
        call).

        kv_unified=True: one pool of n_ctx cells that any slot may fill, each
        slot's cells kept in position order (patch 0004, LLAMA_KV_CACHE_ORDERED)
        and sliding-window layers given a full-size cache, so that a sequence
        never wraps around; kv_unified=False gives every slot its own
        n_ctx / n_seq_max cells. With weight_repack=False the CPU backend uses
        the same matmul kernels for a 1-row and an n-row step. These keep a
        sequence's logits independent of the others (docs/design.md).
        """
        _init_backend()
        path = os.fspath(model_path)
        self.model_path = path
        if not os.path.exists(path):
            raise ModelLoadError(f"model file not found: {path}")
        if not os.path.isfile(path):
            raise ModelLoadError(f"model path is not a file: {path}")
        with open(path, "rb") as f:
            magic = f.read(4)
        if magic != b"GGUF":
            raise ModelLoadError(f"not a GGUF file (bad magic {magic!r}): {path}")
        if n_seq_max < 1 or n_batch < 1 or n_ubatch < 1 or n_ctx < 1:
            raise ContextError("n_ctx, n_seq_max, n_batch and n_ubatch must be positive")
        if weight_repack and "AMX_INT8 = 1" in system_info():
            # Seen on the CI machine type (evidence/DGR-013): the pinned llama.cpp's AMX
            # repacked matmul dies with SIGSEGV; refuse rather than crash the process.
            raise ContextError("weight_repack is not supported on this CPU: llama.cpp's AMX "
                               "repacked matmul crashes here; leave weight repacking off")

        cdef llama_model_params mparams = llama_model_default_params()
        mparams.n_gpu_layers = 0
        mparams.use_extra_bufts = weight_repack
        cdef bytes bpath = path.encode()
        cdef const char * cpath = bpath
        cdef ggml_backend_dev_t * devices = NULL
        cdef float * split = NULL
        cdef llama_model_tensor_buft_override local_output[2]
        if rpc_servers:
            # read by ggml-rpc (patch 0006) when it connects to each worker
            os.environ["GGML_RPC_TIMEOUT"] = repr(max(0.0, rpc_timeout_s))
        placement = _rpc_placement(path, list(rpc_servers), rpc_layers, tuple(rpc_split))
        if placement is not None:
            devices = <ggml_backend_dev_t *> calloc(len(placement["devices"]) + 1,
                                                    sizeof(ggml_backend_dev_t))
            split = <float *> calloc(max(llama_max_devices(), len(placement["devices"])),
                                     sizeof(float))
            if devices == NULL or split == NULL:
                free(devices); free(split)
                raise MemoryError()
            # llama.cpp offloads the last n_gpu_layers of n_layer + 1 units, the output
            # layer last, split in proportion to tensor_split (by default: free memory)
            for i, device in enumerate(placement["devices"]):
                devices[i] = <ggml_backend_dev_t> <size_t> device["handle"]
                split[i] = device["layers"] + (1 if device["output"] else 0)
            mparams.devices = devices
            mparams.tensor_split = split
            mparams.n_gpu_layers = placement["offloaded"] + (1 if placement["offloaded"] else 0)
            # ...but the output layer's weights stay here: each sampled row's logits
            # (n_vocab floats) are made where they are sampled, and only the hidden
            # state (n_embd floats) crosses the network
            local_output[0].pattern = _OUTPUT_TENSORS
            local_output[0].buft = ggml_backend_cpu_buffer_type()
            local_output[1].pattern = NULL
            local_output[1].buft = NULL
            mparams.tensor_buft_overrides = local_output
        dgr_log_clear()
        try:
            with nogil:
                self.model = llama_model_load_from_file(cpath, mparams)
        finally:
            free(devices); free(split)  # read while loading only
        if self.model == NULL:
            raise ModelLoadError(f"cannot load model {path}: "
                                 f"{_error_lines(llama_log_text()) or 'llama.cpp refused it'}")

        cdef llama_context_params cparams = llama_context_default_params()
        cparams.n_ctx = n_ctx
        cparams.n_seq_max = n_seq_max
        cparams.n_batch = n_batch
        cparams.n_ubatch = min(n_ubatch, n_batch)
        threads = int(n_threads) if n_threads else (os.cpu_count() or 1)
        cparams.n_threads = threads
        cparams.n_threads_batch = threads
        cparams.kv_unified = kv_unified
        cparams.swa_full = kv_unified
        cparams.no_perf = True
        cparams.abort_callback = dgr_abort_callback
        cparams.abort_callback_data = &self.abort_flag
        dgr_log_clear()
        # read by the KV cache's constructor only; restored so that other contexts in
        # the process (llama_cpp.Llama) keep llama.cpp's default placement
        ordered_before = os.environ.get("LLAMA_KV_CACHE_ORDERED")
        os.environ["LLAMA_KV_CACHE_ORDERED"] = "1" if kv_unified else "0"
        try:
            with nogil:
                self.ctx = llama_init_from_model(self.model, cparams)
        finally:
            if ordered_before is None:
                del os.environ["LLAMA_KV_CACHE_ORDERED"]
            else:
                os.environ["LLAMA_KV_CACHE_ORDERED"] = ordered_before
        if self.ctx == NULL:
            raise ContextError(f"cannot create a context for {path} "
                               f"(n_ctx={n_ctx}, n_seq_max={n_seq_max}, n_batch={n_batch}): "
                               f"{_error_lines(llama_log_text()) or 'llama.cpp refused it'}")
        sizes = _buffer_sizes(llama_log_text())

        self.vocab = llama_model_get_vocab(self.model)
        self.mem = llama_get_memory(self.ctx)
        self.vocab_size = llama_vocab_n_tokens(self.vocab)
        self.n_slots = llama_n_seq_max(self.ctx)
        self.batch_capacity = llama_n_batch(self.ctx)
        self.batch = llama_batch_init(self.batch_capacity, 0, 1)
        self.samplers = <llama_sampler **> malloc(self.n_slots * sizeof(llama_sampler *))
        self.grammars = <llama_sampler **> calloc(self.n_slots, sizeof(llama_sampler *))
        # rows are sampled on llama.cpp's threads (see _sample_rows): scratch per thread
        self.sample_threads = threads
        self.candidates = <llama_token_data *> malloc(
            <size_t> threads * self.vocab_size * sizeof(llama_token_data))
        self.row_logits = <const float **> calloc(self.batch_capacity, sizeof(float *))
        if (self.samplers == NULL or self.grammars == NULL or self.candidates == NULL
                or self.row_logits == NULL):
            raise MemoryError()
        self.greedy_slot = <char *> calloc(self.n_slots, 1)
        self.n_bans = <int *> calloc(self.n_slots, sizeof(int))
        self.n_bans_always = <int *> calloc(self.n_slots, sizeof(int))
        self.ban_until = <int *> calloc(self.n_slots, sizeof(int))
        self.sampled_n = <int *> calloc(self.n_slots, sizeof(int))
        if (self.greedy_slot == NULL or self.n_bans == NULL or self.n_bans_always == NULL
                or self.ban_until == NULL or self.sampled_n == NULL):
            raise MemoryError()
        for slot in range(self.n_slots):
            self.samplers[slot] = NULL
        if placement is not None:
            self.rpc_connected = <rpc_connected_fn> _rpc_proc(b"ggml_backend_rpc_connected")
            self.rpc_names = [d["endpoint"].encode() for d in placement["devices"]]
            self.rpc_endpoints = <const char **> malloc(len(self.rpc_names) * sizeof(char *))
            if self.rpc_endpoints == NULL:
                raise MemoryError()
            for i, name in enumerate(self.rpc_names):
                self.rpc_endpoints[i] = <const char *> name
            self.n_rpc = len(self.rpc_names)
        self._collect_eog()
        for slot in range(self.n_slots):
            self.set_sampling(slot)

        n_ctx_total = llama_n_ctx(self.ctx)
        self.info = {
            "path": path,
            "name": self.meta("general.name") or os.path.basename(path),
            "architecture": self.meta("general.architecture") or "",
            "description": self._desc(),
            "model_bytes": int(llama_model_size(self.model)),
            "n_params": int(llama_model_n_params(self.model)),
            "n_vocab": self.vocab_size,
            "n_ctx_train": llama_model_n_ctx_train(self.model),
            "n_layer": llama_model_n_layer(self.model),
            "n_embd": llama_model_n_embd(self.model),
            "n_swa": llama_model_n_swa(self.model),
            "n_ctx": n_ctx_total,
            "n_ctx_seq": llama_n_ctx_seq(self.ctx),
            "n_seq_max": self.n_slots,
            "n_batch": self.batch_capacity,
            "n_ubatch": llama_n_ubatch(self.ctx),
            "n_threads": threads,
            "kv_unified": bool(kv_unified),
            "weight_repack": bool(weight_repack),
            "kv_bytes": sizes["KV"],
            "kv_bytes_per_cell": sizes["KV"] // max(1, n_ctx_total),
            "compute_bytes": sizes["compute"],
            "output_bytes": sizes["output"],
            "logits_bytes_per_output": self.vocab_size * 4,
            "devices": _device_report(placement, llama_model_n_layer(self.model)),
        }

    def __dealloc__(self):
        self._free()

    def close(self):
        """Free the context and model now rather than at garbage collection, once
        tokenize calls on other threads have left the vocabulary."""
        while self.tokenizing:
            time.sleep(0.001)
        self._free()

    cdef void _free(self) noexcept:
        if self.samplers != NULL:
            for slot in range(self.n_slots):
                if self.samplers[slot] != NULL:
                    llama_sampler_free(self.samplers[slot])
            free(self.samplers)
            self.samplers = NULL
        if self.grammars != NULL:
            for slot in range(self.n_slots):
                if self.grammars[slot] != NULL:
                    llama_sampler_free(self.grammars[slot])
            free(self.grammars)
            self.grammars = NULL
        free(self.candidates)
        self.candidates = NULL
        free(self.row_logits)
        self.row_logits = NULL
        if self.eog_bias != NULL:
            free(self.eog_bias)
            self.eog_bias = NULL
        free(self.eog_saved)
        free(self.bans)
        free(self.n_bans); free(self.n_bans_always); free(self.ban_until); free(self.sampled_n)
        self.bans = NULL
        self.n_bans = self.n_bans_always = self.ban_until = self.sampled_n = NULL
        free(self.greedy_slot)
        free(self.rpc_endpoints)
        self.rpc_endpoints = NULL
        self.n_rpc = 0
        self.eog_saved = NULL
        self.greedy_slot = NULL
        if self.batch.token != NULL:
            llama_batch_free(self.batch)
            self.batch.token = NULL
        if self.ctx != NULL:
            llama_free(self.ctx)
            self.ctx = NULL
        if self.model != NULL:
            llama_model_free(self.model)
            self.model = NULL

    @property
    def is_open(self):
        return self.ctx != NULL

    cdef void _check_open(self) except *:
        if self.ctx == NULL:
            raise DecodeError("engine is closed")

    cdef _collect_eog(self):
        eog = [t for t in range(self.vocab_size) if llama_vocab_is_eog(self.vocab, t)]
        self.n_eog = len(eog)
        self.eog_bias = <llama_logit_bias *> malloc(max(1, self.n_eog) * sizeof(llama_logit_bias))
        self.eog_saved = <float *> malloc(self.sample_threads * (self.n_eog + MAX_STOP_IDS)
                                          * sizeof(float))
        self.bans = <llama_logit_bias *> malloc(self.n_slots * (self.n_eog + MAX_STOP_IDS)
                                                * sizeof(llama_logit_bias))
        if self.eog_bias == NULL or self.eog_saved == NULL or self.bans == NULL:
            raise MemoryError()
        for i, t in enumerate(eog):
            self.eog_bias[i].token = t
            self.eog_bias[i].bias = -INFINITY

    def _desc(self):
        cdef char buf[256]
        n = llama_model_desc(self.model, buf, sizeof(buf))
        return buf[:max(0, min(n, 255))].decode("utf-8", "replace")

    # ---------------------------------------------------------------- model facts

    def meta(self, str key):
        """A GGUF metadata value as a string, or None when the key is absent."""
        cdef bytes bkey = key.encode()
        cdef int n = llama_model_meta_val_str(self.model, bkey, NULL, 0)
        if n < 0:
            return None
        cdef bytes buf = bytes(n + 1)
        llama_model_meta_val_str(self.model, bkey, buf, n + 1)
        return buf[:n].decode("utf-8", "replace")

    @property
    def n_vocab(self):
        return self.vocab_size

    @property
    def n_seq_max(self):
        return self.n_slots

    @property
    def n_batch(self):
        return self.batch_capacity

    @property
    def eog_tokens(self):
        """The vocabulary's end-of-generation tokens."""
        return [self.eog_bias[i].token for i in range(self.n_eog)]

    def chat_template(self):
        """The model's chat template from its GGUF metadata, or None."""
        self._check_open()
        cdef const char * tmpl = llama_model_chat_template(self.model, NULL)
        return None if tmpl == NULL else tmpl.decode("utf-8", "replace")

    def apply_chat_template(self, messages, template=None, bint add_assistant=True):
        """Render [{"role": ..., "content": ...}, ...] with a chat template.

        `template` is a template string or a llama.cpp built-in name ("gemma",
        "chatml", ...); None means the model's own. llama.cpp recognizes the
        family of a template string; an unknown one raises ValueError."""
        self._check_open()
        tmpl = template if template is not None else self.chat_template()
        if tmpl is None:
            raise ValueError("the model has no chat template")
        cdef bytes btmpl = tmpl.encode()
        encoded = [(str(m["role"]).encode(), str(m["content"]).encode()) for m in messages]
        cdef int n_msg = len(encoded)
        cdef llama_chat_message * chat = <llama_chat_message *> malloc(max(1, n_msg) * sizeof(llama_chat_message))
        cdef int cap = 256 + 2 * sum(len(r) + len(c) for r, c in encoded)
        cdef int n
        cdef bytes out
        try:
            for i, (role, content) in enumerate(encoded):
                chat[i].role = role
                chat[i].content = content
            while True:
                out = bytes(cap)
                n = llama_chat_apply_template(btmpl, chat, n_msg, add_assistant, out, cap)
                if n < 0:
                    raise ValueError("llama.cpp does not support this model's chat template")
                if n <= cap:
                    return out[:n].decode("utf-8", "replace")
                cap = n
        finally:
            free(chat)

    # ---------------------------------------------------------------- text

    def tokenize(self, text, bint add_special=True, bint parse_special=False):
        """Token ids of `text` (str or UTF-8 bytes) as an int32 array. The GIL is
        released while llama.cpp tokenizes (a 30,000-token text takes ~0.1 s), so
        a caller on a worker thread does not stall the others."""
        cdef bytes data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        cdef const char * chars = data
        cdef int length = len(data)
        cdef int cap = length + 8
        cdef cnp.ndarray[int32_t, ndim=1] out = np.empty(cap, dtype=np.int32)
        cdef llama_token * ids = <llama_token *> out.data
        cdef int n
        self.tokenizing += 1  # counted before the open check: close cannot free in between
        try:
            self._check_open()
            with nogil:
                n = llama_tokenize(self.vocab, chars, length, ids, cap, add_special, parse_special)
            if n < 0:
                if n == -2147483648:
                    raise ValueError("text too long to tokenize")
                cap = -n
                out = np.empty(cap, dtype=np.int32)
                ids = <llama_token *> out.data
                with nogil:
                    n = llama_tokenize(self.vocab, chars, length, ids, cap, add_special,
                                       parse_special)
        finally:
            self.tokenizing -= 1
        return out[:n].copy()

    def token_to_piece(self, int token, bint special=False):
        """The bytes of one token (possibly part of a UTF-8 character)."""
        self._check_open()
        if token < 0 or token >= self.vocab_size:
            raise ValueError(f"token id {token} out of vocabulary (n_vocab={self.vocab_size})")
        cdef char buf[128]
        cdef int n = llama_token_to_piece(self.vocab, token, buf, sizeof(buf), 0, special)
        cdef bytes big
        if n >= 0:
            return buf[:n]
        big = bytes(-n)
        n = llama_token_to_piece(self.vocab, token, big, -n, 0, special)
        return big[:n]

    def detokenize(self, tokens, bint remove_special=True, bint unparse_special=False):
        """Text of a whole token sequence."""
        self._check_open()
        cdef cnp.ndarray[int32_t, ndim=1] ids = np.ascontiguousarray(tokens, dtype=np.int32)
        if ids.shape[0] and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise ValueError(f"token id out of vocabulary (n_vocab={self.vocab_size})")
        cdef int cap = 16 * ids.shape[0] + 16
        cdef bytes out = bytes(cap)
        cdef int n = llama_detokenize(self.vocab, <llama_token *> ids.data, ids.shape[0], out, cap,
                                      remove_special, unparse_special)
        if n < 0:
            cap = -n
            out = bytes(cap)
            n = llama_detokenize(self.vocab, <llama_token *> ids.data, ids.shape[0], out, cap,
                                 remove_special, unparse_special)
        return out[:n].decode("utf-8", "replace")

    # ---------------------------------------------------------------- slots

    def _check_slot(self, int slot):
        if slot < 0 or slot >= self.n_slots:
            raise ValueError(f"sequence slot {slot} out of range 0..{self.n_slots - 1}")

    def set_sampling(self, int slot, double temperature=0.0, int top_k=0, double top_p=1.0,
                     double min_p=0.0, seed=0, bint ignore_eos=False, logit_bias=(),
                     int repeat_last_n=64, double repeat_penalty=1.0,
                     double frequency_penalty=0.0, double presence_penalty=0.0, grammar=None,
                     int min_tokens=0, stop_token_ids=()):
        """Give `slot` a fresh sampler chain. temperature <= 0 means greedy.

        ignore_eos bans the end-of-generation tokens; min_tokens bans them and
        stop_token_ids (at most MAX_STOP_IDS) until the slot has sampled that many
        tokens (the slot's session ends on a stop token id: dgr.node).

        grammar: GBNF text (root rule "root") that every sampled token must keep
        satisfiable (llama.cpp's grammar sampler; see check_grammar).

        logit_bias: (token, bias) pairs added to the logits (-inf bans a token);
        the penalties (llama.cpp's: repeat divides, frequency and presence
        subtract) apply to the last repeat_last_n tokens the slot generated.
        Plain greedy, without either, is an argmax in C (no chain)."""
        self._check_slot(slot)
        if min_tokens < 0 or len(stop_token_ids) > MAX_STOP_IDS:
            raise ValueError(f"min_tokens must be >= 0 and stop_token_ids at most {MAX_STOP_IDS}")
        for token in stop_token_ids:
            if not 0 <= token < self.vocab_size:
                raise ValueError(f"stop token {token} out of vocabulary (n_vocab={self.vocab_size})")
        cdef llama_logit_bias * bans = self.bans + slot * (self.n_eog + MAX_STOP_IDS)
        cdef int n = 0, e
        if ignore_eos or min_tokens > 0:
            for e in range(self.n_eog):
                bans[n] = self.eog_bias[e]
                n += 1
        if min_tokens > 0:
            for token in stop_token_ids:
                bans[n].token = token
                bans[n].bias = -INFINITY
                n += 1
        self.n_bans[slot] = n
        self.n_bans_always[slot] = self.n_eog if ignore_eos else 0
        self.ban_until[slot] = min_tokens
        self.sampled_n[slot] = 0
        cdef llama_sampler_chain_params sparams = llama_sampler_chain_default_params()
        sparams.no_perf = True
        cdef llama_sampler * chain = llama_sampler_chain_init(sparams)
        cdef int n_bias = len(logit_bias), i
        cdef llama_logit_bias * biases
        if n_bias:
            biases = <llama_logit_bias *> malloc(n_bias * sizeof(llama_logit_bias))
            if biases == NULL:
                llama_sampler_free(chain)
                raise MemoryError()
            for i, (token, bias) in enumerate(logit_bias):
                if not 0 <= token < self.vocab_size:
                    free(biases)
                    llama_sampler_free(chain)
                    raise ValueError(f"logit_bias token {token} out of vocabulary "
                                     f"(n_vocab={self.vocab_size})")
                biases[i].token = token
                biases[i].bias = bias
            llama_sampler_chain_add(chain, llama_sampler_init_logit_bias(self.vocab_size, n_bias, biases))
            free(biases)  # the sampler keeps a copy
        # The grammar stays outside the chain: _sample_chain checks the chain's
        # pick against it and constrains the whole vocabulary only when it is rejected.
        cdef llama_sampler * constrained = NULL
        cdef bytes grammar_text
        if grammar is not None:
            grammar_text = grammar.encode()
            constrained = llama_sampler_init_grammar(self.vocab, grammar_text, b"root")
            if constrained == NULL:
                llama_sampler_free(chain)
                raise ValueError("invalid grammar")
        cdef bint penalized = repeat_last_n != 0 and (
            repeat_penalty != 1.0 or frequency_penalty != 0.0 or presence_penalty != 0.0)
        if penalized:
            llama_sampler_chain_add(chain, llama_sampler_init_penalties(
                self.vocab_size, repeat_last_n, repeat_penalty, frequency_penalty, presence_penalty))
        if temperature <= 0.0:
            llama_sampler_chain_add(chain, llama_sampler_init_greedy())
        else:
            if top_k > 0:
                llama_sampler_chain_add(chain, llama_sampler_init_top_k(top_k))
            if top_p < 1.0:
                llama_sampler_chain_add(chain, llama_sampler_init_top_p(top_p, 1))
            if min_p > 0.0:
                llama_sampler_chain_add(chain, llama_sampler_init_min_p(min_p, 1))
            llama_sampler_chain_add(chain, llama_sampler_init_temp(temperature))
            llama_sampler_chain_add(chain, llama_sampler_init_dist(<uint32_t> (int(seed) & 0xFFFFFFFF)))
        if self.samplers[slot] != NULL:
            llama_sampler_free(self.samplers[slot])
        self.samplers[slot] = chain
        if self.grammars[slot] != NULL:
            llama_sampler_free(self.grammars[slot])
        self.grammars[slot] = constrained
        # Greedy needs no chain: an argmax over the logits row picks the same
        # token (the first maximum) without copying the whole vocabulary.
        self.greedy_slot[slot] = (temperature <= 0.0 and not n_bias and not penalized
                                  and grammar is None)

    def check_grammar(self, grammar):
        """None if llama.cpp parses the GBNF `grammar` (root rule "root"), else the
        reason from its log."""
        dgr_log_clear()
        cdef bytes text = grammar.encode()
        cdef llama_sampler * parsed = llama_sampler_init_grammar(self.vocab, text, b"root")
        if parsed != NULL:
            llama_sampler_free(parsed)
            return None
        return _error_lines(llama_log_text()) or "llama.cpp could not parse the grammar"

    def release(self, int slot):
        """Free every KV cell of `slot` and reset its sampler."""
        self._check_open()
        self._check_slot(slot)
        llama_memory_seq_rm(self.mem, slot, -1, -1)
        llama_sampler_reset(self.samplers[slot])

    def pos_max(self, int slot):
        """Largest position held in KV for `slot`, -1 when it holds none."""
        self._check_open()
        self._check_slot(slot)
        return llama_memory_seq_pos_max(self.mem, slot)

    def cells_used(self):
        """KV cells held by all slots (each slot holds a contiguous range of positions)."""
        self._check_open()
        cdef int total = 0
        cdef int lo, hi
        for slot in range(self.n_slots):
            hi = llama_memory_seq_pos_max(self.mem, slot)
            if hi >= 0:
                lo = llama_memory_seq_pos_min(self.mem, slot)
                total += hi - lo + 1
        return total

    # ---------------------------------------------------------------- abort and faults

    def request_abort(self):
        """Make a running (or the next) llama_decode return 2 at its next graph node."""
        dgr_set_flag(&self.abort_flag, 1)

    def clear_abort(self):
        dgr_set_flag(&self.abort_flag, 0)

    def inject_fault(self, int after_steps, int code):
        """Test hook: the step after `after_steps` more steps reports `code`.

        Codes 1 and -1 skip llama_decode (llama.cpp leaves memory unchanged for
        them); 2 and codes below -1 run it and then report failure, leaving the
        processed cells behind as llama.cpp does, so reconciliation is exercised.
        FAULT_RAISE runs it and then raises RuntimeError without reconciling,
        like a bug in the engine would."""
        self.fault_step = self.steps_done + after_steps
        self.fault_code = code

    # ---------------------------------------------------------------- step

    def step(self, tokens, positions, seq_ids, want, int n_logprobs=0):
        """Decode one batch and sample its output rows.

        tokens, positions, seq_ids: int32 arrays, one entry per row.
        want: int8 array; 0 = no output, WANT_SAMPLE = sample this row with the
        row's slot sampler, WANT_SAMPLE | WANT_LOGPROBS = also report the top
        `n_logprobs` log-probabilities (from the raw logits) and the sampled
        token's log-probability.

        Returns (sampled, top_ids, top_logprobs, sampled_logprobs): sampled is
        int32[n] with -1 for rows without output; the others are None unless
        n_logprobs > 0, then int32[n, k], float32[n, k] and float32[n].

        Each slot's rows must continue its KV: positions start at pos_max + 1
        and increase by one. On failure the KV memory is put back as it was
        before the step and a DecodeError subclass (or InvalidBatch) is raised.
        """
        self._check_open()
        cdef const int32_t[::1] tok = np.ascontiguousarray(tokens, dtype=np.int32)
        cdef const int32_t[::1] pos = np.ascontiguousarray(positions, dtype=np.int32)
        cdef const int32_t[::1] seq = np.ascontiguousarray(seq_ids, dtype=np.int32)
        cdef const int8_t[::1] wnt = np.ascontiguousarray(want, dtype=np.int8)
        cdef int n = tok.shape[0]
        if pos.shape[0] != n or seq.shape[0] != n or wnt.shape[0] != n:
            raise InvalidBatch("tokens, positions, seq_ids and want must have the same length")
        if n == 0:
            raise InvalidBatch("empty batch")
        if n > self.batch_capacity:
            raise InvalidBatch(f"{n} rows exceed n_batch={self.batch_capacity}")
        if n_logprobs < 0 or n_logprobs > 64:
            raise InvalidBatch("n_logprobs must be within 0..64")

        cdef int i, s
        cdef cnp.ndarray[int32_t, ndim=1] next_pos = np.full(self.n_slots, -2, dtype=np.int32)
        cdef cnp.ndarray[int32_t, ndim=1] pos_before = np.full(self.n_slots, -2, dtype=np.int32)
        for i in range(n):
            if tok[i] < 0 or tok[i] >= self.vocab_size:
                raise InvalidBatch(f"row {i}: token id {tok[i]} out of vocabulary (n_vocab={self.vocab_size})")
            s = seq[i]
            if s < 0 or s >= self.n_slots:
                raise InvalidBatch(f"row {i}: sequence id {s} out of range 0..{self.n_slots - 1}")
            if wnt[i] < 0 or wnt[i] > 3:
                raise InvalidBatch(f"row {i}: want flag {wnt[i]} is not 0..3")
            if next_pos[s] == -2:
                pos_before[s] = llama_memory_seq_pos_max(self.mem, s)
                next_pos[s] = pos_before[s] + 1
            if pos[i] != next_pos[s]:
                raise InvalidBatch(f"row {i}: sequence {s} position {pos[i]} does not continue its KV "
                                   f"(expected {next_pos[s]})")
            next_pos[s] += 1

        cdef int k = n_logprobs
        cdef cnp.ndarray[int32_t, ndim=1] sampled = np.full(n, -1, dtype=np.int32)
        cdef cnp.ndarray[int32_t, ndim=2] top_ids = np.zeros((n, max(k, 1)), dtype=np.int32)
        cdef cnp.ndarray[float, ndim=2] top_lp = np.zeros((n, max(k, 1)), dtype=np.float32)
        cdef cnp.ndarray[float, ndim=1] sampled_lp = np.zeros(n, dtype=np.float32)
        cdef int rc
        cdef int bad_row = -1
        cdef double times[3]
        with nogil:
            rc = self._run_call(n, &tok[0], &pos[0], &seq[0], &wnt[0], k,
                                <int32_t *> sampled.data, <float *> sampled_lp.data,
                                <int32_t *> top_ids.data, <float *> top_lp.data, &bad_row, times)

        if rc == FAULT_RAISE_C:
            raise RuntimeError("injected engine fault after llama_decode")
        if rc != 0:
            self._reconcile(pos_before)
            raise _decode_error(rc)
        if bad_row >= 0:
            raise DecodeError(f"no logits for output row {bad_row}")
        if k == 0:
            return sampled, None, None, None
        return sampled, top_ids, top_lp, sampled_lp

    cdef int _run_call(self, int n, const int32_t * tok, const int32_t * pos, const int32_t * seq,
                       const int8_t * want, int k, int32_t * out_ids, float * out_lp,
                       int32_t * out_top, float * out_top_lp, int * bad_row,
                       double * times) noexcept nogil:
        """One llama_decode over n rows, then every row with want != 0 sampled with
        its slot's sampler (and, with WANT_LOGPROBS, its top-k log-probabilities, k
        apart in out_top*). Returns llama_decode's code (or an injected fault's);
        a row without logits ends sampling with its index in bad_row. times:
        batch fill, decode and sampling seconds. Shared by step() and BatchLoop."""
        cdef int i, rc, injected = 0
        cdef double t0 = _now(), t1, t2
        if self.fault_step >= 0 and self.steps_done == self.fault_step:
            injected = self.fault_code
            self.fault_step = -1
        self.steps_done += 1
        for i in range(n):
            self.batch.token[i] = tok[i]
            self.batch.pos[i] = pos[i]
            self.batch.n_seq_id[i] = 1
            self.batch.seq_id[i][0] = seq[i]
            self.batch.logits[i] = 1 if want[i] != 0 else 0
        self.batch.n_tokens = n
        t1 = _now()
        if injected == 1 or injected == -1:
            rc = injected
        else:
            rc = llama_decode(self.ctx, self.batch)
            if rc == 0 and injected != 0:
                rc = injected
        if rc == 0:
            self._resolve_logits(n, want)
        if self.n_rpc and (rc == 0 or rc < -1) and self._worker_lost(rc != 0):
            rc = WORKER_LOST_C
        t2 = _now()
        if rc == 0:
            self._sample_rows(n, seq, want, k, out_ids, out_lp, out_top, out_top_lp, bad_row)
        times[0] = t1 - t0
        times[1] = t2 - t1
        times[2] = _now() - t2
        return rc

    def workers_connected(self):
        """{endpoint: whether its connection is up} for the RPC workers (patch 0005)."""
        return {name.decode(): bool(self.rpc_connected(self.rpc_endpoints[i]))
                for i, name in enumerate(self.rpc_names or [])}

    cdef void _resolve_logits(self, int n, const int8_t * want) noexcept nogil:
        """Each output row's logits, in row_logits (NULL for the others). One
        llama_get_logits, so the context is synchronized once a call, not once a
        row (with RPC workers each is a round trip to ggml's dispatcher thread):
        llama.cpp keeps the output rows in the batch's order."""
        cdef float * logits = llama_get_logits(self.ctx)
        cdef int i, j = 0
        for i in range(n):
            self.row_logits[i] = NULL
            if want[i] != 0:
                if logits != NULL:
                    self.row_logits[i] = logits + <size_t> j * self.vocab_size
                j += 1

    cdef bint _worker_lost(self, bint synchronize) noexcept nogil:
        """Whether an RPC worker was lost during (or before) the last llama_decode:
        its results are then not the model's. The decode's graph computes on the
        workers are asynchronous: every command of the step has settled once the
        context is synchronized (by _resolve_logits after a decode that succeeded)."""
        cdef int i
        if synchronize:
            llama_synchronize(self.ctx)
        for i in range(self.n_rpc):
            if not self.rpc_connected(self.rpc_endpoints[i]):
                return True
        return False

    cdef void _sample_rows(self, int n, const int32_t * seq, const int8_t * want, int k,
                           int32_t * out_ids, float * out_lp, int32_t * out_top,
                           float * out_top_lp, int * bad_row) noexcept nogil:
        """Sample every row with want != 0 (see _run_call). Rows are independent (one
        slot each, its own sampler), so several are sampled at once on llama.cpp's
        OpenMP threads, which spin idle between two llama_decode calls; a row's
        result does not depend on which thread samples it. Their logits were
        looked up before (_resolve_logits), on this thread."""
        cdef int i, wanted = 0
        for i in range(n):
            if want[i] != 0:
                wanted += 1
        cdef int threads = min(self.sample_threads, wanted)
        if threads > 1:
            for i in prange(n, num_threads=threads, schedule="dynamic"):
                self._sample_row(i, seq[i], want[i], k, out_ids, out_lp, out_top, out_top_lp,
                                 threadid())
        else:
            for i in range(n):
                self._sample_row(i, seq[i], want[i], k, out_ids, out_lp, out_top, out_top_lp, 0)
        for i in range(n):
            if want[i] != 0 and out_ids[i] < 0:
                bad_row[0] = i
                break

    cdef void _sample_row(self, int row, int slot, int8_t want, int k, int32_t * out_ids,
                          float * out_lp, int32_t * out_top, float * out_top_lp,
                          int tid) noexcept nogil:
        """One row's token (-1 without logits) and, if asked, its log-probabilities,
        with thread `tid`'s scratch."""
        if want == 0:
            return
        cdef const float * logits = self.row_logits[row]
        cdef int token
        if logits == NULL:
            out_ids[row] = -1
            return
        if self.greedy_slot[slot]:
            token = _argmax(<float *> logits, self.vocab_size, self._bans(slot),
                            self._n_banned(slot), self.eog_saved + tid * (self.n_eog + MAX_STOP_IDS))
        else:
            token = self._sample_chain(slot, logits,
                                       self.candidates + <size_t> tid * self.vocab_size)
        if token >= 0:
            self.sampled_n[slot] += 1
        if token >= 0 and k > 0 and (want & 2):
            if not _logprobs(logits, self.vocab_size, k, token, out_top + row * k,
                             out_top_lp + row * k, out_lp + row):
                token = -1
        out_ids[row] = token

    cdef inline llama_logit_bias * _bans(self, int slot) noexcept nogil:
        return self.bans + slot * (self.n_eog + MAX_STOP_IDS)

    cdef inline int _n_banned(self, int slot) noexcept nogil:
        """How many of the slot's bans hold for its next token."""
        if self.sampled_n[slot] < self.ban_until[slot]:
            return self.n_bans[slot]
        return self.n_bans_always[slot]

    cdef void _fill(self, int slot, const float * logits,
                    llama_token_data * candidates) noexcept nogil:
        """The whole vocabulary as the chain's candidates, the slot's bans applied."""
        cdef int j
        cdef llama_logit_bias * bans = self._bans(slot)
        for j in range(self.vocab_size):
            candidates[j].id = j
            candidates[j].logit = logits[j]
            candidates[j].p = 0.0
        for j in range(self._n_banned(slot)):
            candidates[bans[j].token].logit = -INFINITY

    cdef int _sample_chain(self, int slot, const float * logits,
                           llama_token_data * candidates) noexcept nogil:
        """A token from the slot's sampler chain over the whole vocabulary, as
        llama_sampler_sample does (which cannot run on two threads at once: it
        looks the logits up itself). With a grammar, as llama.cpp's common sampler
        does: the chain picks freely and the grammar checks only that pick; only a
        rejected pick makes the grammar constrain every candidate before the chain
        runs again. For a sampled row that is exactly the constrained distribution
        (a rejected pick is redrawn from it), and it spares a grammar check of the
        whole vocabulary per step that would stall every other row."""
        cdef llama_sampler * grammar = self.grammars[slot]
        cdef int token = self._pick(slot, logits, candidates, NULL)
        if grammar != NULL and token >= 0 and not _grammar_allows(grammar, token):
            token = self._pick(slot, logits, candidates, grammar)
        if token < 0:
            return -1
        if grammar != NULL:
            llama_sampler_accept(grammar, token)
        llama_sampler_accept(self.samplers[slot], token)
        return token

    cdef int _pick(self, int slot, const float * logits, llama_token_data * candidates,
                   llama_sampler * grammar) noexcept nogil:
        """The chain's pick (-1: none) over the whole vocabulary with the slot's bans,
        constrained first by `grammar` when given; accepts nothing."""
        cdef llama_token_data_array cur
        self._fill(slot, logits, candidates)
        cur.data = candidates
        cur.size = self.vocab_size
        cur.selected = -1
        cur.sorted = False
        if grammar != NULL:
            llama_sampler_apply(grammar, &cur)
        llama_sampler_apply(self.samplers[slot], &cur)
        if cur.selected < 0 or cur.selected >= <int> cur.size:
            return -1
        return cur.data[cur.selected].id

    cdef _reconcile(self, cnp.ndarray[int32_t, ndim=1] pos_before):
        # llama.cpp keeps the ubatches it processed before an abort or a fatal
        # error; drop them so every slot is back where the step found it.
        for s in range(self.n_slots):
            if pos_before[s] != -2:
                llama_memory_seq_rm(self.mem, s, pos_before[s] + 1, -1)


cdef class BatchLoop:
    """The batch-assembly loop: steps every session of a node, on the engine
    thread, without the GIL and without waiting for Trio between steps.

    The node talks to it through a mailbox and an event ring, both under one
    mutex held only for microseconds:

    - the node's requests (`start`, `credit`, `request_finish`, `stop`) change
      the slot table and wake the loop when it idles;
    - each step (module doc of dgr._scheduler: plan, one llama_decode for the
      decode rows and one per prefill chunk, sampling, post-step update)
      appends its events to a bounded ring and writes to `wake_fd` (an
      eventfd the node's Trio task waits on); `drain` takes them.

    The loop keeps stepping while it has rows to run and room in the ring for
    one more step's events; a full ring (the node fell behind) stops it until
    the node drains, so nothing between the two grows without bound. Ended
    slots' KV cells are freed before their EV_FINISH is published, but for
    what a slot was told to keep (a prefix cache entry).

    KV changes the node asks for (a start that reuses cells of another slot's
    sequence, an eviction) are queued and applied by the loop between steps,
    in order, since llama.cpp's KV cache may only change on its thread.
    """

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
    cdef Event * scratch
    cdef int step_cap
    cdef int32_t * row_tok
    cdef int32_t * row_pos
    cdef int32_t * row_seq
    cdef int8_t * row_want
    cdef int32_t * sampled
    cdef float * chosen_lp
    cdef int32_t * top_ids
    cdef float * top_lp
    cdef int * call_rc
    cdef int64_t steps
    cdef double mark
    cdef int cells_used_now
    cdef int * pos_max_now
    cdef bint * keep_kv            # per slot: its sequence keeps its KV when it ends (cache)
    cdef int * op_slot             # queued KV changes: see _apply_kv_ops
    cdef int * op_src
    cdef int * op_keep
    cdef int n_ops, ops_cap
    cdef int64_t ops_queued, ops_done

    def __cinit__(self):
        self.sync_ready = False
        self.ring = self.scratch = NULL
        self.row_tok = self.row_pos = self.row_seq = self.sampled = self.top_ids = NULL
        self.row_want = NULL
        self.chosen_lp = self.top_lp = NULL
        self.call_rc = self.pos_max_now = NULL
        self.op_slot = self.op_src = self.op_keep = NULL
        self.keep_kv = NULL

    def __init__(self, Engine engine, Scheduler scheduler, int wake_fd, int ring_steps=32):
        engine._check_open()
        if scheduler.n_slots != engine.n_slots or scheduler.token_budget > engine.batch_capacity:
            raise ValueError("the scheduler's slots and token budget must fit the engine's "
                             f"({engine.n_slots} slots, n_batch {engine.batch_capacity})")
        self.engine = engine
        self.scheduler = scheduler
        self.wake_fd = wake_fd
        self.step_cap = scheduler.max_step_events()
        self.ring_cap = ring_steps * self.step_cap
        cdef int rows = scheduler.token_budget
        self.ring = <Event *> calloc(self.ring_cap, sizeof(Event))
        self.scratch = <Event *> calloc(self.step_cap, sizeof(Event))
        self.row_tok = <int32_t *> calloc(rows, sizeof(int32_t))
        self.row_pos = <int32_t *> calloc(rows, sizeof(int32_t))
        self.row_seq = <int32_t *> calloc(rows, sizeof(int32_t))
        self.row_want = <int8_t *> calloc(rows, sizeof(int8_t))
        self.sampled = <int32_t *> calloc(rows, sizeof(int32_t))
        self.chosen_lp = <float *> calloc(rows, sizeof(float))
        self.top_ids = <int32_t *> calloc(rows * MAX_LOGPROBS, sizeof(int32_t))
        self.top_lp = <float *> calloc(rows * MAX_LOGPROBS, sizeof(float))
        self.call_rc = <int *> calloc(1 + scheduler.n_slots, sizeof(int))
        self.pos_max_now = <int *> malloc(scheduler.n_slots * sizeof(int))
        self.keep_kv = <bint *> calloc(scheduler.n_slots, sizeof(bint))
        # a start and an eviction or two per slot between two loop iterations; more
        # waits for the loop (_queue_kv_op)
        self.ops_cap = 4 * scheduler.n_slots + 4
        self.op_slot = <int *> calloc(self.ops_cap, sizeof(int))
        self.op_src = <int *> calloc(self.ops_cap, sizeof(int))
        self.op_keep = <int *> calloc(self.ops_cap, sizeof(int))
        if (self.keep_kv == NULL or self.op_slot == NULL or self.op_src == NULL
                or self.op_keep == NULL):
            raise MemoryError()
        if (self.ring == NULL or self.scratch == NULL or self.row_tok == NULL
                or self.row_pos == NULL or self.row_seq == NULL or self.row_want == NULL
                or self.sampled == NULL or self.chosen_lp == NULL or self.top_ids == NULL
                or self.top_lp == NULL or self.call_rc == NULL or self.pos_max_now == NULL):
            raise MemoryError()
        for s in range(scheduler.n_slots):
            self.pos_max_now[s] = -1
        pthread_mutex_init(&self.lock, NULL)
        pthread_cond_init(&self.wake, NULL)
        pthread_cond_init(&self.ops_room, NULL)
        self.sync_ready = True

    def __dealloc__(self):
        if self.sync_ready:
            pthread_cond_destroy(&self.wake)
            pthread_cond_destroy(&self.ops_room)
            pthread_mutex_destroy(&self.lock)
        free(self.ring); free(self.scratch)
        free(self.row_tok); free(self.row_pos); free(self.row_seq); free(self.row_want)
        free(self.sampled); free(self.chosen_lp); free(self.top_ids); free(self.top_lp)
        free(self.call_rc); free(self.pos_max_now)
        free(self.keep_kv); free(self.op_slot); free(self.op_src); free(self.op_keep)

    # ------------------------------------------------------------ the node's side (GIL held)

    def start(self, int slot, prompt, int max_tokens, *, int n_logprobs=0, bint ignore_eos=False,
              int credits=1, double temperature=0.0, int top_k=0, double top_p=1.0,
              double min_p=0.0, seed=0, int reuse_from=-1, int n_reused=0, bint keep_kv=False,
              logit_bias=(), int repeat_last_n=64, double repeat_penalty=1.0,
              double frequency_penalty=0.0, double presence_penalty=0.0, grammar=None,
              int min_tokens=0, stop_token_ids=()):
        """Run a session on a free slot (one whose EV_FINISH the node has seen).

        The slot's sequence first drops what it holds (a cache entry), but for
        the KV of prompt positions [0, n_reused) taken from slot `reuse_from`'s
        sequence (its own when reuse_from == slot): a shared prefix, which the
        session then does not prefill. With keep_kv, when the session ends (but
        with an error) its sequence keeps its KV: the prompt it prefilled and the
        tokens it fed back (a prefix cache entry); otherwise it is freed."""
        if n_reused and not 0 <= reuse_from < self.scheduler.n_slots:
            raise ValueError(f"reuse_from {reuse_from} is not a slot")
        # The loop leaves a free slot's sampler alone, so it is set outside the lock.
        self.engine.set_sampling(slot, temperature, top_k, top_p, min_p, seed, ignore_eos,
                                 logit_bias, repeat_last_n, repeat_penalty, frequency_penalty,
                                 presence_penalty, grammar, min_tokens, stop_token_ids)
        pthread_mutex_lock(&self.lock)
        try:
            self.scheduler.start(slot, prompt, max_tokens, n_logprobs, ignore_eos, credits, n_reused)
            self._queue_kv_op(slot, reuse_from if n_reused else -1, n_reused)
            self.keep_kv[slot] = keep_kv
            pthread_cond_signal(&self.wake)
        finally:
            pthread_mutex_unlock(&self.lock)

    def evict(self, int slot):
        """Drop what a free slot's sequence holds (a prefix cache entry)."""
        if not 0 <= slot < self.scheduler.n_slots:
            raise ValueError(f"slot {slot} out of range")
        pthread_mutex_lock(&self.lock)
        try:
            self._queue_kv_op(slot, -1, 0)
            pthread_cond_signal(&self.wake)
        finally:
            pthread_mutex_unlock(&self.lock)

    cdef void _queue_kv_op(self, int slot, int src, int keep) except *:
        """Queue a KV change (lock held). A full queue (sessions started and cancelled
        faster than one step) waits for the loop to apply it."""
        while self.n_ops == self.ops_cap and not self.stopping:
            pthread_cond_signal(&self.wake)
            pthread_cond_wait(&self.ops_room, &self.lock)
        if self.n_ops == self.ops_cap:
            raise RuntimeError("the batch loop stopped with KV changes queued")
        self.op_slot[self.n_ops] = slot
        self.op_src[self.n_ops] = src
        self.op_keep[self.n_ops] = keep
        self.n_ops += 1
        self.ops_queued += 1

    @property
    def kv_ops_queued(self):
        """KV changes asked for so far (starts and evictions)."""
        return self.ops_queued

    @property
    def kv_ops_published(self):
        """KV changes applied by the loop and published (cells_used, pos_max show them)."""
        return self.ops_done

    def credit(self, int slot, int n=1):
        """The slot's reader took n tokens; it may be sent n more."""
        pthread_mutex_lock(&self.lock)
        try:
            self.scheduler.credit(slot, n)
            pthread_cond_signal(&self.wake)
        finally:
            pthread_mutex_unlock(&self.lock)

    def request_finish(self, int slot, int reason=FINISH_CANCELLED):
        """End the slot before its next row; an EV_FINISH follows."""
        pthread_mutex_lock(&self.lock)
        try:
            self.scheduler.request_finish(slot, reason)
            pthread_cond_signal(&self.wake)
        finally:
            pthread_mutex_unlock(&self.lock)

    def stop(self):
        """Make run() return: after the step in flight, which the abort flag cuts short."""
        self.engine.request_abort()
        pthread_mutex_lock(&self.lock)
        self.stopping = True
        pthread_cond_signal(&self.wake)
        pthread_cond_broadcast(&self.ops_room)
        pthread_mutex_unlock(&self.lock)

    def drain(self):
        """The events published since the last drain, oldest first (as tuples, see
        dgr._scheduler.event_tuple)."""
        cdef int n, i, first
        cdef Event * taken
        pthread_mutex_lock(&self.lock)
        n = self.ring_len
        taken = <Event *> malloc(max(n, 1) * sizeof(Event))
        if taken != NULL:
            for i in range(n):
                memcpy(&taken[i], &self.ring[(self.ring_head + i) % self.ring_cap], sizeof(Event))
            self.ring_head = (self.ring_head + n) % self.ring_cap
            self.ring_len = 0
            pthread_cond_signal(&self.wake)
        pthread_mutex_unlock(&self.lock)
        if taken == NULL:
            raise MemoryError()
        try:
            return [event_tuple(&taken[i]) for i in range(n)]
        finally:
            free(taken)

    @property
    def cells_used(self):
        """KV cells holding tokens after the last published step."""
        return self.cells_used_now

    def pos_max(self, int slot):
        """The slot's largest KV position after the last published step (-1: none)."""
        if not 0 <= slot < self.scheduler.n_slots:
            raise ValueError(f"slot {slot} out of range")
        return self.pos_max_now[slot]

    def run(self):
        """Step until stop(); call it on the engine thread (the GIL is released throughout)."""
        with nogil:
            self._run()

    # ------------------------------------------------------------ the loop (nogil)

    cdef void _run(self) noexcept nogil:
        cdef int n_events, rows, n_ops
        pthread_mutex_lock(&self.lock)
        self.mark = _now()
        while not self.stopping:
            if self.ring_cap - self.ring_len < self.step_cap:
                self._wake_node()
                pthread_cond_wait(&self.wake, &self.lock)  # until the node drains
                self.mark = _now()
                continue
            n_ops = self._apply_kv_ops()
            n_events = self.scheduler.take_finish_requests(self.scratch)
            rows = self.scheduler.plan()
            if rows > 0:
                self._step(n_events)
                self.ops_done += n_ops
                continue
            if n_events or n_ops:
                self._release_finished(n_events)
                self.ops_done += n_ops
                self._publish(n_events)
                continue
            self._wake_node()
            pthread_cond_wait(&self.wake, &self.lock)
            self.mark = _now()
        self._wake_node()
        pthread_mutex_unlock(&self.lock)

    cdef void _wake_node(self) noexcept nogil:
        """Wake the node's pump for the events published since it was last woken.
        Done where the lock is about to be let go (before a wait, or just after the
        next step's rows are filled), so the pump does not wake only to block on
        the lock while the next step is planned."""
        cdef uint64_t one = 1
        if self.wake_pending:
            self.wake_pending = False
            write(self.wake_fd, &one, sizeof(one))

    cdef void _step(self, int n_events) noexcept nogil:
        """Run the planned step; entered and left with the lock held, which is
        released while llama.cpp runs."""
        cdef StepFigures figures
        cdef double times[3]
        cdef double started = self.mark, unlocked, relocked, ended
        cdef double fill_s = 0.0, decode_s = 0.0, sample_s = 0.0
        cdef int rows = self.scheduler.plan_rows(), call, start, end, bad_row, rc, n_calls = 0
        memset(&figures, 0, sizeof(StepFigures))
        self._fill_rows()
        unlocked = _now()
        pthread_mutex_unlock(&self.lock)
        self._wake_node()
        # one_call: every row in call 0. Otherwise call 0: the decode rows (when there
        # are any); call 1 + c: chunk c, alone.
        for call in range(1 if self.scheduler.one_call else 1 + self.scheduler.n_chunks):
            start = 0 if call == 0 else self.scheduler.chunk_offset(call - 1)
            end = (rows if self.scheduler.one_call else
                   self.scheduler.n_decode if call == 0 else self.scheduler.chunk_offset(call))
            if end == start:
                continue
            bad_row = -1
            rc = self.engine._run_call(
                end - start, self.row_tok + start, self.row_pos + start, self.row_seq + start,
                self.row_want + start, MAX_LOGPROBS, self.sampled + start, self.chosen_lp + start,
                self.top_ids + start * MAX_LOGPROBS, self.top_lp + start * MAX_LOGPROBS,
                &bad_row, times)
            if rc == FAULT_RAISE_C:
                rc = ENGINE_FAULT_C
            elif rc == 0 and bad_row >= 0:
                self.sampled[start + bad_row] = -1  # the scheduler ends that session
            self.call_rc[call] = rc
            n_calls += 1
            fill_s += times[0]
            decode_s += times[1]
            sample_s += times[2]
        relocked = _now()
        pthread_mutex_lock(&self.lock)
        n_events += self.scheduler.update(self.sampled, self.call_rc, self.chosen_lp, self.top_ids,
                              self.top_lp, self.scratch + n_events, &figures)
        self._release_finished(n_events)
        self.steps += 1
        figures.index = self.steps
        figures.rows = rows
        figures.calls = n_calls
        figures.plan_s = unlocked - started + fill_s
        figures.decode_s = decode_s
        figures.sample_s = sample_s
        ended = _now()
        figures.update_s = ended - relocked
        figures.total_s = ended - started
        figures.ended_at = ended
        self.scratch[n_events].kind = EV_STEP
        self.scratch[n_events].step = figures
        self._publish(n_events + 1)

    cdef void _fill_rows(self) noexcept nogil:
        """The plan's rows from the slot table: decode rows, then each chunk."""
        cdef int i, c, s, row = 0, p
        for i in range(self.scheduler.n_decode):
            s = self.scheduler.decode_slots[i]
            self.row_tok[row] = self.scheduler.slots[s].last_token
            self.row_pos[row] = self.scheduler.slots[s].n_prefilled + self.scheduler.slots[s].n_generated - 1
            self.row_seq[row] = s
            self.row_want[row] = WANT_SAMPLE_C | (WANT_LOGPROBS_C if self.scheduler.slots[s].n_logprobs else 0)
            row += 1
        for c in range(self.scheduler.n_chunks):
            s = self.scheduler.chunk_slot[c]
            for p in range(self.scheduler.chunk_start[c], self.scheduler.chunk_end[c]):
                self.row_tok[row] = self.scheduler.slots[s].prompt[p]
                self.row_pos[row] = p
                self.row_seq[row] = s
                self.row_want[row] = 0
                row += 1
            if self.scheduler.chunk_end[c] == self.scheduler.slots[s].n_prompt:
                self.row_want[row - 1] = WANT_SAMPLE_C | (
                    WANT_LOGPROBS_C if self.scheduler.slots[s].n_logprobs else 0)

    cdef int _apply_kv_ops(self) noexcept nogil:
        """The queued KV changes, in order: a slot's sequence keeps positions
        [0, keep) of its own (src == slot), of another slot's (src: copied, which
        in a unified cache only adds the sequence to those cells) or nothing
        (src == -1, keep == 0: an eviction)."""
        cdef int i, s, src, keep, n
        for i in range(self.n_ops):
            s, src, keep = self.op_slot[i], self.op_src[i], self.op_keep[i]
            if src >= 0 and src != s:
                llama_memory_seq_rm(self.engine.mem, s, -1, -1)
                llama_memory_seq_cp(self.engine.mem, src, s, 0, keep)
            else:
                llama_memory_seq_rm(self.engine.mem, s, keep, -1)
            if keep > 0 and (llama_memory_seq_pos_min(self.engine.mem, s) != 0
                             or llama_memory_seq_pos_max(self.engine.mem, s) != keep - 1):
                # the sequence lacks positions the node counted on (a bug, never expected):
                # prefill the whole prompt rather than compute on missing KV
                llama_memory_seq_rm(self.engine.mem, s, -1, -1)
                if self.scheduler.slots[s].phase == SLOT_PREFILL:
                    self.scheduler.slots[s].n_prefilled = 0
        n, self.n_ops = self.n_ops, 0
        if n:
            pthread_cond_broadcast(&self.ops_room)
        return n

    cdef void _release_finished(self, int n_events) noexcept nogil:
        """Ended slots: their samplers reset, their KV freed but for the positions
        they were told to keep (a prefix cache entry: the prompt it prefilled and the
        tokens it fed back; nothing after an error)."""
        cdef int i, s, keep
        cdef Slot * sl
        for i in range(n_events):
            if self.scratch[i].kind == EV_FINISH:
                s = self.scratch[i].slot
                sl = &self.scheduler.slots[s]
                keep = 0
                if self.keep_kv[s] and self.scratch[i].reason != FINISH_ERROR:
                    keep = sl.n_prefilled + (sl.n_generated - 1 if sl.n_generated > 0 else 0)
                llama_memory_seq_rm(self.engine.mem, s, keep, -1)
                llama_sampler_reset(self.engine.samplers[s])

    cdef void _publish(self, int n_events) noexcept nogil:
        """Append the scratch events to the ring and note the KV now held; the node is
        woken for them by _wake_node."""
        cdef int i, s, hi, total = 0
        for i in range(n_events):
            memcpy(&self.ring[(self.ring_head + self.ring_len) % self.ring_cap], &self.scratch[i],
                   sizeof(Event))
            self.ring_len += 1
        for s in range(self.scheduler.n_slots):
            hi = llama_memory_seq_pos_max(self.engine.mem, s)
            self.pos_max_now[s] = hi
            if hi >= 0:
                total += hi - llama_memory_seq_pos_min(self.engine.mem, s) + 1
        self.cells_used_now = total
        self.wake_pending = True
        self.mark = _now()


cdef int _argmax(float * logits, int n_vocab, const llama_logit_bias * banned, int n_banned,
                 float * saved) noexcept nogil:
    """Index of the first largest logit, skipping the n_banned tokens of `banned`
    (their logits are set aside in `saved` for the search and put back); -1
    without logits."""
    if logits == NULL:
        return -1
    cdef int j
    for j in range(n_banned):
        saved[j] = logits[banned[j].token]
        logits[banned[j].token] = -INFINITY
    cdef int best = dgr_argmax(logits, n_vocab)
    for j in range(n_banned):
        logits[banned[j].token] = saved[j]
    return best if best >= 0 else 0


cdef bint _grammar_allows(llama_sampler * grammar, int token) noexcept nogil:
    """Whether the grammar, in its current state, accepts `token` next."""
    cdef llama_token_data one
    cdef llama_token_data_array single
    one.id = token
    one.logit = 1.0
    one.p = 0.0
    single.data = &one
    single.size = 1
    single.selected = -1
    single.sorted = False
    llama_sampler_apply(grammar, &single)
    return single.data[0].logit != -INFINITY


cdef bint _logprobs(const float * logits, int n_vocab, int k, int chosen,
                    int32_t * top_ids, float * top_lp, float * chosen_lp) noexcept nogil:
    """Top-k log-softmax of one logits row, best first, and the chosen token's."""
    if logits == NULL:
        return False
    cdef int i, j
    cdef float mx = -INFINITY
    for i in range(n_vocab):
        if logits[i] > mx:
            mx = logits[i]
    cdef double total = 0.0
    for i in range(n_vocab):
        total += expf(logits[i] - mx)
    cdef float log_z = mx + logf(<float> total)
    cdef int filled = 0
    cdef float v
    for i in range(n_vocab):
        v = logits[i]
        if filled == k and v <= top_lp[k - 1]:
            continue
        j = filled if filled < k else k - 1
        while j > 0 and top_lp[j - 1] < v:
            top_lp[j] = top_lp[j - 1]
            top_ids[j] = top_ids[j - 1]
            j -= 1
        top_lp[j] = v
        top_ids[j] = i
        if filled < k:
            filled += 1
    for j in range(filled):
        top_lp[j] -= log_z
    chosen_lp[0] = logits[chosen] - log_z if 0 <= chosen < n_vocab else -INFINITY
    return True


def _decode_error(int rc):
    if rc == 1:
        return KVSlotUnavailable("llama_decode: no KV slot for the batch (code 1)")
    if rc == 2:
        return DecodeAborted("llama_decode: aborted (code 2)")
    if rc == -1:
        return InvalidBatch("llama_decode: invalid input batch (code -1)")
    if rc == WORKER_LOST_C:
        return WorkerLost("an RPC worker was lost (connection closed, reset or timed out); "
                          "restart the node once the worker is back")
    if rc < -1:
        return FatalDecodeError(f"llama_decode: fatal error (code {rc})", rc)
    return DecodeError(f"llama_decode: unexpected return code {rc}", rc)
