"""An admitted session's output over HTTP: as server-sent events while it is
generated (SessionEvents, completion_events), or read whole before the answer
goes out (read_whole). Either way a client that disconnects cancels its session,
and no admitted session outlives its response. The endpoints are dgr/server.py.
"""

from __future__ import annotations

import contextlib
import json
from typing import Optional

import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dgr.openai import ResponseBuilder, error_body


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
    failed = next((c for c in streams if c.finish_reason == "error"), None)
    if failed is not None:
        return error_response(500, failed.error, "server_error", "model_failed")
    if any(c.finish_reason == "cancelled" for c in streams):
        return error_response(503, "the session was cancelled (server shutting down)",
                              "server_error", "cancelled")
    return None


async def cancel_on_disconnect(receive, scope: trio.CancelScope) -> None:
    """A client that goes away cancels its session (streamed or not)."""
    while (await receive())["type"] != "http.disconnect":
        pass
    scope.cancel()


def prompt_tokens(streams, n: int) -> int:
    """Usage: each prompt's tokens once, however many samples it has (OpenAI's count)."""
    return sum(chunks.prompt_tokens for chunks in streams[::n])


def scores_prompt(parsed) -> bool:
    return parsed.echo and parsed.params.prompt_logprobs is not None


def scored_prompt(chunks) -> list:
    """(token id, (logprob, alternatives) or None) for each prompt token."""
    return list(zip(chunks.session.prompt, chunks.prompt_logprobs))


def cached_tokens(streams, n: int) -> int:
    """Usage: of those, the tokens whose KV was reused, not computed (a prompt's
    first sample's; the others share its prefill)."""
    return sum(chunks.cached_tokens for chunks in streams[::n])


def sse_event(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


class TextEvents:
    """The events of deltas that carry text alone (no log-probabilities, not a
    choice's first, not its last), as `sse_event(builder.delta(text, ...))` writes
    them: the choice's event is made once around a mark, and a token's event is
    the text's JSON between its two halves (0.8 us an event, where encoding the
    whole chunk object took 3.5-3.9: evidence/DGR-025, sse_cost.py)."""

    _MARK = "\x00"  # JSON "\u0000", found nowhere else in an event (checked)

    def __init__(self, builder: ResponseBuilder):
        self._builder = builder
        self._halves: dict[int, Optional[tuple[str, str]]] = {}

    def __call__(self, text: str, index: int) -> str:
        halves = self._halves.get(index, False)
        if halves is False:
            event = sse_event(self._builder.delta(self._MARK, [], index=index))
            mark = json.dumps(self._MARK)
            halves = self._halves[index] = (tuple(event.split(mark))
                                            if event.count(mark) == 1 else None)
        if halves is None:
            return sse_event(self._builder.delta(text, [], index=index))
        return halves[0] + json.dumps(text, ensure_ascii=False) + halves[1]


async def completion_events(request, streams, builder: ResponseBuilder, parsed, echoes,
                            emit) -> None:
    """The choices' chunks as they come, each event naming its choice's index; a
    choice's first event carries its echo. The events of the chunks there were
    to take at once go out in one write."""
    completion, failed = 0, False

    async def forward(index, chunks, send):
        async with send:
            while batch := await chunks.next_chunks():
                await send.send([(index, chunk) for chunk in batch])

    async def single(chunks):  # one choice: no task in between (one hop less per token)
        while batch := await chunks.next_chunks():
            yield [(0, chunk) for chunk in batch]

    async with trio.open_nursery() as nursery:
        if len(streams) == 1:
            merged = contextlib.aclosing(single(streams[0]))
        else:
            send, merged = trio.open_memory_channel(0)
            async with send:
                for index, chunks in enumerate(streams):
                    nursery.start_soon(forward, index, chunks, send.clone())
        first = set(range(len(streams)))
        text_event = TextEvents(builder)
        readers: dict = {}  # with tools: each choice's answer reader
        events: list[str] = []  # the events of one batch of chunks
        async with merged as receive:
            async for batch in receive:
                for index, chunk in batch:
                    if chunk.token_id is not None:
                        completion += 1
                    if parsed.tools is not None and chunk.finish_reason != "error":
                        if index not in readers:
                            readers[index] = parsed.tools.format.reader()
                        reader = readers[index]
                        objs = builder.tool_deltas(reader.feed(chunk.text), index,
                                                   first=index in first)
                        if objs:
                            first.discard(index)
                        if chunk.finish_reason is not None:
                            objs += builder.tool_finish(reader, chunk.finish_reason, index,
                                                        first=index in first)
                        events.extend(sse_event(obj) for obj in objs)
                        continue
                    rows = [chunk] if chunk.token_id is not None else []
                    if chunk.finish_reason == "error":
                        events.append(sse_event(error_body(chunk.error, "server_error",
                                                           "model_failed")))
                        failed = True
                        break
                    text = echoes[index] + chunk.text if index in first else chunk.text
                    if index not in first and text and (not rows or rows[0].top_logprobs is None):
                        events.append(text_event(text, index))
                    elif text or rows or index in first:
                        # a scored prompt is complete before the choice's first chunk
                        prompt = (scored_prompt(streams[index])
                                  if index in first and scores_prompt(parsed) else None)
                        events.append(sse_event(builder.delta(text, rows, None,
                                                              first=index in first,
                                                              index=index, prompt=prompt)))
                        first.discard(index)
                    if chunk.finish_reason is not None:
                        events.append(sse_event(builder.delta("", [], chunk.finish_reason,
                                                              index=index)))
                request.scope["dgr.tokens"] = completion
                if events:
                    await emit("".join(events))
                    events.clear()
                if failed:
                    break
        nursery.cancel_scope.cancel()  # the other choices' forwarders, after a failure
    if failed:
        pass  # the error event said it all; [DONE] still ends the stream
    elif any(chunks.finish_reason == "cancelled" for chunks in streams):
        await emit(sse_event(error_body("the session was cancelled (server shutting down)",
                                        "server_error", "cancelled")))
    elif parsed.include_usage:
        await emit(sse_event(builder.usage_chunk(prompt_tokens(streams, parsed.n), completion,
                                                 cached_tokens(streams, parsed.n))))
    await emit("data: [DONE]\n\n")
