"""Materialize vendor/llama.cpp (pristine) and vendor/llama.cpp-patched from the
pinned llama-cpp-python sdist.

The sdist is fetched by pip from the package registry, checked against the
sha256 in vendor/PIN, and only its vendor/llama.cpp subtree is unpacked. The
pristine tree gives the headers for the Cython build and the peers a user would
build; the patched tree (the stack in patches/series applied) is what the
native tests and the patched peers build. Run it again at any time: a tree
already in place for the same pin (and patch stack) is left alone.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENDOR = ROOT / "vendor"
TREE = VENDOR / "llama.cpp"
PATCHED_TREE = VENDOR / "llama.cpp-patched"
SDIST_DIR = VENDOR / "sdist"
PATCHES = ROOT / "patches"
# ggml's CMake flags that limit its CPU kernels to one x86 instruction set: AVX2 with
# FMA, F16C and BMI2 and no AVX-512, or those and AVX-512 with VNNI (the native tests'
# --cpu avx2 build and the benches' --cpu-kind)
_AVX2 = ["-DGGML_NATIVE=OFF", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON",
         "-DGGML_F16C=ON", "-DGGML_BMI2=ON"]
X86_KIND_FLAGS = {"avx2": [*_AVX2, "-DGGML_AVX512=OFF"],
                  "avx512": [*_AVX2, "-DGGML_AVX512=ON", "-DGGML_AVX512_VNNI=ON"]}


def read_pin() -> dict[str, str]:
    pin = {}
    for line in (VENDOR / "PIN").read_text().splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            key, _, value = line.partition("=")
            pin[key.strip()] = value.strip()
    return pin


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def fetch_sdist(pin: dict[str, str]) -> Path:
    sdist = SDIST_DIR / pin["sdist"]
    if not sdist.exists():
        SDIST_DIR.mkdir(parents=True, exist_ok=True)
        # --no-build-isolation: preparing metadata uses the scikit-build-core
        # already installed instead of assembling a build environment.
        subprocess.run(
            [sys.executable, "-m", "pip", "download", "--no-deps", "--no-build-isolation",
             "--no-binary", pin["package"], f"{pin['package']}=={pin['version']}",
             "-d", str(SDIST_DIR)],
            check=True,
        )
    actual = sha256_of(sdist)
    if actual != pin["sha256"]:
        sdist.unlink()
        raise SystemExit(f"{sdist.name}: sha256 {actual} does not match the pin {pin['sha256']}")
    return sdist


def build_env() -> dict[str, str]:
    """The environment for cmake, ninja and ctest: this interpreter's scripts folder
    (where the install script's pip puts them) first on PATH, so that they are found
    in a virtual environment that was not activated."""
    scripts = str(Path(sys.executable).parent)
    return dict(os.environ, PATH=os.pathsep.join([scripts, os.environ.get("PATH", "")]))


def series() -> list[str]:
    """The patch file names of patches/series, in order."""
    lines = (PATCHES / "series").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def stack_digest() -> str:
    """sha256 of what the patch stack changes: the patch names in order and each
    patch's diff (its explanatory header is left out, so editing prose does not
    force a rebuild)."""
    digest = hashlib.sha256()
    for name in series():
        text = (PATCHES / name).read_text()
        start = min((i for i in (text.find("\ndiff "), text.find("\n--- ")) if i >= 0), default=0)
        digest.update(name.encode() + b"\0" + text[start:].encode() + b"\0")
    return digest.hexdigest()


def apply_series(tree: Path) -> list[str]:
    """Apply patches/series to `tree` in order; a patch that does not apply stops
    the program with one line naming it."""
    applied = []
    for name in series():
        result = subprocess.run(
            ["patch", "-p1", "--forward", "--batch", "--no-backup-if-mismatch", "-i", str(PATCHES / name)],
            cwd=tree, capture_output=True, text=True,
        )
        if result.returncode != 0:
            first = (result.stdout + result.stderr).strip().splitlines()
            raise SystemExit(f"patch {name} does not apply to the pinned llama.cpp "
                             f"({first[-1] if first else 'patch failed'})")
        applied.append(name)
    return applied


def extract_tree(sdist: Path, dest: Path, subtree: str = "vendor/llama.cpp/") -> None:
    """Unpack `subtree` of the sdist (default: the llama.cpp tree; "" for the whole
    package source) into `dest`."""
    prefix = sdist.name.removesuffix(".tar.gz") + "/" + subtree
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        members = []
        for member in tar.getmembers():
            # the sdist's vendor/llama.cpp/.git names a submodule dir that is not there
            if member.name.startswith(prefix) and len(member.name) > len(prefix) \
                    and not member.name.endswith("/.git"):
                member.name = member.name[len(prefix):]
                members.append(member)
        tar.extractall(tmp, members=members, filter="data")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def _materialize(dest: Path, stamp: str, patched: bool) -> None:
    marker = dest / ".dgr-pin"
    if (dest / "include" / "llama.h").exists() and marker.exists() and marker.read_text().strip() == stamp:
        short = "+".join(part[:12] for part in stamp.split("+"))
        print(f"{dest.relative_to(ROOT)} is in place (pin{'+stack' if patched else ''} {short})")
        return
    sdist = fetch_sdist(read_pin())
    extract_tree(sdist, dest)
    if patched:
        names = apply_series(dest)
        print(f"{dest.relative_to(ROOT)}: applied {len(names)} patch(es)")
    marker.write_text(stamp + "\n")
    print(f"{dest.relative_to(ROOT)} materialized from {sdist.name} (sha256 verified)")


def main() -> None:
    pin = read_pin()
    _materialize(TREE, pin["sha256"], patched=False)
    _materialize(PATCHED_TREE, pin["sha256"] + "+" + stack_digest(), patched=True)


if __name__ == "__main__":
    main()
