"""KV tiers beyond the pool: host memory and disk, and the blob that carries a
prefix between them and between nodes.

A prefix cache entry (dgr.prefix_cache) is a slot's sequence holding the KV of a
list of tokens. Evicted from the pool, it can live on as that sequence's saved
llama.cpp state (`llama_state_seq_get_data`: every cell of the sequence, SWA
layers included with patch 0010): in the host tier, a store bounded in bytes,
least recently used out; from there in the disk tier, files bounded in bytes
that outlive the process. A session whose prompt begins with a stored prefix
gets it restored into its slot (`llama_state_seq_set_data`) and prefills only
the rest. The KV is bitwise what computing the tokens gives, whoever computed
them (the patch stack), so a restored prefix continues bitwise as a computed
one, on this node or, exported, on another one with the same key.

The key names what the bits depend on: the model file, the llama.cpp libraries
(the pin, the patch stack and the build), the CPU features they use, and the KV
layout. A blob or file with another key is refused, never restored.

Blob format (version 1), all integers little-endian:

    8 bytes   magic b"DGRKV\\x00\\x01\\x00"
    4 bytes   u32 H: length of the JSON header
    H bytes   JSON {"key": <hex>, "n_tokens": N}
    4N bytes  the tokens, int32
    rest      the llama.cpp sequence state of exactly those N tokens' KV
    32 bytes  sha256 of everything before

No llama.cpp here: the batch loop saves and restores (dgr/_batch.pyx), placement
decides (dgr.placement); this module stores and checks bytes.
"""

from __future__ import annotations

import collections
import contextlib
import hashlib
import json
import logging
import os
import struct
import tempfile
import threading
from pathlib import Path
from typing import Iterable, Optional, Sequence

import attrs
import numpy as np

from dgr.prefix_cache import common_prefix

log = logging.getLogger("dgr.kv_tier")

MAGIC = b"DGRKV\x00\x01\x00"
# llama.cpp's sequence state starts with this magic (llama-context.cpp, io_magic)
STATE_MAGIC = 0xAF143CD8
SUFFIX = ".kv"
_DIGEST = 32
# the largest JSON header a blob may have (it holds a key and a count)
_MAX_HEADER = 4096


# A stored prefix is restored only when it gives at least this many prompt tokens
# more than the pool could share, and saved only when it holds at least this many.
# Restoring beats recomputing at every size that restores (benchmarks/kv_tier.py
# measures it); shorter prefixes cost more in an entry's save, bytes and look-ups
# than computing them costs.
MIN_RESTORE_TOKENS = 32


class BlobError(ValueError):
    """A blob or file that is not a prefix this node may restore (why in the message)."""


@attrs.frozen(eq=False)
class Prefix:
    """The KV of `tokens` as a saved llama.cpp sequence state."""

    tokens: np.ndarray
    state: bytes

    @property
    def nbytes(self) -> int:
        return len(self.state) + 4 * len(self.tokens)


def pack(prefix: Prefix, key: str) -> bytes:
    """The blob of `prefix` under `key` (module doc)."""
    header = json.dumps({"key": key, "n_tokens": len(prefix.tokens)}).encode()
    body = b"".join([MAGIC, struct.pack("<I", len(header)), header,
                     prefix.tokens.astype("<i4").tobytes(), prefix.state])
    return body + hashlib.sha256(body).digest()


def unpack(blob: bytes, key: str) -> Prefix:
    """The prefix a blob carries; BlobError if it is truncated, corrupt, of another
    key, or not a sequence state of its tokens."""
    view = memoryview(blob)
    if len(view) < len(MAGIC) + 4 + _DIGEST or bytes(view[:len(MAGIC)]) != MAGIC:
        raise BlobError("not a dgr KV prefix (bad magic or too short)")
    if hashlib.sha256(view[:-_DIGEST]).digest() != bytes(view[-_DIGEST:]):
        raise BlobError("checksum mismatch (truncated or corrupt)")
    (n_header,) = struct.unpack_from("<I", view, len(MAGIC))
    start = len(MAGIC) + 4
    if n_header > _MAX_HEADER or start + n_header > len(view) - _DIGEST:
        raise BlobError("bad header length")
    try:
        header = json.loads(bytes(view[start:start + n_header]))
        blob_key, n_tokens = header["key"], int(header["n_tokens"])
    except (ValueError, KeyError, TypeError) as e:
        raise BlobError(f"bad header: {e}") from None
    if blob_key != key:
        raise BlobError("foreign prefix: made by another model, llama.cpp build or KV layout "
                        f"(key {str(blob_key)[:12]}, this node's {key[:12]})")
    start += n_header
    state_at = start + 4 * n_tokens
    if n_tokens < 1 or state_at > len(view) - _DIGEST:
        raise BlobError("bad token count")
    tokens = np.frombuffer(view[start:state_at], dtype="<i4").astype(np.int32)
    state = bytes(view[state_at:-_DIGEST])
    check_state(state, n_tokens)
    return Prefix(tokens, state)


def check_state(state: bytes, n_tokens: int) -> None:
    """The state's leading fields: llama.cpp's magic, one KV stream, n_tokens cells."""
    if len(state) < 16:
        raise BlobError("state too short")
    magic, _seq, n_stream, n_cells = struct.unpack_from("<IiII", state)
    if magic != STATE_MAGIC or n_stream != 1 or n_cells != n_tokens:
        raise BlobError("not the llama.cpp sequence state of its tokens "
                        f"(magic {magic:#x}, {n_stream} stream(s), {n_cells} cells for "
                        f"{n_tokens} tokens)")


def node_key(model_path: str, libraries: Sequence[Path], system_info: str,
             layout: dict) -> str:
    """The key of what a node's KV bits depend on (module doc); reads the model
    file and the libraries (about a second per GB)."""
    digest = hashlib.sha256()
    for path in [Path(model_path), *sorted(libraries)]:
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
    digest.update(system_info.encode() + b"\0")
    digest.update(json.dumps(layout, sort_keys=True).encode())
    return digest.hexdigest()


def kv_layout(info: dict) -> dict:
    """What of an engine's setup (dgr._engine.Engine.info) the KV bits and the state
    format depend on."""
    fields = ("architecture", "n_layer", "n_embd", "n_swa", "kv_unified", "weight_repack",
              "kv_bytes_per_cell")
    return {**{k: info[k] for k in fields},
            "kv_ordered": os.environ.get("LLAMA_KV_CACHE_ORDERED")}


def llama_libraries() -> list[Path]:
    """The shared libraries of the installed llama_cpp package (llama.cpp and ggml)."""
    import llama_cpp
    return sorted((Path(llama_cpp.__file__).parent / "lib").glob("lib*.so*"))


def longest(prompt: np.ndarray, candidates: Iterable[tuple[object, np.ndarray]]):
    """(item, n): the candidate whose tokens share the longest prefix with `prompt`
    (at most all but its last token); (None, 0) without one."""
    best, best_n = None, 0
    limit = len(prompt) - 1
    for item, tokens in candidates:
        n = min(common_prefix(prompt, tokens), limit)
        if n > best_n:
            best, best_n = item, n
    return best, best_n


class HostTier:
    """Prefixes in host memory, at most `max_bytes` of them, least recently used
    out. An entry whose tokens begin another entry's is not kept beside it (the
    longer restores either, cut to the shorter)."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self._entries: collections.OrderedDict[int, Prefix] = collections.OrderedDict()
        self.bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def match(self, prompt: np.ndarray) -> tuple[Optional[Prefix], int]:
        """The entry sharing the longest prefix with `prompt` (but its last token)."""
        entry, n = longest(prompt, ((e, e.tokens) for e in self._entries.values()))
        if entry is not None:
            self._entries.move_to_end(id(entry))
        return entry, n

    def covers(self, tokens: np.ndarray) -> bool:
        """Whether an entry holds all of `tokens` (and maybe more after them)."""
        n = len(tokens)
        return any(len(e.tokens) >= n and common_prefix(e.tokens, tokens) == n
                   for e in self._entries.values())

    def contained(self, tokens: np.ndarray) -> Optional[Prefix]:
        """The longest entry whose tokens all begin `tokens`."""
        best, best_n = None, 0
        for e in self._entries.values():
            n = len(e.tokens)
            if best_n < n <= len(tokens) and common_prefix(e.tokens, tokens) == n:
                best, best_n = e, n
        return best

    def put(self, prefix: Prefix) -> list[Prefix]:
        """Keep `prefix` (unless an entry covers it or it exceeds the bound); returns
        the entries that left: least recently used ones for room and those it covers."""
        if prefix.nbytes > self.max_bytes or self.covers(prefix.tokens):
            return []
        gone = [e for e in self._entries.values()
                if len(e.tokens) <= len(prefix.tokens)
                and common_prefix(e.tokens, prefix.tokens) == len(e.tokens)]
        for e in gone:
            self._remove(e)
        out = []
        while self.bytes + prefix.nbytes > self.max_bytes:
            _, oldest = self._entries.popitem(last=False)
            self.bytes -= oldest.nbytes
            out.append(oldest)
        self._entries[id(prefix)] = prefix
        self.bytes += prefix.nbytes
        return out

    def _remove(self, prefix: Prefix) -> None:
        if self._entries.pop(id(prefix), None) is not None:
            self.bytes -= prefix.nbytes

    def entries(self) -> list[Prefix]:
        """Least recently used first."""
        return list(self._entries.values())

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0


@attrs.define
class _File:
    path: Path
    tokens: np.ndarray
    size: int


class DiskTier:
    """Prefix blobs (module doc) in files under `root`, at most `max_bytes` of them,
    least recently used out; survives the process. `read` and `write` do file
    I/O: call them off the Trio loop (trio.to_thread); the index (`match`,
    `covers`, `contained`) is in memory, under a lock held only for it.

    Files are written whole to a temporary name and renamed (a crash leaves no
    half file under a real name), mode 0600, in a directory made 0700. A file
    that is truncated, corrupt or of another key is removed with a warning
    when found, never restored. An I/O error (a full disk, an unwritable
    directory) turns the tier off with a warning; serving goes on."""

    def __init__(self, root: str | os.PathLike, max_bytes: int, key: str):
        self.max_bytes = max_bytes
        self.key = key
        self.root = Path(root) / key[:24]
        self.enabled = True
        self._lock = threading.Lock()
        self._files: collections.OrderedDict[str, _File] = collections.OrderedDict()
        self.bytes = 0
        self.removed_bad = 0  # files found truncated, corrupt or foreign
        self.evictions = 0    # files removed for room
        try:
            os.makedirs(self.root, mode=0o700, exist_ok=True)
            os.chmod(self.root, 0o700)
            self._scan()
        except OSError as e:
            self._disable(e)

    def __len__(self) -> int:
        return len(self._files)

    def _disable(self, error: OSError) -> None:
        log.warning("KV disk tier at %s turned off: %s", self.root, error)
        with self._lock:
            self.enabled = False
            self._files.clear()
            self.bytes = 0

    def _scan(self) -> None:
        """Index the files left by earlier runs, oldest first; bad ones removed."""
        found = []
        for path in self.root.iterdir():
            if path.name.startswith(".tmp"):
                path.unlink(missing_ok=True)  # a write a crash cut short
                continue
            if path.suffix != SUFFIX:
                continue
            tokens = self._read_tokens(path)
            if tokens is not None:
                st = path.stat()
                found.append((st.st_mtime, _File(path, tokens, st.st_size)))
        for _, f in sorted(found, key=lambda x: x[0]):
            self._files[f.path.name] = f
            self.bytes += f.size
        with self._lock:
            doomed = self._make_room(0)
        self._unlink(doomed)

    def _read_tokens(self, path: Path) -> Optional[np.ndarray]:
        """A file's tokens from its header (the checksum is checked when it is read)."""
        try:
            with open(path, "rb") as f:
                head = f.read(len(MAGIC) + 4)
                if len(head) < len(MAGIC) + 4 or head[:len(MAGIC)] != MAGIC:
                    raise BlobError("bad magic")
                (n_header,) = struct.unpack_from("<I", head, len(MAGIC))
                if n_header > _MAX_HEADER:
                    raise BlobError("bad header length")
                header = json.loads(f.read(n_header))
                if header.get("key") != self.key:
                    raise BlobError("foreign key")
                n = int(header["n_tokens"])
                raw = f.read(4 * n)
                if n < 1 or len(raw) != 4 * n:
                    raise BlobError("truncated")
                return np.frombuffer(raw, dtype="<i4").astype(np.int32)
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
            self._remove_bad(path, e)
            return None

    def _remove_bad(self, path: Path, why: Exception) -> None:
        log.warning("KV disk tier: removed %s, which cannot be restored: %s", path.name, why)
        with self._lock:
            self.removed_bad += 1
            f = self._files.pop(path.name, None)
            if f is not None:
                self.bytes -= f.size
        with contextlib.suppress(OSError):
            path.unlink(missing_ok=True)

    def match(self, prompt: np.ndarray) -> tuple[Optional[str], int]:
        """The file sharing the longest prefix with `prompt` (but its last token)."""
        with self._lock:
            return longest(prompt, [(name, f.tokens) for name, f in self._files.items()])

    def covers(self, tokens: np.ndarray) -> bool:
        """Whether a file holds all of `tokens` (and maybe more after them)."""
        n = len(tokens)
        with self._lock:
            return any(len(f.tokens) >= n and common_prefix(f.tokens, tokens) == n
                       for f in self._files.values())

    def contained(self, tokens: np.ndarray) -> tuple[Optional[str], int]:
        """(name, its tokens): the longest file whose tokens all begin `tokens`."""
        best, best_n = None, 0
        with self._lock:
            for name, f in self._files.items():
                n = len(f.tokens)
                if best_n < n <= len(tokens) and common_prefix(f.tokens, tokens) == n:
                    best, best_n = name, n
        return best, best_n

    def read(self, name: str) -> Optional[Prefix]:
        """The prefix in file `name`, or None (gone, or bad: then removed)."""
        with self._lock:
            f = self._files.get(name)
        if f is None:
            return None
        try:
            prefix = unpack(f.path.read_bytes(), self.key)
        except (OSError, BlobError) as e:
            self._remove_bad(f.path, e)
            return None
        with self._lock:
            if name in self._files:
                self._files.move_to_end(name)
        with contextlib.suppress(OSError):
            os.utime(f.path)
        return prefix

    def write(self, prefix: Prefix) -> bool:
        """Keep `prefix` in a file (unless a file covers it or it exceeds the bound);
        files it covers and least recently used ones go. False if not written."""
        if not self.enabled or self.covers(prefix.tokens):
            return False
        blob = pack(prefix, self.key)
        if len(blob) > self.max_bytes:
            return False
        name = hashlib.sha256(prefix.tokens.astype("<i4").tobytes()).hexdigest()[:32] + SUFFIX
        with self._lock:
            doomed = self._make_room(len(blob))
        self._unlink(doomed)
        try:
            fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".tmp")
            try:
                with os.fdopen(fd, "wb") as out:
                    out.write(blob)
                os.chmod(tmp, 0o600)
                os.replace(tmp, self.root / name)
            except BaseException:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
                raise
        except OSError as e:
            self._disable(e)
            return False
        with self._lock:
            covered = [n for n, f in self._files.items()
                       if len(f.tokens) <= len(prefix.tokens) and n != name
                       and common_prefix(f.tokens, prefix.tokens) == len(f.tokens)]
            doomed = [self._forget(n) for n in covered]
            self._files[name] = _File(self.root / name, prefix.tokens, len(blob))
            self.bytes += len(blob)
        self._unlink(doomed)
        return True

    def _make_room(self, room: int) -> list[Path]:
        """Forget least recently used files until `room` more bytes fit (lock held)."""
        doomed = []
        while self._files and self.bytes + room > self.max_bytes:
            doomed.append(self._forget(next(iter(self._files))))
            self.evictions += 1
        return doomed

    def _forget(self, name: str) -> Path:
        f = self._files.pop(name)
        self.bytes -= f.size
        return f.path

    @staticmethod
    def _unlink(paths: Iterable[Path]) -> None:
        for path in paths:
            with contextlib.suppress(OSError):
                path.unlink(missing_ok=True)

    def clear(self) -> None:
        with self._lock:
            doomed = [self._forget(n) for n in list(self._files)]
        self._unlink(doomed)
