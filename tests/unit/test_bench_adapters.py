"""The adapters case's figures: aggregate tokens/s and the table of its rounds."""

import pytest

from benchmarks import adapters


def test_aggregate_counts_every_token_from_the_first_request_to_the_last_token():
    first = {"sent": 0.0, "stamps": [1.0, 2.0, 3.0]}
    queued = {"sent": 0.5, "stamps": [4.0, 5.0]}  # an adapter served in its turn
    assert adapters.aggregate([first, queued]) == pytest.approx(5 / 5.0)


def test_sessions_pick_adapters_in_each_servers_way():
    assert adapters.adapter_fields("dgr", 3) == {"model": "a3"}
    assert adapters.adapter_fields("llama-server", 3) == {"lora": [{"id": 3, "scale": 1.0}]}
    assert adapters.adapter_fields("dgr", None) == adapters.adapter_fields("llama-server",
                                                                           None) == {}


def test_adapters_table_reads_the_rounds():
    def figures(ours, peer, decode=None):
        return {"dgr": {"aggregate": ours} | ({"decode": decode[0]} if decode else {}),
                "llama-server": {"aggregate": peer} | ({"decode": decode[1]} if decode else {})}

    row = {"mixed": figures(100.0, 40.0), "spread": figures(90.0, 20.0),
           "one": figures(95.0, 80.0, (90.0, 80.0)), "base": figures(110.0, 100.0, (100.0, 100.0))}
    result = {"adapters": 32, "rank": 16, "targets": ["attn_q"], "n_new": 64, "threads": 2,
              "model": "the default model", "rounds": [row]}
    table = "\n".join(adapters.markdown(result))
    assert "## Adapters on the default model" in table
    assert ("| 8 adapters x 2 sessions (aggregate) | 100.0 | 40.0 | "
            "2.500 / 2.500 / 2.500 |") in table
    assert "| 32 adapters x 1 session (aggregate) | 90.0 | 20.0 | 4.500 / 4.500 / 4.500 |" in table
    assert "| 16 sessions on one adapter (decode) | 90.0 | 80.0 |" in table
    # each server against itself: one adapter's decode over the base's, 8 x 2 over base
    assert ("- dgr against itself on the base model (min / median / max): one adapter's decode "
            "0.900 / 0.900 / 0.900; 8 x 2 aggregate 0.909 / 0.909 / 0.909.") in table
    assert "- llama-server against itself" in table and "0.800 / 0.800 / 0.800" in table
