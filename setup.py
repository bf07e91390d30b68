"""Builds dgr's Cython modules: the engine (dgr._engine) and its model's loading
(dgr._model_load), its sampling (dgr._sampling), the batch loop (dgr._batch) and its
mailbox (dgr._mailbox), the engine's checked step for tests and tools (dgr._step)
and the RPC worker (dgr._rpc) against the pinned llama.cpp, with their C helpers from dgr/csrc; the scheduler
(dgr._scheduler) over its slot table (dgr._slots), its speculation policy
(dgr._speculation), the drafts (dgr._drafts), the node's store of outputs they draft
from (dgr._ngram_store) and the shared codes (dgr._codes) are pure C.

Headers come from vendor/llama.cpp-patched (materialized by scripts/vendor_llama.py
from the sha256-pinned llama-cpp-python sdist). The extension links the
libllama that llama-cpp-python installed under llama_cpp/lib, found through
an rpath, so one libllama serves the whole process and no LD_LIBRARY_PATH is
needed. Build without isolation (see README) so that llama-cpp-python is the
installed one, never a second copy inside a build environment.
"""

import importlib.util
import subprocess
import sys
from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

ROOT = Path(__file__).resolve().parent
# the pinned llama.cpp with patches/series applied: the headers of the libllama dgr links
# (patches add API, patch 0018 the per-sequence adapters)
VENDOR = ROOT / "vendor" / "llama.cpp-patched"


def llama_cpp_lib_dir() -> Path:
    spec = importlib.util.find_spec("llama_cpp")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("dgr needs llama-cpp-python==0.3.36 installed before it is built: "
                 "run scripts/install.sh (see README)")
    lib = Path(next(iter(spec.submodule_search_locations))) / "lib"
    if not (lib / "libllama.so").exists():
        sys.exit(f"llama-cpp-python is installed but {lib}/libllama.so is missing")
    return lib


if not (VENDOR / "include" / "llama.h").exists():
    subprocess.run([sys.executable, str(ROOT / "scripts" / "vendor_llama.py")], check=True)

lib_dir = llama_cpp_lib_dir()
CSRC = "dgr/csrc"


def llama_extension(name: str, *c_sources: str, openmp: bool = False) -> Extension:
    """A module that calls llama.cpp: the pinned headers, the installed libllama."""
    flags = ["-fopenmp"] if openmp else []
    return Extension(
        name, sources=[name.replace(".", "/") + ".pyx", *(f"{CSRC}/{c}" for c in c_sources)],
        # ggml/src: ggml-backend-impl.h, for a worker's memory-capped CPU device
        include_dirs=[CSRC, str(VENDOR / "include"), str(VENDOR / "ggml" / "include"),
                      str(VENDOR / "ggml" / "src"), numpy.get_include()],
        library_dirs=[str(lib_dir)],
        libraries=["llama", "ggml", "ggml-base"],
        runtime_library_dirs=[str(lib_dir)],
        define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
        # a call the headers do not declare is an error, never an implicit int function
        extra_compile_args=["-O3", "-Werror=implicit-function-declaration", *flags],
        extra_link_args=flags,
    )


extensions = [
    # pure C, no llama.cpp: their tests need no model
    Extension("dgr._codes", sources=["dgr/_codes.pyx"]),
    Extension("dgr._events", sources=["dgr/_events.pyx"]),
    Extension("dgr._drafts", sources=["dgr/_drafts.pyx"], extra_compile_args=["-O3"]),
    Extension("dgr._ngram_store", sources=["dgr/_ngram_store.pyx"], extra_compile_args=["-O3"]),
    Extension("dgr._speculation", sources=["dgr/_speculation.pyx"], extra_compile_args=["-O3"]),
    Extension("dgr._slots", sources=["dgr/_slots.pyx"], extra_compile_args=["-O3"]),
    Extension("dgr._scheduler", sources=["dgr/_scheduler.pyx"], extra_compile_args=["-O3"]),
    # rows are sampled on llama.cpp's OpenMP thread team
    llama_extension("dgr._sampling", "dgr_argmax.c", openmp=True),
    llama_extension("dgr._parked"),
    # llama.cpp's log goes to one process-wide callback: its buffer lives here only
    llama_extension("dgr._vocab"),
    llama_extension("dgr._backend", "dgr_log.c"),
    llama_extension("dgr._model_load"),
    llama_extension("dgr._engine"),
    llama_extension("dgr._embed"),
    llama_extension("dgr._kv_ops"),
    llama_extension("dgr._adapters"),
    llama_extension("dgr._mailbox"),
    llama_extension("dgr._batch"),
    llama_extension("dgr._step"),
    llama_extension("dgr._rpc", "dgr_rpc_offer.c"),
]

setup(ext_modules=cythonize(extensions, compiler_directives={"language_level": 3}))
