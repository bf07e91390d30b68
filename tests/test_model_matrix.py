"""The invariance promise across architectures and weight types: random-weight models
written at test time (a llama with grouped-query attention and a qwen3moe with 8
experts, 2 per token, each in eleven weight types made by llama.cpp's quantizer; a dense
qwen3 in two; an lfm2
hybrid of short convolutions and attention, and a mamba, in two), every session
checked by `python -m dgr check-invariance`'s check: alone, 8 at once arriving
staggered, again (from the prefix cache where the model has one), and at once in a
nearly full pool drafting, tokens and log-probabilities bitwise, with speculation off, auto and always for the models with
recurrent state."""

import pytest

import dgr
from dgr import _engine, invariance, weight_repack
from dgr._step import step
from dgr.engine import repacked_tensors
from dgr.testmodel import QUANT_TYPES, quantize, write_test_model

# rows of 256 (K-quant blocks); 2 layers; 4 query heads over 2 KV heads
SHAPE = dict(n_embd=256, n_layer=2, n_head=4, n_head_kv=2, n_ff=256)
# lfm2: 6 layers, 4 short convolutions and 2 attending; weights whose greedy answers
# to PROMPTS reject some of the drafts they are offered
RECURRENT_SHAPE = dict(n_embd=256, n_layer=6, n_head=4, n_head_kv=2, n_ff=256, seed=7)


@pytest.fixture(scope="module")
def source_models(tmp_path_factory):
    folder = tmp_path_factory.mktemp("matrix")
    return {arch: write_test_model(folder / f"{arch}-f32.gguf", architecture=arch, **SHAPE)
            for arch in ("llama", "qwen3moe")} | {
            arch: write_test_model(folder / f"{arch}-f32.gguf", architecture=arch, **RECURRENT_SHAPE)
            for arch in ("lfm2", "mamba")}


@pytest.mark.parametrize("kind", QUANT_TYPES)
@pytest.mark.parametrize("arch", ["llama", "qwen3moe"])
async def test_every_session_is_bitwise_alone_together_and_cached(source_models, tmp_path, arch,
                                                                   kind):
    model = quantize(source_models[arch], tmp_path / f"{arch}-{kind}.gguf", kind)
    config = dgr.NodeConfig(model_path=str(model), max_running=8, n_ctx=4096, n_batch=256,
                            n_ubatch=256, prefill_chunk=16, n_threads=2)
    report = await invariance.check(config, invariance.PROMPTS, n_new=16)
    assert report["cached_tokens"] > 0  # the third run did take its prompts from the cache
    assert report["bitwise"], invariance.describe(report)


@pytest.mark.parametrize("kind", ["F32", "Q4_K_M"])
async def test_qwen3_dense_is_bitwise_alone_together_and_cached(tmp_path, kind):
    """Qwen3's dense decoder (llama's layers with q/k norms: the graph Qwen3-Embedding
    and Qwen3-Reranker run too) generates bitwise as the matrix's models do."""
    model = write_test_model(tmp_path / "qwen3-f32.gguf", architecture="qwen3", **SHAPE)
    if kind != "F32":
        model = quantize(model, tmp_path / f"qwen3-{kind}.gguf", kind)
    config = dgr.NodeConfig(model_path=str(model), max_running=8, n_ctx=4096, n_batch=256,
                            n_ubatch=256, prefill_chunk=16, n_threads=2)
    report = await invariance.check(config, invariance.PROMPTS, n_new=16)
    assert report["cached_tokens"] > 0
    assert report["bitwise"], invariance.describe(report)


@pytest.mark.parametrize("arch", ["llama", "qwen3moe"])
async def test_q4_k_repacked_for_decode_is_bitwise_alone_together_and_cached(source_models,
                                                                            tmp_path, arch):
    """--weight-repack decode: Q4_K weights take llama.cpp's repacked kernels, whose
    one-column GEMV rounds as the 4-column GEMM does (patch 0017)."""
    model = quantize(source_models[arch], tmp_path / f"{arch}-Q4_K_M.gguf", "Q4_K_M")
    config = dgr.NodeConfig(model_path=str(model), max_running=8, n_ctx=4096, n_batch=256,
                            n_ubatch=256, prefill_chunk=16, n_threads=2, weight_repack="decode")
    report = await invariance.check(config, invariance.PROMPTS, n_new=16)
    assert report["cached_tokens"] > 0
    assert report["bitwise"], invariance.describe(report)


@pytest.mark.parametrize("speculation", ["off", "auto", "always"])
@pytest.mark.parametrize("kind", ["F32", "Q4_K_M"])
@pytest.mark.parametrize("arch", ["lfm2", "mamba"])
async def test_models_with_recurrent_state_are_bitwise_with_and_without_drafts(
        source_models, tmp_path, arch, kind, speculation):
    """lfm2 rolls its state back past rejected drafts (llama.cpp's snapshots); mamba
    cannot, so it never drafts. Neither keeps prefixes: a state is a whole past."""
    model = (source_models[arch] if kind == "F32"
             else quantize(source_models[arch], tmp_path / f"{arch}-{kind}.gguf", kind))
    config = dgr.NodeConfig(model_path=str(model), max_running=8, n_ctx=4096, n_batch=256,
                            n_ubatch=256, prefill_chunk=16, n_threads=2, speculation=speculation)
    report = await invariance.check(config, invariance.PROMPTS, n_new=64)
    assert report["bitwise"], invariance.describe(report)
    assert report["cached_tokens"] == 0  # nothing claimed from a cache it does not keep
    # mamba never drafts. Whether lfm2's sessions find drafts, and have some rejected,
    # depends on their answers and on when they ran (the node's store of recent
    # outputs): the rollback itself is
    # test_a_rolled_back_state_continues_as_if_the_drafts_never_ran's
    if arch == "mamba":
        assert report["drafted"] == 0


@pytest.mark.parametrize("arch", ["lfm2", "mamba"])
def test_a_rolled_back_state_continues_as_if_the_drafts_never_ran(source_models, arch):
    """Three rows past a prompt, cut back by two (rejected drafts): lfm2's state rolls
    back from its snapshots and the next rows' logits are bitwise those of the run that
    never drafted; mamba's cannot, and says so (the node does not let it draft)."""
    prompt = [1, 40, 41, 42, 43, 44, 45, 46]
    drafts = [50, 51, 52]
    engine = _engine.Engine(str(source_models[arch]), n_ctx=256, n_seq_max=2, n_batch=64,
                            n_ubatch=64, kv_unified=True, state_rollback=4)
    try:
        want = [0] * (len(prompt) - 1) + [3]  # sample with log-probabilities
        n = len(prompt)
        for slot in (0, 1):
            step(engine, prompt, list(range(n)), [slot] * n, want)
        # slot 0 never drafts; slot 1 verifies three drafts and keeps the first
        plain = step(engine, [drafts[0], 60], [n, n + 1], [0, 0], [0, 3], n_logprobs=5)
        step(engine, drafts, [n, n + 1, n + 2], [1] * 3, [3] * 3, n_logprobs=5)
        rolled_back = engine.truncate(1, n + 1)
        assert rolled_back == (engine.info["state_rollback"] > 0)
        assert rolled_back == (arch == "lfm2")
        if rolled_back:
            assert engine.pos_max(1) == n
            after = step(engine, [60], [n + 1], [1], [3], n_logprobs=5)
            assert after[0][0] == plain[0][1]
            assert (after[1][0] == plain[1][1]).all() and (after[2][0] == plain[2][1]).all()
            assert after[3][0] == plain[3][1]
    finally:
        engine.close()


@pytest.mark.parametrize(("arch", "kind", "mode"), [
    ("llama", "Q4_0", "invariant"), ("llama", "IQ4_NL", "invariant"),
    ("qwen3moe", "MXFP4_MOE", "invariant"), ("llama", "Q4_K_M", "decode"),
    ("qwen3moe", "Q4_K_M", "decode")])
def test_the_named_modes_repack_the_weights_whose_repacked_kernels_are_row_invariant(
        source_models, tmp_path, arch, kind, mode):
    """The matrix runs these models with --weight-repack invariant (the default) and
    Q4_K_M also with "decode": their layer weights are in llama.cpp's CPU_REPACK
    buffer type; "off" repacks none, and "invariant" what "decode" does but where
    Q4_K's batch kernel falls behind (AVX-512 without VNNI)."""
    model = str(quantize(source_models[arch], tmp_path / f"{arch}-{kind}.gguf", kind))
    names = repacked_tensors(dgr.NodeConfig(model_path=model, weight_repack=mode), model)
    if not weight_repack.repacked_types(_engine.system_info(), mode):
        assert names == []
        return
    assert names and all(name.startswith("blk.") for name in names)
    engine = _engine.Engine(model, n_ctx=256, n_seq_max=1, repack=weight_repack.patterns(names))
    try:
        assert engine.info["weight_repack"] == "invariant"
        assert engine.info["repacked_bytes"] > 0
    finally:
        engine.close()
    assert repacked_tensors(dgr.NodeConfig(model_path=model, weight_repack="off"), model) == []
    if kind == "Q4_K_M":
        by_default = repacked_tensors(dgr.NodeConfig(model_path=model), model)
        same = (weight_repack.repacked_types(_engine.system_info(), "invariant")
                == weight_repack.repacked_types(_engine.system_info(), "decode"))
        assert (by_default == names) == same
