"""dgr over ggml RPC workers: `python -m dgr worker` processes on loopback (started
by benchmarks/rpc.py's `worker`), a node placing layers on them
(`NodeConfig.rpc_workers`)."""

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import trio

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import dgr  # noqa: E402
from benchmarks.rpc import worker, worker_process  # noqa: E402
from benchmarks.servers import free_port  # noqa: E402
from dgr.config import ServerConfig  # noqa: E402
from dgr.errors import AdmissionRejected, ModelLoadError  # noqa: E402
from dgr.sequence import FinishReason  # noqa: E402
from dgr.server import serve  # noqa: E402
from dgr.testmodel import write_test_model  # noqa: E402

pytestmark = pytest.mark.rpc

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
    with worker() as first, worker() as second:
        async with dgr.open_node(config(deep_model, rpc_workers=(first, second), rpc_layers=4,
                                        rpc_tensor_split="3,1")) as node:
            devices = node.capabilities()["devices"]
            result = await node.generate("x", dgr.SamplingParams(max_tokens=3, ignore_eos=True))
    assert [d["layers"] for d in devices] == [2, 3, 1]
    assert len(result.token_ids) == 3
    with pytest.raises(ValueError, match="one non-negative share per RPC worker"):
        config(deep_model, rpc_workers=(first,), rpc_tensor_split=(1, 1))


async def test_a_worker_that_is_down_is_a_clear_error(deep_model):
    down = f"127.0.0.1:{free_port()}"
    with pytest.raises(ModelLoadError, match=f"RPC worker {down} is not reachable"):
        async with dgr.open_node(config(deep_model, rpc_workers=(down,))):
            pass
    with pytest.raises(ValueError, match="rpc_layers"):
        config(deep_model, rpc_layers=2)


async def test_a_worker_that_does_not_answer_at_start_is_a_clear_error(deep_model):
    """A worker that accepts the connection but never answers ggml's handshake
    (stopped here; in life: hung, or serving another node) is a ModelLoadError,
    not an abort of the node's process."""
    with worker_process() as (endpoint, proc):
        os.kill(proc.pid, signal.SIGSTOP)
        try:
            with pytest.raises(ModelLoadError, match=f"RPC worker {endpoint} accepted the "
                                                     "connection but did not answer"):
                async with dgr.open_node(config(deep_model, rpc_workers=(endpoint,))):
                    pass
        finally:
            os.kill(proc.pid, signal.SIGCONT)


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


async def test_a_worker_offers_the_memory_it_is_told(deep_model):
    """`worker --mem`: nodes see that much memory there and place no more than fits."""
    with worker_process(args=("--mem", str(1 << 30))) as (endpoint, _):
        async with dgr.open_node(config(deep_model, rpc_workers=(endpoint,))) as node:
            device = node.capabilities()["devices"][1]
    assert device["total_bytes"] == 1 << 30 and device["free_bytes"] <= 1 << 30
    with worker_process(args=("--mem", "4096")) as (endpoint, _):
        with pytest.raises(ModelLoadError, match=f"RPC worker {endpoint} has 0 MiB free"):
            async with dgr.open_node(config(deep_model, rpc_workers=(endpoint,))):
                pass


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
    log-probabilities as local with no weights repacked (a node with workers repacks
    none), sessions decoded together."""
    params = dgr.SamplingParams(max_tokens=16, logprobs=1, ignore_eos=True)
    base = dict(model_path=default_model, max_running=4, max_waiting=4, n_ctx=2048, n_threads=2)
    async with dgr.open_node(dgr.NodeConfig(**base, weight_repack="off")) as node:
        local = await generate_together(node, params)
    with worker(threads=2) as endpoint:
        async with dgr.open_node(dgr.NodeConfig(**base, rpc_workers=(endpoint,))) as node:
            assert [d["layers"] for d in node.capabilities()["devices"]] == [9, 9]
            remote = await generate_together(node, params)
    for here, there in zip(local, remote):
        assert there.token_ids == here.token_ids
        assert there.token_logprobs == here.token_logprobs


# ---------------------------------------------------------------- a worker lost mid-session

async def lose_worker_while_running(node, lose):
    """Three sessions running (each has sent a token and waits for its reader), then
    `lose()`; returns each stream once it has ended."""
    params = dgr.SamplingParams(max_tokens=400, ignore_eos=True)
    async with contextlib.AsyncExitStack() as stack:
        streams = [await stack.enter_async_context(node.stream(p, params)) for p in PROMPTS]
        for stream in streams:
            await stream.__anext__()
        lose()
        for stream in streams:
            async for _ in stream:
                pass
    return streams


def assert_failed_for_good(node, endpoint, streams):
    """Every session ended with an error naming the cause; the node says why it is
    unhealthy and refuses new sessions with that reason."""
    for stream in streams:
        assert stream.finish_reason is FinishReason.ERROR
        assert "RPC worker" in stream.error
    assert endpoint in node.failure
    load = node.capabilities()["load"]
    assert load["failure"] == node.failure and load["active"] == 0 and load["waiting"] == 0
    assert node.telemetry.registry.get_sample_value("dgr_healthy") == 0
    link = next(d for d in node.capabilities()["devices"] if d["endpoint"] == endpoint)
    assert link["link"]["connected"] is False


async def test_a_worker_killed_mid_session_ends_the_sessions_and_the_node_refuses_more(deep_model):
    """The worker process dies (its connection closes): no abort, no hang; every
    session ends with the error, new ones are refused ("unhealthy") until restart."""
    with worker_process() as (endpoint, proc):
        async with dgr.open_node(config(deep_model, rpc_workers=(endpoint,))) as node:
            with trio.fail_after(120):  # a hang guard, not a speed bound
                streams = await lose_worker_while_running(node, proc.kill)
            assert_failed_for_good(node, endpoint, streams)
            with pytest.raises(AdmissionRejected, match="unhealthy") as refused:
                await node.generate("x", dgr.SamplingParams(max_tokens=2))
            assert endpoint in str(refused.value)


async def test_a_worker_that_stops_answering_is_lost_after_the_rpc_timeout(deep_model):
    """The worker process hangs (SIGSTOP: its connection stays open, nothing comes
    back): after rpc_timeout_s the sessions end with the error, as for a dead one."""
    with worker_process() as (endpoint, proc):
        async with dgr.open_node(config(deep_model, rpc_workers=(endpoint,),
                                        rpc_timeout_s=1.0)) as node:
            try:
                with trio.fail_after(120):
                    streams = await lose_worker_while_running(
                        node, lambda: os.kill(proc.pid, signal.SIGSTOP))
            finally:
                os.kill(proc.pid, signal.SIGCONT)
            assert_failed_for_good(node, endpoint, streams)


async def test_http_after_a_worker_is_lost(deep_model):
    """Over HTTP: a stream in flight ends with an error event and [DONE]; /health is
    503 with the reason; a new request is a 503 "unhealthy" in OpenAI's error shape;
    /metrics counts the bytes the worker's link carried and shows dgr_healthy 0."""
    with worker_process() as (endpoint, proc):
        async with trio.open_nursery() as nursery:
            shutdown = trio.Event()
            urls = await nursery.start(lambda task_status: serve(
                config(deep_model, rpc_workers=(endpoint,)), ServerConfig(port=0),
                task_status=task_status, shutdown=shutdown))
            async with httpx.AsyncClient(base_url=urls[0], timeout=60) as client:
                metrics = (await client.get("/metrics")).text
                body = {"prompt": "hello", "max_tokens": 400, "ignore_eos": True, "stream": True}
                events = []
                async with client.stream("POST", "/v1/completions", json=body) as response:
                    async for line in response.aiter_lines():
                        if line.startswith("data: "):
                            events.append(line[6:])
                            if len(events) == 1:
                                proc.kill()
                health = await client.get("/health")
                refused = await client.post("/v1/completions", json={"prompt": "x", "max_tokens": 2})
                metrics_after = (await client.get("/metrics")).text
            shutdown.set()
    assert events[-1] == "[DONE]"
    error = json.loads(events[-2])
    assert "RPC worker" in error["error"]["message"]
    assert health.status_code == 503
    assert health.json()["status"] == "failed" and endpoint in health.json()["reason"]
    assert refused.status_code == 503 and refused.json()["error"]["code"] == "unhealthy"
    assert f'dgr_rpc_sent_bytes_total{{worker="{endpoint}"}}' in metrics
    assert "dgr_healthy 0.0" in metrics_after


async def test_rpc_link_figures_count_what_crossed(deep_model):
    """/capabilities reports, per worker, the bytes its connection carried since the
    node started and per step (hidden states in and out), and the kernel's RTT."""
    with worker() as endpoint:
        async with dgr.open_node(config(deep_model, rpc_workers=(endpoint,))) as node:
            await node.generate("hello", dgr.SamplingParams(max_tokens=8, ignore_eos=True))
            device = node.capabilities()["devices"][1]
    link = device["link"]
    assert link["connected"] is True and link["connections"] >= 1
    assert link["bytes_sent"] > 0 and link["bytes_received"] > 0
    assert link["bytes_per_step"] > 0 and link["rtt_ms"] >= 0


# ---------------------------------------------------------------- two hosts (network namespaces)

@contextlib.contextmanager
def second_host():
    """A network namespace joined to this one by a veth pair: the worker side's
    address there, this side's here. Skips the test where namespaces cannot be made
    (not root, no veth); tears everything down after."""
    if shutil.which("ip") is None:
        pytest.skip("no `ip` command (iproute2) to build a network namespace")
    tag = f"dgr{os.getpid() % 100000}"
    net = f"10.{200 + os.getpid() % 50}.{os.getpid() % 250}"
    steps = [["ip", "netns", "add", tag],
             ["ip", "link", "add", f"{tag}a", "type", "veth", "peer", "name", f"{tag}b"],
             ["ip", "link", "set", f"{tag}b", "netns", tag],
             ["ip", "addr", "add", f"{net}.1/24", "dev", f"{tag}a"],
             ["ip", "link", "set", f"{tag}a", "up"],
             ["ip", "-n", tag, "addr", "add", f"{net}.2/24", "dev", f"{tag}b"],
             ["ip", "-n", tag, "link", "set", f"{tag}b", "up"],
             ["ip", "-n", tag, "link", "set", "lo", "up"]]
    try:
        for step in steps:
            made = subprocess.run(step, capture_output=True, text=True)
            if made.returncode != 0:
                pytest.skip(f"cannot build a network namespace here ({' '.join(step)}: "
                            f"{made.stderr.strip()})")
        yield tag, f"{net}.2", f"{tag}a"
    finally:
        subprocess.run(["ip", "link", "del", f"{tag}a"], capture_output=True)
        subprocess.run(["ip", "netns", "del", tag], capture_output=True)


async def test_a_worker_on_another_host_equals_local_and_a_pulled_cable_is_a_lost_worker(
        deep_model, tmp_path):
    """A worker in its own network namespace (another host as far as TCP goes,
    reached over a veth pair): the same tokens and log-probabilities as local; it
    warns that it listens beyond loopback. Then the link goes down mid-session (no
    FIN, no RST: a pulled cable): after rpc_timeout_s the sessions end with the
    error and the node refuses new ones."""
    params = dgr.SamplingParams(max_tokens=12, logprobs=2, ignore_eos=True)
    async with dgr.open_node(config(deep_model)) as node:
        local = await generate_all(node, params)
    with second_host() as (namespace, address, our_link):
        log = tmp_path / "worker.log"
        with open(log, "w") as stderr, worker_process(
                host=address, prefix=("ip", "netns", "exec", namespace), stderr=stderr) as (
                endpoint, _):
            async with dgr.open_node(config(deep_model, rpc_workers=(endpoint,),
                                            rpc_timeout_s=2.0)) as node:
                remote = await generate_all(node, params)
                with trio.fail_after(120):
                    streams = await lose_worker_while_running(node, lambda: subprocess.run(
                        ["ip", "link", "set", our_link, "down"], check=True))
                assert_failed_for_good(node, endpoint, streams)
        assert "no authentication" in log.read_text().lower()
    for here, there in zip(local, remote):
        assert there.token_ids == here.token_ids
        assert there.token_logprobs == here.token_logprobs
        assert there.logprobs == here.logprobs
