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
    row = {"mixed": {"dgr": 100.0, "llama-server": 40.0},
           "one": {"dgr": 90.0, "llama-server": 80.0},
           "base": {"dgr": 100.0, "llama-server": 100.0}}
    result = {"adapters": 8, "rank": 16, "targets": ["attn_q"], "n_new": 64, "threads": 2,
              "rounds": [row]}
    table = "\n".join(adapters.markdown(result))
    assert ("| two sessions on each adapter (aggregate) | 100.0 | 40.0 | "
            "2.500 / 2.500 / 2.500 |") in table
    assert "dgr 0.900 / 0.900 / 0.900, llama-server 0.800 / 0.800 / 0.800" in table
