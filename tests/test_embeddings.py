"""Embedding nodes (dgr.embedding) on random-weight encoders, a reranker and a
decoder with pooling, written at test time: every vector bitwise the same alone,
16 at once and in mixed steps; the same as llama.cpp's own pooling (llama-cpp-python
on the same file); the doors' shapes and their refusals; the queue's bounds."""

import base64

import httpx
import llama_cpp
import numpy as np
import openai
import pytest
import trio
import trio.testing

import dgr
from dgr import invariance, testmodel
from dgr.embedding import MAX_INPUTS, load_embedder, open_embedding_node
from dgr.errors import AdmissionRejected, InvalidRequest
from test_server import start_server  # noqa: F401  (the fixture)

TEXTS = ["hello world", "the cat sat on the mat", "a", "Embeddings are vectors.",
         "one two three four five six seven eight nine ten eleven twelve",
         "in the beginning", "then", "the the the the", "zebra", "Quick brown fox",
         "x y z", "another text here", "numbers 12345", "short", "a longer one, with commas",
         "last of sixteen"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("embedding-models")
    mean = testmodel.write_encoder_model(folder / "mean.gguf", n_embd=256, n_layer=3,
                                         n_head=4, n_ff=512)
    return {
        "bert-mean-f32": str(mean),
        "bert-mean-q8_0": str(testmodel.quantize(mean, folder / "q8.gguf", "Q8_0")),
        "bert-mean-q4_k_m": str(testmodel.quantize(mean, folder / "q4k.gguf", "Q4_K_M")),
        "bert-cls": str(testmodel.write_encoder_model(folder / "cls.gguf", pooling="cls")),
        "llama-last": str(testmodel.write_test_model(folder / "last.gguf", pooling="last")),
        "rank": str(testmodel.write_encoder_model(folder / "rank.gguf", pooling="rank",
                                                  n_labels=1)),
        "nomic-bert-mean": str(testmodel.write_encoder_model(
            folder / "nomic.gguf", n_embd=128, n_head=4, n_ff=256, architecture="nomic-bert")),
        "jina-bert-v2-mean": str(testmodel.write_encoder_model(
            folder / "jina.gguf", n_embd=128, n_head=4, n_ff=256, architecture="jina-bert-v2")),
        "qwen3-last": str(testmodel.write_test_model(folder / "qwen3-last.gguf",
                                                     architecture="qwen3", pooling="last")),
        "qwen3-rank": str(testmodel.write_test_model(folder / "qwen3-rank.gguf",
                                                     architecture="qwen3", pooling="rank",
                                                     n_labels=2)),
    }


def config(path, **overrides):
    return dgr.NodeConfig(**({"model_path": path, "max_running": 16, "max_waiting": 16,
                              "n_ctx": 1024, "n_threads": 2} | overrides))


@pytest.mark.parametrize("name", ["bert-mean-f32", "bert-mean-q8_0", "bert-mean-q4_k_m",
                                  "bert-cls", "llama-last", "rank", "nomic-bert-mean",
                                  "jina-bert-v2-mean", "qwen3-last", "qwen3-rank"])
async def test_vectors_bitwise_alone_together_and_mixed(models, name):
    async with open_embedding_node(config(models[name])) as node:
        ids = [node.tokenize(t) for t in TEXTS]
        alone = [(await node.embed([x]))[0] for x in ids]
        together = [None] * len(ids)

        async def one(i):
            together[i] = (await node.embed([ids[i]]))[0]

        steps = node.steps_done
        async with trio.open_nursery() as nursery:
            for i in range(len(ids)):
                nursery.start_soon(one, i)
        assert node.steps_done - steps < len(ids)  # they shared steps
        # mixed: other inputs around them, in another order, and each twice
        mixed = await node.embed(ids[::-1] + [node.tokenize("filler " * k) for k in range(1, 6)]
                                 + ids)
        for i in range(len(ids)):
            assert np.array_equal(alone[i], together[i]), i
            assert np.array_equal(alone[i], mixed[len(ids) - 1 - i]), i
            assert np.array_equal(alone[i], mixed[len(ids) + 5 + i]), i
        assert len({a.tobytes() for a in alone}) == len(ids)


@pytest.mark.parametrize("name,pooling", [("bert-mean-f32", llama_cpp.LLAMA_POOLING_TYPE_MEAN),
                                          ("bert-cls", llama_cpp.LLAMA_POOLING_TYPE_CLS),
                                          ("llama-last", llama_cpp.LLAMA_POOLING_TYPE_LAST),
                                          ("nomic-bert-mean", llama_cpp.LLAMA_POOLING_TYPE_MEAN),
                                          ("jina-bert-v2-mean",
                                           llama_cpp.LLAMA_POOLING_TYPE_MEAN),
                                          ("qwen3-last", llama_cpp.LLAMA_POOLING_TYPE_LAST)])
async def test_vectors_match_llama_cpps_own_pooling(models, name, pooling):
    """llama.cpp pools in its graph (a mean by matmul, the first or last row); dgr pools
    the same token states itself: equal within 1e-4 in cosine, each text."""
    reference = llama_cpp.Llama(models[name], embedding=True, pooling_type=pooling,
                                n_ctx=512, n_batch=512, n_ubatch=512, verbose=False)
    expected = [np.array(reference.embed(t, normalize=False), dtype=np.float64) for t in TEXTS]
    reference.close()
    async with open_embedding_node(config(models[name])) as node:
        got = await node.embed([node.tokenize(t) for t in TEXTS])
    for want, vector in zip(expected, got):
        cosine = want @ vector / np.linalg.norm(want) / np.linalg.norm(vector)
        assert cosine > 1 - 1e-4


@pytest.mark.parametrize("name", ["rank", "qwen3-rank"])
async def test_rerank_scores_match_llama_cpp(models, name):
    """A BERT-style reranker (its first token's state through a classifier head) and a
    Qwen3-Reranker-style one (its last token's, the pair laid out by its template)."""
    reference = llama_cpp.Llama(models[name], embedding=True, n_ctx=512, n_batch=512,
                                n_ubatch=512, verbose=False)
    async with open_embedding_node(config(models[name])) as node:
        inputs = node.rerank_inputs("which animal", TEXTS)
        # the model's rerank template lays the pair out where it has one
        first = node.tokenize("<|im_start|>" if name == "qwen3-rank" else "",
                              add_special=name != "qwen3-rank", parse_special=True)
        assert inputs[0][:1] == first[:1]
        got = [float(s[0]) for s in await node.embed(inputs)]
    # llama-cpp-python's embed() (llama.cpp's rank pooling; its first value is the
    # score) on the same tokens: its tokenizer is given them
    pairs = {f"pair {i}".encode(): ids for i, ids in enumerate(inputs)}
    reference.tokenize = lambda text, *args, **kwargs: pairs[text]
    expected = [reference.embed(f"pair {i}", normalize=False)[0] for i in range(len(inputs))]
    reference.close()
    assert np.allclose(got, expected, rtol=1e-3, atol=1e-3), (got, expected)
    assert np.argsort(got).tolist() == np.argsort(expected).tolist()


async def test_bounds_refuse_with_reasons(models):
    async with open_embedding_node(config(models["bert-mean-f32"], max_running=1,
                                          max_waiting=1, max_waiting_tokens=0)) as node:
        short = node.tokenize("hi")
        node._admit("embedding", [short] * 40)  # stays in the node until its steps run
        node._admit("embedding", [short])
        with pytest.raises(AdmissionRejected) as refused:
            await node.embed([short])
        assert refused.value.reason == "queue_full"
        with pytest.raises(AdmissionRejected) as refused:
            await node.embed([[5] * (node.max_input_tokens + 1)])
        assert refused.value.reason == "never_fits"
        # counted by reason, as the generation node counts its refusals
        counted = {reason: node.telemetry.registry.get_sample_value(
            "dgr_embedding_admissions_rejected_total", {"reason": reason})
            for reason in ("queue_full", "never_fits", "draining")}
        assert counted == {"queue_full": 1, "never_fits": 1, "draining": 0}
        for bad in ([], [[]], [[node.engine_info["n_vocab"]]], [[-1]], [["a"]],
                    [short] * (MAX_INPUTS + 1)):
            with pytest.raises(InvalidRequest):
                await node.embed(bad)
    async with open_embedding_node(config(models["bert-mean-f32"], n_ctx=256)) as node:
        node._admit("embedding", [[5] * 200] * (node.max_waiting_tokens // 200))
        with pytest.raises(AdmissionRejected) as refused:
            await node.embed([[5] * 200])
        assert refused.value.reason == "queue_tokens_full"


async def test_a_cancelled_request_leaves_the_queue(models):
    async with open_embedding_node(config(models["bert-mean-f32"])) as node:
        ids = [node.tokenize(t) for t in TEXTS] * 20
        with trio.move_on_after(0.01):
            await node.embed(ids)
        assert node._waiting_tokens == 0 and not node._queue and not node._requests
        first = (await node.embed(ids[:1]))[0]
        assert np.array_equal(first, (await node.embed(ids[:3]))[0])


async def test_a_drain_waits_for_the_requests_in_the_node_and_refuses_new_ones(models):
    """The node interface every kind shares (dgr.serving): a drain wakes as the last
    request leaves, refuses what comes after with "draining", and a grace that runs out
    says so."""
    async with open_embedding_node(config(models["bert-mean-f32"])) as node:
        assert node.task == "embedding" and not node.generates
        assert node.capabilities()["task"] == "embedding"
        ids = [node.tokenize(t) for t in TEXTS] * 8
        got, drained = [], []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(lambda: _collect(node, ids, got))
            await trio.testing.wait_all_tasks_blocked()
            assert node.in_flight == 1
            drained.append(await node.drain(60))
        assert drained == [True] and len(got[0]) == len(ids) and node.in_flight == 0
        with pytest.raises(AdmissionRejected) as refused:
            await node.embed(ids[:1])
        assert refused.value.reason == "draining" and node.draining
        assert node.capabilities()["bounds"]["requests"]["used"] == 0
    async with open_embedding_node(config(models["bert-mean-f32"])) as node:
        node._admit("embedding", [node.tokenize("still in the node")])
        assert not await node.drain(0)  # the grace is over before it leaves


async def _collect(node, ids, got):
    got.append(await node.embed(ids))


async def test_openai_client_float_and_base64(start_server, models):  # noqa: F811
    server = await start_server({"model_path": models["bert-mean-f32"], "n_ctx": 1024})
    async with openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused",
                                  max_retries=0) as client:
        floats = await client.embeddings.create(model="x", input=TEXTS[:4],
                                                encoding_format="float")
        packed = await client.embeddings.create(model="x", input=TEXTS[:4])  # base64 asked
        one = await client.embeddings.create(model="x", input=TEXTS[1])
        assert [d.index for d in floats.data] == [0, 1, 2, 3]
        for a, b in zip(floats.data, packed.data):
            assert np.array_equal(np.float32(a.embedding), np.float32(b.embedding))
        assert np.array_equal(np.float32(one.data[0].embedding),
                              np.float32(floats.data[1].embedding))
        assert abs(np.linalg.norm(floats.data[0].embedding) - 1) < 1e-5  # normalized
        assert floats.usage.prompt_tokens == floats.usage.total_tokens > 4
        with pytest.raises(openai.BadRequestError):
            await client.embeddings.create(model="x", input=TEXTS[0], dimensions=8)
        with pytest.raises(openai.APIStatusError) as refused:
            await client.completions.create(model="x", prompt="hi", max_tokens=2)
        assert refused.value.status_code == 501
    async with server.client() as http:
        raw = (await http.post("/v1/embeddings", json={"input": "hello world",
                                                       "encoding_format": "base64"})).json()
        vector = np.frombuffer(base64.b64decode(raw["data"][0]["embedding"]), dtype="<f4")
        assert vector.shape == (256,)
        models_list = (await http.get("/v1/models")).json()["data"][0]["meta"]
        assert (models_list["task"], models_list["pooling"], models_list["n_embd"]) == (
            "embedding", "mean", 256)
        report = (await http.get("/capabilities")).json()
        assert report["model"]["task"] == "embedding" and report["served"]["embedding"][
            "inputs"] >= 9
        metrics = (await http.get("/metrics")).text
        assert 'dgr_embedding_requests_total{kind="embedding",outcome="ok"}' in metrics
        # the fields routers add at their defaults are taken, at other values refused
        routed = {"input": "hello world", "priority": 0, "add_special_tokens": True,
                  "truncate_prompt_tokens": None, "user": "u"}
        assert (await http.post("/v1/embeddings", json=routed)).status_code == 200
        refused = await http.post("/v1/embeddings", json=routed | {"truncate_prompt_tokens": 8})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == \
            "truncate_prompt_tokens"
        native = (await http.post("/embedding", json={"content": "hello world",
                                                      "embd_normalize": -1})).json()
        assert len(native) == 1 and len(native[0]["embedding"]) == 1
        assert (await http.get("/health")).json() == {"status": "ok"}


async def test_bad_inputs_are_clear_4xx(start_server, models):  # noqa: F811
    server = await start_server({"model_path": models["bert-mean-f32"], "n_ctx": 1024})
    bad = [{"input": []}, {"input": ""}, {"input": ["ok", ""]}, {"input": ["x"] * 10_000},
           {"input": [5, 10 ** 9]}, {"input": [[-3]]}, {"input": "word " * 2000},
           {"input": {"content": [{"type": "image_url", "image_url": {"url": "x"}}]}},
           {"input": "ok", "encoding_format": "int8"}, {"input": "ok", "dimensions": 0},
           {"input": "ok", "truncate": True}, {"input": None}, {"input": [True]},
           {"input": [[12, "a", 10 ** 6]]}]
    async with server.client() as client:
        for body in bad:
            got = await client.post("/v1/embeddings", json=body)
            assert 400 <= got.status_code < 500, (body, got.status_code, got.text)
            assert got.json()["error"]["message"]
        too_long = await client.post("/v1/embeddings", json={"input": "word " * 2000})
        assert "too large" in too_long.json()["error"]["message"]
        assert (await client.post("/rerank", json={"query": "a", "documents": ["b"]})
                ).status_code == 501
        # and the node still serves, token ids mixed with text among them (llama-server's
        # pieces of one input)
        for body in ({"input": "ok"}, {"input": [12, 34, "string", 56]},
                     {"input": [[12, 34], [12, "string", 34]]}):
            got = await client.post("/v1/embeddings", json=body)
            assert got.status_code == 200, got.text


async def test_rerank_jina_cohere_and_tei_shapes(start_server, models):  # noqa: F811
    server = await start_server({"model_path": models["rank"], "n_ctx": 1024})
    documents = TEXTS[:6]
    async with httpx.AsyncClient(base_url=server.url, timeout=30) as client:
        got = (await client.post("/v1/rerank", json={
            "model": "reranker", "query": "which animal", "documents": documents, "top_n": 3,
            "return_documents": True})).json()
        results = got["results"]
        assert len(results) == 3 and got["model"] == "reranker"
        scores = [r["relevance_score"] for r in results]
        assert scores == sorted(scores, reverse=True)
        assert all(r["document"]["text"] == documents[r["index"]] for r in results)
        assert got["usage"]["prompt_tokens"] > 0
        full = (await client.post("/rerank", json={"query": "which animal",
                                                   "documents": documents})).json()["results"]
        assert full[:3] == [{"index": r["index"], "relevance_score": r["relevance_score"]}
                            for r in results]
        tei = (await client.post("/rerank", json={"query": "which animal", "texts": documents,
                                                  "return_text": True})).json()
        assert [(t["index"], t["score"]) for t in tei] == [
            (r["index"], r["relevance_score"]) for r in full]
        for body in ({"query": "", "documents": ["a"]}, {"query": "q", "documents": []},
                     {"query": "q", "documents": [""]}, {"query": "q", "documents": "a"},
                     {"query": "q", "documents": ["a"], "top_n": 0}):
            assert (await client.post("/rerank", json=body)).status_code == 400
        assert (await client.post("/v1/embeddings", json={"input": "a"})).status_code == 501


async def test_generation_node_refuses_embeddings(start_server):  # noqa: F811
    server = await start_server()
    async with server.client() as client:
        got = await client.post("/v1/embeddings", json={"input": "hello"})
        assert got.status_code == 501 and "--embeddings" in got.json()["error"]["message"]


@pytest.mark.default_model
async def test_default_model_with_mean_pooling_is_bitwise(default_model):
    """A generation model started with --embeddings: a causal decoder whose step runs
    in ubatches of 512 over its KV cells, its 262k-token logits computed beside."""
    async with open_embedding_node(dgr.NodeConfig(model_path=str(default_model),
                                                  embeddings=True, pooling="mean",
                                                  n_threads=2)) as node:
        ids = [node.tokenize(t) for t in TEXTS] + [node.tokenize("long " * 600)]
        alone = [(await node.embed([x]))[0] for x in ids]
        together = await node.embed(ids[::-1])
        assert all(np.array_equal(a, b) for a, b in zip(alone, together[::-1]))
        assert alone[0].shape == (640,)


async def test_a_step_past_the_memory_budget_is_refused_at_start(models):
    with pytest.raises(dgr.DgrError, match="memory budget"):
        async with open_embedding_node(config(models["bert-mean-f32"],
                                              memory_budget_bytes=1 << 20)):
            pass


async def test_a_pooling_the_model_cannot_do_is_refused(start_server, models):  # noqa: F811
    with pytest.raises(dgr.DgrError, match="no classifier head"):
        async with open_embedding_node(config(models["bert-mean-f32"], rerank=True)):
            pass
    server = await start_server({"model_path": models["bert-mean-f32"], "pooling": "none"})
    async with server.client() as client:
        refused = await client.post("/v1/embeddings", json={"input": "hello world"})
        assert refused.status_code == 400 and "pooling" in refused.json()["error"]["message"]
        rows = (await client.post("/embedding", json={"content": "hello world"})).json()
        ids = (await client.post("/tokenize", json={"content": "hello world",
                                                    "add_special": True})).json()["tokens"]
        assert len(rows[0]["embedding"]) == len(ids)  # a vector per token
        assert (await client.post("/detokenize", json={"tokens": ids})).status_code == 200
        assert (await client.post("/tokenize", json={"prompt": "hi"})).status_code == 501


async def test_embeddings_beside_generation_share_weights_and_stay_bitwise(tmp_path):
    """--pooling alone on a generation model: one copy of the weights serves sessions
    and embeddings, their calls taking turns. Each vector is bitwise the one an
    embedding-only node gives, and each session's tokens and log-probabilities are
    those it gets with nothing beside it."""
    path = str(testmodel.write_test_model(tmp_path / "gen.gguf"))
    beside = config(path, pooling="mean")
    greedy = dgr.SamplingParams(max_tokens=24, logprobs=2, ignore_eos=True)
    prompts = invariance.PROMPTS[:4]
    together = [None] * len(prompts)
    async with dgr.open_node(beside) as node:
        solo = [await node.generate(p, greedy) for p in prompts]
        async with open_embedding_node(beside, beside=node) as embedder:
            assert embedder.engine_info["shares_weights"]
            ids = [embedder.tokenize(t) for t in TEXTS]
            vectors = []
            sessions_done = trio.Event()
            overlapped = 0  # embedding calls that ended while the sessions ran

            async def sessions():
                async with trio.open_nursery() as inner:
                    for i in range(len(prompts)):
                        inner.start_soon(session, i)
                sessions_done.set()

            async def session(i):
                together[i] = await node.generate(prompts[i], greedy)

            async with trio.open_nursery() as nursery:
                nursery.start_soon(sessions)
                while not sessions_done.is_set():
                    vectors += await embedder.embed(ids)
                    overlapped += not sessions_done.is_set()
            assert overlapped >= 1
    async with open_embedding_node(config(path, embeddings=True, pooling="mean")) as alone:
        assert not alone.engine_info["shares_weights"]
        expected = await alone.embed(ids)
    for a, b in zip(solo, together):
        assert invariance.first_difference(a, b) is None
    for i, vector in enumerate(vectors):
        assert np.array_equal(vector, expected[i % len(ids)]), i


async def test_one_server_generates_and_embeds_with_pooling(start_server, tmp_path):  # noqa: F811
    path = str(testmodel.write_test_model(tmp_path / "gen.gguf"))
    server = await start_server({"model_path": path, "pooling": "last", "n_ctx": 1024})
    async with server.client() as http:
        chat = await http.post("/v1/chat/completions", json={
            "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4})
        assert chat.status_code == 200 and chat.json()["choices"][0]["message"]
        got = await http.post("/v1/embeddings", json={"input": ["hello world", "again"]})
        assert got.status_code == 200 and len(got.json()["data"][1]["embedding"]) == 64
        report = (await http.get("/capabilities")).json()
        assert report["embeddings"]["model"]["pooling"] == "last"
        assert report["embeddings"]["model"]["shares_weights"]
        assert report["embeddings"]["invariance"] == report["invariance"]  # the same weights
        assert (report["task"], report["embeddings"]["task"]) == ("generation", "embedding")
        metrics = (await http.get("/metrics")).text
        assert "dgr_embedding_requests_total" in metrics
        # both kinds' admission families, each under its own prefix, once
        assert metrics.count("# TYPE dgr_admissions_rejected_total counter") == 1
        assert metrics.count("# TYPE dgr_embedding_admissions_rejected_total counter") == 1
        assert "dgr_embedding_admissions_total 1.0" in metrics
        refused = await http.post("/rerank", json={"query": "q", "documents": ["d"]})
        assert refused.status_code == 501


async def test_embeddings_beside_fit_in_what_the_generation_node_leaves(tmp_path):
    """The embedding context beside a generation node is checked against what that
    node's budget leaves; by default its host KV tier takes what the budget leaves (up
    to 8 GiB), and the refusal says so."""
    path = str(testmodel.write_test_model(tmp_path / "gen.gguf"))
    squeezed = config(path, pooling="mean", memory_budget_bytes=1 << 30)
    async with dgr.open_node(squeezed) as node:
        with pytest.raises(dgr.DgrError, match="--cache-ram"):
            async with open_embedding_node(squeezed, beside=node):
                pass
        assert (await node.generate("still serving", dgr.SamplingParams(max_tokens=2))).token_ids
    room = config(path, pooling="mean", memory_budget_bytes=1 << 30, cache_ram_bytes=64 << 20)
    async with dgr.open_node(room) as node, open_embedding_node(room, beside=node) as embedder:
        assert len((await embedder.embed([embedder.tokenize("hello")]))[0]) == 64


def test_embeddings_beside_generation_refuse_rpc_workers(tmp_path):
    """Layers on RPC workers are the generation node's alone: a clear refusal at start."""
    path = str(testmodel.write_test_model(tmp_path / "gen.gguf"))
    with pytest.raises(dgr.DgrError, match="--rpc"):
        load_embedder(config(path, pooling="mean", rpc_workers=("127.0.0.1:50052",)),
                      beside=object())
