"""The KV tiers' stores and blob format (dgr.kv_tier), without a model."""

import os
import struct

import numpy as np
import pytest

from dgr.kv_tier import (MAGIC, STATE_MAGIC, BlobError, DiskTier, HostTier, Prefix, pack,
                         unpack)

KEY = "ab" * 32


def state(n: int, extra: int = 64) -> bytes:
    """Bytes shaped like llama.cpp's state of n cells (magic, seq, one stream, n)."""
    return struct.pack("<IiII", STATE_MAGIC, 0, 1, n) + bytes(range(256))[:extra]


def prefix(tokens, extra: int = 64) -> Prefix:
    tokens = np.asarray(tokens, dtype=np.int32)
    return Prefix(tokens, state(len(tokens), extra))


def test_a_blob_round_trips_and_refuses_corruption_truncation_and_foreign_keys():
    p = prefix(range(10, 30))
    blob = pack(p, KEY)
    back = unpack(blob, KEY)
    assert back.tokens.tolist() == p.tokens.tolist() and back.state == p.state
    with pytest.raises(BlobError, match="foreign"):
        unpack(blob, "cd" * 32)
    flipped = bytearray(blob)
    flipped[len(blob) // 2] ^= 1
    with pytest.raises(BlobError, match="checksum"):
        unpack(bytes(flipped), KEY)
    with pytest.raises(BlobError):
        unpack(blob[:-5], KEY)
    with pytest.raises(BlobError, match="magic"):
        unpack(b"x" * 100, KEY)
    # a valid checksum over a state that is not its tokens' (cell count) is refused too
    wrong = Prefix(np.arange(5, dtype=np.int32), state(6))
    with pytest.raises(BlobError, match="sequence state"):
        unpack(pack(wrong, KEY), KEY)


def test_the_host_tier_keeps_its_byte_bound_least_recently_used_out():
    a, b, c = prefix([1] * 10), prefix([2] * 10), prefix([3] * 10)
    tier = HostTier(max_bytes=2 * a.nbytes)
    assert tier.put(a) == [] and tier.put(b) == []
    tier.match(np.array([1] * 10 + [9], dtype=np.int32))  # a used: b is least recent
    assert tier.put(c) == [b]
    assert tier.bytes == 2 * a.nbytes <= tier.max_bytes and len(tier) == 2
    assert tier.put(prefix([4] * 1000)) == []  # larger than the bound: not kept
    assert tier.bytes <= tier.max_bytes


def test_the_host_tier_matches_the_longest_prefix_and_drops_what_a_longer_entry_covers():
    tier = HostTier(1 << 20)
    short = prefix([1, 2, 3, 4])
    tier.put(short)
    entry, n = tier.match(np.array([1, 2, 3, 4, 5, 6], dtype=np.int32))
    assert entry is short and n == 4
    # never the prompt's last token: it is prefilled for its logits
    assert tier.match(np.array([1, 2, 3], dtype=np.int32))[1] == 2
    longer = prefix([1, 2, 3, 4, 5, 6, 7])
    tier.put(longer)
    assert tier.entries() == [longer]
    assert tier.put(prefix([1, 2, 3])) == [] and tier.entries() == [longer]  # covered
    assert tier.contained(np.array([1, 2, 3, 4, 5, 6, 7, 8], dtype=np.int32)) is longer
    assert tier.contained(np.array([1, 2, 3, 4], dtype=np.int32)) is None


def test_the_disk_tier_survives_a_restart_and_removes_bad_and_foreign_files(tmp_path):
    disk = DiskTier(tmp_path, 1 << 20, KEY)
    assert disk.write(prefix(range(100, 140)))
    assert disk.write(prefix(range(200, 220)))
    assert oct(os.stat(disk.root).st_mode & 0o777) == "0o700"
    names = sorted(p.name for p in disk.root.iterdir())
    assert len(names) == 2 and all((disk.root / n).stat().st_mode & 0o777 == 0o600 for n in names)

    again = DiskTier(tmp_path, 1 << 20, KEY)
    name, n = again.match(np.arange(100, 150, dtype=np.int32))
    assert n == 40 and again.read(name).tokens.tolist() == list(range(100, 140))

    # one file corrupted after the index was read, one truncated, one foreign
    files = sorted(again.root.iterdir(), key=lambda p: p.stat().st_size)
    corrupt = files[0]
    data = bytearray(corrupt.read_bytes())
    data[-40] ^= 0xFF
    corrupt.write_bytes(bytes(data))
    name, _ = again.match(np.arange(200, 230, dtype=np.int32))
    assert again.read(name) is None and not corrupt.exists() and again.removed_bad == 1
    (again.root / "cut.kv").write_bytes(MAGIC + b"\x01")
    (again.root / "other.kv").write_bytes(pack(prefix([7] * 5), "ef" * 32))
    (again.root / ".tmpabc").write_bytes(b"half a write")
    third = DiskTier(tmp_path, 1 << 20, KEY)
    assert len(third) == 1 and third.removed_bad == 2
    assert sorted(p.name for p in third.root.iterdir()) == [files[1].name]


def test_the_disk_tier_keeps_its_byte_bound_and_turns_off_when_it_cannot_write(tmp_path):
    one = len(pack(prefix(range(50)), KEY))
    disk = DiskTier(tmp_path, 2 * one + 10, KEY)
    for start in (0, 1000, 2000):
        assert disk.write(prefix(range(start, start + 50)))
    assert len(disk) == 2 and disk.bytes <= disk.max_bytes and disk.evictions == 1
    assert disk.match(np.arange(0, 60, dtype=np.int32))[1] == 0  # the oldest went
    # the directory replaced by a file (a write fails, even for root)
    for f in disk.root.iterdir():
        f.unlink()
    disk.root.rmdir()
    disk.root.write_bytes(b"")
    assert not disk.write(prefix(range(5000, 5050)))
    assert not disk.enabled and len(disk) == 0 and disk.bytes == 0
    assert not disk.write(prefix(range(6000, 6050)))
