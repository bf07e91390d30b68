"""Nodes behind the routers people run (smg, vllm-router): the fields routers
add, the load and token endpoints they read, draining, and the everyday calls of
the official `openai` client through each router to two nodes."""

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
import trio

from test_server import start_server  # noqa: F401  (the fixture)

# what vllm-router adds to every completions and chat body, and smg to a Responses body
VLLM_ROUTER_EXTRAS = {"ignore_eos": False, "no_stop_trim": False, "return_hidden_states": False,
                      "skip_special_tokens": True}
VLLM_ROUTER_CHAT_EXTRAS = VLLM_ROUTER_EXTRAS | {
    "continue_final_message": False, "include_reasoning": True, "separate_reasoning": True,
    "stream_reasoning": True, "logprobs": False}
SMG_RESPONSES_EXTRAS = {"priority": 0, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.0,
                        "store": True}
CHAT = {"messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4,
        "temperature": 0}


async def test_the_fields_routers_add_are_taken_at_their_defaults_and_refused_otherwise(
        start_server):  # noqa: F811
    server = await start_server()
    async with server.client() as client:
        done = await client.post("/v1/completions", json={"prompt": "hi", "max_tokens": 4,
                                                          "temperature": 0} | VLLM_ROUTER_EXTRAS)
        assert done.status_code == 200, done.text
        done = await client.post("/v1/chat/completions", json=CHAT | VLLM_ROUTER_CHAT_EXTRAS)
        assert done.status_code == 200, done.text
        done = await client.post("/v1/responses", json={"input": "hi", "max_output_tokens": 4,
                                                        "temperature": 0} | SMG_RESPONSES_EXTRAS)
        assert done.status_code == 200, done.text
        for field, value in (("no_stop_trim", True), ("return_hidden_states", True)):
            refused = await client.post("/v1/chat/completions", json=CHAT | {field: value})
            assert refused.status_code == 400 and refused.json()["error"]["param"] == field
        refused = await client.post("/v1/responses", json={"input": "hi", "priority": "high"})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "priority"


async def test_routers_read_the_load_and_the_tokens_the_doors_compute(start_server):  # noqa: F811
    server = await start_server()
    async with server.client() as client:
        snapshot = (await client.get("/v1/loads")).json()
        assert isinstance(snapshot["timestamp"], str)  # smg reads nothing of a numeric one
        loads = snapshot["loads"]
        assert loads[0]["num_running_reqs"] == 0 and loads[0]["max_total_num_tokens"] > 0
        assert (await client.get("/loads")).json()["loads"] == loads
        assert (await client.get("/get_load")).json() == {"load": 0}
        metrics = (await client.get("/metrics")).text
        for name in ("vllm:num_requests_running", "vllm:num_requests_waiting",
                     "vllm:kv_cache_usage_perc", "vllm:prefix_cache_hits_total"):
            assert name + "{" in metrics
        # vLLM's /tokenize and render: the tokens the chat door prefills
        chat = (await client.post("/v1/chat/completions", json=CHAT)).json()
        rendered = (await client.post("/v1/chat/completions/render", json=CHAT)).json()
        tokenized = (await client.post("/tokenize", json={"model": "m",
                                                          "messages": CHAT["messages"]})).json()
        assert len(rendered["token_ids"]) == chat["usage"]["prompt_tokens"]
        assert tokenized["tokens"] == rendered["token_ids"] and tokenized["count"] > 0
        completion = (await client.post("/v1/completions/render",
                                         json={"prompt": "hi there", "max_tokens": 1})).json()
        plain = (await client.post("/tokenize", json={"model": "m", "prompt": "hi there"})).json()
        assert completion[0]["token_ids"] == plain["tokens"]
        # llama-server's shape is unchanged
        llama = await client.post("/tokenize", json={"content": "hi there", "add_special": True})
        assert llama.json()["tokens"] == plain["tokens"]


async def test_a_drained_node_says_so_at_once_and_loses_nothing(start_server):  # noqa: F811
    """/health answers 503 at once; what routers still send before they notice is
    served, and what runs finishes; with --drain-quiet 0 new work is refused at once."""
    # a quiet period longer than the test: no timing decides what it sees
    server = await start_server(grace_s=60, drain_quiet_s=30)
    async with server.client() as client:
        async with client.stream("POST", "/v1/completions", json={
                "prompt": "a", "max_tokens": 40, "ignore_eos": True, "stream": True}) as running:
            assert running.status_code == 200
            drained = await client.post("/v1/dgr/drain")
            assert drained.status_code == 202
            assert (await client.get("/health")).status_code == 503
            late = await client.post("/v1/completions", json={"prompt": "b", "max_tokens": 2})
            assert late.status_code == 200
            body = "".join([part async for part in running.aiter_text()])
        assert body.rstrip().endswith("data: [DONE]") and '"finish_reason":"length"' in \
            body.replace(" ", "")
    strict = await start_server(drain_quiet_s=0)
    async with strict.client() as client:
        # long enough that it is still running (and the drained node up) when the late
        # request comes, however slow this machine is at the moment
        async with client.stream("POST", "/v1/completions", json={
                "prompt": "a", "max_tokens": 1000, "ignore_eos": True, "stream": True}) as running:
            assert (await client.post("/v1/dgr/drain")).status_code == 202
            with trio.fail_after(10):
                while (await client.get("/health")).status_code != 503:
                    await trio.sleep(0.01)
            refused = await client.post("/v1/completions", json={"prompt": "b", "max_tokens": 2})
            assert refused.status_code == 503
            assert [part async for part in running.aiter_text()]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("router", ["smg", "vllm-router"])
async def test_the_everyday_calls_work_through_a_router_to_two_nodes(start_server,  # noqa: F811
                                                                      router):
    # installed beside the interpreter (the test extra), or on PATH
    binary = shutil.which(router, path=os.pathsep.join([os.path.dirname(sys.executable),
                                                        os.environ.get("PATH", "")]))
    if binary is None:
        pytest.skip(f"{router} is not installed (the test extra installs it)")
    nodes = [await start_server(), await start_server()]
    port = _free_port()
    argv = [binary, *(["launch"] if router == "smg" else []), "--worker-urls",
            *[node.url for node in nodes], "--policy", "cache_aware", "--host", "127.0.0.1",
            "--port", str(port)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    base = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient(base_url=base, timeout=5) as probe:
            with trio.fail_after(60):
                while True:
                    try:
                        listed = await probe.get("/v1/models")
                        if listed.status_code == 200 and listed.json()["data"]:
                            break
                    except httpx.HTTPError:
                        pass
                    await trio.sleep(0.2)
        model = listed.json()["data"][0]["id"]  # smg routes by the workers' model ids
        async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused",
                                      max_retries=0) as client:
            messages = [{"role": "user", "content": "hello"}]
            done = await client.completions.create(model=model, prompt="hi", max_tokens=4,
                                                   temperature=0)
            assert done.choices[0].finish_reason in ("stop", "length")
            pieces = [c async for c in await client.completions.create(
                model=model, prompt="hi", max_tokens=4, temperature=0, stream=True)]
            assert pieces
            chat = await client.chat.completions.create(model=model, messages=messages,
                                                        max_tokens=4, temperature=0)
            assert chat.choices[0].message.role == "assistant"
            pieces = [c async for c in await client.chat.completions.create(
                model=model, messages=messages, max_tokens=4, temperature=0, stream=True)]
            assert pieces
            response = await client.responses.create(model=model, input="hi",
                                                     max_output_tokens=4, temperature=0)
            assert response.status in ("completed", "incomplete")
            events = [e async for e in await client.responses.create(
                model=model, input="hi", max_output_tokens=4, temperature=0, stream=True)]
            assert events[-1].type in ("response.completed", "response.incomplete")
            assert [m.id async for m in client.models.list()]
            # a request's priority and user reach the node that serves it (its metrics)
            asked = {"model": model, "max_tokens": 2, "temperature": 0, "user": "via-router",
                     "extra_body": {"priority": -3}}
            await client.chat.completions.create(messages=messages, **asked)
            await client.completions.create(prompt="hi", **asked)
            seen = 0.0
            for node in nodes:
                seen += await metric_sum(node.url, 'dgr_tenant_time_to_first_token_seconds_count'
                                         '{priority="-3",tenant="via-router"}')
            assert seen == 2
        async with httpx.AsyncClient(base_url=base, timeout=30) as plain:
            tokenized = await plain.post("/tokenize", json={"content": "hi"})
            # smg does not forward /tokenize; where a router does, it answers
            assert tokenized.status_code in (200, 404)
            if router == "vllm-router":
                assert tokenized.status_code == 200
    finally:
        proc.terminate()
        proc.wait(10)


def readme_router_command(router: str) -> list[str]:
    """The README's command for `router`, as a user copies it."""
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    line = next(line for line in readme.splitlines() if line.startswith(router + " "))
    return line.split()


async def admitted(url: str) -> float:
    return await metric_sum(url, "dgr_admissions_total")


async def metric_sum(url: str, sample: str) -> float:
    """The sum of a node's /metrics samples whose lines begin `sample`."""
    async with httpx.AsyncClient(timeout=10) as client:
        text = (await client.get(url + "/metrics")).text
    return sum(float(line.split()[-1]) for line in text.splitlines()
               if line.startswith(sample))


async def wait_ready(url: str, path: str) -> None:
    async with httpx.AsyncClient(base_url=url, timeout=5) as probe:
        with trio.fail_after(120):
            while True:
                try:
                    if (await probe.get(path)).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await trio.sleep(0.2)


async def test_a_node_killed_behind_vllm_router_started_as_the_readme_says_loses_nothing(
        tiny_model):
    """Two node processes behind vllm-router with the README's flags: six requests at
    once spread over both; then one node is killed (SIGKILL) and none of the 20
    non-streamed requests after it fails."""
    binary = shutil.which("vllm-router", path=os.pathsep.join(
        [os.path.dirname(sys.executable), os.environ.get("PATH", "")]))
    if binary is None:
        pytest.skip("vllm-router is not installed (the test extra installs it)")
    ports = [_free_port(), _free_port()]
    nodes = [subprocess.Popen([sys.executable, "-m", "dgr", "run", "--model", tiny_model,
                               "--port", str(p), "--max-running", "4", "--ctx", "4096",
                               "--threads", "1", "--log-level", "WARNING"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
             for p in ports]
    urls = [f"http://127.0.0.1:{p}" for p in ports]
    argv = readme_router_command("vllm-router")
    port = _free_port()
    flags = argv[argv.index("--worker-urls") + 3:]  # after the two workers' URLs
    flags[flags.index("--port") + 1] = str(port)
    base = f"http://127.0.0.1:{port}"
    router = None
    try:
        # the router starts once both nodes answer: a health check that fails while a
        # node loads takes it out until two more pass, and the six requests below
        # would all go to the other
        for url in urls:
            await wait_ready(url, "/health")
        router = subprocess.Popen([binary, "--worker-urls", *urls, *flags, "--host",
                                   "127.0.0.1"], stdout=subprocess.DEVNULL,
                                  stderr=subprocess.DEVNULL)
        await wait_ready(base, "/v1/models")
        async with openai.AsyncOpenAI(base_url=base + "/v1", api_key="unused",
                                      max_retries=0, timeout=60) as client:
            async def ask(text, tokens=4):
                return await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": text}], max_tokens=tokens,
                    temperature=0, extra_body={"ignore_eos": True})

            async def complete(text):
                await client.completions.create(model="m", prompt=text, max_tokens=256,
                                                temperature=0, extra_body={"ignore_eos": True})

            # six at once: the router's cache-aware policy sends a text that matches no
            # node's tree well to the node whose tree is smallest, and one that does to
            # that node; completions whose prompts share no beginning (a chat's text
            # shares its template's) spread, each long enough to be in flight
            async with trio.open_nursery() as nursery:
                for i in range(6):
                    nursery.start_soon(complete, f"{'ABCDEF'[i]}: " + "words " * 40 * i)
            served = [await admitted(url) for url in urls]
            assert all(served), served  # the load spread over both nodes
            nodes[0].kill()
            nodes[0].wait()
            lost = []
            for i in range(20):
                try:
                    await ask(f"after the kill {i}")
                except openai.APIError as exc:
                    lost.append(exc)
            assert not lost, lost
    finally:
        for proc in (router, *nodes):
            if proc is not None:
                proc.terminate()
                proc.wait(20)
