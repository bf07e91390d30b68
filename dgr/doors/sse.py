"""An admitted session's output over HTTP, for every door: as server-sent events
while it is generated (SessionEvents, each event framed by `sse_event`), or read
whole before the answer goes out (read_whole). Either way a client that
disconnects cancels its session, and no admitted session outlives its response;
a session that failed or was cancelled ends as dgr.doors.problems decides, each
door rendering it in its protocol's shape.
"""

from __future__ import annotations

import json
from typing import Optional

import trio
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from dgr.doors.problems import SessionEnded, ended

# the end of an OpenAI-style stream
SSE_DONE = "data: [DONE]\n\n"


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


async def read_whole(request: Request, streams, collect) -> None:
    """Read every stream to its end with `collect(index, chunks)`, cancelling them
    all if the client leaves. Raises ClientDisconnect if it left, SessionEnded if
    a session failed or was cancelled by a shutdown."""
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
        raise ClientDisconnect()
    problem = ended(streams)
    if problem is not None:
        raise SessionEnded(problem)


async def read_one(request: Request, stream) -> list:
    """One session's whole answer (read_whole): its chunks (dgr.stream.Chunk)."""
    got: list = []

    async def collect(_, chunks):
        got.extend(await chunks.read_all())
        request.scope["dgr.tokens"] = sum(chunk.token_id is not None for chunk in got)

    await read_whole(request, [stream], collect)
    return got


async def cancel_on_disconnect(receive, scope: trio.CancelScope) -> None:
    """A client that goes away cancels its session (streamed or not)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


def sse_event(obj, event: Optional[str] = None) -> str:
    """One server-sent event: `obj` as JSON (text as it is, not escaped), under
    the event name `event` where the protocol names its events."""
    named = f"event: {event}\n" if event is not None else ""
    return f"{named}data: {json.dumps(obj, ensure_ascii=False)}\n\n"
