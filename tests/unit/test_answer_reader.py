"""dgr.tools.AnswerReader: a constrained answer read as it is generated, cut anywhere."""

import json
import random

import pytest

from dgr.tools import AnswerReader, ArgumentsPiece, CallStarted, ContentPiece

ANSWERS = [
    '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Par\\"is", "n": 12, '
    '"x": [1, {"a": true}], "s": "a\\\\b}"}}, {"name": "b", "arguments": {}}]}',
    '{ "tool_calls" : [ { "name" : "f" , "arguments" : { "v" : -1.5e3 } } ] }',
    '{"tool_calls": [{"name": "n\\u00e9", "arguments": {"q": null}}]}',
    '{"response": "hello \\u00e9 w\\\\orld \\ud83d\\ude00 \\"ok\\" \\n"}',
    '{"response": "a\x08b\\/c \\udc00 d"}',  # a control character, a lone surrogate
]


def read(text: str, cuts: list[int]) -> tuple[AnswerReader, list]:
    reader, out, at = AnswerReader(), [], 0
    for cut in [*cuts, len(text)]:
        out += reader.feed(text[at:cut])
        at = cut
    return reader, out


@pytest.mark.parametrize("text", ANSWERS)
def test_an_answer_cut_anywhere_reads_the_same(text):
    """Calls with their names, the arguments' pieces joined as the JSON the model
    wrote, and a response's text decoded, wherever the pieces of text end."""
    expected = json.loads(text, strict=False)
    rng = random.Random(7)
    for _ in range(300):
        cuts = sorted(rng.sample(range(1, len(text)), rng.randint(0, min(20, len(text) - 1))))
        reader, out = read(text, cuts)
        assert reader.whole and reader.text == text
        content = "".join(p.text for p in out if isinstance(p, ContentPiece))
        calls = [p for p in out if isinstance(p, CallStarted)]
        arguments: dict[int, str] = {}
        for p in out:
            if isinstance(p, ArgumentsPiece):
                arguments[p.index] = arguments.get(p.index, "") + p.text
        if "response" in expected:
            assert content == expected["response"].replace("\udc00", "\ufffd") and not calls
            continue
        assert [c.name for c in calls] == [c["name"] for c in expected["tool_calls"]]
        assert [c.index for c in calls] == list(range(len(calls)))
        assert len({c.id for c in calls}) == len(calls)
        for i, call in enumerate(expected["tool_calls"]):
            assert json.loads(arguments[i]) == call["arguments"]
            assert arguments[i] in text  # as written, not re-encoded
        # a call starts before its arguments' first piece
        order = [(type(p), p.index) for p in out if not isinstance(p, ContentPiece)]
        for i in range(len(calls)):
            assert order.index((CallStarted, i)) < order.index((ArgumentsPiece, i))


def test_a_cut_answer_is_not_whole_and_keeps_its_text():
    reader, out = read(ANSWERS[0][:60], [10, 30])
    assert not reader.whole and reader.text == ANSWERS[0][:60]
    assert [p.name for p in out if isinstance(p, CallStarted)] == ["get_weather"]
