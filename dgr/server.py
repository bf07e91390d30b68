"""`python -m dgr run`: the node over HTTP, thin over the Node API.

Starlette (on anyio's Trio backend) for routing and responses, Hypercorn's
Trio worker for HTTP. Endpoints: /v1/completions, /v1/chat/completions,
/v1/responses, /v1/models, /tokenize, /detokenize, /metrics, /capabilities, /health. Bad input is a 4xx with an
OpenAI-style error body, never a 500; a full queue is a 429 with Retry-After;
a client that disconnects mid-stream cancels its session.
"""

from __future__ import annotations

import hmac
import json
import logging
import math
import signal
import time
from typing import Any, Optional

import trio
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from dgr.config import NodeConfig, ServerConfig
from dgr.errors import AdmissionRejected, InvalidRequest, NodeClosed
from dgr.node import Node, open_node
from dgr.stream import Chunk
from dgr import responses as responses_api
from dgr.http_sessions import (SessionEvents, cached_tokens, completion_events, error_response,
                               prompt_tokens, read_whole, scored_prompt, scores_prompt)
from dgr.openai import (BadRequest, ResponseBuilder, parse_chat, parse_completion,
                        parse_detokenize, parse_tokenize, token_piece)

log = logging.getLogger("dgr.server")


class _State:
    """What the app sees of the node: None while loading."""

    def __init__(self) -> None:
        self.node: Optional[Node] = None
        self.model_id = "dgr"


def _retry_after(node: Node) -> str:
    """Seconds until the queue has likely drained a place, from the measured session drain rate."""
    rate = node.telemetry.drain_rate()
    ahead = node.waiting_sessions + 1
    seconds = ahead / rate if rate > 0 else 5.0
    return str(max(1, min(60, math.ceil(seconds))))


def create_app(state: _State, config: ServerConfig) -> Starlette:
    store = responses_api.ResponseStore(config.responses_stored, config.responses_store_bytes)

    async def read_json(request: Request) -> Any:
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > config.max_body_bytes:
            raise _TooLarge()
        body = bytearray()
        async for part in request.stream():
            body += part
            if len(body) > config.max_body_bytes:
                raise _TooLarge()
        try:
            return json.loads(body)
        except (ValueError, RecursionError) as exc:
            raise BadRequest(f"malformed JSON body: {exc}") from None

    def ready_node() -> Node:
        if state.node is None:
            raise _Unavailable("the model is loading")
        if state.node.draining:
            raise _Unavailable("the server is shutting down")
        return state.node

    async def completions(request: Request) -> Response:
        node = ready_node()
        parsed = parse_completion(await read_json(request))
        return await _generate(request, node, parsed, parsed.prompts)

    async def chat_completions(request: Request) -> Response:
        node = ready_node()
        parsed, messages = parse_chat(await read_json(request), node.tool_format)
        try:
            prompt = node.chat_prompt(messages, parsed.tools)
        except ValueError as exc:
            raise BadRequest(f"cannot apply the chat template: {exc}", "messages") from None
        ids = await node.tokenize_off_loop(prompt, add_special=True, parse_special=True)
        return await _generate(request, node, parsed, [ids])

    async def _generate(request: Request, node: Node, parsed, prompts: list) -> Response:
        """One choice per prompt and sample (n), admitted together (dgr.Node.stream_group)."""
        builder = ResponseBuilder(state.model_id, parsed.chat, node.token_text, node.token_bytes,
                                  parsed.top_logprobs, parsed.tools)
        # echo: each choice's text begins with its prompt (choice i samples prompt i // n)
        echoes = [(p if isinstance(p, str) else node.detokenize(p)) if parsed.echo else ""
                  for p in prompts for _ in range(parsed.n)]
        if parsed.stream:
            # Admission happens before the 200 goes out, so a refusal is a real status code.
            group_cm = node.stream_group(prompts, parsed.params, parsed.n)
            streams = await group_cm.__aenter__()
            return SessionEvents(
                lambda emit: completion_events(request, streams, builder, parsed, echoes, emit),
                close=lambda: group_cm.__aexit__(None, None, None))
        texts: list[list[str]] = [[echo] for echo in echoes]
        rows: list[list[Chunk]] = [[] for _ in texts]

        async def collect(i, chunks):
            got = await chunks.read_all()
            texts[i] += [chunk.text for chunk in got]
            rows[i] = [chunk for chunk in got if chunk.token_id is not None]
            request.scope["dgr.tokens"] = sum(map(len, rows))

        async with node.stream_group(prompts, parsed.params, parsed.n, whole=True) as streams:
            instead = await read_whole(request, streams, collect)
        if instead is not None:
            return instead
        reasons = [chunks.finish_reason for chunks in streams]
        completion = sum(map(len, rows))
        return JSONResponse(builder.full(
            [("".join(t), r, reason) for t, r, reason in zip(texts, rows, reasons)],
            prompt_tokens(streams, parsed.n), completion, cached_tokens(streams, parsed.n),
            [scored_prompt(c) for c in streams] if scores_prompt(parsed) else None))

    async def responses(request: Request) -> Response:
        """OpenAI's Responses API over one chat session (dgr.responses)."""
        node = ready_node()
        parsed = responses_api.parse_response_request(await read_json(request), store,
                                                      node.tool_format)
        try:
            prompt = node.chat_prompt(parsed.prompt, parsed.chat.tools)
        except ValueError as exc:
            raise BadRequest(f"cannot apply the chat template: {exc}", "input") from None
        ids = await node.tokenize_off_loop(prompt, add_special=True, parse_special=True)
        builder = responses_api.ResponseBuilder(state.model_id, parsed)

        def finished(text: str, chunks) -> dict:
            usage = builder.usage(chunks.prompt_tokens, len(generated), chunks.cached_tokens)
            if parsed.store:
                store.put(builder.id, parsed.conversation + [builder.answer(text)[1]])
            return usage

        generated: list[int] = []
        if parsed.stream:
            stream_cm = node.stream(ids, parsed.chat.params)
            chunks = await stream_cm.__aenter__()

            async def produce(emit) -> None:
                for event in builder.opening():
                    await emit(event)
                texts = []
                async for chunk in chunks:
                    if chunk.token_id is not None:
                        generated.append(chunk.token_id)
                        request.scope["dgr.tokens"] = len(generated)
                    if chunk.finish_reason == "error":
                        await emit(builder.event("error", code="model_failed",
                                                 message=chunk.error))
                        return
                    if chunk.text:
                        texts.append(chunk.text)
                        for event in builder.delta(chunk.text):
                            await emit(event)
                if chunks.finish_reason == "cancelled":
                    await emit(builder.event("error", code="cancelled",
                                             message="the session was cancelled"))
                    return
                text = "".join(texts)
                for event in builder.closing(text, chunks.finish_reason, finished(text, chunks)):
                    await emit(event)

            return SessionEvents(produce, close=lambda: stream_cm.__aexit__(None, None, None))
        texts = []

        async def collect(_, chunks):
            got = await chunks.read_all()
            texts.extend(chunk.text for chunk in got)
            generated.extend(chunk.token_id for chunk in got if chunk.token_id is not None)
            request.scope["dgr.tokens"] = len(generated)

        async with node.stream(ids, parsed.chat.params, whole=True) as chunks:
            instead = await read_whole(request, [chunks], collect)
        if instead is not None:
            return instead
        text = "".join(texts)
        return JSONResponse(builder.response("completed", text, chunks.finish_reason,
                                             finished(text, chunks)))

    async def tokenize(request: Request) -> Response:
        node = ready_node()
        content, add_special, with_pieces = parse_tokenize(await read_json(request))
        ids = await node.tokenize_off_loop(content, add_special=add_special, parse_special=True)
        if with_pieces:
            return JSONResponse({"tokens": [{"id": t, "piece": token_piece(node.token_bytes(t))}
                                            for t in ids]})
        return JSONResponse({"tokens": ids})

    async def detokenize(request: Request) -> Response:
        node = ready_node()
        tokens = parse_detokenize(await read_json(request))
        return JSONResponse({"content": node.detokenize(tokens)})

    async def models(request: Request) -> Response:
        node = state.node
        data = []
        if node is not None:
            info = node.engine_info
            data.append({"id": state.model_id, "object": "model", "created": 0, "owned_by": "dgr",
                         "meta": {"architecture": info["architecture"], "n_params": info["n_params"],
                                  "n_ctx_per_session": info["n_ctx_seq"],
                                  "n_vocab": info["n_vocab"]}})
        return JSONResponse({"object": "list", "data": data})

    async def metrics(request: Request) -> Response:
        if state.node is None:
            raise _Unavailable("the model is loading")
        return Response(state.node.telemetry.exposition(), media_type=CONTENT_TYPE_LATEST)

    async def capabilities(request: Request) -> Response:
        if state.node is None:
            raise _Unavailable("the model is loading")
        return JSONResponse(state.node.capabilities())

    async def health(request: Request) -> Response:
        if state.node is None:
            return JSONResponse({"status": "loading"}, status_code=503)
        if state.node.failure is not None:
            return JSONResponse({"status": "failed", "reason": state.node.failure}, status_code=503)
        if state.node.draining:
            return JSONResponse({"status": "draining"}, status_code=503)
        return JSONResponse({"status": "ok"})

    async def prefix_export(request: Request) -> Response:
        node = ready_node()
        body = await read_json(request)
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
        node = ready_node()
        limit = node.budgets.cache_ram_bytes + (1 << 20)
        blob = bytearray()
        async for part in request.stream():
            blob += part
            if len(blob) > limit:
                raise BadRequest(f"the prefix exceeds the host tier's bound ({limit} bytes)")
        n = await node.import_prefix(bytes(blob))
        return JSONResponse({"tokens": n})

    routes = [
        Route("/v1/completions", completions, methods=["POST"]),
        Route("/v1/chat/completions", chat_completions, methods=["POST"]),
        Route("/v1/responses", responses, methods=["POST"]),
        Route("/v1/models", models, methods=["GET"]),
        Route("/tokenize", tokenize, methods=["POST"]),
        Route("/detokenize", detokenize, methods=["POST"]),
        Route("/metrics", metrics, methods=["GET"]),
        Route("/capabilities", capabilities, methods=["GET"]),
        Route("/health", health, methods=["GET"]),
    ]
    if config.cache_transfer:
        # for a coordinator moving conversations between nodes (dgr.kv_tier's blob format)
        routes += [Route("/v1/dgr/prefix/export", prefix_export, methods=["POST"]),
                   Route("/v1/dgr/prefix/import", prefix_import, methods=["POST"])]
    mapper = _ErrorMapper(state, config)
    handled = (BadRequest, InvalidRequest, _TooLarge, AdmissionRejected, _Unavailable, NodeClosed,
               ClientDisconnect, ExceptionGroup, Exception)
    handlers = {cls: mapper for cls in handled}
    # Starlette's own 404 and 405 come as plain text; every 4xx here is OpenAI-shaped
    handlers[404] = handlers[405] = mapper
    app = Starlette(routes=routes, exception_handlers=handlers)
    return _Guard(app, config)


class _TooLarge(Exception):
    pass


class _Unavailable(Exception):
    pass


class _ErrorMapper:
    """Exception -> OpenAI-style error response: 4xx for bad input and refusals,
    503 while unavailable; a 500 only for a real server fault (logged)."""

    def __init__(self, state: _State, config: ServerConfig):
        self.state = state
        self.config = config

    async def __call__(self, request: Request, exc: Exception) -> Response:
        return self.map(exc)

    def map(self, exc: BaseException) -> Response:
        if isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
            return self.map(exc.exceptions[0])
        if isinstance(exc, HTTPException) and exc.status_code in (404, 405):
            found = exc.status_code == 404
            return error_response(exc.status_code,
                                  "no such endpoint" if found else "method not allowed",
                                  "invalid_request_error",
                                  "not_found" if found else "method_not_allowed",
                                  headers=exc.headers)
        if isinstance(exc, BadRequest):
            return error_response(400, str(exc), "invalid_request_error", "invalid_value",
                                  exc.param)
        if isinstance(exc, InvalidRequest):
            return error_response(400, str(exc), "invalid_request_error", "invalid_value")
        if isinstance(exc, _TooLarge):
            return error_response(413, f"request body exceeds {self.config.max_body_bytes} bytes",
                                  "invalid_request_error", "body_too_large")
        if isinstance(exc, AdmissionRejected):
            if exc.reason == "never_fits":
                return error_response(400, str(exc), "invalid_request_error",
                                      "context_length_exceeded")
            if exc.reason in ("draining", "unhealthy"):
                return error_response(503, str(exc), "server_error", exc.reason)
            headers = {"Retry-After": _retry_after(self.state.node)} if self.state.node else None
            return error_response(429, str(exc), "rate_limit_error", exc.reason, headers=headers)
        if isinstance(exc, (_Unavailable, NodeClosed)):
            return error_response(503, str(exc), "server_error", "unavailable")
        if isinstance(exc, ClientDisconnect):
            return Response(status_code=499)
        log.error("internal error", exc_info=exc)
        return error_response(500, "internal server error", "server_error", "internal_error")


class _Guard:
    """ASGI wrapper: the API key check, and one log line per request."""

    def __init__(self, app, config: ServerConfig):
        self.app = app
        self.key = config.api_key.encode() if config.api_key else None

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
            if self.key is not None and scope["path"] != "/health" and not self._authorized(scope):
                response = error_response(401, "missing or invalid API key",
                                          "invalid_request_error", "invalid_api_key")
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
        for name, value in scope["headers"]:
            if name == b"authorization":
                return value.startswith(b"Bearer ") and hmac.compare_digest(value[7:], self.key)
        return False


async def serve(node_config: NodeConfig, server_config: ServerConfig, *,
                task_status=trio.TASK_STATUS_IGNORED, shutdown: Optional[trio.Event] = None,
                handle_signals: bool = True) -> Optional[int]:
    """Serve until SIGINT/SIGTERM (or `shutdown` is set): then stop admitting, let
    running sessions finish for up to grace_s, and return. A second signal ends at once.

    task_status.started() reports the bound URLs once the node is ready. Signals are
    handled only with handle_signals (and only Python's main thread can). Returns the
    number of a second signal that forced the exit, else None."""
    import hypercorn.config
    import hypercorn.trio

    state = _State()
    app = create_app(state, server_config)
    hconfig = hypercorn.config.Config()
    hconfig.bind = [f"{server_config.host}:{server_config.port}"]
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
        async with open_node(node_config) as node:
            state.model_id = server_config.model_alias or node.engine_info["name"]
            state.node = node
            log.info("serving %s (%s)", state.model_id, node.engine_info["path"])
            task_status.started(urls)
            await shutdown.wait()
            drained = await node.drain(server_config.grace_s)
            log.info("drained" if drained else "grace period over: cancelling remaining sessions")
        stop_http.set()
        with trio.move_on_after(hconfig.graceful_timeout + 2):
            await http_done.wait()
        nursery.cancel_scope.cancel()
    return forced[0] if forced else None
