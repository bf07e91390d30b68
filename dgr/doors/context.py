"""What a door sees of the server: the node (None while it loads), the model's
name, the server's config and the Responses API's store; reading a body within
its bound; the errors the server maps to 413 and 503."""

from __future__ import annotations

import json
from typing import Any, Optional

from prometheus_client import CollectorRegistry
from starlette.requests import Request

from dgr.config import ServerConfig
from dgr.doors.fields import FIELDS, BadRequest
from dgr.doors.problems import TooLarge, Unavailable
from dgr.doors.response_store import ResponseStore
from dgr.errors import NotServed
from dgr.serving import ServingNode


# how much of a refused body is read on before the 413 (read_json)
LINGER_BODIES = 16


class ServerState:
    def __init__(self, config: ServerConfig) -> None:
        self.config = config
        self.node: Optional[ServingNode] = None
        self.embedder: Optional[ServingNode] = None  # beside a generation node (--pooling)
        self.model_id = "dgr"
        self.responses = ResponseStore(config.responses_stored, config.responses_store_bytes)
        self.request_shutdown = lambda: None  # set by dgr.server.serve: drain, then exit
        self.leaving = False  # draining: /health says so, requests are still taken
        self.last_request_at = 0.0  # time.monotonic() of the last door request
        # the gauges routers read (dgr.doors.routers), exposed after dgr's own in /metrics
        self.gateway_metrics = CollectorRegistry(auto_describe=False)

    def model_name(self, params) -> str:
        """The model a response names: the adapter the request named, else the model's id."""
        served = self.node is not None and self.node.adapters.serves(params.model)
        return params.model if served else self.model_id

    def ready_node(self) -> ServingNode:
        """The node, if it generates (dgr.node.Node)."""
        node = self.ready_vocabulary()
        if not node.generates:
            raise NotServed("this server serves embeddings (an embedding model, or "
                            "--embeddings): it does not generate; start it without "
                            "--embeddings on a generation model")
        return node

    def ready_embedder(self, task: str) -> ServingNode:
        """The node that serves `task` ("embedding" or "rerank"): the node, or the
        embedding node beside it."""
        node = self.ready_vocabulary()
        if node.generates and self.embedder is not None:
            node = self.embedder
        if not node.generates and node.task == task:
            return node
        if task == "rerank":
            raise NotServed("this server does not rerank: start it with --rerank on a "
                            "reranking model")
        raise NotServed("this server does not serve embeddings: start it with --embeddings, "
                        "or with --pooling to serve them beside generation"
                        + (" (it serves a reranker: use /rerank)" if not node.generates else ""))

    def ready_vocabulary(self):
        """The node of either kind (a generation or an embedding node), for what its
        vocabulary answers (/tokenize, /detokenize)."""
        if self.node is None:
            raise Unavailable("the model is loading")
        if self.node.draining:
            raise Unavailable("the server is shutting down")
        return self.node

    async def read_body(self, request: Request, door: str) -> Any:
        """A door's body (read_json) with the server's sampling defaults (--temp,
        --seed) where it gives none and the door takes them."""
        body = await self.read_json(request)
        if isinstance(body, dict):
            defaults = {"temperature": self.config.temperature, "seed": self.config.seed}
            body = {name: value for name, value in defaults.items()
                    if value is not None and name in FIELDS[door]} | body
        return body

    async def read_json(self, request: Request) -> Any:
        """The body as JSON, refused past max_body_bytes (413). A refused body is
        read on, unkept, up to LINGER_BODIES times the bound, so that the client,
        still sending it, reads the 413 rather than a reset connection."""
        limit = self.config.max_body_bytes
        declared = request.headers.get("content-length")
        too_large = declared is not None and declared.isdigit() and int(declared) > limit
        body = bytearray()
        seen = 0
        async for part in request.stream():
            seen += len(part)
            if seen > limit:
                too_large = True
            if too_large and seen > LINGER_BODIES * limit:
                break
            if not too_large:
                body += part
        if too_large:
            raise TooLarge()
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise BadRequest(f"malformed JSON body: {exc}") from None
