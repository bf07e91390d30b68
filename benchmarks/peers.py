"""Peer binaries for the benchmarks, built from the same pinned llama.cpp tree.

`llama-server` and `llama-batched-bench` come from vendor/llama.cpp (the tree
llama-cpp-python 0.3.36 vendors), built once into vendor/build-peers with the
same CPU settings as the wheel (native, OpenMP). Part of the benchmark's own
setup, never of the tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TREE = ROOT / "vendor" / "llama.cpp"
BUILD = ROOT / "vendor" / "build-peers"
TARGETS = ("llama-server", "llama-batched-bench")


def binary(name: str) -> Path:
    return BUILD / "bin" / name


def ensure_peers(log=print) -> dict[str, Path]:
    if not all(binary(t).exists() for t in TARGETS):
        if not (TREE / "CMakeLists.txt").exists():
            subprocess.run([sys.executable, str(ROOT / "scripts" / "vendor_llama.py")], check=True)
        log(f"building {', '.join(TARGETS)} from {TREE} (once; a few minutes)")
        subprocess.run([
            "cmake", "-S", str(TREE), "-B", str(BUILD), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
            "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
            "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF",
            "-DLLAMA_CURL=OFF"], check=True, stdout=subprocess.DEVNULL)
        subprocess.run(["cmake", "--build", str(BUILD), "--target", *TARGETS,
                        "-j", str(os.cpu_count() or 2)], check=True, stdout=subprocess.DEVNULL)
    return {t: binary(t) for t in TARGETS}


if __name__ == "__main__":
    for name, path in ensure_peers().items():
        print(name, path)
