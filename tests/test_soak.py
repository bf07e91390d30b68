"""A short soak (the CI variant of benchmarks/soak.py): 200 sessions at concurrency 32
against max_running=8 / max_waiting=8, with cancellations and slow readers."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.soak import soak  # noqa: E402

pytestmark = pytest.mark.slow


async def test_short_soak_accounts_for_every_session(tiny_model):
    report = await soak(tiny_model, sessions=200, concurrency=32, warmup=40)
    assert report["outcomes_total"] == 200
    assert set(report["outcomes"]) <= {"completed", "rejected", "cancelled"}
    assert report["outcomes"].get("completed", 0) > 0
    assert set(report["rejection_reasons"]) <= {"queue_full", "queue_tokens_full"}
    # cells in use come back to exactly the cached prompt prefixes, and to 0 after a flush
    assert report["kv_cells_in_use_cached"] == report["kv_cells_cached_after"]
    assert report["kv_cells_in_use_after"] == 0
    assert report["active_after"] == 0 and report["waiting_after"] == 0
    assert report["threads_left"] <= 0
    assert report["tasks_left"] == 0
    assert report["node_finished"]["error"] == 0
