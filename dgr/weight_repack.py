"""Which weights the node has llama.cpp repack for its CPU kernels.

llama.cpp's CPU backend can copy a weight at load into an interleaved layout
(its CPU_REPACK buffer type) whose kernels multiply several rows at once. On x86,
for Q4_0, IQ4_NL, MXFP4 and Q4_K (patch 0017 makes Q4_K's one-column kernel round
as its batch kernel does) those kernels give every batch column, and every MoE
token's expert output, the bits it gets alone (patches/native-tests:
repacked_mul_mat). The first three run faster than the plain kernels
(bench-kernels measures it): the "invariant" mode places them in CPU_REPACK, by
name. Q4_K's repacked kernels run one to three columns faster than dgr's tiled
kernel, and four and more within a few per cent of it with AVX-512 VNNI (patch
0019) or faster with AVX2 alone (patch 0020); on CPUs with AVX-512 but no VNNI its
batches take llama.cpp's AVX-512 kernel, at about half the tiled one's speed
(docs/design.md has the figures). So "invariant" adds Q4_K except there, and the
"decode" mode adds it everywhere. For Q2_K the repacked matmul rounds a column
differently in a group of four than alone, and llama.cpp's AMX buffer type
crashes on some machines: both modes leave everything else (and the AMX buffer
type) as loaded.

On ARM with NEON, dotprod and i8mm (the kind the native tests run under qemu), the
repacked kernels of Q4_0, Q8_0, IQ4_NL, MXFP4, Q4_K (patch 0021 makes its
one-column kernel round as its batch kernel does) and Q6_K are row-invariant, and
those of them counted (scripts/arm_kernel_counts.py) execute 1.2 to 6.6 times fewer
instructions than dgr's plain ones: both modes place those; Q5_K's are not invariant
there and stay as loaded.
"""

from __future__ import annotations

import re
import struct
from collections import defaultdict

from dgr import gguf_file, kernel_coverage

MODES = ("invariant", "decode", "off", "all")
# the weight types each named mode repacks: types whose repacked x86 kernels are
# row-invariant for MUL_MAT and MUL_MAT_ID
TYPES = {"invariant": frozenset({"Q4_0", "IQ4_NL", "MXFP4"}),
         "decode": frozenset({"Q4_0", "IQ4_NL", "MXFP4", "Q4_K"})}
# on the ARM kind the native tests cover (NEON, dotprod and i8mm, no SVE), the types
# whose repacked kernels are row-invariant there (Q4_K's with patch 0021), in both
# modes (Q5_K's are not: its 4-column kernel rounds differently from the one-column one)
ARM_TYPES = frozenset({"Q4_0", "Q8_0", "IQ4_NL", "MXFP4", "Q4_K", "Q6_K"})
# layer weights that every architecture multiplies by F32 activations (MUL_MAT, or
# MUL_MAT_ID for MoE experts): the only ops the repacked buffer type computes
_MATMUL_WEIGHT = re.compile(
    r"^blk\.(\d+)\.(attn_(q|k|v|qkv|output)|ffn_(gate|up|down)(_exps|_shexp)?)\.weight$")
# the repacked tiles interleave 8 weight rows
_ROW_GROUP = 8


def repacked_types(system_info: str, mode: str, machine: str | None = None) -> frozenset[str]:
    """The weight types `mode` ("invariant" or "decode") repacks on this CPU: on x86
    with AVX2, TYPES[mode] and Q4_K where its batches run nearly as fast; on the ARM
    kind the native tests cover, ARM_TYPES; on other CPUs none (their repacked kernels
    are not checked)."""
    if kernel_coverage.cpu_kind(system_info, machine) == kernel_coverage.ARM_DOTPROD_I8MM:
        return ARM_TYPES
    if "AVX2 = 1" not in system_info:
        return frozenset()
    return TYPES[mode] | ({"Q4_K"} if q4_k_batches_fast(system_info) else frozenset())


def invariant_tensors(model_path: str, system_info: str, mode: str = "invariant",
                      machine: str | None = None) -> list[str]:
    """The names of the weights `mode` ("invariant" or "decode") repacks: layer
    matmul weights of repacked_types whose rows fill the tiles; none from a file whose
    header cannot be read (loading it says what is wrong)."""
    types = repacked_types(system_info, mode, machine)
    if not types:
        return []
    try:
        found = gguf_file.tensors(model_path)
    except (OSError, ValueError, struct.error):
        return []
    return [name for name, kind, dims in found
            if kind in types and _MATMUL_WEIGHT.match(name)
            and len(dims) >= 2 and dims[1] % _ROW_GROUP == 0]


def q4_k_batches_fast(system_info: str) -> bool:
    """Whether repacked Q4_K's batch kernel keeps pace with the tiled one on this x86
    CPU: with AVX-512 VNNI (patch 0019) or AVX2 and F16C without AVX-512 (patch 0020)."""
    return ("AVX512_VNNI = 1" in system_info
            or ("AVX512 = 1" not in system_info and "F16C = 1" in system_info))


def patterns(names: list[str]) -> list[str]:
    """Regular expressions that match exactly `names` (layer weights), one per
    weight kind: llama.cpp compiles every override for every tensor it loads."""
    layers = defaultdict(list)
    for name in names:
        _, layer, kind = name.split(".", 2)
        layers[kind].append(layer)
    return [rf"^blk\.({'|'.join(found)})\.{re.escape(kind)}$"
            for kind, found in sorted(layers.items())]
