"""The grammars of JSON schemas (tool calls, response_format): strings without raw
control characters, which strict JSON parsers refuse."""

from dgr import tools


def test_a_schemas_strings_leave_out_raw_control_characters():
    grammar = tools.json_grammar({"type": "object", "properties": {"s": {"type": "string"}}})
    char = next(line for line in grammar.splitlines() if line.startswith("char ::="))
    assert char.startswith('char ::= [^"\\\\\\x7F\\x00-\\x1F] |')
