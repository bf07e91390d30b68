"""OpenAI's Responses API (`POST /v1/responses`): a request becomes a chat's
GenerationRequest by the Responses API's own fields, the reply becomes a
response object or its typed stream events, and a bounded store keeps recent
conversations so that `previous_response_id` continues one without resending
it (its prefix then comes from the prefix cache like any resent history).
`responses` is the door; the rest is without I/O.
"""

from __future__ import annotations

import contextlib
import json
import time
import uuid
from typing import TYPE_CHECKING, Any, Optional

import attrs
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dgr import tools as tool_calls
from dgr.doors import chat_turn
from dgr.doors.fields import BadRequest, check_fields, json_object, read_bool
from dgr.doors.openai import ROLES, progress_timings, prompt_progress, timings
from dgr.doors.request import (GenerationRequest, chat_message, checked_chat, joined_text,
                               json_object_grammar, named_values, prompt_ending,
                               reasoning_fields, requester_of, sampling, schema_grammar,
                               tool_call)
from dgr.doors.response_store import ResponseStore
from dgr.doors.problems import ended
from dgr.doors.sse import SessionEvents, read_one, sse_event

if TYPE_CHECKING:
    from dgr.doors.context import ServerState
# the Responses API's name of each SamplingParams field it has
_SAMPLING_NAMES = {"max_output_tokens": "max_tokens", "temperature": "temperature",
                   "top_p": "top_p", "top_k": "top_k", "min_p": "min_p",
                   "repetition_penalty": "repeat_penalty", "seed": "seed", "model": "model"}
_TEXT_PARTS = {"input_text", "output_text", "text"}
# the roles an input message may have (tool results come as function_call_output items)
_ROLES = {name: role for name, role in ROLES.items() if role != "tool"}


@attrs.frozen
class ResponseRequest:
    chat: GenerationRequest  # its messages: instructions, history, this turn's input
    conversation: list[dict]  # the chat messages so far, as stored for a next turn
    store: bool
    instructions: Optional[str]
    previous_response_id: Optional[str]


def _messages(value: Any) -> list[dict]:
    """`input` as chat messages: a string (one user message) or a list of items:
    messages, and a previous answer's function calls and their outputs."""
    if isinstance(value, str):
        if not value:
            raise BadRequest("'input' must not be empty", "input")
        return [chat_message("user", value)]
    if not isinstance(value, list) or not value:
        raise BadRequest("'input' must be a string or a non-empty list of items", "input")
    messages: list[dict] = []
    for item in value:
        kind = item.get("type", "message") if isinstance(item, dict) else type(item).__name__
        if kind == "function_call":
            call = tool_call(item.get("call_id"), item.get("name"),
                             _arguments(item.get("arguments"), strict=True))
            if messages and messages[-1].get("tool_calls"):
                messages[-1]["tool_calls"].append(call)  # calls of one answer: one message
            else:
                messages.append(chat_message("assistant", "", [call]))
            continue
        if kind == "function_call_output":
            output = item.get("output")
            if not isinstance(output, str):
                raise BadRequest("a function_call_output's 'output' must be a string", "input")
            messages.append(chat_message("tool", output, answers=item.get("call_id")))
            continue
        if kind != "message":
            raise BadRequest(f"input items of type {kind!r} are not supported", "input")
        role, content = item.get("role"), item.get("content")
        if role not in _ROLES:
            raise BadRequest(f"message role {role!r} is not one of {', '.join(sorted(_ROLES))}",
                             "input")
        if isinstance(content, list):
            if not all(isinstance(p, dict) and p.get("type") in _TEXT_PARTS
                       and isinstance(p.get("text"), str) for p in content):
                raise BadRequest("only text content parts are supported", "input")
            content = joined_text([p["text"] for p in content])
        if content is None:
            content = ""
        if not isinstance(content, str):
            raise BadRequest("a message's 'content' must be a string or text parts", "input")
        messages.append(chat_message(_ROLES[role], content))
    return messages


def _arguments(text: Any, strict: bool) -> Any:
    """A function call's arguments (JSON text) as a JSON value; an answer's own,
    cut short by max_tokens, as {}."""
    try:
        return json.loads(text or "{}")
    except (TypeError, ValueError):
        if strict:
            raise BadRequest("a function_call's arguments must be JSON text", "input") from None
        return {}


def _tools(body: dict, tool_format) -> Optional[tool_calls.ToolSpec]:
    """The Responses API's function tools ({type, name, description, parameters})
    and tool_choice ("auto", "required", "none" or {type: function, name})."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None:
        if choice not in (None, "none", "auto"):
            raise BadRequest("'tool_choice' needs 'tools'", "tool_choice")
        return None
    if not isinstance(tools, list) or not all(isinstance(t, dict) and t.get("type") == "function"
                                              for t in tools):
        raise BadRequest("'tools' must be a list of function tools", "tools")
    if isinstance(choice, dict):
        choice = {"name": choice.get("name") if choice.get("type") == "function" else None}
    try:
        return tool_calls.tool_spec(tools, choice, body.get("parallel_tool_calls", True),
                                    tool_format)
    except tool_calls.ToolsError as exc:
        raise BadRequest(str(exc), exc.field) from None


def _grammar(text: Any) -> Optional[str]:
    """`text.format`'s grammar: none for text, JSON for json_object, a schema's."""
    if text is None:
        return None
    if not isinstance(text, dict) or not isinstance(text.get("format", {}), dict):
        raise BadRequest("'text' must be an object with a 'format' object", "text")
    fmt = text.get("format") or {"type": "text"}
    if fmt.get("type") == "text":
        return None
    if fmt.get("type") == "json_object":
        return json_object_grammar()
    if fmt.get("type") == "json_schema":
        return schema_grammar(fmt.get("schema"), "'text.format.schema'", "text")
    raise BadRequest("'text.format.type' must be text, json_object or json_schema", "text")


def parse_response_request(body: Any, store: ResponseStore,
                           tool_format=None) -> ResponseRequest:
    """A Responses API body, its earlier turns from `store` (tools in `tool_format`)."""
    body = json_object(body)
    check_fields(body, "/v1/responses")
    previous_id = body.get("previous_response_id")
    history: list[dict] = []
    if previous_id is not None:
        if not isinstance(previous_id, str):
            raise BadRequest("'previous_response_id' must be a string", "previous_response_id")
        history = store.get(previous_id)
        if history is None:
            raise BadRequest(f"no stored response {previous_id!r} (unknown, not stored, or "
                             "evicted)", "previous_response_id")
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise BadRequest("'instructions' must be a string", "instructions")
    conversation = [*history, *_messages(body.get("input"))]
    # a later turn continues the conversation, without this turn's instructions
    messages = checked_chat(([chat_message("system", instructions)] if instructions else [])
                            + conversation, "input")
    tools, grammar = _tools(body, tool_format), _grammar(body.get("text"))
    if tools is not None and grammar is not None:
        raise BadRequest("'tools' cannot be combined with a 'text.format' other than text",
                         "tools")
    params = sampling(named_values(body, _SAMPLING_NAMES),
                      grammar=tools.format.grammar(tools) if tools is not None else grammar)
    stored = body.get("store", True)
    if not isinstance(stored, bool):
        raise BadRequest("'store' must be a boolean", "store")
    effort = body.get("reasoning") or {}  # OpenAI's {"effort"}; no summaries are written
    if not isinstance(effort, dict) or {k for k, v in effort.items() if v is not None} - {
            "effort"}:
        raise BadRequest("'reasoning' takes 'effort' only (the thinking itself is returned, "
                         "not a summary)", "reasoning")
    chat = GenerationRequest(params, messages=messages, tools=tools,
                             effort=reasoning_fields({}, effort.get("effort"))["effort"],
                             stream=read_bool(body, "stream"),
                             timings_per_token=read_bool(body, "timings_per_token"),
                             return_progress=read_bool(body, "return_progress"),
                             **prompt_ending(messages))
    return ResponseRequest(chat, conversation, stored, instructions, previous_id)


class ResponsesBuilder:
    """One response's object and stream events, from its answer's parts
    (dgr.doors.chat_turn)."""

    def __init__(self, model: str, request: ResponseRequest, reader: chat_turn.ChoiceReader):
        self.id = "resp_" + uuid.uuid4().hex
        self.item_id = "msg_" + uuid.uuid4().hex
        self.reasoning_id = "rs_" + uuid.uuid4().hex
        # the answer's reader (its thinking and calls so far); a plain answer (no
        # thinking split off, no tools) opens its message at once, else a thinking
        # model's thinking comes first, as a reasoning item (streamed: the output index
        # of the items after it), and the answer says what follows
        self._reader = reader
        self._base = 0
        self._message_opened = False
        self.created_at = int(time.time())
        self.model = model
        self._request = request
        self._sequence = 0
        self.extra: dict = {}  # fields every event carries from now on (llama-server's timings)
        # with tools: the ids of the answer's function_call items, and the item being
        # streamed (its kind and index)
        self._call_items: list[str] = []
        self._open: Optional[tuple[str, int]] = None

    def answer(self, choice: chat_turn.WholeChoice) -> tuple[list[dict], dict]:
        """The output items of the model's whole answer and the assistant message a
        next turn continues from: a thinking model's reasoning item, then a message,
        or (with tools) function calls (their ids made once: the stream, the
        response and the stored conversation share them)."""
        first = [self.reasoning_item("completed", choice.thought)] if choice.thought else []
        if not choice.calls:
            content = choice.content or ""
            return first + [self.item("completed", content)], chat_message("assistant", content)
        items = first + [self._call_item(i, call, "completed")
                         for i, call in enumerate(choice.calls)]
        return items, chat_message("assistant", "", [
            tool_call(call["id"], call["function"]["name"],
                      _arguments(call["function"]["arguments"], strict=False))
            for call in choice.calls])

    def _call_item(self, index: int, call: dict, status: str) -> dict:
        while len(self._call_items) <= index:
            self._call_items.append("fc_" + uuid.uuid4().hex)
        return {"type": "function_call", "id": self._call_items[index], "status": status,
                "call_id": call["id"], "name": call["function"]["name"],
                "arguments": call["function"]["arguments"] if status == "completed" else ""}

    def response(self, status: str, choice: Optional[chat_turn.WholeChoice] = None,
                 finish_reason: Optional[str] = None, usage: Optional[dict] = None) -> dict:
        params, spec = self._request.chat.params, self._request.chat.tools
        output = [] if choice is None else self.answer(choice)[0]
        incomplete = None
        if status == "completed" and finish_reason == "length":
            status, incomplete = "incomplete", {"reason": "max_output_tokens"}
        return {"id": self.id, "object": "response", "created_at": self.created_at,
                "status": status, "model": self.model, "output": output,
                "instructions": self._request.instructions,
                "previous_response_id": self._request.previous_response_id,
                "incomplete_details": incomplete, "error": None, "metadata": {},
                "max_output_tokens": params.max_tokens, "temperature": params.temperature,
                "top_p": params.top_p, "store": self._request.store, "usage": usage,
                "parallel_tool_calls": spec.parallel if spec else False,
                "tool_choice": "none" if spec is None else spec.choice if spec.choice in (
                    "auto", "required") else {"type": "function", "name": spec.choice},
                "tools": [{"type": "function", **t} for t in spec.tools] if spec else []}

    def reasoning_item(self, status: str, text: Optional[str]) -> dict:
        """The thinking, as OpenAI's reasoning item carries a model's own reasoning text."""
        content = [] if text is None else [{"type": "reasoning_text", "text": text}]
        return {"type": "reasoning", "id": self.reasoning_id, "status": status, "summary": [],
                "content": content}

    def item(self, status: str, text: Optional[str]) -> dict:
        content = [] if text is None else [self.part(text)]
        return {"type": "message", "id": self.item_id, "status": status, "role": "assistant",
                "content": content}

    @staticmethod
    def part(text: str) -> dict:
        return {"type": "output_text", "text": text, "annotations": []}

    @staticmethod
    def usage(input_tokens: int, output_tokens: int, cached_tokens: int,
              reasoning_tokens: int = 0) -> dict:
        return {"input_tokens": input_tokens, "output_tokens": output_tokens,
                "total_tokens": input_tokens + output_tokens,
                "input_tokens_details": {"cached_tokens": cached_tokens},
                "output_tokens_details": {"reasoning_tokens": reasoning_tokens}}

    def event(self, kind: str, **fields) -> str:
        """One server-sent event of the stream (its `event:` line names its type)."""
        payload = {"type": kind, "sequence_number": self._sequence, **fields, **self.extra}
        self._sequence += 1
        return sse_event(payload, kind)

    def opening(self) -> list[str]:
        started = [self.event("response.created", response=self.response("in_progress")),
                   self.event("response.in_progress", response=self.response("in_progress"))]
        if not self._reader.plain:
            return started  # the answer says which output items follow
        return started + self._open_message(0)

    def _open_message(self, index: int) -> list[str]:
        self._open = ("message", index)
        self._message_opened = True
        return [self.event("response.output_item.added", item=self.item("in_progress", None),
                           output_index=index),
                self.event("response.content_part.added", item_id=self.item_id,
                           output_index=index, content_index=0, part=self.part(""))]

    def delta(self, parts: list) -> list[str]:
        """The events of an answer's parts: a thinking model's thinking, a reasoning
        item's text; answer text, a message's text delta; a function call's item once
        its name is read, then its arguments' pieces."""
        events = []
        for part in parts:
            if isinstance(part, chat_turn.Thought):
                if self._open is None:
                    self._open, self._base = ("reasoning", 0), 1
                    events.append(self.event("response.output_item.added", output_index=0,
                                             item=self.reasoning_item("in_progress", None)))
                events.append(self.event("response.reasoning_text.delta", output_index=0,
                                         item_id=self.reasoning_id, content_index=0,
                                         delta=part.text))
            elif isinstance(part, chat_turn.Answer):
                events += self._text_delta(self._base, part.text)
            elif isinstance(part, tool_calls.CallStarted):
                events += self._close_open()
                call = {"id": part.id, "function": {"name": part.name}}
                self._open = ("call", self._base + part.index)
                events.append(self.event("response.output_item.added",
                                         output_index=self._base + part.index,
                                         item=self._call_item(part.index, call, "in_progress")))
            else:
                events.append(self.event("response.function_call_arguments.delta",
                                         item_id=self._call_items[part.index],
                                         output_index=self._base + part.index, delta=part.text))
        return events

    def _text_delta(self, index: int, text: str) -> list[str]:
        events = self._close_open() if self._open and self._open[0] == "reasoning" else []
        events += self._open_message(index) if self._open is None else []
        return events + [self.event("response.output_text.delta", item_id=self.item_id,
                                    output_index=index, content_index=0, delta=text)]

    def _close_open(self, output: Optional[list[dict]] = None) -> list[str]:
        """The done events of the item being streamed, as it ends up in `output`
        (the final response's items; None only for a call whose next call has
        begun: an answer is calls or a text, never a text then calls)."""
        if self._open is None:
            return []
        kind, index = self._open
        self._open = None
        if kind == "reasoning":
            item = self.reasoning_item("completed", self._reader.thought)
            return [self.event("response.reasoning_text.done", item_id=self.reasoning_id,
                               output_index=0, content_index=0, text=self._reader.thought),
                    self.event("response.output_item.done", item=item, output_index=0)]
        if kind == "message":
            item = output[index]
            text = item["content"][0]["text"]
            where = {"item_id": self.item_id, "output_index": index, "content_index": 0}
            return [self.event("response.output_text.done", text=text, **where),
                    self.event("response.content_part.done", part=self.part(text), **where),
                    self.event("response.output_item.done", item=item, output_index=index)]
        item = self._call_item(index - self._base, self._reader.calls[index - self._base],
                               "completed")
        return [self.event("response.function_call_arguments.done", item_id=item["id"],
                           output_index=index, arguments=item["arguments"]),
                self.event("response.output_item.done", output_index=index, item=item)]

    def closing(self, choice: chat_turn.WholeChoice, finish_reason: str,
                usage: dict) -> list[str]:
        """The last events, once the answer's final part is written (`delta`)."""
        final = self.response("completed", choice, finish_reason, usage)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        events = []
        if self._open is not None and self._open[0] == "reasoning":
            events += self._close_open()
        if not self._message_opened and not choice.calls:
            events += self._open_message(self._base)  # an answer with no text
        return events + self._close_open(final["output"]) + [self.event(kind, response=final)]


async def responses(request: Request, server: "ServerState") -> Response:
    """One chat session, answered whole or as the Responses API's events."""
    node = server.ready_node()
    store = server.responses
    body = await server.read_body(request, "/v1/responses")
    parsed = parse_response_request(body, store, node.tool_format)
    parsed = attrs.evolve(parsed, chat=attrs.evolve(
        parsed.chat, requester=requester_of(request, body.get("user"), body.get("priority"))))
    turn = chat_turn.render(node, parsed.chat, server.config, "input")
    ids = await turn.tokens(node)
    chat = turn.request
    reader = turn.reader()
    builder = ResponsesBuilder(server.model_name(chat.params), parsed, reader)

    def finished(choice: chat_turn.WholeChoice, chunks, generated: int) -> dict:
        usage = builder.usage(chunks.prompt_tokens, generated, chunks.cached_tokens,
                              choice.thought_tokens)
        if parsed.store:
            store.put(builder.id, parsed.conversation + [builder.answer(choice)[1]])
        return usage

    opened = contextlib.AsyncExitStack()
    chunks, = await opened.enter_async_context(turn.sessions(node, ids))
    if chat.stream:

        async def produce(emit) -> None:
            for event in builder.opening():
                await emit(event)
            generated = 0
            started = None  # the first progress report's time
            while batch := await chunks.next_chunks():
                for chunk in batch:
                    if chunk.progress is not None:  # llama-server's return_progress
                        started = started or chunk.progress.at
                        timing = ({"timings": progress_timings(chunk.progress, started)}
                                  if chat.timings_per_token else {})
                        await emit(builder.event(
                            "response.in_progress", response=builder.response("in_progress"),
                            prompt_progress=prompt_progress(chunk.progress, started), **timing))
                        continue
                    if chunk.token_id is not None:
                        generated += 1
                        request.scope["dgr.tokens"] = generated
                    if chat.timings_per_token:  # llama-server's: on each event from here on
                        builder.extra = {"timings": timings(chunks)}
                    if chunk.finish_reason != "error":
                        for event in builder.delta(reader.feed(
                                chunk.text, chunk.token_id is not None,
                                chunk.finish_reason is not None)):
                            await emit(event)
            problem = ended([chunks])
            if problem is not None:
                await emit(builder.event("error", code=problem.code, message=problem.message))
                return
            choice = reader.result()
            for event in builder.closing(choice, chunks.finish_reason,
                                         finished(choice, chunks, generated)):
                await emit(event)

        return SessionEvents(produce, close=opened.aclose)
    try:
        got = await read_one(request, chunks)
    finally:
        await opened.aclose()
    choice = reader.whole(got)
    generated = sum(chunk.token_id is not None for chunk in got)
    return JSONResponse(builder.response("completed", choice, chunks.finish_reason,
                                         finished(choice, chunks, generated)))
