"""One chat turn in every door (dgr.doors.chat_turn): the endpoints that show a
chat's tokens show exactly those the chat door runs, with the thinking on, off and
budgeted; thinking switched off closes a thinking that the template's generation
prompt opens and reads no switch for (DeepSeek-R1's distills), as llama-server
closes it. The model is the tiny random one with real templates of thinking models
(from the pinned llama.cpp's models/templates); a grammar makes it write."""

from pathlib import Path

import pytest

from dgr import testmodel
from test_server import sse_events, start_server  # noqa: F401  (the fixture)

TEMPLATES = Path(__file__).resolve().parent.parent / "vendor" / "llama.cpp" / "models" \
    / "templates"
# opens the thinking in its generation prompt and reads no enable_thinking
R1_DISTILL = TEMPLATES / "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja"
PLAIN = 'root ::= [a-z]{3,8}'
OPENED = 'root ::= [a-z ]{4,12} "</think>" "\\n\\n" [a-z]{3,8}'
QUESTION = "What is the capital of France?"
# each way a request says how its thinking goes, in the chat door's fields and in
# Anthropic's
SWITCHES = {
    "on": ({}, {}),
    "off": ({"chat_template_kwargs": {"enable_thinking": False}},
            {"thinking": {"type": "disabled"}}),
    "budgeted": ({"thinking_budget_tokens": 6},
                 {"thinking": {"type": "enabled", "budget_tokens": 6}}),
}


@pytest.fixture(scope="module")
def qwen3_model(tmp_path_factory):
    template = (TEMPLATES / "Qwen-Qwen3-0.6B.jinja").read_text()
    return str(testmodel.write_test_model(tmp_path_factory.mktemp("qwen3") / "q.gguf",
                                          chat_template=template))


async def _shown_tokens(client, chat_fields: dict, anthropic_fields: dict) -> dict:
    """The prompt's tokens as each door shows or runs them."""
    messages = [{"role": "user", "content": QUESTION}]
    tokenized = (await client.post("/tokenize", json={
        "messages": messages, "with_pieces": True, "return_token_strs": True}
        | chat_fields)).json()
    assert len(tokenized["token_strs"]) == tokenized["count"] == len(tokenized["tokens"])
    rendered = (await client.post("/v1/chat/completions/render", json={
        "messages": messages} | chat_fields)).json()
    counted = (await client.post("/v1/messages/count_tokens", json={
        "messages": messages} | anthropic_fields)).json()
    ran = (await client.post("/v1/chat/completions", json={
        "messages": messages, "max_tokens": 2, "temperature": 0} | chat_fields)).json()
    return {"tokenize": [t["id"] for t in tokenized["tokens"]],
            "pieces": "".join(t["piece"] for t in tokenized["tokens"]
                              if isinstance(t["piece"], str)),
            "render": rendered["token_ids"], "count_tokens": counted["input_tokens"],
            "prompt_tokens": ran["usage"]["prompt_tokens"]}


@pytest.mark.parametrize("template", ["qwen3", "r1_distill"])
async def test_every_door_shows_the_tokens_the_chat_door_runs(start_server, qwen3_model,
                                                               template):  # noqa: F811
    server = await (start_server({"model_path": qwen3_model}) if template == "qwen3" else
                    start_server({"chat_template_file": str(R1_DISTILL)}))
    async with server.client() as client:
        shown = {name: await _shown_tokens(client, *fields)
                 for name, fields in SWITCHES.items()}
    for name, doors in shown.items():
        assert doors["tokenize"] == doors["render"], name
        assert len(doors["render"]) == doors["count_tokens"] == doors["prompt_tokens"], name
    # the switch reaches every door: off is another prompt, its thinking closed
    assert shown["off"]["render"] != shown["on"]["render"]
    assert shown["budgeted"]["render"] == shown["on"]["render"]
    assert shown["off"]["pieces"].rstrip().endswith("</think>")
    assert not shown["on"]["pieces"].rstrip().endswith("</think>")


async def test_thinking_off_closes_a_thinking_the_template_opens(start_server):  # noqa: F811
    """The template's generation prompt ends `<think>\\n` whatever the request says: off,
    the node closes it before the model writes, and the answer is all answer."""
    body = {"messages": [{"role": "user", "content": QUESTION}], "max_tokens": 12,
            "temperature": 0, "grammar": PLAIN, "verbose": True}
    server = await start_server({"chat_template_file": str(R1_DISTILL)})
    async with server.client() as client:
        on = (await client.post("/v1/chat/completions", json=body | {"grammar": OPENED})).json()
        assert on["__verbose"]["prompt"].endswith("<think>\n")
        assert on["choices"][0]["message"]["reasoning_content"]
        off = (await client.post("/v1/chat/completions", json=body | {
            "chat_template_kwargs": {"enable_thinking": False}})).json()
        assert off["__verbose"]["prompt"].endswith("<think>\n</think>")
        assert "reasoning_content" not in off["choices"][0]["message"]
        answer = off["choices"][0]["message"]["content"]
        assert answer and answer.isalpha()
        streamed = sse_events((await client.post("/v1/chat/completions", json=body | {
            "chat_template_kwargs": {"enable_thinking": False}, "stream": True})).text)
        deltas = [e["choices"][0]["delta"] for e in streamed if e["choices"]]
        assert not any(d.get("reasoning_content") for d in deltas)
        assert "".join(d.get("content") or "" for d in deltas) == answer
        anthropic = (await client.post("/v1/messages", json={
            "messages": body["messages"], "max_tokens": 12, "temperature": 0,
            "thinking": {"type": "disabled"}})).json()
        assert "thinking" not in [block["type"] for block in anthropic["content"]]
    budget_zero = await start_server({"chat_template_file": str(R1_DISTILL)},
                                     reasoning_budget=0)
    async with budget_zero.client() as client:
        got = (await client.post("/v1/chat/completions", json=body)).json()
        assert got["__verbose"]["prompt"] == off["__verbose"]["prompt"]
        assert got["choices"][0]["message"] == off["choices"][0]["message"]


async def test_a_chat_completion_names_its_build(start_server):  # noqa: F811
    """OpenAI's system_fingerprint, whole and on every streamed chunk, in llama-server's
    form."""
    server = await start_server()
    body = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3}
    async with server.client() as client:
        whole = (await client.post("/v1/chat/completions", json=body)).json()
        assert whole["system_fingerprint"].startswith("b")
        streamed = sse_events((await client.post("/v1/chat/completions", json=body | {
            "stream": True})).text)
        assert {e["system_fingerprint"] for e in streamed} == {whole["system_fingerprint"]}
        text = (await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 2}))
        assert text.json()["system_fingerprint"] == whole["system_fingerprint"]


async def test_a_budget_cut_ends_the_thinking_with_the_requests_message(
        start_server):  # noqa: F811
    """llama-server's reasoning_budget_message: the text the thinking ends with where the
    budget cuts it (the random model never closes its thinking itself)."""
    server = await start_server({"chat_template_file": str(R1_DISTILL)}, reasoning_budget=6)
    body = {"messages": [{"role": "user", "content": "Think briefly."}], "max_tokens": 24,
            "temperature": 0}
    async with server.client() as client:
        plain = (await client.post("/v1/chat/completions", json=body)).json()
        told = (await client.post("/v1/chat/completions", json=body | {
            "reasoning_budget_message": " Time to answer."})).json()
        refused = await client.post("/v1/chat/completions", json=body | {
            "reasoning_budget_message": 3})
    thought = told["choices"][0]["message"]["reasoning_content"]
    assert thought.rstrip().endswith("Time to answer.")
    assert thought.startswith(plain["choices"][0]["message"]["reasoning_content"].rstrip())
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "reasoning_budget_message"
