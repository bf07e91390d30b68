"""Doors clients knock on: llama-server's API (its native completion, props,
slots, templates, metrics, sampling defaults, progress reports), the OpenAI paths
without /v1, Anthropic's X-Api-Key header, CORS for web pages (preflights before
the key check), json_object's schema and Vertex AI's predict route."""

import json

import httpx

from test_server import start_server  # noqa: F401  (the fixture)


async def test_the_openai_paths_without_v1_are_the_same_doors(start_server):  # noqa: F811
    server = await start_server()
    async with server.client() as client:
        # but /completions, which is llama.cpp's native completion there, as /completion
        body = {"prompt": "hi", "max_tokens": 3, "temperature": 0}
        with_v1 = (await client.post("/v1/completions", json=body)).json()
        native = (await client.post("/completions", json=body)).json()
        assert native["content"] == with_v1["choices"][0]["text"]
        assert (await client.get("/v1/health")).status_code == 200
        chat = await client.post("/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert chat.status_code == 200
        assert (await client.get("/models")).json()["data"]


async def test_x_api_key_is_a_key_and_cors_preflights_come_before_it(start_server):  # noqa: F811
    server = await start_server(api_key="sekret", cors_origins=("https://app.example",))
    async with server.client() as client:
        assert (await client.get("/v1/models")).status_code == 401
        assert (await client.get("/v1/models", headers={"x-api-key": "wrong"})).status_code == 401
        assert (await client.get("/v1/models", headers={"x-api-key": "sekret"})).status_code == 200
        preflight = await client.options("/v1/chat/completions", headers={
            "origin": "https://app.example", "access-control-request-method": "POST",
            "access-control-request-headers": "authorization, content-type"})
        assert preflight.status_code == 200
        assert preflight.headers["access-control-allow-origin"] == "https://app.example"
        assert "POST" in preflight.headers["access-control-allow-methods"]
        listed = await client.get("/v1/models", headers={"origin": "https://app.example",
                                                         "authorization": "Bearer sekret"})
        assert listed.headers["access-control-allow-origin"] == "https://app.example"
        stranger = await client.options("/v1/models", headers={
            "origin": "https://evil.example", "access-control-request-method": "GET"})
        assert stranger.status_code == 400
        assert "access-control-allow-origin" not in stranger.headers
    plain = await start_server()
    async with plain.client() as client:
        answer = await client.get("/v1/models", headers={"origin": "https://app.example"})
        assert "access-control-allow-origin" not in answer.headers  # off by default


async def test_json_object_with_a_schema_follows_the_schema(start_server):  # noqa: F811
    server = await start_server()
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
              "additionalProperties": False}
    async with server.client() as client:
        done = await client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "a number"}], "max_tokens": 60,
            "temperature": 0, "response_format": {"type": "json_object", "schema": schema}})
        assert done.status_code == 200, done.text
        answer = json.loads(done.json()["choices"][0]["message"]["content"])
        assert set(answer) == {"n"} and isinstance(answer["n"], int)
        odd = await client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "x"}],
            "response_format": {"type": "json_object", "strict": True}})
        assert odd.status_code == 400 and odd.json()["error"]["param"] == "response_format"


async def test_llama_cpps_native_completion_props_and_template(start_server):  # noqa: F811
    server = await start_server()
    async with server.client() as client:
        body = {"prompt": "Once upon", "n_predict": 12, "temperature": 0, "return_tokens": True,
                "cache_prompt": True, "id_slot": -1}
        whole = (await client.post("/completion", json=body)).json()
        assert whole["stop"] and whole["stop_type"] == "limit"
        assert whole["timings"]["predicted_n"] == 12 and len(whole["tokens"]) == 12
        assert whole["tokens_evaluated"] > 0 and isinstance(whole["has_new_line"], bool)
        streamed = await client.post("/completion", json=body | {"stream": True})
        events = [json.loads(line[6:]) for line in streamed.text.splitlines()
                  if line.startswith("data: ")]
        assert events[-1]["stop"] and not any(e["stop"] for e in events[:-1])
        assert "".join(e["content"] for e in events) == whole["content"]
        word = whole["content"][3:5]
        stopped = (await client.post("/completion", json=body | {"stop": [word]})).json()
        assert stopped["stop_type"] == "word" and stopped["stopping_word"] == word
        assert whole["generation_settings"]["logit_bias"] == []
        picked = (await client.post("/completion", json=body | {"response_fields": [
            "content", "generation_settings/n_predict", "prompt"]})).json()
        assert set(picked) == {"content", "generation_settings/n_predict", "prompt"}
        assert picked["generation_settings/n_predict"] == 12 and "Once upon" in picked["prompt"]
        banned = (await client.post("/completion", json=body | {"ignore_eos": True})).json()
        biases = banned["generation_settings"]["logit_bias"]
        assert biases and all(b["bias"] is None for b in biases)  # -inf: each end token banned
        refused = await client.post("/completion", json=body | {"samplers": ["top_k"]})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "samplers"
        props = (await client.get("/props")).json()
        assert props["default_generation_settings"]["n_ctx"] > 0 and props["total_slots"] > 0
        applied = (await client.post("/apply-template", json={
            "messages": [{"role": "user", "content": "hi"}]})).json()
        assert "hi" in applied["prompt"]
        chat = {"messages": [{"role": "user", "content": "hi"}]}
        counted = (await client.post("/v1/chat/completions/input_tokens", json=chat)).json()
        rendered = (await client.post("/v1/chat/completions/render", json=chat)).json()
        assert counted == {"input_tokens": len(rendered["token_ids"])}
        counted = (await client.post("/responses/input_tokens", json={"input": "hi"})).json()
        assert counted["input_tokens"] > 0


async def test_a_prompt_past_the_context_says_how_far(start_server):  # noqa: F811
    server = await start_server()
    async with server.client() as client:
        long = await client.post("/v1/completions", json={"prompt": "word " * 3000,
                                                          "max_tokens": 4})
        assert long.status_code == 400
        error = long.json()["error"]
        assert error["type"] == "exceed_context_size_error"
        assert error["n_prompt_tokens"] > error["n_ctx"] > 0


async def test_slots_show_each_slots_state(start_server):  # noqa: F811
    # a running session's entry: tests/test_node.py, test_slots_show_running_sessions
    server = await start_server({"max_running": 2, "max_waiting": 2})
    async with server.client() as client:
        idle = (await client.get("/slots")).json()
        n_ctx = (await client.get("/props")).json()["default_generation_settings"]["n_ctx"]
        assert [s["id"] for s in idle] == [0, 1]
        assert all(s["n_ctx"] == n_ctx and not s["is_processing"] for s in idle)
        assert (await client.get("/slots?fail_on_no_slot=1")).status_code == 200
    hidden = await start_server(slots_endpoint=False)
    async with hidden.client() as client:
        refused = await client.get("/slots")
        assert refused.status_code == 501 and refused.json()["error"]["type"] == "not_supported_error"


async def test_a_node_listens_on_each_address_given(start_server):  # noqa: F811
    server = await start_server(host="127.0.0.1,127.0.0.2")
    assert {httpx.URL(url).host for url in server.urls} == {"127.0.0.1", "127.0.0.2"}
    for url in server.urls:
        async with httpx.AsyncClient(base_url=url) as client:
            assert (await client.get("/health")).status_code == 200


async def test_a_chat_template_in_place_of_the_models(start_server, tmp_path):  # noqa: F811
    template = tmp_path / "chat.jinja"
    template.write_text("{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}"
                        "</{{ m.role }}>{% endfor %}{% if add_generation_prompt %}<assistant>"
                        "{% endif %}")
    server = await start_server({"chat_template_file": str(template)})
    chat = [{"role": "user", "content": "hi"}]
    async with server.client() as client:
        async def rendered(**body):
            answer = await client.post("/apply-template", json={"messages": chat} | body)
            return answer.json()["prompt"]

        # the BOS text is left to the tokenizer, which adds it
        assert await rendered() == "<user>hi</user><assistant>"
        assert await rendered(add_generation_prompt=False) == "<user>hi</user>"
        prefill = chat + [{"role": "assistant", "content": "Wh"}]
        assert await rendered(messages=prefill) == "<user>hi</user><assistant>Wh"
        shown = (await client.post("/v1/chat/completions", json={
            "messages": prefill, "max_tokens": 2, "verbose": True})).json()
        assert shown["__verbose"]["prompt"] == "<user>hi</user><assistant>Wh"
        # a continued message's text parts are joined by a blank line, as llama-server
        # continues one (in the template's messages, by a newline)
        parts = [{"type": "text", "text": "Wh"}, {"type": "text", "text": "ill"}]
        assert await rendered(messages=chat + [{"role": "assistant", "content": parts}]) == \
            "<user>hi</user><assistant>Wh\n\nill"
        assert await rendered(messages=[{"role": "user", "content": parts}]) == \
            "<user>Wh\nill</user><assistant>"
        assert (await client.get("/props")).json()["chat_template"] == template.read_text()
    named = await start_server({"chat_template": "chatml"})
    async with named.client() as client:
        prompt = (await client.post("/apply-template", json={"messages": chat})).json()["prompt"]
        assert prompt == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"


async def test_the_servers_sampling_defaults_fill_what_a_request_leaves_out(start_server):  # noqa: F811
    server = await start_server(temperature=0.0, seed=7)
    async with server.client() as client:
        params = (await client.get("/props")).json()["default_generation_settings"]["params"]
        assert params == {"temperature": 0.0, "seed": 7}
        body = {"prompt": "Once upon a time", "max_tokens": 24}
        texts = {(await client.post("/v1/completions", json=body)).json()["choices"][0]["text"]
                 for _ in range(3)}
        assert len(texts) == 1  # greedy: the server's temperature, not OpenAI's 1
        sampled = {(await client.post("/v1/completions", json=body | {"temperature": 1.5, "seed": s})
                    ).json()["choices"][0]["text"] for s in range(3)}
        assert len(sampled) > 1  # a request's own fields win


async def test_metrics_carry_llama_servers_families_too(start_server):  # noqa: F811
    server = await start_server()
    async with server.client() as client:
        done = (await client.post("/completion", json={"prompt": "I believe", "n_predict": 6,
                                                      "ignore_eos": True})).json()
        # a session whose first token is end-of-generation: that token ends it and is
        # counted as predicted nowhere, neither in its timings nor in the metrics
        eog = done["generation_settings"]["logit_bias"][0]["token"]
        ended = (await client.post("/completion", json={
            "prompt": "I believe", "n_predict": 6, "logit_bias": [[eog, 100]]})).json()
        assert ended["stop_type"] == "eos" and ended["tokens_predicted"] == 0
        scraped = await client.get("/metrics")
        assert float(scraped.headers["process-start-time-unix"]) > 0
        families, values = {}, {}
        for line in scraped.text.splitlines():
            if line.startswith("# TYPE llamacpp:"):
                _, _, name, kind = line.split(" ")
                families[name] = kind
            elif line.startswith("llamacpp:"):
                name, value = line.split(" ")
                values[name] = float(value)
        assert set(values) == set(families) and len(families) == 15
        assert families["llamacpp:n_tokens_max"] == families["llamacpp:n_decode_total"] == "counter"
        assert families["llamacpp:requests_processing"] == "gauge"
        assert done["timings"]["predicted_n"] == 6 and ended["timings"]["predicted_n"] == 0
        assert values["llamacpp:tokens_predicted_total"] == 6
        assert values["llamacpp:prompt_tokens_total"] == (done["timings"]["prompt_n"]
                                                          + ended["timings"]["prompt_n"])
        assert values["llamacpp:n_decode_total"] > 0 and values["llamacpp:requests_processing"] == 0


async def test_llama_cpps_prompt_shapes(start_server):  # noqa: F811
    server = await start_server()
    async with server.client() as client:
        async def complete(prompt):
            answer = await client.post("/completion", json={"prompt": prompt, "n_predict": 4,
                                                            "temperature": 0})
            assert answer.status_code == 200, answer.text
            return answer.json()

        text = "I believe the meaning of life is"
        ids = (await client.post("/tokenize", json={"content": text,
                                                    "add_special": True})).json()["tokens"]
        one = (await complete(text))["content"]
        assert (await complete(ids))["content"] == one
        assert (await complete({"prompt_string": text}))["content"] == one
        several = await complete([ids, {"prompt_string": text}, text])
        assert [r["content"] for r in several] == [one] * 3
        assert [r["index"] for r in several] == [0, 1, 2]
        mixed = await complete([*ids[:3], "meaning", *ids[3:]])  # one prompt, tokenized in place
        assert isinstance(mixed["content"], str)
        refused = await client.post("/completion", json={"prompt": {
            "prompt_string": text, "multimodal_data": ["aGk="]}})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "prompt"


async def test_a_stream_reports_its_prompts_prefill_when_asked(start_server):  # noqa: F811
    server = await start_server({"n_batch": 64, "n_ubatch": 64, "prefill_chunk": 32})
    prompt = "the quick brown fox jumps over the lazy dog " * 20  # several steps' prefill
    async with server.client() as client:
        native = await client.post("/completion", json={
            "prompt": prompt, "n_predict": 4, "stream": True, "return_progress": True,
            "timings_per_token": True})
        events = [json.loads(line[6:]) for line in native.text.splitlines()
                  if line.startswith("data: ")]
        reports = [e for e in events if "prompt_progress" in e]
        assert len(reports) > 1
        first, last = reports[0], reports[-1]  # the first, at the start, always has room
        assert first["prompt_progress"]["processed"] == first["prompt_progress"]["cache"]
        assert first["timings"]["prompt_n"] == 0 and first["timings"]["prompt_ms"] == 0.0
        # (a report the reader has not made room for is dropped: the last may be)
        assert last["prompt_progress"]["processed"] <= last["prompt_progress"]["total"]
        processed = [r["prompt_progress"]["processed"] for r in reports]
        assert processed == sorted(processed)
        assert events[-1]["stop"] and events[-1]["tokens_predicted"] == 4
        assert all("timings" in e for e in events)
        chat = await client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": prompt}], "max_tokens": 2,
            "stream": True, "return_progress": True})
        chunks = [json.loads(line[6:]) for line in chat.text.splitlines()
                  if line.startswith("data: ") and line != "data: [DONE]"]
        reports = [c for c in chunks if "prompt_progress" in c]
        assert len(reports) > 1 and all(c["choices"] == [] for c in reports)
        plain = await client.post("/completion", json={"prompt": prompt, "n_predict": 2,
                                                       "stream": True})
        assert "prompt_progress" not in plain.text  # only when asked
        responses = await client.post("/v1/responses", json={
            "input": prompt, "max_output_tokens": 4, "stream": True, "return_progress": True,
            "timings_per_token": True})
        data = [json.loads(line[6:]) for line in responses.text.splitlines()
                if line.startswith("data: ")]
        assert any(d["type"] == "response.in_progress" and "prompt_progress" in d for d in data)
        assert any(d["type"] == "response.output_text.delta" and "timings" in d for d in data)
        assert "timings" in data[-1] and data[-1]["type"] == "response.incomplete"  # max_output_tokens


async def test_llama_cpps_probabilities_and_text_biases(start_server):  # noqa: F811
    server = await start_server()
    async with server.client() as client:
        body = {"prompt": "I believe the meaning of life is", "n_probs": 3, "n_predict": 4,
                "temperature": 0}
        whole = (await client.post("/completion", json=body)).json()
        probs = whole["completion_probabilities"]
        assert len(probs) == 4
        for p in probs:
            assert p["logprob"] <= 0 and len(p["top_logprobs"]) == 3
            assert isinstance(p["token"], str) and isinstance(p["bytes"], list)
        streamed = await client.post("/completion", json=body | {"stream": True})
        pieces = [json.loads(line[6:]) for line in streamed.text.splitlines()
                  if line.startswith("data: ")]
        assert [p["completion_probabilities"][0]["id"] for p in pieces if not p["stop"]] == \
            [p["id"] for p in probs]
        banned = (await client.post("/completion", json=body | {
            "logit_bias": [[probs[0]["id"], False]]})).json()  # false: banned
        assert banned["completion_probabilities"][0]["id"] != probs[0]["id"]
        assert banned["generation_settings"]["logit_bias"] == [{"token": probs[0]["id"],
                                                                "bias": -100}]
        # a text's tokens all take its bias
        texts = (await client.post("/completion", json=body | {
            "logit_bias": {"hello world": -5}})).json()["generation_settings"]["logit_bias"]
        ids = (await client.post("/tokenize", json={"content": "hello world"})).json()["tokens"]
        assert sorted(b["token"] for b in texts) == sorted(set(ids))
        assert {b["bias"] for b in texts} == {-5}
        refused = await client.post("/completion", json=body | {"post_sampling_probs": True})
        assert refused.status_code == 400


async def test_vertex_ais_predict_route_in_its_container(start_server, monkeypatch):  # noqa: F811
    monkeypatch.setenv("AIP_MODE", "PREDICTION")
    monkeypatch.setenv("AIP_HEALTH_ROUTE", "/ping")
    server = await start_server()
    async with server.client() as client:
        assert (await client.get("/ping")).status_code == 200
        answer = await client.post("/predict", json={"instances": [
            {"@requestFormat": "chatCompletions", "max_tokens": 4, "stream": True,
             "messages": [{"role": "user", "content": "hi"}]},
            {"@requestFormat": "/v1/completions", "prompt": "hi", "max_tokens": 3},
            {"@requestFormat": "completion", "prompt": "hi", "n_predict": 2},
            {"@requestFormat": "chatCompletions", "messages": []},
            {"@requestFormat": "noSuchDoor"}]})
        assert answer.status_code == 200
        chat, oai, native, refused, unknown = answer.json()["predictions"]
        assert chat["choices"][0]["message"]["role"] == "assistant"  # answered whole
        assert oai["object"] == "text_completion" and native["tokens_predicted"] == 2
        assert refused["error"]["param"] == "messages" and "noSuchDoor" in unknown["error"]["message"]
        bad = await client.post("/predict", json={"instances": 5})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "instances"
