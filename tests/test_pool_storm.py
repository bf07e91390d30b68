"""A randomized storm on a nearly full KV pool: sessions sharing system prompts, chat
continuations resent as token ids (their prefixes cached), staggered arrivals, long
answers and cancellations, 8 running in a pool that holds little more than their
reservations. Every session that completes is bitwise its solo run (tokens and
log-probabilities): a session finds cells in position order, or the node moves it
there, however the others came and went."""

import random

import pytest
import trio

import dgr
from dgr import _engine, weight_repack
from dgr.errors import DgrError
from dgr.invariance import first_difference
from dgr.testmodel import quantize, write_test_model

SYSTEMS = ["You are a terse assistant who answers in one line. ",
           "The following is a conversation between a pirate and a parrot about the sea. "]
POOL = dict(max_running=8, max_waiting=64, n_ctx=1024, n_batch=128, n_ubatch=128,
            prefill_chunk=16, n_threads=2)


def storm_plan(seed: int) -> list[dict]:
    """The storm's requests: when each arrives, its prompt (text, or a chat's earlier
    turn and answer resent as token ids: `after`), max_tokens, and when it is cancelled."""
    rng = random.Random(seed)
    plan = []
    for i in range(24):
        request = {"at": rng.uniform(0.0, 1.5), "max_tokens": rng.randint(20, 120),
                   "cancel_after": rng.uniform(0.05, 0.4) if rng.random() < 0.15 else None}
        if plan and rng.random() < 0.3:
            request["after"] = rng.randrange(len(plan))  # continues that request's chat
            request["text"] = f" and then {i}?"
        else:
            request["text"] = (rng.choice(SYSTEMS) + f"Question {i}: "
                               + "tell me more " * rng.randint(1, 20))
        plan.append(request)
    return plan


async def run_storm(node, plan, params_for):
    """Each request of the plan on `node`, at its time; {index: result} of those that
    completed (a continuation waits for the answer it continues)."""
    done: dict[int, trio.Event] = {i: trio.Event() for i in range(len(plan))}
    prompts: dict[int, list[int]] = {}
    results = {}

    async def one(i, request):
        await trio.sleep(request["at"])
        if "after" in request:
            await done[request["after"]].wait()
            before = results.get(request["after"])
            if before is None:  # the turn it continues was cancelled or failed
                done[i].set()
                return
            prompt = (prompts[request["after"]] + before.token_ids
                      + node.tokenize(request["text"], add_special=False))
        else:
            prompt = node.tokenize(request["text"])
        prompts[i] = prompt
        try:
            with trio.move_on_after(request["cancel_after"] or float("inf")):
                results[i] = await node.generate(prompt, params_for(request))
        except DgrError:
            pass
        done[i].set()

    async with trio.open_nursery() as nursery:
        for i, request in enumerate(plan):
            nursery.start_soon(one, i, request)
    return results, prompts


@pytest.fixture(scope="module")
def q4_k_model(tmp_path_factory):
    """A small llama in Q4_K_M: its Q4_K layer weights repacked by default where their
    batch kernel keeps pace (dgr.weight_repack)."""
    folder = tmp_path_factory.mktemp("storm")
    source = write_test_model(folder / "llama-f32.gguf", n_embd=256, n_layer=2, n_head=4,
                              n_head_kv=2, n_ff=256)
    return str(quantize(source, folder / "llama-Q4_K_M.gguf", "Q4_K_M"))


@pytest.mark.parametrize("seed", [11, 12, 13, 14, 15])
async def test_every_completed_session_of_a_storm_on_a_small_pool_is_bitwise(seed, tiny_model):
    await check_storm(seed, tiny_model)


async def test_a_storm_on_q4_k_weights_is_bitwise(q4_k_model):
    """The same on Q4_K_M weights: rows of every batch width take the repacked kernels
    (or, on AVX-512 without VNNI, the tiled ones) and keep their bits."""
    await check_storm(11, q4_k_model,
                      repacked=weight_repack.q4_k_batches_fast(_engine.system_info()))


async def check_storm(seed: int, model: str, repacked: bool = False) -> None:
    """Every session of storm_plan(seed) that completes on the small pool is bitwise its
    solo run on a node with room to spare (whose weights are repacked, if `repacked`)."""
    plan = storm_plan(seed)

    def params_for(request):
        return dgr.SamplingParams(max_tokens=request["max_tokens"], ignore_eos=True, logprobs=2)

    async with dgr.open_node(dgr.NodeConfig(model_path=model, **POOL)) as node:
        assert node.engine_info["repacked_bytes"] > 0 or not repacked
        results, prompts = await run_storm(node, plan, params_for)
        moves = node._loop.batch.tier_figures
    assert len(results) >= len(plan) // 2  # most of the storm completed
    assert moves["moves_failed"] == 0
    big = dgr.NodeConfig(model_path=model, **(POOL | {"n_ctx": 8192}), prefix_cache=False)
    async with dgr.open_node(big) as alone:
        for i, result in sorted(results.items()):
            solo = await alone.generate(prompts[i], params_for(plan[i]))
            assert first_difference(solo, result) is None, (i, first_difference(solo, result))
