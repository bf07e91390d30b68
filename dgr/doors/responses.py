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
from dgr.doors.fields import BadRequest, check_fields, json_object, read_bool
from dgr.doors.openai import ROLES, progress_timings, prompt_progress, timings
from dgr.doors.request import (GenerationRequest, chat_message, checked_chat, joined_text,
                               json_object_grammar, named_values, prompt_ending,
                               reasoning_fields, sampling, schema_grammar, tool_call)
from dgr.doors.prompts import Thinking, thinking_prompt
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
    """One response's object and stream events."""

    def __init__(self, model: str, request: ResponseRequest, thinking: Thinking = Thinking()):
        self.id = "resp_" + uuid.uuid4().hex
        self.item_id = "msg_" + uuid.uuid4().hex
        self.reasoning_id = "rs_" + uuid.uuid4().hex
        # a thinking model's thinking, split off into a reasoning item that comes first
        # (streamed: its splitter, and the output index of the items after it)
        self._thinking = thinking
        self._splitter = thinking.splitter() if thinking.split else None
        self._base = 0
        self._thought_text = ""
        self._message_opened = False
        self.created_at = int(time.time())
        self.model = model
        self._request = request
        self._sequence = 0
        self.extra: dict = {}  # fields every event carries from now on (llama-server's timings)
        # with tools, the answer as read so far (streamed: piece by piece), the ids of
        # its function_call items, and the item being streamed (its kind and index)
        spec = request.chat.tools
        self._reader = spec.format.reader() if spec is not None else None
        self._call_items: list[str] = []
        self._open: Optional[tuple[str, int]] = None

    def answer(self, text: str) -> tuple[list[dict], dict]:
        """The output items of the model's whole answer and the assistant message a
        next turn continues from: a thinking model's reasoning item, then a message,
        or (with tools) function calls (their ids made once: the stream, the
        response and the stored conversation share them)."""
        first = []
        if self._thinking.split:
            thought, text = self._thinking.splitting.split(text)
            first = [self.reasoning_item("completed", thought)] if thought else []
        if self._reader is None:
            return first + [self.item("completed", text)], chat_message("assistant", text)
        if self._reader.text != text:  # unstreamed: read whole here
            self._reader.feed(text[len(self._reader.text):])
        content, calls = self._reader.result()
        if not calls:
            return first + [self.item("completed", content)], chat_message("assistant", content)
        items = first + [self._call_item(i, call, "completed") for i, call in enumerate(calls)]
        return items, chat_message("assistant", "", [
            tool_call(call["id"], call["function"]["name"],
                      _arguments(call["function"]["arguments"], strict=False)) for call in calls])

    def _call_item(self, index: int, call: dict, status: str) -> dict:
        while len(self._call_items) <= index:
            self._call_items.append("fc_" + uuid.uuid4().hex)
        return {"type": "function_call", "id": self._call_items[index], "status": status,
                "call_id": call["id"], "name": call["function"]["name"],
                "arguments": call["function"]["arguments"] if status == "completed" else ""}

    def response(self, status: str, text: Optional[str] = None,
                 finish_reason: Optional[str] = None, usage: Optional[dict] = None) -> dict:
        params, spec = self._request.chat.params, self._request.chat.tools
        output = [] if text is None else self.answer(text)[0]
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
        if self._reader is not None or self._splitter is not None:
            return started  # the answer says which output items follow
        return started + self._open_message(0)

    def _open_message(self, index: int) -> list[str]:
        self._open = ("message", index)
        self._message_opened = True
        return [self.event("response.output_item.added", item=self.item("in_progress", None),
                           output_index=index),
                self.event("response.content_part.added", item_id=self.item_id,
                           output_index=index, content_index=0, part=self.part(""))]

    def delta(self, text: str, final: bool = False) -> list[str]:
        """The events a piece of the model's text makes (`final`: the last): a
        thinking model's thinking, a reasoning item's text; then without tools, a
        text delta; with tools, what the answer read so far adds (a text delta of a
        text answer, a function call's item once its name is read, then its
        arguments' pieces)."""
        events = []
        if self._splitter is not None:
            thought, text = self._splitter.feed(text, final)
            if thought:
                if self._open is None:
                    self._open, self._base = ("reasoning", 0), 1
                    events.append(self.event("response.output_item.added", output_index=0,
                                             item=self.reasoning_item("in_progress", None)))
                self._thought_text += thought
                events.append(self.event("response.reasoning_text.delta", output_index=0,
                                         item_id=self.reasoning_id, content_index=0,
                                         delta=thought))
            if not text:
                return events
        if self._reader is None:
            return events + self._text_delta(self._base, text)
        for piece in self._reader.feed(text):
            index = self._base + getattr(piece, "index", 0)
            if isinstance(piece, tool_calls.ContentPiece):
                events += self._text_delta(self._base, piece.text)
            elif isinstance(piece, tool_calls.CallStarted):
                events += self._close_open()
                call = {"id": piece.id, "function": {"name": piece.name}}
                self._open = ("call", index)
                events.append(self.event("response.output_item.added", output_index=index,
                                         item=self._call_item(piece.index, call, "in_progress")))
            else:
                events.append(self.event("response.function_call_arguments.delta",
                                         item_id=self._call_items[piece.index],
                                         output_index=index, delta=piece.text))
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
            item = self.reasoning_item("completed", self._thought_text)
            return [self.event("response.reasoning_text.done", item_id=self.reasoning_id,
                               output_index=0, content_index=0, text=self._thought_text),
                    self.event("response.output_item.done", item=item, output_index=0)]
        if kind == "message":
            item = output[index]
            text = item["content"][0]["text"]
            where = {"item_id": self.item_id, "output_index": index, "content_index": 0}
            return [self.event("response.output_text.done", text=text, **where),
                    self.event("response.content_part.done", part=self.part(text), **where),
                    self.event("response.output_item.done", item=item, output_index=index)]
        content, calls = self._reader.result()
        item = self._call_item(index - self._base, calls[index - self._base], "completed")
        return [self.event("response.function_call_arguments.done", item_id=item["id"],
                           output_index=index, arguments=item["arguments"]),
                self.event("response.output_item.done", output_index=index, item=item)]

    def closing(self, text: str, finish_reason: str, usage: dict) -> list[str]:
        final = self.response("completed", text, finish_reason, usage)
        kind = "response.incomplete" if final["status"] == "incomplete" else "response.completed"
        # a thinking's text held back (a tag's start) goes out, and its item closes
        events = self.delta("", final=True) if self._splitter is not None else []
        if self._open is not None and self._open[0] == "reasoning":
            events += self._close_open()
        if self._reader is None and not self._message_opened:
            events += self._open_message(self._base)  # an answer with no text after its thinking
        elif self._reader is not None and not self._reader.sent_any:
            # an answer that said nothing yet (an empty text answer, or one cut short
            # before a call's name): its text as one message
            events += self._open_message(self._base)
            content = final["output"][self._base]["content"][0]["text"]
            if content:
                events += self._text_delta(self._base, content)
        return events + self._close_open(final["output"]) + [self.event(kind, response=final)]


async def responses(request: Request, server: "ServerState") -> Response:
    """One chat session, answered whole or as the Responses API's events."""
    node = server.ready_node()
    store = server.responses
    parsed = parse_response_request(await server.read_body(request, "/v1/responses"), store,
                                    node.tool_format)
    prompt, thinking = thinking_prompt(node, parsed.chat, server.config, "input")
    parsed = attrs.evolve(parsed, chat=thinking.request(parsed.chat))
    ids = await node.tokenize_off_loop(prompt, add_special=True, parse_special=True)
    builder = ResponsesBuilder(server.model_name(parsed.chat.params), parsed, thinking)
    generated: list[int] = []
    pieces: list[str] = []  # each token's text, for the thinking's token count

    def finished(text: str, chunks) -> dict:
        thought = thinking.splitting.thought_tokens(pieces) if thinking.split else 0
        usage = builder.usage(chunks.prompt_tokens, len(generated), chunks.cached_tokens,
                              thought)
        if parsed.store:
            store.put(builder.id, parsed.conversation + [builder.answer(text)[1]])
        return usage

    chat = parsed.chat
    opened = contextlib.AsyncExitStack()
    session = await opened.enter_async_context(node.stream(
        ids, chat.params, whole=not chat.stream and thinking.budget is None,
        progress=chat.stream and chat.return_progress))
    chunks, = await opened.enter_async_context(thinking.bounded(node, [session]))
    if chat.stream:

        async def produce(emit) -> None:
            for event in builder.opening():
                await emit(event)
            texts = []
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
                        generated.append(chunk.token_id)
                        pieces.append(chunk.text)
                        request.scope["dgr.tokens"] = len(generated)
                    if chat.timings_per_token:  # llama-server's: on each event from here on
                        builder.extra = {"timings": timings(chunks)}
                    if chunk.text and chunk.finish_reason != "error":
                        texts.append(chunk.text)
                        for event in builder.delta(chunk.text):
                            await emit(event)
            problem = ended([chunks])
            if problem is not None:
                await emit(builder.event("error", code=problem.code, message=problem.message))
                return
            text = "".join(texts)
            for event in builder.closing(text, chunks.finish_reason, finished(text, chunks)):
                await emit(event)

        return SessionEvents(produce, close=opened.aclose)
    rows: list = []
    try:
        text = await read_one(request, chunks, generated, rows)
    finally:
        await opened.aclose()
    pieces.extend(chunk.text for chunk in rows)
    return JSONResponse(builder.response("completed", text, chunks.finish_reason,
                                         finished(text, chunks)))
