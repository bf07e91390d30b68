"""A thinking model's answer split into thinking and answer (dgr.reasoning): the
same parts whole and in any pieces, the prompt opening the thinking, an unclosed
thinking, text without any; gpt-oss's harmony channels likewise."""

import pytest
from hypothesis import given, strategies as st

from dgr import reasoning
from dgr.doors.chat_turn import ChatTurn, Thinking
from dgr.doors.request import GenerationRequest
from dgr.spec import SamplingParams

CASES = [
    ("<think>\nLet me see.\n</think>\n\nParis.", False, ("Let me see.\n", "Paris.")),
    ("  <think>a</think>b", False, ("a", "b")),
    ("Let me see.\n</think>\n\nParis.", True, ("Let me see.\n", "Paris.")),
    ("\nstill thinking", True, ("still thinking", "")),
    ("<think>cut short", False, ("cut short", "")),
    ("Paris. <think>not thinking</think>", False, ("", "Paris. <think>not thinking</think>")),
    ("", False, ("", "")),
    ("<thi", False, ("", "<thi")),
    ("<think></think>Paris", False, ("", "Paris")),
]


HARMONY = [
    ("<|channel|>analysis<|message|>Let me see.<|end|><|start|>assistant<|channel|>final"
     "<|message|>Paris.<|return|>", ("Let me see.", "Paris.")),
    ("<|channel|>analysis<|message|>cut short", ("cut short", "")),
    ("<|channel|>analysis<|message|>a<|end|><|start|>assistant<|channel|>commentary"
     "<|message|>b<|end|><|start|>assistant<|channel|>final<|message|>c", ("a", "bc")),
    ("Paris, without channels <|end|>", ("", "Paris, without channels <|end|>")),
    ("<|channel|>final<|message|>only the answer<|return|>", ("", "only the answer")),
    ("<|channel|>analy", ("", "")),
    ("", ("", "")),
]
STYLES = [(text, reasoning.Splitting(opened=opened), parts) for text, opened, parts in CASES] \
    + [(text, reasoning.Splitting(harmony=True), parts) for text, parts in HARMONY]


@pytest.mark.parametrize("text,style,parts", STYLES)
def test_whole_answers_split(text, style, parts):
    assert style.splitter().feed(text, final=True) == parts


@given(st.sampled_from(STYLES), st.lists(st.integers(0, 120), max_size=8))
def test_any_pieces_give_the_whole_answers_parts(case, cuts):
    text, style, parts = case
    points = sorted({min(c, len(text)) for c in cuts})
    pieces = [text[a:b] for a, b in zip([0] + points, points + [len(text)])]
    splitter = style.splitter()
    got = [splitter.feed(piece, final=i == len(pieces) - 1) for i, piece in enumerate(pieces)]
    assert ("".join(t for t, _ in got), "".join(a for _, a in got)) == parts


def test_the_family_and_the_prompt_tell_where_the_output_starts():
    assert reasoning.harmony("<|start|>assistant<|channel|>final<|message|>")
    assert not reasoning.harmony("{{ '</think>' }}") and not reasoning.harmony(None)
    assert reasoning.thinks("{{ '<think>' }}...{{ '</think>' }}")
    assert not reasoning.thinks("{{ messages }}") and not reasoning.thinks(None)
    assert reasoning.opened_in_prompt("<|user|>hi<|assistant|><think>\n")
    assert not reasoning.opened_in_prompt("<think>\n\n</think>\n\n")
    assert not reasoning.opened_in_prompt("a<think>x</think>b<|assistant|>")


def test_a_tag_and_the_blank_line_after_it_in_separate_pieces():
    splitter = reasoning.ThinkSplitter()
    pieces = ["<think>", "\n", "Let me", " see.\n</", "think>", "\n\n", "Paris."]
    got = [splitter.feed(p, final=i == len(pieces) - 1) for i, p in enumerate(pieces)]
    assert "".join(t for t, _ in got) == "Let me see.\n"
    assert "".join(a for _, a in got) == "Paris."


def test_harmony_thinking_tokens_are_counted():
    pieces = ["<|channel|>", "analysis", "<|message|>", "Let", " me", "<|end|>", "<|start|>",
              "assistant", "<|channel|>", "final", "<|message|>", "Paris", "<|return|>"]
    reader = ChatTurn(GenerationRequest(SamplingParams()), "",
                      Thinking(on=True, split=True, harmony=True)).reader()
    for piece in pieces:  # usage's reasoning_tokens: the analysis message's tokens
        reader.feed(piece, token=True, final=False)
    assert reader.thought_tokens == 4
