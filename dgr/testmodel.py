"""Write a tiny random-weight GGUF model for tests: no download, loads in milliseconds.

Architecture "llama" (or "qwen3": q/k norms; "qwen3moe": q/k norms and a mixture of
experts; "lfm2": a hybrid of short-convolution and attention layers; "mamba": a
selective state-space model, recurrent only), a few layers, f32 weights drawn from a
seeded generator, and an SPM tokenizer with byte fallback (every UTF-8 byte has a
token, so any text encodes), printable ASCII characters, a few merged pairs, and
ChatML control tokens so that llama.cpp
recognizes its chat template. `quantize` turns one into another weight type with
the installed llama.cpp's quantizer.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional

import numpy as np

from dgr.gguf_file import POOLING

# gguf token types
_NORMAL, _UNKNOWN, _CONTROL, _BYTE = 1, 2, 3, 6

ARCHITECTURES = ("llama", "qwen3", "qwen3moe", "lfm2", "mamba")
# write_encoder_model's: BERT, nomic-bert (rotary positions, a gated feed-forward),
# jina-bert-v2 (ALiBi: no positions, a linear bias by distance in the attention mask)
ENCODER_ARCHITECTURES = ("bert", "nomic-bert", "jina-bert-v2")
# LFM2's short convolution: the window of tokens each output mixes (its state keeps
# the last LFM2_CONV_CACHE - 1)
LFM2_CONV_CACHE = 3

_MERGES = ["th", "he", "in", "er", "an", " t", " a", "on", "re", "at", "en", "nd", "the", " the"]
CHAT_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content']"
    " + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}"
    "{% endif %}"
)
# a reranker's layout of a (query, document) pair, as Qwen3-Reranker's GGUF carries it
# (llama-server fills in {query} and {document}; its control tokens are parsed)
RERANK_TEMPLATE = ("<|im_start|>user\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
                   "<|im_start|>assistant\n")


def _vocab() -> tuple[list[str], list[float], list[int]]:
    tokens = ["<unk>", "<s>", "</s>", "<|im_start|>", "<|im_end|>"]
    types = [_UNKNOWN, _CONTROL, _CONTROL, _CONTROL, _CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [_BYTE] * 256
    chars = [chr(c) for c in range(33, 127)] + ["\u2581"]  # U+2581 stands for a space in SPM
    tokens += chars
    types += [_NORMAL] * len(chars)
    merges = [m.replace(" ", "\u2581") for m in _MERGES]
    tokens += merges
    types += [_NORMAL] * len(merges)
    # SPM merges the pair whose result scores highest: longer pieces score higher.
    scores = [0.0] * (5 + 256) + [-10.0] * len(chars) + [-5.0 + len(m) for m in merges]
    return tokens, scores, types


def write_test_model(path: str | os.PathLike, *, n_embd: int = 64, n_layer: int = 2,
                     n_head: int = 4, n_head_kv: int = 2, n_ff: int = 128,
                     n_ctx_train: int = 8192, seed: int = 1234,
                     chat_template: str = CHAT_TEMPLATE, architecture: str = "llama",
                     n_expert: int = 8, n_expert_used: int = 2,
                     deltas: Optional[dict] = None, pooling: Optional[str] = None,
                     n_labels: int = 0) -> Path:
    """Write the model to `path` (atomically) and return the path. With architecture
    "qwen3moe" each layer's feed-forward is n_expert experts of n_ff rows, n_expert_used
    of them per token; with "lfm2" every third layer attends and the others are short
    convolutions (recurrent state); "mamba" has no attention at all. `deltas`
    ({tensor name: array}) are added to those weights: a LoRa adapter merged in
    (`write_lora`). `pooling` (a POOLING name) makes it an embedding model's GGUF
    (Qwen3-Embedding-style: a decoder whose vector is its last token's, say). With
    n_labels (and pooling "rank") it is a Qwen3-Reranker-style reranker: a classifier
    (cls.output) over the last token's state, and a "rerank" template that lays out a
    query and a document. llama.cpp soft-maxes a qwen3 reranker's labels, so the first
    of two ("yes", "no") is the score."""
    if architecture not in ARCHITECTURES:
        raise ValueError(f"architecture must be one of {', '.join(ARCHITECTURES)}, "
                         f"not {architecture!r}")
    import gguf  # a test dependency; the runtime never writes models

    path = Path(path)
    tokens, scores, types = _vocab()
    n_vocab = len(tokens)
    rng = np.random.default_rng(seed)

    def weight(rows: int, cols: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * scale / np.sqrt(cols)).astype(np.float32)

    tmp = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(str(tmp), architecture)
    if deltas:
        add_tensor = writer.add_tensor
        writer.add_tensor = lambda name, array, **kw: add_tensor(
            name, (array + deltas[name]).astype(np.float32) if name in deltas else array, **kw)
    moe = architecture == "qwen3moe"
    qk_norm = architecture in ("qwen3", "qwen3moe")
    writer.add_name("dgr-tiny-test")
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_layer_norm_rms_eps(1e-5)
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if pooling is not None:
        writer.add_pooling_type(gguf.PoolingType(POOLING[pooling]))
    _add_tokenizer(writer, tokens, scores, types, chat_template,
                   rerank_template=RERANK_TEMPLATE if n_labels else None)
    if n_labels:
        writer.add_classifier_output_labels([f"label{i}" for i in range(n_labels)])
        writer.add_tensor("cls.output.weight", weight(n_labels, n_embd, scale=4.0))
    writer.add_tensor("token_embd.weight",
                      rng.standard_normal((n_vocab, n_embd)).astype(np.float32))
    if architecture == "mamba":
        _mamba_layers(writer, weight, n_embd, n_layer)
    elif architecture == "lfm2":
        _lfm2_layers(writer, weight, n_embd, n_layer, n_head, n_head_kv, n_ff)
    else:
        _attention_layers(writer, weight, n_embd, n_layer, n_head, n_head_kv, n_ff,
                          n_expert if moe else 0, n_expert_used, qk_norm)
    # LFM2 names its final norm token_embd_norm
    writer.add_tensor("token_embd_norm.weight" if architecture == "lfm2" else "output_norm.weight",
                      np.ones(n_embd, dtype=np.float32))
    # A large output scale spreads the logits, so greedy choices are rarely near-ties.
    writer.add_tensor("output.weight", weight(n_vocab, n_embd, scale=8.0))

    _write(writer, tmp, path)
    return path


def _write(writer, tmp: Optional[Path] = None, path: Optional[Path] = None) -> None:
    """Write out and close a GGUFWriter; with `tmp`, move its file to `path` once whole."""
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    if tmp is not None:
        os.replace(tmp, path)


def _add_tokenizer(writer, tokens, scores, types, chat_template: str,
                   add_eos: bool = False, rerank_template: Optional[str] = None) -> None:
    writer.add_tokenizer_model("llama")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    writer.add_unk_token_id(0)
    writer.add_bos_token_id(1)
    writer.add_eos_token_id(2)
    writer.add_eot_token_id(4)
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(add_eos)
    writer.add_add_space_prefix(False)
    if rerank_template is None:
        writer.add_chat_template(chat_template)
    else:  # named templates: tokenizer.chat_template and tokenizer.chat_template.rerank
        writer.add_chat_template([{"name": "default", "template": chat_template},
                                  {"name": "rerank", "template": rerank_template}])


def _attention_layers(writer, weight, n_embd, n_layer, n_head, n_head_kv, n_ff,
                      n_expert, n_expert_used, qk_norm) -> None:
    """llama's layers, qwen3's (qk_norm) or qwen3moe's (and n_expert experts)."""
    head_dim = n_embd // n_head
    writer.add_feed_forward_length(n_ff)
    if n_expert:
        writer.add_expert_feed_forward_length(n_ff)
        writer.add_expert_count(n_expert)
        writer.add_expert_used_count(n_expert_used)
    writer.add_head_count(n_head)
    writer.add_head_count_kv(n_head_kv)
    writer.add_rope_dimension_count(head_dim)
    for i in range(n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.attn_q.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"blk.{i}.attn_k.weight", weight(n_head_kv * head_dim, n_embd))
        writer.add_tensor(f"blk.{i}.attn_v.weight", weight(n_head_kv * head_dim, n_embd))
        writer.add_tensor(f"blk.{i}.attn_output.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        if qk_norm:
            writer.add_tensor(f"blk.{i}.attn_q_norm.weight", np.ones(head_dim, dtype=np.float32))
            writer.add_tensor(f"blk.{i}.attn_k_norm.weight", np.ones(head_dim, dtype=np.float32))
        if not n_expert:
            writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(n_ff, n_embd))
            writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(n_ff, n_embd))
            writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(n_embd, n_ff))
            continue
        # a router with a wide spread, so that tokens pick experts far from ties
        writer.add_tensor(f"blk.{i}.ffn_gate_inp.weight", weight(n_expert, n_embd, scale=4.0))
        for name, rows, cols in (("gate", n_ff, n_embd), ("up", n_ff, n_embd), ("down", n_embd, n_ff)):
            writer.add_tensor(f"blk.{i}.ffn_{name}_exps.weight",
                              np.stack([weight(rows, cols) for _ in range(n_expert)]))


def _lfm2_layers(writer, weight, n_embd, n_layer, n_head, n_head_kv, n_ff) -> None:
    """LFM2's layers: every third one (from the third) attends with q/k norms, the
    others are gated short convolutions over the last LFM2_CONV_CACHE - 1 tokens."""
    head_dim = n_embd // n_head
    attends = [i % 3 == 2 for i in range(n_layer)]
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_head_count_kv([n_head_kv if a else 0 for a in attends])
    writer.add_rope_dimension_count(head_dim)
    writer.add_uint32("lfm2.shortconv.l_cache", LFM2_CONV_CACHE)
    for i in range(n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        if attends[i]:
            writer.add_tensor(f"blk.{i}.attn_q_norm.weight", np.ones(head_dim, dtype=np.float32))
            writer.add_tensor(f"blk.{i}.attn_k_norm.weight", np.ones(head_dim, dtype=np.float32))
            writer.add_tensor(f"blk.{i}.attn_q.weight", weight(n_embd, n_embd))
            writer.add_tensor(f"blk.{i}.attn_k.weight", weight(n_head_kv * head_dim, n_embd))
            writer.add_tensor(f"blk.{i}.attn_v.weight", weight(n_head_kv * head_dim, n_embd))
            writer.add_tensor(f"blk.{i}.attn_output.weight", weight(n_embd, n_embd))
        else:
            writer.add_tensor(f"blk.{i}.shortconv.conv.weight",
                              weight(n_embd, LFM2_CONV_CACHE, scale=0.5))
            writer.add_tensor(f"blk.{i}.shortconv.in_proj.weight", weight(3 * n_embd, n_embd))
            writer.add_tensor(f"blk.{i}.shortconv.out_proj.weight", weight(n_embd, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ffn_gate.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_up.weight", weight(n_ff, n_embd))
        writer.add_tensor(f"blk.{i}.ffn_down.weight", weight(n_embd, n_ff))


def _mamba_layers(writer, weight, n_embd, n_layer) -> None:
    """Mamba's selective state-space layers (expansion factor 2, llama.cpp's only)."""
    d_inner, d_state, d_conv, dt_rank = 2 * n_embd, 16, 4, max(1, n_embd // 16)
    writer.add_feed_forward_length(0)
    writer.add_head_count(0)
    writer.add_head_count_kv(0)
    writer.add_uint32("mamba.ssm.conv_kernel", d_conv)
    writer.add_uint32("mamba.ssm.inner_size", d_inner)
    writer.add_uint32("mamba.ssm.state_size", d_state)
    writer.add_uint32("mamba.ssm.time_step_rank", dt_rank)
    for i in range(n_layer):
        writer.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ssm_in.weight", weight(2 * d_inner, n_embd))
        writer.add_tensor(f"blk.{i}.ssm_conv1d.weight", weight(d_inner, d_conv, scale=0.5))
        writer.add_tensor(f"blk.{i}.ssm_conv1d.bias", np.zeros(d_inner, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ssm_x.weight", weight(dt_rank + 2 * d_state, d_inner))
        writer.add_tensor(f"blk.{i}.ssm_dt.weight", weight(d_inner, dt_rank))
        writer.add_tensor(f"blk.{i}.ssm_dt.bias", np.full(d_inner, -2.0, dtype=np.float32))
        # A = -exp(A_log), negative: a decaying state
        a = -np.tile(np.arange(1, d_state + 1, dtype=np.float32), (d_inner, 1))
        writer.add_tensor(f"blk.{i}.ssm_a", a)
        writer.add_tensor(f"blk.{i}.ssm_d", np.ones(d_inner, dtype=np.float32))
        writer.add_tensor(f"blk.{i}.ssm_out.weight", weight(n_embd, d_inner))


# llama.cpp's quantization types by their llama-quantize names
QUANT_TYPES = ("F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_1", "Q4_K_M", "Q6_K", "IQ4_XS",
               "IQ4_NL", "MXFP4_MOE")


def write_encoder_model(path: str | os.PathLike, *, n_embd: int = 64, n_layer: int = 2,
                        n_head: int = 4, n_ff: int = 128, n_ctx_train: int = 512,
                        pooling: str = "mean", n_labels: int = 0, seed: int = 99,
                        architecture: str = "bert") -> Path:
    """Write a BERT-style encoder (non-causal attention, layer norms with biases) with
    the SPM vocabulary above, adding a leading <s> and a trailing </s> to every input,
    whose GGUF asks for `pooling`. Architecture "bert" has absolute positions;
    "nomic-bert" rotary ones, a fused QKV projection and a gated (SiLU) feed-forward;
    "jina-bert-v2" ALiBi and a GELU-gated feed-forward. With n_labels a classifier head
    follows the pooled first token (cls and cls_output, n_labels scores; llama.cpp's
    "rank" pooling: a reranker)."""
    if architecture not in ENCODER_ARCHITECTURES:
        raise ValueError(f"architecture must be one of {', '.join(ENCODER_ARCHITECTURES)}, "
                         f"not {architecture!r}")
    import gguf

    path = Path(path)
    tokens, scores, types = _vocab()
    rng = np.random.default_rng(seed)

    def weight(*shape: int, scale: float = 1.0) -> np.ndarray:
        return (rng.standard_normal(shape) * scale / np.sqrt(shape[-1])).astype(np.float32)

    def norm(name: str) -> None:
        writer.add_tensor(name + ".weight", (1 + 0.1 * rng.standard_normal(n_embd))
                          .astype(np.float32))
        writer.add_tensor(name + ".bias", (0.1 * rng.standard_normal(n_embd)).astype(np.float32))

    def linear(name: str, rows: int, cols: int, bias: bool = True) -> None:
        writer.add_tensor(name + ".weight", weight(rows, cols))
        if bias:
            writer.add_tensor(name + ".bias", weight(rows, scale=0.1))

    tmp = path.with_name(path.name + ".partial")
    writer = gguf.GGUFWriter(str(tmp), architecture)
    writer.add_name("dgr-tiny-encoder")
    writer.add_context_length(n_ctx_train)
    writer.add_embedding_length(n_embd)
    writer.add_block_count(n_layer)
    writer.add_feed_forward_length(n_ff)
    writer.add_head_count(n_head)
    writer.add_layer_norm_eps(1e-12)
    writer.add_causal_attention(False)
    writer.add_pooling_type(gguf.PoolingType(POOLING[pooling]))
    writer.add_file_type(gguf.LlamaFileType.ALL_F32)
    if architecture == "nomic-bert":
        writer.add_rope_freq_base(1000.0)
    _add_tokenizer(writer, tokens, scores, types, CHAT_TEMPLATE, add_eos=True)
    writer.add_token_type_count(2)
    if n_labels:
        writer.add_classifier_output_labels([f"label{i}" for i in range(n_labels)])
    writer.add_tensor("token_embd.weight", weight(len(tokens), n_embd, scale=np.sqrt(n_embd)))
    writer.add_tensor("token_types.weight", weight(2, n_embd, scale=np.sqrt(n_embd)))
    if architecture == "bert":
        writer.add_tensor("position_embd.weight",
                          weight(n_ctx_train, n_embd, scale=np.sqrt(n_embd)))
    norm("token_embd_norm")
    for i in range(n_layer):
        if architecture == "nomic-bert":
            linear(f"blk.{i}.attn_qkv", 3 * n_embd, n_embd, bias=False)
            linear(f"blk.{i}.attn_output", n_embd, n_embd, bias=False)
        else:
            for name in ("attn_q", "attn_k", "attn_v", "attn_output"):
                linear(f"blk.{i}.{name}", n_embd, n_embd)
        norm(f"blk.{i}.attn_output_norm")
        if architecture == "nomic-bert":
            linear(f"blk.{i}.ffn_gate", n_ff, n_embd, bias=False)
            linear(f"blk.{i}.ffn_up", n_ff, n_embd, bias=False)
            linear(f"blk.{i}.ffn_down", n_embd, n_ff, bias=False)
        else:  # jina-bert-v2's up projection holds its gate's rows too
            linear(f"blk.{i}.ffn_up", n_ff * (2 if architecture == "jina-bert-v2" else 1), n_embd)
            linear(f"blk.{i}.ffn_down", n_embd, n_ff)
        norm(f"blk.{i}.layer_output_norm")
    if n_labels:
        linear("cls", n_embd, n_embd)
        writer.add_tensor("cls.output.weight", weight(n_labels, n_embd, scale=4.0))
        writer.add_tensor("cls.output.bias", weight(n_labels, scale=0.1))
    _write(writer, tmp, path)
    return path


def write_tensors(path: str | os.PathLike, tensors: dict) -> str:
    """A GGUF of `tensors` ({name: (array, raw ggml type or None)}) and a little
    metadata (a string array, a number), no model: for header readers' tests."""
    import gguf

    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_token_list([f"t{i}" for i in range(1000)])
    writer.add_uint32("test.number", 7)
    for name, (array, raw_type) in tensors.items():
        writer.add_tensor(name, array, raw_dtype=raw_type)
    _write(writer)
    return str(path)


def write_lora(base: str | os.PathLike, path: str | os.PathLike, *, rank: int = 4,
               targets: tuple[str, ...] = ("attn_q", "ffn_down"), alpha: float = 8.0,
               size: float = 0.5, seed: int = 0) -> dict:
    """Write a random LoRa adapter (llama.cpp's GGUF adapter format) for the model at
    `base`: A and B of rank `rank` for every layer's `targets` weights. Returns each
    adapted weight's delta at scale 1 (alpha / rank * B A, numpy's orientation, the
    size of the weight's own values times about `size`), for `write_test_model`'s
    `deltas`."""
    import gguf

    from dgr import gguf_file

    metadata, tensors = gguf_file.header(os.fspath(base))
    rng = np.random.default_rng(seed)
    writer = gguf.GGUFWriter(str(path), metadata["general.architecture"])
    writer.add_string("general.type", "adapter")
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    deltas = {}
    for name, _, dims in tensors:
        if len(dims) != 2 or not any(f".{t}.weight" in name for t in targets):
            continue
        n_in, n_out = dims
        a = (rng.standard_normal((rank, n_in)) / np.sqrt(n_in)).astype(np.float32)
        b = (rng.standard_normal((n_out, rank)) * size / np.sqrt(rank)).astype(np.float32)
        writer.add_tensor(name + ".lora_a", a)
        writer.add_tensor(name + ".lora_b", b)
        deltas[name] = (b.astype(np.float64) @ a) * (alpha / rank)
    _write(writer)
    return deltas


def quantize(source: str | os.PathLike, path: str | os.PathLike, kind: str) -> Path:
    """Write `source` as weight type `kind` (one of QUANT_TYPES) to `path` with the
    installed llama.cpp's quantizer (tensors whose rows do not fit the type's blocks
    take llama.cpp's fallback type, as llama-quantize does)."""
    import llama_cpp

    if kind not in QUANT_TYPES:
        raise ValueError(f"kind must be one of {', '.join(QUANT_TYPES)}, not {kind!r}")
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{kind}")
    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    if llama_cpp.llama_model_quantize(str(source).encode(), str(tmp).encode(), params) != 0:
        raise RuntimeError(f"llama.cpp could not quantize {source} to {kind}")
    os.replace(tmp, path)
    return path


if __name__ == "__main__":
    import sys

    print(write_test_model(sys.argv[1] if len(sys.argv) > 1 else "dgr-tiny.gguf"))
