"""The official `openai` client against the server, as applications call it:
structured output, tool calls and a tool loop, the Responses API, prompt
log-probabilities and cached-token usage."""

import json

import openai
import pydantic
import pytest

from test_server import WEATHER_TOOL, start_server  # noqa: F401  (the fixture)


@pytest.fixture
async def client(start_server):  # noqa: F811
    server = await start_server()
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused",
                                  max_retries=0) as client:
        yield client


class Answer(pydantic.BaseModel):
    city: str
    days: int


async def test_structured_output_and_tool_calls(client):
    parsed = await client.chat.completions.parse(
        model="m", messages=[{"role": "user", "content": "json"}], response_format=Answer,
        max_tokens=200, temperature=0)
    assert isinstance(parsed.choices[0].message.parsed, Answer)
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    called = await client.chat.completions.create(
        model="m", messages=messages, tools=[WEATHER_TOOL], tool_choice="required",
        parallel_tool_calls=False, max_tokens=200, temperature=0)
    message = called.choices[0].message
    assert called.choices[0].finish_reason == "tool_calls"
    call = message.tool_calls[0]
    arguments = json.loads(call.function.arguments)
    assert call.function.name == "get_weather" and arguments["city"] in ("Paris", "Rome")
    answer = await client.chat.completions.create(
        model="m", messages=messages + [message.model_dump(exclude_none=True),
                                        {"role": "tool", "tool_call_id": call.id,
                                         "content": "sunny"}],
        tools=[WEATHER_TOOL], max_tokens=30, temperature=0)
    assert answer.choices[0].message.content is not None or answer.choices[0].message.tool_calls
    named = dict(model="m", messages=messages, tools=[WEATHER_TOOL],
                 tool_choice={"type": "function", "function": {"name": "get_weather"}},
                 parallel_tool_calls=False, max_tokens=200, temperature=0)
    whole = (await client.chat.completions.create(**named)).choices[0].message.tool_calls[0]
    # the SDK's own stream helper puts the streamed pieces together
    async with client.chat.completions.stream(**named) as stream:
        argument_deltas = [event async for event in stream
                           if event.type == "tool_calls.function.arguments.delta"]
        final = await stream.get_final_completion()
    streamed = final.choices[0].message.tool_calls[0]
    assert final.choices[0].finish_reason == "tool_calls" and len(argument_deltas) > 1
    assert streamed.function.name == "get_weather" and streamed.id.startswith("call_")
    assert json.loads(streamed.function.arguments) == json.loads(whole.function.arguments)


async def test_responses_api(client):
    first = await client.responses.create(model="m", input="Say something", instructions="Brief.",
                                          max_output_tokens=6, temperature=0)
    assert first.output_text and first.usage.output_tokens == 6
    follow = await client.responses.create(model="m", input="More?",
                                           previous_response_id=first.id,
                                           max_output_tokens=4, temperature=0)
    assert follow.usage.input_tokens_details.cached_tokens > 0
    events = [event async for event in await client.responses.create(
        model="m", input="Say something", max_output_tokens=6, temperature=0, stream=True)]
    assert events[0].type == "response.created"
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == events[-1].response.output_text
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
              "additionalProperties": False}
    structured = await client.responses.create(
        model="m", input="json", max_output_tokens=40, temperature=0,
        text={"format": {"type": "json_schema", "name": "t", "schema": schema}})
    assert isinstance(json.loads(structured.output_text)["a"], int)
    with pytest.raises(openai.BadRequestError):
        await client.responses.create(model="m", input="x", previous_response_id="resp_gone")


async def test_prompt_logprobs_and_cached_tokens(client):
    scored = await client.completions.create(model="m", prompt="The quick brown fox", echo=True,
                                             logprobs=1, max_tokens=0, temperature=0)
    logprobs = scored.choices[0].logprobs
    assert logprobs.token_logprobs[0] is None and len(logprobs.tokens) == scored.usage.prompt_tokens
    system = "You are a careful assistant who answers in one short sentence. " * 4
    for _ in range(2):
        chat = await client.chat.completions.create(
            model="m", messages=[{"role": "system", "content": system},
                                 {"role": "user", "content": "hi"}], max_tokens=2, temperature=0)
    assert chat.usage.prompt_tokens_details.cached_tokens == chat.usage.prompt_tokens - 1


async def test_responses_function_calls_and_a_tool_loop(client):
    tool = {"type": "function", "name": WEATHER_TOOL["function"]["name"],
            "description": WEATHER_TOOL["function"]["description"],
            "parameters": WEATHER_TOOL["function"]["parameters"]}
    first = await client.responses.create(
        model="m", input="Weather in Paris?", tools=[tool], tool_choice="required",
        parallel_tool_calls=False, max_output_tokens=200, temperature=0)
    call = first.output[0]
    assert call.type == "function_call" and call.name == "get_weather"
    assert json.loads(call.arguments)["city"] in ("Paris", "Rome")
    # the result, continuing the stored conversation
    answer = await client.responses.create(
        model="m", previous_response_id=first.id, tools=[tool], max_output_tokens=30,
        temperature=0, input=[{"type": "function_call_output", "call_id": call.call_id,
                               "output": "sunny"}])
    assert answer.output and answer.usage.input_tokens_details.cached_tokens > 0
    events = [e async for e in await client.responses.create(
        model="m", input="Weather in Paris?", tools=[tool], tool_choice="required",
        parallel_tool_calls=False, max_output_tokens=200, temperature=0, stream=True)]
    kinds = [e.type for e in events]
    assert kinds[-1] == "response.completed"
    # as OpenAI streams a call: its item, its arguments in pieces, their whole, the item done
    added = kinds.index("response.output_item.added")
    pieces = [e.delta for e in events if e.type == "response.function_call_arguments.delta"]
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    assert events[added].item.type == "function_call" and events[added].item.arguments == ""
    assert added < kinds.index("response.function_call_arguments.delta") < kinds.index(
        "response.function_call_arguments.done") < kinds.index("response.output_item.done")
    assert len(pieces) > 1 and "".join(pieces) == done.arguments == call.arguments
    streamed = events[-1].response
    assert streamed.output[0].arguments == call.arguments
    assert streamed.output[0].call_id == events[added].item.call_id
    # the streamed response's call is continued as stored, by its call id
    after = await client.responses.create(
        model="m", previous_response_id=streamed.id, tools=[tool], max_output_tokens=30,
        temperature=0, input=[{"type": "function_call_output",
                               "call_id": streamed.output[0].call_id, "output": "sunny"}])
    assert after.output and after.usage.input_tokens_details.cached_tokens > 0
