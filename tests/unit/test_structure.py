"""What a maintainer relies on when changing dgr, checked: each protocol's event
framing and error shapes are written in one place, no module grows past what one
reader holds, and evidence/ holds pages and the figures they quote, no script that
no test runs."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DGR = ROOT / "dgr"
SOURCES = [p for p in DGR.rglob("*") if p.suffix in (".py", ".pyx", ".pxd")]


def _lines_matching(pattern: str, allowed: set[str]) -> list[str]:
    found = []
    for path in SOURCES:
        if path.name in allowed:
            continue
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if re.search(pattern, line):
                found.append(f"{path.relative_to(DGR.parent)}:{number}: {line.strip()}")
    return found


def test_server_sent_events_are_framed_in_one_place():
    assert _lines_matching(r"""["']data: |["']event: |f["'](event|data): """, {"sse.py"}) == []


def test_error_shapes_are_written_in_one_place():
    assert _lines_matching(r"""["']error["']: \{""", {"problems.py"}) == []


def test_no_module_in_dgr_is_past_five_hundred_lines():
    long = {str(p.relative_to(DGR.parent)): n for p in SOURCES
            if (n := len(p.read_text().splitlines())) > 500}
    assert long == {}


def test_evidence_holds_pages_and_figures_only():
    kinds = {".md", ".txt", ".png"}
    others = [str(p.relative_to(ROOT)) for p in (ROOT / "evidence").rglob("*")
              if p.is_file() and p.suffix not in kinds]
    assert others == []
