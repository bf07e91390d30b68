"""Checks on the default model (Gemma 3 270M Q4_K_M). Select with -m default_model."""

import sys
from pathlib import Path

import pytest

from dgr import _batch
from dgr.consistency import Verdict

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.batch_invariance import PROMPTS, solo, together  # noqa: E402

pytestmark = pytest.mark.default_model
N_NEW = 24


@pytest.fixture(scope="module")
def gemma(default_model):
    eng = _batch.Engine(default_model, n_ctx=4096, n_seq_max=8, n_batch=512, n_ubatch=512)
    yield eng
    eng.close()


def test_default_model_facts(gemma):
    info = gemma.info
    assert info["architecture"] == "gemma3"
    assert info["n_vocab"] == 262144
    assert info["n_swa"] > 0
    assert info["model_bytes"] > 100 << 20
    # buffer sizes read from llama.cpp's log at context creation (Gemma's log is long)
    for key in ("kv_bytes", "kv_bytes_per_cell", "compute_bytes", "output_bytes"):
        assert info[key] > 0, key
    assert info["output_bytes"] >= info["n_seq_max"] * info["logits_bytes_per_output"]


def test_greedy_batch_matches_solo_over_8_prompts(gemma):
    """The raw engine against the correctness bar: each prompt prefilled in its
    own step, then all eight decoding in one call per step (beyond the 7-row
    groups the node keeps), so near-ties may flip but nothing else."""
    prompts = [list(gemma.tokenize(p)) for p in PROMPTS]
    reference = [solo(gemma, p, N_NEW) for p in prompts]
    verdict = Verdict()
    for i, ((tokens, gaps), batched) in enumerate(
            zip(reference, together(gemma, prompts, N_NEW, one_step_prefill=False))):
        verdict.add(i, tokens, gaps, batched)
    print("batch vs solo:", verdict.as_dict())
    assert verdict.unexplained == 0, verdict.details
    assert verdict.identical + verdict.near_tie == 8


@pytest.mark.parametrize("concurrency", [1, 2, 4, 8, 16])
async def test_node_batching_matches_solo_on_the_default_model(default_model, concurrency):
    """By construction (one chunk per llama_decode, at most 7 decode rows per
    call) every session's tokens and log-probabilities equal its solo run's."""
    import trio

    import dgr

    config = dgr.NodeConfig(model_path=default_model, max_running=16, n_ctx=8192, prefill_chunk=4,
                            n_batch=64, n_ubatch=64)
    greedy = dgr.SamplingParams(max_tokens=N_NEW, logprobs=2, ignore_eos=True)
    prompts = (PROMPTS * 2)[:concurrency]
    async with dgr.open_node(config) as node:
        solo = [await node.generate(p, greedy) for p in prompts]
        together = [None] * concurrency

        async def run(i):
            together[i] = await node.generate(prompts[i], greedy)

        async with trio.open_nursery() as nursery:
            for i in range(concurrency):
                nursery.start_soon(run, i)
    verdict = Verdict()
    for i, (alone, batched) in enumerate(zip(solo, together)):
        gaps = [top[0][1] - top[1][1] for top in alone.logprobs]
        verdict.add(i, alone.token_ids, gaps, batched.token_ids)
    print(f"c={concurrency}:", verdict.as_dict())
    assert verdict.identical == concurrency, verdict.details
    for alone, batched in zip(solo, together):
        assert batched.token_logprobs == alone.token_logprobs  # bitwise
