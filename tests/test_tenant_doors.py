"""Tenants and priorities over HTTP: a keys file's keys (401 without one), whose
tenant a request is by key, X-Tenant or user, its priority in every door, the
tenants' own 429s with Retry-After, and what /metrics and /capabilities show."""

import re

import pytest

from test_server import start_server  # noqa: F401  (the fixture)

KEYS = "sk-batch tenant=batch max_waiting=4 tokens_per_min=40\nsk-chat tenant=chat weight=2\n"
CHAT = [{"role": "user", "content": "hello there"}]


def ttft_count(metrics: str, tenant: str, priority: int) -> float:
    pattern = (r'^dgr_tenant_time_to_first_token_seconds_count\{priority="%s",tenant="%s"\} '
               r'(\S+)$' % (priority, re.escape(tenant)))
    found = re.search(pattern, metrics, re.MULTILINE)
    return float(found.group(1)) if found else 0.0


@pytest.fixture
async def keyed_server(start_server, tmp_path):  # noqa: F811
    keys = tmp_path / "keys"
    keys.write_text(KEYS)
    return await start_server({"api_keys": str(keys), "scheduling_policy": "priority"})


async def test_a_keys_file_admits_its_keys_only_and_names_each_requests_tenant(keyed_server):
    async with keyed_server.client() as client:
        body = {"prompt": "hi", "max_tokens": 2, "temperature": 0}
        refused = await client.post("/v1/completions", json=body)
        assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
        wrong = await client.post("/v1/completions", json=body,
                                  headers={"Authorization": "Bearer sk-nobody"})
        assert wrong.status_code == 401
        # the key names the tenant, whatever the header or the body say
        done = await client.post("/v1/completions", json=body | {"user": "mallory"},
                                 headers={"Authorization": "Bearer sk-chat",
                                          "X-Tenant": "batch"})
        assert done.status_code == 200, done.text
        anthropic = await client.post("/v1/messages", headers={"X-Api-Key": "sk-chat"},
                                      json={"max_tokens": 2, "messages": CHAT})
        assert anthropic.status_code == 200, anthropic.text
        assert (await client.get("/health")).status_code == 200  # no key needed
        metrics = (await client.get("/metrics", headers={"X-Api-Key": "sk-chat"})).text
        assert ttft_count(metrics, "chat", 0) == 2 and ttft_count(metrics, "batch", 0) == 0
        facts = (await client.get("/capabilities", headers={"X-Api-Key": "sk-chat"})).json()
        assert facts["scheduling"]["policy"] == "priority"
        assert facts["scheduling"]["parking"]["on"] is True
        assert facts["scheduling"]["tenants"]["chat"]["weight"] == 2.0
        assert facts["bounds"]["tenant:batch:waiting_sessions"]["capacity"] == 4


async def test_a_tenant_past_its_rate_gets_429_and_retry_after_and_the_other_does_not(
        keyed_server):
    batch = {"Authorization": "Bearer sk-batch"}
    async with keyed_server.client() as client:
        body = {"prompt": "hi", "max_tokens": 48, "temperature": 0, "ignore_eos": True}
        assert (await client.post("/v1/completions", json=body, headers=batch)).status_code == 200
        refused = await client.post("/v1/completions", json=body, headers=batch)
        assert refused.status_code == 429
        assert refused.json()["error"]["code"] == "tenant_rate"
        assert int(refused.headers["retry-after"]) >= 10  # the 48 tokens over its 40 a minute
        done = await client.post("/v1/completions", json=body,
                                 headers={"Authorization": "Bearer sk-chat"})
        assert done.status_code == 200
        metrics = (await client.get("/metrics", headers=batch)).text
        assert 'dgr_tenant_admissions_rejected_total{reason="tenant_rate",tenant="batch"} 1.0' \
            in metrics


async def test_every_door_takes_a_priority_and_a_tenant(start_server):  # noqa: F811
    server = await start_server({"scheduling_policy": "priority"})
    async with server.client() as client:
        asked = {"max_tokens": 2, "temperature": 0}
        calls = [
            ("/v1/completions", {"prompt": "hi", "priority": -2, "user": "u1"}, {}),
            ("/v1/chat/completions", {"messages": CHAT, "priority": -2, "user": "u1"}, {}),
            ("/v1/responses", {"input": "hi", "max_output_tokens": 2, "priority": -2,
                               "user": "u1"}, {}),
            ("/completion", {"prompt": "hi", "priority": -2}, {"X-Tenant": "u1"}),
            ("/v1/messages", {"messages": CHAT, "metadata": {"user_id": "u1", "priority": -2}},
             {}),
            ("/v1/messages", {"messages": CHAT}, {"X-Tenant": "u1", "X-Priority": "-2"}),
        ]
        for path, body, headers in calls:
            body = ({k: v for k, v in asked.items() if path != "/v1/responses" or k != "max_tokens"}
                    | body)
            done = await client.post(path, json=body, headers=headers)
            assert done.status_code == 200, (path, done.text)
        metrics = (await client.get("/metrics")).text
        assert ttft_count(metrics, "u1", -2) == len(calls)
        for path, body, headers, param in [
                ("/v1/completions", {"prompt": "hi", "priority": "high"}, {}, "priority"),
                ("/v1/chat/completions", {"messages": CHAT, "priority": 2 ** 40}, {}, "priority"),
                ("/v1/completions", {"prompt": "hi"}, {"X-Priority": "soon"}, "X-Priority"),
                ("/v1/completions", {"prompt": "hi", "user": "x" * 65}, {}, "user"),
                ("/v1/completions", {"prompt": "hi"}, {"X-Tenant": "x" * 65}, "X-Tenant"),
                ("/v1/messages", {"messages": CHAT, "max_tokens": 2,
                                  "metadata": {"priority": 1.5}}, {}, "metadata.priority")]:
            refused = await client.post(path, json=body, headers=headers)
            assert refused.status_code == 400, (body, refused.text)
            error = refused.json()["error"]
            if path == "/v1/messages":  # Anthropic's errors name no param: the message does
                assert f"'{param}'" in error["message"]
            else:
                assert error["param"] == param


async def test_a_bad_keys_file_stops_the_server_before_it_loads(
        start_server, tmp_path):  # noqa: F811
    keys = tmp_path / "keys"
    keys.write_text("sk-1 tenant=a weight=zero\n")
    with pytest.raises(Exception, match="line 1: weight must be a number"):
        await start_server({"api_keys": str(keys)})
