"""Placement: which slot a starting session takes, what KV it starts from, which
cached prefixes go to make room, and the order in which those KV operations
reach the batch loop. The one owner of the prefix cache (dgr.prefix_cache).

Admission decides *whether* a session runs (queue, slots, reservations) and
asks `place` *where*. Every KV change placement decides becomes an operation
in one ordered outbox, which the step loop sends to the batch loop in that
order, synchronously (no checkpoint between deciding and sending):

- `Save(slot, tokens)`: copy a free slot's KV state out (into the host tier,
  dgr.kv_tier) before it is evicted or cut;
- `Evict(slot)`: empty a free slot's sequence (a cache entry leaves);
- `Start(session)`: run a session on its slot, first taking the prefix
  placement gave it (its own slot's, a copy of another slot's, or a stored
  one restored from the host tier).

The order is the safety rule: an eviction a session's placement made goes
just before that session's start (it may take the evicted slot) and after the
starts placed before it (they may copy from it). A slot given a prefix holds
nothing another session may copy until its start has reached the batch loop
(`started`). A session whose prompt shares more with a running session still
prefilling it (another sample of the same prompt, or a burst behind one system
prompt) follows it: its slot and KV are reserved, and its start is held until
the leader has prefilled that much (`prefilled`), or has ended.

With a host tier, a cache entry that leaves the pool (evicted, or cut by a
session that takes its slot) is saved first, when it is long enough to be
worth restoring and the tier does not hold it already; a session whose prompt
shares more with a stored prefix than with the pool (by `min_restore` tokens)
restores it.

A session applying LoRa adapters shares only KV computed under the same
adapters and scales (`SessionSpec.cache_key`): it matches cache entries and
follows leaders of its key alone, and its prefixes stay in the pool (the tiers
and prefix transfer keep base-model prefixes, whose blobs name no adapter).

No I/O and no llama.cpp here.
"""

from __future__ import annotations

from typing import NamedTuple, Optional, Sequence, Union

from dgr.kv_tier import HostTier
from dgr.prefix_cache import PrefixCache, common_prefix, shareable, tokens_array
from dgr.sequence import Phase, Session


class Save(NamedTuple):
    """Copy free slot `slot`'s KV state (it holds `tokens`) out to the host tier."""

    slot: int
    tokens: object  # np.ndarray


class Evict(NamedTuple):
    """Empty free slot `slot`'s sequence (a cache entry leaves)."""

    slot: int


class Start(NamedTuple):
    """Run `session` on its slot, from the prefix placement gave it."""

    session: Session


Op = Union[Save, Evict, Start]


class Placement:
    """Slots, shared prefixes and the order of KV operations (module doc).
    Without a cache (`cache` None) a session takes any free slot and nothing
    is shared. With a host tier (`tier`), prefixes of at least `min_restore`
    tokens leaving the pool are saved there, and restored from there."""

    def __init__(self, kv_cells_total: int, cache: Optional[PrefixCache] = None,
                 tier: Optional[HostTier] = None, min_restore: int = 1):
        self.cache = cache
        self.tier = tier if cache is not None else None
        self.min_restore = min_restore
        self._kv_cells_total = kv_cells_total
        self._outbox: list[Op] = []
        self._held: dict[int, list[Session]] = {}  # leader id -> followers waiting for it

    @property
    def cached_cells(self) -> int:
        return self.cache.cached_cells if self.cache is not None else 0

    # ------------------------------------------------------------ admission's calls

    def place(self, session: Session, free_slots: list[int], reserved_cells: int,
              running: Sequence[Session]) -> int:
        """Give `session` one of `free_slots` (returned; admission removes it) and,
        with a cache, a shared prefix or a leader; evict cached prefixes until
        `reserved_cells` (the session's included) and the cache fit the pool.
        Its start, after the evictions, joins the outbox."""
        cache = self.cache
        if cache is None:
            slot = free_slots[-1]
            session.start(slot)
            self._outbox.append(Start(session))
            return slot
        if session.spec.scores_prompt:
            # it scores every prompt token, so it computes them all: no prefix, no leader
            holder, n_reused = None, 0
            session.follow(None, 0)
        else:
            holder, n_reused = cache.match(session.prompt_array, session.spec.cache_key)
            self._follow(session, n_reused, running)
        restore = None
        if session.leader is not None:
            # it shares when it starts, from its leader or what holds the prefix then
            holder, n_reused = None, 0
        elif (self.tier is not None and not session.spec.scores_prompt
              and not session.spec.adapters):
            stored, n_stored = self.tier.match(session.prompt_array)
            if n_stored >= n_reused + self.min_restore:
                holder, n_reused, restore = None, n_stored, stored
        empty = next((s for s in reversed(free_slots) if not cache.holds(s)), None)
        if holder in free_slots and (cache.cells(holder) <= n_reused
                                     or (empty is None and holder == cache.oldest_cached)):
            # the session goes on from its prefix in place: it cuts nothing, or only
            # the entry that would leave first anyway
            slot = holder
        else:
            # a free slot holding nothing, else the least recently used cache entry; a
            # cache entry it only partly shares survives (its cells are shared, not cut)
            slot = empty if empty is not None else cache.oldest_cached
        if cache.cells(slot) > (n_reused if slot == holder else 0):
            # the entry it takes is cut (going on in place) or replaced (a copy or a
            # restore from elsewhere, however long)
            self._save(slot)
        cache.assign(slot, session.run_prompt[:n_reused], session.spec.cache_key)
        while reserved_cells + cache.cached_cells > self._kv_cells_total:
            # the entry copied from goes last
            victim = next((s for s in cache.cached_slots if s != holder), holder)
            self._evict(victim)
            if victim == holder:
                holder, n_reused = None, 0
                cache.assign(slot, [], session.spec.cache_key)
        session.start(slot, holder if n_reused else None, n_reused,
                      restore if n_reused else None)
        self._outbox.append(Start(session))
        return slot

    def _follow(self, session: Session, n_cached: int, running: Sequence[Session]) -> None:
        """A session whose prompt shares more with a running session still
        prefilling it (its own leader, for a request's samples) than the cache
        holds follows it. Another running session is followed only when that
        saves at least `min_follow` tokens."""
        best, common = session.leader, 0
        if best is not None:
            common = shareable(session.prompt_array, best.prompt_array)
        else:
            most = len(session.run_prompt) - 1  # shareable's bound
            for other in running:
                if (other is session or other.leader is not None or other.done
                        or other.spec.cache_key != session.spec.cache_key):
                    continue
                if other.n_prefilled >= min(len(other.run_prompt), most):
                    continue  # it has prefilled all it could share: none is to wait for
                n = shareable(session.prompt_array, other.prompt_array)
                if n > common and other.n_prefilled < n:
                    best, common = other, n
            if common < n_cached + self.cache.min_follow:
                best = None
        if best is not None and not best.done and common > n_cached:
            session.follow(best, common)
        else:
            session.follow(None, 0)

    def release(self, session: Session) -> None:
        """Admission freed the slot of a session that ran: what its sequence holds
        becomes a cache entry (most recent)."""
        if self.cache is not None and session.slot is not None:
            self.cache.keep(session.slot)

    def flush(self, save: bool = False) -> None:
        """Evict every cached prefix (running sessions keep what they share); with
        `save`, into the host tier as any eviction."""
        if self.cache is not None:
            for slot in self.cache.cached_slots:
                self._evict(slot, save)

    def cached_within(self, tokens) -> tuple[Optional[int], int]:
        """(slot, n): the cached (free) slot holding the most tokens, all of which
        begin `tokens`; (None, 0) without one."""
        best, best_n = None, 0
        if self.cache is not None:
            tokens = tokens_array(tokens)
            for slot in self.cache.cached_slots:
                if self.cache.key(slot):
                    continue  # computed under adapters: not a base-model prefix
                held = self.cache.tokens(slot)
                n = len(held)
                if best_n < n <= len(tokens) and common_prefix(tokens, held) == n:
                    best, best_n = slot, n
        return best, best_n

    def save(self, slot: int) -> None:
        """Save a cached slot's entry into the host tier (it stays in the pool)."""
        if self.cache is not None and slot in self.cache.cached_slots:
            self._save(slot)

    def _evict(self, slot: int, save: bool = True) -> None:
        if save:
            self._save(slot)
        self.cache.drop(slot)
        self._outbox.append(Evict(slot))

    def _save(self, slot: int) -> None:
        """Save the free slot's entry to the host tier before it leaves (if worth it)."""
        if self.tier is None or self.cache.key(slot):
            return  # the tiers keep base-model prefixes only
        tokens = tokens_array(self.cache.tokens(slot))
        if len(tokens) >= self.min_restore and not self.tier.covers(tokens):
            self._outbox.append(Save(slot, tokens))

    # ------------------------------------------------------------ the step loop's calls

    def take_ops(self) -> list[Op]:
        """The KV operations decided since the last call, in the order they must
        reach the batch loop; a follower's start is held back until its leader
        has its prefix (it joins a later take_ops)."""
        ops, self._outbox = self._outbox, []
        ready = []
        for op in ops:
            if isinstance(op, Start) and self._waits_for_leader(op.session):
                self._held.setdefault(op.session.leader.id, []).append(op.session)
            else:
                ready.append(op)
        return ready

    def _waits_for_leader(self, session: Session) -> bool:
        leader = session.leader
        return (leader is not None and not leader.done and leader.phase is not Phase.FINISHED
                and leader.n_prefilled < session.share_len)

    def started(self, session: Session) -> None:
        """The session's start reached the batch loop: what its slot holds may be
        shared from now on."""
        if self.cache is not None:
            self.cache.activate(session.slot)

    def prefilled(self, session: Session, end: int) -> None:
        """The session's sequence holds its prompt up to `end`: followers it has
        prefilled enough for start."""
        if self.cache is None:
            return
        self.cache.hold(session.slot, session.run_prompt[:end])
        if session.id in self._held:
            self._release_followers(session, ended=False)

    def finished(self, session: Session, kept: int) -> None:
        """The batch loop ended the session; its sequence keeps `kept` positions."""
        if self.cache is not None:
            self.cache.hold(session.slot, session.kv_tokens(kept))

    def retired(self, session: Session, reached_loop: bool) -> None:
        """The session leaves. One placed with a prefix whose start never reached
        the batch loop (cancelled first) leaves its slot empty: the cache must not
        count on the prefix. Its followers start without it."""
        if (self.cache is not None and session.phase is Phase.PREFILL and not reached_loop):
            self._evict(session.slot, save=False)
        if session.id in self._held:
            self._release_followers(session, ended=True)

    def unhold(self, session: Session) -> bool:
        """Forget a follower still held (it was cancelled); True if it was."""
        held = self._held.get(session.leader.id, []) if session.leader is not None else []
        if session in held:
            held.remove(session)
            if not held:
                del self._held[session.leader.id]
            return True
        return False

    def _release_followers(self, leader: Session, ended: bool) -> None:
        """Start the followers `leader` has prefilled enough for (all of them when it
        ended), sharing what it prefilled or, if a slot (the leader's ended one
        among them) now holds more of their prompt, that."""
        waiting = self._held.pop(leader.id, [])
        still = []
        for session in waiting:
            if not ended and leader.n_prefilled < session.share_len:
                still.append(session)
                continue
            source, n = leader.slot, 0 if ended else session.share_len
            holder, cached = self.cache.match(session.prompt_array, session.spec.cache_key)
            if cached > n:
                source, n = holder, cached
            if n:
                session.share(source, n)
                self.cache.assign(session.slot, session.run_prompt[:n], session.spec.cache_key)
            self._outbox.append(Start(session))
        if still:
            self._held[leader.id] = still
