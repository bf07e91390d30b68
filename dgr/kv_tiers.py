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

from dgr.kv_tier import BlobError, DiskTier, HostTier, Prefix, pack, unpack
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
