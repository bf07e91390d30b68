"""The official `anthropic` client against the node's Messages API door, as
coding agents and tools call it."""

import anthropic
import pytest

from test_server import start_server  # noqa: F401  (the fixture)

# bounded choices: the tiny random model's free strings could run past max_tokens
WEATHER = {"name": "get_weather", "description": "The weather in a city.",
           "input_schema": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]},
                                                             "days": {"type": "integer"}},
                            "required": ["city", "days"]}}


@pytest.fixture
async def client(start_server):  # noqa: F811
    server = await start_server(api_key="k")
    async with anthropic.AsyncAnthropic(base_url=server.url, api_key="k",
                                        max_retries=0) as client:
        yield client


def text_of(message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


async def test_plain_system_turns_and_the_ways_a_message_stops(client):
    hello = [{"role": "user", "content": "hello"}]
    plain = await client.messages.create(model="m", max_tokens=12, messages=hello)
    assert plain.role == "assistant" and plain.stop_reason in ("end_turn", "max_tokens")
    assert plain.usage.input_tokens > 0 and plain.usage.output_tokens > 0
    cut = await client.messages.create(model="m", max_tokens=3, messages=hello,
                                       system="Answer at length.")
    assert cut.stop_reason == "max_tokens" and cut.usage.output_tokens == 3
    turns = hello + [{"role": "assistant", "content": text_of(plain)},
                     {"role": "user", "content": [{"type": "text", "text": "and then?",
                                                   "cache_control": {"type": "ephemeral"}}]}]
    again = await client.messages.create(model="m", max_tokens=8, messages=turns)
    assert again.usage.cache_read_input_tokens > 0  # the first turn's prefix, from the cache
    # greedy (the SDK no longer has `temperature` in create's signature; clients that
    # want it send it as an extra field)
    greedy = {"temperature": 0}
    long = await client.messages.create(model="m", max_tokens=40, messages=hello,
                                        extra_body=greedy)
    stop = text_of(long)[2:4]
    stopped = await client.messages.create(model="m", max_tokens=40, messages=hello,
                                           stop_sequences=[stop], extra_body=greedy)
    assert stopped.stop_reason == "stop_sequence" and stopped.stop_sequence == stop
    assert text_of(stopped) == text_of(long)[:text_of(long).find(stop)]


async def test_a_streamed_message_is_the_whole_one_in_anthropics_events(client):
    hello = [{"role": "user", "content": "hello"}]
    whole = await client.messages.create(model="m", max_tokens=12, messages=hello,
                                         extra_body={"temperature": 0})
    kinds, text = [], ""
    async with client.messages.stream(model="m", max_tokens=12, messages=hello,
                                      extra_body={"temperature": 0}) as stream:
        async for event in stream:
            kinds.append(event.type)
        final = await stream.get_final_message()
    text = text_of(final)
    assert text == text_of(whole) and final.stop_reason == whole.stop_reason
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert "content_block_delta" in kinds and "message_delta" in kinds


async def test_tools_any_named_streamed_and_a_result_turn(client):
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    greedy = {"temperature": 0}
    called = await client.messages.create(model="m", max_tokens=300, messages=ask,
                                          tools=[WEATHER], tool_choice={"type": "any", "disable_parallel_tool_use": True},
                                          extra_body=greedy)
    assert called.stop_reason == "tool_use"
    use = next(block for block in called.content if block.type == "tool_use")
    assert use.name == "get_weather" and use.input["city"] in ("Paris", "Rome")
    named = await client.messages.create(model="m", max_tokens=300, messages=ask, tools=[WEATHER],
                                         tool_choice={"type": "tool", "name": "get_weather",
                                                      "disable_parallel_tool_use": True})
    assert named.content[-1].type == "tool_use"
    async with client.messages.stream(model="m", max_tokens=300, messages=ask, tools=[WEATHER],
                                      tool_choice={"type": "any", "disable_parallel_tool_use": True}, extra_body=greedy) as stream:
        deltas = [e.delta.type async for e in stream if e.type == "content_block_delta"]
        streamed = await stream.get_final_message()
    assert "input_json_delta" in deltas and streamed.content[-1].input == use.input
    # an agent loop: the call, its result, the answer
    turns = ask + [{"role": "assistant", "content": called.content},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                                 "content": "Sunny, 21 C"}]}]
    answer = await client.messages.create(model="m", max_tokens=20, messages=turns,
                                          tools=[WEATHER], tool_choice={"type": "none"})
    assert answer.stop_reason in ("end_turn", "max_tokens") and text_of(answer)


async def test_count_tokens_and_errors_in_anthropics_shape(client, start_server):  # noqa: F811
    counted = await client.messages.count_tokens(
        model="m", messages=[{"role": "user", "content": "hello"}])
    made = await client.messages.create(model="m", max_tokens=1,
                                        messages=[{"role": "user", "content": "hello"}])
    assert counted.input_tokens == made.usage.input_tokens + made.usage.cache_read_input_tokens
    with pytest.raises(anthropic.BadRequestError) as bad:
        await client.messages.create(model="m", max_tokens=5, messages=[
            {"role": "user", "content": [{"type": "image", "source": {}}]}])
    assert bad.value.body["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.BadRequestError):  # a thinking needs its budget
        await client.messages.create(model="m", max_tokens=5, thinking={"type": "enabled"},
                                     messages=[{"role": "user", "content": "hi"}])
    wrong = anthropic.AsyncAnthropic(base_url=client.base_url, api_key="nope", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as denied:
        await wrong.messages.create(model="m", max_tokens=5,
                                    messages=[{"role": "user", "content": "hi"}])
    assert denied.value.body["error"]["type"] == "authentication_error"
