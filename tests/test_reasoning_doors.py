"""A thinking model's thinking apart from its answer in the chat door: whole and
streamed the same, switched off by chat_template_kwargs, left inside with
reasoning_format none, opened by the prompt itself (DeepSeek-R1's template), and
counted in usage. The model is the tiny random one with real templates of
thinking models (from the pinned llama.cpp's models/templates); a grammar makes it
write a thinking and an answer."""

from pathlib import Path

import pytest

from dgr import testmodel
from test_server import sse_events, start_server  # noqa: F401  (the fixture)

TEMPLATES = Path(__file__).resolve().parent.parent / "vendor" / "llama.cpp-patched" / "models" \
    / "templates"
THINKS = 'root ::= "<think>" [a-z ]{4,12} "</think>" "\\n\\n" [a-z]{3,8}'
OPENED = 'root ::= [a-z ]{4,12} "</think>" "\\n\\n" [a-z]{3,8}'
PLAIN = 'root ::= [a-z]{3,8}'


@pytest.fixture(scope="module")
def qwen3_model(tmp_path_factory):
    template = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
    return str(testmodel.write_test_model(tmp_path_factory.mktemp("qwen3") / "q.gguf",
                                          chat_template=template))


def chat(grammar, **extra):
    return {"messages": [{"role": "user", "content": "What is the capital of France?"}],
            "max_tokens": 40, "temperature": 0, "grammar": grammar} | extra


async def test_thinking_is_apart_whole_and_streamed(start_server, qwen3_model):  # noqa: F811
    server = await start_server({"model_path": qwen3_model})
    async with server.client() as client:
        whole = (await client.post("/v1/chat/completions", json=chat(THINKS))).json()
        message = whole["choices"][0]["message"]
        assert message["reasoning_content"] and message["content"]
        assert "<think>" not in message["content"] + message["reasoning_content"]
        assert whole["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0
        streamed = await client.post("/v1/chat/completions", json=chat(
            THINKS, stream=True, stream_options={"include_usage": True}))
        events = sse_events(streamed.text)
        deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
        assert "".join(d.get("reasoning_content") or "" for d in deltas) == \
            message["reasoning_content"]
        assert "".join(d.get("content") or "" for d in deltas) == message["content"]
        assert (events[-1]["usage"]["completion_tokens_details"]
                == whole["usage"]["completion_tokens_details"])
        # vLLM's include_reasoning false: split off and not returned; SGLang's
        # stream_reasoning false: one delta; separate_reasoning false: as format none
        hidden = (await client.post("/v1/chat/completions", json=chat(
            THINKS, include_reasoning=False))).json()["choices"][0]["message"]
        assert "reasoning_content" not in hidden and hidden["content"] == message["content"]
        held = sse_events((await client.post("/v1/chat/completions", json=chat(
            THINKS, stream=True, stream_reasoning=False))).text)
        thoughts = [e["choices"][0]["delta"]["reasoning_content"] for e in held
                    if e["choices"] and e["choices"][0]["delta"].get("reasoning_content")]
        assert thoughts == [message["reasoning_content"]]
        whole_text = (await client.post("/v1/chat/completions", json=chat(
            THINKS, separate_reasoning=False))).json()["choices"][0]["message"]
        assert whole_text["content"].startswith("<think>")
        # none: the thinking stays in the answer's text, as the model wrote it
        raw = (await client.post("/v1/chat/completions", json=chat(
            THINKS, reasoning_format="none"))).json()["choices"][0]["message"]
        assert "reasoning_content" not in raw and raw["content"].startswith("<think>")


async def test_thinking_switched_off(start_server, qwen3_model):  # noqa: F811
    server = await start_server({"model_path": qwen3_model})
    async with server.client() as client:
        got = (await client.post("/v1/chat/completions", json=chat(
            PLAIN, chat_template_kwargs={"enable_thinking": False}, verbose=True))).json()
        assert got["__verbose"]["prompt"].endswith("<think>\n\n</think>\n\n")
        assert "reasoning_content" not in got["choices"][0]["message"]
        for bad in ({"chat_template_kwargs": {"enable_thinking": "no"}},
                    {"chat_template_kwargs": {"tools_in_user": True}},
                    {"reasoning_format": "harmony"}):
            refused = await client.post("/v1/chat/completions", json=chat(PLAIN, **bad))
            assert refused.status_code == 400


async def test_a_prompt_that_opens_the_thinking(start_server, tmp_path):  # noqa: F811
    server = await start_server({"chat_template_file": str(
        TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")})
    async with server.client() as client:
        got = (await client.post("/v1/chat/completions", json=chat(OPENED, verbose=True))).json()
        assert got["__verbose"]["prompt"].endswith("<think>\n")
        message = got["choices"][0]["message"]
        assert message["reasoning_content"] and message["content"]
        off = (await client.post("/v1/chat/completions", json=chat(
            PLAIN, chat_template_kwargs={"enable_thinking": False}, verbose=True))).json()
        # as the template renders it with enable_thinking false
        assert off["__verbose"]["prompt"].endswith("<think>\n</think>")
        assert "reasoning_content" not in off["choices"][0]["message"]


async def test_models_that_do_not_think_are_left_alone(start_server):  # noqa: F811
    server = await start_server()
    async with server.client() as client:
        got = (await client.post("/v1/chat/completions", json=chat(THINKS))).json()
        assert got["choices"][0]["message"]["content"].startswith("<think>")
        assert "completion_tokens_details" not in got["usage"]
        split = (await client.post("/v1/chat/completions", json=chat(
            THINKS, reasoning_format="deepseek"))).json()
        assert split["choices"][0]["message"]["reasoning_content"]


async def test_a_thinking_budget_closes_the_thinking_and_the_answer_follows(
        start_server):  # noqa: F811
    """DeepSeek-R1's template opens the thinking in the prompt, and the random model
    never closes it: at the budget the node does, and the answer follows."""
    server = await start_server({"chat_template_file": str(
        TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")}, reasoning_budget=6)
    body = {"messages": [{"role": "user", "content": "Think briefly."}], "max_tokens": 24,
            "temperature": 0}
    async with server.client() as client:
        unbounded = (await client.post("/v1/chat/completions", json=body | {
            "thinking_budget_tokens": -1, "reasoning_budget_tokens": 1000})).json()
        assert "content" not in unbounded["choices"][0]["message"] or \
            not unbounded["choices"][0]["message"]["content"]
        whole = (await client.post("/v1/chat/completions", json=body)).json()
        message = whole["choices"][0]["message"]
        assert message["reasoning_content"] and message["content"]
        assert whole["usage"]["completion_tokens"] == 24
        assert whole["choices"][0]["finish_reason"] == "length"
        # the thinking is the unbounded answer's first tokens (and the closing's newline)
        assert unbounded["choices"][0]["message"]["reasoning_content"].startswith(
            message["reasoning_content"].rstrip("\n"))
        streamed = sse_events((await client.post("/v1/chat/completions", json=body | {
            "stream": True})).text)
        deltas = [e["choices"][0]["delta"] for e in streamed if e["choices"]]
        assert "".join(d.get("reasoning_content") or "" for d in deltas) == \
            message["reasoning_content"]
        assert "".join(d.get("content") or "" for d in deltas) == message["content"]
        # the same beside other sessions, and with the budget asked per request
        together = []

        async def ask(extra):
            got = await client.post("/v1/chat/completions", json=body | extra)
            together.append(got.json()["choices"][0]["message"])

        import trio
        async with trio.open_nursery() as nursery:
            for extra in ({}, {"thinking_budget_tokens": 6}, {"max_tokens": 30},
                          {"messages": [{"role": "user", "content": "Other."}]}):
                nursery.start_soon(ask, extra)
        assert sum(m == message for m in together) == 2


async def test_anthropic_thinking_blocks(start_server):  # noqa: F811
    import anthropic

    server = await start_server({"chat_template_file": str(
        TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")}, temperature=0.0)
    ask = {"model": "m", "max_tokens": 20,
           "messages": [{"role": "user", "content": "Think briefly."}]}
    async with anthropic.AsyncAnthropic(base_url=server.url, api_key="unused",
                                        max_retries=0) as client:
        reply = await client.messages.create(
            **ask, thinking={"type": "enabled", "budget_tokens": 5})
        assert [b.type for b in reply.content] == ["thinking", "text"]
        assert reply.usage.output_tokens == 20
        async with client.messages.stream(
                **ask, thinking={"type": "enabled", "budget_tokens": 5}) as stream:
            streamed = await stream.get_final_message()
        assert [b.model_dump() for b in streamed.content] == \
            [b.model_dump() for b in reply.content]
        off = await client.messages.create(**ask, thinking={"type": "disabled"})
        assert [b.type for b in off.content] == ["text"]
        # an earlier turn's thinking block is taken (rendered or dropped, as the template does)
        again = await client.messages.create(**ask | {"messages": [
            {"role": "user", "content": "Think briefly."},
            {"role": "assistant", "content": [b.model_dump() for b in reply.content]},
            {"role": "user", "content": "And now?"}]})
        assert again.content
        with pytest.raises(anthropic.BadRequestError):
            await client.messages.create(**ask, thinking={"type": "enabled"})


async def test_responses_reasoning_items(start_server):  # noqa: F811
    import openai

    server = await start_server({"chat_template_file": str(
        TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")}, reasoning_budget=5)
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused",
                                  max_retries=0) as client:
        ask = {"model": "m", "input": "Think briefly.", "max_output_tokens": 20,
               "temperature": 0, "store": False}
        whole = await client.responses.create(**ask)
        assert [item.type for item in whole.output] == ["reasoning", "message"]
        assert whole.output[0].content[0].text and whole.output_text
        assert whole.usage.output_tokens_details.reasoning_tokens > 0
        async with client.responses.stream(**ask) as stream:
            events = [event async for event in stream]
        kinds = [event.type for event in events]
        assert kinds[-1] == "response.incomplete"  # max_output_tokens, as in the whole one
        streamed = events[-1].response
        assert "response.reasoning_text.delta" in kinds
        assert [i.model_dump() for i in streamed.output][0]["content"] == \
            [i.model_dump() for i in whole.output][0]["content"]
        assert streamed.output_text == whole.output_text
        indexes = [kinds.index("response.reasoning_text.delta"),
                   kinds.index("response.output_text.delta")]
        assert indexes == sorted(indexes)


async def test_tool_calls_follow_the_thinking(start_server):  # noqa: F811
    """The tools' grammar applies to the answer: the model thinks (here to its budget),
    then calls the tool."""
    from test_server import WEATHER_TOOL

    server = await start_server({"chat_template_file": str(
        TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja")}, reasoning_budget=4)
    body = {"messages": [{"role": "user", "content": "Weather in Paris?"}], "max_tokens": 400,
            "temperature": 0, "tools": [WEATHER_TOOL], "tool_choice": "required",
            "parallel_tool_calls": False}
    async with server.client() as client:
        whole = (await client.post("/v1/chat/completions", json=body)).json()
        message = whole["choices"][0]["message"]
        assert message["reasoning_content"]
        assert message["tool_calls"][0]["function"]["name"] == "get_weather"
        assert whole["choices"][0]["finish_reason"] == "tool_calls"
        events = sse_events((await client.post("/v1/chat/completions", json=body | {
            "stream": True})).text)
        deltas = [e["choices"][0]["delta"] for e in events if e["choices"]]
        assert "".join(d.get("reasoning_content") or "" for d in deltas) == \
            message["reasoning_content"]
        assert any(d.get("tool_calls") for d in deltas)


async def test_earlier_turns_thinking_reaches_the_template(start_server):  # noqa: F811
    """Qwen3's template renders the thinking of the turns after the last user query
    (a tool loop) and drops the others'."""
    server = await start_server({"chat_template_file": str(TEMPLATES / "Qwen-Qwen3-0.6B.jinja")})
    call = {"id": "c1", "type": "function", "function": {"name": "ls", "arguments": "{}"}}
    messages = [{"role": "user", "content": "Fix it"},
                {"role": "assistant", "content": "", "reasoning_content": "Look first.",
                 "tool_calls": [call]},
                {"role": "tool", "tool_call_id": "c1", "content": "main.py"}]
    async with server.client() as client:
        prompt = (await client.post("/apply-template", json={"messages": messages})).json()[
            "prompt"]
        assert "<think>\nLook first.\n</think>" in prompt
        bad = await client.post("/apply-template", json={"messages": [
            {"role": "user", "content": "hi", "reasoning_content": "no"}]})
        assert bad.status_code == 400


HARMONY = ('root ::= "<|channel|>analysis<|message|>" [a-z ]{4,12} "<|end|><|start|>assistant'
           '<|channel|>final<|message|>" [a-z]{3,8}')
LONG = {"max_tokens": 160}  # the tiny vocabulary spells the harmony markup a character a token


async def test_harmony_channels_split_in_every_door(start_server):  # noqa: F811
    """gpt-oss's template (the pin's), on the tiny model: a grammar makes it write an
    analysis message and a final one (as text here: the tiny vocabulary has no harmony
    control tokens); each door returns them apart, whole and streamed alike, and
    reasoning_effort reaches the template."""
    import openai

    server = await start_server({"chat_template_file": str(
        TEMPLATES / "openai-gpt-oss-120b.jinja")})
    async with server.client() as client:
        whole = (await client.post("/v1/chat/completions", json=chat(
            HARMONY, reasoning_effort="low", verbose=True, **LONG))).json()
        assert "Reasoning: low" in whole["__verbose"]["prompt"]
        message = whole["choices"][0]["message"]
        assert message["reasoning_content"] and message["content"]
        assert "<|" not in message["reasoning_content"] + message["content"]
        assert whole["usage"]["completion_tokens_details"]["reasoning_tokens"] > 0
        streamed = sse_events((await client.post("/v1/chat/completions", json=chat(
            HARMONY, reasoning_effort="low", stream=True, **LONG))).text)
        deltas = [e["choices"][0]["delta"] for e in streamed if e["choices"]]
        assert "".join(d.get("reasoning_content") or "" for d in deltas) == \
            message["reasoning_content"]
        assert "".join(d.get("content") or "" for d in deltas) == message["content"]
        high = (await client.post("/v1/chat/completions", json=chat(
            HARMONY, chat_template_kwargs={"reasoning_effort": "high"}, verbose=True))).json()
        assert "Reasoning: high" in high["__verbose"]["prompt"]
        for bad in ({"reasoning_effort": "extreme"}, {"reasoning_effort": 3}):
            refused = await client.post("/v1/chat/completions", json=chat(HARMONY, **bad))
            assert refused.status_code == 400
        # an earlier turn's thinking reaches the template's analysis message
        again = (await client.post("/v1/chat/completions", json=chat(
            HARMONY, verbose=True, **LONG) | {
            "messages": [{"role": "user", "content": "hi"},
                         {"role": "assistant", "content": "yes", "reasoning_content": "hmm"},
                         {"role": "user", "content": "and?"}]})).json()
        assert again["choices"][0]["message"]["content"]
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused",
                                  max_retries=0) as client:
        # Responses' reasoning.effort (the random model writes no channels: all answer)
        got = await client.responses.create(model="m", input="hi", max_output_tokens=8,
                                            temperature=0, reasoning={"effort": "low"})
        assert [item.type for item in got.output] == ["message"]
        with pytest.raises(openai.BadRequestError):
            await client.responses.create(model="m", input="hi", max_output_tokens=4,
                                          reasoning={"effort": "low", "summary": "auto"})


async def test_special_tokens_text_on_request(start_server):  # noqa: F811
    """vLLM's skip_special_tokens: false writes control tokens' text into the output."""
    server = await start_server()
    body = {"prompt": "Hello", "max_tokens": 2, "temperature": 0, "logit_bias": {"3": 100}}
    async with server.client() as client:
        plain = (await client.post("/v1/completions", json=body)).json()
        special = (await client.post("/v1/completions", json=body | {
            "skip_special_tokens": False})).json()
        assert plain["choices"][0]["text"] == ""
        assert special["choices"][0]["text"] == "<|im_start|><|im_start|>"
        bad = await client.post("/v1/completions", json=body | {"skip_special_tokens": "no"})
        assert bad.status_code == 400
