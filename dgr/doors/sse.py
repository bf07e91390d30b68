"""An admitted session's output over HTTP, for every door: as server-sent events
while it is generated (SessionEvents), or read whole before the answer goes out
(read_whole). Either way a client that disconnects cancels its session, and no
admitted session outlives its response; how a session that failed or was
cancelled ends (`ending`) is decided here once, each door rendering it in its
protocol's shape.
"""

from __future__ import annotations

import json
from typing import Optional

import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dgr.doors.fields import error_body


def error_response(status: int, message: str, kind: str, code: Optional[str] = None,
                   param: Optional[str] = None, headers: Optional[dict] = None) -> JSONResponse:
    """An OpenAI-style error body with its status."""
    return JSONResponse(error_body(message, kind, code, param), status_code=status, headers=headers)


class SessionEvents(Response):
    """Server-sent events of one admitted session.

    The session is admitted before this response exists, so a refusal is a real
    status code. Whatever happens once the response is handed to the server
    (the stream ends, the client disconnects, the server stops), `close`
    releases the session: no admitted session outlives its response."""

    def __init__(self, produce, close):
        self.status_code = 200
        self.background = None
        self.raw_headers = [(b"content-type", b"text/event-stream; charset=utf-8"),
                            (b"cache-control", b"no-cache")]
        self.produce = produce  # async (emit) -> None: emits the events' text
        self.close = close

    async def __call__(self, scope, receive, send) -> None:
        async def emit(event: str) -> None:
            await send({"type": "http.response.body", "body": event.encode(), "more_body": True})

        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(cancel_on_disconnect, receive, nursery.cancel_scope)
                await send({"type": "http.response.start", "status": 200,
                            "headers": self.raw_headers})
                await self.produce(emit)
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                nursery.cancel_scope.cancel()
        except OSError:
            pass  # the client went away while we wrote
        finally:
            with trio.CancelScope(shield=True):
                await self.close()


async def read_whole(request: Request, streams, collect) -> Optional[Response]:
    """Read every stream to its end with `collect(index, chunks)`, cancelling them
    all if the client leaves. Returns what to send instead of the answer (499: the
    client left, 500: the model failed, 503: cancelled by a shutdown), or None."""
    gone = trio.Event()

    async def watch(scope):
        await cancel_on_disconnect(request.receive, scope)
        gone.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(watch, nursery.cancel_scope)
        async with trio.open_nursery() as collectors:
            for i, chunks in enumerate(streams):
                collectors.start_soon(collect, i, chunks)
        nursery.cancel_scope.cancel()
    if gone.is_set():
        # nobody reads this; the status is for the log line (nginx's "client closed request")
        return Response(status_code=499)
    ended = ending(streams)
    if ended is not None:
        status, message, code = ended
        return error_response(status, message, "server_error", code)
    return None


async def read_one(request: Request, chunks, tokens: list[int],
                   rows: Optional[list] = None) -> tuple[str, Optional[Response]]:
    """One session's whole answer (read_whole): its text, with its token ids appended
    to `tokens` (and their chunks to `rows`), and what to send instead of the
    answer (or None)."""
    texts: list[str] = []

    async def collect(_, stream):
        got = await stream.read_all()
        texts.extend(chunk.text for chunk in got)
        tokens.extend(chunk.token_id for chunk in got if chunk.token_id is not None)
        if rows is not None:
            rows.extend(chunk for chunk in got if chunk.token_id is not None)
        request.scope["dgr.tokens"] = len(tokens)

    instead = await read_whole(request, [chunks], collect)
    return "".join(texts), instead


def ending(streams) -> Optional[tuple[int, str, str]]:
    """(HTTP status, message, code) when a session of `streams` (ended) failed
    or was cancelled by a shutdown, else None; a failure wins."""
    failed = next((c for c in streams if c.finish_reason == "error"), None)
    if failed is not None:
        return 500, failed.error, "model_failed"
    if any(c.finish_reason == "cancelled" for c in streams):
        return 503, "the session was cancelled (server shutting down)", "cancelled"
    return None


async def cancel_on_disconnect(receive, scope: trio.CancelScope) -> None:
    """A client that goes away cancels its session (streamed or not)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


def sse_event(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"
