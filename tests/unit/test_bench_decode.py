"""The decode case's figures: only the window in which every session decodes counts."""

import pytest

from benchmarks import decode


def test_decode_counts_only_the_window_in_which_all_sessions_decode():
    # a first token at 1.0 s, then one a second; the second session's first at 4.0 s
    early = {"sent": 0.0, "stamps": [1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0]}
    late = {"sent": 0.0, "stamps": [4.0, 4.5, 5.0, 5.5, 6.0, 6.5]}
    result = decode.figures([early, late])
    # window (4.0, 6.5]: early's 5.0 and 6.0, late's 4.5 .. 6.5 (5 tokens): 7 in 2.5 s
    assert result["decode"] == pytest.approx(7 / 2.5)
    assert result["ttft_mean"] == pytest.approx(2.5)
    assert result["ttft_max"] == pytest.approx(4.0)


def test_decode_refuses_sessions_that_never_decode_together():
    with pytest.raises(ValueError, match="no window"):
        decode.figures([{"sent": 0.0, "stamps": [1.0, 2.0]}, {"sent": 0.0, "stamps": [3.0, 4.0]}])


def test_decode_table_reads_the_rounds():
    per_server = {"decode": 40.0, "ttft_mean": 0.5, "ttft_max": 0.9}
    result = {"levels": [1], "n_new": 64, "threads": 2, "weight_bytes": 500e6,
              "read_bandwidth": 40e9,
              "rounds": [{1: {"dgr": dict(per_server, decode=44.0), "llama-server": per_server}}]}
    table = "\n".join(decode.markdown(result))
    assert "| 1 | 44.0 | 40.0 | 1.100 / 1.100 / 1.100 | 55% / 50% | 0.50 / 0.90 | 0.50 / 0.90 |" in table
