"""A pytest plugin for llama.cpp's own server tests (tools/server/tests in the
pinned tree), loaded by scripts/llama_server_suite/run.py: the tests run
unchanged, but for the server they start and its model.

- The tests' server binary is $LLAMA_SERVER_BIN_PATH: llama-server, or
  dgr_server.py (dgr behind llama-server's flags).
- The suite's tiny "stories" chat model (the tinyllama2 preset) is swapped for
  $DGR_SUITE_MODEL (the default model), its BERT embedding model and its reranker for
  random-weight ones of their kinds (run.py's encoder_models); a test whose server
  needs any other model is set aside, with its reason, since this machine downloads
  nothing.
- Each test's outcome goes to $DGR_SUITE_RESULTS as one JSON line.
"""

import json
import os

import pytest

# The preset every swappable test starts from; its model is the one replaced.
SWAPPED_REPO = "ggml-org/test-model-stories260K"

# What a server that asks for no model (llama-server's router mode) is set aside as
ROUTER_MODE = "models it loads on demand"
# Why a test is set aside, by the model (hf repo, or hf repo/file) its server asks for.
# The models swapped for random-weight ones of their kind, by the variable naming the file
SWAPPED_ENCODERS = {
    "ggml-org/models/bert-bge-small/ggml-model-f16.gguf": "DGR_SUITE_EMBEDDING_MODEL",
    "ggml-org/models/jina-reranker-v1-tiny-en/ggml-model-f16.gguf": "DGR_SUITE_RERANK_MODEL",
}
MODELS_SET_ASIDE = {
    "ggml-org/test-model-stories260K-infill": "an infill (fill-in-the-middle) model",
    "ggml-org/stories15M_MOE/stories15M_MOE-F16.gguf": "the stories MoE model with its LoRA",
    "ggml-org/tinygemma3-GGUF:Q8_0": "a vision model with its projector",
    "ggml-org/models/tinyllamas/split/stories15M-q8_0-00001-of-00003.gguf":
        "a model split in three files",
    ROUTER_MODE: "llama-server's router mode, started without a model",
}


def _model_asked(server) -> str:
    if server.model_hf_repo is None:
        return server.model_file or server.model_url or ROUTER_MODE
    return server.model_hf_repo + (f"/{server.model_hf_file}" if server.model_hf_file else "")


def pytest_configure(config):
    import utils  # the suite's own helpers, on its rootdir's path

    original_start = utils.ServerProcess.start

    def start(server, *args, **kwargs):
        asked = _model_asked(server)
        swapped = {os.environ.get(name) for name in SWAPPED_ENCODERS.values()}
        if server.model_hf_repo == SWAPPED_REPO:
            server.model_hf_repo = server.model_hf_file = None
            server.model_file = os.environ["DGR_SUITE_MODEL"]
        elif asked in SWAPPED_ENCODERS and os.environ.get(SWAPPED_ENCODERS[asked]):
            server.model_hf_repo = server.model_hf_file = None
            server.model_file = os.environ[SWAPPED_ENCODERS[asked]]
        elif server.model_file not in {os.environ["DGR_SUITE_MODEL"], *swapped}:  # (again)
            reason = MODELS_SET_ASIDE.get(asked, "a model this machine lacks")
            pytest.skip(f"set aside: needs {asked} ({reason})")
        return original_start(server, *args, **kwargs)

    utils.ServerProcess.start = start
    # every preset's model is downloaded up front otherwise
    utils.ServerPreset.load_all = staticmethod(lambda: None)


def pytest_runtest_logreport(report):
    if report.when == "call" or (report.when == "setup" and report.outcome != "passed"):
        outcome = report.outcome
        detail = ""
        if report.skipped:
            detail = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        elif report.failed:
            detail = report.longreprtext.strip().splitlines()[-1][:300] if report.longreprtext else ""
        with open(os.environ["DGR_SUITE_RESULTS"], "a") as out:
            out.write(json.dumps({"test": report.nodeid, "outcome": outcome,
                                  "when": report.when, "detail": detail}) + "\n")
