"""Prefix cache: which sequence slots hold the KV of which token prefixes.

A slot's sequence holds the KV of a list of tokens: a running session's prompt
as far as it has prefilled it, and, once the session ends, its prompt and the
tokens it generated and fed back (all but the last one sampled). A token's KV
depends on the tokens before it alone, not on the chunk, the batch or the
other sessions it was computed with (the patch stack: row-invariant matmuls,
a row-invariant flash attention for every row, and each sequence's cells in
position order). So any common prefix, to the token, is bitwise what
recomputing it gives: a session whose prompt begins with tokens a slot holds
takes those cells (`llama_memory_seq_cp` shares them without copying) and
prefills the rest. A conversation's next turn, which resends the history,
reuses the previous turn's prompt and answer.

A sequence's KV depends on the LoRa adapters it was computed with as well (a
session's `cache_key`, dgr.spec): a slot is matched only by prompts of its key.

Free slots holding tokens are the cache: least recently used first out, and
their cells count against the KV pool until they are evicted. No I/O and no
llama.cpp here: the node turns decisions into BatchLoop requests.
"""

from __future__ import annotations

import collections
from typing import Optional, Sequence

import numpy as np


def tokens_array(tokens: Sequence[int]) -> np.ndarray:
    return np.asarray(tokens, dtype=np.int32)


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if len(differ) else n


def shareable(prompt: np.ndarray, other: np.ndarray) -> int:
    """Leading tokens of `prompt` another sequence's tokens can give it: all but
    the prompt's last, which is always prefilled (for its logits)."""
    return min(common_prefix(prompt, other), len(prompt) - 1)


class PrefixCache:
    """Holders of token prefixes, among running and cached (free) slots.

    `min_follow`: a session waits for a running session still prefilling its
    prompt's prefix (admission's leader) only when that saves it at least this
    many tokens over what it can take at once (a prefill chunk)."""

    def __init__(self, min_follow: int):
        self.min_follow = min_follow
        self._held: dict[int, np.ndarray] = {}  # slot -> tokens its sequence holds the KV of
        self._held_bytes: dict[int, bytes] = {}  # the same tokens' bytes (match's fast path)
        self._keys: dict[int, tuple] = {}  # slot -> the cache key its KV was computed under
        self._cached: collections.OrderedDict[int, None] = collections.OrderedDict()  # LRU first
        self._cached_cells = 0  # the cached slots' tokens: admission asks at every placement
        # slots given a prefix whose BatchLoop start (the KV copy) is not queued yet: they
        # hold nothing another session may copy until then
        self._pending: set[int] = set()

    def match(self, prompt: np.ndarray, key: tuple = ()) -> tuple[int | None, int]:
        """(slot, tokens): a slot of cache key `key` holding the longest prefix of
        `prompt` (but its last token), preferring a cached slot, then the lowest;
        (None, 0) without one."""
        best, best_n = None, 0
        # the most a slot can give (all but the last token), as bytes: a slot holding
        # all of it, or only a part of it, is told by comparing bytes; else numpy finds
        # where they differ
        most = len(prompt) - 1
        wanted = prompt[:most].tobytes()
        wanted_itemsize = prompt.itemsize
        for slot in sorted(self._held):
            if slot in self._pending or self._keys.get(slot, ()) != key:
                continue
            held = self._held_bytes[slot]
            if held.startswith(wanted):
                n = most
            elif wanted.startswith(held):
                n = len(held) // wanted_itemsize
            else:
                n = shareable(prompt, self._held[slot])
            if n > best_n or (n == best_n and n and slot in self._cached
                              and best not in self._cached):
                best, best_n = slot, n
        return best, best_n

    def hold(self, slot: int, tokens: Sequence[int]) -> None:
        """`slot`'s sequence now holds the KV of `tokens` (and nothing after them)."""
        if slot in self._cached:
            self._cached_cells += len(tokens) - self.cells(slot)
        if len(tokens):
            held = self._held[slot] = tokens_array(tokens)
            self._held_bytes[slot] = held.tobytes()
        else:
            self._held.pop(slot, None)
            self._held_bytes.pop(slot, None)
            self._cached.pop(slot, None)

    def assign(self, slot: int, tokens: Sequence[int], key: tuple = ()) -> None:
        """A session of cache key `key` is placed on `slot` with `tokens` in its
        sequence once it starts (reused in place or copied): the slot holds exactly
        those, under that key, shareable once `activate` says its start has been
        queued."""
        self.drop(slot)
        self.hold(slot, tokens)
        if key:
            self._keys[slot] = key
        self._pending.add(slot)

    def activate(self, slot: int) -> None:
        """The slot's start is queued to the BatchLoop: what it holds may be shared."""
        self._pending.discard(slot)

    def tokens(self, slot: int) -> np.ndarray:
        """The tokens the slot's sequence holds the KV of."""
        held = self._held.get(slot)
        return held if held is not None else tokens_array([])

    def key(self, slot: int) -> tuple:
        """The cache key the slot's KV was computed under (() : the base model alone)."""
        return self._keys.get(slot, ())

    def cells(self, slot: int) -> int:
        held = self._held.get(slot)
        return 0 if held is None else len(held)

    def holds(self, slot: int) -> bool:
        return slot in self._held

    def keep(self, slot: int) -> None:
        """The slot's session ended: what it holds becomes a cache entry (most recent)."""
        if slot in self._held:
            if slot not in self._cached:
                self._cached_cells += self.cells(slot)
            self._cached[slot] = None
            self._cached.move_to_end(slot)

    def drop(self, slot: int) -> None:
        """The slot's sequence holds nothing any more (evicted, or given to a new session)."""
        if self._cached.pop(slot, False) is None:
            self._cached_cells -= self.cells(slot)
        self._pending.discard(slot)
        self._held.pop(slot, None)
        self._held_bytes.pop(slot, None)
        self._keys.pop(slot, None)

    @property
    def cached_slots(self) -> list[int]:
        """Free slots holding a prefix, least recently used first."""
        return list(self._cached)

    @property
    def oldest_cached(self) -> int | None:
        """The cached slot that leaves first (least recently used), if any."""
        return next(iter(self._cached), None)

    @property
    def cached_cells(self) -> int:
        return self._cached_cells


def prefix_cache_off(config, info: dict) -> Optional[str]:
    """Why the node runs without the prefix cache, or None where it has one. A
    recurrent state holds a sequence's whole past in one cell: no prefix of it can be
    shared or kept."""
    if not config.prefix_cache:
        return "--no-prefix-cache"
    if not config.kv_unified:
        return "split KV (--no-kv-unified)"
    if info["memory"] != "attention":
        return (f"the model's {info['memory']} state keeps a sequence's whole past in one "
                "cell: no prefix of it can be shared or kept")
    return None
