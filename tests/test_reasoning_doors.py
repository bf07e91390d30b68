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
        assert off["__verbose"]["prompt"].endswith("<think>\n\n</think>\n\n")
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
