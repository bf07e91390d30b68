"""The bench's command line (benchmarks/concurrency.py) refuses what it cannot run
before it builds or starts anything."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from benchmarks.concurrency import main  # noqa: E402


def test_an_unknown_speculation_workload_is_refused_with_the_case_s_workloads(capsys, tmp_path):
    # --render-only on an empty folder: without the check, main fails at once on the
    # missing bench.json instead of building peers
    with pytest.raises(SystemExit) as refused:
        main(["--render-only", "--out", str(tmp_path), "--cases", "speculation",
              "--spec-workloads", "templated burst,nope"])
    err = capsys.readouterr().err
    assert refused.value.code == 2
    assert "unknown ['nope']" in err and "templated burst" in err and "code edit" in err


def test_an_unknown_speculation_server_is_refused_with_the_case_s_servers(capsys, tmp_path):
    with pytest.raises(SystemExit) as refused:
        main(["--render-only", "--out", str(tmp_path), "--cases", "speculation",
              "--spec-servers", "dgr auto,dgr"])
    err = capsys.readouterr().err
    assert refused.value.code == 2
    assert "unknown ['dgr']" in err and "dgr off" in err and "llama-server ngram-mod" in err


def test_a_burst_level_reaching_its_earlier_user_s_number_is_refused(capsys, tmp_path):
    # the earlier user's prompt would be one of the burst's own
    with pytest.raises(SystemExit) as refused:
        main(["--render-only", "--out", str(tmp_path), "--cases", "speculation",
              "--spec-levels", "1,64", "--spec-workloads", "templated burst"])
    assert refused.value.code == 2
    assert "below 40" in capsys.readouterr().err
