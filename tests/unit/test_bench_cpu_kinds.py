"""The benches' CPU kinds: what a kind needs of the CPU, and how the report names it."""

import pytest

from benchmarks import cpu_kinds

AVX2_ONLY = ("model name\t: AMD EPYC 7B12\n"
             "flags\t\t: fpu sse2 avx avx2 fma f16c bmi2\n")
VNNI = ("model name\t: AMD EPYC 9B14\n"
        "flags\t\t: avx avx2 fma f16c bmi2 avx512f avx512dq avx512bw avx512vl avx512_vnni\n")


def test_a_kind_the_cpu_lacks_is_refused_naming_what_is_missing():
    cpu_kinds.check("native", AVX2_ONLY)
    cpu_kinds.check("avx2", AVX2_ONLY)
    cpu_kinds.check("avx512", VNNI)
    with pytest.raises(SystemExit, match="avx512f, avx512bw, avx512dq, avx512vl, avx512_vnni"):
        cpu_kinds.check("avx512", AVX2_ONLY)


def test_the_report_names_the_cpu_and_its_vector_extensions():
    assert cpu_kinds.cpu(AVX2_ONLY).startswith("AMD EPYC 7B12, AVX2 without AVX-512, ")
    assert cpu_kinds.cpu(VNNI).startswith("AMD EPYC 9B14, AVX-512 VNNI, ")
