#!/usr/bin/env python3
"""dgr behind llama-server's command line, for llama.cpp's server tests: the
flags their ServerProcess passes become `python -m dgr run`'s.

A flag dgr has an equivalent for is translated; one that only tunes how
llama-server runs (UNCHANGED) is accepted as it changes nothing; any other
exits with status 2, naming it (the test then fails for dgr and run.py lists
it).
"""

import argparse
import os
import sys

# llama-server flags that need no counterpart in dgr, and why.
UNCHANGED = {
    "--cont-batching": "dgr always batches continuously",
    "--metrics": "dgr always serves /metrics",
    "--jinja": "dgr renders the model's chat template with Jinja",
    "--no-jinja": "a template llama-server has built in is the model's own; dgr renders that",
    "--no-ui": "dgr has no web UI",
    "--offline": "dgr downloads nothing",
    "--kv-unified": "dgr's default",
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="dgr_server.py", add_help=False)
    p.add_argument("--port", type=int, default=8080)
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--model")
    p.add_argument("--alias")
    p.add_argument("--ctx-size", type=int)
    p.add_argument("--parallel", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--ubatch-size", type=int)
    p.add_argument("--threads", type=int)
    p.add_argument("--n-gpu-layers", type=int, default=0)
    p.add_argument("--n-predict", type=int)
    p.add_argument("--api-key")
    p.add_argument("--cors-origins")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--slots", action=argparse.BooleanOptionalAction, default=True)
    p.add_argument("--tags")
    p.add_argument("--chat-template")
    p.add_argument("--chat-template-file")
    p.add_argument("--reasoning", choices=["on", "auto", "off"])
    # dgr always runs flash attention (its row-invariant kernel): "on" changes nothing
    p.add_argument("-fa", "--flash-attn", choices=["on"])
    p.add_argument("--embedding", "--embeddings", action="store_true")
    p.add_argument("--reranking", "--rerank", action="store_true")
    p.add_argument("--pooling", choices=["none", "mean", "cls", "last", "rank"])
    p.add_argument("--temp", type=float)
    p.add_argument("--seed", type=int)
    for flag in UNCHANGED:
        p.add_argument(flag, action="store_true")
    return p


def dgr_argv(known: argparse.Namespace) -> list[str]:
    python = os.environ.get("DGR_PYTHON", sys.executable)  # the one dgr is installed in
    # --drain-quiet 0: on SIGTERM, stop taking requests at once, as llama-server does
    argv = [python, "-m", "dgr", "run", "--host", known.host, "--port", str(known.port),
            "--drain-quiet", "0"]
    if known.model:
        argv += ["--model", known.model]
    if known.alias:
        argv += ["--model-alias", known.alias]
    if known.verbose:
        argv += ["--echo-prompts"]
    if not known.slots:
        argv += ["--no-slots"]
    if known.tags:
        argv += ["--model-tags", known.tags]
    if known.chat_template:
        argv += ["--chat-template", known.chat_template]
    if known.chat_template_file:
        argv += ["--chat-template-file", known.chat_template_file]
    slots = known.parallel or 4  # llama-server's default --parallel (auto) on a CPU
    argv += ["--max-running", str(slots)]
    if known.ctx_size:
        argv += ["--ctx", str(known.ctx_size)]
        if not known.kv_unified:
            # llama-server gives each slot ctx-size / parallel cells
            argv += ["--session-ctx", str(known.ctx_size // slots)]
    if known.batch_size:
        argv += ["--batch", str(known.batch_size)]
        argv += ["--ubatch", str(min(known.batch_size, known.ubatch_size or 512))]
    elif known.ubatch_size:
        argv += ["--ubatch", str(known.ubatch_size)]
    if known.threads:
        argv += ["--threads", str(known.threads)]
    if known.n_predict and known.n_predict > 0:
        argv += ["--default-max-tokens", str(known.n_predict)]
    elif known.n_predict == -1:  # llama-server's "until the context is full"
        argv += ["--default-max-tokens", str(known.ctx_size or 1 << 20)]
    if known.api_key:
        argv += ["--api-key", known.api_key]
    if known.cors_origins:
        argv += ["--cors-origins", known.cors_origins]
    if known.temp is not None:
        argv += ["--temp", str(known.temp)]
    if known.seed is not None:
        argv += ["--seed", str(known.seed)]
    if known.embedding:
        argv += ["--embeddings"]
    if known.reranking:
        argv += ["--rerank"]
    if known.pooling:
        argv += ["--pooling", known.pooling]
    if known.reasoning == "off":  # "on" and "auto": a thinking model thinks as it will
        argv += ["--reasoning-budget", "0"]
    return argv


def main() -> int:
    known, unknown = parser().parse_known_args()
    if known.n_gpu_layers:
        unknown.append(f"--n-gpu-layers {known.n_gpu_layers}")
    if unknown:
        print(f"dgr_server.py: dgr has no counterpart for {' '.join(unknown)}", file=sys.stderr)
        return 2
    argv = dgr_argv(known)
    print("dgr_server.py:", " ".join(argv), flush=True)
    os.execv(argv[0], argv)


if __name__ == "__main__":
    sys.exit(main())
