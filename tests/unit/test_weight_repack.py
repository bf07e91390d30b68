"""Which weights "invariant" and "decode" repacking place in llama.cpp's CPU_REPACK
buffer type (dgr/weight_repack.py), read from a GGUF header."""

import re
from pathlib import Path

import gguf
import numpy as np

from dgr import weight_repack
from dgr.testmodel import write_tensors as write

X86 = "AVX = 1 | AVX2 = 1 | F16C = 1 | AVX512 = 1"


def q4_0(rows):
    return np.zeros((rows, 18), dtype=np.uint8), gguf.GGMLQuantizationType.Q4_0  # 32 weights a row


def test_only_layer_matmul_weights_of_invariant_types_with_whole_tiles_are_repacked(tmp_path):
    path = write(tmp_path / "m.gguf", {
        "token_embd.weight": q4_0(8),                 # read by GET_ROWS, not a matmul
        "output.weight": q4_0(8),                     # not a layer weight
        "blk.0.attn_q.weight": q4_0(8),
        "blk.0.attn_norm.weight": (np.ones(32, dtype=np.float32), None),
        "blk.0.ffn_down.weight": q4_0(12),            # 12 rows: not whole 8-row tiles
        "blk.1.attn_q.weight": q4_0(16),
        "blk.1.ffn_up_exps.weight": (np.zeros((4, 8, 18), dtype=np.uint8),  # 4 experts
                                     gguf.GGMLQuantizationType.Q4_0),
        "blk.1.ffn_gate.weight": (np.zeros((8, 144), dtype=np.uint8),  # Q4_K: "decode", and
                                  gguf.GGMLQuantizationType.Q4_K),        # "invariant" but on
                                                                          # AVX-512 without VNNI
    })
    names = weight_repack.invariant_tensors(path, X86)
    assert names == ["blk.0.attn_q.weight", "blk.1.attn_q.weight", "blk.1.ffn_up_exps.weight"]
    assert weight_repack.invariant_tensors(path, "AVX = 1 | AVX2 = 0") == []
    assert weight_repack.invariant_tensors(path, X86, "decode") == names + ["blk.1.ffn_gate.weight"]
    assert (weight_repack.invariant_tensors(path, X86 + " | AVX512_VNNI = 1")
            == names + ["blk.1.ffn_gate.weight"])
    avx2_only = "AVX = 1 | AVX2 = 1 | F16C = 1 | FMA = 1"
    assert weight_repack.invariant_tensors(path, avx2_only) == names + ["blk.1.ffn_gate.weight"]
    assert weight_repack.invariant_tensors(path, "AVX = 1 | AVX2 = 1 | FMA = 1") == names
    patterns = weight_repack.patterns(names)
    assert patterns == [r"^blk\.(0|1)\.attn_q\.weight$", r"^blk\.(1)\.ffn_up_exps\.weight$"]
    every = ["token_embd.weight", "output.weight", "blk.0.attn_q.weight", "blk.10.attn_q.weight",
             "blk.0.attn_norm.weight", "blk.0.ffn_down.weight", "blk.1.attn_q.weight",
             "blk.1.ffn_up_exps.weight", "blk.1.ffn_gate.weight"]
    matched = [n for n in every if any(re.search(p, n) for p in patterns)]
    assert matched == names


def test_a_file_whose_header_cannot_be_read_repacks_nothing(tmp_path):
    """Loading it reports what is wrong (dgr._engine); the choice does not fail first."""
    (tmp_path / "x.gguf").write_bytes(b"not a model")
    assert weight_repack.invariant_tensors(str(tmp_path / "x.gguf"), X86) == []
    assert weight_repack.invariant_tensors(str(tmp_path / "gone.gguf"), X86) == []


def test_on_the_covered_arm_kind_the_types_whose_repacked_arm_kernels_are_invariant_are_repacked(
        tmp_path):
    """aarch64 with NEON, dotprod and i8mm (the native tests' ARM kind): Q4_0, Q8_0, IQ4_NL,
    MXFP4, Q4_K and Q6_K, in both modes, and never Q5_K (its repacked ARM kernels round a
    column differently in a batch); an SVE build takes other kernels, so nothing there."""
    path = write(tmp_path / "m.gguf", {
        "blk.0.attn_q.weight": q4_0(8),
        "blk.0.attn_k.weight": (np.zeros((8, 272), dtype=np.uint8), gguf.GGMLQuantizationType.Q8_0),
        "blk.0.ffn_down.weight": (np.zeros((8, 210), dtype=np.uint8), gguf.GGMLQuantizationType.Q6_K),
        "blk.0.ffn_up.weight": (np.zeros((8, 144), dtype=np.uint8), gguf.GGMLQuantizationType.Q4_K),
        "blk.0.ffn_gate.weight": (np.zeros((8, 176), dtype=np.uint8), gguf.GGMLQuantizationType.Q5_K),
    })
    arm = "NEON = 1 | ARM_FMA = 1 | FP16_VA = 1 | MATMUL_INT8 = 1 | DOTPROD = 1"
    expected = ["blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.ffn_down.weight",
                "blk.0.ffn_up.weight"]
    for mode in ("invariant", "decode"):
        assert weight_repack.invariant_tensors(path, arm, mode, machine="aarch64") == expected
    assert weight_repack.invariant_tensors(path, arm + " | SVE = 1", machine="aarch64") == []
    assert weight_repack.invariant_tensors(path, "NEON = 1 | DOTPROD = 1", machine="aarch64") == []
    assert weight_repack.invariant_tensors(path, "AVX = 1 | AVX2 = 1 | F16C = 1",
                                           machine="x86_64") == ["blk.0.attn_q.weight",
                                                                 "blk.0.ffn_up.weight"]


def test_the_native_test_guards_the_types_dgr_repacks_on_each_cpu():
    """patches/native-tests/test_row_invariance.cpp's dgr_repacks fails the
    repacked_mul_mat test where a type dgr repacks differs: its lists are dgr's."""
    source = (Path(__file__).resolve().parents[2] / "patches" / "native-tests"
              / "test_row_invariance.cpp").read_text()
    body = source[source.index("static bool dgr_repacks("):]
    body = body[:body.index("\n}\n")]
    arm = body[body.index("#if defined(__aarch64__)"):body.index("#elif defined(__AVX2__)")]
    x86 = body[body.index("#elif defined(__AVX2__)"):body.index("#else")]

    def types(text):
        return frozenset(re.findall(r"GGML_TYPE_(\w+)", text))

    assert types(arm) == weight_repack.ARM_TYPES
    assert types(x86) == weight_repack.TYPES["decode"]
