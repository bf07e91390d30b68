"""Run llama.cpp's own server tests (tools/server/tests of the pinned tree)
against llama-server and against dgr, on the default model, and compare.

    .venv/bin/python scripts/llama_server_suite/run.py [--servers llama-server,dgr]
        [--tests unit] [-k EXPR] [--timeout 180] [--out DIR]

The tests run unchanged (suite_plugin.py swaps the server binary and the
model; tests whose server needs a model this machine lacks are set aside, each
with its reason). Their requirements go into a virtual environment of their
own, vendor/server-tests-venv. Prints, per server, the tests passed, failed
and set aside; then every test that passes against llama-server and not
against dgr, each either a refusal by design (REFUSALS, with its reason) or a
defect. Exits 1 when there is a defect.
"""

import argparse
import json
import os
import re
import subprocess
import sys
import venv
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.peers import ensure_peers  # noqa: E402
from dgr.engine import resolve_model_path  # noqa: E402

SUITE = ROOT / "vendor" / "llama.cpp" / "tools" / "server" / "tests"
SUITE_VENV = ROOT / "vendor" / "server-tests-venv"

# Tests that pass against llama-server and not against dgr, by design: a pattern
# matching the start of their ids (re.match) -> why dgr answers otherwise.
_NO_UI = "llama-server's web UI and its MCP proxy; dgr serves an API and no web UI"
_IMAGE = ("an image for a model that reads none is the client's error: dgr answers 400 "
          "naming it (llama-server 500)")
REFUSALS: dict[str, str] = {
    r"unit/test_embedding\.py::test_embedding_mixed_input\[-False\]": (
        "an empty string has nothing to embed: dgr answers 400, as OpenAI's API does "
        "(llama-server embeds its special tokens alone)"),
    r"unit/test_basic\.py::test_no_ui": _NO_UI,
    r"unit/test_proxy\.py::": _NO_UI,
    r"unit/test_security\.py::test_cors_proxy_only_forwards_explicit_proxy_headers": _NO_UI,
    r"unit/test_security\.py::test_cors_options": (
        "CORS is off until --cors-origins names the origins (llama-server answers every "
        "origin by default): otherwise any web page a user opens could drive a node on "
        "loopback"),
    r"unit/test_sleep\.py::": (
        "--sleep-idle-seconds unloads the model when idle; a dgr node keeps its model "
        "loaded: behind a router it is ready or drained, never asleep"),
    r"unit/test_metrics\.py::test_metrics_disabled": "dgr always serves /metrics",
    r"unit/test_kv_keep_only_active\.py::": (
        "reads llama-server's debug log for its own prompt cache's tags; dgr's KV tiers "
        "have their own tests (tests/test_kv_tier_*.py)"),
    r"unit/test_compat_anthropic\.py::test_anthropic_vision_format_accepted": _IMAGE,
    r"unit/test_compat_anthropic\.py::test_anthropic_tool_result_with_image": _IMAGE,
    r"unit/test_compat_anthropic\.py::test_anthropic_empty_messages": (
        "Anthropic's API needs at least one message: dgr answers 400, as Anthropic does "
        "(llama-server accepts none)"),
    r"unit/test_completion\.py::test_n_probs_post_": (
        "post_sampling_probs: dgr reports the model's log-probabilities (before the "
        "samplers), bitwise the same whatever shares the batch"),
    r"unit/test_compat_oai_responses\.py::test_responses_stream_with_llama_telemetry": (
        "a response cut short by max_output_tokens ends with response.incomplete, as "
        "OpenAI's API ends it (llama-server sends response.completed); its progress and "
        "timings events are there"),
    r"unit/test_tool_call\.py::test_completion_without_tool_call_": (
        "with tools and tool_choice auto, calling one is the model's choice: for a "
        "template without Hermes-style calls dgr describes the tools in its generic, "
        "grammar-sure format where llama.cpp renders the template's own, and Gemma 270M "
        "then calls the tool in some of these cases"),
    r"unit/test_ctx_shift\.py::test_ctx_shift_disabled_stream": (
        "max_tokens is reserved in the KV at admission (bounded admission): a request "
        "whose prompt and max_tokens pass its context is refused (400), where llama-server "
        "generates until the context is full"),
}


def suite_python() -> Path:
    python = SUITE_VENV / "bin" / "python"
    if not python.exists():
        venv.create(SUITE_VENV, with_pip=True)
        subprocess.run([python, "-m", "pip", "install", "--quiet", "-r",
                        SUITE / "requirements.txt", "pytest-timeout"], check=True)
    return python


def encoder_models(out: Path) -> dict[str, str]:
    """Random-weight stand-ins, in F16, for the suite's BERT embedding model (bge-small's
    shape) and its reranker (jina-reranker-v1-tiny's: a classifier head of one label),
    written once into `out`: $DGR_SUITE_EMBEDDING_MODEL and $DGR_SUITE_RERANK_MODEL."""
    from dgr import testmodel

    paths = {}
    for name, kw in (("DGR_SUITE_EMBEDDING_MODEL", dict(n_embd=384, n_layer=12, n_head=12,
                                                        n_ff=1536, pooling="mean")),
                     ("DGR_SUITE_RERANK_MODEL", dict(n_embd=384, n_layer=4, n_head=12,
                                                     n_ff=1536, pooling="rank", n_labels=1))):
        path = out / f"{name.lower()}-f16.gguf"
        if not path.exists():
            source = testmodel.write_encoder_model(out / f"{name.lower()}-f32.gguf", **kw)
            testmodel.quantize(source, path, "F16")
            source.unlink()
        paths[name] = str(path)
    return paths


def run_suite(server: str, binary: Path, model: str, args, out: Path) -> dict[str, dict]:
    results = out / f"{server}.jsonl"
    results.unlink(missing_ok=True)
    env = {**os.environ, **encoder_models(out), "LLAMA_SERVER_BIN_PATH": str(binary),
           "DGR_SUITE_MODEL": model,
           "DGR_SUITE_RESULTS": str(results), "DGR_PYTHON": sys.executable,
           "PYTHONPATH": str(HERE), "LLAMA_CACHE": str(out / "cache"),
           # llama-server's --no-repack, as the bench runs it: the pinned build's AMX
           # weights fault on this project's machines (benchmarks/servers.py)
           "LLAMA_ARG_REPACK": "0"}
    command = [str(suite_python()), "-m", "pytest", *args.tests, "-p", "suite_plugin", "-q",
               "-p", "no:cacheprovider", f"--timeout={args.timeout}"]
    if args.k:
        command += ["-k", args.k]
    with open(out / f"{server}.log", "w") as log:
        subprocess.run(command, cwd=SUITE, env=env, stdout=log, stderr=subprocess.STDOUT)
    return read_results(results)


def read_results(results: Path) -> dict[str, dict]:
    outcomes = {}
    for line in results.read_text().splitlines() if results.exists() else []:
        record = json.loads(line)
        outcomes[record["test"]] = record
    return outcomes


def refusal(test: str) -> str | None:
    return next((why for pattern, why in REFUSALS.items() if re.match(pattern, test)), None)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--servers", default="llama-server,dgr",
                        help="the servers to run; the other's earlier results in --out, "
                        "if any, are compared")
    parser.add_argument("--tests", nargs="*", default=["unit"], help="paths under the suite")
    parser.add_argument("-k", help="pytest -k expression")
    parser.add_argument("--timeout", type=int, default=180, help="seconds per test")
    parser.add_argument("--out", default=str(ROOT / "benchmarks" / "out" / "llama-server-suite"))
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = resolve_model_path(None)
    binaries = {"llama-server": (ensure_peers(batched_bench=False)["llama-server"]
                                 if "llama-server" in args.servers else None),
                "dgr": HERE / "dgr_server.py"}
    outcomes = {}
    for server in ("llama-server", "dgr"):
        if server in args.servers.split(","):
            outcomes[server] = run_suite(server, binaries[server], model, args, out)
            if not outcomes[server]:
                print(f"{server}: no test ran; see {out / (server + '.log')}")
                return 2
        else:  # an earlier run's, when there is one
            outcomes[server] = read_results(out / f"{server}.jsonl")
            if not outcomes[server]:
                del outcomes[server]
                continue
            print(f"({server}: its earlier run in {out})")
        counts = Counter(r["outcome"] for r in outcomes[server].values())
        print(f"{server}: {counts['passed']} passed, {counts['failed']} failed, "
              f"{counts['skipped']} set aside, of {len(outcomes[server])}")
    set_aside = {t: r["detail"] for r in outcomes.values() for t, r in r.items()
                 if r["outcome"] == "skipped"}
    print(f"\nset aside ({len(set_aside)}), by reason:")
    by_reason: dict[str, list[str]] = {}
    for test, why in sorted(set_aside.items()):
        by_reason.setdefault(why.removeprefix("Skipped: "), []).append(test)
    for why, tests in sorted(by_reason.items(), key=lambda item: -len(item[1])):
        print(f"  {len(tests)} {why}")
        for test in tests:
            print(f"      {test}")
    if set(outcomes) != {"llama-server", "dgr"}:
        return 0
    peer, ours = outcomes["llama-server"], outcomes["dgr"]
    behind = sorted(t for t, r in peer.items() if r["outcome"] == "passed"
                    and ours.get(t, {}).get("outcome") != "passed")
    refused = [t for t in behind if refusal(t)]
    defects = [t for t in behind if not refusal(t)]
    both = sum(1 for t, r in peer.items() if r["outcome"] == "passed"
               and ours.get(t, {}).get("outcome") == "passed")
    print(f"\npassed on llama-server: {sum(r['outcome'] == 'passed' for r in peer.values())}; "
          f"on dgr too: {both}; refused by design: {len(refused)}; defects: {len(defects)}")
    for test in refused:
        print(f"  refused {test}: {refusal(test)}")
    for test in defects:
        print(f"  DEFECT {test}: {ours.get(test, {}).get('detail', 'not run')}")
    return 1 if defects else 0


if __name__ == "__main__":
    sys.exit(main())
