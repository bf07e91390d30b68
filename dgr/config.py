"""Node configuration and per-session sampling parameters (attrs classes).

Both load from plain dicts (a TOML file, a JSON body) with cattrs:
`load_config({...})`, `SamplingParams.from_dict({...})`.
"""

from __future__ import annotations

import math
import os
from typing import Optional

import attrs
import cattrs

from dgr.errors import InvalidRequest


def _total_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 << 30


@attrs.define(frozen=True)
class NodeConfig:
    """Everything a node needs to start. Budgets are explicit; defaults are safe.

    model_path: the GGUF file; None means the default model (Gemma 3 270M).
    max_running: sessions decoding at once (= llama.cpp sequence slots).
    max_waiting: sessions allowed to wait for a slot; one more is rejected.
    max_waiting_tokens: prompt tokens allowed to wait in the queue.
    n_ctx: total KV cells. With kv_unified=False every slot gets n_ctx / max_running
        (llama.cpp rounds a slot up to a multiple of 256 cells).
    max_batch_tokens: token budget of one step (rows in one llama_decode), <= n_batch.
    prefill_chunk: prompt tokens per chunk; chunk boundaries are multiples of it.
    prefill_sessions_per_step: sessions that may prefill a chunk in one step, each in a
        llama_decode call of its own (see dgr/scheduler.py); bounds how many chunks
        decoders can wait for in one step.
    reply_buffer: tokens a session may hold unread before it is skipped in steps.
    memory_budget_bytes: weights + KV + scratch must fit here or the node refuses to start.
    """

    model_path: Optional[str] = None
    max_running: int = 16
    max_waiting: int = 16
    max_waiting_tokens: int = 16384
    n_ctx: int = 32768
    n_batch: int = 512
    n_ubatch: int = 512
    max_batch_tokens: Optional[int] = None
    prefill_chunk: int = 256
    prefill_sessions_per_step: int = 4
    n_threads: Optional[int] = None
    kv_unified: bool = False
    weight_repack: bool = False
    reply_buffer: int = 16
    memory_budget_bytes: Optional[int] = None
    default_max_tokens: int = 256

    def __attrs_post_init__(self) -> None:
        positive = ["max_running", "n_ctx", "n_batch", "n_ubatch", "prefill_chunk",
                    "prefill_sessions_per_step", "reply_buffer", "default_max_tokens"]
        for name in positive:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.max_waiting < 0 or self.max_waiting_tokens < 0:
            raise ValueError("max_waiting and max_waiting_tokens must not be negative")
        if self.max_batch_tokens is not None and not 1 <= self.max_batch_tokens <= self.n_batch:
            raise ValueError(f"max_batch_tokens must be within 1..n_batch ({self.n_batch})")
        if self.prefill_chunk > self.step_token_budget:
            raise ValueError(f"prefill_chunk ({self.prefill_chunk}) exceeds the step token budget "
                             f"({self.step_token_budget})")
        if self.step_token_budget <= self.max_running:
            raise ValueError("the step token budget must exceed max_running, or prefill "
                             "could never run beside a full set of decoders")

    @property
    def step_token_budget(self) -> int:
        return self.max_batch_tokens if self.max_batch_tokens is not None else self.n_batch

    @property
    def memory_budget(self) -> int:
        if self.memory_budget_bytes is not None:
            return self.memory_budget_bytes
        return int(_total_memory_bytes() * 0.8)


_converter = cattrs.Converter(forbid_extra_keys=True)


def load_config(data: dict) -> NodeConfig:
    """NodeConfig from a dict (e.g. a parsed TOML file); unknown keys are errors."""
    unknown = set(data) - {f.name for f in attrs.fields(NodeConfig)}
    if unknown:
        raise ValueError(f"unknown config keys: {', '.join(sorted(unknown))}")
    try:
        return _converter.structure(data, NodeConfig)
    except cattrs.BaseValidationError as exc:
        raise ValueError("; ".join(_messages(exc))) from None


def _messages(exc: BaseException) -> list[str]:
    if isinstance(exc, BaseExceptionGroup):
        return [m for inner in exc.exceptions for m in _messages(inner)]
    note = "".join(f" ({n})" for n in getattr(exc, "__notes__", []))
    return [f"{exc}{note}"]


@attrs.define(frozen=True)
class SamplingParams:
    """How one session samples and when it stops.

    temperature 0 is greedy. stop: strings that end generation (not included in
    the text). logprobs: report the top-k log-probabilities of each token (0..20).
    seed: per-session seed for temperature > 0 (None picks one at random).
    """

    max_tokens: Optional[int] = None
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    seed: Optional[int] = None
    stop: tuple[str, ...] = attrs.field(default=(), converter=lambda v: (v,) if isinstance(v, str) else tuple(v or ()))
    logprobs: int = 0
    ignore_eos: bool = False

    def __attrs_post_init__(self) -> None:
        def bad(msg: str) -> None:
            raise InvalidRequest(msg)

        if self.max_tokens is not None and (not isinstance(self.max_tokens, int) or self.max_tokens < 1):
            bad(f"max_tokens must be a positive integer, got {self.max_tokens!r}")
        for name in ("temperature", "top_p", "min_p"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                bad(f"{name} must be a finite number, got {value!r}")
        if not 0.0 <= self.temperature <= 100.0:
            bad(f"temperature must be within 0..100, got {self.temperature}")
        if not 0.0 < self.top_p <= 1.0:
            bad(f"top_p must be within (0, 1], got {self.top_p}")
        if not 0.0 <= self.min_p <= 1.0:
            bad(f"min_p must be within 0..1, got {self.min_p}")
        if isinstance(self.top_k, bool) or not isinstance(self.top_k, int) or self.top_k < 0:
            bad(f"top_k must be a non-negative integer, got {self.top_k!r}")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            bad(f"seed must be an integer, got {self.seed!r}")
        if isinstance(self.logprobs, bool) or not isinstance(self.logprobs, int) or not 0 <= self.logprobs <= 20:
            bad(f"logprobs must be an integer within 0..20, got {self.logprobs!r}")
        if len(self.stop) > 8 or any(not isinstance(s, str) or not s or len(s) > 256 for s in self.stop):
            bad("stop must be at most 8 non-empty strings of at most 256 characters")

    @classmethod
    def from_dict(cls, data: dict) -> "SamplingParams":
        known = {f.name for f in attrs.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known and v is not None})
