# cython: language_level=3
"""ggml's RPC backend, the parts that call C: connecting to workers and listing
their devices, the model's layer count, patch 0005's connection check, and
serving this machine's CPU backend (`python -m dgr worker`). Where layers go
is decided in dgr.rpc_placement."""

import os

from dgr._llama cimport *
from dgr._backend cimport error_lines, init_backend

from dgr.errors import ModelLoadError
from dgr.rpc_placement import check_worker, place_layers

cdef extern from "dgr_rpc_offer.h" nogil:
    ggml_backend_dev_t dgr_cpu_offering(size_t bytes)

PROTOCOL = (RPC_PROTO_MAJOR_VERSION, RPC_PROTO_MINOR_VERSION)


cdef void * _proc(const char * name) except NULL:
    """An entry point of ggml's RPC backend (ggml-rpc.h), or ModelLoadError."""
    init_backend()
    cdef ggml_backend_reg_t reg = ggml_backend_reg_by_name(b"RPC")
    if reg == NULL:
        raise ModelLoadError("this llama.cpp build has no RPC backend (build it with "
                             "-DGGML_RPC=ON: scripts/build_llama.py does)")
    cdef void * fn = ggml_backend_reg_get_proc_address(reg, name)
    if fn == NULL:
        raise ModelLoadError(f"the RPC backend lacks {name.decode()}")
    return fn


def connect_workers(servers):
    """Connect to each "host:port" (after check_worker) and list its devices:
    [{endpoint, name, description, handle, free_bytes, total_bytes}]."""
    cdef rpc_add_server_fn add_server = <rpc_add_server_fn> _proc(b"ggml_backend_rpc_add_server")
    cdef ggml_backend_reg_t reg
    cdef ggml_backend_dev_t dev
    cdef size_t free_b, total_b
    cdef bytes endpoint
    cdef const char * c_endpoint
    devices = []
    for server in servers:
        check_worker(server, PROTOCOL)
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
    return devices


def connect_and_place(path, servers, int rpc_layers, split):
    """Connect to the RPC workers and place the model's layers on them
    (dgr.rpc_placement.place_layers); None without workers."""
    if not servers:
        return None
    return place_layers(connect_workers(servers), layer_count(path), rpc_layers, split,
                        os.path.getsize(path))


def connected_check():
    """The address of patch 0005's ggml_backend_rpc_connected (for dgr._engine)."""
    return <size_t> _proc(b"ggml_backend_rpc_connected")


def layer_count(path):
    """The model's layer count from its metadata ({arch}.block_count), read by a
    vocabulary-only load (which leaves llama_model_n_layer at 0)."""
    init_backend()
    cdef llama_model_params params = llama_model_default_params()
    params.vocab_only = True
    cdef bytes bpath = os.fsencode(path)
    cdef const char * cpath = bpath
    cdef llama_model * probe
    with nogil:
        probe = llama_model_load_from_file(cpath, params)
    if probe == NULL:
        raise ModelLoadError(f"cannot read the model's metadata: "
                             f"{error_lines() or 'llama.cpp refused it'}")
    cdef char buf[256]
    cdef int n = llama_model_meta_val_str(probe, b"general.architecture", buf, sizeof(buf))
    arch = buf[:n].decode() if n > 0 else ""
    key = f"{arch}.block_count".encode()
    n = llama_model_meta_val_str(probe, key, buf, sizeof(buf))
    llama_model_free(probe)
    if n <= 0 or not buf[:n].isdigit():
        raise ModelLoadError(f"the model's metadata has no {key.decode()}")
    return int(buf[:n])


def serve_rpc(str endpoint, int n_threads, cache_dir=None, size_t mem_bytes=0):
    """Serve this machine's CPU backend to ggml RPC clients (llama.cpp's
    rpc-server, in this process so that it runs dgr's patched kernels). Blocks
    until the process ends; returns only if it cannot listen. mem_bytes > 0:
    report at most that much memory to nodes (which place layers within it)."""
    cdef rpc_start_server_fn start = <rpc_start_server_fn> _proc(
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
