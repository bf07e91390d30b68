"""The Responses API's parsing and its bounded store, without a model."""

import pytest

from dgr.openai import BadRequest
from dgr.responses import ResponseStore, parse_response_request


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
    assert len(ResponseStore(0, 1000)) == 0


def test_a_request_becomes_a_chat_with_its_history():
    store = ResponseStore(10, 10_000)
    store.put("r1", [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
    parsed = parse_response_request({
        "input": [{"type": "message", "role": "user",
                   "content": [{"type": "input_text", "text": "c"}]}],
        "previous_response_id": "r1", "instructions": "sys", "max_output_tokens": 5,
        "temperature": 0.5, "text": {"format": {"type": "json_object"}}}, store)
    assert parsed.messages == [{"role": "user", "content": "a"},
                               {"role": "assistant", "content": "b"},
                               {"role": "user", "content": "c"}]
    assert parsed.instructions == "sys" and parsed.store and not parsed.stream
    params = parsed.chat.params
    assert params.max_tokens == 5 and params.temperature == 0.5 and params.grammar
    with pytest.raises(BadRequest) as exc:
        parse_response_request({"input": "x", "top_p": 2}, store)
    assert exc.value.param == "top_p"
    with pytest.raises(BadRequest) as exc:
        parse_response_request({"input": "x", "stream": "yes"}, store)
    assert exc.value.param == "stream"
