"""Prove the llama.cpp patch stack applies cleanly to the pristine pinned tree.

Unpacks a fresh copy of the pinned tree from the sha256-checked sdist into a
temporary directory and applies every patch named in patches/series, in
order, with `patch -p1`. Exits non-zero on the first patch that does not apply.
"""

import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import vendor_llama  # noqa: E402


def series() -> list[str]:
    lines = (ROOT / "patches" / "series").read_text().splitlines()
    return [line.strip() for line in lines if line.strip() and not line.startswith("#")]


def main() -> int:
    sdist = vendor_llama.fetch_sdist(vendor_llama.read_pin())
    patches = series()
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "llama.cpp"
        vendor_llama.extract_tree(sdist, tree)
        for name in patches:
            result = subprocess.run(
                ["patch", "-p1", "--forward", "--batch", "-i", str(ROOT / "patches" / name)],
                cwd=tree, capture_output=True, text=True,
            )
            if result.returncode != 0:
                print(f"patch {name} does not apply:\n{result.stdout}{result.stderr}")
                return 1
            print(f"applied {name}")
    print(f"patch stack OK: {len(patches)} patch(es) apply cleanly to {sdist.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
