"""The bench's command line (benchmarks/concurrency.py) refuses what it cannot run
before it builds or starts anything."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from benchmarks.concurrency import main  # noqa: E402
from benchmarks.speculation import EARLIER_USER  # noqa: E402


@pytest.mark.parametrize("arguments, said", [
    # an unknown workload or server, named with the case's own
    (["--spec-workloads", "templated burst,nope"],
     ["unknown ['nope']", "templated burst", "code edit"]),
    (["--spec-servers", "dgr auto,dgr"], ["unknown ['dgr']", "dgr off", "llama-server ngram-mod"]),
    (["--kv-servers", "dgr host,nope"], ["unknown ['nope']", "kv_tier case", "dgr disk restart"]),
    # a burst level reaching its earlier user's number: that prompt would be one of its own
    (["--spec-levels", f"1,{EARLIER_USER}", "--spec-workloads", "templated burst"],
     [f"below {EARLIER_USER}"]),
])
def test_the_bench_refuses_what_it_cannot_run(capsys, tmp_path, arguments, said):
    # --render-only on an empty folder: without the checks, main fails at once on the
    # missing bench.json instead of building peers
    with pytest.raises(SystemExit) as refused:
        main(["--render-only", "--out", str(tmp_path), "--cases", "speculation", *arguments])
    err = capsys.readouterr().err
    assert refused.value.code == 2
    assert all(words in err for words in said)


def test_the_bench_refuses_a_repack_mode_dgr_lacks(capsys, tmp_path):
    with pytest.raises(SystemExit) as refused:
        main(["--render-only", "--out", str(tmp_path), "--cases", "decode",
              "--weight-repack", "fastest"])
    assert refused.value.code == 2 and "invalid choice: 'fastest'" in capsys.readouterr().err
