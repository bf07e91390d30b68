"""Many LoRa adapters known, few loaded (dgr.adapters' KnownAdapters, --lora-dir,
--lora-modules, --max-loras, --lora-wait; patch 0023's per-row products): a session's
bits are its own in adapter groups of one row and of many; an adapter evicted and
loaded again gives the same bits; 64 known through 8 places all complete; a request
that cannot get a place within its wait is refused with a reason and nothing else
is lost; a name is never a path; /v1/models and /metrics tell."""

from pathlib import Path

import pytest
import trio

import dgr
from dgr import testmodel
from dgr.adapters import ADAPTERS_BUSY, KnownAdapters
from dgr.errors import AdapterError, AdmissionRejected, ModelNotFound
from test_server import start_server  # noqa: F401  (the fixture)

PROMPTS = [[1, 40, 41, 42, 43, 44, 45, 46, 47], [1, 60, 61, 62, 63],
           [1, 80, 81, 82, 83, 84, 85], [1, 90, 91, 92]]


@pytest.fixture(scope="module")
def lora_dir(tmp_path_factory):
    """The tiny model (f32) and a folder of 64 random adapters for it, a0 ... a63
    (ranks 4 and 8, on attention and feed-forward weights)."""
    folder = tmp_path_factory.mktemp("lora-dir")
    base = str(testmodel.write_test_model(tmp_path_factory.mktemp("base") / "base.gguf"))
    for i in range(64):
        testmodel.write_lora(base, folder / f"a{i}.gguf", seed=100 + i, rank=4 + 4 * (i % 2),
                             targets=(("attn_q", "ffn_down"), ("attn_v", "ffn_up"))[i % 3 == 0])
    return {"base": base, "dir": str(folder)}


def config(files, **overrides):
    return dgr.NodeConfig(**{"model_path": files["base"], "max_running": 8, "n_ctx": 4096,
                             "n_threads": 2, "prefill_chunk": 4, "prefix_cache": False,
                             "lora_dir": files["dir"]} | overrides)


def params(model=None, tokens=10):
    return dgr.SamplingParams(max_tokens=tokens, logprobs=2, model=model, ignore_eos=True)


def bits(result):
    return result.token_ids, result.token_logprobs, result.logprobs


async def test_groups_of_one_row_and_of_many_are_bitwise_alone(lora_dir):
    """Four sessions on a0 (a group of many rows), one each on a1 and a2, one on none,
    all in one batch: each session's bits are those it has alone."""
    plan = [("a0", 0), ("a0", 1), ("a0", 2), ("a0", 3), ("a1", 0), ("a2", 1), (None, 2)]
    async with dgr.open_node(config(lora_dir)) as node:
        alone = {(m, i): bits(await node.generate(PROMPTS[i], params(m))) for m, i in plan}
        assert alone["a0", 0] != alone["a1", 0]
        together = {}

        async def run(model, i):
            together[model, i] = bits(await node.generate(PROMPTS[i], params(model)))

        async with trio.open_nursery() as nursery:
            for model, i in plan:
                nursery.start_soon(run, model, i)
        assert together == alone
        assert max(record.rows for record in node.steps) >= 4  # they shared steps


async def test_an_evicted_adapter_loaded_again_gives_the_same_bits(lora_dir):
    async with dgr.open_node(config(lora_dir, max_loras=2)) as node:
        first = bits(await node.generate(PROMPTS[0], params("a5")))
        for model in ("a6", "a7"):  # a5, used least recently, makes room for a7
            await node.generate(PROMPTS[1], params(model))
        assert "a5" not in node.adapters.by_name
        again = bits(await node.generate(PROMPTS[0], params("a5")))
        counts = node.adapters.counts
        assert again == first
        assert counts["a5"]["loads"] == 2 and counts["a5"]["evictions"] == 1
        assert counts["a5"]["sessions"] == 2 and counts["a5"]["tokens"] == 20
        assert len(node.adapters.by_name) == 2


async def test_64_adapters_known_8_loaded_every_session_completes(lora_dir):
    async with dgr.open_node(config(lora_dir, max_loras=8)) as node:
        alone = {i: bits(await node.generate(PROMPTS[i % 4], params(f"a{i}", 4)))
                 for i in (0, 9, 63)}
        results = {}

        async def run(i):
            results[i] = bits(await node.generate(PROMPTS[i % 4], params(f"a{i}", 4)))

        async with trio.open_nursery() as nursery:
            for i in range(64):
                nursery.start_soon(run, i)
        assert len(results) == 64 and all(len(r[0]) == 4 for r in results.values())
        assert all(results[i] == alone[i] for i in alone)
        assert len(node.adapters.by_name) <= 8
        counts = node.adapters.counts
        assert sum(c["evictions"] for c in counts.values()) >= 56
        assert all(counts[f"a{i}"]["sessions"] >= 1 for i in range(64))


async def test_a_request_waits_at_most_lora_wait_then_is_refused_with_a_reason(lora_dir):
    async with dgr.open_node(config(lora_dir, max_loras=1, lora_wait_s=0.3)) as node:
        async with node.stream(PROMPTS[0], params("a1", 400)) as held:
            with pytest.raises(AdmissionRejected) as refused:
                await node.generate(PROMPTS[1], params("a2"))
            assert refused.value.reason == ADAPTERS_BUSY
            assert "--max-loras" in str(refused.value)
            # the base model and the loaded adapter are served meanwhile
            await node.generate(PROMPTS[1], params())
            await node.generate(PROMPTS[1], params("a1", 3))
            tokens = [c.token_id async for c in held if c.token_id is not None]
        assert len(tokens) == 400
        assert node.adapters.counts["a2"]["busy"] == 1
        # a1 idle now: a2 takes its place
        assert len((await node.generate(PROMPTS[1], params("a2"))).token_ids) == 10


async def test_a_waiting_request_gets_the_place_its_holder_leaves(lora_dir):
    async with dgr.open_node(config(lora_dir, max_loras=1, lora_wait_s=60)) as node:
        done = []

        async def first():
            done.append(("a1", await node.generate(PROMPTS[0], params("a1", 60))))

        async def second():
            await trio.sleep(0.05)
            done.append(("a2", await node.generate(PROMPTS[1], params("a2", 5))))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(first)
            nursery.start_soon(second)
        assert [name for name, _ in done] == ["a1", "a2"]
        assert node.adapters.counts["a1"]["evictions"] == 1


async def test_a_name_is_never_a_path(lora_dir, tmp_path):
    async with dgr.open_node(config(lora_dir)) as node:
        for name in ("../base/base", "a1/../a2", "/etc/passwd", ".hidden", "a1.gguf", "a64",
                     "a1\0"):
            with pytest.raises(ModelNotFound):
                await node.generate(PROMPTS[0], params(name))
        assert not node.adapters.by_name
        assert len((await node.generate(PROMPTS[0], params("a3"))).token_ids) == 10
    with pytest.raises(ValueError, match="not a folder"):
        KnownAdapters((), str(tmp_path / "missing"))
    with pytest.raises(ValueError, match="NAME=PATH"):
        KnownAdapters(("no-path",))


async def test_a_bad_file_in_the_folder_is_refused_saying_why_and_nothing_is_lost(lora_dir,
                                                                                   tmp_path):
    (tmp_path / "broken.gguf").write_bytes(b"GGUF" + bytes(range(60)))
    (tmp_path / "good.gguf").write_bytes(Path(lora_dir["dir"], "a1.gguf").read_bytes())
    async with dgr.open_node(config(lora_dir, lora_dir=str(tmp_path), max_loras=1)) as node:
        good = bits(await node.generate(PROMPTS[0], params("good")))
        with pytest.raises(AdapterError, match="not a GGUF adapter"):
            await node.generate(PROMPTS[0], params("broken"))
        assert list(node.adapters.by_name) == ["good"]  # the loaded one stays
        assert bits(await node.generate(PROMPTS[0], params("good"))) == good


async def test_lora_modules_by_name_and_json(lora_dir):
    modules = (f"first={lora_dir['dir']}/a1.gguf",
               '{"name": "second", "path": "%s/a2.gguf"}' % lora_dir["dir"])
    async with dgr.open_node(config(lora_dir, lora_dir=None, lora_modules=modules)) as node:
        by_module = bits(await node.generate(PROMPTS[0], params("second")))
        assert node.adapters.known.names() == ["first", "second"]
        with pytest.raises(ModelNotFound):
            await node.generate(PROMPTS[0], params("a2"))  # no --lora-dir
    async with dgr.open_node(config(lora_dir)) as node:
        assert bits(await node.generate(PROMPTS[0], params("a2"))) == by_module


async def test_models_and_metrics_tell(start_server, lora_dir):  # noqa: F811
    server = await start_server({"model_path": lora_dir["base"], "lora_dir": lora_dir["dir"],
                                 "max_loras": 2})
    async with server.client() as client:
        models = (await client.get("/v1/models")).json()["data"]
        assert {f"a{i}" for i in range(64)} <= {m["id"] for m in models}
        for name in ("a1", "a2", "a3"):
            reply = await client.post("/v1/completions", json={
                "model": name, "prompt": "Hello", "max_tokens": 3, "temperature": 0,
                "ignore_eos": True})
            assert reply.status_code == 200 and reply.json()["model"] == name
        metrics = (await client.get("/metrics")).text
    assert 'dgr_adapter_loads_total{adapter="a1"} 1.0' in metrics
    assert 'dgr_adapter_evictions_total{adapter="a1"} 1.0' in metrics
    assert 'dgr_adapter_tokens_total{adapter="a3"} 3.0' in metrics
    assert 'dgr_adapter_sessions_started_total{adapter="a2"} 1.0' in metrics
