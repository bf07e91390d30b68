"""What the routers in front of a node read of it: its load in SGLang's shape
(`GET /v1/loads`, `/loads`: smg's load-aware policies) and in vLLM's (`GET
/get_load`: vllm-router's power-of-two policy), and in /metrics the gauges of the
Gateway API Inference Extension's model-server protocol under vLLM's names
(waiting and running requests, KV-cache usage, prefix-cache queries and hits),
beside dgr's own. All from the node's live figures (`Node.router_load`)."""

from __future__ import annotations

import datetime

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dgr.doors.context import ServerState
from dgr.doors.problems import Unavailable


def _node(server: ServerState):
    if server.node is None:
        raise Unavailable("the model is loading")
    return server.node


async def sglang_loads(request: Request, server: ServerState) -> Response:
    """SGLang's load snapshot: one entry (a node is one data-parallel rank)."""
    f = _node(server).router_load()
    prompt = f["prompt_tokens"]
    stamp = datetime.datetime.now(datetime.timezone.utc).isoformat()
    return JSONResponse({"timestamp": stamp, "version": "dgr", "dp_rank_count": 1, "loads": [{
        "dp_rank": 0,
        "num_running_reqs": f["running"],
        "num_waiting_reqs": f["waiting"],
        "num_total_reqs": f["running"] + f["waiting"],
        "num_used_tokens": f["kv_cells_used"],
        "max_total_num_tokens": f["kv_cells_total"],
        "token_usage": f["kv_usage"],
        "gen_throughput": f["decode_tokens_per_s"],
        "cache_hit_rate": f["prompt_tokens_cached"] / prompt if prompt else 0.0,
    }]})


async def vllm_load(request: Request, server: ServerState) -> Response:
    """vLLM's `GET /get_load`: the requests the node holds, running and waiting."""
    f = _node(server).router_load()
    return JSONResponse({"load": f["running"] + f["waiting"]})


class GatewayGauges:
    """The Inference Extension's model-server metrics (vLLM's names), collected
    when /metrics is scraped."""

    def __init__(self, node, model_name: str):
        self._node = node
        self._model = model_name

    def describe(self):
        return []

    def collect(self):
        f = self._node.router_load()
        labels = ["model_name"]
        gauges = [
            ("vllm:num_requests_running", "Requests running (sessions decoding or prefilling).",
             f["running"]),
            ("vllm:num_requests_waiting", "Requests waiting for a slot.", f["waiting"]),
            ("vllm:kv_cache_usage_perc", "KV cache usage: cells in use over cells (1 = full).",
             f["kv_usage"]),
            ("vllm:gpu_cache_usage_perc", "The same KV cache usage, under vLLM's older name.",
             f["kv_usage"]),
        ]
        for name, text, value in gauges:
            family = GaugeMetricFamily(name, text, labels=labels)
            family.add_metric([self._model], value)
            yield family
        for name, text, value in (
                ("vllm:prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                 f["prompt_tokens"]),
                ("vllm:prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                 f["prompt_tokens_cached"])):
            family = CounterMetricFamily(name, text, labels=labels)
            family.add_metric([self._model], value)
            yield family
