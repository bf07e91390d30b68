"""The batch loop's scheduler (policy and post-step update) and admission in
isolation: no llama.cpp, no model."""

import pytest

from dgr import _scheduler
from dgr._codes import NO_LOGITS, FinishCode
from dgr.admission import Admission, Budgets
from dgr.spec import SamplingParams
from dgr.errors import AdmissionRejected, BudgetError
from dgr.events import CallFailed, Decoded, Finished, Prefilled, Sampled
from dgr.sequence import FinishReason, Phase, Session
from dgr.spec import SessionSpec


EOG = 99


def spec(prompt, max_tokens, **params) -> SessionSpec:
    """A session's spec as the node resolves it (no drafting unless asked)."""
    return SessionSpec(list(prompt), SamplingParams(**{"speculation": "off"} | params,
                                                    max_tokens=max_tokens))


def scheduler(n_slots=8, token_budget=256, prefill_chunk=64, prefill_sessions=4, one_call=False,
              decode_stall=0.0):
    return _scheduler.Scheduler(n_slots, token_budget, prefill_chunk, prefill_sessions,
                                n_vocab=100, eog_tokens=[EOG], one_call=one_call,
                                decode_stall=decode_stall)


def decoding(sched, slots, prompt_len=3, max_tokens=1000, credits=1000, **kw):
    """Start sessions on `slots` and step until all of them decode."""
    for slot in slots:
        sched.start(slot, spec(list(range(1, prompt_len + 1)), max_tokens), credits=credits, **kw)
    while any(sched.slot_state(slot)[0] != 2 for slot in slots):  # SLOT_DECODE
        _, decode, chunks = sched.plan_step()
        sched.apply(tokens_for(sched, decode, chunks))


def tokens_for(sched, decode, chunks, token=7):
    """One sampled token per row of the plan (-1 for rows without output)."""
    rows = [token] * len(decode)
    for slot, start, end in chunks:
        rows += [-1] * (end - start - 1) + [token]
    return rows


def kinds(events, kind):
    return [e for e in events if isinstance(e, kind)]


def test_long_prefill_never_starves_decoders():
    sched = scheduler(prefill_chunk=64)
    decoding(sched, range(4))
    sched.start(6, spec(list(range(1000)), 10))
    steps = 0
    while sched.slot_state(6)[0] == 1:
        _, decode, chunks = sched.plan_step()
        assert decode == [0, 1, 2, 3]  # every decoder, every step
        assert len(decode) + sum(e - s for _, s, e in chunks) <= 256
        for slot, start, end in chunks:
            assert start % 64 == 0 and (end % 64 == 0 or end == 1000)
        sched.apply(tokens_for(sched, decode, chunks))
        steps += 1
    assert steps == -(-1000 // 64)  # one chunk per step: ceil(1000 / 64)


def test_prefill_pieces_are_oldest_first_and_cut_to_fit():
    sched = scheduler(n_slots=40, token_budget=90, prefill_chunk=64)
    decoding(sched, range(30))
    sched.start(35, spec(list(range(100)), 10))  # older
    sched.start(31, spec(list(range(100)), 10))  # younger, on a lower slot
    _, decode, chunks = sched.plan_step()
    # 30 decode rows leave 60: the oldest takes them; the younger may not jump ahead
    assert len(decode) == 30 and chunks == [(35, 0, 60)]
    sched.apply(tokens_for(sched, decode, chunks))
    sched = scheduler(n_slots=32, token_budget=40, prefill_chunk=16)
    decoding(sched, range(30))
    sched.start(31, spec(list(range(100)), 10))
    sched.start(30, spec(list(range(100)), 10))
    # 10 rows left: less than the oldest's least piece (MIN_PIECE), so both wait
    assert len(sched.plan_step()[1]) == 30 and sched.plan_step()[2] == []


def test_without_decoders_a_step_prefills_its_whole_budget():
    sched = scheduler(token_budget=256, prefill_chunk=64)
    sched.start(5, spec(list(range(200)), 5))
    sched.start(1, spec(list(range(200)), 5))
    assert sched.plan_step()[2] == [(5, 0, 200), (1, 0, 56)]


def test_final_piece_is_the_remainder_and_yields_the_first_token():
    sched = scheduler(prefill_chunk=64)
    decoding(sched, [0])
    sched.start(2, spec(list(range(70)), 5))
    _, decode, chunks = sched.plan_step()
    assert chunks == [(2, 0, 64)]  # while a session decodes: prefill_chunk rows a step
    assert Prefilled(2, 0, 64) in sched.apply([7] + [-1] * 64)
    _, _, chunks = sched.plan_step()
    assert chunks == [(2, 64, 70)]
    events = sched.apply([7] + [-1] * 5 + [42])
    assert Prefilled(2, 64, 70) in events and Sampled(2, 42) in events
    assert sched.slot_state(2) == (2, 70, 1, 0)  # decoding, prefilled, one token, credit spent


def test_while_sessions_decode_the_step_time_model_bounds_prefill():
    """With decode_stall and a step-time model, a step's prefill rows are the most
    whose predicted time keeps the step within decode_stall x a decode-only step."""
    sched = scheduler(token_budget=512, prefill_chunk=64, decode_stall=2.0)
    decoding(sched, range(4))
    sched.start(6, spec(list(range(2000)), 5))
    assert sched.plan_step()[2] == [(6, 0, 64)]  # no model yet: prefill_chunk rows
    sched.apply(tokens_for(sched, *sched.plan_step()[1:]))
    a, b, c = 0.010, 0.001, 0.0001
    sched.set_step_time(a, b, c, 0.0)  # room: (2 - 1)(a + 4b) = 0.014 s = 140 rows of c
    _, decode, chunks = sched.plan_step()
    assert chunks == [(6, 64, 204)] and sched.last_prefill_cap == 140
    sched.apply(tokens_for(sched, decode, chunks))
    e = 0.0002  # attention: each row's cost grows with the cells before it
    sched.set_step_time(a, b, c, e)
    _, decode, chunks = sched.plan_step()
    (slot, start, end), = chunks
    n = end - start
    cost = lambda n: c * n + e * n * (2 * start + n + 1) / 2048
    assert cost(n) <= 0.014 < cost(n + 1)
    sched.set_step_time(a, b, 1.0, 0.0)  # a row costs more than the room: MIN_PIECE
    sched.apply(tokens_for(sched, decode, chunks))
    assert [e - s for _, s, e in sched.plan_step()[2]] == [16]
    for bad in [(a, b, 0.0, 0.0), (a, b, c, -1.0), (0.0, 0.0, c, 0.0)]:
        with pytest.raises(ValueError):
            sched.set_step_time(*bad)
    with pytest.raises(ValueError):
        scheduler(decode_stall=0.5)


def test_the_stall_is_counted_from_the_decode_only_step_the_node_timed_at_these_rows():
    """Where the node timed decode-only steps of the plan's output rows at the
    sessions' contexts (RowTimes), the room is decode_stall - 1 times that step's
    seconds, not the fit's a + b n: a CPU's step is not linear in its rows (three rows
    may cost about eight)."""
    sched = scheduler(token_budget=512, prefill_chunk=64, decode_stall=2.0, one_call=True)
    decoding(sched, range(4))
    sched.start(6, spec(list(range(2000)), 5))
    sched.apply(tokens_for(sched, *sched.plan_step()[1:]))  # no model yet: prefill_chunk rows
    a, b, c = 0.010, 0.001, 0.0001
    sched.set_step_time(a, b, c, 0.0)  # the fit's 4-row step: 0.014 s, room for 140 rows
    sched.set_row_times([(4, 0.020, 0.0)])  # as timed: 0.020 s, room for 200
    _, decode, chunks = sched.plan_step()
    assert decode == [0, 1, 2, 3] and sched.last_prefill_cap == 200
    sched.apply(tokens_for(sched, decode, chunks))
    sched.set_row_times([(3, 0.020, 0.0)])  # not timed at 4 rows: the fit's
    sched.plan_step()
    assert sched.last_prefill_cap == 140


def test_slow_reader_is_skipped_others_continue():
    sched = scheduler()
    decoding(sched, [0], credits=16)
    decoding(sched, [1], credits=2)   # its first token took one credit
    _, decode, _ = sched.plan_step()
    assert decode == [0, 1]
    sched.apply([7, 7])
    _, decode, _ = sched.plan_step()
    assert decode == [0]            # slot 1's reader holds everything it may
    sched.apply([7])
    sched.credit(1)                 # its task took a token
    assert sched.plan_step()[1] == [0, 1]


def test_decode_rows_are_in_ascending_slot_order():
    """Sessions reuse slots in any order as others finish; llama.cpp evaluates a
    batch whose sequence ids are out of order in several ubatches (4.8x slower
    at 16 rows, measured), so the plan orders decode rows by slot."""
    sched = scheduler()
    decoding(sched, [5, 2, 7, 0, 3])
    assert sched.plan_step()[1] == [0, 2, 3, 5, 7]


def test_post_step_update_ends_sessions_on_length_eog_and_request():
    sched = scheduler()
    for slot in range(4):
        sched.start(slot, spec([1, 2, 3], 3 if slot == 0 else 100, ignore_eos=slot == 2),
                    credits=9)
    _, decode, chunks = sched.plan_step()
    sched.apply(tokens_for(sched, decode, chunks))  # each session's first token
    sched.request_finish(3, FinishReason.STOP.code)  # a stop string, seen by the node
    finished, decode, _ = sched.plan_step()
    assert finished == [Finished(3, FinishReason.STOP.code, 0)] and decode == [0, 1, 2]
    events = sched.apply([7, EOG, EOG])
    assert kinds(events, Sampled) == [Sampled(0, 7),
                                            Sampled(2, EOG)]
    assert kinds(events, Finished) == [Finished(1, FinishReason.STOP.code, 0)]
    _, decode, _ = sched.plan_step()
    events = sched.apply([8, 8])
    assert events[2:] == [Sampled(0, 8),  # its third: max_tokens
                          Finished(0, FinishReason.LENGTH.code, 0),
                          Sampled(2, 8)]
    assert sched.slot_state(0)[0] == 0 and sched.slot_state(2)[2] == 3 and sched.slot_state(2)[3] == 6


def test_a_finish_requested_during_the_step_wins_over_its_token():
    sched = scheduler()
    decoding(sched, [0])
    _, decode, _ = sched.plan_step()
    sched.request_finish(0, FinishReason.CANCELLED.code)  # the caller left mid-step
    assert kinds(sched.apply([7]), Finished) == [
        Finished(0, FinishReason.CANCELLED.code, 0)]
    assert sched.plan_step() == ([], [], [])


def test_a_park_requested_during_the_step_keeps_its_token_and_ends_before_the_next_row():
    sched = scheduler()
    decoding(sched, [0], credits=100, keep_kv=True)  # one token (from its prompt's last row)
    sched.plan_step()
    sched.request_finish(0, FinishCode.FINISH_PARKED)  # its sampler drew the step's token
    events = sched.apply([7])
    assert [e.token for e in kinds(events, Sampled)] == [7] and not kinds(events, Finished)
    finished, decode, chunks = sched.plan_step()  # parked before its next row
    # the prompt's 3 positions and the first token fed back; the token just drawn is its
    assert finished == [Finished(0, FinishCode.FINISH_PARKED, 0, kept=4)]
    assert decode == chunks == []


def test_a_resumed_session_without_credits_prefills_all_but_its_sampling_row():
    sched = scheduler()
    sched.start(0, spec(list(range(1, 11)), 5), credits=0)
    _, decode, chunks = sched.plan_step()
    assert chunks == [(0, 0, 9)]
    sched.apply(tokens_for(sched, decode, chunks))
    assert sched.plan_step() == ([], [], [])  # its last row waits for a credit
    sched.credit(0)
    _, decode, chunks = sched.plan_step()
    assert chunks == [(0, 9, 10)]


def test_a_failed_call_ends_only_its_sessions():
    sched = scheduler(prefill_chunk=16)
    decoding(sched, [0, 1])
    sched.start(4, spec(list(range(10)), 5), credits=4)
    _, decode, chunks = sched.plan_step()
    assert decode == [0, 1] and chunks == [(4, 0, 10)]
    events = sched.apply(tokens_for(sched, decode, chunks), call_rc=[-3, 0])
    assert kinds(events, CallFailed) == [CallFailed(-3)]
    assert kinds(events, Finished) == [Finished(0, FinishReason.ERROR.code, -3),
                                             Finished(1, FinishReason.ERROR.code, -3)]
    assert kinds(events, Sampled) == [Sampled(4, 7)]
    _, decode, chunks = sched.plan_step()
    assert decode == [4] and chunks == []


def test_one_failed_call_for_the_whole_step_is_one_failure():
    """With one_call (unified KV) decode rows and chunks are one llama_decode: its
    failure ends every session in it and is reported once."""
    sched = scheduler(prefill_chunk=32, one_call=True)
    decoding(sched, [0, 1])
    sched.start(4, spec(list(range(10)), 5), credits=4)
    sched.start(5, spec(list(range(12)), 5), credits=4)
    _, decode, chunks = sched.plan_step()
    assert decode == [0, 1] and chunks == [(4, 0, 10), (5, 0, 12)]
    events = sched.apply(tokens_for(sched, decode, chunks), call_rc=[-3])
    assert kinds(events, CallFailed) == [CallFailed(-3)]
    assert [e.slot for e in kinds(events, Finished)] == [0, 1, 4, 5]
    assert sched.plan_step() == ([], [], [])


def test_a_row_without_logits_ends_its_session_with_an_error():
    sched = scheduler()
    decoding(sched, [0])
    sched.plan_step()
    assert sched.apply([-1]) == [Decoded(0),
                                 Finished(0, FinishReason.ERROR.code, NO_LOGITS)]


def test_prefill_sessions_per_step_bound():
    sched = scheduler(prefill_chunk=16, prefill_sessions=1)
    for slot in (3, 1, 2):
        sched.start(slot, spec(list(range(5 + slot)), 4))
    assert sched.plan_step()[2] == [(3, 0, 8)]  # one chunk, the oldest session's
    sched = scheduler(prefill_chunk=64, prefill_sessions=4)
    decoding(sched, range(3))
    for slot in (6, 4, 5):
        sched.start(slot, spec(list(range(5 + slot)), 4))
    assert sched.plan_step()[2] == [(6, 0, 11), (4, 0, 9), (5, 0, 10)]


def test_a_slot_is_reused_only_after_it_finished():
    sched = scheduler()
    decoding(sched, [0])
    with pytest.raises(ValueError, match="in use"):
        sched.start(0, spec([1, 2], 4))
    sched.request_finish(0, FinishReason.CANCELLED.code)
    sched.plan_step()
    sched.start(0, spec([1, 2], 4))


BUDGETS = Budgets(kv_cells_total=1000, kv_cells_per_session=500, slots=2, max_waiting=2,
                  max_waiting_tokens=300, step_tokens=256, step_outputs=2, memory_bytes=10_000)


def waiting(sid, prompt_len, max_tokens=10):
    params = SamplingParams(max_tokens=max_tokens, speculation="off")
    return Session(id=sid, spec=SessionSpec(list(range(1, prompt_len + 1)), params))


def test_admission_never_fits_is_rejected_at_once():
    adm = Admission(BUDGETS)
    with pytest.raises(AdmissionRejected) as exc:
        adm.submit(waiting(1, 495, max_tokens=6))
    assert exc.value.reason == "never_fits"
    adm.submit(waiting(2, 495, max_tokens=5))  # exactly the per-session context fits
    assert len(adm.running) == 1


def test_admission_runs_what_fits_then_queues_within_bounds():
    adm = Admission(BUDGETS)
    for sid in (1, 2):
        adm.submit(waiting(sid, 100))
    assert [s.id for s in adm.running] == [1, 2] and not adm.waiting
    assert sorted(s.slot for s in adm.running) == [0, 1]
    assert adm.load().reserved_cells == 220
    assert adm.submit(waiting(3, 100)) == []
    adm.submit(waiting(4, 150))
    assert [s.id for s in adm.waiting] == [3, 4] and adm.load().waiting_tokens == 250
    with pytest.raises(AdmissionRejected) as exc:
        adm.submit(waiting(5, 10))
    assert exc.value.reason == "queue_full"


def test_admission_queue_token_bound():
    adm = Admission(BUDGETS)
    adm.submit(waiting(1, 100))
    adm.submit(waiting(2, 100))
    adm.submit(waiting(3, 250))
    with pytest.raises(AdmissionRejected) as exc:
        adm.submit(waiting(4, 51))
    assert exc.value.reason == "queue_tokens_full"


def test_kv_reservation_gates_promotion_fifo():
    budgets = Budgets(kv_cells_total=600, kv_cells_per_session=500, slots=4, max_waiting=4,
                      max_waiting_tokens=2000, step_tokens=256, step_outputs=4, memory_bytes=1)
    adm = Admission(budgets)
    big = waiting(1, 400, max_tokens=50)
    assert adm.submit(big) == [big]
    second = waiting(2, 300, max_tokens=50)   # 450 + 350 > 600: waits despite free slots
    small = waiting(3, 10, max_tokens=10)     # would fit, but FIFO keeps it behind
    adm.submit(second)
    adm.submit(small)
    assert adm.promote() == []
    assert [s.id for s in adm.running] == [1]
    big.finish(FinishReason.LENGTH)
    assert adm.release(big) == [second, small]
    assert [s.id for s in adm.running] == [2, 3] and big.phase is Phase.FINISHED
    assert adm.load().reserved_cells == 350 + 20


def test_cancelled_waiting_session_leaves_the_queue():
    adm = Admission(BUDGETS)
    for sid in (1, 2, 3):
        adm.submit(waiting(sid, 100))
    queued = adm.waiting[0]
    queued.finish(FinishReason.CANCELLED)
    assert adm.release(queued) == []
    assert not adm.waiting and adm.load().waiting_tokens == 0


def test_draining_rejects():
    adm = Admission(BUDGETS)
    adm.gate.start_draining()
    with pytest.raises(AdmissionRejected) as exc:
        adm.submit(waiting(1, 10))
    assert exc.value.reason == "draining"


def test_memory_budget():
    BUDGETS.check_memory(model_bytes=5000, kv_bytes=3000, scratch_bytes=2000)
    with pytest.raises(BudgetError, match="weights"):
        BUDGETS.check_memory(model_bytes=20_000, kv_bytes=0, scratch_bytes=0)
    with pytest.raises(BudgetError, match="exceed"):
        BUDGETS.check_memory(model_bytes=5000, kv_bytes=3000, scratch_bytes=2001)


# ---------------------------------------------------------------------- prefix cache

def test_a_prefix_is_shared_to_the_token_but_never_a_prompts_last():
    from dgr.prefix_cache import common_prefix, shareable, tokens_array

    a = tokens_array([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert common_prefix(a, tokens_array([1, 2, 3, 4, 0, 6])) == 4
    assert common_prefix(a, tokens_array([])) == 0
    assert shareable(a, a) == 8  # the last token is prefilled for its logits
    assert shareable(tokens_array([1, 2, 3]), tokens_array([1, 2, 3, 4, 5])) == 2
    assert shareable(a, tokens_array([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11])) == 8


def test_prefix_cache_matches_longest_active_prefix_and_evicts_lru():
    from dgr.prefix_cache import PrefixCache, tokens_array

    cache = PrefixCache(min_follow=2)
    prompt = tokens_array(range(11))
    cache.assign(0, list(range(5)))
    assert cache.match(prompt) == (None, 0)  # placed, its start not queued yet: nothing to copy
    cache.activate(0)
    assert cache.match(prompt) == (0, 5)
    cache.hold(0, list(range(9)))  # it prefilled four more tokens
    cache.assign(1, [0, 1, 2])
    cache.activate(1)
    assert cache.match(prompt) == (0, 9)
    assert cache.match(tokens_array([0, 1, 2, 7])) == (0, 3)  # both hold it; none cached: the lowest
    cache.keep(1)  # slot 1's session ended: what it holds is a cache entry, preferred
    assert cache.match(tokens_array([0, 1, 2, 7])) == (1, 3)
    cache.keep(0)
    assert cache.cached_slots == [1, 0] and cache.cached_cells == 3 + 9
    # a finished session holds its prompt and what it generated and fed back
    cache.hold(1, [0, 1, 2, 50, 51])
    assert cache.match(tokens_array([0, 1, 2, 50, 51, 60])) == (1, 5)
    cache.drop(1)
    assert cache.cached_slots == [0] and cache.match(tokens_array([0, 1, 2, 7])) == (0, 3)
    cache.assign(0, [])  # a new session on slot 0 without a shared prefix
    assert cache.match(prompt) == (None, 0) and cache.cached_cells == 0


def test_an_entry_copied_from_is_evicted_only_after_the_copy():
    """Placement's outbox keeps the order of KV operations: an eviction a
    session's placement made goes just before that session's start, after the
    starts placed earlier (which may copy from the evicted entry)."""
    from dgr.placement import Evict, Placement, Start
    from dgr.prefix_cache import PrefixCache

    budgets = Budgets(kv_cells_total=1000, kv_cells_per_session=1000, slots=3, max_waiting=2,
                      max_waiting_tokens=1000, step_tokens=256, step_outputs=3,
                      memory_bytes=10_000)
    adm = Admission(budgets, Placement(budgets.kv_cells_total, PrefixCache(min_follow=64)))
    placement = adm.placement
    cached = []
    for sid, first in ((1, 1), (2, 1001)):  # two finished sessions leave 300-token entries
        session = Session(id=sid, spec=SessionSpec(list(range(first, first + 300)),
                                                   SamplingParams(max_tokens=10,
                                                                  speculation="off")))
        adm.submit(session)
        assert placement.take_ops() == [Start(session)]
        placement.started(session)  # as the step loop does once the start is fed
        session.record_prefill(300)
        placement.prefilled(session, 300)
        session.finish(FinishReason.LENGTH)
        placement.finished(session, kept=300)
        adm.release(session)
        cached.append(session.slot)
    sharer = Session(id=3, spec=SessionSpec(list(range(1, 151)) + [5000 + i for i in range(150)],
                                            SamplingParams(max_tokens=10, speculation="off")))
    big = Session(id=4, spec=SessionSpec(list(range(3000, 3500)),
                                         SamplingParams(max_tokens=10, speculation="off")))
    adm.submit_group([sharer, big])
    assert sharer.reuse_from == cached[0] and sharer.n_reused == 150
    assert sharer.slot not in cached  # copied into the empty slot: the entry survives it
    assert big.slot == cached[0]  # the least recently used entry, after the copy's start
    assert placement.take_ops() == [Start(sharer), Evict(cached[1]), Start(big)]


def test_an_ended_slot_keeps_its_prompt_and_the_tokens_it_fed_back_unless_it_failed():
    sched = scheduler(prefill_chunk=64)
    sched.start(0, spec(list(range(1, 11)), 3), credits=100, keep_kv=True)
    sched.start(1, spec(list(range(1, 11)), 100), credits=100, keep_kv=True)
    sched.start(2, spec(list(range(1, 11)), 3), credits=100)  # no cache: nothing kept
    for _ in range(10):
        _, decode, chunks = sched.plan_step()
        events = sched.apply(tokens_for(sched, decode, chunks))
        finished = {e.slot: e for e in kinds(events, Finished)}
        if finished:
            break
    # three tokens reported, the last one never fed back: 10 + 2 positions
    assert finished[0].reason == FinishReason.LENGTH.code and finished[0].kept == 12
    assert finished[2].kept == 0
    _, decode, chunks = sched.plan_step()
    assert decode == [1]
    failed = kinds(sched.apply([7], call_rc=[-3]), Finished)
    assert failed == [Finished(1, FinishReason.ERROR.code, -3, 0)]


def test_a_scoring_session_prefills_small_chunks_one_per_step_and_may_end_at_its_prompt():
    from dgr._codes import SCORE_CHUNK
    from dgr.events import Scored

    sched = scheduler(prefill_chunk=64)
    sched.start(0, spec(list(range(1, 41)), 0, prompt_logprobs=2))  # scores only
    sched.start(1, spec(list(range(1, 41)), 5, prompt_logprobs=0))
    sched.start(2, spec(list(range(1, 41)), 5))
    _, _, chunks = sched.plan_step()
    # one scoring chunk a step, SCORE_CHUNK rows; the next scoring session waits, the
    # plain one behind it goes on
    assert chunks == [(0, 0, SCORE_CHUNK), (2, 0, 40)]
    events = sched.apply([-1] * SCORE_CHUNK + [-1] * 39 + [7])
    scored = kinds(events, Scored)
    assert [(e.slot, e.position, e.token) for e in scored] == [
        (0, p + 1, p + 2) for p in range(SCORE_CHUNK)]
    while sched.slot_state(0)[0] != 0:
        _, decode, chunks = sched.plan_step()
        assert sum(1 for c in chunks if c[0] in (0, 1)) <= 1
        events = sched.apply(tokens_for(sched, decode, chunks))
    # slot 0 scored positions 1..39 and ended at its prompt, without a token
    finished = kinds(events, Finished)
    assert Finished(0, FinishReason.LENGTH.code, 0, 0) in finished
    assert not [e for e in kinds(events, Sampled) if e.slot == 0]
    with pytest.raises(ValueError):
        sched.start(3, spec([1, 2], 0))  # max_tokens 0 only when scoring
    with pytest.raises(ValueError):
        # scoring computes it all
        sched.start(3, spec([1, 2, 3], 4, prompt_logprobs=0), n_reused=1)
