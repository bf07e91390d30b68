"""A GGUF file as dgr reads it before llama.cpp does: whether it is one at all,
and its tensors' names, types and shapes from the header (no tensor data)."""

from __future__ import annotations

import mmap
import os
import struct

from dgr.errors import ModelLoadError

# ggml_type numbers (ggml.h) and names
TYPE_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 6: "Q5_0", 7: "Q5_1", 8: "Q8_0",
              9: "Q8_1", 10: "Q2_K", 11: "Q3_K", 12: "Q4_K", 13: "Q5_K", 14: "Q6_K",
              15: "Q8_K", 16: "IQ2_XXS", 17: "IQ2_XS", 18: "IQ3_XXS", 19: "IQ1_S",
              20: "IQ4_NL", 21: "IQ3_S", 22: "IQ2_S", 23: "IQ4_XS", 24: "I8", 25: "I16",
              26: "I32", 27: "I64", 28: "F64", 29: "IQ1_M", 30: "BF16", 34: "TQ1_0",
              35: "TQ2_0", 39: "MXFP4"}

# llama.cpp's pooling types (enum llama_pooling_type, a GGUF's {arch}.pooling_type), by name
POOLING = {"none": 0, "mean": 1, "cls": 2, "last": 3, "rank": 4}
POOLING_NAMES = {code: name for name, code in POOLING.items()}

# GGUF metadata value types: fixed sizes and struct formats; 8 is a string, 9 an array
_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}
_FORMATS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
            10: "<Q", 11: "<q", 12: "<d"}
_STRING, _ARRAY = 8, 9


def header(path: str) -> tuple[dict, list[tuple[str, str, tuple[int, ...]]]]:
    """(metadata, tensors) of a GGUF file's header: each scalar or string value by
    its key (an array as its length), and each tensor's (name, type name,
    dimensions). ValueError for a file that is not one or is cut short."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as m:
        if m[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        try:
            return _read_header(m)
        except (struct.error, KeyError, OverflowError) as exc:
            raise ValueError(f"{path} has a malformed GGUF header ({exc})") from None


def _read_header(m) -> tuple[dict, list]:
    _, n_tensors, n_kv = struct.unpack_from("<IQQ", m, 4)
    at = 24

    def string(at: int) -> tuple[str, int]:
        end = at + 8 + struct.unpack_from("<Q", m, at)[0]
        if end > len(m):
            raise struct.error("a string runs past the end of the file")
        return m[at + 8:end].decode("utf-8", "replace"), end

    def value(kind: int, at: int) -> tuple[object, int]:
        if kind == _STRING:
            return string(at)
        if kind == _ARRAY:
            item, count = struct.unpack_from("<IQ", m, at)
            at += 12
            if item in _SIZES:
                return count, at + count * _SIZES[item]
            for _ in range(count):
                _, at = value(item, at)
            return count, at
        return struct.unpack_from(_FORMATS[kind], m, at)[0], at + _SIZES[kind]

    metadata = {}
    for _ in range(n_kv):
        key, at = string(at)
        kind = struct.unpack_from("<I", m, at)[0]
        metadata[key], at = value(kind, at + 4)
    found = []
    for _ in range(n_tensors):
        name, at = string(at)
        n_dims = struct.unpack_from("<I", m, at)[0]
        dims = struct.unpack_from(f"<{n_dims}Q", m, at + 4)
        at += 4 + 8 * n_dims
        kind = struct.unpack_from("<I", m, at)[0]
        at += 4 + 8
        found.append((name, TYPE_NAMES.get(kind, f"type {kind}"), dims))
    return metadata, found


def tensors(path: str) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, type name, dimensions) of each tensor of a GGUF file (its header only)."""
    return header(path)[1]


def check_model_file(path: str) -> None:
    """A clear error for a path that is not a GGUF file, before llama.cpp reads it."""
    if not os.path.exists(path):
        raise ModelLoadError(f"model file not found: {path}")
    if not os.path.isfile(path):
        raise ModelLoadError(f"model path is not a file: {path}")
    with open(path, "rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise ModelLoadError(f"not a GGUF file (bad magic {magic!r}): {path}")
