"""The node's KV tiers at work: what goes from the pool to host memory, from
host memory to disk and back, and what a prefix blob is exported and imported
as (the stores and the blob format: dgr.kv_tier).

    pool --(placement: Save before an entry leaves)--> batch loop saves the state
    batch loop --(step loop: take_saved)--> host tier (LRU, bytes bound)
    host tier --(entries pushed out; spill task, a thread)--> disk tier
    disk tier --(prefetch before admission, a thread)--> host tier
    host tier --(placement: a longer match than the pool)--> restore in the slot
    shutdown: the pool's cached entries and the host tier --> disk tier

Nothing here waits inside the batch loop or blocks the Trio loop on file I/O
but `persist`, which runs once the batch loop has stopped.
"""

from __future__ import annotations

import logging
from typing import Optional, Sequence

import numpy as np
import trio

from dgr._engine import system_info
from dgr.errors import InvalidRequest
from dgr.kv_tier import (BlobError, DiskTier, HostTier, Prefix, kv_layout, llama_libraries,
                         node_key, pack, unpack)
from dgr.telemetry import Telemetry

log = logging.getLogger("dgr.kv_tiers")

# Prefixes waiting for the disk writer; one more pushed out of host memory then is
# dropped (counted), so a slow disk never holds more than this many in memory.
SPILL_QUEUE = 16


class Tiers:
    """The host tier, maybe a disk tier, and the node key (dgr.kv_tier.node_key)
    that blobs and files carry (None: no disk tier and no transfer)."""

    def __init__(self, host: HostTier, telemetry: Telemetry, *, disk: Optional[DiskTier] = None,
                 key: Optional[str] = None, min_restore: int = 1):
        self.host = host
        self.disk = disk
        self.key = key
        self.min_restore = min_restore
        self._telemetry = telemetry
        self._spill_send, self._spill_receive = trio.open_memory_channel(SPILL_QUEUE)
        self._loop_seen = {"restores": 0, "restores_failed": 0, "restore_s": 0.0,
                           "save_s": 0.0, "saves_dropped": 0}
        self._gauges()

    # ------------------------------------------------------------ the step loop's calls

    def saved(self, prefix: Prefix) -> None:
        """The batch loop saved a prefix leaving the pool: into host memory."""
        self._telemetry.tier_writes.labels("host").inc()
        for gone in self.host.put(prefix):
            self._telemetry.tier_evictions.labels("host").inc()
            self._spill(gone)
        self._gauges()

    def restored(self, n_tokens: int) -> None:
        """A session starts from a host-tier prefix of n_tokens."""
        self._telemetry.tier_hits.labels("host").inc()
        self._telemetry.tier_tokens_restored.inc(n_tokens)

    def loop_figures(self, figures: dict) -> None:
        """The batch loop's save and restore counts and times (BatchLoop.tier_figures)."""
        t, seen = self._telemetry, self._loop_seen
        t.tier_restores.inc(figures["restores"] - seen["restores"])
        t.tier_restore_seconds.inc(max(0.0, figures["restore_s"] - seen["restore_s"]))
        t.tier_save_seconds.inc(max(0.0, figures["save_s"] - seen["save_s"]))
        t.tier_dropped.labels("host").inc(figures["saves_dropped"] - seen["saves_dropped"])
        failed = figures["restores_failed"] - seen["restores_failed"]
        if failed:
            log.warning("llama.cpp refused %d stored prefix(es); those sessions prefilled "
                        "their prompts", failed)
        self._loop_seen = {k: figures[k] for k in seen}

    # ------------------------------------------------------------ disk

    def _spill(self, prefix: Prefix) -> None:
        if self.disk is None or not self.disk.enabled:
            return
        try:
            self._spill_send.send_nowait(prefix)
        except trio.WouldBlock:
            self._telemetry.tier_dropped.labels("disk").inc()

    async def run(self) -> None:
        """The disk writer: prefixes pushed out of host memory into files."""
        async for prefix in self._spill_receive:
            await self._write(prefix)

    async def _write(self, prefix: Prefix) -> None:
        disk = self.disk
        evictions = disk.evictions
        if await trio.to_thread.run_sync(disk.write, prefix):
            self._telemetry.tier_writes.labels("disk").inc()
        self._telemetry.tier_evictions.labels("disk").inc(disk.evictions - evictions)
        self._gauges()

    async def prefetch(self, prompt: np.ndarray, pool_tokens: int) -> None:
        """Before admission: a prompt the disk tier holds more of (by min_restore)
        than the pool (`pool_tokens`) and host memory is read into host memory."""
        disk = self.disk
        if disk is None or not disk.enabled or not len(disk):
            return
        name, n = disk.match(prompt)
        _, n_host = self.host.match(prompt)
        if name is None or n < max(pool_tokens, n_host) + self.min_restore:
            return
        bad = disk.removed_bad
        prefix = await trio.to_thread.run_sync(disk.read, name)
        self._telemetry.tier_dropped.labels("disk").inc(disk.removed_bad - bad)
        if prefix is not None:
            self._telemetry.tier_hits.labels("disk").inc()
            for gone in self.host.put(prefix):
                self._telemetry.tier_evictions.labels("host").inc()
                self._spill(gone)
        self._gauges()

    def persist(self, pool: Sequence[Prefix]) -> int:
        """At shutdown (the batch loop stopped): host memory's prefixes, then the
        pool's cached ones (most recent last, so that the disk bound keeps them),
        into the disk tier; blocking. Returns how many were written."""
        disk = self.disk
        if disk is None or not disk.enabled:
            return 0
        written = 0
        for prefix in [*self.host.entries(), *pool]:
            try:
                written += disk.write(prefix)
            except Exception:  # a shutdown goes on whatever the disk does
                log.exception("KV disk tier: writing a prefix at shutdown failed")
                break
        return written

    # ------------------------------------------------------------ transfer

    def blob_of(self, prefix: Prefix) -> bytes:
        return pack(prefix, self._need_key())

    def held_prefix(self, tokens: np.ndarray) -> tuple[Optional[Prefix], Optional[str], int]:
        """(prefix, file, n): the longest stored prefix whose n tokens all begin
        `tokens`, from host memory (a Prefix) or a disk file (its name, to read off
        the loop); (None, None, 0) without one."""
        in_host = self.host.contained(tokens)
        name, n_disk = self.disk.contained(tokens) if self.disk is not None else (None, 0)
        if in_host is not None and len(in_host.tokens) >= n_disk:
            return in_host, None, len(in_host.tokens)
        return None, name, n_disk

    def import_blob(self, blob: bytes) -> Prefix:
        """A blob from another node (or an export of this one) into host memory;
        BlobError if it is not one this node may restore."""
        prefix = unpack(blob, self._need_key())
        if prefix.nbytes > self.host.max_bytes:
            raise BlobError(f"the prefix takes {prefix.nbytes} bytes, more than the host "
                            f"tier's bound of {self.host.max_bytes}")
        self._telemetry.tier_writes.labels("host").inc()
        for gone in self.host.put(prefix):
            self._telemetry.tier_evictions.labels("host").inc()
            self._spill(gone)
        self._gauges()
        return prefix

    def _need_key(self) -> str:
        if self.key is None:
            raise BlobError("this node has no KV key (it was started without a disk tier or "
                            "transfer)")
        return self.key

    # ------------------------------------------------------------ state

    def clear(self, host: bool, disk: bool) -> None:
        if host:
            self.host.clear()
        if disk and self.disk is not None:
            self.disk.clear()
        self._gauges()

    def _gauges(self) -> None:
        t = self._telemetry
        t.tier_bytes.labels("host").set(self.host.bytes)
        t.tier_entries.labels("host").set(len(self.host))
        if self.disk is not None:
            t.tier_bytes.labels("disk").set(self.disk.bytes)
            t.tier_entries.labels("disk").set(len(self.disk))

    def report(self) -> dict:
        """For /capabilities."""
        disk = self.disk
        return {
            "host": {"enabled": True, "max_bytes": self.host.max_bytes, "bytes": self.host.bytes,
                     "entries": len(self.host)},
            "disk": ({"enabled": disk.enabled, "dir": str(disk.root), "max_bytes": disk.max_bytes,
                      "bytes": disk.bytes, "entries": len(disk)} if disk is not None
                     else {"enabled": False}),
            "min_restore_tokens": self.min_restore,
            "key": self.key,
        }


class NodePrefixes:
    """A node's stored prefixes as its API offers them: flushed by tier, exported as a
    blob, imported from one, the disk tier opened at start and the pool persisted at
    shutdown. It reaches the pool through the step loop (its saves and flushes) and
    the placement (which slot caches which tokens); `tiers` is None on a node that
    keeps no tier beyond its pool."""

    def __init__(self, tiers: Optional[Tiers], loop, placement, engine):
        self.tiers = tiers
        self._loop = loop
        self._placement = placement
        self._engine = engine
        self._key_lock = trio.Lock()

    async def flush(self, tiers: Sequence[str]) -> None:
        """Empty the named tiers (dgr.Node.flush_prefix_cache)."""
        unknown = set(tiers) - {"pool", "host", "disk"}
        if unknown:
            raise InvalidRequest(f"unknown tier(s) {sorted(unknown)}: pool, host, disk")
        if "pool" in tiers:
            await self._loop.flush_cache(save="host" not in tiers)
        if self.tiers is not None:
            disk = self.tiers.disk
            if "disk" in tiers and disk is not None:
                await trio.to_thread.run_sync(disk.clear)
            self.tiers.clear(host="host" in tiers, disk=False)

    async def key(self) -> str:
        """The node key of prefix blobs and files (dgr.kv_tier.node_key), computed
        once, off the Trio loop (it reads the model file)."""
        if self.tiers is None:
            raise InvalidRequest("this node keeps no KV tier (cache_ram_bytes 0, no prefix "
                                 "cache or RPC workers): prefixes cannot be exported or "
                                 "imported")
        async with self._key_lock:
            if self.tiers.key is None:
                self.tiers.key = await trio.to_thread.run_sync(
                    node_key, self._engine.model_path, llama_libraries(), system_info(),
                    kv_layout(self._engine.info))
        return self.tiers.key

    async def open_disk(self, root, max_bytes: int) -> None:
        """The disk tier under `root` (its files of this node's key)."""
        key = await self.key()
        self.tiers.disk = await trio.to_thread.run_sync(DiskTier, root, max_bytes, key)

    async def export(self, tokens: np.ndarray) -> Optional[bytes]:
        """A blob of the longest stored prefix of `tokens` (dgr.Node.export_prefix)."""
        await self.key()  # the blob carries it; refuses a node without tiers
        stored, name, n_stored = self.tiers.held_prefix(tokens)
        slot, n_pool = self._placement.cached_within(tokens)
        if slot is not None and n_pool > n_stored:
            # the pool holds more: saved into the host tier (as an eviction would) first
            await self._loop.save_to_host(slot)
            stored, name, n_stored = self.tiers.held_prefix(tokens)
        if stored is None and name is not None:
            stored = await trio.to_thread.run_sync(self.tiers.disk.read, name)
        return None if stored is None else self.tiers.blob_of(stored)

    async def import_blob(self, blob: bytes) -> int:
        """A prefix blob into the host tier (dgr.Node.import_prefix): its token count."""
        await self.key()
        try:
            return len(self.tiers.import_blob(blob).tokens)
        except BlobError as e:
            raise InvalidRequest(f"prefix refused: {e}") from None

    def persist(self) -> None:
        """Once the batch loop has stopped: host memory's prefixes and the pool's
        cached ones into the disk tier, so a restarted node finds them (blocking)."""
        cache = self._placement.cache
        pool = []
        for slot in cache.cached_slots:
            tokens = cache.tokens(slot)
            if len(tokens) >= self.tiers.min_restore:
                try:
                    pool.append(Prefix(tokens.copy(), self._engine.save_slot(slot)))
                except Exception:  # a shutdown goes on: this entry is not kept
                    log.exception("saving slot %d at shutdown failed", slot)
        self.tiers.persist(pool)
