"""The OpenAI completions and chat completions doors: a body into its sessions
(dgr.doors.openai; a chat through dgr.doors.chat_turn), admitted together, their
output as one response or as stream chunks, each naming its choice."""

from __future__ import annotations

import contextlib
import json
from typing import Optional

import attrs
import trio
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dgr.doors import chat_turn
from dgr.doors.context import ServerState
from dgr.doors.openai import (CompletionBuilder, parse_chat, parse_completion, progress_timings,
                             prompt_progress, timings)
from dgr.doors.problems import ended, model_failed, openai_error
from dgr.doors.request import requester_of
from dgr.doors.sse import SSE_DONE, SessionEvents, read_whole, sse_event
from dgr.node import Node
from dgr.spec import Requester
from dgr.stream import Chunk


async def completions(request: Request, server: ServerState) -> Response:
    node = server.ready_node()
    body = await server.read_body(request, "/v1/completions")
    parsed = attrs.evolve(parse_completion(body), requester=openai_requester(request, body))
    sessions = node.stream_group(parsed.prompts, parsed.params, parsed.n,
                                 whole=not parsed.stream,
                                 progress=parsed.stream and parsed.return_progress,
                                 requester=parsed.requester)
    return await _generate(request, server, node, parsed, parsed.prompts, sessions)


async def chat_completions(request: Request, server: ServerState) -> Response:
    node = server.ready_node()
    body = await server.read_body(request, "/v1/chat/completions")
    parsed = attrs.evolve(parse_chat(body, node.tool_format),
                          requester=openai_requester(request, body))
    turn = chat_turn.render(node, parsed, server.config)
    ids = await turn.tokens(node)
    # llama-server's `verbose`: the answer shows the prompt the chat became
    shown = ({"__verbose": {"prompt": turn.prompt}}
             if parsed.verbose or server.config.echo_prompts else {})
    return await _generate(request, server, node, turn.request, [ids], turn.sessions(node, ids),
                           shown, turn)


def openai_requester(request: Request, body) -> Requester:
    """An OpenAI-shaped body's requester: its `user` and `priority` (vLLM's)."""
    return requester_of(request, body.get("user"), body.get("priority"))


async def _generate(request: Request, server: ServerState, node: Node, parsed,
                    prompts: list, sessions, extra: Optional[dict] = None,
                    turn: Optional[chat_turn.ChatTurn] = None) -> Response:
    """One choice per prompt and sample (n), admitted together (`sessions`, not yet
    entered: dgr.Node.stream_group or a chat turn's); `extra`: fields a whole answer
    carries besides; `turn`: a chat's (dgr.doors.chat_turn)."""
    builder = CompletionBuilder(server.model_name(parsed.params), parsed.chat, node.token_text,
                                node.token_bytes, parsed.top_logprobs,
                                turn is not None and turn.thinking.split)
    # echo: each choice's text begins with its prompt (choice i samples prompt i // n)
    echoes = [(p if isinstance(p, str) else node.detokenize(p)) if parsed.echo else ""
              for p in prompts for _ in range(parsed.n)]
    if parsed.stream:
        # Admission happens before the 200 goes out, so a refusal is a real status code.
        opened = contextlib.AsyncExitStack()
        streams = await opened.enter_async_context(sessions)
        return SessionEvents(
            lambda emit: completion_events(request, streams, builder, parsed, echoes, emit, turn),
            close=opened.aclose)
    got: list[list[Chunk]] = [[] for _ in echoes]

    async def collect(i, chunks):
        got[i] = await chunks.read_all()
        request.scope["dgr.tokens"] = sum(
            chunk.token_id is not None for choice in got for chunk in choice)

    async with sessions as streams:
        await read_whole(request, streams, collect)
    reasons = [chunks.finish_reason for chunks in streams]
    rows = [[chunk for chunk in choice if chunk.token_id is not None] for choice in got]
    answers = ([turn.reader().whole(choice) for choice in got] if turn is not None else
               [echo + "".join(chunk.text for chunk in choice)
                for echo, choice in zip(echoes, got)])
    return JSONResponse(builder.full(
        list(zip(answers, rows, reasons)), prompt_tokens(streams, parsed.n), sum(map(len, rows)),
        cached_tokens(streams, parsed.n),
        [scored_prompt(c) for c in streams] if scores_prompt(parsed) else None)
        | {"timings": timings(streams[0])} | (extra or {}))


def prompt_tokens(streams, n: int) -> int:
    """Usage: each prompt's tokens once, however many samples it has (OpenAI's count)."""
    return sum(chunks.prompt_tokens for chunks in streams[::n])


def scores_prompt(parsed) -> bool:
    return parsed.echo and parsed.params.prompt_logprobs is not None


def scored_prompt(chunks) -> list:
    """(token id, (logprob, alternatives) or None) for each prompt token."""
    return list(zip(chunks.session.spec.prompt, chunks.prompt_logprobs))


def cached_tokens(streams, n: int) -> int:
    """Usage: of those, the tokens whose KV was reused, not computed (a prompt's
    first sample's; the others share its prefill)."""
    return sum(chunks.cached_tokens for chunks in streams[::n])



class TextEvents:
    """The events of deltas that carry text alone (no log-probabilities, not a
    choice's first, not its last), as `sse_event(builder.delta(text, ...))` writes
    them: the choice's event is made once around a mark, and a token's event is
    the text's JSON between its two halves, a fraction of the cost of encoding the
    whole chunk object each token."""

    _MARK = "\x00"  # JSON "\u0000", found nowhere else in an event (checked)

    def __init__(self, builder: CompletionBuilder):
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


async def completion_events(request, streams, builder: CompletionBuilder, parsed, echoes,
                            emit, turn: Optional[chat_turn.ChatTurn] = None) -> None:
    """The choices' chunks as they come, each event naming its choice's index; a
    choice's first event carries its echo; a chat's choices are read into parts
    (dgr.doors.chat_turn). The events of the chunks there were to take at once go
    out in one write."""
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
        first = set(range(len(streams)))  # choices whose first text is still to come
        if builder.chat:  # each choice's role first, as llama-server and OpenAI stream it
            await emit("".join(sse_event(builder.role_chunk(i)) for i in range(len(streams))))

        def timing(index):  # llama-server's timings_per_token
            return timings(streams[index]) if parsed.timings_per_token else None

        progress_started: dict = {}  # each choice's first report's time

        text_event = TextEvents(builder)
        # a chat's: each choice's reader (its thinking, answer and tool calls)
        readers = [turn.reader() for _ in streams] if turn is not None else None
        if readers is not None and readers[0].plain:
            readers = None
        events: list[str] = []  # the events of one batch of chunks
        async with merged as receive:
            async for batch in receive:
                for index, chunk in batch:
                    if chunk.progress is not None:
                        started = progress_started.setdefault(index, chunk.progress.at)
                        events.append(sse_event(builder.progress_chunk(
                            prompt_progress(chunk.progress, started),
                            progress_timings(chunk.progress, started)
                            if parsed.timings_per_token else None)))
                        continue
                    if chunk.token_id is not None:
                        completion += 1
                    if chunk.finish_reason == "error":
                        events.append(sse_event(openai_error(model_failed(chunk.error))))
                        failed = True
                        break
                    answer = chunk.text
                    if readers is not None:
                        reader = readers[index]
                        answer = ""
                        for part in reader.feed(chunk.text, chunk.token_id is not None,
                                                chunk.finish_reason is not None):
                            if isinstance(part, chat_turn.Thought):
                                events.append(sse_event(builder.reasoning_chunk(part.text, index)))
                            elif parsed.tools is not None:
                                events.append(sse_event(builder.tool_delta(part, index)))
                            else:
                                answer += part.text
                        if parsed.tools is not None:
                            if chunk.finish_reason is not None:
                                events.append(sse_event(builder.finish_chunk(
                                    index, "tool_calls" if reader.tool_use
                                    else chunk.finish_reason)))
                            continue
                    rows = [chunk] if chunk.token_id is not None else []
                    text = echoes[index] + answer if index in first else answer
                    if (index not in first and text and not parsed.timings_per_token
                            and (not rows or rows[0].top_logprobs is None)):
                        events.append(text_event(text, index))
                    elif text or rows or index in first:
                        # a scored prompt is complete before the choice's first chunk
                        prompt = (scored_prompt(streams[index])
                                  if index in first and scores_prompt(parsed) else None)
                        events.append(sse_event(builder.delta(
                            text, rows, None, timing=timing(index), index=index, prompt=prompt)))
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
    problem = None if failed else ended(streams)  # after a failure its event said it all
    if problem is not None:
        await emit(sse_event(openai_error(problem)))
    elif not failed and parsed.include_usage:
        thought_tokens = sum(reader.thought_tokens for reader in readers or ())
        await emit(sse_event(builder.usage_chunk(prompt_tokens(streams, parsed.n), completion,
                                                 cached_tokens(streams, parsed.n), thought_tokens)
                             | {"timings": timings(streams[0])}))
    await emit(SSE_DONE)
