"""dgr over ggml RPC workers: `python -m dgr worker` processes on loopback (started
by benchmarks/rpc.py's `worker`), a node placing layers on them
(`NodeConfig.rpc_workers`)."""

import socket
import subprocess
import sys
from pathlib import Path

import pytest
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dgr  # noqa: E402
from benchmarks.rpc import free_port, worker  # noqa: E402
from dgr.errors import ModelLoadError  # noqa: E402
from dgr.testmodel import write_test_model  # noqa: E402

PROMPTS = ["The quick brown fox jumps over the lazy dog", "a", "in the beginning there was"]


@pytest.fixture(scope="module")
def deep_model(tmp_path_factory):
    """The tiny test model with 6 layers, so that every device gets some."""
    return str(write_test_model(tmp_path_factory.mktemp("rpc") / "deep.gguf", n_layer=6))


def config(model, **overrides):
    base = dict(model_path=model, max_running=4, max_waiting=4, n_ctx=2048, n_batch=128,
                n_ubatch=128, prefill_chunk=16, n_threads=1)
    return dgr.NodeConfig(**(base | overrides))


async def generate_all(node, params):
    return [await node.generate(p, params) for p in PROMPTS]


async def generate_together(node, params):
    out = [None] * len(PROMPTS)

    async def one(i):
        out[i] = await node.generate(PROMPTS[i], params)

    async with trio.open_nursery() as nursery:
        for i in range(len(PROMPTS)):
            nursery.start_soon(one, i)
    return out


async def test_output_through_two_workers_equals_local(deep_model):
    """Greedy tokens and their log-probabilities through two worker processes are
    bitwise the local ones (the workers run the same patched CPU kernels), and
    the capability report says where each layer is (the output layer stays here)."""
    params = dgr.SamplingParams(max_tokens=12, logprobs=2, ignore_eos=True)
    async with dgr.open_node(config(deep_model)) as node:
        local = await generate_all(node, params)
    with worker() as first, worker() as second:
        async with dgr.open_node(config(deep_model, rpc_workers=(first, second))) as node:
            devices = node.capabilities()["devices"]
            remote = await generate_all(node, params)
    assert [d["endpoint"] for d in devices] == [None, first, second]
    assert [d["layers"] for d in devices] == [2, 2, 2]
    assert all(d["total_bytes"] > 0 for d in devices[1:])
    for here, there in zip(local, remote):
        assert there.token_ids == here.token_ids
        assert there.token_logprobs == here.token_logprobs
        assert there.logprobs == here.logprobs


async def test_layers_placed_as_asked(deep_model):
    with worker() as endpoint:
        async with dgr.open_node(config(deep_model, rpc_workers=endpoint, rpc_layers=5)) as node:
            devices = node.capabilities()["devices"]
            result = await node.generate("x", dgr.SamplingParams(max_tokens=3, ignore_eos=True))
    assert [d["layers"] for d in devices] == [1, 5]
    assert len(result.token_ids) == 3


async def test_a_worker_that_is_down_is_a_clear_error(deep_model):
    down = f"127.0.0.1:{free_port()}"
    with pytest.raises(ModelLoadError, match=f"RPC worker {down} is not reachable"):
        async with dgr.open_node(config(deep_model, rpc_workers=(down,))):
            pass
    with pytest.raises(ValueError, match="rpc_layers"):
        config(deep_model, rpc_layers=2)


def test_cli_exits_2_with_one_line_when_a_worker_is_down(deep_model):
    down = f"127.0.0.1:{free_port()}"
    run = subprocess.run([sys.executable, "-m", "dgr", "run", "--model", deep_model, "--port",
                          str(free_port()), "--ctx", "1024", "--rpc", down],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 2
    errors = [line for line in run.stderr.splitlines() if line.startswith("dgr: error:")]
    assert len(errors) == 1 and f"RPC worker {down} is not reachable" in errors[0]


def test_worker_that_cannot_listen_exits_2():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = subprocess.run([sys.executable, "-m", "dgr", "worker", "--port", str(port)],
                             capture_output=True, text=True, timeout=60)
    assert run.returncode == 2
    assert "cannot listen" in run.stderr


async def test_node_sessions_still_batch_through_a_worker(deep_model):
    """Concurrent sessions through a worker: same tokens as one at a time."""
    params = dgr.SamplingParams(max_tokens=10, ignore_eos=True)
    with worker() as endpoint:
        async with dgr.open_node(config(deep_model, rpc_workers=endpoint)) as node:
            alone = await generate_all(node, params)
            together = await generate_together(node, params)
    assert [r.token_ids for r in together] == [r.token_ids for r in alone]


@pytest.mark.default_model
async def test_default_model_through_a_worker_equals_local(default_model):
    """Gemma 3 270M, half its layers on a worker process: the same tokens and
    log-probabilities as local, sessions decoded together."""
    params = dgr.SamplingParams(max_tokens=16, logprobs=1, ignore_eos=True)
    base = dict(model_path=default_model, max_running=4, max_waiting=4, n_ctx=2048, n_threads=2)
    async with dgr.open_node(dgr.NodeConfig(**base)) as node:
        local = await generate_together(node, params)
    with worker(threads=2) as endpoint:
        async with dgr.open_node(dgr.NodeConfig(**base, rpc_workers=(endpoint,))) as node:
            assert [d["layers"] for d in node.capabilities()["devices"]] == [9, 9]
            remote = await generate_together(node, params)
    for here, there in zip(local, remote):
        assert there.token_ids == here.token_ids
        assert there.token_logprobs == here.token_logprobs
