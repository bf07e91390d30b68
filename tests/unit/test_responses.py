"""The Responses API's parsing and its bounded store, without a model."""

import pytest

from dgr.doors.fields import BadRequest
from dgr.doors.response_store import ResponseStore
from dgr.doors.responses import parse_response_request


def test_the_store_keeps_recent_conversations_within_count_and_bytes():
    store = ResponseStore(max_count=2, max_bytes=200)
    for i in range(3):
        store.put(f"r{i}", [{"role": "user", "content": f"m{i}"}])
    assert store.get("r0") is None and len(store) == 2
    assert store.get("r1") is not None  # now the most recent
    store.put("r3", [{"role": "user", "content": "x"}])
    assert store.get("r2") is None and store.get("r1") is not None
    store.put("big", [{"role": "user", "content": "y" * 300}])  # larger than the bound: not kept
    assert store.get("big") is None and store.bytes <= 200
    assert store.statistics() == {"response_store_entries": {"used": 2, "capacity": 2},
                                  "response_store_bytes": {"used": store.bytes, "capacity": 200}}
    assert len(ResponseStore(0, 1000)) == 0


def test_a_request_becomes_a_chat_with_its_history():
    store = ResponseStore(10, 10_000)
    store.put("r1", [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
    parsed = parse_response_request({
        "input": [{"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": "c"}]}],
        "previous_response_id": "r1", "instructions": "sys", "max_output_tokens": 5,
        "temperature": 0.5, "text": {"format": {"type": "json_object"}}}, store)
    assert parsed.conversation == [{"role": "user", "content": "a"},
                                   {"role": "assistant", "content": "b"},
                                   {"role": "user", "content": "c"}]
    assert parsed.chat.messages == [{"role": "system", "content": "sys"}, *parsed.conversation]
    assert parsed.instructions == "sys" and parsed.store and not parsed.chat.stream
    params = parsed.chat.params
    assert params.max_tokens == 5 and params.temperature == 0.5 and params.grammar
    with pytest.raises(BadRequest) as exc:
        parse_response_request({"input": "x", "top_p": 2}, store)
    assert exc.value.param == "top_p"
    with pytest.raises(BadRequest) as exc:
        parse_response_request({"input": "x", "stream": "yes"}, store)
    assert exc.value.param == "stream"


def test_function_calls_and_their_outputs_become_the_chat_history():
    store = ResponseStore(10, 10_000)
    tool = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
    parsed = parse_response_request({
        "input": [{"role": "user", "content": "go"},
                  {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"},
                  {"type": "function_call", "call_id": "c2", "name": "f", "arguments": "{}"},
                  {"type": "function_call_output", "call_id": "c1", "output": "one"},
                  {"type": "function_call_output", "call_id": "c2", "output": "two"}],
        "tools": [tool], "tool_choice": "required"}, store)
    assert [m["role"] for m in parsed.conversation] == ["user", "assistant", "tool", "tool"]
    assert len(parsed.conversation[1]["tool_calls"]) == 2  # one answer's calls, one message
    assert parsed.chat.tools.choice == "required" and parsed.chat.tools.names == ["f"]
    with pytest.raises(BadRequest) as exc:
        parse_response_request({"input": [{"type": "function_call_output", "call_id": "zz",
                                           "output": "x"}]}, store)
    assert exc.value.param == "input"
    with pytest.raises(BadRequest) as exc:
        parse_response_request({"input": "x", "tools": [tool],
                                "tool_choice": {"type": "function", "name": "g"}}, store)
    assert exc.value.param == "tool_choice"
