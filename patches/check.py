"""Prove the llama.cpp patch stack applies cleanly to the pristine pinned tree.

Unpacks a fresh copy of the pinned tree from the sha256-checked sdist into a
temporary directory and applies every patch named in patches/series, in
order, with `patch -p1`. Exits non-zero, naming the patch, on the first one
that does not apply.
"""

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))
import vendor_llama  # noqa: E402


def main() -> int:
    sdist = vendor_llama.fetch_sdist(vendor_llama.read_pin())
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "llama.cpp"
        vendor_llama.extract_tree(sdist, tree)
        applied = vendor_llama.apply_series(tree)
    for name in applied:
        print(f"applied {name}")
    print(f"patch stack OK: {len(applied)} patch(es) apply cleanly to {sdist.name} "
          f"(stack digest {vendor_llama.stack_digest()[:12]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
