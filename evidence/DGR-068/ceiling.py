"""The compute bound of the embeddings bench's workload for each build: from
encoder_step.sh's per-length step times (one input a step, no HTTP), the time to
compute the bench's 96 inputs (16 of each length in benchmarks/embeddings.LENGTHS)
one at a time, and the inputs/s that allows; per model and round.

    sh evidence/DGR-068/encoder_step.sh MODEL 16,32,64,128,256,512 3 | \
        python3 evidence/DGR-068/ceiling.py
"""

import re
import sys
from collections import defaultdict

EACH = 16  # inputs of each length in the bench's 96


def main() -> None:
    model, times, seen = "", defaultdict(list), defaultdict(int)
    for line in sys.stdin:
        print(line, end="")
        if line.startswith("#"):
            model = line[1:].strip()
        found = re.match(r"(\w+): (\d+) tokens: median ([\d.]+) ms", line)
        if found:
            build, length, ms = found.group(1), int(found.group(2)), float(found.group(3))
            key = (model, build)
            if length == 16:
                seen[key] += 1
                times[key].append(0.0)
            times[key][-1] += EACH * ms / 1000
    for (model, build), rounds in times.items():
        rates = ", ".join(f"{6 * EACH / s:.1f}" for s in rounds)
        print(f"{model}, {build}: the 96 inputs one at a time in "
              f"{', '.join(f'{s:.2f}' for s in rounds)} s: at most {rates} inputs/s")


if __name__ == "__main__":
    main()
