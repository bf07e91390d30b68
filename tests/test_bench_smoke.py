"""The benches that run without llama.cpp's peers, run small so they cannot rot:
dgr against dgr (benchmarks/ab.py) and repacking's engine-level cost and gain
(benchmarks/weight_repack.py), on the tiny model."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks import ab  # noqa: E402


def test_dgr_against_dgr_alternates_two_trees_and_tables_their_ratios(tiny_model):
    logged = []
    rates = ab.run({"before": str(ROOT), "after": str(ROOT)}, tiny_model, [2], 4, 2, 1,
                   log=logged.append)
    # the pair runs before-first, then after-first
    assert [line.split(":")[0] for line in logged] == [
        "round 0 c=2 before", "round 0 c=2 after", "round 1 c=2 after", "round 1 c=2 before"]
    assert all(len(got) == 2 and min(got) > 0 for got in rates.values())
    lines = ab.table(rates, [2])
    assert lines[0].startswith("| c | before (median) | after (median)") and len(lines) == 3


def test_repacking_cost_and_gain_runs_each_pair_of_modes(tmp_path, capsys):
    from benchmarks import weight_repack
    from dgr.testmodel import quantize, write_test_model

    source = write_test_model(tmp_path / "llama-f32.gguf", n_embd=256, n_layer=2, n_head=4,
                              n_head_kv=2, n_ff=512)
    model = quantize(source, tmp_path / "llama-Q4_K_M.gguf", "Q4_K_M")
    assert weight_repack.main(["--rounds", "2", "--prompt", "16", "--decode", "2",
                               "--q4-k", str(model), "--only-q4-k"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[1] for line in lines[1:]] == ["prefill", "decode"]
    assert all("Q4_K as loaded/decode:" in line for line in lines[1:])
