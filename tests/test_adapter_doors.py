"""LoRa adapters through the doors: the official openai client picks one by `model`
(vLLM's convention, /v1/models listing each with its parent), llama-server's `lora`
field and /lora-adapters, vLLM's run-time loading, and each door's 404 for a model
it does not serve."""

import anthropic
import openai
import pytest

from dgr import testmodel
from test_server import start_server  # noqa: F401  (the fixture)


@pytest.fixture(scope="module")
def adapter_files(tmp_path_factory, tiny_model):
    folder = tmp_path_factory.mktemp("adapters")
    testmodel.write_lora(tiny_model, folder / "x.gguf", seed=1)
    testmodel.write_lora(tiny_model, folder / "y.gguf", seed=2)
    return {"x": str(folder / "x.gguf"), "y": str(folder / "y.gguf")}


async def test_openai_client_selects_adapters_by_model(start_server, adapter_files):  # noqa: F811
    server = await start_server({"lora": (f"x={adapter_files['x']}",)})
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused",
                                  max_retries=0) as client:
        models = {m.id: m for m in (await client.models.list()).data}
        base = next(name for name in models if name != "x")
        assert models["x"].model_extra["parent"] == base

        async def complete(model):
            got = await client.completions.create(model=model, prompt="Hello there",
                                                  max_tokens=12, temperature=0, logprobs=1)
            return got.model, got.choices[0].text, got.choices[0].logprobs.token_logprobs

        named_base, named_x = await complete(base), await complete("x")
        assert named_x[0] == "x" and named_base[0] == base
        assert named_x[1:] != named_base[1:]
        chat = await client.chat.completions.create(
            model="x", messages=[{"role": "user", "content": "hi"}], max_tokens=8, temperature=0)
        assert chat.model == "x"
        response = await client.responses.create(model="x", input="hi", max_output_tokens=8)
        assert response.model == "x"
        with pytest.raises(openai.NotFoundError) as raised:
            await client.completions.create(model="nope", prompt="Hello", max_tokens=2)
        assert raised.value.body["code"] == "model_not_found"
    async with anthropic.AsyncAnthropic(base_url=server.url, api_key="unused",
                                        max_retries=0) as client:
        reply = await client.messages.create(model="x", max_tokens=8, messages=[
            {"role": "user", "content": "hi"}])
        assert reply.model == "x"
        with pytest.raises(anthropic.NotFoundError):
            await client.messages.create(model="nope", max_tokens=8,
                                         messages=[{"role": "user", "content": "hi"}])


async def test_llama_server_lora_field_and_endpoint(start_server, adapter_files):  # noqa: F811
    server = await start_server({"lora": (adapter_files["x"], adapter_files["y"]),
                                 "lora_init_without_apply": True})
    body = {"prompt": "Hello there", "n_predict": 12, "temperature": 0}
    async with server.client() as client:
        listed = (await client.get("/lora-adapters")).json()
        assert [(a["id"], a["path"], a["scale"]) for a in listed] == [
            (0, adapter_files["x"], 0.0), (1, adapter_files["y"], 0.0)]
        plain = (await client.post("/completion", json=body)).json()["content"]
        with_x = (await client.post("/completion", json=body | {"lora": [{"id": 0, "scale": 1}]}
                                    )).json()["content"]
        assert with_x != plain
        assert (await client.post("/lora-adapters", json=[{"id": 0, "scale": 1.0}])).json() == {
            "success": True}
        assert [a["scale"] for a in (await client.get("/lora-adapters")).json()] == [1.0, 0.0]
        assert (await client.post("/completion", json=body)).json()["content"] == with_x
        # the request's own list wins: [] means none in particular, so the global scales
        assert (await client.post("/completion", json=body | {"lora": []})).json()[
            "content"] == with_x
        for bad in ([{"id": 5, "scale": 1}], [{"id": "0"}], {"id": 0}):
            got = await client.post("/completion", json=body | {"lora": bad})
            assert got.status_code == 400 and "lora" in got.json()["error"]["message"]
        got = await client.post("/lora-adapters", json=[{"id": 9, "scale": 1.0}])
        assert got.status_code == 400
        chat = await client.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4,
            "lora": [{"id": 1, "scale": 0.5}]})
        assert chat.status_code == 200


async def test_runtime_loading(start_server, adapter_files, tiny_model):  # noqa: F811
    server = await start_server(runtime_lora=True)
    async with server.client() as client:
        got = await client.post("/v1/load_lora_adapter",
                                json={"lora_name": "x", "lora_path": adapter_files["x"]})
        assert got.status_code == 200 and "added" in got.text
        for bad in ({"lora_name": "b", "lora_path": tiny_model},
                    {"lora_name": "b", "lora_path": "/no/such.gguf"},
                    {"lora_name": "x", "lora_path": adapter_files["y"]},
                    {"lora_name": "", "lora_path": adapter_files["y"]}):
            got = await client.post("/v1/load_lora_adapter", json=bad)
            assert got.status_code == 400, bad
        ids = [m["id"] for m in (await client.get("/v1/models")).json()["data"]]
        assert "x" in ids
        body = {"model": "x", "prompt": "Hello", "max_tokens": 4}
        assert (await client.post("/v1/completions", json=body)).status_code == 200
        metrics = (await client.get("/metrics")).text
        assert 'dgr_adapter_rank{adapter="x"} 4.0' in metrics
        facts = (await client.get("/capabilities")).json()["adapters"]
        assert [a["name"] for a in facts["adapters"]] == ["x"] and facts["per_session"]
        got = await client.post("/v1/unload_lora_adapter", json={"lora_name": "x"})
        assert got.status_code == 200 and "removed" in got.text
        assert (await client.post("/v1/completions", json=body)).status_code == 404
        got = await client.post("/v1/unload_lora_adapter", json={"lora_name": "x"})
        assert got.status_code == 400


async def test_runtime_loading_is_off_by_default(start_server, adapter_files):  # noqa: F811
    server = await start_server()
    async with server.client() as client:
        got = await client.post("/v1/load_lora_adapter",
                                json={"lora_name": "x", "lora_path": adapter_files["x"]})
        assert got.status_code == 403 and "--runtime-lora" in got.json()["error"]["message"]
        # with no adapter served, any model name is the base model (llama-server's way)
        got = await client.post("/v1/completions", json={"model": "any", "prompt": "Hi",
                                                         "max_tokens": 2})
        assert got.status_code == 200
