"""The CPU kernels a bench measures: `native` (this machine's, what the install
builds), or one instruction set only, so that a kind this CPU runs can be measured
here whatever else it has (`avx2`: x86-64 with AVX2, FMA, F16C and BMI2 and no
AVX-512, the kernels of CPUs without it; `avx512`: those and AVX-512 with VNNI).

For a kind other than native, both servers run llama.cpp built for it: dgr the
patched pin's libraries from llama-cpp-python's own build (scripts/build_llama.py,
its wheel cached by the pin, the patch stack and the flags) in
vendor/build-kinds/KIND/lib, which the dgr server process loads instead of the
installed ones (LD_LIBRARY_PATH for dgr's extensions, LLAMA_CPP_LIB_PATH for
llama_cpp's); llama-server the pristine pin built with the same flags
(benchmarks/peers.py). A kind's speed on this CPU is not an older CPU's; the ratio
of the two servers on the same kernels is what a bench reports.
"""

from __future__ import annotations

import os
import platform
import re
import sys
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import build_llama  # noqa: E402
import vendor_llama  # noqa: E402

# llama.cpp's CMake flags of each kind besides native
FLAGS = vendor_llama.X86_KIND_FLAGS
KINDS = ("native", *FLAGS)
# /proc/cpuinfo flags a kind's kernels need
_NEEDS = {"avx2": ("avx2", "fma", "f16c", "bmi2"),
          "avx512": ("avx2", "fma", "f16c", "bmi2", "avx512f", "avx512bw", "avx512dq",
                     "avx512vl", "avx512_vnni")}


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def _flags(cpuinfo: str) -> set[str]:
    found = re.search(r"^flags\s*:\s*(.+)$", cpuinfo, re.M)
    return set(found.group(1).split()) if found else set()


def cpu(cpuinfo: str | None = None) -> str:
    """This machine's CPU in words: its model name and the vector extensions it has."""
    cpuinfo = _cpuinfo() if cpuinfo is None else cpuinfo
    name = re.search(r"^model name\s*:\s*(.+)$", cpuinfo, re.M)
    flags = _flags(cpuinfo)
    vector = ("AVX-512 VNNI" if "avx512_vnni" in flags else "AVX-512" if "avx512f" in flags
              else "AVX2 without AVX-512" if "avx2" in flags else "no AVX2")
    return f"{name.group(1).strip() if name else platform.machine()}, {vector}, " \
           f"{os.cpu_count()} cores"


def check(kind: str, cpuinfo: str | None = None) -> None:
    """Refuse a kind this CPU cannot run, naming what it lacks."""
    if kind == "native":
        return
    flags = _flags(_cpuinfo() if cpuinfo is None else cpuinfo)
    missing = [flag for flag in _NEEDS[kind] if flag not in flags]
    if missing:
        raise SystemExit(f"--cpu-kind {kind}: this CPU lacks {', '.join(missing)}")


def dgr_libraries(kind: str, log=print) -> Path:
    """The folder of the patched pin's libraries built for `kind` (built once)."""
    pin = vendor_llama.read_pin()
    cmake_args = f"{build_llama.DEFAULT_CMAKE_ARGS} {' '.join(FLAGS[kind])}"
    key = build_llama.build_key(pin, cmake_args)
    folder = ROOT / "vendor" / "build-kinds" / kind
    stamp = folder / ".dgr-build"
    if stamp.exists() and stamp.read_text() == key:
        return folder / "lib"
    cache = build_llama.wheel_cache() / key
    wheels = sorted(cache.glob("llama_cpp_python-*.whl")) if cache.is_dir() else []
    if not wheels:
        log(f"building llama-cpp-python's libraries for --cpu-kind {kind} (once; minutes)")
        wheels = [build_llama.build_wheel(pin, cmake_args, cache)]
    (folder / "lib").mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(wheels[0]) as wheel:
        for member in wheel.namelist():
            if member.startswith("llama_cpp/lib/") and not member.endswith("/"):
                target = folder / "lib" / Path(member).name
                target.write_bytes(wheel.read(member))
    stamp.write_text(key)
    return folder / "lib"


def use(kind: str, log=print) -> None:
    """Make the dgr servers this process starts run `kind`'s kernels."""
    check(kind)
    if kind == "native":
        return
    lib = str(dgr_libraries(kind, log))
    os.environ["LD_LIBRARY_PATH"] = lib + (
        ":" + os.environ["LD_LIBRARY_PATH"] if os.environ.get("LD_LIBRARY_PATH") else "")
    os.environ["LLAMA_CPP_LIB_PATH"] = lib
