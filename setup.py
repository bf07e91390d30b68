"""Builds the Cython engine dgr._batch (against the pinned llama.cpp) and its
scheduler dgr._scheduler (pure C).

Headers come from vendor/llama.cpp (materialized by scripts/vendor_llama.py
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
VENDOR = ROOT / "vendor" / "llama.cpp"


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
extension = Extension(
    "dgr._batch",
    sources=["dgr/_batch.pyx"],
    # ggml/src: ggml-backend-impl.h, for a worker's memory-capped CPU device (dgr_cpu_offering)
    include_dirs=[str(VENDOR / "include"), str(VENDOR / "ggml" / "include"),
                  str(VENDOR / "ggml" / "src"), numpy.get_include()],
    library_dirs=[str(lib_dir)],
    libraries=["llama", "ggml", "ggml-base"],
    runtime_library_dirs=[str(lib_dir)],
    define_macros=[("NPY_NO_DEPRECATED_API", "NPY_1_7_API_VERSION")],
    # OpenMP, as llama.cpp's CPU backend: rows are sampled on the same thread team
    extra_compile_args=["-O3", "-fopenmp"],
    extra_link_args=["-fopenmp"],
)

# The scheduler is pure C: no llama.cpp, so its tests need no model.
scheduler = Extension("dgr._scheduler", sources=["dgr/_scheduler.pyx"], extra_compile_args=["-O3"])

setup(ext_modules=cythonize([scheduler, extension], compiler_directives={"language_level": 3}))
