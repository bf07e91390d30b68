"""check-invariance's comparison (dgr/invariance.py): where a run first departs from
the solo one."""

from dgr.invariance import describe, first_difference
from dgr.stream import GenerationResult


def result(tokens, logprobs):
    return GenerationResult(text="", token_ids=tokens, finish_reason=None, prompt_tokens=3,
                            logprobs=[[(t, lp)] for t, lp in zip(tokens, logprobs)],
                            token_logprobs=logprobs)


def test_equal_runs_have_no_difference_and_the_first_departure_is_named():
    solo = result([5, 6, 7], [-0.5, -0.25, -1.0])
    assert first_difference(solo, result([5, 6, 7], [-0.5, -0.25, -1.0])) is None
    assert first_difference(solo, result([5, 6, 7], [-0.5, -0.2500001, -1.5])) == {
        "position": 1, "what": "logprob", "solo": -0.25, "other": -0.2500001}
    assert first_difference(solo, result([5, 9, 7], [-0.5, -0.25, -1.0]))["what"] == "token"
    assert first_difference(solo, result([5, 6], [-0.5, -0.25])) == {
        "position": 2, "what": "length", "solo": 3, "other": 2}


def test_the_verdict_says_which_run_differs_and_where():
    report = {"sessions": 2, "tokens": 3, "cached_tokens": 10, "drafted": 5, "rejected": 2,
              "longest_prompt": 2100, "pool_cells": 2560, "reserved": 2200, "bitwise": False,
              "runs": {"concurrent": [None, None],
                       "cached": [None, {"position": 4, "what": "token", "solo": 7, "other": 9}]},
              "coverage": {"covered": False, "why_not": ["flash attention is disabled"]}}
    text = describe(report)
    assert "concurrent: 2 of 2 sessions bitwise" in text
    assert "cached: 1 of 2 sessions bitwise" in text
    assert "session 1, token 4, token 7 alone vs 9" in text
    assert "5 draft tokens verified, 2 rejected" in text
    assert "the longest prompt 2100 tokens; the full pool 2560 cells for 2200 reserved" in text
    assert "verdict: NOT invariant" in text
    # what the node claims here, beside what the run showed
    assert text.endswith("does not claim the invariance for this model here: "
                         "flash attention is disabled")
    covered = report | {"coverage": {"covered": True, "cpu": "x86-64 with AVX-512 and VNNI"}}
    assert describe(covered).endswith("claims the invariance for this model on this CPU "
                                      "(x86-64 with AVX-512 and VNNI)")
