"""Prefix cache: which sequence slots hold the KV of which prompt prefixes.

A prompt is seen as a chain of whole prefill chunks (positions [0, c), [c, 2c),
...; c = prefill_chunk); a chunk's key is a hash of every token up to its end,
so equal keys mean equal prefixes. A slot holds a prefix once its session has
prefilled those chunks, and keeps holding it after the session ends (the batch
loop keeps those cells) until the slot is given to another session or evicted.

Only whole prompt chunks are shared: their KV is bitwise what recomputing the
prompt gives, since a chunk's results depend on its own sequence alone (the
patch stack) and chunk boundaries are the same for every session. Generated
tokens and a prompt's last partial chunk are never shared (the same tokens
prefilled as a prompt would round differently).

Free slots holding a prefix are the cache: least recently used first out, and
their cells count against the KV pool until they are evicted. No I/O and no
llama.cpp here: the node turns decisions into BatchLoop requests.
"""

from __future__ import annotations

import array
import collections
import hashlib
from typing import Sequence

Key = bytes


def chunk_keys(tokens: Sequence[int], chunk: int, limit: int) -> list[Key]:
    """Keys of the whole chunks of `tokens` that end at or before `limit`: each a
    digest of the previous key and the chunk's tokens (a collision would share
    wrong KV, so not Python's 64-bit hash)."""
    keys: list[Key] = []
    key = b""
    for end in range(chunk, min(len(tokens), limit) + 1, chunk):
        key = hashlib.blake2b(key + array.array("i", tokens[end - chunk:end]).tobytes(),
                              digest_size=16).digest()
        keys.append(key)
    return keys


class PrefixCache:
    """Holders of chunk prefixes, among running and cached (free) slots."""

    def __init__(self, chunk: int):
        self.chunk = chunk
        self._holders: dict[Key, set[int]] = collections.defaultdict(set)
        self._held: dict[int, list[Key]] = {}  # slot -> keys of the chunks it holds, in order
        self._cached: collections.OrderedDict[int, None] = collections.OrderedDict()  # LRU first
        # slots given a prefix whose BatchLoop start (the KV copy) is not queued yet: they
        # hold nothing another session may copy until then
        self._pending: set[int] = set()

    def keys_for(self, prompt: Sequence[int]) -> list[Key]:
        """A prompt's shareable chunks: whole chunks before its last token (the last
        token is always prefilled, for its logits)."""
        return chunk_keys(prompt, self.chunk, len(prompt) - 1)

    def match(self, keys: Sequence[Key]) -> tuple[int | None, int]:
        """(slot, tokens): a slot holding the longest prefix of `keys`, preferring a
        cached slot, and that prefix's length in tokens; (None, 0) without one."""
        for n in range(len(keys), 0, -1):
            holders = self._holders.get(keys[n - 1], set()) - self._pending
            if holders:
                slot = next((s for s in self._cached if s in holders), min(holders))
                return slot, n * self.chunk
        return None, 0

    def hold(self, slot: int, keys: Sequence[Key]) -> None:
        """`slot`'s sequence now also holds the chunks `keys` extends its prefix with."""
        held = self._held.setdefault(slot, [])
        for key in keys[len(held):]:
            held.append(key)
            self._holders[key].add(slot)

    def assign(self, slot: int, keys: Sequence[Key]) -> None:
        """A session is placed on `slot` with the chunks `keys` in its sequence once
        it starts (its own prefix, reused or copied): the slot holds exactly those,
        shareable once `activate` says its start has been queued."""
        self.drop(slot)
        self.hold(slot, keys)
        self._pending.add(slot)

    def activate(self, slot: int) -> None:
        """The slot's start is queued to the BatchLoop: what it holds may be shared."""
        self._pending.discard(slot)

    def cells(self, slot: int) -> int:
        return len(self._held.get(slot, ())) * self.chunk

    def keep(self, slot: int) -> None:
        """The slot's session ended: what it holds becomes a cache entry (most recent)."""
        if self._held.get(slot):
            self._cached[slot] = None
            self._cached.move_to_end(slot)

    def drop(self, slot: int) -> None:
        """The slot's sequence holds nothing any more (evicted, or given to a new session)."""
        self._cached.pop(slot, None)
        self._pending.discard(slot)
        for key in self._held.pop(slot, ()):
            holders = self._holders[key]
            holders.discard(slot)
            if not holders:
                del self._holders[key]

    @property
    def cached_slots(self) -> list[int]:
        """Free slots holding a prefix, least recently used first."""
        return list(self._cached)

    @property
    def cached_cells(self) -> int:
        return sum(self.cells(s) for s in self._cached)
