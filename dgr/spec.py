"""SessionSpec: what one session is asked for, built once where it arrives
(dgr.Node, from a door's or a caller's prompt and SamplingParams) and carried
whole: admission sizes it, placement matches its prompt, the batch loop's start
configures the slot and the scheduler from it, the reply writer reads its stops.
A per-session option is a SamplingParams field, set where the request is read
(a door, or the caller) and read where it is used; SamplingParams loads from a
plain dict too (`SamplingParams.from_dict({...})`)."""

from __future__ import annotations

import math
from typing import Optional

import attrs

from dgr._codes import MAX_LOGPROBS, MAX_STOP_IDS, Speculation
from dgr.errors import InvalidRequest

MAX_STOP_STRINGS = 8        # stop strings per session
MAX_STOP_STRING_CHARS = 256
MAX_LOGIT_BIAS = 1024       # tokens one session may bias
# speculative decoding (dgr/_drafts.pyx, dgr/_scheduler.pyx Policy 3): never, where
# the node's step-time model says drafts pay, or whenever there is a draft
SPECULATION_MODES = {"off": Speculation.SPECULATE_OFF, "auto": Speculation.SPECULATE_AUTO,
                     "always": Speculation.SPECULATE_ALWAYS}


def _pairs(value):
    """A list of pairs (lists or tuples) as a tuple of tuples; None stays None."""
    if not isinstance(value, (list, tuple)):
        return value
    return tuple(tuple(pair) if isinstance(pair, list) else pair for pair in value)


def _tuple(value):
    """A list (or tuple) as a tuple, None as (); anything else is left for
    SamplingParams' checks to refuse."""
    if value is None:
        return ()
    return tuple(value) if isinstance(value, (list, tuple)) else value


@attrs.define(frozen=True)
class SamplingParams:
    """How one session samples and when it stops.

    temperature 0 is greedy. stop: strings that end generation (not included in
    the text). logprobs: report the top-k log-probabilities of each token (0..MAX_LOGPROBS),
    from the model's distribution (before penalties and biases).
    seed: per-session seed for temperature > 0, any integer (None picks one at
    random); equal seeds repeat a session exactly, different seeds are hashed to
    different 32-bit sampler seeds (dgr._sampling.seed32).
    logit_bias: token id -> bias added to its logit (-100..100; -100 bans it).
    grammar: GBNF (root rule "root") the output must follow (structured output);
    generation ends when the grammar is complete.
    presence_penalty, frequency_penalty (-2..2, OpenAI's) and repeat_penalty (> 0,
    llama.cpp's divisor, 1 = off) apply to the last repeat_last_n generated tokens.
    stop_token_ids: token ids that end generation (finish reason "stop"; like an
    end-of-generation token, not part of the output). min_tokens: neither an
    end-of-generation token nor a stop token id (nor a stop string) ends the
    session before it has generated that many tokens (vLLM's semantics).
    prompt_logprobs: also report each prompt token's log-probability given the
    tokens before it, with that many alternatives (vLLM's; the first token has
    none); the prompt is then computed whole (nothing shared from the prefix
    cache), so the figures are those of computing it, and max_tokens may be 0.
    typical_p: locally typical sampling (llama.cpp's typ_p; 1 = off): keeps the
    tokens whose surprise is closest to the distribution's entropy, up to that
    much probability, after top_k and before top_p.
    speculation: "off", "auto" or "always" (SPECULATION_MODES), None for the node's
    setting: whether its decode steps may verify draft tokens (the output is
    the same either way, only its speed differs).
    model: the model the request names: the base model (by any of its names) or a
    loaded LoRa adapter, which the session then applies (dgr.adapters). lora:
    llama-server's ((adapter id, scale), ...): these adapters at these scales
    instead of the global ones. skip_special_tokens (vLLM's): control tokens write no
    text; False: their text is part of the output.
    """

    max_tokens: Optional[int] = None
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    typical_p: float = 1.0
    seed: Optional[int] = None
    stop: tuple[str, ...] = attrs.field(default=(), converter=lambda v: _tuple((v,) if isinstance(v, str) else v))
    logprobs: int = 0
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    logit_bias: tuple = attrs.field(default=(), converter=lambda v: _tuple(
        sorted(v.items(), key=lambda kv: str(kv[0])) if isinstance(v, dict) else v))
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    grammar: Optional[str] = None
    stop_token_ids: tuple[int, ...] = attrs.field(default=(), converter=lambda v: _tuple(v))
    min_tokens: int = 0
    prompt_logprobs: Optional[int] = None
    speculation: Optional[str] = None
    model: Optional[str] = None
    lora: Optional[tuple] = attrs.field(default=None, converter=lambda v: _pairs(v))

    def __attrs_post_init__(self) -> None:
        def bad(field: str, msg: str) -> None:
            raise InvalidRequest(msg, field)

        def integer(field: str, lo: int = 0) -> None:
            value = getattr(self, field)
            if isinstance(value, bool) or not isinstance(value, int) or value < lo:
                bad(field, f"{field} must be an integer >= {lo}, got {value!r}")

        def number(field: str, lo: float, hi: float, open_lo: bool = False) -> None:
            value = getattr(self, field)
            if (isinstance(value, bool) or not isinstance(value, (int, float))
                    or not math.isfinite(value) or not lo <= value <= hi
                    or (open_lo and value == lo)):
                bad(field, f"{field} must be a number within {'(' if open_lo else ''}"
                           f"{lo:g}..{hi:g}{')' if open_lo else ''}, got {value!r}")

        if self.prompt_logprobs is not None:
            integer("prompt_logprobs")
            if self.prompt_logprobs > MAX_LOGPROBS:
                bad("prompt_logprobs", f"prompt_logprobs must be within 0..{MAX_LOGPROBS}, got "
                                       f"{self.prompt_logprobs}")
        if self.max_tokens is not None:
            # a session that scores its prompt may generate nothing
            integer("max_tokens", 0 if self.prompt_logprobs is not None else 1)
        number("temperature", 0.0, 100.0)
        number("top_p", 0.0, 1.0, open_lo=True)
        number("min_p", 0.0, 1.0)
        number("typical_p", 0.0, 1.0, open_lo=True)
        integer("top_k")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            bad("seed", f"seed must be an integer, got {self.seed!r}")
        integer("logprobs")
        if self.logprobs > MAX_LOGPROBS:
            bad("logprobs", f"logprobs must be within 0..{MAX_LOGPROBS}, got {self.logprobs}")
        for flag in ("ignore_eos", "skip_special_tokens"):
            if not isinstance(getattr(self, flag), bool):
                bad(flag, f"{flag} must be a boolean, got {getattr(self, flag)!r}")
        if not isinstance(self.stop, tuple) or len(self.stop) > MAX_STOP_STRINGS or any(
                not isinstance(s, str) or not s or len(s) > MAX_STOP_STRING_CHARS for s in self.stop):
            bad("stop", f"stop must be at most {MAX_STOP_STRINGS} non-empty strings of at most "
                        f"{MAX_STOP_STRING_CHARS} characters")
        number("presence_penalty", -2.0, 2.0)
        number("frequency_penalty", -2.0, 2.0)
        number("repeat_penalty", 0.0, 10.0, open_lo=True)
        integer("repeat_last_n")
        if self.grammar is not None:
            if not isinstance(self.grammar, str) or not self.grammar.strip():
                bad("grammar", "grammar must be non-empty GBNF text")
            if self.ignore_eos:
                bad("ignore_eos", "ignore_eos cannot be used with a grammar (it ends where the "
                                  "grammar does)")
        if not isinstance(self.stop_token_ids, tuple) or len(self.stop_token_ids) > MAX_STOP_IDS or any(
                isinstance(t, bool) or not isinstance(t, int) or t < 0 for t in self.stop_token_ids):
            bad("stop_token_ids", f"stop_token_ids must be at most {MAX_STOP_IDS} token ids "
                                  "(non-negative integers)")
        integer("min_tokens")
        if self.model is not None and (not isinstance(self.model, str) or not self.model):
            bad("model", f"model must be a non-empty string, got {self.model!r}")
        if self.lora is not None and any(
                not isinstance(pair, tuple) or len(pair) != 2 or isinstance(pair[0], bool)
                or not isinstance(pair[0], int) or isinstance(pair[1], bool)
                or not isinstance(pair[1], (int, float)) or not math.isfinite(pair[1])
                for pair in self.lora):
            bad("lora", "lora must be (adapter id, scale) pairs")
        if self.max_tokens is not None and self.min_tokens > self.max_tokens:
            bad("min_tokens", f"min_tokens ({self.min_tokens}) must not exceed max_tokens "
                              f"({self.max_tokens})")
        if self.min_tokens and self.grammar is not None:
            bad("min_tokens", "min_tokens cannot be used with a grammar (it ends where the "
                              "grammar does)")
        if self.speculation is not None and (not isinstance(self.speculation, str)
                                             or self.speculation not in SPECULATION_MODES):
            bad("speculation", f"speculation must be one of {', '.join(SPECULATION_MODES)}, "
                               f"got {self.speculation!r}")
        if not isinstance(self.logit_bias, tuple):
            bad("logit_bias", "logit_bias must map token ids to biases")
        if len(self.logit_bias) > MAX_LOGIT_BIAS:
            bad("logit_bias", f"logit_bias takes at most {MAX_LOGIT_BIAS} tokens")
        for entry in self.logit_bias:
            if (not isinstance(entry, tuple) or len(entry) != 2 or isinstance(entry[0], bool)
                    or not isinstance(entry[0], int) or entry[0] < 0
                    or isinstance(entry[1], bool) or not isinstance(entry[1], (int, float))
                    or not -100 <= entry[1] <= 100):
                bad("logit_bias", "logit_bias maps token ids (non-negative integers) to biases "
                                  "within -100..100")

    def sampler_bias(self) -> tuple:
        """logit_bias as the engine takes it: -100 bans the token outright."""
        return tuple((token, -math.inf if bias <= -100 else float(bias))
                     for token, bias in self.logit_bias)

    @classmethod
    def from_dict(cls, data: dict) -> "SamplingParams":
        known = {f.name for f in attrs.fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known and v is not None})



DEFAULT_TENANT = "default"  # a request with no API key, X-Tenant header or user
MAX_PRIORITY = 1 << 31  # priorities lie within -MAX_PRIORITY..MAX_PRIORITY - 1 (vLLM's int)


@attrs.frozen
class Requester:
    """Whose a session is and how urgent: the tenant it counts against (dgr.tenants)
    and its priority, lower running first (vLLM's; under --scheduling-policy fcfs
    it changes nothing)."""

    tenant: str = DEFAULT_TENANT
    priority: int = attrs.field(default=0)

    @priority.validator
    def _check_priority(self, attribute, value) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or not (
                -MAX_PRIORITY <= value < MAX_PRIORITY):
            raise InvalidRequest(f"priority must be an integer within {-MAX_PRIORITY}.."
                                 f"{MAX_PRIORITY - 1}", "priority")


@attrs.frozen
class SessionSpec:
    prompt: list[int]  # token ids, at least one
    # as the node resolved them: max_tokens is the tokens it may generate (its
    # request's or the node's default, within the KV a session may reserve; 0 when
    # it only scores its prompt), speculation its mode where the node can draft
    # (else the node's), seed set where it samples
    params: SamplingParams
    reports_progress: bool = False  # its stream reports its prompt's prefill as it goes
    # (dgr.stream.PromptProgress chunks)
    # the LoRa adapters it applies, each with its scale (dgr.adapters.Adapter, float),
    # as the node resolved the request's model and lora fields
    adapters: tuple = ()
    requester: Requester = Requester()

    @property
    def adapter_scales(self) -> tuple[tuple[int, float], ...]:
        """(engine index, scale) of each adapter, as the batch loop sets them."""
        return tuple((adapter.index, scale) for adapter, scale in self.adapters)

    @property
    def cache_key(self) -> tuple[tuple[int, float], ...]:
        """What its KV depends on besides its tokens: (load id, scale) of each adapter.
        A prefix is shared only between sessions of one key (dgr.prefix_cache)."""
        return tuple((adapter.id, scale) for adapter, scale in self.adapters)

    @property
    def scores_prompt(self) -> bool:
        """It reports each prompt token's log-probability (SamplingParams.prompt_logprobs)."""
        return self.params.prompt_logprobs is not None
