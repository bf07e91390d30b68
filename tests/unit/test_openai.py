"""OpenAI request parsing and response shapes, without a model or a server."""

import json

import pytest

from dgr._codes import MAX_LOGPROBS
from dgr.spec import MAX_STOP_STRINGS
from dgr.doors.completions import TextEvents
from dgr.doors.sse import sse_event
from dgr.doors.fields import BadRequest
from dgr.doors.openai import CompletionBuilder, parse_chat, parse_completion
from dgr.reasoning import ThinkingSwitch
from dgr.stream import Chunk
from dgr.tools import GENERIC


def test_a_completion_request_maps_every_field_to_sampling_params():
    parsed = parse_completion({
        "prompt": "hi", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 40,
        "min_p": 0.05, "typical_p": 0.8, "seed": 3, "stop": ["x", "y"], "logprobs": 2,
        "ignore_eos": True,
        "logit_bias": {"5": -100}, "presence_penalty": 0.5, "frequency_penalty": -0.5,
        "repetition_penalty": 1.1, "repeat_last_n": 32, "min_tokens": 2,
        "stop_token_ids": [9], "n": 2, "stream": True,
        "stream_options": {"include_usage": True}, "user": "someone"})
    p = parsed.params
    assert parsed.prompts == ["hi"] and parsed.n == 2 and parsed.stream and parsed.include_usage
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.min_p, p.seed) == (7, 0.5, 0.9, 40,
                                                                                 0.05, 3)
    assert p.typical_p == 0.8
    with pytest.raises(BadRequest) as exc:
        parse_completion({"prompt": "hi", "typical_p": 0})
    assert exc.value.param == "typical_p"
    assert p.stop == ("x", "y") and p.logprobs == 2 and p.ignore_eos
    assert p.logit_bias == ((5, -100),) and p.sampler_bias()[0][1] == float("-inf")
    assert (p.presence_penalty, p.frequency_penalty, p.repeat_penalty, p.repeat_last_n) == (
        0.5, -0.5, 1.1, 32)
    assert p.min_tokens == 2 and p.stop_token_ids == (9,)


def test_openai_defaults_differ_from_the_librarys():
    p = parse_completion({"prompt": "hi"}).params
    assert p.temperature == 1.0  # OpenAI's default; SamplingParams' own is greedy
    assert p.max_tokens is None and p.logprobs == 0


@pytest.mark.parametrize("body, param", [
    ({"prompt": "hi", "tools": []}, "tools"),
    ({"prompt": "hi", "mirostat": 2}, "mirostat"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": [1, True]}, "prompt"),
    ({"prompt": "hi", "max_tokens": 0}, "max_tokens"),
    ({"prompt": "hi", "temperature": "hot"}, "temperature"),
    ({"prompt": "hi", "logprobs": MAX_LOGPROBS + 1}, "logprobs"),
    ({"prompt": "hi", "stop": ["s"] * (MAX_STOP_STRINGS + 1)}, "stop"),
    ({"prompt": "hi", "n": 33}, "n"),
    ({"prompt": ["a", "b"], "n": 17}, "n"),
    ({"prompt": "hi", "repeat_penalty": 1.1, "repetition_penalty": 1.1}, "repeat_penalty"),
    # SamplingParams validates, the error names the request's own name for the field
    ({"prompt": "hi", "repetition_penalty": 0}, "repetition_penalty"),
    ({"prompt": "hi", "stop_token_ids": 5}, "stop_token_ids"),
    ({"prompt": "hi", "ignore_eos": "yes"}, "ignore_eos"),
    ({"prompt": "hi", "top_k": -2}, "top_k"),
    ({"prompt": "hi", "logit_bias": {"5": 101}}, "logit_bias"),
    ({"prompt": "hi", "min_tokens": 5, "max_tokens": 2}, "min_tokens"),
    ({"prompt": "hi", "grammar": "root ::= \"a\"", "response_format": {"type": "text"}},
     "grammar"),
])
def test_bad_completion_fields_are_a_400_naming_the_field(body, param):
    with pytest.raises(BadRequest) as exc:
        parse_completion(body)
    assert exc.value.param == param


def test_a_non_object_body_is_refused():
    for body in ([], "text", None, 3):
        with pytest.raises(BadRequest):
            parse_completion(body)
        with pytest.raises(BadRequest):
            parse_chat(body)


def test_chat_messages_are_flattened_and_logprobs_need_the_flag():
    parsed = parse_chat({
        "messages": [{"role": "system", "content": "be brief"},
                     {"role": "user", "content": [{"type": "text", "text": "a"},
                                                  {"type": "text", "text": "b"}]},
                     {"role": "assistant", "content": None}],
        "logprobs": True, "top_logprobs": 3, "max_completion_tokens": 5})
    assert parsed.messages == [{"role": "system", "content": "be brief"},
                               {"role": "user", "content": "a\nb"},  # as llama-server, vLLM
                               {"role": "assistant", "content": ""}]
    assert parsed.chat and parsed.top_logprobs == 3 and parsed.params.logprobs == 3
    assert parsed.params.max_tokens == 5
    with pytest.raises(BadRequest) as exc:
        parse_chat({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2})
    assert exc.value.param == "top_logprobs"
    with pytest.raises(BadRequest):
        parse_chat({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})
    with pytest.raises(BadRequest):
        parse_chat({"messages": []})


def test_a_json_schema_becomes_a_grammar_and_a_bad_one_names_the_field():
    parsed = parse_chat({"messages": [{"role": "user", "content": "x"}],
                            "response_format": {"type": "json_schema", "json_schema": {
                                "name": "t", "schema": {"type": "object", "properties": {
                                    "a": {"type": "integer"}}, "required": ["a"]}}}})
    assert parsed.params.grammar and "root" in parsed.params.grammar
    with pytest.raises(BadRequest) as exc:
        parse_chat({"messages": [{"role": "user", "content": "x"}],
                    "response_format": {"type": "xml"}})
    assert exc.value.param == "response_format"


def test_response_shapes():
    texts = {5: "Hel", 6: "lo"}
    builder = CompletionBuilder("m", chat=False, token_text=texts.get)
    chunks = [Chunk(5, "Hel", -0.5, [(5, -0.5), (6, -1.5)]), Chunk(6, "lo", -0.25, [(6, -0.25)])]
    body = builder.full([("Hello", chunks, "length")], prompt_tokens=3, completion_tokens=2)
    assert body["object"] == "text_completion" and body["model"] == "m"
    assert body["usage"] == {"prompt_tokens": 3, "completion_tokens": 2, "total_tokens": 5,
                             "prompt_tokens_details": {"cached_tokens": 0}}
    choice = body["choices"][0]
    assert choice["text"] == "Hello" and choice["finish_reason"] == "length"
    assert choice["logprobs"] == {"tokens": ["Hel", "lo"], "token_logprobs": [-0.5, -0.25],
                                  "top_logprobs": [{"Hel": -0.5, "lo": -1.5}, {"lo": -0.25}],
                                  "text_offset": [0, 3]}
    chat = CompletionBuilder("m", chat=True, token_text=texts.get, top_logprobs=1)
    assert chat.role_chunk(0)["choices"][0]["delta"] == {"role": "assistant", "content": None}
    first = chat.delta("Hel", chunks[:1])
    assert first["object"] == "chat.completion.chunk"
    assert first["choices"][0]["delta"] == {"content": "Hel"}
    assert first["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == [
        {"token": "Hel", "logprob": -0.5, "bytes": list(b"Hel")}]
    last = chat.delta("", [], finish_reason="stop")
    assert last["choices"][0] == {"index": 0, "delta": {}, "logprobs": None,
                                  "finish_reason": "stop"}
    assert chat.usage_chunk(3, 2)["choices"] == []


@pytest.mark.parametrize("chat", [False, True])
def test_a_text_delta_from_its_template_is_the_whole_events_bytes(chat):
    builder = CompletionBuilder("m\u00e9 \"quoted\" \\ \x01", chat, str)
    events = TextEvents(builder)
    texts = ["a", " hello", "\u00e9\u4e2d\U0001f600", "\"\\/\n\t\r", "\x00", "\x00\x00",
             "\u2028\u2029", "data: x\n\n", "{}[],:"]
    for index in (0, 2, 0):
        for text in texts:
            assert events(text, index) == sse_event(builder.delta(text, [], index=index))


def test_text_deltas_without_a_template_are_encoded_whole():
    """A model name holding the template's mark: no template, the same event."""
    builder = CompletionBuilder("m\x00", False, str)
    assert TextEvents(builder)("hi", 1) == sse_event(builder.delta("hi", [], index=1))


def test_message_roles_are_openais_and_developer_is_system():
    messages = parse_chat({"messages": [
        {"role": "developer", "content": "d"},
        {"role": "assistant", "tool_calls": [{"id": "c1", "type": "function",
                                              "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "t"}]}).messages
    assert [m["role"] for m in messages] == ["system", "assistant", "tool"]
    assert messages[1]["tool_calls"] == [{"id": "c1", "type": "function",
                                          "function": {"name": "f", "arguments": {}}}]
    assert messages[2]["tool_call_id"] == "c1"
    # the generic format renders the call as the JSON the model answers in
    rendered = GENERIC.render(messages, None, lambda plain, add, thinking: plain, True,
                              ThinkingSwitch())
    assert json.loads(rendered[1]["content"]) == {"tool_calls": [{"name": "f", "arguments": {}}]}
    assert all(set(m) == {"role", "content"} for m in rendered)
    with pytest.raises(BadRequest) as exc:
        parse_chat({"messages": [{"role": "wizard", "content": "x"}]})
    assert exc.value.param == "messages" and "wizard" in str(exc.value)


def test_usage_carries_cached_tokens():
    builder = CompletionBuilder("m", chat=True, token_text=str)
    assert builder.usage(10, 2, 7) == {"prompt_tokens": 10, "completion_tokens": 2,
                                       "total_tokens": 12,
                                       "prompt_tokens_details": {"cached_tokens": 7}}


def test_tokenize_and_detokenize_requests():
    from dgr.doors.tokens import parse_detokenize, parse_tokenize, token_piece

    assert parse_tokenize({"content": "x"}) == ("x", False, False)
    assert parse_tokenize({"content": "x", "add_special": True, "with_pieces": True}) == (
        "x", True, True)
    assert parse_detokenize({"tokens": [1, 2]}) == [1, 2]
    for bad in ({"content": None}, {"content": "x", "add_special": "yes"}, []):
        with pytest.raises(BadRequest):
            parse_tokenize(bad)
    for bad in ({"tokens": [True]}, {"tokens": "12"}, {}):
        with pytest.raises(BadRequest):
            parse_detokenize(bad)
    assert token_piece(b"ab") == "ab" and token_piece(b"\xc3") == [0xC3]


def test_echo_with_logprobs_scores_the_prompt_and_allows_max_tokens_0():
    parsed = parse_completion({"prompt": "hi", "echo": True, "logprobs": 3, "max_tokens": 0})
    assert parsed.params.prompt_logprobs == 3 and parsed.params.max_tokens == 0
    assert parse_completion({"prompt": "hi", "echo": True}).params.prompt_logprobs is None
    with pytest.raises(BadRequest) as exc:
        parse_completion({"prompt": "hi", "max_tokens": 0})
    assert exc.value.param == "max_tokens"
    builder = CompletionBuilder("m", chat=False, token_text={1: "a", 2: "bc", 3: "d"}.get)
    prompt = [(1, None), (2, (-0.5, [(2, -0.5), (3, -1.0)]))]
    body = builder.full([("abcd", [Chunk(3, "d", -0.25, [(3, -0.25)])], "length")], 2, 1,
                        prompts=[prompt])
    assert body["choices"][0]["logprobs"] == {
        "tokens": ["a", "bc", "d"], "token_logprobs": [None, -0.5, -0.25],
        "top_logprobs": [None, {"bc": -0.5, "d": -1.0}, {"d": -0.25}], "text_offset": [0, 1, 3]}


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}


def test_tools_become_a_grammar_and_a_system_message():
    parsed = parse_chat({"messages": [{"role": "user", "content": "weather?"}],
                                   "tools": [WEATHER], "tool_choice": "required"})
    assert parsed.tools.choice == "required" and parsed.tools.names == ["get_weather"]
    rendered = GENERIC.render(parsed.messages, parsed.tools,
                              lambda plain, add_generation_prompt, enable_thinking: plain, True,
                              ThinkingSwitch())
    assert rendered[0]["role"] == "system" and "get_weather" in rendered[0]["content"]
    assert "tool_calls" in parsed.params.grammar and "response" not in parsed.params.grammar
    auto = parse_chat({"messages": [{"role": "user", "content": "x"}], "tools": [WEATHER]})
    assert auto.tools.choice == "auto" and "response" in auto.params.grammar
    none = parse_chat({"messages": [{"role": "user", "content": "x"}], "tools": [WEATHER],
                              "tool_choice": "none"})
    assert none.tools is None and none.params.grammar is None and len(none.messages) == 1


@pytest.mark.parametrize("extra, param", [
    ({"tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ({"tool_choice": "sometimes"}, "tool_choice"),
    ({"tools": [{"type": "retrieval"}]}, "tools"),
    ({"tools": [WEATHER, WEATHER]}, "tools"),
    ({"response_format": {"type": "json_object"}}, "tools"),
    ({"parallel_tool_calls": "yes"}, "parallel_tool_calls"),
])
def test_bad_tool_requests_name_the_field(extra, param):
    body = {"messages": [{"role": "user", "content": "x"}], "tools": [WEATHER]} | extra
    with pytest.raises(BadRequest) as exc:
        parse_chat(body)
    assert exc.value.param == param


def test_a_tool_message_must_answer_an_earlier_call():
    with pytest.raises(BadRequest) as exc:
        parse_chat({"messages": [{"role": "tool", "tool_call_id": "c9", "content": "1"}]})
    assert exc.value.param == "messages"


def test_tool_answers_become_calls_or_content():
    from dgr import tools

    def parse_answer(text):
        reader = tools.AnswerReader()
        reader.feed(text)
        return reader.result()

    content, calls = parse_answer('{"tool_calls": [{"name": "get_weather", '
                                        '"arguments": {"city": "Paris"}}]}')
    assert content is None and calls[0]["function"] == {"name": "get_weather",
                                                         "arguments": '{"city": "Paris"}'}
    assert calls[0]["id"].startswith("call_") and calls[0]["type"] == "function"
    assert parse_answer('{"response": "sunny"}') == ("sunny", [])
    assert parse_answer('{"tool_ca') == ('{"tool_ca', [])  # cut short
    # cut short after saying something: what it said, as a stream sends it
    assert parse_answer('{"response": "sun') == ("sun", [])
    content, calls = parse_answer('{"tool_calls": [{"name": "f", "arguments": {"a": 1')
    assert content is None and calls[0]["function"] == {"name": "f", "arguments": '{"a": 1'}
    assert parse_answer('{"response": ""}') == ("", [])


def test_a_final_assistant_message_is_continued_unless_asked_otherwise():
    chat = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "Wh"}]
    prefill = parse_chat({"messages": chat})  # llama-server's prefill, Anthropic's too
    assert prefill.continue_final and not prefill.add_generation_prompt
    vllm = parse_chat({"messages": chat, "continue_final_message": True,
                          "add_generation_prompt": False})
    assert vllm.continue_final
    closed = parse_chat({"messages": chat, "add_generation_prompt": False})
    assert not closed.continue_final and not closed.add_generation_prompt
    answered = parse_chat({"messages": chat[:1]})
    assert answered.add_generation_prompt and not answered.continue_final
    for body, param in [({"messages": chat, "continue_final_message": True,
                          "add_generation_prompt": True}, "continue_final_message"),
                        ({"messages": chat[:1], "continue_final_message": True},
                         "continue_final_message"),
                        ({"messages": chat + chat[1:]}, "messages")]:
        with pytest.raises(BadRequest) as exc:
            parse_chat(body)
        assert exc.value.param == param


def test_a_top_level_json_schema_is_the_response_formats():
    parsed = parse_chat({"messages": [{"role": "user", "content": "x"}],
                            "json_schema": {"const": "42"}})
    assert parsed.params.grammar and "42" in parsed.params.grammar
    with pytest.raises(BadRequest) as exc:
        parse_chat({"messages": [{"role": "user", "content": "x"}], "json_schema": {},
                    "grammar": "root ::= \"a\""})
    assert exc.value.param == "json_schema"
