"""Exact speculative decoding on the default model (Gemma 3 270M Q4_K_M): with
drafts verified in the steps, every session's tokens, log-probabilities, text
and finish are bitwise those of a node that never drafts."""

import attrs
import pytest

import dgr

pytestmark = pytest.mark.default_model

FRUIT = ("apple, banana, cherry, damson, elderberry, fig, grape, huckleberry, kiwi, lemon, "
         "mango, nectarine, orange, papaya, quince, raspberry")
CODE = "\n".join(f"def area_{i}(w, h):\n    return w * h * {i}\n" for i in range(12))
LIST_GRAMMAR = 'root ::= item (", " item)*\nitem ::= [a-z]+'


def quoting_prompts(n):
    """Prompts whose answers quote them (what drafts come from), varied per index."""
    kinds = [lambda i: f"Copy the list exactly.\nList {i}: {FRUIT}\nCopy {i}: apple, banana,",
             lambda i: f"# file v{i}\n{CODE}\n# the same file, unchanged:\n{CODE[:120]}",
             lambda i: f"Repeat after me ({i}): the cat sat on the mat; the cat sat on the mat;"]
    return [kinds[i % len(kinds)](i) for i in range(n)]


def mixed_params(n, max_tokens=40):
    """Greedy, seeded sampling, a grammar, penalties, stop strings and min_tokens."""
    kinds = [dict(),
             dict(temperature=1.5, seed=11),
             dict(temperature=0.7, top_k=40, top_p=0.9, seed=5),
             dict(grammar=LIST_GRAMMAR),
             dict(repeat_penalty=1.3, frequency_penalty=0.4, presence_penalty=0.2),
             dict(stop=["huckleberry", "area_5"]),
             dict(min_tokens=8, temperature=0.5, seed=3, stop_token_ids=[108])]
    return [dgr.SamplingParams(max_tokens=max_tokens, logprobs=2, **kinds[i % len(kinds)])
            for i in range(n)]


async def _run(config, prompts, params):
    import trio

    results = [None] * len(prompts)
    async with dgr.open_node(config) as node:
        async def one(i):
            results[i] = await node.generate(prompts[i], params[i])

        async with trio.open_nursery() as nursery:
            for i in range(len(prompts)):
                nursery.start_soon(one, i)
        spec = node.capabilities()["speculation"]
    return results, spec


def _assert_same(plain, speculated):
    for i, (a, b) in enumerate(zip(plain, speculated)):
        assert b.token_ids == a.token_ids, i
        assert b.token_logprobs == a.token_logprobs, i  # bitwise
        assert b.logprobs == a.logprobs, i
        assert (b.text, b.finish_reason) == (a.text, a.finish_reason), i


def _accepted(spec):
    return sum(source["accepted"] for source in spec["sources"].values())


@pytest.mark.parametrize("concurrency", [1, 4, 16])
async def test_speculation_gives_the_bits_of_decoding_one_token_a_step(default_model,
                                                                       concurrency):
    prompts = quoting_prompts(concurrency if concurrency > 1 else 3)
    params = mixed_params(len(prompts)) if concurrency > 1 else [
        dgr.SamplingParams(max_tokens=40, logprobs=2),
        # hot enough that drafts are rejected: each rejection is a draw not taken
        dgr.SamplingParams(max_tokens=40, logprobs=2, temperature=1.5, seed=11),
        dgr.SamplingParams(max_tokens=40, logprobs=2, grammar=LIST_GRAMMAR)]
    config = dgr.NodeConfig(model_path=default_model, n_ctx=16384, max_running=16)
    if concurrency == 1:  # one session at a time
        plain, speculated = [], []
        for prompt, p in zip(prompts, params):
            plain += (await _run(attrs.evolve(config, speculation="off"), [prompt], [p]))[0]
            got, spec = await _run(attrs.evolve(config, speculation="always"), [prompt], [p])
            speculated += got
            assert spec["steps_with_drafts"] > 0
    else:
        plain, _ = await _run(attrs.evolve(config, speculation="off"), prompts, params)
        speculated, spec = await _run(attrs.evolve(config, speculation="always"), prompts, params)
        assert spec["steps_with_drafts"] > 0 and _accepted(spec) > 0
    _assert_same(plain, speculated)


async def test_speculation_past_2048_tokens_and_in_auto(default_model):
    """4 sessions quoting a context of about 2,300 tokens, drafts always and as the
    policy decides: bitwise the plain node's."""
    prompts = [f"Log {i}:\n" + "\n".join(f"{k}: {FRUIT}" for k in range(40)) + "\n40: apple,"
               for i in range(4)]
    params = mixed_params(4, max_tokens=32)
    config = dgr.NodeConfig(model_path=default_model, n_ctx=4 * 2600, max_running=4)
    plain, _ = await _run(attrs.evolve(config, speculation="off"), prompts, params)
    for mode in ("always", "auto"):
        got, spec = await _run(attrs.evolve(config, speculation=mode), prompts, params)
        _assert_same(plain, got)
        if mode == "always":
            assert _accepted(spec) > 0


async def test_speculation_drafts_a_tables_values_into_its_json(default_model):
    """A table turned into JSON under a grammar: from the second object on, the values
    source drafts the table's next values in the answer's words; bitwise the plain
    node's, drafts always and as the policy decides."""
    people = [("Ana", "Lisbon", 31), ("Ben", "Leeds", 45), ("Chen", "Xian", 28),
              ("Dara", "Cork", 39), ("Eli", "Haifa", 52), ("Fay", "Perth", 24)]
    table = "\n".join(f"| {name} | {city} | {age} |" for name, city, age in people)
    prompt = f"Table (name | city | age):\n{table}\n\nThe same table as JSON:\n"
    grammar = (r'root ::= "[" ws obj ("," ws obj)* ws "]"' "\n"
               r'obj ::= "{\"name\": \"" [A-Za-z]+ "\", \"city\": \"" [A-Za-z]+ "\", '
               r'\"age\": " [0-9]+ "}"' "\n" r"ws ::= [ \n]*")
    params = [dgr.SamplingParams(max_tokens=80, logprobs=2, grammar=grammar)]
    config = dgr.NodeConfig(model_path=default_model, n_ctx=4096, max_running=4)
    plain, _ = await _run(attrs.evolve(config, speculation="off"), [prompt], params)
    for mode in ("always", "auto"):
        got, spec = await _run(attrs.evolve(config, speculation=mode), [prompt], params)
        _assert_same(plain, got)
        if mode == "always":
            assert spec["sources"]["values"]["accepted"] > 0


async def test_speculation_with_n_samples_and_a_shared_prefix(default_model):
    """n = 3 seeded samples of one quoting prompt (the others take its prefix), and
    a second request sharing it from the cache: bitwise the plain node's."""
    prompt = quoting_prompts(1)[0]
    params = dgr.SamplingParams(max_tokens=32, logprobs=2, temperature=0.9, seed=42)
    config = dgr.NodeConfig(model_path=default_model, n_ctx=8192)

    async def samples(mode):
        async with dgr.open_node(attrs.evolve(config, speculation=mode)) as node:
            async with node.stream_group([prompt], params, n=3) as streams:
                out = [[(c.token_id, c.logprob, c.text) async for c in s] for s in streams]
            again = await node.generate(prompt + " cherry,", params)
            hits = node.telemetry.registry.get_sample_value("dgr_prefix_hits_total")
            return out, (again.token_ids, again.token_logprobs, again.text), hits

    plain = await samples("off")
    speculated = await samples("always")
    assert speculated == plain and plain[2] >= 3
