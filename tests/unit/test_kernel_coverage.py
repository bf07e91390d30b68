"""The capability report's invariance coverage (dgr/kernel_coverage.py): a GGUF's
weight types, read from its header, against those the patch stack covers; the
architecture, attention path, repacking mode and CPU, each a reason where not covered."""

import gguf
import numpy as np
import pytest

from dgr.gguf_file import tensors
from dgr.kernel_coverage import report, cpu_kind, weight_types
from dgr.testmodel import write_tensors as write


def test_the_header_gives_each_types_tensor_count_and_whether_all_are_covered(tmp_path):
    # IQ4_NL's plain kernel rounds a column differently alone than in a batch (native
    # test mul_mat); repacked, it is covered
    iq4_nl = np.zeros((2, 18), dtype=np.uint8)  # 2 rows of one 32-weight IQ4_NL block
    path = write(tmp_path / "m.gguf", {
        "a.weight": (np.ones((4, 32), dtype=np.float32), None),
        "b.weight": (np.ones((4, 32), dtype=np.float16), None),
        "c.weight": (iq4_nl, gguf.GGMLQuantizationType.IQ4_NL),
    })
    assert tensors(path) == [("a.weight", "F32", (32, 4)), ("b.weight", "F16", (32, 4)),
                             ("c.weight", "IQ4_NL", (32, 2))]
    assert weight_types(path) == {"weight_types": {"F32": 1, "F16": 1, "IQ4_NL": 1},
                                  "not_covered": ["IQ4_NL"]}
    got = report(path, frozenset(), INFO, AVX512, "x86_64")
    assert not got["covered"] and got["why_not"] == [
        "weight types IQ4_NL take kernels no native test shows row-invariant"]
    covered = write(tmp_path / "n.gguf", {"a.weight": (np.ones((4, 32), dtype=np.float32), None)})
    assert report(covered, frozenset(), INFO, AVX512, "x86_64")["covered"]
    # a weight placed in the row-invariant repacked kernels is covered whatever its type
    assert report(path, frozenset({"c.weight"}), INFO, AVX512, "x86_64")["covered"]


INFO = {"architecture": "llama", "memory": "attention", "flash_attn": "enabled",
        "weight_repack": "invariant"}
AVX512 = "CPU : SSE3 = 1 | AVX = 1 | AVX2 = 1 | FMA = 1 | AVX512 = 1 | AVX512_VNNI = 1 |"


@pytest.mark.parametrize(("change", "reason"), [
    ({"weight_repack": "all"}, "--weight-repack all"),
    ({"flash_attn": "disabled"}, "flash attention is disabled"),
    ({"architecture": "qwen2"}, "no test serves the qwen2 architecture"),
])
def test_each_setting_outside_what_tests_show_is_a_reason(tmp_path, change, reason):
    path = write(tmp_path / "m.gguf", {"a.weight": (np.ones((4, 32), dtype=np.float32), None)})
    got = report(path, frozenset(), INFO | change, AVX512, "x86_64")
    assert not got["covered"] and len(got["why_not"]) == 1 and got["why_not"][0].startswith(reason)
    # a model without attention needs no flash attention
    assert report(path, frozenset(), INFO | {"memory": "recurrent", "flash_attn": "disabled"},
                  AVX512, "x86_64")["covered"]


def test_only_the_cpus_the_native_tests_ran_on_are_covered(tmp_path):
    path = write(tmp_path / "m.gguf", {"a.weight": (np.ones((4, 32), dtype=np.float32), None)})
    assert cpu_kind(AVX512, "x86_64") == "x86-64 with AVX-512 and VNNI"
    assert cpu_kind("CPU : AVX = 1 | AVX2 = 1 | FMA = 1 |", "x86_64") == "x86-64 with AVX2"
    arm = "CPU : NEON = 1 | ARM_FMA = 1 | MATMUL_INT8 = 1 | DOTPROD = 1 |"
    assert cpu_kind(arm, "aarch64") == "aarch64 with NEON, dotprod and i8mm"
    # AVX-512 without VNNI takes kernel paths neither x86 build tested
    for features, machine in (("CPU : SSE3 = 1 | AVX = 1 |", "x86_64"),
                              ("CPU : AVX = 1 | AVX2 = 1 | FMA = 1 | AVX512 = 1 |", "x86_64"),
                              ("CPU : NEON = 1 | ARM_FMA = 1 | DOTPROD = 1 |", "aarch64"),
                              (arm + " SVE = 1 |", "aarch64")):
        assert cpu_kind(features, machine) is None
        got = report(path, frozenset(), INFO, features, machine)
        assert not got["covered"] and got["cpu"] is None
        assert f"this CPU ({machine})" in got["why_not"][0]


def test_a_file_that_is_not_gguf_is_refused_and_a_header_cut_short_reported(tmp_path):
    (tmp_path / "x.bin").write_bytes(b"not a model at all")
    with pytest.raises(ValueError, match="not a GGUF file"):
        tensors(str(tmp_path / "x.bin"))
    whole = (tmp_path / "m.gguf")
    write(whole, {"a.weight": (np.ones((4, 32), dtype=np.float32), None)})
    (tmp_path / "cut.gguf").write_bytes(whole.read_bytes()[:200])  # inside the metadata
    got = report(str(tmp_path / "cut.gguf"), frozenset(), INFO, AVX512, "x86_64")
    assert got["covered"] is False and "cannot read" in got["error"]
    assert got["why_not"][0] == got["error"]
