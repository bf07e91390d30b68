"""Property-based fuzzing of the HTTP edge: whatever the body, the answer is a
200 or a 4xx with an OpenAI-style error, never a 500 and never a hang, and the
server keeps serving."""

import functools
import json
import queue
import threading

import httpx
import pytest
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import dgr
from dgr.config import ServerConfig
from dgr.server import serve

FIELDS = ["prompt", "max_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
          "logprobs", "stream", "n", "ignore_eos", "stream_options", "echo", "unknown_field",
          "messages", "top_logprobs", "max_completion_tokens", "logit_bias", "presence_penalty",
          "frequency_penalty", "repeat_penalty", "repetition_penalty", "repeat_last_n", "user",
          "tools", "response_format", "grammar", "min_tokens", "stop_token_ids"]

scalars = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2 ** 70), max_value=2 ** 70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=40),
    st.sampled_from(["", "x" * 5000, "\ud7ff\U0001f389", "0", "-1"]))
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=4), st.dictionaries(st.text(max_size=8), inner, max_size=4)),
    max_leaves=12)
bodies = st.dictionaries(st.sampled_from(FIELDS), values, max_size=8)


@pytest.fixture(scope="module")
def live_server(tiny_model):
    config = dgr.NodeConfig(model_path=tiny_model, max_running=4, max_waiting=8, n_ctx=2048,
                            n_batch=128, n_ubatch=128, prefill_chunk=32, n_threads=1)
    ready: queue.Queue = queue.Queue()
    holder = {}

    def run():
        async def main():
            holder["token"] = trio.lowlevel.current_trio_token()
            holder["shutdown"] = trio.Event()
            async with trio.open_nursery() as nursery:
                urls = await nursery.start(functools.partial(
                    serve, config, ServerConfig(port=0, grace_s=1, max_body_bytes=64 * 1024),
                    shutdown=holder["shutdown"], handle_signals=False))
                ready.put(urls[0])

        trio.run(main)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    url = ready.get(timeout=60)
    with httpx.Client(base_url=url, timeout=60) as client:
        yield client
    holder["token"].run_sync_soon(holder["shutdown"].set)
    thread.join(30)
    assert not thread.is_alive()


def check(response):
    assert response.status_code in (200, 400, 413, 429), response.text
    if response.status_code != 200:
        error = response.json()["error"]
        assert isinstance(error["message"], str) and error["type"]


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=bodies, chat=st.booleans())
def test_fuzzed_json_bodies(live_server, body, chat):
    if "max_tokens" not in body:
        body["max_tokens"] = 4  # keep the valid ones short
    path = "/v1/chat/completions" if chat else "/v1/completions"
    check(live_server.post(path, content=json.dumps(body, allow_nan=True),
                           headers={"content-type": "application/json"}))


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.binary(max_size=300))
def test_fuzzed_raw_bytes(live_server, raw):
    check(live_server.post("/v1/completions", content=raw))


@pytest.mark.parametrize("raw", [
    b"\xff\xfe{\"prompt\": \"x\"}",                       # invalid UTF-8
    b"{\"prompt\": \"\xc3\x28\"}",                        # invalid UTF-8 inside a string
    b"[" * 50_000 + b"]" * 50_000,                        # deeply nested
    b"{\"a\":" * 20_000 + b"1" + b"}" * 20_000,            # deeply nested objects
    json.dumps({"prompt": "x" * 100_000}).encode(),       # over the body limit
    json.dumps({"prompt": "x", "max_tokens": 10 ** 30}).encode(),
    json.dumps({"prompt": "x", "seed": -1, "max_tokens": 2}).encode(),
])
def test_nasty_bodies(live_server, raw):
    check(live_server.post("/v1/completions", content=raw))


def test_still_serving_after_the_fuzz(live_server):
    response = live_server.post("/v1/completions", json={"prompt": "alive?", "max_tokens": 3})
    assert response.status_code == 200
    assert response.json()["usage"]["completion_tokens"] >= 1
