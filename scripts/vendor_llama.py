"""Materialize vendor/llama.cpp from the pinned llama-cpp-python sdist.

The sdist is fetched by pip from the package registry, checked against the
sha256 in vendor/PIN, and only its vendor/llama.cpp subtree is unpacked. The
tree gives the headers for the Cython build and is what patches/ applies to.
Run it again at any time: it does nothing when the tree is already in place.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
VENDOR = ROOT / "vendor"
TREE = VENDOR / "llama.cpp"
SDIST_DIR = VENDOR / "sdist"


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


def extract_tree(sdist: Path, dest: Path) -> None:
    prefix = sdist.name.removesuffix(".tar.gz") + "/vendor/llama.cpp/"
    tmp = dest.with_name(dest.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    with tarfile.open(sdist) as tar:
        members = []
        for member in tar.getmembers():
            if member.name.startswith(prefix) and len(member.name) > len(prefix):
                member.name = member.name[len(prefix):]
                members.append(member)
        tar.extractall(tmp, members=members, filter="data")
    shutil.rmtree(dest, ignore_errors=True)
    tmp.rename(dest)


def main() -> None:
    pin = read_pin()
    if (TREE / "include" / "llama.h").exists() and (TREE / ".dgr-pin").exists() \
            and (TREE / ".dgr-pin").read_text().strip() == pin["sha256"]:
        print(f"vendor/llama.cpp is in place (sha256 {pin['sha256'][:12]})")
        return
    sdist = fetch_sdist(pin)
    extract_tree(sdist, TREE)
    (TREE / ".dgr-pin").write_text(pin["sha256"] + "\n")
    print(f"vendor/llama.cpp materialized from {sdist.name} (sha256 verified)")


if __name__ == "__main__":
    main()
