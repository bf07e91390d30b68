"""Whether the invariance covers a model on this node, and why not where it does not.

The promise rests on what tests show: the weight types whose matmuls and MoE expert
matmuls the native tests show row-invariant (patches/native-tests; docs/design.md,
Batch invariance), read from the GGUF header; the architectures a test serves and
checks bitwise; the attention path (the row-invariant flash attention, which the
engine asks llama.cpp for); the repacking mode; and the CPUs the native tests ran on.
`GET /capabilities` reports it under "invariance"; `python -m dgr check-invariance`
checks a model end to end on this CPU and prints it beside its verdict."""

from __future__ import annotations

import platform
import struct

from dgr.gguf_file import tensors

COVERED = frozenset({"F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K",
                     "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_XS", "IQ3_XXS", "IQ3_S", "IQ2_XXS",
                     "IQ2_XS", "IQ2_S", "IQ1_S", "IQ1_M", "TQ1_0", "TQ2_0", "MXFP4"})
# served and checked bitwise by a test: random-weight models in tests/test_model_matrix.py
# (attention with and without q/k norms, mixture of experts, a hybrid with short
# convolutions, a state-space model), the default model (Gemma 3) in
# tests/test_default_model.py, and embedders and rerankers (encoders with absolute,
# rotary and ALiBi positions; decoders pooling their last token) in tests/test_embeddings.py
TESTED_ARCHITECTURES = frozenset({"llama", "qwen3", "qwen3moe", "lfm2", "mamba", "gemma3",
                                  "bert", "nomic-bert", "jina-bert-v2"})
# the CPUs the native invariance tests pass on (scripts/native_tests.py, and with --cpu
# avx2 | aarch64): a name, the machine, the llama.cpp system_info features that pick the
# kernels they tested, and those that would pick others (an SVE build's)
ARM_DOTPROD_I8MM = "aarch64 with NEON, dotprod and i8mm"
TESTED_CPUS = (("x86-64 with AVX-512 and VNNI", "x86_64", ("AVX512 = 1", "AVX512_VNNI = 1"), ()),
               ("x86-64 with AVX2", "x86_64", ("AVX2 = 1", "FMA = 1"), ("AVX512 = 1",)),
               (ARM_DOTPROD_I8MM, "aarch64",
                ("NEON = 1", "DOTPROD = 1", "MATMUL_INT8 = 1"), ("SVE = 1",)))


def weight_types(path: str, repacked: frozenset[str] = frozenset()) -> dict:
    """{"weight_types": {name: tensors}, "not_covered": [type names whose tensors the
    invariance does not cover]}: a weight among `repacked` (dgr.weight_repack:
    row-invariant repacked kernels) is covered whatever its type; a header this reader
    cannot follow (llama.cpp loaded the model, so it is not the file's fault) adds
    "error"."""
    try:
        found = tensors(path)
    except (ValueError, KeyError, struct.error, OSError) as exc:
        return {"weight_types": {}, "not_covered": [],
                "error": f"cannot read the GGUF header's tensor types: {exc}"}
    types: dict[str, int] = {}
    for _, kind, _ in found:
        types[kind] = types.get(kind, 0) + 1
    # the token embedding is only read row by row (GET_ROWS), unless it is also the
    # output matrix (no output.weight)
    lookup_only = {"token_embd.weight"} if any(n == "output.weight" for n, _, _ in found) else set()
    missing = sorted({kind for name, kind, _ in found
                      if kind not in COVERED and name not in repacked and name not in lookup_only})
    return {"weight_types": types, "not_covered": missing}


def cpu_kind(system_info: str, machine: str | None = None) -> str | None:
    """The name of the tested CPU kind this one is (TESTED_CPUS), else None."""
    machine = machine or platform.machine()
    for name, tested_machine, features, others in TESTED_CPUS:
        if (machine == tested_machine and all(f in system_info for f in features)
                and not any(f in system_info for f in others)):
            return name
    return None


def report(path: str, repacked: frozenset[str], info: dict, system_info: str,
           machine: str | None = None) -> dict:
    """{"covered", "weight_types", "not_covered", "architecture", "flash_attn",
    "weight_repack", "cpu" (the tested CPU kind, or None), "cpus_covered", "why_not":
    [reasons]} of
    the model at `path` as the engine runs it (`info`: Engine.info) on this CPU."""
    weights = weight_types(path, repacked)
    why_not = []
    if "error" in weights:
        why_not.append(weights["error"])
    if weights["not_covered"]:
        why_not.append(f"weight types {', '.join(weights['not_covered'])} take kernels no "
                       "native test shows row-invariant")
    if info["weight_repack"] == "all":
        why_not.append("--weight-repack all: llama.cpp's repacked kernels of other types "
                       "(Q2_K among them) round a row differently beside others")
    if info["memory"] != "recurrent" and info["flash_attn"] != "enabled":
        why_not.append(f"flash attention is {info['flash_attn']} for this model: the other "
                       "attention path sums by absolute cell index, which depends on the "
                       "other sessions in a shared pool")
    if info["architecture"] not in TESTED_ARCHITECTURES:
        why_not.append(f"no test serves the {info['architecture'] or 'unnamed'} architecture "
                       f"(tested: {', '.join(sorted(TESTED_ARCHITECTURES))}): its graph may "
                       "hold ops whose kernels are not row-invariant")
    cpu = cpu_kind(system_info, machine)
    if cpu is None:
        why_not.append(f"the native invariance tests ran on {', '.join(t[0] for t in TESTED_CPUS)}"
                       f" only; this CPU ({machine or platform.machine()}) takes other kernel "
                       "paths")
    return {"covered": not why_not, **weights, "architecture": info["architecture"],
            "flash_attn": info["flash_attn"], "weight_repack": info["weight_repack"],
            "cpu": cpu, "cpus_covered": [t[0] for t in TESTED_CPUS], "why_not": why_not}
