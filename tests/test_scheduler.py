"""The scheduler and admission in isolation: pure Python, no engine."""

import pytest

from dgr.admission import Admission, Budgets
from dgr.config import SamplingParams
from dgr.errors import AdmissionRejected, BudgetError
from dgr.scheduler import plan_step
from dgr.sequence import Phase, Session


def make_session(sid, prompt_len, max_tokens=8, phase=Phase.PREFILL, slot=None):
    s = Session(id=sid, prompt=list(range(1, prompt_len + 1)), params=SamplingParams(),
                max_tokens=max_tokens)
    s.phase = phase
    s.slot = sid if slot is None else slot
    if phase is Phase.DECODE:
        s.n_prefilled = prompt_len
        s.generated = [7]
    return s


def advance(plan):
    """What the node does with a step's result."""
    for c in plan.prefill:
        c.session.n_prefilled = c.end
        if c.last:
            c.session.generated.append(7)
            c.session.phase = Phase.DECODE
    for s in plan.decode:
        s.generated.append(7)


def test_long_prefill_never_starves_decoders():
    decoders = [make_session(i, 5, phase=Phase.DECODE) for i in range(4)]
    long = make_session(9, 1000)
    running = decoders + [long]
    steps = 0
    while long.phase is Phase.PREFILL:
        plan = plan_step(running, token_budget=256, prefill_chunk=64)
        assert set(plan.decode) == set(decoders)  # every decoder, every step
        assert plan.n_rows <= 256
        for c in plan.prefill:
            assert c.start % 64 == 0 and (c.end % 64 == 0 or c.last)
        advance(plan)
        steps += 1
    assert steps == -(-1000 // 64)  # one chunk per step: ceil(1000 / 64)


def test_prefill_chunks_are_oldest_first_and_never_cut_to_fit():
    a, b = make_session(1, 100), make_session(2, 100)
    decoders = [make_session(10 + i, 3, phase=Phase.DECODE) for i in range(30)]
    plan = plan_step(decoders + [a, b], token_budget=90, prefill_chunk=64)
    # 30 decode rows leave 60: the 64-token chunk waits whole; b may not jump ahead
    assert len(plan.decode) == 30 and plan.prefill == ()
    plan = plan_step(decoders[:10] + [a, b], token_budget=90, prefill_chunk=64)
    assert [(c.session.id, c.start, c.end) for c in plan.prefill] == [(1, 0, 64)]


def test_final_chunk_is_the_remainder_and_samples():
    s = make_session(1, 70)
    s.n_prefilled = 64
    plan = plan_step([s], token_budget=256, prefill_chunk=64)
    (chunk,) = plan.prefill
    assert (chunk.start, chunk.end, chunk.last) == (64, 70, True)
    tokens, positions, seq_ids, want, _ = plan.arrays()
    assert positions.tolist() == list(range(64, 70))
    assert want.tolist() == [0, 0, 0, 0, 0, 1]
    assert plan.output_rows() == [(s, 5)]


def test_slow_reader_is_skipped_others_continue():
    fast = make_session(1, 4, phase=Phase.DECODE)
    slow = make_session(2, 4, phase=Phase.DECODE)
    slow.reader_ready = lambda: False
    plan = plan_step([fast, slow], token_budget=64, prefill_chunk=16)
    assert plan.decode == (fast,)


def test_decode_rows_are_in_ascending_slot_order():
    """Sessions reuse slots in any order as others finish; llama.cpp evaluates a
    batch whose sequence ids are out of order in several ubatches (4.8x slower
    at 16 rows, measured), so the plan orders decode rows by slot."""
    running = [make_session(i, 3, phase=Phase.DECODE, slot=slot)
               for i, slot in enumerate([5, 2, 7, 0, 3])]
    plan = plan_step(running, 256, 16)
    assert [s.slot for s in plan.decode] == [0, 2, 3, 5, 7]
    _, _, seq_ids, _, _ = plan.arrays()
    assert list(seq_ids) == [0, 2, 3, 5, 7]
    assert [row for _, row in plan.output_rows()] == [0, 1, 2, 3, 4]


def test_decode_rows_feed_back_the_last_token_at_the_next_position():
    s = make_session(3, 10, phase=Phase.DECODE, slot=5)
    s.generated = [11, 12, 13]
    tokens, positions, seq_ids, want, n_logprobs = plan_step([s], 8, 4).arrays()
    assert (tokens.tolist(), positions.tolist(), seq_ids.tolist()) == ([13], [12], [5])


BUDGETS = Budgets(kv_cells_total=1000, kv_cells_per_session=500, slots=2, max_waiting=2,
                  max_waiting_tokens=300, step_tokens=256, step_outputs=2, memory_bytes=10_000)


def waiting(sid, prompt_len, max_tokens=10):
    return make_session(sid, prompt_len, max_tokens=max_tokens, phase=Phase.WAITING, slot=-1)


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
    assert adm.reserved_cells == 220
    adm.submit(waiting(3, 100))
    adm.submit(waiting(4, 150))
    assert [s.id for s in adm.waiting] == [3, 4] and adm.waiting_tokens == 250
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
    adm.submit(big)
    second = waiting(2, 300, max_tokens=50)   # 450 + 350 > 600: waits despite free slots
    small = waiting(3, 10, max_tokens=10)     # would fit, but FIFO keeps it behind
    adm.submit(second)
    adm.submit(small)
    adm.promote()
    assert [s.id for s in adm.running] == [1]
    big.finish("length")
    adm.release(big)
    adm.promote()
    assert [s.id for s in adm.running] == [2, 3]
    assert adm.reserved_cells == 350 + 20
    assert [s.id for s in adm.take_started()] == [1, 2, 3]


def test_cancelled_waiting_session_leaves_the_queue():
    adm = Admission(BUDGETS)
    for sid in (1, 2, 3):
        adm.submit(waiting(sid, 100))
    queued = adm.waiting[0]
    queued.finish("cancelled")
    assert list(adm.finished()) == [queued]
    adm.release(queued)
    assert not adm.waiting and adm.waiting_tokens == 0


def test_draining_rejects():
    adm = Admission(BUDGETS)
    adm.draining = True
    with pytest.raises(AdmissionRejected) as exc:
        adm.submit(waiting(1, 10))
    assert exc.value.reason == "draining"


def test_memory_budget():
    BUDGETS.check_memory(model_bytes=5000, kv_bytes=3000, scratch_bytes=2000)
    with pytest.raises(BudgetError, match="weights"):
        BUDGETS.check_memory(model_bytes=20_000, kv_bytes=0, scratch_bytes=0)
    with pytest.raises(BudgetError, match="exceed"):
        BUDGETS.check_memory(model_bytes=5000, kv_bytes=3000, scratch_bytes=2001)


def test_prefill_sessions_per_step_bound_and_one_call_per_chunk():
    decoders = [make_session(i, 3, phase=Phase.DECODE) for i in range(3)]
    prompts = [make_session(10 + i, 5 + i) for i in range(3)]
    assert len(plan_step(prompts, 256, 16, prefill_sessions=1).prefill) == 1
    plan = plan_step(decoders + prompts, 256, 16, prefill_sessions=4)
    assert [c.session.id for c in plan.prefill] == [10, 11, 12]
    # all decode rows in one call, every chunk alone in its own call
    assert plan.calls() == [(0, 3), (3, 3 + 5), (8, 8 + 6), (14, 14 + 7)]
    many = [make_session(i, 3, phase=Phase.DECODE) for i in range(16)]
    assert plan_step(many, 256, 16).calls() == [(0, 16)]
    assert plan_step(prompts[:1], 256, 16).calls() == [(0, 5)]


def test_want_flags_match_the_engine():
    from dgr import _batch, scheduler

    assert (scheduler.WANT_SAMPLE, scheduler.WANT_LOGPROBS) == (_batch.WANT_SAMPLE,
                                                                _batch.WANT_LOGPROBS)
