"""Summarize kernels-raw.txt (bench-kernels run alternating against three builds):
per case, each build's median over the rounds, and the new kernel's time relative
to upstream's (pristine: llama-server's kernels) and to dgr's before it (the stack
with GGML_CPU_FA_TILED=0), as min / median / max over the rounds' ratios.

    python evidence/DGR-056/kernels_table.py evidence/DGR-056/kernels-raw.txt
"""

import re
import statistics
import sys
from collections import defaultdict


def main(path: str) -> None:
    times = defaultdict(lambda: defaultdict(dict))  # case -> build -> round -> ms
    build = round_ = None
    for line in open(path):
        head = re.match(r"== (\w+) round (\d+)", line)
        if head:
            build, round_ = head.group(1), int(head.group(2))
            continue
        case, sep, ms = line.rpartition(":")
        if sep and ms.strip().endswith("ms"):
            times[" ".join(case.split())][build][round_] = float(ms.split()[0])
    print("| case | llama.cpp ms | dgr before ms | new ms | new / llama.cpp (min-med-max) | new / before (min-med-max) |")
    print("|---|---|---|---|---|---|")
    for case, by in times.items():
        rounds = sorted(by["new"])
        med = {b: statistics.median(by[b].values()) for b in ("pristine", "stack", "new")}

        def ratios(base: str) -> str:
            r = sorted(by["new"][i] / by[base][i] for i in rounds)
            return f"{r[0]:.2f}-{statistics.median(r):.2f}-{r[-1]:.2f}"

        print(f"| {case} | {med['pristine']:.3f} | {med['stack']:.3f} | {med['new']:.3f} "
              f"| {ratios('pristine')} | {ratios('stack')} |")


if __name__ == "__main__":
    main(sys.argv[1])
