"""What llama.cpp's log says of a model it loaded or a context it made: the sizes of
the buffers it allocated, and whether the context runs flash attention."""

from __future__ import annotations

import re

_MIB = re.compile(r"(KV|RS|compute|output|CPU_REPACK model) buffer size =\s*([0-9.]+) MiB")
_FLASH_ATTN = re.compile(r"flash_attn\s+=\s+(\w+)")


def buffer_sizes(text: str) -> dict[str, int]:
    """Bytes of each kind of buffer logged (KV cells, recurrent state RS, compute,
    output, repacked weights), summed over devices."""
    sizes = {"KV": 0, "RS": 0, "compute": 0, "output": 0, "CPU_REPACK model": 0}
    for kind, mib in _MIB.findall(text):
        sizes[kind] += int(float(mib) * 1024 * 1024)
    return sizes


def flash_attn(text: str) -> str:
    """The attention path the last context logged ("enabled", "disabled", "auto"), or
    "unknown"."""
    found = _FLASH_ATTN.findall(text)
    return found[-1] if found else "unknown"
