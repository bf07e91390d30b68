"""The node under Trio with the tiny model: batching, admission, backpressure,
cancellation, shutdown and telemetry."""

import ctypes
import math
import os
import threading

import attrs
import pytest
import trio

import dgr
from dgr.errors import AdmissionRejected, BudgetError, InvalidRequest, ModelLoadError
from dgr.prefix_cache import common_prefix, tokens_array
from dgr.sequence import FinishReason, Phase

PROMPTS = [
    "The quick brown fox jumps over the lazy dog",
    "a",
    "Lorem ipsum dolor sit amet, consectetur adipiscing elit, sed do eiusmod tempor incididunt "
    "ut labore et dolore magna aliqua. Ut enim ad minim veniam, quis nostrud exercitation",
    "Zwölf Boxkämpfer jagen Viktor quer über den großen Sylter Deich",
    "emoji 🎉🚀 and more",
    "in the beginning there was the word and the word was",
    "1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20 21 22 23 24 25 26 27 28 29 30",
    "short",
]


def metric(node, name, **labels):
    value = node.telemetry.registry.get_sample_value(name, labels or None)
    return 0.0 if value is None else value


async def wait_retired(node, session):
    """Wait until the node has processed the session's end (the BatchLoop's finish
    event for a session on the engine): its KV figures are then final."""
    with trio.fail_after(10):
        while session.phase is not Phase.FINISHED:
            await node._loop.departures.park()


async def test_generate_and_stream_agree(node_config):
    params = dgr.SamplingParams(max_tokens=20)
    async with dgr.open_node(node_config()) as node:
        result = await node.generate("Hello there", params)
        assert result.finish_reason == "length"
        assert len(result.token_ids) == 20
        assert result.prompt_tokens == len(node.tokenize("Hello there"))
        pieces, ids = [], []
        async with node.stream("Hello there", params) as chunks:
            async for chunk in chunks:
                pieces.append(chunk.text)
                if chunk.token_id is not None:
                    ids.append(chunk.token_id)
        assert chunks.finish_reason == "length"
        assert ids == result.token_ids
        assert "".join(pieces) == result.text


def _outputs(result):
    return result.token_ids, result.token_logprobs, result.logprobs


@pytest.mark.parametrize("speculation", ["off", "always"])
@pytest.mark.parametrize("concurrency", [1, 2, 4, 8])
async def test_no_cross_session_corruption(concurrency, speculation, node_config):
    """Tokens and log-probabilities bitwise those of each session alone (the tiny
    model's weights are F32: its batched matmuls take llamafile's sgemm, and a
    row alone takes it too with patch 0007), drafts verified or not."""
    params = dgr.SamplingParams(max_tokens=24, logprobs=2)
    prompts = PROMPTS[:concurrency]
    async with dgr.open_node(node_config(speculation=speculation)) as node:
        solo = [_outputs(await node.generate(p, params)) for p in prompts]
        together = [None] * concurrency
        ids = [node.tokenize(p) for p in prompts]  # admitted in one tick: they share steps

        async def run(i):
            together[i] = _outputs(await node.generate(ids[i], params))

        async with trio.open_nursery() as nursery:
            for i in range(concurrency):
                nursery.start_soon(run, i)
        # they really shared steps (with drafts, sessions also wait for their readers'
        # credits, so steps need not be shared)
        if concurrency > 1 and speculation == "off":
            assert max(len(r.decode) for r in node.steps) > 1
    assert together == solo


async def test_as_many_sessions_as_llama_cpp_has_sequences(node_config):
    """256 sessions at once (llama.cpp's limit), up to 256 decode rows of one stream per
    call: each bitwise what its prompt gives alone."""
    params = dgr.SamplingParams(max_tokens=32, logprobs=2, ignore_eos=True)
    cfg = node_config(max_running=256, max_waiting=0, n_ctx=256 * 128, n_batch=512,
                 n_ubatch=512, prefill_sessions_per_step=64)
    async with dgr.open_node(cfg) as node:
        solo = [_outputs(await node.generate(p, params)) for p in PROMPTS]
        together = [None] * 256
        ids = [node.tokenize(p) for p in PROMPTS]  # admitted in one tick: they share steps

        async def run(i):
            together[i] = _outputs(await node.generate(ids[i % len(PROMPTS)], params))

        async with trio.open_nursery() as nursery:
            for i in range(256):
                nursery.start_soon(run, i)
        assert max(len(r.decode) for r in node.steps) > 64
    assert together == [solo[i % len(PROMPTS)] for i in range(256)]


async def test_a_prefix_copy_reaches_the_loop_before_its_source_is_given_away(monkeypatch, node_config):
    """Admission places A to copy a cached prefix from slot S, then B, arriving
    later, into S (the least recently used entry; no slot is empty). A's copy must
    reach the batch loop before B overwrites S, however long A's opening takes
    after admission: A's result is bitwise what a fresh node gives it."""
    params = dgr.SamplingParams(max_tokens=16, logprobs=2, ignore_eos=True)
    cached, other, long_prompt = PROMPTS[2], PROMPTS[3], PROMPTS[6] * 3
    a_prompt = cached + " and then some more"
    async with dgr.open_node(node_config(max_running=3)) as node:
        expected = _outputs(await node.generate(a_prompt, params))
        a_ids = node.tokenize(a_prompt)

    opening = dgr.Node._open_sessions

    async def slow_opening_for_a(self, sessions, whole):
        opened = await opening(self, sessions, whole)  # admitted
        if sessions[0].spec.prompt == a_ids:
            await trio.sleep(0.5)  # B is admitted and prefilled meanwhile
        return opened

    monkeypatch.setattr(dgr.Node, "_open_sessions", slow_opening_for_a)
    async with dgr.open_node(node_config(max_running=3)) as node:
        await node.generate(cached, params)  # slot S, least recently used
        await node.generate(other, params)   # another slot; the third stays empty
        results = {}

        async def run(name, prompt, delay):
            await trio.sleep(delay)
            async with node.stream(prompt, params) as chunks:
                results[name] = [c async for c in chunks if c.token_id is not None]

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "a", a_ids, 0)
            nursery.start_soon(run, "b", long_prompt, 0.1)
        got = results["a"]
        assert metric(node, "dgr_prefix_hits_total") >= 1
    assert ([c.token_id for c in got], [c.logprob for c in got],
            [c.top_logprobs for c in got]) == expected


async def test_logprobs_and_stop_strings(node_config):
    async with dgr.open_node(node_config()) as node:
        base = await node.generate("stop test", dgr.SamplingParams(max_tokens=30))
        text = base.text
        stop = text[10:13]
        assert stop and stop not in text[:10]
        stopped = await node.generate("stop test", dgr.SamplingParams(max_tokens=30, stop=[stop]))
        assert stopped.finish_reason == "stop"
        assert stopped.text == text[:text.index(stop)]
        with_lp = await node.generate("stop test", dgr.SamplingParams(max_tokens=5, logprobs=3))
        assert with_lp.token_ids == base.token_ids[:5]
        for token, top, lp in zip(with_lp.token_ids, with_lp.logprobs, with_lp.token_logprobs):
            assert len(top) == 3 and top[0][0] == token and top[0][1] == pytest.approx(lp)


async def test_sampling_is_seeded_per_session(node_config):
    params = dgr.SamplingParams(max_tokens=16, temperature=0.9, top_k=40, top_p=0.95, seed=42)
    async with dgr.open_node(node_config()) as node:
        a = await node.generate("seeded", params)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(node.generate, "another session", params)
            b = await node.generate("seeded", params)
    assert a.token_ids == b.token_ids


async def test_typical_sampling_changes_tokens_and_stays_the_sessions_own(node_config):
    """typical_p truncates the distribution (llama.cpp's typ_p, after top_k): a low one
    picks other tokens than plain sampling with the same seed, and a session with it
    gets the same tokens and log-probabilities alone and beside others."""
    plain = dgr.SamplingParams(max_tokens=24, temperature=1.5, seed=7, logprobs=2,
                               ignore_eos=True)
    typical = attrs.evolve(plain, typical_p=0.2)
    async with dgr.open_node(node_config()) as node:
        alone = _outputs(await node.generate("typical", typical))
        without = _outputs(await node.generate("typical", plain))
        results = {}

        async def run(name, prompt, params):
            results[name] = _outputs(await node.generate(prompt, params))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run, "typical", "typical", typical)
            nursery.start_soon(run, "other", "another session", plain)
            nursery.start_soon(run, "third", "a third one", typical)
    assert alone[0] != without[0]
    assert results["typical"] == alone


async def test_per_session_cap_is_the_pool_or_what_is_configured(node_config):
    """Unified KV: one session may reserve the whole pool, or --session-ctx cells;
    split KV: a fixed ctx/max-running share. Beyond it: never_fits, with the numbers."""
    long_prompt = "x" * 1000  # about 1000 tokens of the tiny model's byte vocabulary
    cases = [(node_config(), None),
             (node_config(session_ctx=600), 600),
             (node_config(kv_unified=False), 512)]
    for cfg, cap in cases:
        async with dgr.open_node(cfg) as node:
            per_session = node.capabilities()["budgets"]["kv"]["cells_per_session"]
            assert per_session == (cap or 4096)
            if cap is None:
                result = await node.generate(long_prompt, dgr.SamplingParams(max_tokens=2))
                assert len(result.token_ids) == 2
            else:
                with pytest.raises(AdmissionRejected, match=f"context of {cap} tokens") as exc:
                    await node.generate(long_prompt, dgr.SamplingParams(max_tokens=2))
                assert exc.value.reason == "never_fits"
            assert (await node.generate("still fine", dgr.SamplingParams(max_tokens=2))).token_ids


def test_max_running_is_capped_at_llamas_sequence_limit():
    assert dgr.NodeConfig(max_running=256, n_batch=512).max_running == 256
    for kv_unified in (True, False):
        with pytest.raises(ValueError, match="at most 256"):
            dgr.NodeConfig(max_running=257, n_batch=512, kv_unified=kv_unified)


async def test_bad_requests_get_clear_errors(node_config):
    with pytest.raises(InvalidRequest, match="temperature"):
        dgr.SamplingParams(temperature=-1)
    with pytest.raises(InvalidRequest, match="top_p"):
        dgr.SamplingParams(top_p=0)
    with pytest.raises(InvalidRequest, match="max_tokens"):
        dgr.SamplingParams(max_tokens=0)
    with pytest.raises(InvalidRequest, match="logprobs"):
        dgr.SamplingParams(logprobs=99)
    async with dgr.open_node(node_config()) as node:
        with pytest.raises(InvalidRequest, match="token ids"):
            await node.generate([1, 10_000])
        with pytest.raises(InvalidRequest, match="empty"):
            await node.generate([])
        # a prompt that can never fit: one session may use the whole pool (4096 cells), no more
        with pytest.raises(AdmissionRejected) as exc:
            await node.generate("x" * 4100, dgr.SamplingParams(max_tokens=1))
        assert exc.value.reason == "never_fits"
        assert "4096" in str(exc.value)
        assert metric(node, "dgr_admissions_rejected_total", reason="never_fits") == 1
        # the node still serves
        assert (await node.generate("still fine", dgr.SamplingParams(max_tokens=3))).token_ids


async def test_node_refuses_to_start_outside_its_memory_budget(tmp_path, node_config):
    with pytest.raises(BudgetError, match="weights"):
        async with dgr.open_node(node_config(memory_budget_bytes=1000)):
            pass
    with pytest.raises(ModelLoadError, match="missing.gguf"):
        async with dgr.open_node(node_config(model_path=str(tmp_path / "missing.gguf"))):
            pass
    assert not [t for t in threading.enumerate() if t.name == "dgr-engine"]


async def test_burst_of_100_is_bounded(node_config):
    cfg = node_config(max_running=2, max_waiting=4, max_waiting_tokens=10_000)
    outcomes = {"ok": 0}
    peaks = {"waiting": 0, "active": 0}
    async with dgr.open_node(cfg) as node:

        async def one(i):
            try:
                result = await node.generate(f"burst {i}",
                                             dgr.SamplingParams(max_tokens=8, ignore_eos=True))
                assert result.finish_reason == "length"
                outcomes["ok"] += 1
            except AdmissionRejected as exc:
                outcomes[exc.reason] = outcomes.get(exc.reason, 0) + 1

        async def watch():
            while True:
                peaks["waiting"] = max(peaks["waiting"], node.waiting_sessions)
                peaks["active"] = max(peaks["active"], node.active_sessions)
                await trio.sleep(0)

        async with trio.open_nursery() as outer:
            outer.start_soon(watch)
            async with trio.open_nursery() as nursery:
                for i in range(100):
                    nursery.start_soon(one, i)
            outer.cancel_scope.cancel()
        assert outcomes["ok"] + outcomes.get("queue_full", 0) == 100
        assert outcomes["ok"] >= 6  # 2 running + 4 queued at the burst
        assert peaks["waiting"] <= 4 and peaks["active"] <= 2
        assert metric(node, "dgr_admissions_rejected_total", reason="queue_full") == outcomes["queue_full"]
        # cells in use come back to exactly the cached prompt prefixes, and to 0 after a flush
        assert await node.kv_cells_in_use() == node.capabilities()["load"]["kv_cells_cached"]
        await node.flush_prefix_cache()
        assert await node.kv_cells_in_use() == 0


async def test_slow_reader_is_skipped_not_buffered(node_config):
    cfg = node_config(reply_buffer=2)
    params = dgr.SamplingParams(max_tokens=30)
    async with dgr.open_node(cfg) as node:
        solo = (await node.generate("slow reader", params)).token_ids
        slow_ids = []

        async def slow():
            async with node.stream("slow reader", params) as chunks:
                async for chunk in chunks:
                    if chunk.token_id is not None:
                        slow_ids.append(chunk.token_id)
                    await trio.sleep(0.02)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(slow)
            await trio.sleep(0.01)
            fast = await node.generate("fast reader", params)
        slow_session_steps = [r for r in node.steps if len(r.decode) == 1]
        assert slow_session_steps, "the fast session ran steps without the slow one"
    assert slow_ids == solo
    assert len(fast.token_ids) == 30


async def test_a_whole_answer_is_never_held_for_its_reader_and_reads_as_the_stream(node_config):
    # two credits a reader; the whole answer's reader wakes once, at its end
    cfg = node_config(reply_buffer=2)
    params = dgr.SamplingParams(max_tokens=30, logprobs=2)
    async with dgr.open_node(cfg) as node:
        async with node.stream("a whole answer", params) as chunks:
            streamed = [chunk async for chunk in chunks]
        async with node.stream("a whole answer", params, whole=True) as chunks:
            with trio.move_on_after(60) as guard:  # a session held for credits never ends
                first = await chunks.next_chunks()
            assert not guard.cancelled_caught
            assert chunks.session.finish_reason is FinishReason.LENGTH
            assert len(chunks.session.generated) == 30
            whole = first + [chunk async for chunk in chunks]
    assert whole == streamed and len(first) == 31


async def test_decoders_get_a_row_in_every_step_while_a_long_prompt_prefills(node_config):
    # fixed 16-token pieces (decode_stall 0), decoders that never wait for their
    # readers (credits for all their tokens: a step without a decoder prefills its
    # whole budget) and yield one token a step (no drafts: they outlast the prompt)
    cfg = node_config(prefill_chunk=16, n_batch=64, n_ubatch=64, max_running=4,
                      decode_stall=0, reply_buffer=256, speculation="off")
    async with dgr.open_node(cfg) as node:
        decoding = {}

        async def decoder(i):
            async with node.stream(f"decoder {i}", dgr.SamplingParams(max_tokens=1000,
                                                                      ignore_eos=True)) as chunks:
                async for chunk in chunks:
                    decoding[i] = chunks.session.id

        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(decoder, i)
            while len(decoding) < 3:
                await trio.sleep(0.001)
            long_prompt = "x" * 300
            first_step = node.steps[-1].index
            result = await node.generate(long_prompt, dgr.SamplingParams(max_tokens=1))
            nursery.cancel_scope.cancel()
        long_id = max(s for r in node.steps for s, _, _ in r.prefill)
        prefill_steps = [r for r in node.steps
                         if r.index > first_step and any(s == long_id for s, _, _ in r.prefill)]
        chunks = [(start, end) for r in prefill_steps for s, start, end in r.prefill if s == long_id]
        # one 16-token chunk a step from where its prefill starts (after the shared BOS)
        assert len(prefill_steps) == len(chunks) == -(-(len(node.tokenize(long_prompt)) - chunks[0][0]) // 16)
        assert all(end == start + 16 for start, end in chunks[:-1])
        for record in prefill_steps:
            assert set(decoding.values()) <= set(record.decode), record
        assert result.finish_reason == "length"


async def test_cancel_while_waiting_prefilling_or_decoding(node_config):
    # a streamed session stays within two tokens of its reader (whole answers do not)
    cfg = node_config(max_running=2, prefill_chunk=8, n_batch=32, n_ubatch=32, reply_buffer=2)
    params = dgr.SamplingParams(max_tokens=40, ignore_eos=True)
    async with dgr.open_node(cfg) as node:
        reference = (await node.generate(PROMPTS[0], params)).token_ids

        async with trio.open_nursery() as nursery:
            survivor = {}

            async def keep_going():
                survivor["ids"] = (await node.generate(PROMPTS[0], params)).token_ids

            nursery.start_soon(keep_going)

            # decode phase: cancel after 5 tokens, the session at most two ahead of its
            # reader (else it may reach its 40th in the steps the cancellation takes to land)
            with trio.CancelScope() as scope:
                async with node.stream("decode then cancel", params) as chunks:
                    seen = 0
                    async for chunk in chunks:
                        seen += 1
                        slot = chunks.session.slot
                        if seen == 5:
                            scope.cancel()
                            await trio.sleep(0)
            await wait_retired(node, chunks.session)
            # as llama.cpp reported after the last step: the slot keeps its prompt and the
            # tokens it fed back (a prefix cache entry)
            session = chunks.session
            assert (node._loop.batch.pos_max(slot) == session.n_prefilled + len(session.generated) - 2
                    > len(session.spec.prompt))
            assert chunks.session.finish_reason == "cancelled"

            # waiting phase: both slots busy with blockers, so this one queues
            blockers = trio.CancelScope()

            async def two_blockers():
                with blockers:
                    async with trio.open_nursery() as inner:
                        for _ in range(2):
                            inner.start_soon(node.generate, "blocker",
                                             dgr.SamplingParams(max_tokens=400, ignore_eos=True))

            while survivor.get("ids") is None:
                await trio.sleep(0.001)
            nursery.start_soon(two_blockers)
            while node.active_sessions < 2:
                await trio.sleep(0.001)
            queued = trio.CancelScope()

            async def queued_client():
                with queued:
                    await node.generate("queued then cancelled", params)

            nursery.start_soon(queued_client)
            while node.waiting_sessions < 1:
                await trio.sleep(0.001)
            queued.cancel()
            # the cancel reaches admission through the request channel (no engine step):
            # wait for that, not for steps, which may be published before it is read
            with trio.fail_after(10):
                while node.waiting_sessions:
                    await trio.sleep(0.001)
            assert metric(node, "dgr_queue_sessions") == 0
            blockers.cancel()

            # prefill phase: a long prompt, cancelled after its first chunk
            with trio.CancelScope() as scope:
                async with node.stream("y" * 200, params) as chunks:
                    while chunks.session.n_prefilled == 0:
                        await trio.sleep(0)
                    slot = chunks.session.slot
                    assert chunks.session.n_prefilled < len(chunks.session.spec.prompt)
                    scope.cancel()
                    await trio.sleep(0)
            await wait_retired(node, chunks.session)
            # its sequence keeps what it computed (the cancel may land after the last
            # chunk and a token), and the prefix cache holds those tokens for the slot
            cache = node._admission.placement.cache
            assert node._loop.batch.pos_max(slot) == cache.cells(slot) - 1
            assert chunks.session.n_prefilled <= cache.cells(slot)
        assert survivor["ids"] == reference
        assert metric(node, "dgr_sessions_finished_total", reason="cancelled") == 5  # decode, queued, 2 blockers, prefill
        # cells in use come back to exactly the cached prompt prefixes, and to 0 after a flush
        assert await node.kv_cells_in_use() == node.capabilities()["load"]["kv_cells_cached"]
        await node.flush_prefix_cache()
        assert await node.kv_cells_in_use() == 0


async def test_a_caller_gone_at_once_costs_no_engine_work(node_config):
    """A caller cancelled before its session is admitted, its prompt text or token
    ids, leaves nothing: no admission, no prefill, no finished session."""
    params = dgr.SamplingParams(max_tokens=8, ignore_eos=True)
    async with dgr.open_node(node_config()) as node:
        await node.generate("warm up", params)
        with trio.move_on_after(0):  # gone while its text would be tokenized
            await node.generate("cancelled before tokenizing", params)
        with trio.move_on_after(0):  # gone before admission
            await node.generate(node.tokenize("cancelled before admission"), params)
        after = await node.generate("after", params)
        assert after.finish_reason == "length"
        assert metric(node, "dgr_admissions_total") == 2
        assert len({sid for r in node.steps for sid, _, _ in r.prefill}) == 2  # warm up, after
        assert metric(node, "dgr_sessions_finished_total", reason="cancelled") == 0
        assert metric(node, "dgr_prefill_tokens_total") == sum(  # "after" shares the BOS
            len(node.tokenize(p)) for p in ("warm up", "after")) - metric(
                node, "dgr_prefix_tokens_reused_total")
        assert node.waiting_sessions == node.active_sessions == 0


async def test_a_caller_gone_right_after_admission_leaves_nothing_behind(node_config):
    """Cancelled once admitted, before its session's task started: the session ends
    "cancelled" (within a step, if the loop had started it) and gives back its
    slot, its KV cells and any cached prefix it was placed to share."""
    params = dgr.SamplingParams(max_tokens=8, ignore_eos=True)
    async with dgr.open_node(node_config()) as node:
        warm = await node.generate(PROMPTS[2], params)
        admit = node._loop.admit
        with trio.CancelScope() as caller:
            def admit_then_cancel(replies):
                admit(replies)
                caller.cancel()

            node._loop.admit = admit_then_cancel
            # long enough that the loop cannot end it ("length") before the cancel lands
            await node.generate(PROMPTS[2] + " and more", attrs.evolve(params, max_tokens=400))
        node._loop.admit = admit
        assert caller.cancelled_caught
        again = await node.generate(PROMPTS[2], params)
        assert again.token_ids == warm.token_ids
        assert metric(node, "dgr_admissions_total") == 3
        assert metric(node, "dgr_sessions_finished_total", reason="cancelled") == 1
        assert node.waiting_sessions == node.active_sessions == 0
        await node.flush_prefix_cache()
        assert await node.kv_cells_in_use() == 0


async def test_leaving_the_node_cancels_sessions_in_flight(node_config):
    reasons = []
    async with trio.open_nursery() as outer:
        async with dgr.open_node(node_config()) as node:

            async def client(i):
                async with node.stream(f"in flight {i}", dgr.SamplingParams(max_tokens=400)) as chunks:
                    async for _ in chunks:
                        pass
                reasons.append(chunks.finish_reason)

            for i in range(3):
                outer.start_soon(client, i)
            # all three admitted (their prompts are tokenized on worker threads first)
            # and decoding
            with trio.fail_after(10):
                while node.active_sessions < 3 or sum(len(r.decode) for r in node.steps) < 10:
                    await trio.sleep(0.001)
    assert reasons == ["cancelled"] * 3
    assert not [t for t in threading.enumerate() if t.name == "dgr-engine"]
    with pytest.raises(dgr.NodeClosed):
        await node.generate("after close")
    with pytest.raises(dgr.NodeClosed):  # the model is freed: an error, not a crash
        node.tokenize("after close")
    with pytest.raises(dgr.NodeClosed):
        node.detokenize([1, 2])


async def test_long_text_prompts_are_tokenized_off_the_trio_thread(monkeypatch, node_config):
    """llama.cpp takes ~0.1 s to tokenize a 30,000-token text: on the Trio thread
    that would hold back every session's tokens. A long text prompt is tokenized on
    a worker thread, a short one at once (the hop would cost more), each to the ids
    the caller would get from tokenize."""
    from dgr.serving import TOKENIZE_INLINE_CHARS

    on_trio_thread = []
    tokenize = dgr.Node.tokenize

    def recording_tokenize(node, text, add_special=True, parse_special=False):
        on_trio_thread.append(trio.lowlevel.in_trio_run())
        return tokenize(node, text, add_special, parse_special)

    monkeypatch.setattr(dgr.Node, "tokenize", recording_tokenize)
    params = dgr.SamplingParams(max_tokens=8)
    long_text = (PROMPTS[2] + " ") * (TOKENIZE_INLINE_CHARS // len(PROMPTS[2]) + 1)
    async with dgr.open_node(node_config()) as node:
        results = []
        for text in (long_text, PROMPTS[2]):
            from_text = await node.generate(text, params)
            ids = tokenize(node, text)
            results.append((from_text, await node.generate(ids, params), ids))
    assert on_trio_thread == [False, True]  # the long text, then the short one
    for from_text, from_ids, ids in results:
        assert from_text.prompt_tokens == len(ids)
        assert from_text.token_ids == from_ids.token_ids


async def test_telemetry_counts_a_known_workload(node_config):
    async with dgr.open_node(node_config()) as node:
        prompts = PROMPTS[:4]
        results = []

        async def run(p, n):
            results.append((p, await node.generate(p, dgr.SamplingParams(max_tokens=n,
                                                                               ignore_eos=True))))

        async with trio.open_nursery() as nursery:
            for i, p in enumerate(prompts):
                nursery.start_soon(run, p, 5 + i)
        prompt_tokens = sum(len(node.tokenize(p)) for p in prompts)
        generated = sum(len(r.token_ids) for _, r in results)
        assert metric(node, "dgr_prefill_tokens_total") == prompt_tokens - metric(
            node, "dgr_prefix_tokens_reused_total")  # a common BOS, arriving apart
        assert metric(node, "dgr_generated_tokens_total") == generated == 5 + 6 + 7 + 8
        assert metric(node, "dgr_decode_tokens_total") == generated - len(prompts)
        assert metric(node, "dgr_sessions_finished_total", reason="length") == 4
        assert metric(node, "dgr_admissions_total") == 4
        assert metric(node, "dgr_time_to_first_token_seconds_count") == 4
        assert metric(node, "dgr_inter_token_latency_seconds_count") == generated - 4
        assert metric(node, "dgr_steps_total") == len(node.steps)
        assert metric(node, "dgr_sessions_active") == 0
        assert metric(node, "dgr_kv_cells_total") == 4096
        caps = node.capabilities()
        assert caps["model"]["architecture"] == "llama"
        assert caps["budgets"]["kv"]["cells_per_session"] == 4096  # the pool (unified KV)
        assert caps["model"]["context_per_session"] == 4096
        assert caps["budgets"]["queue"]["max_waiting"] == 16
        assert caps["load"]["active"] == 0 and caps["load"]["kv_cells_free"] == 4096
        assert caps["load"]["decode_tokens_per_s"] > 0
        text = node.telemetry.exposition().decode()
        assert "dgr_batch_occupancy_ratio" in text and "dgr_kv_pressure_ratio" in text


PREAMBLE = "A shared preamble that several requests begin with, long enough for chunks. " * 3


async def test_a_shared_prompt_prefix_is_prefilled_once(node_config):
    """A session whose prompt begins with tokens another session prefilled
    (finished and cached, or still running) prefills only the rest, to the token;
    from the cache its tokens and log-probabilities are bitwise those of a fresh
    node (the default-model tests check bitwise equality beside running sessions
    too)."""
    cfg = node_config(prefill_chunk=16)
    params = dgr.SamplingParams(max_tokens=8, logprobs=2, ignore_eos=True)
    prompt = PREAMBLE + "Q1: cached?"
    async with dgr.open_node(cfg) as fresh:
        expected = await fresh.generate(prompt, params)
        assert metric(fresh, "dgr_prefix_hits_total") == 0
    async with dgr.open_node(cfg) as node:
        first = await node.generate(PREAMBLE + "Q0: the first", params)
        got = await node.generate(prompt, params)
        assert metric(node, "dgr_prefix_hits_total") == 1
        reused = metric(node, "dgr_prefix_tokens_reused_total")
        assert reused == common_prefix(tokens_array(node.tokenize(PREAMBLE + "Q0: the first")),
                                       tokens_array(node.tokenize(prompt))) > 16
        assert metric(node, "dgr_prefill_tokens_total") == (
            first.prompt_tokens + got.prompt_tokens - reused)
        async with trio.open_nursery() as nursery:  # from a running session
            async with node.stream(PREAMBLE + "Q3: still running",
                                   dgr.SamplingParams(max_tokens=400, ignore_eos=True)) as running:
                await running.__anext__()
                assert len((await node.generate(PREAMBLE + "Q2", params)).token_ids) == 8
                nursery.cancel_scope.cancel()
        assert metric(node, "dgr_prefix_hits_total") == 3
        prefix = node.capabilities()["prefix_cache"]
        assert prefix["enabled"] and prefix["hits"] == 3 and prefix["tokens_reused"] >= reused
        assert prefix["cached_cells"] == node.capabilities()["load"]["kv_cells_cached"] > 0
    assert got.token_ids == expected.token_ids
    assert got.token_logprobs == expected.token_logprobs  # bitwise
    assert got.logprobs == expected.logprobs


async def test_a_conversations_next_turn_reuses_the_answer_it_resends(node_config):
    """A finished session keeps its prompt and the tokens it generated and fed back:
    a next turn whose prompt resends them (and more) prefills only what is new, and
    gets bitwise what a fresh node computing the whole prompt gets. A session that
    shares only a few tokens with a cached conversation copies them to an empty slot
    and leaves the conversation cached."""
    cfg = node_config(prefill_chunk=16)
    params = dgr.SamplingParams(max_tokens=12, logprobs=2, ignore_eos=True)
    async with dgr.open_node(cfg) as node:
        turn1 = await node.generate(PREAMBLE + "User: hello", params)
        prompt1 = node.tokenize(PREAMBLE + "User: hello")
        turn2_prompt = prompt1 + turn1.token_ids + node.tokenize(" User: and then?", add_special=False)
        stranger = await node.generate(PREAMBLE[:12] + " unrelated", params)
        before = metric(node, "dgr_prefill_tokens_total")
        turn2 = await node.generate(turn2_prompt, params)
        # all of turn 1 but its last token (never fed back) came from the cache
        assert (metric(node, "dgr_prefix_tokens_reused_total")
                >= len(prompt1) + len(turn1.token_ids) - 1)
        assert metric(node, "dgr_prefill_tokens_total") - before == (
            len(turn2_prompt) - len(prompt1) - len(turn1.token_ids) + 1)
        assert len(stranger.token_ids) == 12
    async with dgr.open_node(cfg) as fresh:
        expected = await fresh.generate(turn2_prompt, params)
        assert metric(fresh, "dgr_prefix_hits_total") == 0
    assert turn2.token_ids == expected.token_ids
    assert turn2.token_logprobs == expected.token_logprobs  # bitwise
    assert turn2.logprobs == expected.logprobs


async def test_cached_prefixes_are_evicted_before_admission_rejects(node_config):
    """A pool full of cached prefixes admits a new session by evicting them (least
    recently used first), never by rejecting it; running sessions' cells stay."""
    cfg = node_config(n_ctx=1024, max_running=4, prefill_chunk=16)
    short = dgr.SamplingParams(max_tokens=2)
    async with dgr.open_node(cfg) as node:
        for i in range(3):
            await node.generate(f"{i} " + "z" * 290, short)
        cached = node.capabilities()["load"]["kv_cells_cached"]
        assert cached >= 3 * 272
        result = await node.generate("w" * 300, dgr.SamplingParams(max_tokens=400, ignore_eos=True))
        assert len(result.token_ids) == 400
        assert metric(node, "dgr_prefix_evictions_total") >= 1
        assert metric(node, "dgr_admissions_rejected_total", reason="never_fits") == 0
        assert await node.kv_cells_in_use() == node.capabilities()["load"]["kv_cells_cached"]
        await node.flush_prefix_cache()
        assert await node.kv_cells_in_use() == 0


async def test_n_choices_share_their_prompt_and_are_admitted_together(node_config):
    """stream_group: n samples of each prompt; the first prefills, the others take
    its KV (bitwise the same results as alone); a group that cannot be admitted
    whole is rejected whole."""
    cfg = node_config(prefill_chunk=16)
    greedy = dgr.SamplingParams(max_tokens=6, logprobs=2, ignore_eos=True)
    prompts = [PREAMBLE + "first prompt", PREAMBLE + "the second one"]
    async with dgr.open_node(cfg) as fresh:
        alone = [await fresh.generate(p, greedy) for p in prompts]
    async with dgr.open_node(cfg) as node:
        async with node.stream_group(prompts, greedy, n=3) as streams:
            results = []
            for s in streams:
                results.append([c async for c in s])
        assert len(results) == 6
        for i, chunks in enumerate(results):
            ids = [c.token_id for c in chunks if c.token_id is not None]
            lps = [c.logprob for c in chunks if c.token_id is not None]
            assert ids == alone[i // 3].token_ids
            leader = [c.logprob for c in results[i // 3 * 3] if c.token_id is not None]
            assert lps == leader  # bitwise; against solo runs: the default-model tests
        # each prompt prefilled once, its 2 other samples shared all of it but the last
        # token, and the second prompt's first sample shared the preamble with the first's
        assert metric(node, "dgr_prefix_hits_total") == 5
        shared = metric(node, "dgr_prefix_tokens_reused_total")
        assert shared > 2 * sum(len(node.tokenize(p)) - 1 for p in prompts)
        assert metric(node, "dgr_prefill_tokens_total") == 3 * sum(
            len(node.tokenize(p)) for p in prompts) - shared

    # all or nothing: 2 can run, 1 may wait, a group of 4 is refused whole
    async with dgr.open_node(node_config(max_running=2, max_waiting=1)) as node:
        with pytest.raises(AdmissionRejected) as exc:
            async with node.stream_group(["a", "b"], greedy, n=2):
                pass
        assert exc.value.reason == "queue_full"
        assert node.active_sessions == 0 and node.waiting_sessions == 0
        async with node.stream_group(["a"], dgr.SamplingParams(max_tokens=2), n=3) as streams:
            assert [len([c async for c in s if c.token_id is not None]) for s in streams] == [2, 2, 2]


async def test_sessions_arriving_together_prefill_a_shared_prefix_once(node_config):
    """The second of two sessions whose prompts begin alike, arriving while the
    first still prefills that prefix, waits for it and takes it."""
    cfg = node_config(prefill_chunk=16)
    params = dgr.SamplingParams(max_tokens=4, ignore_eos=True)
    prompts = [PREAMBLE + "first of two", PREAMBLE + "second of two"]
    async with dgr.open_node(cfg) as node:
        results = [None, None]

        async def run(i):
            results[i] = await node.generate(prompts[i], params)

        async with trio.open_nursery() as nursery:
            for i in range(2):
                nursery.start_soon(run, i)
        shared = common_prefix(*(tokens_array(node.tokenize(p)) for p in prompts))
        assert metric(node, "dgr_prefix_hits_total") == 1
        assert metric(node, "dgr_prefix_tokens_reused_total") == shared
        assert metric(node, "dgr_prefill_tokens_total") == (
            sum(r.prompt_tokens for r in results) - metric(node, "dgr_prefix_tokens_reused_total"))
        assert all(len(r.token_ids) == 4 for r in results)


async def test_logit_bias_penalties_and_seeds_do_what_they_say(node_config):
    greedy = dgr.SamplingParams(max_tokens=24, logprobs=1, ignore_eos=True)
    async with dgr.open_node(node_config()) as node:
        plain = await node.generate("bias me", greedy)
        first = plain.token_ids[0]
        # the chain path with nothing that applies gives the argmax path's tokens and bits
        neutral = await node.generate("bias me", attrs.evolve(greedy, logit_bias={first: 0.0}))
        assert neutral.token_ids == plain.token_ids
        assert neutral.token_logprobs == plain.token_logprobs
        banned = await node.generate("bias me", attrs.evolve(greedy, logit_bias={first: -100}))
        assert first not in banned.token_ids
        forced = await node.generate("bias me", attrs.evolve(greedy, logit_bias={77: 100}))
        assert forced.token_ids[0] == 77
        # penalties on generated tokens: fewer repeats than plain greedy
        repeats = len(plain.token_ids) - len(set(plain.token_ids))
        assert repeats > 0  # the random test model loops when greedy
        penalized = await node.generate("bias me", attrs.evolve(
            greedy, repeat_penalty=5.0, frequency_penalty=2.0, presence_penalty=2.0))
        assert len(penalized.token_ids) - len(set(penalized.token_ids)) < repeats
        # any integer seed repeats; seeds 2**32 apart do not collide
        runs = {}
        for seed in (-1, 5, 2 ** 32 + 5, 4294967295):
            params = dgr.SamplingParams(max_tokens=16, temperature=1.0, seed=seed, ignore_eos=True)
            runs[seed] = (await node.generate("seeded", params)).token_ids
            assert (await node.generate("seeded", params)).token_ids == runs[seed]
        assert runs[5] != runs[2 ** 32 + 5]
    with pytest.raises(InvalidRequest, match="logit_bias"):
        dgr.SamplingParams(logit_bias={1: 101})
    with pytest.raises(InvalidRequest, match="presence_penalty"):
        dgr.SamplingParams(presence_penalty=-3)
    async with dgr.open_node(node_config()) as node:
        with pytest.raises(InvalidRequest, match="logit_bias token ids"):
            await node.generate("x", dgr.SamplingParams(logit_bias={10 ** 9: 1}))


async def test_stop_token_ids_and_min_tokens(node_config):
    """A stop token id ends the session before it (finish "stop"); min_tokens holds
    off the end-of-generation tokens, stop token ids and stop strings until that
    many tokens, on the argmax path and on the sampler chain's."""
    greedy = dgr.SamplingParams(max_tokens=16, ignore_eos=True)
    async with dgr.open_node(node_config()) as node:
        eos = node._engine.eog_tokens[0]
        plain = await node.generate("stop here", greedy)
        stop_id = plain.token_ids[5]
        cut = plain.token_ids.index(stop_id)
        stopped = await node.generate("stop here", attrs.evolve(greedy, stop_token_ids=[stop_id]))
        assert stopped.token_ids == plain.token_ids[:cut]
        assert stopped.finish_reason == "stop"
        # min_tokens: the stop token id cannot come before it (argmax path: banned there)
        held = await node.generate("stop here", attrs.evolve(
            greedy, stop_token_ids=[stop_id], min_tokens=cut + 2))
        assert len(held.token_ids) >= cut + 2
        assert stop_id not in held.token_ids[:cut + 2]
        # an end-of-generation token forced by logit_bias (sampler chain path)
        forced = dgr.SamplingParams(max_tokens=16, logit_bias={eos: 100})
        assert (await node.generate("stop here", forced)).token_ids == []
        at_least = await node.generate("stop here", attrs.evolve(forced, min_tokens=5))
        assert len(at_least.token_ids) == 5 and at_least.finish_reason == "stop"
        # stop strings too wait for min_tokens: the output's first character stops it
        # at once, or only after 3 tokens
        assert plain.text
        early = await node.generate("stop here", attrs.evolve(greedy, stop=[plain.text[0]]))
        assert early.text == "" and early.finish_reason == "stop"
        late = await node.generate("stop here", attrs.evolve(
            greedy, stop=[plain.text[0]], min_tokens=3))
        assert late.token_ids[:3] == plain.token_ids[:3]
        with pytest.raises(InvalidRequest, match="stop_token_ids"):
            await node.generate("x", dgr.SamplingParams(stop_token_ids=[10 ** 9]))
    with pytest.raises(InvalidRequest, match="min_tokens"):
        dgr.SamplingParams(max_tokens=2, min_tokens=3)
    with pytest.raises(InvalidRequest, match="min_tokens"):
        dgr.SamplingParams(min_tokens=2, grammar='root ::= "x"')


async def test_a_scored_prompt_has_bitwise_the_logprobs_of_decoding_it(node_config):
    """prompt_logprobs: each prompt token's log-probability and alternatives, given
    the tokens before it, equal to those the same token had when it was decoded;
    the same again once the whole prompt is cached (it is computed, not shared)."""
    async with dgr.open_node(node_config(prefill_chunk=64)) as node:
        prompt = node.tokenize("The quick brown fox jumps over the lazy dog, and then")
        decoded = await node.generate(prompt, dgr.SamplingParams(max_tokens=20, logprobs=3,
                                                                 ignore_eos=True))
        full = prompt + decoded.token_ids
        scores = []
        for max_tokens in (0, 0, 2):
            params = dgr.SamplingParams(max_tokens=max_tokens, prompt_logprobs=3, ignore_eos=True)
            async with node.stream(full, params) as chunks:
                got = [chunk async for chunk in chunks]
                scores.append(chunks.prompt_logprobs)
                assert chunks.cached_tokens == 0
            assert len([c for c in got if c.token_id is not None]) == max_tokens
        assert scores[0] == scores[1] == scores[2] and len(scores[0]) == len(full)
        assert scores[0][0] is None
        tail = scores[0][len(prompt):]
        assert [lp for lp, _ in tail] == decoded.token_logprobs
        assert [top for _, top in tail] == decoded.logprobs


class GrammarOracle:
    """llama.cpp's grammar sampler on the tiny model's vocabulary, outside the node:
    which tokens a grammar allows after the tokens accepted so far."""

    def __init__(self, model_path, grammar):
        import llama_cpp

        self.llama = llama_cpp
        params = llama_cpp.llama_model_default_params()
        params.vocab_only = True
        self.model = llama_cpp.llama_model_load_from_file(model_path.encode(), params)
        vocab = llama_cpp.llama_model_get_vocab(self.model)
        self.sampler = llama_cpp.llama_sampler_init_grammar(vocab, grammar.encode(), b"root")

    def allows(self, token):
        one = (self.llama.llama_token_data * 1)()
        one[0].id, one[0].logit = token, 1.0
        cur = self.llama.llama_token_data_array(data=one, size=1, selected=-1, sorted=False)
        self.llama.llama_sampler_apply(self.sampler, ctypes.byref(cur))
        return one[0].logit != float("-inf")

    def accept(self, token):
        self.llama.llama_sampler_accept(self.sampler, token)

    def close(self):
        self.llama.llama_sampler_free(self.sampler)
        self.llama.llama_model_free(self.model)


async def test_a_greedy_grammar_session_takes_the_best_token_the_grammar_allows(
        node_config, tiny_model):
    """Greedy under a grammar is the argmax of the constrained vocabulary: every
    token the model ranks above the chosen one is one the grammar rejects (the
    chosen one is looked for among the best candidates when the free pick is
    rejected, or in the constrained vocabulary when none of those is allowed)."""
    grammar = 'root ::= [a-f]+ "=" [0-9] [0-9]? ("," [a-f]+ "=" [0-9])*'
    params = dgr.SamplingParams(max_tokens=24, grammar=grammar, logprobs=20)
    async with dgr.open_node(node_config()) as node:
        for prompt in ("key value pairs:", "Once upon a time", "zzz 123"):
            result = await node.generate(prompt, params)
            oracle = GrammarOracle(tiny_model, grammar)
            try:
                for token, tops in zip(result.token_ids, result.logprobs, strict=True):
                    assert oracle.allows(token)
                    chosen = next((lp for t, lp in tops if t == token), None)
                    better = [t for t, lp in tops if chosen is None or lp > chosen
                              or (lp == chosen and t < token)]
                    assert not any(oracle.allows(t) for t in better), (prompt, token, tops)
                    oracle.accept(token)
            finally:
                oracle.close()


async def test_a_sampled_grammar_session_draws_from_the_constrained_distribution(node_config):
    """A sampled grammar session without truncation redraws a pick the grammar
    rejects: over many seeds, each allowed token's frequency follows the model's
    probabilities renormalised over the allowed ones. The grammar allows a few
    one-character tokens the model ranks below its favourite, so that most free
    picks are rejected, some redrawn and some constrained."""
    prompt = "pick a letter:"
    async with dgr.open_node(node_config()) as node:
        probe = await node.generate(prompt, dgr.SamplingParams(max_tokens=1, logprobs=20))
        allowed = {}
        for token, lp in probe.logprobs[0][1:]:
            text = node.detokenize([token])
            if len(text) == 1 and text.isalnum() and text.isascii() and len(allowed) < 5:
                allowed[token] = (text, math.exp(lp))
        assert len(allowed) >= 3
        grammar = "root ::= " + " | ".join(f'"{text}"' for text, _ in allowed.values())
        counts = dict.fromkeys(allowed, 0)
        n = 600
        for seed in range(n):
            got = await node.generate(prompt, dgr.SamplingParams(
                max_tokens=1, temperature=1.0, seed=seed, grammar=grammar))
            counts[got.token_ids[0]] += 1
    total = sum(p for _, p in allowed.values())
    for token, (text, p) in allowed.items():
        assert abs(counts[token] / n - p / total) < 0.05, (text, p / total, counts)


@pytest.mark.skipif(not hasattr(os, "SCHED_BATCH"), reason="Linux scheduling policies")
async def test_the_nodes_thread_is_sched_batch_while_it_is_open_and_the_engines_is_not(
        node_config):
    """The Trio thread's wake-ups must not preempt the engine's threads (sched_batch):
    SCHED_BATCH while the node is open, its policy before restored after; the engine
    thread, started from it, normal; --no-sched-batch leaves the thread as it is."""
    assert os.sched_getscheduler(0) == os.SCHED_OTHER
    async with dgr.open_node(node_config()) as node:
        assert os.sched_getscheduler(0) == os.SCHED_BATCH
        (engine_tid,) = [t.native_id for t in threading.enumerate() if t.name == "dgr-engine"]
        assert os.sched_getscheduler(engine_tid) == os.SCHED_OTHER
        await node.generate("Hello", dgr.SamplingParams(max_tokens=3))
    assert os.sched_getscheduler(0) == os.SCHED_OTHER
    async with dgr.open_node(node_config(sched_batch=False)):
        assert os.sched_getscheduler(0) == os.SCHED_OTHER


async def test_nodes_sharing_a_thread_restore_its_policy_when_the_last_closes(node_config):
    """Two nodes open in one Trio thread (two tasks), the first opened closing first:
    the thread stays SCHED_BATCH while one is open and gets its policy back after."""
    before = os.sched_getscheduler(0)
    opened, close, closed = ([trio.Event(), trio.Event()] for _ in range(3))

    async def node(i):
        async with dgr.open_node(node_config()):
            opened[i].set()
            await close[i].wait()
        closed[i].set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(node, 0)
        await opened[0].wait()
        nursery.start_soon(node, 1)
        await opened[1].wait()
        close[0].set()
        await closed[0].wait()
        assert os.sched_getscheduler(0) == os.SCHED_BATCH  # the second is still open
        close[1].set()
    assert os.sched_getscheduler(0) == before


async def test_a_system_that_refuses_the_policy_still_opens_the_node(node_config, monkeypatch):
    def refuse(*_):
        raise PermissionError("not allowed here")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    async with dgr.open_node(node_config()) as node:
        assert (await node.generate("Hello", dgr.SamplingParams(max_tokens=2))).completion_tokens


async def test_every_bound_is_in_one_statistics_call_and_in_capabilities(node_config):
    """Trio's channels' way: each bound between a caller and the batch loop, in use
    and in all (the queue, slots, KV, the request channel, the event ring, the KV
    operations, the saves held, the readers' chunks)."""
    async with dgr.open_node(node_config()) as node:
        # more tokens than the reader's credits: the session waits on its slot for it
        params = dgr.SamplingParams(max_tokens=300, ignore_eos=True)
        async with node.stream("count on", params) as chunks:
            await chunks.__anext__()
            stats = node.statistics()
            for name in ("waiting_sessions", "waiting_tokens", "slots", "kv_cells_reserved",
                         "requests", "event_ring", "kv_operations", "saves_held",
                         "reply_chunks"):
                assert 0 <= stats[name]["used"] <= stats[name]["capacity"], name
            assert stats["slots"]["used"] == 1 and stats["reply_chunks"]["readers"] == 1
            assert node.capabilities()["bounds"].keys() == stats.keys()


async def test_slots_show_running_sessions_never_their_text(node_config):
    params = dgr.SamplingParams(max_tokens=300, ignore_eos=True)
    async with dgr.open_node(node_config(max_running=2)) as node:
        assert [s["is_processing"] for s in node.slots()] == [False, False]
        # streams read one chunk each, then not: their sessions stay on their slots
        async with node.stream("a secret prompt", params) as first, \
                node.stream("another secret", params) as second:
            await anext(aiter(first))
            await anext(aiter(second))
            slots = node.slots()
            assert [s["is_processing"] for s in slots] == [True, True]
            for state in slots:
                assert state["n_prompt_tokens"] > 0 and state["n_ctx"] > 0
                assert 1 <= state["next_token"][0]["n_decoded"] < 300
                assert state["next_token"][0]["n_remain"] == 300 - state["next_token"][0]["n_decoded"]
            assert "secret" not in repr(slots)


@pytest.mark.parametrize("overrides, said", [
    ({"chat_template_file": "/no/such/template.jinja"}, "chat template file"),
    ({"chat_template": "no-such-template-name"}, "chat template 'no-such-template-name'"),
])
async def test_a_chat_template_that_cannot_render_stops_the_start(node_config,
                                                                   overrides, said):
    with pytest.raises(ModelLoadError, match=said):
        async with dgr.open_node(node_config(**overrides)):
            pass
