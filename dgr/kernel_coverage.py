"""Whether the patch stack's invariance covers a model: the weight types of its
tensors, read from the GGUF header, against the types whose matmuls and MoE expert
matmuls the native tests show row-invariant (patches/native-tests; docs/design.md,
Batch invariance). `GET /capabilities` reports it under "invariance"; `python -m dgr
check-invariance` checks a model end to end on this CPU."""

from __future__ import annotations

import struct

from dgr.gguf_file import tensors

COVERED = frozenset({"F32", "F16", "BF16", "Q4_0", "Q5_0", "Q8_0", "Q2_K", "Q3_K", "Q4_K",
                     "Q5_K", "Q6_K", "IQ4_XS"})


def report(path: str, repacked: frozenset[str] = frozenset()) -> dict:
    """{"covered": whether every weight type is one the invariance covers (flash
    attention is, over dgr's F16 KV cache) or the weight is among `repacked`
    (dgr.weight_repack: row-invariant repacked kernels), "weight_types": {name:
    tensors}, "not_covered": [names]}; a header this reader cannot follow
    (llama.cpp loaded the model, so it is not the file's fault) gives covered False
    and the reason."""
    try:
        found = tensors(path)
    except (ValueError, KeyError, struct.error, OSError) as exc:
        return {"covered": False, "weight_types": {}, "not_covered": [],
                "error": f"cannot read the GGUF header's tensor types: {exc}"}
    types: dict[str, int] = {}
    for _, kind, _ in found:
        types[kind] = types.get(kind, 0) + 1
    # the token embedding is only read row by row (GET_ROWS), unless it is also the
    # output matrix (no output.weight)
    lookup_only = {"token_embd.weight"} if any(n == "output.weight" for n, _, _ in found) else set()
    missing = sorted({kind for name, kind, _ in found
                      if kind not in COVERED and name not in repacked and name not in lookup_only})
    return {"covered": not missing, "weight_types": types, "not_covered": missing}
