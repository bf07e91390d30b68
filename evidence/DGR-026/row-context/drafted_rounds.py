"""Per round of the templated burst at c = 16, the tokens dgr auto drafted and its
decode tok/s over dgr off's, from the bench.json of eleven runs of this session and
the last (in rounds/: margin-A/B from ../draft-cap/margin-ab.sh, step-margin-* from
../draft-cap/step-margin-ab.sh, cap-burst-load from ../draft-cap/burst-load.sh,
rc-* from burst-ab.sh; their trees differ: before the margin, with it, with the
step margin, with the rows' attention), fewest drafts first.

    python evidence/DGR-026/row-context/drafted_rounds.py evidence/DGR-026/row-context/rounds/*.json
"""

import json
import sys
from pathlib import Path

rounds = []
for path in sys.argv[1:]:
    result = json.loads(Path(path).read_text())
    result = result.get("speculation", result)
    drafted = {a["round"]: a["drafted"] for a in result["acceptance"]
               if a["workload"] == "templated burst" and a["c"] == 16}
    rate = {(r["round"], r["server"]): r["decode_tok_s"] for r in result["rows"]
            if r["workload"] == "templated burst" and r["c"] == 16}
    for r, tokens in drafted.items():
        rounds.append((tokens, rate[r, "dgr auto"] / rate[r, "dgr off"], Path(path).stem, r))
rounds.sort()
for tokens, ratio, run, r in rounds:
    print(f"{run:20s} round {r}: drafted {tokens:4.0f}, auto / off {ratio:.3f}")
for lo, hi in ((0, 200), (200, 10_000)):
    ratios = sorted(ratio for tokens, ratio, *_ in rounds if lo <= tokens < hi)
    print(f"drafted {lo}-{hi - 1}: {len(ratios)} rounds, auto / off {ratios[0]:.3f}-"
          f"{ratios[-1]:.3f}, median {ratios[len(ratios) // 2]:.3f}")
