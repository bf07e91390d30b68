"""The HTTP server in-process on a free loopback port, with a real HTTP client."""

import json

import httpx
import pytest
import trio

import dgr
from dgr.config import ServerConfig
from dgr.reasoning import ThinkingSwitch
from dgr.server import serve


# the server tests' node: the shared small node, fewer slots and longer chunks
SERVER_NODE = dict(max_running=4, max_waiting=8, prefill_chunk=32)


class Server:
    def __init__(self, url, shutdown, cancel_scope, urls=()):
        self.url = url
        self.urls = list(urls) or [url]  # every address it listens on
        self.shutdown = shutdown
        self.cancel_scope = cancel_scope

    def client(self, **kw):
        return httpx.AsyncClient(base_url=self.url, timeout=30, **kw)


@pytest.fixture
async def start_server(nursery, node_config):
    async def start(node_overrides=None, **server_kw):
        shutdown = trio.Event()
        scope = trio.CancelScope()

        async def run(task_status=trio.TASK_STATUS_IGNORED):
            with scope:
                await serve(node_config(**(SERVER_NODE | (node_overrides or {}))),
                            ServerConfig(port=0, **server_kw), task_status=task_status,
                            shutdown=shutdown)

        urls = await nursery.start(run)
        return Server(urls[0], shutdown, scope, urls)

    return start


def sse_events(text):
    events = [line[len("data: "):] for line in text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [json.loads(e) for e in events[:-1]]


async def test_completion_stream_equals_non_stream(start_server):
    server = await start_server()
    body = {"prompt": "Hello from HTTP", "max_tokens": 16, "temperature": 0}
    async with server.client() as client:
        full = (await client.post("/v1/completions", json=body)).json()
        assert full["object"] == "text_completion"
        assert full["choices"][0]["finish_reason"] == "length"
        assert full["usage"]["completion_tokens"] == 16
        streamed = await client.post("/v1/completions", json=body | {"stream": True,
                                     "stream_options": {"include_usage": True}})
        assert streamed.headers["content-type"].startswith("text/event-stream")
        events = sse_events(streamed.text)
        text = "".join(e["choices"][0]["text"] for e in events if e["choices"])
        assert text == full["choices"][0]["text"]
        assert events[-2]["choices"][0]["finish_reason"] == "length"
        assert events[-1]["usage"]["completion_tokens"] == 16


async def test_prompt_lists_and_n_give_one_choice_each(start_server):
    """OpenAI semantics: a list of prompts gives a choice per prompt, n a choice per
    sample; streamed events name their choice; usage counts each prompt once."""
    server = await start_server()
    prompts = ["First prompt of the batch", [1, 40, 41, 42, 43]]
    async with server.client() as client:
        full = (await client.post("/v1/completions", json={
            "prompt": prompts, "n": 2, "max_tokens": 6, "temperature": 0,
            "ignore_eos": True, "logprobs": 1})).json()
        choices = full["choices"]
        assert [c["index"] for c in choices] == [0, 1, 2, 3]
        assert all(c["finish_reason"] == "length" for c in choices)
        assert choices[0]["text"] == choices[1]["text"] and choices[2]["text"] == choices[3]["text"]
        alone = [(await client.post("/v1/completions", json={
            "prompt": p, "max_tokens": 6, "temperature": 0, "ignore_eos": True})).json()
            for p in prompts]
        assert [c["text"] for c in choices[::2]] == [a["choices"][0]["text"] for a in alone]
        assert full["usage"]["prompt_tokens"] == sum(a["usage"]["prompt_tokens"] for a in alone)
        assert full["usage"]["completion_tokens"] == 4 * 6
        streamed = await client.post("/v1/completions", json={
            "prompt": prompts, "n": 2, "max_tokens": 6, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}})
        events = sse_events(streamed.text)
        for c in choices:
            text = "".join(e["choices"][0]["text"] for e in events
                           if e["choices"] and e["choices"][0]["index"] == c["index"])
            assert text == c["text"]
        usage = events[-1]["usage"]
        assert {k: usage[k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")} == {
            k: full["usage"][k] for k in ("prompt_tokens", "completion_tokens", "total_tokens")}
        # the same prompts again: all but each prompt's last token come from the cache
        assert usage["prompt_tokens_details"]["cached_tokens"] == usage["prompt_tokens"] - len(prompts)
        chat_body = {"messages": [{"role": "user", "content": "hi"}], "n": 3, "max_tokens": 4,
                     "temperature": 0.8, "seed": 7}
        chat = (await client.post("/v1/chat/completions", json=chat_body)).json()
        assert [c["index"] for c in chat["choices"]] == [0, 1, 2]
        assert chat["usage"]["completion_tokens"] <= 12
        # each sample has its own seed (seed + index): the request repeats exactly
        again = (await client.post("/v1/chat/completions", json=chat_body)).json()
        assert [c["message"] for c in again["choices"]] == [c["message"] for c in chat["choices"]]


async def test_chat_models_metrics_capabilities_health(start_server):
    server = await start_server()
    async with server.client() as client:
        chat = await client.post("/v1/chat/completions", json={
            "messages": [{"role": "system", "content": "be brief"},
                         {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
            "max_tokens": 8, "temperature": 0, "logprobs": True, "top_logprobs": 2,
            "user": "a hint", "metadata": {"ignored": "yes"}})
        assert chat.status_code == 200, chat.text
        choice = chat.json()["choices"][0]
        assert choice["message"]["role"] == "assistant"
        assert len(choice["logprobs"]["content"]) == chat.json()["usage"]["completion_tokens"]
        assert len(choice["logprobs"]["content"][0]["top_logprobs"]) == 2
        stream = await client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8, "temperature": 0,
            "stream": True})
        events = sse_events(stream.text)
        # the role first, without content, as OpenAI and llama-server stream it
        assert events[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
        assert "".join(e["choices"][0]["delta"].get("content") or "" for e in events) == \
            (await client.post("/v1/chat/completions", json={
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 8,
                "temperature": 0})).json()["choices"][0]["message"]["content"]

        models = (await client.get("/v1/models")).json()
        assert models["data"][0]["id"] == "dgr-tiny-test"
        def generated(text):
            (line,) = [x for x in text.splitlines() if x.startswith("dgr_generated_tokens_total")]
            return float(line.split()[-1])

        before = generated((await client.get("/metrics")).text)
        done = (await client.post("/v1/completions", json={
            "prompt": "move the metrics", "max_tokens": 5, "ignore_eos": True})).json()
        after = generated((await client.get("/metrics")).text)
        assert after - before == done["usage"]["completion_tokens"] == 5
        caps = (await client.get("/capabilities")).json()
        assert caps["budgets"]["queue"]["max_running"] == 4
        # every bound, the server's response store too, in use and in all
        assert caps["bounds"]["response_store_entries"]["used"] == 0
        assert all(set(bound) >= {"used", "capacity"} for bound in caps["bounds"].values())
        # the tiny model's weights are F32: types the invariance covers
        assert caps["invariance"]["covered"] and set(caps["invariance"]["weight_types"]) == {"F32"}
        assert (await client.get("/health")).json() == {"status": "ok"}


@pytest.mark.parametrize("body,status", [
    (b"{not json", 400),
    (b"[1, 2]", 400),
    (json.dumps({"prompt": 12}).encode(), 400),
    (json.dumps({"prompt": "x", "max_tokens": "ten"}).encode(), 400),
    (json.dumps({"prompt": "x", "max_tokens": -1}).encode(), 400),
    (json.dumps({"prompt": "x", "temperature": 5}).encode(), 400),
    (json.dumps({"prompt": "x", "top_p": 0}).encode(), 400),
    (json.dumps({"prompt": "x", "logprobs": 100}).encode(), 400),
    (json.dumps({"prompt": "x", "stop": [1]}).encode(), 400),
    (json.dumps({"prompt": "x", "n": 33}).encode(), 400),  # more choices than a request may have
    (json.dumps({"prompt": ["x"] * 8, "n": 5}).encode(), 400),
    (json.dumps({"prompt": ["x", ""]}).encode(), 400),
    (json.dumps({"prompt": [[1, 2], [1, 99999]]}).encode(), 400),
    (json.dumps({"prompt": "x", "stream": "yes"}).encode(), 400),
    (json.dumps({"prompt": [1, 99999]}).encode(), 400),
    (json.dumps({"prompt": "x" * 5000, "max_tokens": 1}).encode(), 400),  # can never fit
    (b"[" * 100_000 + b"]" * 100_000, 400),
    (json.dumps({"prompt": "x" * 2_000_000}).encode(), 413),
])
async def test_bad_input_gets_a_4xx_with_an_openai_error(start_server, body, status):
    server = await start_server()
    async with server.client() as client:
        response = await client.post("/v1/completions", content=body,
                                     headers={"content-type": "application/json"})
        assert response.status_code == status, response.text
        error = response.json()["error"]
        assert error["message"] and error["type"]
        assert (await client.post("/v1/completions", json={"prompt": "ok", "max_tokens": 2})).status_code == 200


async def test_queue_full_gets_429_with_retry_after(start_server):
    server = await start_server({"max_running": 1, "max_waiting": 1})
    statuses = []
    async with server.client() as client:

        async def one():
            response = await client.post("/v1/completions", json={
                "prompt": "overload", "max_tokens": 64, "temperature": 0, "ignore_eos": True})
            statuses.append(response.status_code)
            if response.status_code == 429:
                assert int(response.headers["retry-after"]) >= 1
                assert response.json()["error"]["code"] == "queue_full"

        async with trio.open_nursery() as nursery:
            for _ in range(6):
                nursery.start_soon(one)
        metrics = (await client.get("/metrics")).text
    assert statuses.count(200) >= 2 and statuses.count(429) >= 1
    assert set(statuses) <= {200, 429}
    assert 'dgr_admissions_rejected_total{reason="queue_full"}' in metrics


async def test_disconnect_mid_stream_releases_the_session(start_server):
    server = await start_server()
    async with server.client() as client:
        async with client.stream("POST", "/v1/completions", json={
                "prompt": "disconnect me", "max_tokens": 900, "temperature": 0,
                "ignore_eos": True, "stream": True}) as response:
            assert response.status_code == 200
            seen = 0
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    seen += 1
                if seen == 5:
                    break
        with trio.fail_after(10):
            while True:
                caps = (await client.get("/capabilities")).json()
                if caps["load"]["active"] == 0:
                    break
                await trio.sleep(0.01)
        metrics = (await client.get("/metrics")).text
        assert 'dgr_sessions_finished_total{reason="cancelled"} 1.0' in metrics


async def test_api_key(start_server):
    server = await start_server(api_key="s3cret")
    async with server.client() as client:
        assert (await client.get("/health")).status_code == 200
        denied = await client.get("/v1/models")
        assert denied.status_code == 401 and denied.json()["error"]["code"] == "invalid_api_key"
        wrong = await client.get("/v1/models", headers={"Authorization": "Bearer nope"})
        assert wrong.status_code == 401
        ok = await client.get("/v1/models", headers={"Authorization": "Bearer s3cret"})
        assert ok.status_code == 200


async def test_graceful_shutdown_lets_a_request_in_flight_finish(start_server):
    """Draining (with --drain-quiet 0: no wait for routers to look away) refuses new
    requests (503) and lets a running one finish. The running one is streamed and read
    only after the checks; it asks for 3,000 tokens, a step each, so it is still in
    flight then (its events fit the socket's buffers, which hold nothing back: with 300
    tokens the late request often found no listener, the session and so the server
    having ended)."""
    server = await start_server(grace_s=30, drain_quiet_s=0)
    body = {"prompt": "finish me", "max_tokens": 3000, "temperature": 0, "ignore_eos": True,
            "stream": True, "stream_options": {"include_usage": True}}
    async with server.client() as client:
        async with client.stream("POST", "/v1/completions", json=body) as in_flight:
            assert in_flight.status_code == 200
            server.shutdown.set()
            await trio.sleep(0.05)
            late = await client.post("/v1/completions", json={"prompt": "late", "max_tokens": 2})
            assert late.status_code == 503
            assert (await client.get("/health")).status_code == 503
            text = "".join([line + "\n" async for line in in_flight.aiter_lines()])
    events = sse_events(text)
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert events[-1]["usage"]["completion_tokens"] == 3000


async def test_every_field_is_honoured_or_refused(start_server):
    """A field the server does not implement is a 400 naming it (OpenAI's hints
    excepted); the sampling fields change what they should."""
    server = await start_server()
    base = {"prompt": "Penalties and biases", "max_tokens": 12, "temperature": 0,
            "ignore_eos": True, "logprobs": 1}
    async with server.client() as client:
        reference = (await client.post("/v1/completions", json=base)).json()
        for field, value in [("tools", []), ("functions", []), ("audio", {}),
                             ("suffix", "x"), ("best_of", 2), ("mirostat", 2)]:
            response = await client.post("/v1/completions", json=base | {field: value})
            assert response.status_code == 400, field
            assert response.json()["error"]["param"] == field
        for value in ("fast", ["auto"], 1):
            refused = await client.post("/v1/completions", json=base | {"speculation": value})
            assert refused.status_code == 400 and refused.json()["error"]["param"] == "speculation"
        for value in ("off", "auto", "always"):  # the same output either way
            spec = await client.post("/v1/completions", json=base | {"speculation": value})
            assert spec.status_code == 200
            assert spec.json()["choices"][0]["logprobs"] == reference["choices"][0]["logprobs"]
        hinted = await client.post("/v1/completions", json=base | {
            "user": "u1", "store": False, "cache_prompt": True, "id_slot": 0})  # llama-server's
        assert hinted.json()["choices"][0]["logprobs"] == reference["choices"][0]["logprobs"]
        assert hinted.status_code == 200
        sampled = await client.post("/v1/completions", json=base | {
            "logit_bias": {"5": -100, "6": 3.5}, "presence_penalty": 0.5,
            "frequency_penalty": -0.5, "repetition_penalty": 1.2, "repeat_last_n": 16})
        assert sampled.status_code == 200
        for bad in [{"logit_bias": {"x": 1}}, {"logit_bias": {"5": 101}},
                    {"logit_bias": {"99999999": 5}}, {"presence_penalty": 3},
                    {"repeat_penalty": 0}, {"repeat_penalty": 1.1, "repetition_penalty": 1.1},
                    {"repeat_last_n": -1}]:
            response = await client.post("/v1/completions", json=base | bad)
            assert response.status_code == 400, bad
        chat = await client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "top_logprobs": 2})
        assert chat.status_code == 400 and chat.json()["error"]["param"] == "top_logprobs"


async def test_openai_shapes_404_405_and_chat_logprobs(start_server, tiny_model):
    server = await start_server()
    async with server.client() as client:
        for method, path, status in [("GET", "/v1/nothing", 404), ("GET", "/v1/completions", 405)]:
            response = await client.request(method, path)
            assert response.status_code == status
            assert response.json()["error"]["type"] == "invalid_request_error"
        base = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 6, "temperature": 0,
                "logprobs": True}
        plain = (await client.post("/v1/chat/completions", json=base)).json()
        content = plain["choices"][0]["logprobs"]["content"]
        assert content and all(entry["top_logprobs"] == [] for entry in content)  # none asked for
        two = (await client.post("/v1/chat/completions", json=base | {"top_logprobs": 2})).json()
        assert all(len(e["top_logprobs"]) == 2 for e in two["choices"][0]["logprobs"]["content"])
        # bytes are each token's own bytes: they join to the text
        joined = bytes(b for e in content for b in e["bytes"])
        assert joined.decode("utf-8", "replace") == plain["choices"][0]["message"]["content"]


def test_a_byte_fallback_token_reports_its_own_byte(tiny_model):
    """A token that is one byte of a multi-byte character reports that byte, not
    the replacement character's three."""
    from dgr import _engine

    engine = _engine.Engine(tiny_model, n_ctx=256, n_seq_max=1)
    try:
        ids = engine.tokenize("é", add_special=False)
        pieces = [bytes(engine.token_to_piece(t, special=True)) for t in ids]
        assert b"".join(pieces) == "é".encode()
    finally:
        engine.close()


async def test_grammar_and_response_format_constrain_the_output(start_server):
    """A GBNF grammar or an OpenAI response_format: the output follows it (and ends
    where it does); a grammar llama.cpp cannot parse or a schema the converter
    cannot handle is a 400 saying why."""
    import jsonschema

    server = await start_server()
    base = {"prompt": "Answer:", "max_tokens": 64, "temperature": 0}
    async with server.client() as client:
        yes_no = (await client.post("/v1/completions", json=base | {
            "grammar": 'root ::= "yes" | "no"'})).json()["choices"][0]
        assert yes_no["text"] in ("yes", "no") and yes_no["finish_reason"] == "stop"
        schema = {"type": "object", "properties": {
            "ok": {"type": "boolean"}, "color": {"enum": ["red", "green", "blue"]},
            "tags": {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}},
            "required": ["ok", "color", "tags"]}
        for seed in range(3):
            body = base | {"temperature": 1.0, "seed": seed, "response_format": {
                "type": "json_schema", "json_schema": {"name": "t", "schema": schema, "strict": True}}}
            choice = (await client.post("/v1/completions", json=body)).json()["choices"][0]
            assert choice["finish_reason"] == "stop"
            jsonschema.validate(json.loads(choice["text"]), schema)
        chat = (await client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "a JSON object please"}],
            "max_tokens": 64, "temperature": 0, "response_format": {"type": "json_schema",
            "json_schema": {"name": "t", "schema": {"type": "object", "properties": {
                "ok": {"type": "boolean"}}, "required": ["ok"]}}}})).json()
        assert isinstance(json.loads(chat["choices"][0]["message"]["content"])["ok"], bool)
        bad = await client.post("/v1/completions", json=base | {"grammar": "root ::= ("})
        assert bad.status_code == 400 and "grammar" in bad.json()["error"]["message"]
        unsupported = await client.post("/v1/completions", json=base | {"response_format": {
            "type": "json_schema", "json_schema": {"schema": {"type": "frobnicate"}}}})
        assert unsupported.status_code == 400
        assert "frobnicate" in unsupported.json()["error"]["message"]
        both = await client.post("/v1/completions", json=base | {
            "grammar": 'root ::= "x"', "response_format": {"type": "json_object"}})
        assert both.status_code == 400


def _choice_text(body, chat):
    return [c["message"]["content"] if chat else c["text"] for c in body["choices"]]


async def test_each_parameter_changes_what_it_should_and_nothing_else(start_server, tiny_model, node_config):
    """Both endpoints, one parameter at a time against the same greedy request
    without it: what it should change changes, the rest (prompt tokens, shape,
    other choices) does not. Token ids come from a node of the same config."""
    server = await start_server()
    words = "Matrix of parameters"
    endpoints = {
        False: ("/v1/completions", {"prompt": words}),
        True: ("/v1/chat/completions", {"messages": [{"role": "user", "content": words}]}),
    }
    async with dgr.open_node(node_config(**SERVER_NODE)) as node, server.client() as client:
        for chat, (path, prompt) in endpoints.items():
            base_body = prompt | {"max_tokens": 10, "temperature": 0, "ignore_eos": True}
            prompt_ids = (node.tokenize(node.chat_prompt(prompt["messages"], None, True, False,
                                                         ThinkingSwitch()),
                                        parse_special=True) if chat else words)
            ref = (await node.generate(prompt_ids, dgr.SamplingParams(
                max_tokens=10, ignore_eos=True))).token_ids
            base = (await client.post(path, json=base_body)).json()
            [base_text] = _choice_text(base, chat)
            assert base["usage"]["completion_tokens"] == 10

            async def run(**fields):
                response = await client.post(path, json=base_body | fields)
                assert response.status_code == 200, (fields, response.text)
                body = response.json()
                assert body["usage"]["prompt_tokens"] == base["usage"]["prompt_tokens"]
                assert body["object"] == base["object"] and body["model"] == base["model"]
                return body, _choice_text(body, chat), [c["finish_reason"] for c in body["choices"]]

            body, [text], [finish] = await run(max_tokens=3)
            assert body["usage"]["completion_tokens"] == 3 and base_text.startswith(text)
            assert finish == "length"
            if chat:
                body, [text], _ = await run(max_completion_tokens=4)
                assert body["usage"]["completion_tokens"] == 4 and base_text.startswith(text)
            piece = base_text[3:7]
            assert piece
            _, [text], [finish] = await run(stop=[piece])
            assert text == base_text[:base_text.index(piece)] and finish == "stop"
            cut = ref.index(ref[4])
            body, [text], [finish] = await run(stop_token_ids=[ref[4]])
            assert body["usage"]["completion_tokens"] == cut and finish == "stop"
            assert base_text.startswith(text)
            body, _, _ = await run(stop_token_ids=[ref[0]], min_tokens=2)
            assert body["usage"]["completion_tokens"] >= 2
            _, [text], _ = await run(logit_bias={str(ref[0]): -100})
            assert text != base_text
            # penalties act on tokens generated before: they change the output at its
            # first repeated token, and nothing where no token repeats
            ref24 = (await node.generate(prompt_ids, dgr.SamplingParams(
                max_tokens=24, ignore_eos=True))).token_ids
            _, [base24], _ = await run(max_tokens=24)
            for penalty in ({"presence_penalty": 2.0}, {"frequency_penalty": 2.0},
                            {"repeat_penalty": 3.0}):
                _, [text], _ = await run(max_tokens=24, **penalty)
                assert (text != base24) == (len(set(ref24)) < 24), penalty
            _, [text], _ = await run(temperature=1.0, top_k=1, seed=3)  # top_k 1 is greedy
            assert text == base_text
            _, seeded, _ = await run(temperature=1.5, seed=11)
            _, again, _ = await run(temperature=1.5, seed=11)
            assert seeded == again
            body, texts, _ = await run(n=2)
            assert texts == [base_text, base_text]
            assert [c["index"] for c in body["choices"]] == [0, 1]
            _, [text], _ = await run(user="someone")
            assert text == base_text
            body, [text], _ = await run(**({"logprobs": True, "top_logprobs": 2} if chat
                                            else {"logprobs": 2}))
            assert text == base_text
            logprobs = body["choices"][0]["logprobs"]
            assert len(logprobs["content"] if chat else logprobs["tokens"]) == 10
            streamed = await client.post(path, json=base_body | {"stream": True})
            events = sse_events(streamed.text)
            assert "".join((e["choices"][0]["delta"].get("content") or "") if chat
                           else e["choices"][0]["text"] for e in events) == base_text
            if not chat:
                _, [text], _ = await run(echo=True)
                assert text == words + base_text
                events = sse_events((await client.post(path, json=base_body | {
                    "echo": True, "stream": True})).text)
                assert "".join(e["choices"][0]["text"] for e in events) == words + base_text
                scored, [text], _ = await run(echo=True, logprobs=1)
                assert text == words + base_text
                logprobs = scored["choices"][0]["logprobs"]
                n_prompt = scored["usage"]["prompt_tokens"]
                assert len(logprobs["tokens"]) == n_prompt + 10
                assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
                assert all(lp <= 0 for lp in logprobs["token_logprobs"][1:])


async def test_a_non_streamed_request_whose_client_left_is_logged_cancelled(start_server, caplog):
    server = await start_server()
    caplog.set_level("INFO", logger="dgr.server")
    async with server.client() as client, trio.open_nursery() as nursery:
        leave = trio.CancelScope()

        async def request():
            with leave:
                await client.post("/v1/completions", json={
                    "prompt": "leave early", "max_tokens": 3000, "temperature": 0,
                    "ignore_eos": True})

        nursery.start_soon(request)
        with trio.fail_after(10):
            while (await client.get("/capabilities")).json()["load"]["active"] == 0:
                await trio.sleep(0.005)
        leave.cancel()
        with trio.fail_after(10):
            while "POST /v1/completions" not in caplog.text:
                await trio.sleep(0.01)
            # the session's end reaches telemetry once the batch loop has let its slot go
            while (await client.get("/capabilities")).json()["load"]["active"]:
                await trio.sleep(0.01)
        metrics = (await client.get("/metrics")).text
    line = next(r.getMessage() for r in caplog.records if "POST /v1/completions" in r.getMessage())
    assert " 499 " in line, line
    assert 'dgr_sessions_finished_total{reason="cancelled"} 1.0' in metrics


async def test_tokenize_and_detokenize_in_llama_servers_shape(start_server):
    server = await start_server()
    async with server.client() as client:
        plain = (await client.post("/tokenize", json={"content": "Hello é"})).json()
        assert plain["tokens"] and all(isinstance(t, int) for t in plain["tokens"])
        special = (await client.post("/tokenize", json={"content": "Hello é",
                                                        "add_special": True})).json()
        assert len(special["tokens"]) == len(plain["tokens"]) + 1  # the BOS
        pieces = (await client.post("/tokenize", json={"content": "Hello é",
                                                       "with_pieces": True})).json()["tokens"]
        assert [p["id"] for p in pieces] == plain["tokens"]
        # a byte-fallback piece is its bytes; the rest are their text
        assert b"".join(bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode()
                        for p in pieces) == "Hello é".encode()
        text = (await client.post("/detokenize", json={"tokens": plain["tokens"]})).json()
        assert text["content"] == "Hello é"
        for path, body, param in [("/tokenize", {"content": 5}, "content"),
                                  ("/tokenize", {"content": "x", "nope": 1}, "nope"),
                                  ("/detokenize", {"tokens": ["a"]}, "tokens"),
                                  ("/detokenize", {"tokens": [10 ** 9]}, None)]:
            refused = await client.post(path, json=body)
            assert refused.status_code == 400, body
            assert refused.json()["error"]["param"] == param


async def test_an_unknown_message_role_is_refused_and_developer_is_system(start_server):
    server = await start_server()
    async with server.client() as client:
        refused = await client.post("/v1/chat/completions", json={
            "messages": [{"role": "wizard", "content": "hi"}], "max_tokens": 2})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "messages"
        assert "wizard" in refused.json()["error"]["message"]
        body = {"max_tokens": 4, "temperature": 0}
        as_developer = (await client.post("/v1/chat/completions", json=body | {"messages": [
            {"role": "developer", "content": "be brief"}, {"role": "user", "content": "hi"}]})).json()
        as_system = (await client.post("/v1/chat/completions", json=body | {"messages": [
            {"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]})).json()
        assert as_developer["choices"][0]["message"] == as_system["choices"][0]["message"]
        assert as_developer["usage"]["prompt_tokens"] == as_system["usage"]["prompt_tokens"]


async def test_usage_reports_the_prompt_tokens_reused_from_the_prefix_cache(start_server):
    """cached_tokens: the prompt tokens whose KV was reused, not computed, in every
    endpoint's usage, streamed or not."""
    server = await start_server()
    system = "You are a careful assistant who answers in one short sentence. " * 4
    async with server.client() as client:
        first = (await client.post("/v1/completions", json={
            "prompt": system + "First question?", "max_tokens": 3, "temperature": 0})).json()
        assert first["usage"]["prompt_tokens_details"] == {"cached_tokens": 0}
        again = (await client.post("/v1/completions", json={
            "prompt": system + "Second question?", "max_tokens": 3, "temperature": 0})).json()
        cached = again["usage"]["prompt_tokens_details"]["cached_tokens"]
        assert 0 < cached < again["usage"]["prompt_tokens"]
        async with client.stream("POST", "/v1/completions", json={
                "prompt": system + "Third question?", "max_tokens": 3, "temperature": 0,
                "stream": True, "stream_options": {"include_usage": True}}) as streamed:
            text = "".join([line + "\n" async for line in streamed.aiter_lines()])
        usage = sse_events(text)[-1]["usage"]
        assert usage["prompt_tokens_details"]["cached_tokens"] == cached
        chat = {"messages": [{"role": "system", "content": system},
                             {"role": "user", "content": "hi"}], "max_tokens": 3,
                "temperature": 0}
        await client.post("/v1/chat/completions", json=chat)
        repeat = (await client.post("/v1/chat/completions", json=chat)).json()
        details = repeat["usage"]["prompt_tokens_details"]
        assert details["cached_tokens"] == repeat["usage"]["prompt_tokens"] - 1  # all but the last


async def test_echo_with_logprobs_scores_the_prompt(start_server):
    """How evaluation tools score a continuation: echo + logprobs (+ max_tokens 0).
    Each prompt token's log-probability is computed, never taken from the cache
    (tests/test_node.py checks they are bitwise those of decoding the same tokens)."""
    server = await start_server()
    async with server.client() as client:
        body = {"prompt": "The quick brown fox jumps over the lazy dog", "echo": True,
                "logprobs": 2, "max_tokens": 0, "temperature": 0}
        first = None
        for _ in range(2):  # the second time the whole prompt is cached: it is computed again
            scored = (await client.post("/v1/completions", json=body)).json()
            choice = scored["choices"][0]
            assert choice["text"] == body["prompt"] and choice["finish_reason"] == "length"
            assert scored["usage"]["completion_tokens"] == 0
            assert scored["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            logprobs = choice["logprobs"]
            assert len(logprobs["tokens"]) == scored["usage"]["prompt_tokens"]
            assert logprobs["token_logprobs"][0] is None and logprobs["top_logprobs"][0] is None
            assert all(len(top) <= 2 for top in logprobs["top_logprobs"][1:])
            assert first is None or logprobs == first
            first = logprobs
        one_more = (await client.post("/v1/completions", json=body | {"max_tokens": 1})).json()
        more = one_more["choices"][0]["logprobs"]
        assert {k: v[:-1] for k, v in more.items()} == first  # the prompt's, then the token's
        streamed = await client.post("/v1/completions", json=body | {"stream": True})
        events = sse_events(streamed.text)
        assert events[0]["choices"][0]["logprobs"] == first
        refused = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 0})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "max_tokens"
        too_many = await client.post("/v1/completions", json=body | {"logprobs": 21})
        assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "logprobs"


def sse_typed(text):
    """(event type, payload) of a Responses API stream."""
    out = []
    for block in text.strip().split("\n\n"):
        lines = dict(line.split(": ", 1) for line in block.splitlines())
        out.append((lines["event"], json.loads(lines["data"])))
    return out


async def test_responses_plain_streamed_continued_and_structured(start_server):
    server = await start_server()
    async with server.client() as client:
        body = {"input": "Say something", "max_output_tokens": 6, "temperature": 0,
                "instructions": "Be brief."}
        plain = (await client.post("/v1/responses", json=body)).json()
        assert plain["object"] == "response" and plain["id"].startswith("resp_")
        assert plain["status"] == "incomplete"  # the tiny model ran into max_output_tokens
        assert plain["incomplete_details"] == {"reason": "max_output_tokens"}
        text = plain["output"][0]["content"][0]["text"]
        assert plain["output"][0]["role"] == "assistant" and text
        usage = plain["usage"]
        assert usage["output_tokens"] == 6 and usage["input_tokens"] > 0
        assert usage["input_tokens_details"]["cached_tokens"] == 0
        # the same again, as a chat with the same messages, gives the same text
        chat = (await client.post("/v1/chat/completions", json={
            "messages": [{"role": "system", "content": "Be brief."},
                         {"role": "user", "content": "Say something"}],
            "max_tokens": 6, "temperature": 0})).json()
        assert chat["choices"][0]["message"]["content"] == text
        streamed = await client.post("/v1/responses", json=body | {"stream": True})
        events = sse_typed(streamed.text)
        kinds = [kind for kind, _ in events]
        assert kinds[:4] == ["response.created", "response.in_progress",
                             "response.output_item.added", "response.content_part.added"]
        assert kinds[-4:] == ["response.output_text.done", "response.content_part.done",
                              "response.output_item.done", "response.incomplete"]
        assert [e["sequence_number"] for _, e in events] == list(range(len(events)))
        deltas = "".join(e["delta"] for kind, e in events if kind == "response.output_text.delta")
        assert deltas == text and events[-1][1]["response"]["output"][0]["content"][0]["text"] == text
        # a next turn without resending: its history's KV comes from the cache
        follow = (await client.post("/v1/responses", json={
            "input": "And more?", "previous_response_id": plain["id"], "max_output_tokens": 4,
            "temperature": 0})).json()
        assert follow["previous_response_id"] == plain["id"]
        assert follow["usage"]["input_tokens"] > usage["input_tokens"]
        assert follow["usage"]["input_tokens_details"]["cached_tokens"] > 0
        resent = (await client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "Say something"},
                         {"role": "assistant", "content": text},
                         {"role": "user", "content": "And more?"}],
            "max_tokens": 4, "temperature": 0})).json()
        assert follow["output"][0]["content"][0]["text"] == resent["choices"][0]["message"]["content"]
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
        structured = (await client.post("/v1/responses", json={
            "input": "json please", "max_output_tokens": 40, "temperature": 0,
            "text": {"format": {"type": "json_schema", "name": "t", "schema": schema}}})).json()
        assert isinstance(json.loads(structured["output"][0]["content"][0]["text"])["a"], int)
        for bad, param in [({"input": "x", "previous_response_id": "resp_nope"},
                            "previous_response_id"),
                           ({"input": "x", "tools": [{"type": "web_search"}]}, "tools"),
                           ({"input": [{"type": "input_image", "image_url": "x"}]}, "input"),
                           ({"input": [{"type": "function_call_output", "output": "1"}]}, "input"),
                           ({"input": [{"role": "wizard", "content": "x"}]}, "input"),
                           ({"input": "x", "max_output_tokens": 0}, "max_output_tokens"),
                           ({"input": "x", "text": {"format": {"type": "xml"}}}, "text"),
                           ({"input": ""}, "input")]:
            refused = await client.post("/v1/responses", json=bad)
            assert refused.status_code == 400, bad
            assert refused.json()["error"]["param"] == param, bad
        unstored = (await client.post("/v1/responses", json=body | {"store": False})).json()
        gone = await client.post("/v1/responses", json={"input": "x",
                                                        "previous_response_id": unstored["id"]})
        assert gone.status_code == 400


WEATHER_TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    # bounded choices: the tiny random model's strings could run past max_tokens
    "parameters": {"type": "object", "properties": {"city": {"enum": ["Paris", "Rome"]},
                                                    "days": {"type": "integer"}},
                   "required": ["city", "days"]}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "parameters": {"type": "object", "properties": {}}}}


async def test_tool_calls_required_named_streamed_and_an_agent_loop(start_server):
    import jsonschema

    server = await start_server()
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    base = {"messages": messages, "tools": [WEATHER_TOOL, TIME_TOOL], "max_tokens": 200,
            "temperature": 0}
    async with server.client() as client:
        required = (await client.post("/v1/chat/completions", json=base | {
            "tool_choice": "required", "parallel_tool_calls": False})).json()
        choice = required["choices"][0]
        assert choice["finish_reason"] == "tool_calls" and choice["message"]["content"] is None
        calls = choice["message"]["tool_calls"]
        assert calls and all(c["type"] == "function" and c["id"].startswith("call_")
                             for c in calls)
        schemas = {t["function"]["name"]: t["function"]["parameters"]
                   for t in (WEATHER_TOOL, TIME_TOOL)}
        for call in calls:  # the arguments always parse and follow the tool's schema
            jsonschema.validate(json.loads(call["function"]["arguments"]),
                                schemas[call["function"]["name"]])
        named = (await client.post("/v1/chat/completions", json=base | {
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": False})).json()
        named_calls = named["choices"][0]["message"]["tool_calls"]
        assert [c["function"]["name"] for c in named_calls] == ["get_weather"]
        streamed = await client.post("/v1/chat/completions", json=base | {
            "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": False, "stream": True})
        events = sse_events(streamed.text)
        deltas = [e["choices"][0]["delta"] for e in events if e.get("choices")]
        # as OpenAI streams a call: its id, type and name with empty arguments, then
        # the arguments' text in pieces
        streamed_calls = [c for d in deltas for c in d.get("tool_calls", [])]
        assert deltas[0] == {"role": "assistant", "content": None}
        head, *pieces = streamed_calls
        assert head["index"] == 0 and head["id"].startswith("call_")
        assert head["type"] == "function"
        assert head["function"] == {"name": "get_weather", "arguments": ""}
        assert len(pieces) > 1 and all(set(c) == {"index", "function"} for c in pieces)
        arguments = "".join(c["function"]["arguments"] for c in pieces)
        assert json.loads(arguments) == json.loads(named_calls[0]["function"]["arguments"])
        assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
        # the agent loop: the call, its result, then the model's next answer
        call = named_calls[0]
        turn = messages + [{"role": "assistant", "content": None, "tool_calls": [call]},
                           {"role": "tool", "tool_call_id": call["id"], "content": "sunny, 21 C"}]
        answer = (await client.post("/v1/chat/completions", json=base | {
            "messages": turn, "tool_choice": "auto"})).json()["choices"][0]
        message = answer["message"]
        assert (message.get("tool_calls") and answer["finish_reason"] == "tool_calls") or (
            isinstance(message["content"], str) and answer["finish_reason"] in ("stop", "length"))
        # streamed or not, an answer reads the same, cut short by max_tokens or whole
        for max_tokens in (3, 8, 30, 200):
            request = base | {"messages": turn, "tool_choice": "auto", "max_tokens": max_tokens}
            whole = (await client.post("/v1/chat/completions", json=request)).json()["choices"][0]
            events = sse_events((await client.post("/v1/chat/completions", json=request | {
                "stream": True})).text)
            deltas = [e["choices"][0]["delta"] for e in events if e.get("choices")]
            content = "".join(d.get("content") or "" for d in deltas)
            streamed_calls: dict[int, dict] = {}
            for c in (c for d in deltas for c in d.get("tool_calls", [])):
                got = streamed_calls.setdefault(c["index"], {"name": "", "arguments": ""})
                got["name"] += c["function"].get("name", "")
                got["arguments"] += c["function"]["arguments"]
            assert events[-1]["choices"][0]["finish_reason"] == whole["finish_reason"]
            if whole["message"].get("tool_calls"):
                assert list(streamed_calls.values()) == [
                    c["function"] for c in whole["message"]["tool_calls"]]
            else:
                assert not streamed_calls and content == whole["message"]["content"]
        plain = (await client.post("/v1/chat/completions", json=base | {
            "messages": turn, "tool_choice": "none"})).json()["choices"][0]
        assert "tool_calls" not in plain["message"]
        for bad, param in [({"tool_choice": {"type": "function", "function": {"name": "x"}}},
                            "tool_choice"),
                           ({"messages": messages + [{"role": "tool", "tool_call_id": "nope",
                                                      "content": "1"}]}, "messages")]:
            refused = await client.post("/v1/chat/completions", json=base | bad)
            assert refused.status_code == 400 and refused.json()["error"]["param"] == param


async def test_a_template_with_native_tools_renders_and_calls_them_its_way(
        start_server, hermes_model):
    """A model whose template renders tools in the Hermes format gets them rendered
    by that template (sandboxed Jinja) and answers calls in its tags, constrained
    by a grammar: the reply's calls parse and follow the schema, streamed as
    unstreamed, and a tool result continues the chat through the template."""
    import jsonschema

    server = await start_server({"model_path": hermes_model})
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]
    base = {"messages": messages, "tools": [WEATHER_TOOL, TIME_TOOL], "max_tokens": 200,
            "temperature": 0}
    async with server.client() as client:
        capabilities = (await client.get("/capabilities")).json()
        assert capabilities["model"]["tool_format"] == "hermes"
        prompt = (await client.post("/v1/chat/completions", json=base | {
            "tool_choice": "required", "max_tokens": 1, "logprobs": False})).json()
        assert prompt["usage"]["prompt_tokens"] > 100  # the template's tool description
        for choice in ("required", {"type": "function", "function": {"name": "get_weather"}}):
            request = base | {"tool_choice": choice, "parallel_tool_calls": choice == "required"}
            whole = (await client.post("/v1/chat/completions", json=request)).json()["choices"][0]
            assert whole["finish_reason"] == "tool_calls" and whole["message"]["content"] is None
            calls = whole["message"]["tool_calls"]
            for call in calls:
                schema = next(t["function"]["parameters"] for t in (WEATHER_TOOL, TIME_TOOL)
                              if t["function"]["name"] == call["function"]["name"])
                jsonschema.validate(json.loads(call["function"]["arguments"]), schema)
            events = sse_events((await client.post("/v1/chat/completions", json=request | {
                "stream": True})).text)
            streamed: dict[int, dict] = {}
            for c in (c for e in events if e.get("choices")
                      for c in e["choices"][0]["delta"].get("tool_calls", [])):
                got = streamed.setdefault(c["index"], {"name": "", "arguments": ""})
                got["name"] += c["function"].get("name", "")
                got["arguments"] += c["function"]["arguments"]
            assert list(streamed.values()) == [c["function"] for c in calls]
            assert events[-1]["choices"][0]["finish_reason"] == "tool_calls"
        call = calls[0]
        turn = messages + [{"role": "assistant", "content": None, "tool_calls": [call]},
                           {"role": "tool", "tool_call_id": call["id"], "content": "sunny"}]
        answer = (await client.post("/v1/chat/completions", json=base | {
            "messages": turn, "tool_choice": "auto", "max_tokens": 20})).json()
        assert answer["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        message = answer["choices"][0]["message"]
        assert message.get("tool_calls") or isinstance(message["content"], str)
        # the Responses API renders and calls the same way
        response = (await client.post("/v1/responses", json={
            "input": "Weather in Paris?", "max_output_tokens": 200, "temperature": 0,
            "tools": [{"type": "function", **WEATHER_TOOL["function"]}],
            "tool_choice": "required", "parallel_tool_calls": False})).json()
        assert response["output"][0]["type"] == "function_call"
        assert response["output"][0]["name"] == "get_weather"


async def test_prefix_transfer_endpoints_move_a_conversation_between_nodes(start_server):
    closed = await start_server()
    source = await start_server(cache_transfer=True, api_key="k")
    target = await start_server(cache_transfer=True, api_key="k")
    auth = {"Authorization": "Bearer k"}
    text = "A conversation long enough to keep: " + "one two three " * 20
    body = {"max_tokens": 8, "temperature": 0, "logprobs": 1}
    async with closed.client() as client:
        assert (await client.post("/v1/dgr/prefix/export", json={"tokens": [1]})).status_code == 404
        ids = (await client.post("/tokenize", json={"content": text})).json()["tokens"]
        expected = (await client.post("/v1/completions", json=body | {"prompt": ids})).json()
    async with source.client(headers=auth) as a, target.client(headers=auth) as b:
        assert (await a.post("/v1/dgr/prefix/export", json={"tokens": [1]},
                             headers={"Authorization": ""})).status_code == 401
        # one token: the slot then keeps exactly the prompt (the last token is not fed back)
        await a.post("/v1/completions", json=body | {"prompt": ids, "max_tokens": 1})
        assert (await a.post("/v1/dgr/prefix/export", json={})).status_code == 400
        assert (await a.post("/v1/dgr/prefix/export",
                             json={"tokens": [7, 7, 7]})).status_code == 404
        exported = await a.post("/v1/dgr/prefix/export", json={"tokens": ids})
        assert exported.status_code == 200
        assert exported.headers["content-type"] == "application/octet-stream"
        blob = exported.content
        bad = await b.post("/v1/dgr/prefix/import", content=blob[:-1] + bytes([blob[-1] ^ 1]))
        assert bad.status_code == 400 and "checksum" in bad.json()["error"]["message"]
        good = await b.post("/v1/dgr/prefix/import", content=blob)
        assert good.status_code == 200 and good.json()["tokens"] == len(ids)
        got = (await b.post("/v1/completions", json=body | {"prompt": ids})).json()
        assert got["choices"][0]["text"] == expected["choices"][0]["text"]
        assert got["choices"][0]["logprobs"] == expected["choices"][0]["logprobs"]
        caps = (await b.get("/capabilities")).json()["kv_tiers"]
        assert caps["hits"]["host"] == 1 and caps["tokens_restored"] == len(ids) - 1
