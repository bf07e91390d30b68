"""KV tiers on the tiny model: conversations beyond the pool taking turns, several
at once, restore their histories from host memory beside running sessions, bitwise
as computing them does, and leave the pool holding exactly its cached entries."""

import trio

import dgr

CONVERSATIONS = 12
TURNS = 3
AT_ONCE = 4
PARAMS = dgr.SamplingParams(max_tokens=8, temperature=0.0, logprobs=1)


def opening(i):
    """Conversation i's first prompt: 150 tokens of its own (12 of them pass the pool)."""
    return [1 + (7 * i + 3 * j + j * j) % 200 for j in range(150)]


async def rotate(node):
    """Every conversation takes TURNS turns, AT_ONCE conversations at a time; each turn
    sends the whole history and a question of its own. (conversation, turn) -> result."""
    histories = [opening(i) for i in range(CONVERSATIONS)]
    results = {}

    async def turn(i, t):
        prompt = histories[i] + [5 + i, 9 + t, 13]
        result = await node.generate(prompt, PARAMS)
        results[i, t] = result
        histories[i] = prompt + result.token_ids

    for t in range(TURNS):
        for first in range(0, CONVERSATIONS, AT_ONCE):
            async with trio.open_nursery() as nursery:
                for i in range(first, first + AT_ONCE):
                    nursery.start_soon(turn, i, t)
    return results


async def test_conversations_beyond_the_pool_restore_from_host_memory_bitwise(node_config):
    small_pool = dict(n_ctx=1024, max_running=AT_ONCE)
    async with dgr.open_node(node_config(**small_pool)) as node:
        got = await rotate(node)
        registry = node.telemetry.registry
        restores = registry.get_sample_value("dgr_kv_tier_restores_total")
        hits = registry.get_sample_value("dgr_kv_tier_hits_total", {"tier": "host"})
        # nothing of a finished session is left in the pool but its cached entry
        assert await node.kv_cells_in_use() == node.capabilities()["load"]["kv_cells_cached"]
        tiers = node.capabilities()["kv_tiers"]
        assert 0 < tiers["host"]["bytes"] <= tiers["host"]["max_bytes"]
    async with dgr.open_node(node_config(cache_ram_bytes=0, **small_pool)) as node:
        assert node.tiers is None
        expected = await rotate(node)
    # 12 histories of 150+ tokens in a 1,024-cell pool: most later turns find theirs
    # only in host memory
    assert restores == hits >= CONVERSATIONS
    for key, result in expected.items():
        assert got[key].token_ids == result.token_ids, key
        assert got[key].token_logprobs == result.token_logprobs, key
