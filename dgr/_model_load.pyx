# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True
"""Loading a model's weights for the engine (dgr._engine.Engine), and where each
tensor goes: layers placed on RPC workers (dgr._rpc.connect_and_place; the output
layer's tensors stay here, so each sampled row's logits are made where they are
sampled), the weights whose names match a pattern of `repack` (dgr.weight_repack) in
llama.cpp's CPU_REPACK buffer type, every weight there with weight_repack."""

import os

from libc.stdlib cimport calloc, free
from libc.string cimport strcmp

from dgr._backend cimport clear_log, error_lines
from dgr._llama cimport *

from dgr._backend import llama_log_text, system_info
from dgr.errors import ContextError, ModelLoadError
from dgr.llama_log import buffer_sizes
from dgr._rpc import connect_and_place


# the output layer's tensors (a tied output is the token embedding, duplicated)
cdef const char * _OUTPUT_TENSORS = b"^(output|output_norm|token_embd)\\."


cdef ggml_backend_buffer_type_t _cpu_extra_buffer_type(const char * name) except NULL:
    """The CPU device's extra buffer type called `name` (llama.cpp's CPU_REPACK)."""
    cdef ggml_backend_dev_t dev = ggml_backend_dev_by_type(GGML_BACKEND_DEVICE_TYPE_CPU)
    cdef ggml_backend_dev_get_extra_bufts_t get = <ggml_backend_dev_get_extra_bufts_t> (
        ggml_backend_reg_get_proc_address(ggml_backend_dev_backend_reg(dev),
                                          b"ggml_backend_dev_get_extra_bufts"))
    cdef ggml_backend_buffer_type_t * buft = get(dev) if get != NULL else NULL
    while buft != NULL and buft[0] != NULL:
        if strcmp(ggml_backend_buft_name(buft[0]), name) == 0:
            return buft[0]
        buft += 1
    raise ContextError(f"this llama.cpp build has no {name.decode()} buffer type to repack weights in")


cdef object load_model(str path, bint weight_repack, repack, rpc_servers, int rpc_layers,
                       rpc_split, double rpc_timeout_s, llama_model ** out):
    """The model at `path` into out[0] (ModelLoadError saying why where llama.cpp
    refuses it); returns (the RPC placement or None, the bytes repacked)."""
    if weight_repack and "AMX_INT8 = 1" in system_info():
        # On some machines (VMs among them) the pinned llama.cpp's AMX matmul faults
        # at its first tile instruction; refuse rather than crash the process.
        raise ContextError("weight_repack is not supported on this CPU: llama.cpp's AMX "
                           "repacked matmul crashes here; leave weight repacking off")
    cdef llama_model_params mparams = llama_model_default_params()
    mparams.n_gpu_layers = 0
    mparams.use_extra_bufts = weight_repack
    cdef bytes bpath = path.encode()
    cdef const char * cpath = bpath
    cdef ggml_backend_dev_t * devices = NULL
    cdef float * split = NULL
    cdef llama_model_tensor_buft_override * overrides = NULL
    cdef int n_overrides = 0
    if rpc_servers:
        # read by ggml-rpc (patch 0006) when it connects to each worker
        os.environ["GGML_RPC_TIMEOUT"] = repr(max(0.0, rpc_timeout_s))
    placement = connect_and_place(path, list(rpc_servers), rpc_layers, tuple(rpc_split))
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
    patterns = [p.encode() for p in repack]
    overrides = <llama_model_tensor_buft_override *> calloc(
        len(patterns) + 2, sizeof(llama_model_tensor_buft_override))
    if overrides == NULL:
        free(devices); free(split)
        raise MemoryError()
    if placement is not None:
        overrides[0].pattern = _OUTPUT_TENSORS
        overrides[0].buft = ggml_backend_cpu_buffer_type()
        n_overrides = 1
    try:
        for pattern in patterns:
            overrides[n_overrides].pattern = pattern
            overrides[n_overrides].buft = _cpu_extra_buffer_type(b"CPU_REPACK")
            n_overrides += 1
        mparams.tensor_buft_overrides = overrides if n_overrides else NULL
        clear_log()
        with nogil:
            out[0] = llama_model_load_from_file(cpath, mparams)
    finally:
        free(devices); free(split); free(overrides)  # read while loading only
    if out[0] == NULL:
        raise ModelLoadError(f"cannot load model {path}: "
                             f"{error_lines() or 'llama.cpp refused it'}")
    repacked_bytes = buffer_sizes(llama_log_text())["CPU_REPACK model"]
    return placement, repacked_bytes
