"""Placement (which slot, what prefix, which evictions, in what order) and the
prefix cache it owns, without a model: the step loop's calls are made by hand."""

import attrs
import numpy as np

from dgr.adapters import Adapter
from dgr.admission import Admission, Budgets
from dgr.spec import SamplingParams
from dgr.kv_tier import MIN_RESTORE_TOKENS, HostTier, Prefix
from dgr.placement import Evict, Placement, Save, Start
from dgr.prefix_cache import PrefixCache
from dgr.sequence import FinishReason, Phase, Session
from dgr.spec import SessionSpec



def node(slots=3, cells=1000, min_follow=4, tier=None):
    """Admission and placement; with `tier` (a HostTier) prefixes of at least
    MIN_RESTORE_TOKENS tokens leaving the pool are saved there and restored from there."""
    budgets = Budgets(kv_cells_total=cells, kv_cells_per_session=cells, slots=slots,
                      max_waiting=4, max_waiting_tokens=4000, step_tokens=256,
                      step_outputs=slots, memory_bytes=1)
    return Admission(budgets, Placement(cells, PrefixCache(min_follow=min_follow), tier,
                                        MIN_RESTORE_TOKENS))


def session(sid, prompt, max_tokens=4, leader=None):
    params = SamplingParams(max_tokens=max_tokens, speculation="off")
    return Session(id=sid, spec=SessionSpec(list(prompt), params),
                   leader=leader)


def cached(adm, sid, prompt, generated=()):
    """A session admitted, started, run to its end: its slot becomes a cache entry."""
    s = session(sid, prompt)
    adm.submit(s)
    assert adm.placement.take_ops() == [Start(s)]
    run_to_end(adm, s, generated)
    return s


def run_to_end(adm, s, generated=()):
    """What the step loop does for a session that prefills all and ends."""
    placement = adm.placement
    placement.started(s)
    s.record_prefill(len(s.spec.prompt))
    placement.prefilled(s, len(s.spec.prompt))
    for t in generated:
        s.record_token(t, 0.0)
    s.finish(FinishReason.LENGTH)
    placement.finished(s, kept=len(s.spec.prompt) + max(0, len(generated) - 1))
    placement.retired(s, reached_loop=True)
    adm.release(s)


def test_a_session_extending_a_cached_entry_goes_on_in_place():
    adm = node()
    first = cached(adm, 1, range(100), generated=[500, 501])
    # the entry holds the prompt and the first generated token (the last was not fed back)
    nxt = session(2, [*range(100), 500, 900])
    adm.submit(nxt)
    assert (nxt.slot, nxt.reuse_from, nxt.n_reused) == (first.slot, first.slot, 101)
    assert adm.placement.take_ops() == [Start(nxt)]


def test_a_partly_shared_entry_is_copied_and_survives():
    adm = node()
    first = cached(adm, 1, range(100))
    other = session(2, [*range(10), 999])
    adm.submit(other)
    assert other.slot != first.slot and other.reuse_from == first.slot and other.n_reused == 10
    assert adm.placement.cache.cached_slots == [first.slot]


def test_with_every_slot_cached_a_few_shared_tokens_do_not_cut_a_recent_entry():
    """Prompts that share a few tokens (a common opening) with every entry: each new
    one takes the least recently used entry's slot, copying the few tokens, rather
    than cutting the entry it copies from, so entries leave least recently used first."""
    adm = node(slots=3)
    ends = [cached(adm, sid, [7, 7, sid, *range(100 * sid, 100 * sid + 80)]).slot
            for sid in (1, 2, 3)]
    new = session(4, [7, 7, 3, *range(900, 980)])  # shares most with the latest entry
    adm.submit(new)
    assert (new.slot, new.reuse_from, new.n_reused) == (ends[0], ends[2], 3)
    assert adm.placement.cache.cached_slots == ends[1:]


def test_an_entry_replaced_by_a_longer_restored_prefix_is_saved_first():
    """A stored prefix restored into the least recently used entry's slot replaces
    that entry whatever their lengths: the entry is saved to the host tier first."""
    tier = HostTier(10**6)
    adm = node(slots=2, tier=tier)
    stored = np.arange(5000, 5200, dtype=np.int32)
    tier.put(Prefix(stored, b"state"))
    ends = [cached(adm, sid, range(100 * sid, 100 * sid + 60)).slot for sid in (1, 2)]
    back = session(3, [*stored, 1, 2])
    adm.submit(back)
    assert back.restore is not None and back.n_reused == 200 and back.slot == ends[0]
    ops = adm.placement.take_ops()
    assert [type(op) for op in ops] == [Save, Start] and ops[0].slot == ends[0]
    assert list(ops[0].tokens) == list(range(100, 160))


def test_a_prefix_placed_but_not_started_is_not_shared():
    adm = node()
    a = session(1, range(50))
    adm.submit(a)
    b = session(2, range(60))
    adm.submit(b)  # a's start has not reached the loop: b cannot copy from it
    assert b.n_reused == 0
    adm.placement.started(a)
    c = session(3, range(70))
    adm.submit(c)  # a's slot holds nothing yet (it has prefilled nothing): still none
    assert c.n_reused == 0


def test_a_follower_is_held_until_its_leader_prefilled_the_shared_part():
    adm = node(min_follow=4)
    leader = session(1, range(64))
    adm.submit(leader)
    adm.placement.take_ops()
    adm.placement.started(leader)
    follower = session(2, [*range(64), 77])
    adm.submit(follower)
    assert follower.leader is leader and follower.share_len == 64
    assert adm.placement.take_ops() == []  # held
    leader.record_prefill(32)
    adm.placement.prefilled(leader, 32)
    assert adm.placement.take_ops() == []
    leader.record_prefill(64)
    adm.placement.prefilled(leader, 64)
    assert adm.placement.take_ops() == [Start(follower)]
    assert (follower.reuse_from, follower.n_reused) == (leader.slot, 64)


def test_a_cancelled_follower_is_unheld_and_a_leaders_end_starts_the_rest():
    adm = node(min_follow=4)
    leader = session(1, range(64))
    adm.submit(leader)
    adm.placement.take_ops()
    adm.placement.started(leader)
    gone, stays = session(2, [*range(64), 1]), session(3, [*range(64), 2])
    adm.submit(gone)
    adm.submit(stays)
    assert adm.placement.take_ops() == []
    gone.finish(FinishReason.CANCELLED)
    assert adm.placement.unhold(gone) and not adm.placement.unhold(gone)
    leader.finish(FinishReason.CANCELLED)  # it ended before prefilling anything
    adm.placement.finished(leader, kept=0)
    adm.placement.retired(leader, reached_loop=True)
    assert adm.placement.take_ops() == [Start(stays)]
    assert stays.n_reused == 0


def test_a_session_cancelled_before_its_start_leaves_its_slot_empty():
    adm = node()
    first = cached(adm, 1, range(100))
    taker = session(2, [*range(100), 5])
    adm.submit(taker)  # placed on the cached entry, in place
    assert taker.slot == first.slot and taker.phase is Phase.PREFILL
    adm.placement.take_ops()
    taker.finish(FinishReason.CANCELLED)
    adm.placement.retired(taker, reached_loop=False)  # its start was never fed
    adm.release(taker)
    assert adm.placement.take_ops() == [Evict(first.slot)]
    assert adm.placement.cache.cached_cells == 0


def test_evictions_make_room_least_recently_used_first_and_flush_empties():
    adm = node(slots=3, cells=400)
    ends = [cached(adm, sid, range(base, base + 150)).slot for sid, base in ((1, 0), (2, 1000))]
    big = session(3, range(5000, 5200))  # 204 reserved + 300 cached > 400: one entry goes
    adm.submit(big)
    assert adm.placement.take_ops() == [Evict(ends[0]), Start(big)]
    assert adm.placement.cache.cached_slots == [ends[1]]
    adm.placement.flush()
    assert adm.placement.take_ops() == [Evict(ends[1])] and adm.load().cached_cells == 0


def test_without_a_cache_nothing_is_shared():
    budgets = Budgets(kv_cells_total=1000, kv_cells_per_session=1000, slots=2, max_waiting=2,
                      max_waiting_tokens=1000, step_tokens=256, step_outputs=2, memory_bytes=1)
    adm = Admission(budgets)
    a, b = session(1, range(50)), session(2, range(50))
    adm.submit_group([a, b])
    assert {a.slot, b.slot} == {0, 1} and a.n_reused == b.n_reused == 0
    assert adm.placement.take_ops() == [Start(a), Start(b)]


def test_a_match_finds_the_longest_shareable_prefix_whatever_the_lengths():
    """The cache's fast path (a slot holding all of the prompt but its last token, or
    only a part of it) agrees with comparing the tokens one by one."""
    rng = np.random.default_rng(7)
    for _ in range(200):
        cache = PrefixCache(min_follow=1)
        base = rng.integers(0, 4, 12).tolist()
        held = {}
        for slot in range(6):
            tokens = base[:rng.integers(0, 13)] + rng.integers(0, 4, rng.integers(0, 6)).tolist()
            cache.hold(slot, tokens)
            if tokens:
                held[slot] = tokens
                if rng.random() < 0.5:
                    cache.keep(slot)
        prompt = base[:rng.integers(1, 13)] + rng.integers(0, 4, rng.integers(0, 4)).tolist()

        def shared(tokens):
            n = 0
            while n < min(len(tokens), len(prompt) - 1) and tokens[n] == prompt[n]:
                n += 1
            return n

        slot, n = cache.match(np.asarray(prompt, dtype=np.int32))
        assert n == max([shared(t) for t in held.values()] + [0])
        assert (slot is None) == (n == 0) and (slot is None or shared(held[slot]) == n)


def test_the_cached_cells_are_the_cached_slots_tokens_after_any_calls():
    """The count admission reads at every placement is kept as entries come and go,
    not summed: it equals the sum over the cached slots whatever the calls."""
    rng = np.random.default_rng(11)
    cache = PrefixCache(min_follow=1)
    for _ in range(2000):
        slot, call = int(rng.integers(0, 8)), rng.integers(0, 4)
        tokens = rng.integers(0, 50, rng.integers(0, 20)).tolist()
        if call == 0:
            cache.hold(slot, tokens)
        elif call == 1:
            cache.keep(slot)
        elif call == 2:
            cache.drop(slot)
        else:
            cache.assign(slot, tokens)
        assert cache.cached_cells == sum(cache.cells(s) for s in cache.cached_slots)
        assert cache.oldest_cached == (cache.cached_slots or [None])[0]
        assert all(cache.holds(s) == (cache.cells(s) > 0) for s in range(8))


def test_prefixes_are_shared_only_under_the_same_adapters_and_scales():
    x = Adapter(0, 0, "x", "x.gguf", 1.0, 4, 8.0, 2, 100)

    def on(sid, prompt, adapters):
        s = session(sid, prompt)
        return Session(id=sid, spec=attrs.evolve(s.spec, adapters=adapters))

    adm = node(slots=4, tier=HostTier(10**6))
    base = cached(adm, 1, range(40))
    adapted = on(2, range(60), ((x, 1.0),))
    adm.submit(adapted)  # the base model's entry is not its prefix
    assert adapted.n_reused == 0 and adapted.slot != base.slot
    adm.placement.take_ops()
    run_to_end(adm, adapted)
    for sid, adapters, shared in ((3, ((x, 1.0),), adapted.slot), (4, ((x, 0.5),), None),
                                  (5, (), base.slot)):
        s = on(sid, range(80), adapters)
        adm.submit(s)
        assert (s.reuse_from if s.n_reused else None) == shared, sid
        adm.placement.take_ops()
        run_to_end(adm, s)
    # leaving the pool, only the base model's prefix (on base's slot, which session 5
    # went on in place) goes to the host tier
    adm.placement.flush(save=True)
    assert [op.slot for op in adm.placement.take_ops() if isinstance(op, Save)] == [base.slot]
