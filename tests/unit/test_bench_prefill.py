"""The bench's prefill case (benchmarks/prefill.py): cold prompts and its table."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent.parent))

from benchmarks import prefill  # noqa: E402


def test_every_request_gets_a_prompt_of_its_length_that_no_other_shares_a_prefix_with():
    prompts = [prefill.prompt(2048, request) for request in range(1, 40)]
    assert all(len(p) == 2048 for p in prompts)
    assert len({p[0] for p in prompts}) == len(prompts)  # nothing cached from another
    assert all(prefill.ID_RANGE[0] <= t < prefill.ID_RANGE[1] for p in prompts for t in p)
    assert prefill.prompt(512, 7) == prefill.prompt(512, 7)  # the same run after run


def test_the_table_gives_each_servers_median_and_the_rounds_ratios():
    rounds = [{512: {"dgr": 1000.0, "llama-server": 800.0}},
              {512: {"dgr": 900.0, "llama-server": 1000.0}},
              {512: {"dgr": 1100.0, "llama-server": 1000.0}}]
    table = "\n".join(prefill.markdown({"lengths": [512], "rounds": rounds}))
    assert "| 512 | 1000 | 1000 | 0.900 / 1.100 / 1.250 |" in table
    # the JSON report's keys are strings once written and read back
    as_json = [{"512": row[512]} for row in rounds]
    assert "| 512 | 1000 | 1000 |" in "\n".join(prefill.markdown({"lengths": [512],
                                                                  "rounds": as_json}))
