"""Install llama-cpp-python 0.3.36 built from the patched pinned llama.cpp.

dgr's engine links the libllama that llama-cpp-python installs, so building that
package from the patched tree gives one patched libllama per process, shared by
dgr and `llama_cpp.Llama`. The build (minutes on 2 cores) is cached as a wheel
keyed by the pin, the patch stack's digest and CMAKE_ARGS:

- the installed package already comes from that key: nothing to do;
- the wheel is in the cache: it is installed (seconds);
- otherwise the sdist is unpacked, the stack applied (a patch that does not
  apply stops here with one line naming it), the wheel built and cached.

    python scripts/build_llama.py          # idempotent
    DGR_WHEEL_CACHE=DIR  overrides the cache folder (default ~/.cache/dgr/llama-wheels)
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import vendor_llama

# mtmd (multimodal) is not used by dgr: skipping it trims the build. The RPC backend
# is: `python -m dgr worker` serves it, `python -m dgr run --rpc` offloads layers to it.
DEFAULT_CMAKE_ARGS = "-DLLAVA_BUILD=OFF -DGGML_RPC=ON"
MARKER = ".dgr-build"


def build_key(pin: dict[str, str], cmake_args: str) -> str:
    digest = hashlib.sha256()
    for part in (pin["sha256"], vendor_llama.stack_digest(), cmake_args, sys.implementation.cache_tag):
        digest.update(part.encode() + b"\0")
    return digest.hexdigest()[:24]


def _package_dir() -> Path | None:
    import importlib.util
    try:
        spec = importlib.util.find_spec("llama_cpp")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _libraries_digest(package: Path) -> str:
    digest = hashlib.sha256()
    for lib in sorted((package / "lib").glob("lib*.so")):
        digest.update(lib.name.encode() + b"\0" + lib.read_bytes())
    return digest.hexdigest()


def installed_key() -> str | None:
    """The build key of the installed llama_cpp package: the one recorded at
    install, if its libraries are still the ones installed then (pip leaves the
    record behind when another build replaces the package)."""
    package = _package_dir()
    marker = package / MARKER if package else None
    if marker is None or not marker.exists():
        return None
    key, _, libs = marker.read_text().strip().partition(" ")
    return key if libs == _libraries_digest(package) else None


def pip(*args: str, env: dict | None = None) -> None:
    subprocess.run([sys.executable, "-m", "pip", *args], check=True, env=env)


def wheel_cache() -> Path:
    """The folder of cached wheels, one folder per build key."""
    return Path(os.environ.get("DGR_WHEEL_CACHE", Path.home() / ".cache" / "dgr" / "llama-wheels"))


def build_wheel(pin: dict[str, str], cmake_args: str, out_dir: Path) -> Path:
    sdist = vendor_llama.fetch_sdist(pin)
    with tempfile.TemporaryDirectory(prefix="dgr-llama-build-") as tmp:
        src = Path(tmp) / "src"
        vendor_llama.extract_tree(sdist, src, subtree="")
        names = vendor_llama.apply_series(src / "vendor" / "llama.cpp")
        print(f"llama-cpp-python {pin['version']}: applied {len(names)} patch(es): {', '.join(names) or '-'}",
              flush=True)
        building = out_dir.with_name(out_dir.name + ".partial")
        building.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, CMAKE_ARGS=cmake_args)
        # --no-build-isolation: scikit-build-core, cmake and ninja are installed by install.sh
        pip("wheel", "--no-deps", "--no-build-isolation", "--quiet", "-w", str(building), str(src), env=env)
        wheels = sorted(building.glob("llama_cpp_python-*.whl"))
        if len(wheels) != 1:
            raise SystemExit(f"expected one llama_cpp_python wheel in {building}, found {len(wheels)}")
        building.rename(out_dir)
    return next(out_dir.glob("llama_cpp_python-*.whl"))


def main() -> int:
    pin = vendor_llama.read_pin()
    cmake_args = os.environ.get("CMAKE_ARGS", DEFAULT_CMAKE_ARGS)
    key = build_key(pin, cmake_args)
    if installed_key() == key:
        print(f"llama-cpp-python {pin['version']} (patched, build {key}) is installed")
        return 0
    out_dir = wheel_cache() / key
    wheels = sorted(out_dir.glob("llama_cpp_python-*.whl")) if out_dir.is_dir() else []
    if wheels:
        wheel = wheels[0]
        print(f"llama-cpp-python: cached wheel for build {key}")
    else:
        print(f"llama-cpp-python: building build {key} from the patched pin (several minutes)", flush=True)
        wheel = build_wheel(pin, cmake_args, out_dir)
    pip("install", "--quiet", "--no-deps", "--force-reinstall", str(wheel))
    # runtime dependencies of llama-cpp-python (numpy, diskcache, jinja2, typing-extensions)
    pip("install", "--quiet", str(wheel))
    package = _package_dir()
    (package / MARKER).write_text(f"{key} {_libraries_digest(package)}\n")
    print(f"llama-cpp-python {pin['version']} installed from {wheel.name} (build {key})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
