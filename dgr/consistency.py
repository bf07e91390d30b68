"""Batch-vs-solo greedy consistency, the correctness bar of docs/design.md.

A session decoded inside a batch must produce the tokens it produces alone.
Where they differ, the first divergence is excused only if the solo run's
top-2 log-probability gap there is below NEAR_TIE_GAP (floating point may flip
a near tie); any other divergence is cross-session corruption.
"""

from __future__ import annotations

from typing import Sequence

import attrs

NEAR_TIE_GAP = 0.1


@attrs.define
class Verdict:
    identical: int = 0
    near_tie: int = 0
    unexplained: int = 0
    details: list = attrs.field(factory=list)

    def add(self, index: int, solo: Sequence[int], solo_gaps: Sequence[float],
            batched: Sequence[int]) -> str:
        """Classify one session; solo_gaps[i] is the solo top-2 gap at token i."""
        first = next((i for i, (a, b) in enumerate(zip(solo, batched)) if a != b), None)
        if first is None and len(solo) == len(batched):
            self.identical += 1
            return "identical"
        if first is None:
            first = min(len(solo), len(batched))
        gap = solo_gaps[first] if first < len(solo_gaps) else float("inf")
        kind = "near_tie" if gap < NEAR_TIE_GAP else "unexplained"
        if kind == "near_tie":
            self.near_tie += 1
        else:
            self.unexplained += 1
        self.details.append({"session": index, "position": first, "solo_top2_gap": gap, "kind": kind})
        return kind

    def as_dict(self) -> dict:
        return attrs.asdict(self)
