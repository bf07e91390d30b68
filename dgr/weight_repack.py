"""Which weights the node has llama.cpp repack for its CPU kernels.

llama.cpp's CPU backend can copy a weight at load into an interleaved layout
(its CPU_REPACK buffer type) whose kernels multiply several rows at once. For
Q4_0, IQ4_NL and MXFP4 those kernels give every batch column, and every MoE
token's expert output, the bits it gets alone, and they run 1.3-3x the plain
kernels on x86 (patches/native-tests: repacked_mul_mat and bench-kernels). For
Q4_K and Q2_K the repacked matmul rounds a column differently in a group of four
than alone, and llama.cpp's AMX buffer type crashes on some machines: the
"invariant" mode places only the first kind in CPU_REPACK, by name, and leaves
everything else (and the AMX buffer type) out.
"""

from __future__ import annotations

import re
import struct
from collections import defaultdict

from dgr import gguf_file

MODES = ("invariant", "off", "all")
# weight types whose repacked x86 kernels are row-invariant for MUL_MAT and MUL_MAT_ID
INVARIANT_TYPES = frozenset({"Q4_0", "IQ4_NL", "MXFP4"})
# layer weights that every architecture multiplies by F32 activations (MUL_MAT, or
# MUL_MAT_ID for MoE experts): the only ops the repacked buffer type computes
_MATMUL_WEIGHT = re.compile(
    r"^blk\.(\d+)\.(attn_(q|k|v|qkv|output)|ffn_(gate|up|down)(_exps|_shexp)?)\.weight$")
# the repacked tiles interleave 8 weight rows
_ROW_GROUP = 8


def invariant_tensors(model_path: str, system_info: str) -> list[str]:
    """The names of the weights "invariant" mode repacks: layer matmul weights of
    INVARIANT_TYPES whose rows fill the tiles; none on CPUs without AVX2 (x86's
    repacked kernels need it; other CPUs' are not checked), and none from a file
    whose header cannot be read (loading it says what is wrong)."""
    if "AVX2 = 1" not in system_info:
        return []
    try:
        found = gguf_file.tensors(model_path)
    except (OSError, ValueError, struct.error):
        return []
    return [name for name, kind, dims in found
            if kind in INVARIANT_TYPES and _MATMUL_WEIGHT.match(name)
            and len(dims) >= 2 and dims[1] % _ROW_GROUP == 0]


def patterns(names: list[str]) -> list[str]:
    """Regular expressions that match exactly `names` (layer weights), one per
    weight kind: llama.cpp compiles every override for every tensor it loads."""
    layers = defaultdict(list)
    for name in names:
        _, layer, kind = name.split(".", 2)
        layers[kind].append(layer)
    return [rf"^blk\.({'|'.join(found)})\.{re.escape(kind)}$"
            for kind, found in sorted(layers.items())]
