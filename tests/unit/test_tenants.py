"""Admission's policies without a model: fcfs as it always was, priorities, a full
queue that refuses the lowest-ranked, tenants' bounds and rates, fair shares by
virtual token counters, and the decision to park a decoder for one that outranks it."""

import itertools

import pytest

from dgr.admission import Admission, Budgets, Scheduling
from dgr.errors import AdmissionRejected
from dgr.sequence import Phase, Session
from dgr.spec import Requester, SamplingParams, SessionSpec
from dgr.tenants import OUTPUT_COST, PROMPT_COST, TenantBounds, Tenants, read_keys

_ids = itertools.count(1)


def admission(slots=2, cells=1000, max_waiting=4, max_waiting_tokens=1000, policy="fcfs",
              listed=(), max_parked=4, clock=None):
    budgets = Budgets(kv_cells_total=cells, kv_cells_per_session=cells, slots=slots,
                      max_waiting=max_waiting, max_waiting_tokens=max_waiting_tokens,
                      step_tokens=64, step_outputs=slots, memory_bytes=1)
    tenants = Tenants(listed, clock) if clock else Tenants(listed)
    return Admission(budgets, scheduling=Scheduling(policy, max_parked=max_parked),
                     tenants=tenants)


def session(tenant="default", priority=0, prompt=10, max_tokens=10):
    spec = SessionSpec(list(range(prompt)), SamplingParams(max_tokens=max_tokens),
                       requester=Requester(tenant, priority))
    return Session(id=next(_ids), spec=spec)


def decoding(s, tokens=1):
    """The batch loop gave `s` tokens (it decodes)."""
    for t in range(tokens):
        s.record_token(t, 0.0)


def test_keys_file_names_tenants_and_their_bounds(tmp_path):
    path = tmp_path / "keys"
    path.write_text("# tenants\nk1 tenant=batch weight=1 max_running=4 max_waiting=8\n"
                    "k2 tenant=chat weight=3 tokens_per_min=6000  # interactive\n"
                    "k3 tenant=batch weight=1 max_running=4 max_waiting=8\n\n")
    keys = read_keys(str(path))
    assert keys["k1"] == keys["k3"] == TenantBounds("batch", 1.0, max_running=4, max_waiting=8)
    assert keys["k2"] == TenantBounds("chat", 3.0, tokens_per_min=6000)


@pytest.mark.parametrize("text, says", [
    ("k1 weight=2\n", "tenant=NAME is missing"),
    ("k1 tenant=a colour=red\n", "unknown option colour"),
    ("k1 tenant=a weight=-1\n", "weight must be a positive number"),
    ("k1 tenant=a max_running=x\n", "max_running must be an integer of at least 1"),
    ("k1 tenant=a tokens_per_min=0\n", "tokens_per_min must be an integer of at least 1"),
    ("k1 tenant=a max_waiting=-1\n", "max_waiting must be an integer of at least 0"),
    ("k1 tenant=a\nk1 tenant=b\n", "listed twice"),
    ("k1 tenant=a weight=1\nk2 tenant=a weight=2\n", "other options"),
    ("k1 tenant=a tenant=b\n", "tenant is given twice"),
    ("tenant=a\n", "starts with its key"),
    ("# nothing\n", "lists no key"),
])
def test_a_bad_keys_file_is_refused_naming_its_line(tmp_path, text, says):
    path = tmp_path / "keys"
    path.write_text(text)
    with pytest.raises(ValueError, match=says):
        read_keys(str(path))


def test_fcfs_runs_in_arrival_order_whatever_the_priority():
    a = admission(slots=1)
    first, low, high = session(), session(priority=5), session(priority=-5)
    for s in (first, low, high):
        a.submit(s)
    assert a.running == [first] and a.waiting == [low, high]
    decoding(first)
    a.release(first)
    assert a.running == [low] and a.take_parks() == []


def test_priority_runs_the_lowest_value_first_then_the_oldest():
    a = admission(slots=1, policy="priority", max_parked=0)
    first, low, high, high2 = session(), session(priority=5), session(priority=-5), \
        session(priority=-5)
    for s in (first, low, high, high2):
        a.submit(s)
    a.release(first)
    assert a.running == [high]
    a.release(high)
    assert a.running == [high2]
    a.release(high2)
    assert a.running == [low]


def test_a_full_queue_refuses_the_lowest_ranked_waiting_session_not_one_that_outranks_it():
    a = admission(slots=1, max_waiting=2, policy="priority", max_parked=0)
    a.submit(session())
    old_low, new_low = session(priority=3), session(priority=3)
    a.submit(old_low)
    a.submit(new_low)
    high = session(priority=-1)
    a.submit(high)
    assert a.take_refused() == [new_low]  # the newest of the lowest priority
    assert a.waiting == [old_low, high]
    with pytest.raises(AdmissionRejected) as refused:  # it ranks lowest itself
        a.submit(session(priority=3))
    assert refused.value.reason == "queue_full" and a.take_refused() == []


def test_fcfs_refuses_the_newcomer_as_before():
    a = admission(slots=1, max_waiting=1)
    a.submit(session())
    a.submit(session(priority=3))
    with pytest.raises(AdmissionRejected, match="queue_full"):
        a.submit(session(priority=-9))


def test_a_tenant_past_its_queue_bound_is_refused_and_others_are_not():
    a = admission(slots=1, listed=[TenantBounds("batch", max_waiting=1, max_queued_tokens=15)])
    a.submit(session("batch"))  # runs
    a.submit(session("batch"))  # waits
    with pytest.raises(AdmissionRejected) as refused:
        a.submit(session("batch"))
    assert refused.value.reason == "tenant_queue_full"
    a.submit(session("chat"))
    assert [s.spec.requester.tenant for s in a.waiting] == ["batch", "chat"]
    b = admission(slots=1, listed=[TenantBounds("batch", max_queued_tokens=15)])
    b.submit(session("batch"))
    b.submit(session("batch", prompt=10))
    with pytest.raises(AdmissionRejected, match="tenant_queue_full.*prompt tokens"):
        b.submit(session("batch", prompt=10))


def test_a_tenant_at_its_running_bound_waits_without_blocking_others():
    a = admission(slots=3, listed=[TenantBounds("batch", max_running=1)])
    a.submit(session("batch"))
    second = session("batch")
    a.submit(second)
    chat = session("chat")
    a.submit(chat)
    assert chat in a.running and a.waiting == [second]


def test_a_tenant_past_its_rate_waits_for_the_bucket_with_a_retry_after():
    now = [0.0]
    a = admission(slots=8, listed=[TenantBounds("batch", tokens_per_min=60)],
                  clock=lambda: now[0])
    a.submit(session("batch", prompt=50))
    a.submit(session("batch", prompt=20))  # the bucket still held tokens: admitted, below 0
    with pytest.raises(AdmissionRejected) as refused:
        a.submit(session("batch", prompt=5))
    assert refused.value.reason == "tenant_rate"
    assert refused.value.retry_after == pytest.approx(11.0)  # 10 tokens owed, then one
    a.submit(session("chat"))  # another tenant is untouched
    now[0] = 12.0
    a.submit(session("batch", prompt=5))


def _serve(a, rounds, arrivals, output=20):
    """Run `a` like a batch loop: each round every running session generates
    `output` tokens and leaves; `arrivals(round)` gives the sessions arriving.
    Returns the tokens served per tenant (VTC's costs, prompt and output)."""
    served = {}
    for r in range(rounds):
        for s in arrivals(r):
            try:
                a.submit(s)
            except AdmissionRejected:
                pass
        for s in list(a.running):
            decoding(s, output)
            t = s.spec.requester.tenant
            served[t] = served.get(t, 0) + PROMPT_COST * len(s.spec.prompt) + OUTPUT_COST * output
            a.release(s)
    return served


def test_a_tenant_sending_ten_times_the_requests_gets_only_its_weights_share():
    a = admission(slots=2, max_waiting=64, max_waiting_tokens=10 ** 6, policy="priority",
                  listed=[TenantBounds("flood", weight=1), TenantBounds("light", weight=1)])

    # the light tenant sends one a round (and has a backlog), the flood ten, filling the
    # queue: its newest places go to the light tenant's arrivals
    for _ in range(30):
        a.submit(session("light"))
    served = _serve(a, 40, lambda r: [session("flood") for _ in range(10)] + [session("light")])
    share = served["light"] / (served["light"] + served["flood"])
    assert abs(share - 0.5) <= 0.05, served


def test_weights_divide_the_tokens_among_backlogged_tenants():
    a = admission(slots=1, max_waiting=400, max_waiting_tokens=10 ** 6, policy="priority",
                  listed=[TenantBounds("gold", weight=3), TenantBounds("free", weight=1)])
    for _ in range(100):
        a.submit(session("gold"))
        a.submit(session("free"))
    served = _serve(a, 80, lambda r: [])
    assert abs(served["gold"] / (served["gold"] + served["free"]) - 0.75) <= 0.05, served


def test_a_tenant_back_from_idleness_starts_at_the_least_active_counter():
    a = admission(slots=1, max_waiting=64, policy="priority")
    a.submit(session("early"))
    _serve(a, 1, lambda r: [])
    for _ in range(5):
        a.submit(session("busy"))
    _serve(a, 3, lambda r: [])
    late = session("early")
    a.submit(late)  # "early" banked nothing while away: it takes turns with busy, not 3 at once
    a.submit(session("early"))
    served = []
    for _ in range(3):
        running, = a.running
        served.append(running.spec.requester.tenant)
        decoding(running, 20)
        a.release(running)
    assert served == ["busy", "early", "busy"]


def test_a_decoder_is_parked_for_a_session_that_outranks_it_and_resumes_first():
    a = admission(slots=2, policy="priority")
    low1, low2 = session(priority=1), session(priority=1)
    a.submit(low1)
    a.submit(low2)
    decoding(low1, 3)
    decoding(low2, 2)
    high = session(priority=0)
    a.submit(high)
    parks = a.take_parks()
    assert parks == [low2]  # the newest of the lowest rank
    assert a.take_parks() == []  # decided once
    later_low = session(priority=1)
    a.submit(later_low)
    assert a.take_parks() == []  # one parking is enough room for high
    a.parked_now(low2)  # the batch loop took its slot back
    assert low2.phase is Phase.PARKED and low2.parks == 1
    assert high in a.running and a.parked == [low2]
    assert low2.run_prompt == low2.spec.prompt + [0, 1]
    assert low2.run_spec().params.max_tokens == low2.spec.params.max_tokens - 2
    a.release(high)
    assert low2 in a.running and a.waiting == [later_low]  # ahead of newer arrivals of its rank
    assert low2.reserved_cells == len(low2.run_prompt) + low2.run_spec().params.max_tokens


def test_a_session_is_parked_at_most_max_parks_times_and_never_before_it_decodes():
    a = admission(slots=1, policy="priority")
    low = session(priority=1)
    a.submit(low)
    a.submit(session(priority=0))
    assert a.take_parks() == []  # still prefilling: no token to resume from
    b = admission(slots=1, policy="priority")
    low = session(priority=1)
    b.submit(low)
    decoding(low)
    low.parks = b.scheduling.max_parks
    b.submit(session(priority=0))
    assert b.take_parks() == []


def test_fcfs_never_parks():
    a = admission(slots=1)
    low = session(priority=1)
    a.submit(low)
    decoding(low)
    a.submit(session(priority=0))
    assert a.take_parks() == []
