"""Checks on the default model (Gemma 3 270M Q4_K_M). Select with -m default_model."""

import pytest

from dgr import _batch
from dgr.consistency import Verdict

pytestmark = pytest.mark.default_model

PROMPTS = ["The capital of France is", "Write a haiku about the sea:", "def fibonacci(n):",
           "Once upon a time, in a small village,", "The three laws of thermodynamics are",
           "Translate to German: good morning, my friend.", "List five prime numbers:",
           "Water boils at"]
N_NEW = 24


@pytest.fixture(scope="module")
def gemma(default_model):
    eng = _batch.Engine(default_model, n_ctx=4096, n_seq_max=8, n_batch=512, n_ubatch=512)
    yield eng
    eng.close()


def solo_run(eng, prompt):
    eng.release(0)
    n = len(prompt)
    want = [0] * (n - 1) + [_batch.WANT_SAMPLE | _batch.WANT_LOGPROBS]
    sampled, _, top_lp, _ = eng.step(prompt, list(range(n)), [0] * n, want, n_logprobs=2)
    tokens, gaps, pos = [int(sampled[-1])], [float(top_lp[-1, 0] - top_lp[-1, 1])], n
    while len(tokens) < N_NEW:
        sampled, _, top_lp, _ = eng.step([tokens[-1]], [pos], [0], [3], n_logprobs=2)
        tokens.append(int(sampled[0]))
        gaps.append(float(top_lp[0, 0] - top_lp[0, 1]))
        pos += 1
    eng.release(0)
    return tokens, gaps


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
    prompts = [list(gemma.tokenize(p)) for p in PROMPTS]
    solo = [solo_run(gemma, p) for p in prompts]
    # Each prompt prefilled whole in its own step (its boundaries depend only on
    # itself), then all eight decode together, one row each per step.
    outs = []
    for slot, p in enumerate(prompts):
        n = len(p)
        sampled, *_ = gemma.step(p, list(range(n)), [slot] * n, [0] * (n - 1) + [1])
        outs.append([int(sampled[-1])])
    pos = [len(p) for p in prompts]
    for _ in range(N_NEW - 1):
        sampled, *_ = gemma.step([o[-1] for o in outs], pos, list(range(8)), [1] * 8)
        for slot in range(8):
            outs[slot].append(int(sampled[slot]))
            pos[slot] += 1
    verdict = Verdict()
    for i, ((tokens, gaps), batched) in enumerate(zip(solo, outs)):
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
