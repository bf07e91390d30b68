"""Priorities, tenants and parking on the tiny model: a session parked for one that
outranks it (by priority, by fair share, with its KV kept in the host tier or
computed again) resumes bitwise what it would have generated alone; a full queue
refuses the lowest-ranked; tenants' bounds refuse only their own."""

import pytest
import trio

import dgr
from dgr.errors import AdmissionRejected
from dgr.sequence import Phase
from dgr.spec import Requester

LOW, HIGH = Requester("batch", 5), Requester("chat", 0)
PROMPTS = ["The quick brown fox jumps over the lazy dog", "in the beginning there was"]


def sampled(seed: int, max_tokens: int = 48) -> dgr.SamplingParams:
    """Sampling whose chain carries state from token to token: a seeded draw, penalties
    over what it generated, top-k and min_tokens; log-probabilities reported."""
    return dgr.SamplingParams(max_tokens=max_tokens, temperature=0.9, top_k=40, seed=seed,
                              repeat_penalty=1.3, repeat_last_n=16, presence_penalty=0.2,
                              min_tokens=max_tokens, logprobs=3)


def outputs(result):
    return result.token_ids, result.token_logprobs, result.logprobs


async def alone(config, prompts, params):
    async with dgr.open_node(config) as node:
        return [outputs(await node.generate(p, ps)) for p, ps in zip(prompts, params)]


async def read_stalled(node, prompt, params, requester, got, stall_after, go):
    """Stream a session, taking `stall_after` tokens, then none until `go` is set (its
    session waits on its slot, decoding, without credits), then the rest."""
    async with node.stream(prompt, params, requester=requester) as chunks:
        tokens, logprobs, tops, sessions = [], [], [], [chunks.session]
        async for chunk in chunks:
            if chunk.token_id is not None:
                tokens.append(chunk.token_id)
                logprobs.append(chunk.logprob)
                tops.append(chunk.top_logprobs)
                if len(tokens) == stall_after:
                    await go.wait()
        got.append(((tokens, logprobs, tops), sessions[0]))


@pytest.mark.parametrize("settings", [{}, {"cache_ram_bytes": 0}, {"prefix_cache": False}],
                         ids=["host-tier", "no-tier", "no-prefix-cache"])
async def test_a_session_parked_for_a_higher_priority_resumes_bitwise(node_config, settings):
    config = node_config(max_running=2, scheduling_policy="priority", reply_buffer=4,
                         **settings)
    params = [sampled(7), sampled(11)]
    solo = await alone(config, PROMPTS, params)
    async with dgr.open_node(config) as node:
        got, go = [], trio.Event()
        async with trio.open_nursery() as nursery:
            for prompt, ps in zip(PROMPTS, params):
                nursery.start_soon(read_stalled, node, prompt, ps, LOW, got, 3, go)
            with trio.fail_after(30):
                while node.active_sessions < 2 or any(
                        s is None or len(s.generated) < 3 for s in node._loop.slot_sessions()):
                    await trio.sleep(0.01)
                # both slots decode: the chat parks one of them, twice over
                for seed in (1, 2):
                    high = await node.generate("hello", dgr.SamplingParams(
                        max_tokens=8, seed=seed), requester=HIGH)
                    assert len(high.token_ids) == 8
                go.set()
        parked = [session for _, session in got if session.parks]
        assert parked and node.telemetry.registry.get_sample_value("dgr_parks_total") >= 2
        assert node.telemetry.registry.get_sample_value("dgr_resumes_total") >= 2
        by_prompt = {session.spec.prompt[0:3] == node.tokenize(PROMPTS[0])[0:3]: out
                     for out, session in got}
        assert by_prompt[True] == solo[0] and by_prompt[False] == solo[1]
        assert_every_kv_operation_published(node)


def assert_every_kv_operation_published(node):
    """Every KV operation the node asked for was applied and published: none is left
    for a later restoring start to wait on."""
    batch = node._loop.batch
    assert batch.kv_ops_published == batch.kv_ops_queued


async def test_a_session_parked_three_times_resumes_bitwise_each_time(node_config):
    config = node_config(max_running=1, scheduling_policy="priority")
    params = sampled(13, max_tokens=400)
    solo, = await alone(config, PROMPTS[:1], [params])
    async with dgr.open_node(config) as node:
        got = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_stalled, node, PROMPTS[0], params, LOW, got, 0,
                               trio.Event())
            for seed, after in enumerate((10, 60, 110)):
                with trio.fail_after(30):
                    while not any(s is not None and len(s.generated) >= after
                                  for s in node._loop.slot_sessions()):
                        await trio.sleep(0.001)
                await node.generate("hello", dgr.SamplingParams(max_tokens=4, seed=seed),
                                    requester=HIGH)
        (out, session), = got
        assert session.parks == 3 and out == solo
        assert_every_kv_operation_published(node)


async def test_a_full_pool_parks_by_cells_and_the_session_resumes_bitwise(node_config):
    # 256 cells (n_ctx rounds up): the batch session reserves 39 + 48, the chat about
    # 150 + 40, which do not fit beside it: the chat needs its cells, not a slot
    config = node_config(max_running=4, n_ctx=256, scheduling_policy="priority",
                         reply_buffer=4)
    params = sampled(5)
    solo, = await alone(config, PROMPTS[:1], [params])
    async with dgr.open_node(config) as node:
        got, go = [], trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_stalled, node, PROMPTS[0], params, LOW, got, 5, go)
            with trio.fail_after(30):
                while node.active_sessions < 1 or not any(
                        s is not None and len(s.generated) >= 5
                        for s in node._loop.slot_sessions()):
                    await trio.sleep(0.01)
                high = await node.generate("hello " * 30, dgr.SamplingParams(max_tokens=40),
                                           requester=HIGH)
                assert len(high.token_ids) == 40
                go.set()
        (out, session), = got
        assert session.parks == 1 and out == solo


async def test_fair_shares_park_a_tenant_far_ahead_for_one_that_waits(node_config):
    config = node_config(max_running=1, scheduling_policy="priority", fair_drift=20.0)
    params = sampled(3, max_tokens=200)
    solo, = await alone(config, PROMPTS[:1], [params])
    async with dgr.open_node(config) as node:
        got = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(read_stalled, node, PROMPTS[0], params, Requester("a"), got,
                               0, trio.Event())
            with trio.fail_after(30):
                while not any(s is not None and len(s.generated) >= 5
                              for s in node._loop.slot_sessions()):
                    await trio.sleep(0.001)
                # b starts level with a (VTC's lift) and waits at the same priority: once
                # a is 20 virtual tokens ahead, a is parked for it
                other = await node.generate("hello", dgr.SamplingParams(max_tokens=4),
                                            requester=Requester("b"))
                assert len(other.token_ids) == 4
        (out, session), = got
        assert session.parks == 1 and out == solo


async def test_fcfs_keeps_arrival_order_and_parks_nothing(node_config):
    async with dgr.open_node(node_config(max_running=1)) as node:
        order = []

        async def run(name, requester):
            await node.generate("hi", dgr.SamplingParams(max_tokens=16), requester=requester)
            order.append(name)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "low", LOW)
            await trio.sleep(0.001)
            nursery.start_soon(run, "low2", LOW)
            await trio.sleep(0.001)
            nursery.start_soon(run, "high", HIGH)
        assert order == ["low", "low2", "high"]
        assert node.capabilities()["scheduling"]["parking"]["why_not"] == \
            "--scheduling-policy fcfs"


async def test_a_full_queue_refuses_the_lowest_priority_waiting_session(node_config):
    config = node_config(max_running=1, max_waiting=1, scheduling_policy="priority",
                         reply_buffer=2)
    async with dgr.open_node(config) as node:
        outcomes = {}

        async def run(name, requester):
            try:
                await node.generate("hi", dgr.SamplingParams(max_tokens=8), requester=requester)
                outcomes[name] = "ok"
            except AdmissionRejected as exc:
                outcomes[name] = exc.reason

        # the running session's reader takes nothing: it holds the slot
        async with node.stream("count", dgr.SamplingParams(max_tokens=100, ignore_eos=True),
                               requester=LOW) as running:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(run, "waiting", LOW)
                with trio.fail_after(10):
                    while node.waiting_sessions < 1:
                        await trio.sleep(0.001)
                nursery.start_soon(run, "high", Requester("chat", -1))
            assert running.session.parks == 1  # the high one took its slot for a while
        assert outcomes == {"waiting": "preempted_from_queue", "high": "ok"}
        assert node.telemetry.registry.get_sample_value(
            "dgr_admissions_rejected_total", {"reason": "preempted_from_queue"}) == 1


async def test_a_tenant_over_its_bounds_is_refused_and_the_other_is_not(node_config, tmp_path):
    keys = tmp_path / "keys"
    keys.write_text("kb tenant=batch max_waiting=1\nkc tenant=chat weight=2\n")
    async with dgr.open_node(node_config(max_running=1, api_keys=str(keys))) as node:
        outcomes = []
        long = dgr.SamplingParams(max_tokens=200, ignore_eos=True)

        async def run(requester):
            try:
                await node.generate("hi", long, requester=requester)
                outcomes.append((requester.tenant, "ok"))
            except AdmissionRejected as exc:
                outcomes.append((requester.tenant, exc.reason))

        async with trio.open_nursery() as nursery:
            for _ in range(3):  # one runs, one waits, the third is past the tenant's bound
                nursery.start_soon(run, Requester("batch"))
            while node.in_flight < 2:
                await trio.sleep(0.001)
            nursery.start_soon(run, Requester("chat"))
        assert sorted(outcomes) == [("batch", "ok"), ("batch", "ok"),
                                    ("batch", "tenant_queue_full"), ("chat", "ok")]
        facts = node.capabilities()["scheduling"]["tenants"]
        assert facts["chat"]["weight"] == 2.0 and facts["batch"]["max_waiting"] == 1
        assert node.statistics()["tenant:batch:waiting_sessions"]["capacity"] == 1
        families = node.telemetry.exposition().decode()
        assert 'dgr_tenant_admissions_rejected_total{reason="tenant_queue_full",' \
               'tenant="batch"} 1.0' in families
        assert 'dgr_tenant_tokens_total{kind="output",priority="0",tenant="chat"} 200.0' \
            in families
        assert 'dgr_tenant_time_to_first_token_seconds_count{priority="0",tenant="chat"} 1.0' \
            in families


async def test_a_parked_session_cancelled_by_its_client_leaves_cleanly(node_config):
    config = node_config(max_running=1, scheduling_policy="priority", reply_buffer=2)
    long = dgr.SamplingParams(max_tokens=100, ignore_eos=True)
    async with dgr.open_node(config) as node:
        async with node.stream("count", long, requester=LOW) as low:
            await low.__anext__()
            # the high session's reader takes nothing: it keeps the slot, the low one parked
            async with node.stream("hi", long, requester=HIGH) as high:
                with trio.fail_after(10):
                    while not low.session.parked:
                        await trio.sleep(0.001)
                node.cancel(low)
                with trio.fail_after(10):
                    while low.session.phase is not Phase.FINISHED:
                        await trio.sleep(0.001)
                assert node.statistics()["parked_sessions"]["used"] == 0
                assert (await high.__anext__()).token_id is not None
        with trio.fail_after(10):  # the high session's cancel reaches the loop
            while node.in_flight:
                await trio.sleep(0.001)
        assert node.statistics()["parked_sessions"]["used"] == 0


@pytest.mark.parametrize("prefill", [False, True], ids=["decoding", "prefilling"])
async def test_a_session_the_pool_cannot_place_is_parked_and_resumes_bitwise(node_config,
                                                                           prefill):
    """A session whose rows llama.cpp finds no KV cells for (code 1, as an ordered
    pool that cannot move it reports) is parked, not ended: it waits for the other
    session to give its KV up, resumes, and is bitwise its run alone; so is the
    other. (The fault holds the slot until its KV is freed: no prefix cache here.)"""
    config = node_config(max_running=2, scheduling_policy="priority", prefix_cache=False,
                         reply_buffer=2)
    params = [sampled(17), sampled(19)]
    solo = await alone(config, PROMPTS, params)
    async with dgr.open_node(config) as node:
        got, first_go, victim_go = [], trio.Event(), trio.Event()

        def on_slot(prompt):
            tokens = node.tokenize(prompt)
            return next((s for s in node._loop.slot_sessions()
                         if s is not None and s.spec.prompt == tokens), None)

        async with trio.open_nursery() as nursery:
            # the first session holds its slot, its reader taking nothing after 3 tokens
            nursery.start_soon(read_stalled, node, PROMPTS[0], params[0], LOW, got, 3,
                               first_go)
            with trio.fail_after(30):
                while (first := on_slot(PROMPTS[0])) is None or len(first.generated) < 3:
                    await trio.sleep(0.001)
            other_slot = 1 - first.slot
            if prefill:  # its first piece of prompt is refused
                node._engine.inject_fault(0, 1, other_slot)
            nursery.start_soon(read_stalled, node, PROMPTS[1], params[1], LOW, got, 3,
                               victim_go)
            with trio.fail_after(30):
                while (victim := on_slot(PROMPTS[1])) is None and not prefill:
                    await trio.sleep(0.001)
                if not prefill:  # a decode row of its is refused once it has 3 tokens
                    while len(victim.generated) < 3:
                        await trio.sleep(0.001)
                    node._engine.inject_fault(0, 1, victim.slot)
                    victim_go.set()
                while not any(s.parked for s in node._admission.parked):
                    await trio.sleep(0.001)
            victim, = node._admission.parked
            assert victim.parks == 1
            assert (victim.generated == []) if prefill else len(victim.generated) >= 3
            first_go.set()
            victim_go.set()
        registry = node.telemetry.registry
        assert registry.get_sample_value("dgr_pool_full_parks_total") == 1
        assert victim.error is None and first.parks == 0
        by_session = {session.id: out for out, session in got}
        assert by_session[first.id] == solo[0] and by_session[victim.id] == solo[1]
        assert_every_kv_operation_published(node)
