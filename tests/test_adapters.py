"""LoRa adapters per session (dgr.adapters, patch 0018): an adapter changes the
output; a session's tokens and log-probabilities are bitwise the same alone, beside
sessions on other adapters and on none, and from the prefix cache; they equal the
base model with the adapter merged into its weights; a cached prefix is never
shared across adapters or scales; bad files are refused and the node keeps serving."""

import attrs
import numpy as np
import pytest
import trio

import dgr
from dgr import testmodel
from dgr.adapters import AdapterFile, adapter_files, parse_lora_flag
from dgr.errors import AdapterError, ModelNotFound

PROMPTS = [[1, 40, 41, 42, 43, 44, 45, 46, 47], [1, 60, 61, 62, 63],
           [1, 80, 81, 82, 83, 84, 85], [1, 90, 91, 92]]
TOKENS = 12


@pytest.fixture(scope="module")
def lora_files(tmp_path_factory):
    """The tiny model (f32), three random adapters for it, and the model with the
    first merged in."""
    folder = tmp_path_factory.mktemp("lora")
    base = str(testmodel.write_test_model(folder / "base.gguf"))
    deltas = testmodel.write_lora(base, folder / "x.gguf", seed=1)
    testmodel.write_lora(base, folder / "y.gguf", seed=2, targets=("attn_v", "ffn_up"))
    testmodel.write_lora(base, folder / "z.gguf", seed=3, rank=8)
    merged = str(testmodel.write_test_model(folder / "merged.gguf", deltas=deltas))
    return {"base": base, "merged": merged, **{n: str(folder / f"{n}.gguf") for n in "xyz"}}


def config(files, **overrides):
    return dgr.NodeConfig(**{"model_path": files["base"], "max_running": 8, "n_ctx": 4096,
                             "n_threads": 2, "prefill_chunk": 4,
                             "lora": (f"x={files['x']}", f"y={files['y']}:0.5",
                                      f"z={files['z']}")} | overrides)


def params(model=None, lora=None):
    return dgr.SamplingParams(max_tokens=TOKENS, logprobs=2, model=model, lora=lora)


def bits(result):
    return result.token_ids, result.token_logprobs, result.logprobs


async def test_adapters_change_output_and_each_session_is_bitwise_its_own(lora_files):
    async with dgr.open_node(config(lora_files, prefix_cache=False)) as node:
        alone = {}
        for model in (None, "x", "y", "z"):
            alone[model] = [bits(await node.generate(p, params(model))) for p in PROMPTS]
        for model in ("x", "y", "z"):
            assert alone[model] != alone[None]
        # every prompt on every adapter and on none, all in one batch
        together = {}

        async def run(model, i):
            together[model, i] = bits(await node.generate(PROMPTS[i], params(model)))

        async with trio.open_nursery() as nursery:
            for i in range(len(PROMPTS)):
                for model in (None, "x", "y", "z"):
                    nursery.start_soon(run, model, i)
        for (model, i), got in together.items():
            assert got == alone[model][i], (model, i)
        assert max(record.rows for record in node.steps) > len(PROMPTS)  # they shared steps


async def test_adapter_equals_the_merged_model(lora_files):
    async with dgr.open_node(config(lora_files)) as node:
        adapted = [await node.generate(p, params("x")) for p in PROMPTS]
    async with dgr.open_node(config(lora_files, model_path=lora_files["merged"],
                                    lora=())) as node:
        merged = [await node.generate(p, params()) for p in PROMPTS]
    for a, m in zip(adapted, merged):
        assert a.token_ids == m.token_ids
        assert np.max(np.abs(np.array(a.token_logprobs) - np.array(m.token_logprobs))) < 1e-3


async def test_prefix_cache_is_kept_per_adapter_and_scale(lora_files):
    prompt = list(range(1, 40))
    async with dgr.open_node(config(lora_files)) as node:
        first = {}
        for model, lora in ((None, None), ("x", None), (None, ((0, 1.0),)),
                            (None, ((0, 0.5),)), ("y", None)):
            got = await node.generate(prompt, params(model, lora))
            # x by name and by llama-server's id at scale 1 are one key
            shared = model is None and lora == ((0, 1.0),)
            assert (got.cached_tokens > 0) == shared, (model, lora)
            first[model, lora] = bits(got)
        assert first[None, ((0, 1.0),)] == first["x", None]
        assert first[None, ((0, 0.5),)] != first["x", None]
        # each again, now from its own cached prefix: the same bits
        for (model, lora), expected in first.items():
            again = await node.generate(prompt, params(model, lora))
            assert again.cached_tokens == len(prompt) - 1
            assert bits(again) == expected


async def test_moe_model_sessions_alone_and_together(tmp_path):
    base = str(testmodel.write_test_model(tmp_path / "moe.gguf", architecture="qwen3moe"))
    testmodel.write_lora(base, tmp_path / "q.gguf", seed=4, targets=("attn_q", "attn_output"))
    cfg = dgr.NodeConfig(model_path=base, max_running=4, n_ctx=2048, n_threads=2,
                         lora=(f"q={tmp_path / 'q.gguf'}",), prefix_cache=False)
    async with dgr.open_node(cfg) as node:
        alone = [bits(await node.generate(p, params(m))) for p in PROMPTS[:2] for m in (None, "q")]
        assert alone[0] != alone[1]
        results = [None] * 4

        async def run(i, p, m):
            results[i] = bits(await node.generate(p, params(m)))

        async with trio.open_nursery() as nursery:
            for i, (p, m) in enumerate((p, m) for p in PROMPTS[:2] for m in (None, "q")):
                nursery.start_soon(run, i, p, m)
        assert results == alone


async def test_bad_adapters_are_refused_and_the_node_keeps_serving(lora_files, tmp_path):
    other = str(testmodel.write_test_model(tmp_path / "other.gguf", n_embd=32, n_head=2,
                                           n_head_kv=1))
    testmodel.write_lora(other, tmp_path / "other-lora.gguf")
    corrupt = tmp_path / "corrupt.gguf"
    corrupt.write_bytes(open(lora_files["x"], "rb").read()[:200])
    garbage = tmp_path / "garbage.gguf"
    garbage.write_bytes(b"GGUF" + bytes(range(256)) * 4)
    async with dgr.open_node(config(lora_files, lora=(), max_loras=2)) as node:
        cases = {str(tmp_path / "none.gguf"): "not found",
                 lora_files["base"]: "not a LoRa adapter",
                 str(tmp_path / "other-lora.gguf"): "shapes",
                 str(corrupt): "GGUF", str(garbage): "GGUF"}
        for path, why in cases.items():
            with pytest.raises(AdapterError, match=why):
                await node.adapters.load("bad", path)
        await node.adapters.load("x", lora_files["x"])
        with pytest.raises(AdapterError, match="taken"):
            await node.adapters.load("x", lora_files["y"])
        await node.adapters.load("y", lora_files["y"])
        with pytest.raises(AdapterError, match="most"):
            await node.adapters.load("z", lora_files["z"])
        with pytest.raises(ModelNotFound):
            await node.generate(PROMPTS[0], params("nope"))
        with pytest.raises(AdapterError, match="invalid adapter id"):
            await node.generate(PROMPTS[0], params(lora=((7, 1.0),)))
        assert (await node.generate(PROMPTS[0], params("x"))).finish_reason == "length"
    async with dgr.open_node(config(lora_files, lora=(), memory_budget_bytes=None)) as node:
        node.adapters._room = lambda: 100
        with pytest.raises(AdapterError, match="memory budget"):
            await node.adapters.load("x", lora_files["x"])


async def test_unload_waits_for_the_sessions_using_it(lora_files):
    async with dgr.open_node(config(lora_files)) as node:
        alone = bits(await node.generate(PROMPTS[0], params("x")))
        engine = node._loop.batch.adapters
        async with node.stream(PROMPTS[0], params("x")) as chunks:
            node.adapters.unload("x")
            assert len(engine.state()["loaded"]) == 3  # its session still runs with it
            with pytest.raises(ModelNotFound):
                await node.generate(PROMPTS[0], params("x"))
            got = await chunks.read_all()
        assert [c.token_id for c in got if c.token_id is not None] == alone[0]
        await node.generate(PROMPTS[1], params())  # a step: the loop frees it
        assert len(engine.state()["loaded"]) == 2
        await node.adapters.load("x", lora_files["x"])  # the name and an entry again
        assert bits(await node.generate(PROMPTS[0], params("x"))) == alone


async def test_global_scales_apply_to_requests_naming_no_adapter(lora_files):
    files = adapter_files(dgr.NodeConfig(lora=(lora_files["x"],),
                                         lora_scaled=((lora_files["y"], "0.5"),)))
    assert files == [AdapterFile("x", lora_files["x"], 1.0, 1.0),
                     AdapterFile("y", lora_files["y"], 0.5, 0.5)]
    assert parse_lora_flag("a=/p/f.gguf:0.25") == AdapterFile("a", "/p/f.gguf", 0.25, 0.0)
    async with dgr.open_node(config(lora_files, lora=(lora_files["x"],))) as node:
        applied = bits(await node.generate(PROMPTS[0], params()))
        named = bits(await node.generate(PROMPTS[0], params("x")))
        assert applied == named
        node.adapters.set_global_scales({})
        assert bits(await node.generate(PROMPTS[0], params())) != named


@pytest.mark.default_model
async def test_default_model_sessions_on_adapters_alone_together_and_cached(default_model,
                                                                           tmp_path):
    """Gemma 3 270M Q4_K_M with rank-16 adapters on every attention weight: each
    session's bits alone equal its bits among sessions on other adapters and on none,
    and from the prefix cache."""
    for name, seed in (("a", 1), ("b", 2)):
        testmodel.write_lora(default_model, tmp_path / f"{name}.gguf", rank=16, seed=seed,
                             targets=("attn_q", "attn_k", "attn_v", "attn_output"), size=0.2)
    cfg = dgr.NodeConfig(model_path=default_model, max_running=12, n_ctx=8192, n_threads=2,
                         prefill_chunk=8, lora=(f"a={tmp_path / 'a.gguf'}",
                                                f"b={tmp_path / 'b.gguf'}"))
    prompts = ["The capital of France is", "Write a haiku about the sea:",
               "def fibonacci(n):", "Three facts about owls:"]
    runs = [(p, m) for p in prompts for m in (None, "a", "b")]
    async with dgr.open_node(cfg) as node:
        alone = {}
        for p, m in runs:
            alone[p, m] = bits(await node.generate(p, params(m)))
            await node.flush_prefix_cache()
        assert alone[prompts[0], "a"] != alone[prompts[0], None]
        together = {}

        async def run(p, m):
            together[p, m] = bits(await node.generate(p, params(m)))

        async with trio.open_nursery() as nursery:
            for p, m in runs:
                nursery.start_soon(run, p, m)
        assert together == alone
        for p, m in runs:  # now from each one's cached prefix
            got = await node.generate(p, params(m))
            assert got.cached_tokens > 0 and bits(got) == alone[p, m]


async def test_expert_weight_adapters_are_refused(tmp_path):
    import gguf

    base = str(testmodel.write_test_model(tmp_path / "moe.gguf", architecture="qwen3moe"))
    writer = gguf.GGUFWriter(str(tmp_path / "experts.gguf"), "qwen3moe")
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", 4.0)
    writer.add_tensor("blk.0.ffn_down_exps.weight.lora_a", np.zeros((8, 4, 128), np.float32))
    writer.add_tensor("blk.0.ffn_down_exps.weight.lora_b", np.zeros((8, 64, 4), np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    cfg = dgr.NodeConfig(model_path=base, max_running=2, n_ctx=1024, n_threads=2)
    async with dgr.open_node(cfg) as node:
        with pytest.raises(AdapterError, match="experts"):
            await node.adapters.load("e", str(tmp_path / "experts.gguf"))
        facts = node.capabilities()["adapters"]
        assert facts["tested"]["this_architecture"] and facts["adapters"] == []


async def test_loading_and_unloading_beside_running_sessions(lora_files):
    """Adapters loaded, used and unloaded over and over while sessions run: each
    session's bits are its own, and an unloaded adapter is freed once idle."""
    async with dgr.open_node(config(lora_files, lora=(f"x={lora_files['x']}",))) as node:
        long = dgr.SamplingParams(max_tokens=120, logprobs=1, ignore_eos=True)
        alone = {m: bits(await node.generate(PROMPTS[0], attrs.evolve(long, model=m)))
                 for m in (None, "x")}
        got = []

        async def run(m):
            got.append(bits(await node.generate(PROMPTS[0], attrs.evolve(long, model=m)))
                       == alone[m])

        async def churn():
            for i in range(8):
                name = "yz"[i % 2]
                await node.adapters.load(name, lora_files[name])
                await node.generate(PROMPTS[1], params(name))
                node.adapters.unload(name)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(churn)
            for i in range(6):
                nursery.start_soon(run, "x" if i % 2 else None)
        assert got == [True] * 6
        engine = node._loop.batch.adapters
        with trio.fail_after(60):  # a guard against a loop that never wakes, not a bound
            while len(engine.state()["loaded"]) > 1:  # the loop wakes to free them
                await trio.sleep(0.01)
