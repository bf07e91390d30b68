"""Checks on the default model (Gemma 3 270M Q4_K_M). Select with -m default_model."""

import contextlib
import sys
from pathlib import Path

import pytest

from dgr import _codes, _engine
from dgr.consistency import Verdict
from dgr.invariance import all_at_once as _all_at_once

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from benchmarks.batch_invariance import PROMPTS, solo, together  # noqa: E402

pytestmark = pytest.mark.default_model
N_NEW = 24


@pytest.fixture(scope="module")
def gemma(default_model):
    eng = _engine.Engine(default_model, n_ctx=4096, n_seq_max=8, n_batch=512, n_ubatch=512)
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


def test_word_forms_read_the_vocabulary_as_the_values_drafts_need(gemma):
    """A token's kind, and its twin (its text without the leading space) once learnt."""
    kinds, twins = gemma.word_forms()
    one = lambda text: int(gemma.tokenize(text, add_special=False)[0])  # noqa: E731
    assert kinds[one(" Ana")] == _codes.WordKind.WORD_SPACED
    assert kinds[one("Ana")] == kinds[one("3")] == _codes.WordKind.WORD_PART
    assert kinds[one(" ")] == _codes.WordKind.WORD_SPACE
    assert kinds[one(" |")] == _codes.WordKind.WORD_OTHER
    assert twins[one(" Ana"), 0] == -1  # not learnt yet
    gemma.learn_words([one(" Ana"), one(" Xian"), one(" |")])
    assert list(twins[one(" Ana")][:2]) == [1, one("Ana")]
    assert list(twins[one(" Xian")][:3]) == [2, *gemma.tokenize("Xian", add_special=False)]
    assert twins[one(" |"), 0] == -1  # no word: never learnt
    assert gemma.word_forms()[1] is twins


def test_greedy_batch_matches_solo_over_8_prompts(gemma):
    """The raw engine: each prompt prefilled in its own step, then all eight
    decoding in one llama_decode per step: the same tokens as alone."""
    prompts = [list(gemma.tokenize(p)) for p in PROMPTS]
    reference = [solo(gemma, p, N_NEW) for p in prompts]
    verdict = Verdict()
    for i, ((tokens, gaps), batched) in enumerate(
            zip(reference, together(gemma, prompts, N_NEW, one_step_prefill=False))):
        verdict.add(i, tokens, gaps, batched)
    print("batch vs solo:", verdict.as_dict())
    assert verdict.identical == 8, verdict.details


async def _without_prefix_cache(config, prompts, params):
    """Each prompt alone on a node that shares nothing: the bits to match."""
    import attrs

    import dgr

    async with dgr.open_node(attrs.evolve(config, prefix_cache=False)) as fresh:
        return [await fresh.generate(p, params) for p in prompts]


async def _solo_and_together(config, prompts, params, stagger_s=0.0):
    """Each prompt alone through the node, then all at once (session i arriving
    i * stagger_s seconds after the first, so its prefill chunks land in other
    sessions' decode steps)."""
    import dgr

    async with dgr.open_node(config) as node:
        alone = [await node.generate(p, params) for p in prompts]
        together = await _all_at_once(node, prompts, params, stagger_s)
    return alone, together


@contextlib.asynccontextmanager
async def _decoding_beside(node, prompt):
    """A session on `prompt` that has started decoding and keeps decoding while the
    body runs (its tokens read and dropped); cancelled when the body ends."""
    import trio

    import dgr

    async with trio.open_nursery() as nursery:
        async with node.stream(prompt, dgr.SamplingParams(max_tokens=10_000,
                                                          ignore_eos=True)) as running:
            await running.__anext__()

            async def read_on():
                async for _ in running:
                    pass

            nursery.start_soon(read_on)
            yield
            nursery.cancel_scope.cancel()


def _assert_bitwise(alone, together, label):
    verdict = Verdict()
    for i, (a, b) in enumerate(zip(alone, together)):
        gaps = [top[0][1] - top[1][1] for top in a.logprobs]
        verdict.add(i, a.token_ids, gaps, b.token_ids)
    print(f"{label}:", verdict.as_dict())
    assert verdict.identical == len(alone), verdict.details
    for a, b in zip(alone, together):
        assert b.token_logprobs == a.token_logprobs  # bitwise
        assert b.logprobs == a.logprobs


@pytest.mark.parametrize("concurrency", [1, 2, 4, 8, 16])
async def test_node_batching_matches_solo_on_the_default_model(default_model, concurrency):
    """Every session's tokens and log-probabilities equal its solo run's, all
    decode rows of a step in one llama_decode (small chunks and batches so that
    prefill chunks and decode rows mix over many steps)."""
    import dgr

    config = dgr.NodeConfig(model_path=default_model, max_running=16, n_ctx=8192, prefill_chunk=4,
                            n_batch=64, n_ubatch=64)
    greedy = dgr.SamplingParams(max_tokens=N_NEW, logprobs=2, ignore_eos=True)
    alone, together = await _solo_and_together(config, (PROMPTS * 2)[:concurrency], greedy)
    _assert_bitwise(alone, together, f"c={concurrency}")


async def test_node_batching_matches_solo_past_63_sessions(default_model):
    """72 sessions decoding at once, up to 72 decode rows in one llama_decode: 64 or
    more query rows of one stream, which share flash attention's tiles (patch 0013
    keeps every row's arithmetic its own). Each of the 8 prompts runs in
    9 sessions, admitted in one tick (token ids) and 16 prefills a step so that
    their decode steps overlap: all bitwise equal to its solo run."""
    import dgr

    config = dgr.NodeConfig(model_path=default_model, max_running=72, n_ctx=8192,
                            prefill_sessions_per_step=16)
    greedy = dgr.SamplingParams(max_tokens=16, logprobs=2, ignore_eos=True)
    async with dgr.open_node(config) as node:
        alone = [await node.generate(p, greedy) for p in PROMPTS]
        first = len(node.steps)
        together = await _all_at_once(node, [node.tokenize(p) for p in PROMPTS] * 9, greedy)
        assert max(len(r.decode) for r in list(node.steps)[first:]) >= 64
    _assert_bitwise(alone * 9, together, "c=72")


def long_prompts(engine, n, n_tokens):
    """n distinct prompts of about n_tokens tokens each."""
    topics = ["rivers", "mountains", "trains", "bread", "clocks", "bees", "ships", "glass",
              "maps", "salt", "kites", "tea", "bridges", "owls", "paper", "wool"]
    prompts = []
    for i in range(n):
        words = []
        k = 0
        while len(engine.tokenize(" ".join(words))) < n_tokens:
            words.append(f"Note {k} on {topics[i % len(topics)]} (part {i}): they matter to "
                         f"people in {['spring', 'summer', 'autumn', 'winter'][k % 4]}.")
            k += 1
        prompts.append(" ".join(words) + f" In short, {topics[i % len(topics)]} are")
    return prompts


@pytest.mark.parametrize("concurrency,context", [(8, 600), (16, 600), (4, 2100)])
async def test_node_batching_matches_solo_past_512_and_2048_tokens(default_model, gemma,
                                                                   concurrency, context):
    """Contexts past 512 tokens (flash attention splits the KV range of a lone
    row there) and past 2,048, with the node's defaults but for the context
    size, sessions arriving at different times: bitwise equal to solo."""
    import dgr

    prompts = long_prompts(gemma, concurrency, context)
    config = dgr.NodeConfig(model_path=default_model, max_running=16, n_ctx=16 * 2304)
    greedy = dgr.SamplingParams(max_tokens=16, logprobs=2, ignore_eos=True)
    alone, together = await _solo_and_together(config, prompts, greedy, stagger_s=0.2)
    _assert_bitwise(alone, together, f"c={concurrency}, ~{context} tokens")


async def test_sessions_starting_in_freed_cells_match_solo(default_model, gemma):
    """One KV pool, 4 running and 6 waiting sessions of different lengths: each
    waiting session starts in cells that finished ones freed among the running
    sessions' cells. Every session is still bitwise equal to its solo run."""
    import dgr

    prompts = long_prompts(gemma, 10, 300)
    params = [dgr.SamplingParams(max_tokens=4 + 5 * (i % 4), logprobs=2, ignore_eos=True)
              for i in range(len(prompts))]
    config = dgr.NodeConfig(model_path=default_model, max_running=4, n_ctx=8192)
    assert config.kv_unified
    async with dgr.open_node(config) as node:
        alone = [await node.generate(p, q) for p, q in zip(prompts, params)]
        together = await _all_at_once(node, prompts, params, stagger_s=0.05)
    _assert_bitwise(alone, together, "freed cells")


async def test_a_6000_token_prompt_runs_with_the_defaults(default_model, gemma):
    """The pool is the model's training context and one session may use all of it."""
    import dgr

    prompt = long_prompts(gemma, 1, 6000)[0]
    async with dgr.open_node(dgr.NodeConfig(model_path=default_model)) as node:
        kv = node.capabilities()["budgets"]["kv"]
        assert kv["cells_total"] == gemma.info["n_ctx_train"] == 32768
        assert kv["cells_per_session"] == kv["cells_total"]
        result = await node.generate(prompt, dgr.SamplingParams(max_tokens=8, ignore_eos=True))
    assert result.prompt_tokens >= 6000
    assert len(result.token_ids) == 8


async def test_a_shared_1000_token_prefix_gives_the_bits_of_a_fresh_node(default_model, gemma):
    """Sessions reusing a 1,000+-token prefix, from the cache and from a running
    session that decodes beside them: tokens and log-probabilities bitwise those
    of the same prompts on a fresh node; only the rest is prefilled."""
    import dgr

    preamble = long_prompts(gemma, 1, 1100)[0]
    prompts = [preamble + f" Question {i}: what matters most here?" for i in range(3)]
    params = dgr.SamplingParams(max_tokens=12, logprobs=2, ignore_eos=True)
    config = dgr.NodeConfig(model_path=default_model, n_ctx=16384)
    expected = await _without_prefix_cache(config, prompts, params)
    async with dgr.open_node(config) as node:
        got = [await node.generate(prompts[0], params), await node.generate(prompts[1], params)]
        async with _decoding_beside(node, preamble + " A long answer follows."):
            got.append(await node.generate(prompts[2], params))
        reused = node.telemetry.registry.get_sample_value("dgr_prefix_tokens_reused_total")
        assert reused >= 3 * 1100  # to the token, not whole 256-token chunks
    _assert_bitwise(expected, got, "shared prefix")


async def test_a_chat_turn_reusing_the_previous_answer_gives_the_bits_of_a_fresh_node(
        default_model, gemma):
    """A conversation's next turn resends the first turn's prompt and answer: it
    takes all of them from the cache, to the token (the answer's KV was computed
    by decode rows beside other sessions, the prompt's in 256-token chunks), and
    its tokens and log-probabilities are bitwise those of a fresh node
    prefilling the whole history in chunks."""
    import dgr

    params = dgr.SamplingParams(max_tokens=24, logprobs=2, ignore_eos=True)
    config = dgr.NodeConfig(model_path=default_model, n_ctx=16384)
    first = long_prompts(gemma, 1, 700)[0] + " User: tell me more."
    async with dgr.open_node(config) as node:
        async with _decoding_beside(node, long_prompts(gemma, 1, 300)[0]):  # company for turn 1
            turn1 = await node.generate(first, params)
        history = (node.tokenize(first) + turn1.token_ids
                   + node.tokenize(" User: and after that?", add_special=False))
        reused_before = node.telemetry.registry.get_sample_value("dgr_prefix_tokens_reused_total")
        turn2 = await node.generate(history, params)
        reused = (node.telemetry.registry.get_sample_value("dgr_prefix_tokens_reused_total")
                  - reused_before)
        assert reused == len(node.tokenize(first)) + len(turn1.token_ids) - 1
    expected, = await _without_prefix_cache(config, [history], params)
    _assert_bitwise([expected], [turn2], "next chat turn")


async def test_n_samples_share_one_prefill_and_match_solo(default_model, gemma):
    """n = 4 samples of a 700-token prompt: one prefill, the others take its KV;
    every sample's tokens and log-probabilities are bitwise the solo run's."""
    import dgr

    prompt = long_prompts(gemma, 1, 700)[0]
    greedy = dgr.SamplingParams(max_tokens=8, logprobs=2, ignore_eos=True)
    config = dgr.NodeConfig(model_path=default_model, n_ctx=8192)
    alone, = await _without_prefix_cache(config, [prompt], greedy)
    async with dgr.open_node(config) as node:
        async with node.stream_group([prompt], greedy, n=4) as streams:
            samples = [[c async for c in s] for s in streams]
        hits = node.telemetry.registry.get_sample_value("dgr_prefix_hits_total")
    assert hits == 3
    for chunks in samples:
        rows = [c for c in chunks if c.token_id is not None]
        assert [c.token_id for c in rows] == alone.token_ids
        assert [c.logprob for c in rows] == alone.token_logprobs  # bitwise


async def test_a_burst_behind_one_system_prompt_prefills_it_once(default_model, gemma):
    """4 sessions arriving together behind a 1,100-token preamble: the first
    prefills it, the others wait for it and take it; all bitwise equal
    to the same prompts on a node without the prefix cache."""
    import dgr

    preamble = long_prompts(gemma, 1, 1100)[0]
    prompts = [preamble + f" Burst question {i}?" for i in range(4)]
    params = dgr.SamplingParams(max_tokens=8, logprobs=2, ignore_eos=True)
    config = dgr.NodeConfig(model_path=default_model, n_ctx=16384)
    expected = await _without_prefix_cache(config, prompts, params)
    async with dgr.open_node(config) as node:
        got = await _all_at_once(node, prompts, params)
        hits = node.telemetry.registry.get_sample_value("dgr_prefix_hits_total")
        reused = node.telemetry.registry.get_sample_value("dgr_prefix_tokens_reused_total")
    assert hits == 3 and reused >= 3 * 1100
    _assert_bitwise(expected, got, "burst behind a shared prefix")


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {
        "person": {"type": "object", "properties": {
            "name": {"type": "string", "maxLength": 16}, "age": {"type": "integer"}},
            "required": ["name", "age"]},
        "city": {"type": "string", "maxLength": 16}}, "required": ["person", "city"]},
    {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]},
                                      "sure": {"type": "boolean"}}, "required": ["color", "sure"]},
    {"type": "object", "properties": {"scores": {"type": "array", "items": {"type": "integer"},
                                                 "minItems": 1, "maxItems": 4}},
     "required": ["scores"]},
])
async def test_json_schema_output_parses_and_validates(default_model, schema):
    """Structured output on the default model: under a schema's grammar (llama-cpp-
    python's converter) the output parses and validates, greedy and sampled."""
    import json

    import jsonschema
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    import dgr

    grammar = json_schema_to_gbnf(json.dumps(schema))
    prompt = "Describe a made-up person from a city as JSON:"
    async with dgr.open_node(dgr.NodeConfig(model_path=default_model, n_ctx=4096)) as node:
        for params in (dgr.SamplingParams(max_tokens=160, grammar=grammar),
                       dgr.SamplingParams(max_tokens=160, grammar=grammar, temperature=0.8, seed=3)):
            result = await node.generate(prompt, params)
            assert result.finish_reason == "stop", result.text
            jsonschema.validate(json.loads(result.text), schema)
