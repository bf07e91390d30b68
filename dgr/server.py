"""`python -m dgr run`: the node over HTTP, thin over the Node API.

Starlette (on anyio's Trio backend) for routing and responses, Hypercorn's
Trio worker for HTTP. The protocol doors (/v1/completions,
/v1/chat/completions, /v1/responses, /tokenize, /detokenize) are dgr.doors;
the node's own endpoints (/v1/models, /metrics, /capabilities, /health, the
prefix transfer) are here. Bad input is a 4xx with an OpenAI-style error body,
never a 500; a full queue is a 429 with Retry-After; a client that disconnects
mid-stream cancels its session.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import math
import os
import signal
import time
from typing import Optional

import trio
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from starlette.applications import Starlette
from starlette.middleware.cors import CORSMiddleware
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from dgr.config import NodeConfig, ServerConfig
from dgr.doors import (adapters, anthropic, completions, embeddings, llama_metrics, llama_native,
                       problems, responses, routers, tokens)
from dgr.doors.context import ServerState
from dgr.doors.fields import BadRequest
from dgr.doors.problems import TooLarge, Unavailable, error_response
from dgr.errors import AdmissionRejected, InvalidRequest, NodeClosed
from dgr.doors.vertex import VertexSettings, predict_endpoint
from dgr.embedding import open_embedding_node, serves_embeddings
from dgr.node import open_node
from dgr.serving import ServingNode
from dgr.tenants import TenantBounds, read_keys

log = logging.getLogger("dgr.server")
STARTED_AT = time.time()  # what llama-server's /metrics header Process-Start-Time-Unix says


def _retry_after(node: ServingNode) -> str:
    """Seconds until the queue has likely drained a place, from the measured session drain rate."""
    rate = node.telemetry.drain_rate()
    ahead = node.waiting_sessions + 1
    seconds = ahead / rate if rate > 0 else 5.0
    return str(max(1, min(60, math.ceil(seconds))))


def create_app(state: ServerState, config: ServerConfig,
               keys: Optional[dict[str, TenantBounds]] = None) -> Starlette:
    """The routes: the protocol doors (dgr.doors) and the node's own endpoints;
    `keys`: the tenants' API keys (--api-keys), each request's tenant."""

    mapper = _ErrorMapper(state, config)

    def door(handler, render=problems.openai):
        """A protocol's handler, its errors answered in that protocol's shape."""
        async def endpoint(request: Request) -> Response:
            state.last_request_at = time.monotonic()  # a drain waits for these to stop
            try:
                return await handler(request, state)
            except Exception as exc:  # noqa: BLE001 - every error is answered (problems)
                return mapper.map(exc, render)
        return endpoint

    async def models(request: Request) -> Response:
        node = state.node
        data = []
        if node is not None:
            data.append({"id": state.model_id, "object": "model", "created": 0, "owned_by": "dgr",
                         "aliases": sorted(config.model_alias) or [state.model_id],
                         "tags": list(config.model_tags), "meta": node.model_meta()})
            if node.generates:
                data += adapters.model_entries(state)
        return JSONResponse({"object": "list", "data": data})

    async def metrics(request: Request) -> Response:
        if state.node is None:
            raise Unavailable("the model is loading")
        # dgr's own families, then the routers' gauges (read from those, so in a
        # registry of their own), then llama-server's
        node = state.node
        beside = state.embedder.telemetry.exposition() if state.embedder is not None else b""
        response = Response(node.telemetry.exposition() + beside
                            + generate_latest(state.gateway_metrics)
                            + (llama_metrics.exposition(node) if node.generates else b""),
                            media_type=CONTENT_TYPE_LATEST)
        # in llama-server's case (Starlette would lower it; some clients read it as written)
        response.raw_headers.append((b"Process-Start-Time-Unix", str(int(STARTED_AT)).encode()))
        return response

    async def capabilities(request: Request) -> Response:
        if state.node is None:
            raise Unavailable("the model is loading")
        report = state.node.capabilities()
        report["bounds"] |= state.responses.statistics()
        if state.embedder is not None:
            report["embeddings"] = state.embedder.capabilities()
        return JSONResponse(report)

    async def health(request: Request) -> Response:
        if state.node is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        if state.node.failure is not None:
            return JSONResponse({"status": "failed", "reason": state.node.failure}, status_code=503)
        if state.leaving or state.node.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def drain(request: Request) -> Response:
        """Drain as SIGTERM does (serve's drain)."""
        state.ready_node()
        state.request_shutdown()
        return JSONResponse({"status": "draining"}, status_code=202)

    async def prefix_export(request: Request) -> Response:
        node = state.ready_node()
        body = await state.read_json(request)
        if not isinstance(body, dict) or ("tokens" in body) == ("prompt" in body):
            raise BadRequest("give exactly one of 'tokens' (token ids) or 'prompt' (text)",
                             "tokens")
        if "prompt" in body:
            if not isinstance(body["prompt"], str):
                raise BadRequest("'prompt' must be a string", "prompt")
            ids = await node.tokenize_off_loop(body["prompt"], parse_special=True)
        else:
            ids = body["tokens"]
            if not isinstance(ids, list) or not all(type(t) is int for t in ids):
                raise BadRequest("'tokens' must be a list of token ids", "tokens")
        blob = await node.export_prefix(ids)
        if blob is None:
            return error_response(404, "the node holds no prefix of these tokens",
                                  "not_found_error")
        return Response(blob, media_type="application/octet-stream")

    async def prefix_import(request: Request) -> Response:
        node = state.ready_node()
        limit = node.budgets.cache_ram_bytes + (1 << 20)
        blob = bytearray()
        async for part in request.stream():
            blob += part
            if len(blob) > limit:
                raise BadRequest(f"the prefix exceeds the host tier's bound ({limit} bytes)")
        n = await node.import_prefix(bytes(blob))
        return JSONResponse({"tokens": n})

    openai_doors = [("/chat/completions", completions.chat_completions),
                    ("/responses", responses.responses)]
    # OpenAI's paths with /v1 and, as llama-server serves them, without; its
    # /completions is llama.cpp's native completion, as /completion
    routes = [Route(prefix + path, door(handler), methods=["POST"])
              for prefix in ("/v1", "") for path, handler in openai_doors]
    routes += [
        Route("/v1/completions", door(completions.completions), methods=["POST"]),
        Route("/completions", door(llama_native.completion), methods=["POST"]),
        Route("/v1/messages", door(anthropic.messages, problems.anthropic), methods=["POST"]),
        Route("/v1/messages/count_tokens", door(anthropic.count_tokens, problems.anthropic),
              methods=["POST"]),
        Route("/models", models, methods=["GET"]),
        # llama.cpp's native API
        Route("/completion", door(llama_native.completion), methods=["POST"]),
        Route("/props", door(llama_native.props), methods=["GET"]),
        Route("/slots", door(llama_native.slots), methods=["GET"]),
        Route("/apply-template", door(llama_native.apply_template), methods=["POST"]),
        Route("/tokenize", door(tokens.tokenize), methods=["POST"]),
        Route("/detokenize", door(tokens.detokenize), methods=["POST"]),
        # vLLM's render endpoints: a router's prompt tokens (vllm-router's cache-aware policy)
        Route("/v1/completions/render", door(tokens.render_completion), methods=["POST"]),
        Route("/v1/chat/completions/render", door(tokens.render_chat), methods=["POST"]),
        Route("/v1/responses/render", door(tokens.render_chat), methods=["POST"]),
        # llama-server's prompt token counts
        *(Route(prefix + path, door(tokens.input_tokens), methods=["POST"])
          for prefix in ("/v1", "") for path in ("/chat/completions/input_tokens",
                                                 "/responses/input_tokens")),
        # the load routers read: SGLang's shape (smg), vLLM's (vllm-router)
        Route("/v1/loads", door(routers.sglang_loads), methods=["GET"]),
        Route("/loads", door(routers.sglang_loads), methods=["GET"]),
        Route("/get_load", door(routers.vllm_load), methods=["GET"]),
        Route("/v1/dgr/drain", drain, methods=["POST"]),
        Route("/v1/load_lora_adapter", door(adapters.load_adapter), methods=["POST"]),
        Route("/v1/unload_lora_adapter", door(adapters.unload_adapter), methods=["POST"]),
        Route("/lora-adapters", door(adapters.lora_adapters), methods=["GET", "POST"]),
        Route("/v1/models", models, methods=["GET"]),
        # embeddings and rerank (an embedding node: dgr.embedding)
        Route("/v1/embeddings", door(embeddings.openai_embeddings), methods=["POST"]),
        Route("/embeddings", door(embeddings.llama_embeddings), methods=["POST"]),
        Route("/embedding", door(embeddings.llama_embeddings), methods=["POST"]),
        *(Route(path, door(embeddings.rerank), methods=["POST"])
          for path in ("/rerank", "/v1/rerank", "/reranking", "/v1/reranking")),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/capabilities", capabilities, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
        Route("/v1/health", health, methods=["GET"]),
    ]
    if config.cache_transfer:
        # for a coordinator moving conversations between nodes (dgr.kv_tier's blob format)
        routes += [Route("/v1/dgr/prefix/export", prefix_export, methods=["POST"]),
                   Route("/v1/dgr/prefix/import", prefix_import, methods=["POST"])]
    vertex = VertexSettings.from_env(os.environ)
    if vertex is not None:  # in a Vertex AI container
        doors = {r.path: r.endpoint for r in routes if "POST" in (r.methods or ())}
        routes.append(Route(vertex.predict_route,
                            predict_endpoint(doors, state.read_json, mapper.map), methods=["POST"]))
        if vertex.health_route is not None:
            routes.append(Route(vertex.health_route, health, methods=["GET"]))
    # Starlette's ExceptionMiddleware answers these (an `Exception` handler alone would
    # run in its ServerErrorMiddleware, which raises the exception again)
    handled = (BadRequest, InvalidRequest, TooLarge, AdmissionRejected, Unavailable, NodeClosed,
               ClientDisconnect, ExceptionGroup, Exception)
    handlers = {cls: mapper for cls in handled}
    # Starlette's own 404 and 405 come as plain text; every 4xx here is OpenAI-shaped
    handlers[404] = handlers[405] = mapper
    app = Starlette(routes=routes, exception_handlers=handlers)
    guarded = _Guard(app, config, keys or {})
    if not config.cors_origins:
        return guarded
    # outside the key check: a browser's preflight carries no credentials
    return CORSMiddleware(guarded, allow_origins=list(config.cors_origins),
                          allow_methods=["GET", "POST", "OPTIONS"], allow_headers=["*"],
                          max_age=600)


class _ErrorMapper:
    """An exception -> its Problem (dgr.doors.problems) -> a response in a
    protocol's shape (OpenAI's unless a door says otherwise)."""

    def __init__(self, state: ServerState, config: ServerConfig):
        self.state = state
        self.config = config

    async def __call__(self, request: Request, exc: Exception) -> Response:
        return self.map(exc)

    def map(self, exc: BaseException, render=problems.openai) -> Response:
        def retry_after() -> Optional[str]:
            return _retry_after(self.state.node) if self.state.node else None

        return render(problems.classify(exc, retry_after, self.config.max_body_bytes))


class _Guard:
    """ASGI wrapper: the API key check (--api-key, or a tenant's of --api-keys, whose
    tenant the request then belongs to: scope["dgr.tenant"]), and one log line per
    request."""

    def __init__(self, app, config: ServerConfig, keys: dict[str, TenantBounds]):
        self.app = app
        self.key = config.api_key.encode() if config.api_key else None
        self.tenants = [(key.encode(), bounds.name) for key, bounds in keys.items()]

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = time.perf_counter()
        status = {"code": 0}

        async def send_logged(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            if ((self.key is not None or self.tenants)
                    and scope["path"] not in ("/health", "/v1/health")
                    and not self._authorized(scope)):
                render = (problems.anthropic if scope["path"].startswith("/v1/messages")
                          else problems.openai)
                response = render(problems.Problem(401, "authentication",
                                                   "missing or invalid API key",
                                                   "invalid_api_key"))
                await response(scope, receive, send_logged)
            else:
                await self.app(scope, receive, send_logged)
        except Exception:
            # Starlette re-raises what its catch-all handler already answered and logged.
            if not status["code"]:
                raise
        finally:
            log.info("%s %s %d tokens=%s %.1fms", scope["method"], scope["path"], status["code"],
                     scope.get("dgr.tokens", 0), (time.perf_counter() - started) * 1000)

    def _authorized(self, scope) -> bool:
        """`Authorization: Bearer KEY` (OpenAI's clients) or `X-Api-Key: KEY`
        (Anthropic's), the single key or a tenant's (its tenant noted in the scope)."""
        for name, value in scope["headers"]:
            if name == b"authorization" and value.startswith(b"Bearer "):
                return self._known(value[7:], scope)
            if name == b"x-api-key":
                return self._known(value, scope)
        return False

    def _known(self, given: bytes, scope) -> bool:
        known = self.key is not None and hmac.compare_digest(given, self.key)
        for key, tenant in self.tenants:  # every key compared: no early answer to time
            if hmac.compare_digest(given, key):
                scope["dgr.tenant"], known = tenant, True
        return known


async def _until_requests_stop(state: ServerState, quiet_s: float, deadline: float) -> None:
    """The first part of a drain: /health answers 503 from now on, and requests are
    still taken (routers send them until their next health check) until none has
    come for quiet_s, or the deadline."""
    state.leaving = True
    state.last_request_at = max(state.last_request_at, time.monotonic())
    while True:
        quiet_for = time.monotonic() - state.last_request_at
        left = min(quiet_s - quiet_for, deadline - trio.current_time())
        if left <= 0:
            return
        await trio.sleep(left)


async def serve(node_config: NodeConfig, server_config: ServerConfig, *,
                task_status=trio.TASK_STATUS_IGNORED, shutdown: Optional[trio.Event] = None,
                handle_signals: bool = True) -> Optional[int]:
    """Serve until SIGINT/SIGTERM, POST /v1/dgr/drain or `shutdown`: then drain
    (/health 503; requests still taken until they stop for drain_quiet_s; then no
    more admitted and the running sessions finish), all within grace_s, and return.
    A second signal ends at once.

    task_status.started() reports the bound URLs once the node is ready. Signals are
    handled only with handle_signals (and only Python's main thread can). Returns the
    number of a second signal that forced the exit, else None."""
    import hypercorn.config
    import hypercorn.trio

    state = ServerState(server_config)
    keys = read_keys(node_config.api_keys) if node_config.api_keys else None
    app = create_app(state, server_config, keys)
    hconfig = hypercorn.config.Config()
    vertex = VertexSettings.from_env(os.environ)
    port = vertex.port if vertex is not None and vertex.port else server_config.port
    hconfig.bind = [f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
                    for host in server_config.host.split(",")]
    hconfig.accesslog = None
    hconfig.errorlog = logging.getLogger("hypercorn.error")
    hconfig.graceful_timeout = 1.0
    stop_http = trio.Event()
    shutdown = shutdown if shutdown is not None else trio.Event()

    forced: list[int] = []

    async def watch_signals(cancel_scope: trio.CancelScope):
        with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
            async for signum in signals:
                if shutdown.is_set():
                    log.warning("second %s: exiting now", signal.Signals(signum).name)
                    forced.append(signum)
                    cancel_scope.cancel()
                    return
                log.info("%s: draining (grace %.0fs)", signal.Signals(signum).name,
                         server_config.grace_s)
                shutdown.set()

    http_done = trio.Event()

    async def run_http(task_status=trio.TASK_STATUS_IGNORED):
        try:
            await hypercorn.trio.serve(app, hconfig, shutdown_trigger=stop_http.wait,
                                       task_status=task_status)
        finally:
            http_done.set()

    async with trio.open_nursery() as nursery:
        if handle_signals:
            nursery.start_soon(watch_signals, nursery.cancel_scope)
        urls = await nursery.start(run_http)
        log.info("listening on %s", ", ".join(urls))
        embedding = await trio.to_thread.run_sync(serves_embeddings, node_config)
        # --pooling on a generation model (no --embeddings): embeddings beside generation
        beside = not embedding and node_config.pooling is not None
        async with (open_embedding_node if embedding else open_node)(node_config) as node, \
                contextlib.AsyncExitStack() as embeddings:
            if beside:
                state.embedder = await embeddings.enter_async_context(
                    open_embedding_node(node_config, beside=node))
            state.model_id = min(server_config.model_alias, default=node.engine_info["name"])
            if node.generates:
                node.adapters.base_names |= {state.model_id, *server_config.model_alias}
                state.gateway_metrics.register(routers.GatewayGauges(node, state.model_id))
            state.request_shutdown = shutdown.set
            state.node = node
            log.info("serving %s (%s)", state.model_id, node.engine_info["path"])
            task_status.started(urls)
            await shutdown.wait()
            deadline = trio.current_time() + server_config.grace_s
            await _until_requests_stop(state, server_config.drain_quiet_s, deadline)
            drained = await node.drain(max(0.0, deadline - trio.current_time()))
            if state.embedder is not None:
                drained &= await state.embedder.drain(max(0.0, deadline - trio.current_time()))
            log.info("drained" if drained else "grace period over: cancelling remaining sessions")
        stop_http.set()
        with trio.move_on_after(hconfig.graceful_timeout + 2):
            await http_done.wait()
        nursery.cancel_scope.cancel()
    return forced[0] if forced else None
