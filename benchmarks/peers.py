"""Peer binaries for the benchmarks, built from the pinned llama.cpp tree.

`llama-server` and `llama-batched-bench` come from vendor/llama.cpp, the
pristine tree llama-cpp-python 0.3.36 vendors (what a user would run), built
once into vendor/build-peers; `llama-batched-bench` also from
vendor/llama.cpp-patched (dgr's patch stack applied) into
vendor/build-peers-patched, to measure what the patches cost. Same CPU
settings as the wheel (native, OpenMP). Part of the benchmark's own setup,
never of the tests.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import vendor_llama  # noqa: E402

from benchmarks import cpu_kinds  # noqa: E402

PRISTINE = (vendor_llama.TREE, ROOT / "vendor" / "build-peers", ("llama-server", "llama-batched-bench"))
PATCHED = (vendor_llama.PATCHED_TREE, ROOT / "vendor" / "build-peers-patched", ("llama-batched-bench",))


def _build(tree: Path, build: Path, targets: tuple[str, ...], log,
           flags: tuple[str, ...] = ()) -> dict[str, Path]:
    binaries = {t: build / "bin" / t for t in targets}
    stamp = build / ".dgr-tree"
    source = ((tree / ".dgr-pin").read_text() if (tree / ".dgr-pin").exists() else "") + (
        " " + " ".join(flags) if flags else "")
    if all(b.exists() for b in binaries.values()) and stamp.exists() and stamp.read_text() == source:
        return binaries
    log(f"building {', '.join(targets)} from {tree.relative_to(ROOT)} (once; a few minutes)")
    subprocess.run([
        "cmake", "-S", str(tree), "-B", str(build), "-G", "Ninja", "-DCMAKE_BUILD_TYPE=Release",
        "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF",
        "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF", "-DLLAMA_OPENSSL=OFF",
        "-DLLAMA_CURL=OFF", *flags], check=True, stdout=subprocess.DEVNULL,
        env=vendor_llama.build_env())
    subprocess.run(["cmake", "--build", str(build), "--target", *targets,
                    "-j", str(os.cpu_count() or 2)], check=True, stdout=subprocess.DEVNULL,
                   env=vendor_llama.build_env())
    stamp.write_text(source)
    return binaries


def ensure_peers(log=print, batched_bench: bool = True, kind: str = "native") -> dict[str, Path]:
    """{"llama-server"} from the pristine pin; with batched_bench also
    "llama-batched-bench" from it and "llama-batched-bench-patched" from the
    patched one (only the levels case runs them). For a CPU kind other than native
    (benchmarks/cpu_kinds.py) they are built with its flags only, in build-peers-KIND."""
    vendor_llama.main()
    flags = tuple(cpu_kinds.FLAGS.get(kind, ()))

    def built(tree, build, targets):
        return _build(tree, build.with_name(f"{build.name}-{kind}") if flags else build,
                      targets, log, flags)

    tree, build, targets = PRISTINE
    peers = built(tree, build, targets if batched_bench else ("llama-server",))
    if batched_bench:
        peers["llama-batched-bench-patched"] = built(*PATCHED)["llama-batched-bench"]
    return peers


if __name__ == "__main__":
    for name, path in ensure_peers().items():
        print(name, path)
