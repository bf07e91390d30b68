"""Fault injection: llama_decode failing with each return code, or the engine raising."""

import httpx
import pytest
import trio

import dgr
from dgr import _codes, _engine
from dgr._step import step
from dgr.errors import DecodeAborted, DgrError, FatalDecodeError, InvalidBatch, KVSlotUnavailable
from dgr.config import ServerConfig


@pytest.fixture(scope="module")
def engine(tiny_model):
    eng = _engine.Engine(tiny_model, n_ctx=1024, n_seq_max=2, n_batch=64, n_ubatch=64)
    yield eng
    eng.close()


@pytest.mark.parametrize("code,error", [(1, KVSlotUnavailable), (2, DecodeAborted),
                                        (-1, InvalidBatch), (-3, FatalDecodeError)])
def test_engine_maps_codes_and_reconciles_kv(engine, code, error):
    engine.release(0)
    step(engine, [5, 6, 7], [0, 1, 2], [0, 0, 0], [0, 0, 1])
    engine.inject_fault(0, code)
    with pytest.raises(error) as exc:
        step(engine, [8, 9], [3, 4], [0, 0], [0, 1])
    assert exc.value.code == code if code != -1 else True
    assert engine.pos_max(0) == 2  # back to the state before the failed step
    sampled, *_ = step(engine, [8, 9], [3, 4], [0, 0], [0, 1])  # and it resumes
    assert engine.pos_max(0) == 4 and sampled[1] >= 0
    engine.release(0)


def test_abort_flag_aborts_and_reconciles(engine):
    engine.release(1)
    engine.request_abort()
    try:
        with pytest.raises(DecodeAborted):
            step(engine, list(range(5, 45)), list(range(40)), [1] * 40, [0] * 39 + [1])
    finally:
        engine.clear_abort()
    assert engine.pos_max(1) == -1


FAULTS_NODE = dict(max_running=4, n_ctx=2048, n_batch=128, n_ubatch=128)


@pytest.mark.parametrize("code", [2, -3, _codes.FAULT_RAISE])
async def test_node_fails_affected_sessions_and_keeps_serving(code, node_config):
    # long enough that neither victim ends before the fault, however far the loop
    # ran ahead of the steps this task has seen
    params = dgr.SamplingParams(max_tokens=400, ignore_eos=True)
    # credits for every token: no victim ever sits out a step for a reader behind (the
    # faulty step then holds both)
    async with dgr.open_node(node_config(**FAULTS_NODE, reply_buffer=512)) as node:
        reference = await node.generate("after the fault", params)
        failures = []

        async def victim(i):
            try:
                await node.generate(f"victim {i}", params)
            except DgrError as exc:
                failures.append(str(exc))

        async with trio.open_nursery() as nursery:
            for i in range(2):
                nursery.start_soon(victim, i)
            while len(node.steps[-1].decode) < 2:  # both victims decode in one call
                await trio.sleep(0)
            node._engine.inject_fault(1, code)
        assert len(failures) == 2 and all("the model failed" in f for f in failures)
        # cells in use come back to exactly the cached prompt prefixes, and to 0 after a flush
        assert await node.kv_cells_in_use() == node.capabilities()["load"]["kv_cells_cached"]
        await node.flush_prefix_cache()
        assert await node.kv_cells_in_use() == 0
        label = str(code if code != _codes.FAULT_RAISE else -1000)
        assert node.telemetry.registry.get_sample_value("dgr_step_failures_total",
                                                        {"code": label}) == 1
        again = await node.generate("after the fault", params)
        assert again.token_ids == reference.token_ids


# long enough that no session ends before the fault, however far the loop ran ahead
REFUSED_PARAMS = dgr.SamplingParams(max_tokens=400, ignore_eos=True, logprobs=2)


async def together_with_a_fault(node, prompts, inject) -> list:
    """Each prompt's result (or its DgrError), run at once; `inject()` once every
    session decodes in the same step."""
    outcomes = [None] * len(prompts)

    async def run(i):
        try:
            outcomes[i] = await node.generate(prompts[i], REFUSED_PARAMS)
        except DgrError as exc:
            outcomes[i] = exc

    async with trio.open_nursery() as nursery:
        for i in range(len(prompts)):
            nursery.start_soon(run, i)
        while len(node.steps) == 0 or len(node.steps[-1].decode) < len(prompts):
            await trio.sleep(0)
        inject()
    return outcomes


@pytest.mark.parametrize("code", [1, -1])
async def test_a_refused_call_is_run_again_one_session_a_call(code, node_config):
    """llama.cpp refusing a call whole (no KV slot, an invalid batch) leaves its memory
    as it was: each session's rows run again in a call of their own, and a refusal
    that was no session's fails none; every session's bits are its solo run's."""
    prompts = [f"session {i} of a refused call" for i in range(4)]
    async with dgr.open_node(node_config(**FAULTS_NODE, reply_buffer=512)) as node:
        solo = [await node.generate(p, REFUSED_PARAMS) for p in prompts]
        await node.flush_prefix_cache()
        calls_before, steps_before = node._engine.steps_done, node.steps[-1].index
        results = await together_with_a_fault(node, prompts,
                                              lambda: node._engine.inject_fault(0, code))
        # the refused call, then one call per session, in one step
        steps = node.steps[-1].index - steps_before
        assert node._engine.steps_done - calls_before - steps == len(prompts)
        assert [r.token_ids for r in results] == [r.token_ids for r in solo]
        assert [r.token_logprobs for r in results] == [r.token_logprobs for r in solo]
        assert node.telemetry.registry.get_sample_value("dgr_step_failures_total",
                                                        {"code": str(code)}) is None


@pytest.mark.parametrize("code", [1, -1])
async def test_the_session_llama_cpp_refuses_fails_alone(code, node_config):
    """A session whose rows llama.cpp refuses in every call (its KV inconsistent)
    ends with the error; the sessions that shared its steps complete, bitwise
    their solo runs, and the node serves on."""
    prompts = [f"a culprit among {i}" for i in range(4)]
    async with dgr.open_node(node_config(**FAULTS_NODE, reply_buffer=512)) as node:
        solo = [await node.generate(p, REFUSED_PARAMS) for p in prompts]
        await node.flush_prefix_cache()
        outcomes = await together_with_a_fault(node, prompts,
                                               lambda: node._engine.inject_fault(0, code, 1))
        failed = [i for i, o in enumerate(outcomes) if isinstance(o, DgrError)]
        assert len(failed) == 1 and "the model failed" in str(outcomes[failed[0]])
        for i, outcome in enumerate(outcomes):
            if i not in failed:
                assert outcome.token_ids == solo[i].token_ids
                assert outcome.token_logprobs == solo[i].token_logprobs
        again = await node.generate(prompts[failed[0]], REFUSED_PARAMS)
        assert again.token_ids == solo[failed[0]].token_ids


async def test_http_reports_a_model_failure_not_a_hang(node_config):
    from dgr.doors.context import ServerState
    from dgr.server import create_app

    async with dgr.open_node(node_config(**FAULTS_NODE)) as node:
        state = ServerState(ServerConfig())
        state.node = node
        transport = httpx.ASGITransport(app=create_app(state, ServerConfig()))
        body = {"prompt": "s", "max_tokens": 40, "temperature": 0, "ignore_eos": True}
        async with httpx.AsyncClient(transport=transport, base_url="http://dgr") as client:
            node._engine.inject_fault(3, -3)
            stream = await client.post("/v1/completions", json=body | {"stream": True})
            assert stream.status_code == 200
            assert '"model_failed"' in stream.text
            assert stream.text.rstrip().endswith("data: [DONE]")
            node._engine.inject_fault(3, -3)
            plain = await client.post("/v1/completions", json=body)
            assert plain.status_code == 500
            assert "the model failed" in plain.json()["error"]["message"]
            ok = await client.post("/v1/completions", json=body)
            assert ok.status_code == 200
