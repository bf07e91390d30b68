"""Instructions dgr's ARM matmul kernels execute against llama.cpp's own, counted under qemu.

    python scripts/arm_kernel_counts.py                 # every case (about 15 minutes)
    python scripts/arm_kernel_counts.py --types q4_0 --columns 1,16

bench-kernels (patches/native-tests/bench_kernels.cpp) is built for ARMv8.6 (NEON with
dotprod and i8mm, scripts/native_tests.py's aarch64 flags) against the patched tree and
the pristine one (build/native-{patched,pristine}-aarch64, reused), and
scripts/qemu_symcount.c as a QEMU plugin that counts the instructions executed per
function. Each matmul runs on one thread under `qemu-aarch64 -cpu max` twice, with
different numbers of calls; the difference, divided by the calls, is one call's
instructions, setup excluded. Compared: dgr's kernels on the weights as dgr loads them on
ARM (repacked where dgr/weight_repack.py repacks the type there, else plain), dgr's plain
kernels, llama.cpp's on the weights as llama-server loads them by default (repacked:
CPU_REPACK takes all of these types with i8mm), and llama.cpp's plain kernels.
Instruction counts estimate the work a kernel does; they are not times (no ARM machine
here: an instruction's cost differs, and memory is not modelled).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from collections import Counter

import native_tests

from dgr import weight_repack

ROOT = native_tests.ROOT
PLUGIN_SOURCE = ROOT / "scripts" / "qemu_symcount.c"
SHAPE = "2048x2048"
TYPES = ("q4_0", "q8_0", "q4_K", "q6_K")
COLUMNS = (1, 16, 512)


def sides(kind: str) -> list[tuple[str, bool, str]]:
    """(name, pristine build, buffer type): dgr as it loads a weight of `kind` on ARM
    (repacked if dgr.weight_repack repacks the type there), dgr's plain kernels,
    llama.cpp as llama-server loads it (repacked) and llama.cpp's plain kernels."""
    dgr = "CPU_REPACK" if kind.upper() in weight_repack.ARM_TYPES else "CPU"
    return [("dgr", False, dgr), ("dgr, plain", False, "CPU"),
            ("llama.cpp, repacked", True, "CPU_REPACK"), ("llama.cpp, plain", True, "CPU")]


def plugin(folder) -> str:
    """The instruction-counting plugin, built for this machine (qemu's host)."""
    out = folder / "qemu-symcount.so"
    if not out.exists() or out.stat().st_mtime < PLUGIN_SOURCE.stat().st_mtime:
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(out), str(PLUGIN_SOURCE)], check=True)
    return str(out)


def counts(bench, plugin_path: str, case: str, repeats: int) -> Counter:
    """{symbol: instructions} of one bench-kernels run of `case` on one thread."""
    with tempfile.NamedTemporaryFile("r", suffix=".txt") as out:
        env = dict(os.environ, SYMCOUNT_OUT=out.name)
        ran = subprocess.run(["qemu-aarch64", "-cpu", "max", "-L", "/usr/aarch64-linux-gnu",
                              "-plugin", plugin_path, str(bench), "1", str(repeats), case],
                             env=env, capture_output=True, text=True)
        if ran.returncode != 0 or case not in ran.stdout:
            raise SystemExit(f"bench-kernels under qemu did not run {case!r}: {ran.stdout}{ran.stderr}")
        found = Counter()
        for line in out.read().splitlines():
            count, _, symbol = line.partition("\t")
            found[symbol] += int(count)
        return found


def per_call(bench, plugin_path: str, case: str, columns: int) -> Counter:
    """{symbol: instructions} of one call of `case`: bench-kernels calls it 4 * repeats
    + 1 times below 512 columns, repeats + 1 times at 512."""
    calls = (lambda r: r + 1) if columns == 512 else (lambda r: 4 * r + 1)
    one, two = counts(bench, plugin_path, case, 1), counts(bench, plugin_path, case, 2)
    n = calls(2) - calls(1)
    return Counter({s: (two[s] - one[s]) // n for s in two if two[s] - one[s] >= n})


def short(symbol: str) -> str:
    """A symbol without its C++ parameter list and template arguments."""
    return re.sub(r"<.*>", "<>", symbol.split("(")[0])[:60]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--types", default=",".join(TYPES))
    parser.add_argument("--columns", default=",".join(map(str, COLUMNS)))
    args = parser.parse_args(argv)
    missing = native_tests.missing_tools("aarch64")
    if missing:
        print(f"{', '.join(missing)} not found (apt-get install g++-aarch64-linux-gnu qemu-user)")
        return 2
    builds = {}
    for pristine in (False, True):
        folder = native_tests.build("aarch64", pristine, ["bench-kernels"])
        if folder is None:
            return 1
        builds[pristine] = folder / "bench-kernels"
    plugin_path = plugin(builds[False].parent)
    print(f"\nInstructions per call of a {SHAPE} matmul (k x rows), one thread, qemu-aarch64 -cpu max, "
          "ARMv8.6 build (NEON, dotprod, i8mm); the top functions of each, in millions\n")
    names = [name for name, _, _ in sides("")]
    print("| type | columns | dgr's weights | " + " | ".join(names) + " | dgr / llama.cpp repacked |")
    print("|---|---|---|" + "---|" * (len(names) + 1))
    notes = []
    for kind in args.types.split(","):
        for columns in (int(c) for c in args.columns.split(",")):
            totals = {}
            for name, pristine, buft in sides(kind):
                case = f"mul_mat {SHAPE} {kind:<6} {buft:<10} {columns:3d} columns"
                found = per_call(builds[pristine], plugin_path, case, columns)
                totals[name] = sum(found.values())
                top = ", ".join(f"{short(s)} {c / 1e6:.2f}" for s, c in found.most_common(3))
                notes.append(f"- {kind}, {columns} columns, {name}: {top}")
            placed = "repacked" if sides(kind)[0][2] == "CPU_REPACK" else "plain"
            print(f"| {kind} | {columns} | {placed} | " + " | ".join(f"{totals[n] / 1e6:.2f} M" for n in names)
                  + f" | {totals['dgr'] / totals['llama.cpp, repacked']:.2f} |", flush=True)
    print("\n" + "\n".join(notes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
