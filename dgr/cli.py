"""Command line: `python -m dgr run` serves a node over HTTP; `python -m dgr worker`
lends this machine's CPU to a node over ggml RPC; `python -m dgr check-invariance`
tells whether a model's sessions get the same bits whoever shares the node."""

from __future__ import annotations

import argparse
import logging
import sys

import attrs

from dgr.config import NodeConfig, ServerConfig, load_configs
from dgr.errors import DgrError


def _add_config_flags(parser: argparse.ArgumentParser, cls: type) -> None:
    """One flag per config field, from the field's `option` metadata (dgr/config.py)."""
    for field in attrs.fields(cls):
        meta = field.metadata
        shown = meta["default_text"] or field.default
        text = f"{meta['help']} (default: {shown})".replace("%", "%%")
        flags = (meta["flag"], *meta.get("aliases", ()))
        if "nargs" in meta:  # repeatable: each use appends its values ("+": one list of all)
            parser.add_argument(*flags, dest=field.name, default=None,
                                action="extend" if meta["nargs"] == "+" else "append",
                                nargs=None if meta["nargs"] == 1 else meta["nargs"], help=text)
        elif field.type in (bool, "bool"):  # a string until cattrs resolves the annotations
            parser.add_argument(*flags, dest=field.name, action=argparse.BooleanOptionalAction,
                                default=None, help=text)
        else:
            parser.add_argument(*flags, dest=field.name, type=_value_type(field.type),
                                default=None, help=text)


_VALUE_TYPES = {"int": int, "float": float, "str": str}


def _value_type(annotation) -> type:
    """int, float or str from a field's annotation ("Optional[int]" gives int; a
    tuple is a comma-separated string that the field's converter splits)."""
    if "tuple" in str(annotation):
        return str
    return next(kind for name, kind in _VALUE_TYPES.items() if name in str(annotation))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m dgr", description="dgr node runtime")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="serve the model over OpenAI-compatible HTTP",
                         description="Serve one GGUF model with continuous batching and bounded "
                         "admission, on loopback by default.")
    run.add_argument("--config", help="TOML file with NodeConfig fields at top level and an "
                     "optional [server] table of ServerConfig fields; flags override it.")
    _add_config_flags(run, NodeConfig)
    _add_config_flags(run, ServerConfig)
    run.add_argument("--log-level", default="INFO", help="Logging level (default: INFO).")
    worker = sub.add_parser(
        "worker", help="lend this machine's CPU to a node over ggml RPC (`run --rpc`)",
        description="Serve llama.cpp's ggml RPC protocol with dgr's patched CPU kernels, so a "
        "node (`python -m dgr run --rpc HOST:PORT`) can place model layers here. The protocol "
        "has no authentication and no encryption: bind it to loopback or a trusted network.")
    worker.add_argument("--host", default="127.0.0.1", help="address to listen on (default: "
                        "127.0.0.1; anything else exposes the worker to that network)")
    worker.add_argument("--port", type=int, default=50052, help="port (default: 50052)")
    worker.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    worker.add_argument("--mem", type=int, default=None, help="bytes of memory to offer nodes: "
                        "they place no more layers here than fit in it (default: what is free)")
    worker.add_argument("--cache", default=None, help="folder that keeps tensors nodes sent, "
                        "so a restarted node sends large weights once (default: no cache)")
    worker.add_argument("--log-level", default="INFO", help="Logging level (default: INFO).")
    check = sub.add_parser(
        "check-invariance", help="check that a model's sessions get the same tokens and "
        "log-probabilities alone, beside others and from the prefix cache, on this CPU",
        description="Runs 16 sessions (one past 2,000 tokens) alone, then together (arriving "
        "staggered), then again from the prefix cache, then together in a nearly full pool "
        "drafting whenever they can, and compares every session's tokens and "
        "log-probabilities bit for bit with its solo run. Exit status 0: invariant; 1: not "
        "(the first difference is printed).")
    check.add_argument("--model", default=None, help="GGUF model file (default: the default model)")
    check.add_argument("--tokens", type=int, default=32, help="tokens per session (default: 32)")
    check.add_argument("--threads", type=int, default=None, help="CPU threads (default: all cores)")
    check.add_argument("--json", action="store_true", help="print the whole report as JSON")
    check.add_argument("--log-level", default="WARNING", help="Logging level (default: WARNING).")
    return parser


def _user_error(raised: BaseException) -> BaseException:
    """The error a user caused (a bad file, value or address) inside what the nurseries
    wrapped it in; anything else is raised again."""
    exc = raised
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    if not isinstance(exc, (DgrError, ValueError, OSError)):
        raise raised
    return exc


def run_check(args: argparse.Namespace) -> int:
    """`python -m dgr check-invariance`."""
    import json

    import trio

    from dgr import invariance

    try:
        config = NodeConfig(model_path=args.model, max_running=len(invariance.CHECK_PROMPTS),
                            **({"n_threads": args.threads} if args.threads else {}))
        if args.tokens < 1:
            raise ValueError("--tokens must be at least 1")
        report = trio.run(invariance.check, config, invariance.CHECK_PROMPTS, args.tokens)
    except BaseException as raised:
        print(f"dgr: error: {_user_error(raised)}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=2) if args.json else invariance.describe(report))
    return 0 if report["bitwise"] else 1


def run_worker(args: argparse.Namespace) -> int:
    """`python -m dgr worker`: blocks in llama.cpp's RPC server until killed."""
    import os
    import signal

    from dgr import _rpc

    if args.host not in ("127.0.0.1", "localhost", "::1"):
        print(f"dgr worker: WARNING: listening on {args.host}: ggml RPC has no authentication "
              "or encryption; anyone who can reach this port can run computations and read "
              "what nodes send. Never expose it to an untrusted network.", file=sys.stderr)
    # the server loop is C without the GIL: let a signal end the process at once
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    endpoint = f"{args.host}:{args.port}"
    print(f"dgr worker: serving ggml RPC on {endpoint}", file=sys.stderr, flush=True)
    try:
        if args.mem is not None and args.mem < 1:
            raise DgrError("--mem must be a positive number of bytes")
        _rpc.serve_rpc(endpoint, args.threads or os.cpu_count() or 1, args.cache,
                         args.mem or 0)
    except DgrError as exc:
        print(f"dgr worker: error: {exc}", file=sys.stderr)
        return 2
    print(f"dgr worker: error: cannot listen on {endpoint}", file=sys.stderr)
    return 2


def configs_from_args(args: argparse.Namespace) -> tuple[NodeConfig, ServerConfig]:
    data: dict = {}
    if args.config:
        import tomllib

        with open(args.config, "rb") as f:
            data = tomllib.load(f)
    server = dict(data.pop("server", {}))
    for cls, target in ((NodeConfig, data), (ServerConfig, server)):
        for field in attrs.fields(cls):
            if getattr(args, field.name) is not None:
                target[field.name] = getattr(args, field.name)
    return load_configs(data | {"server": server})


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.command == "worker":
        return run_worker(args)
    if args.command == "check-invariance":
        return run_check(args)
    if args.command == "run":
        import trio

        from dgr.server import serve

        try:
            node_config, server_config = configs_from_args(args)
            forced_by = trio.run(serve, node_config, server_config)
        except BaseException as raised:
            print(f"dgr: error: {_user_error(raised)}", file=sys.stderr)
            return 2
        return 0 if forced_by is None else 128 + forced_by
    return 2
