"""Anthropic's Messages API (`POST /v1/messages`, `/v1/messages/count_tokens`): a
request becomes a GenerationRequest by the Messages API's own fields (its tools
grammar-sure as the chat door's), and the session's answer becomes a
message of text and tool_use blocks, whole or as Anthropic's stream events.
Errors are in Anthropic's shape (the server renders what these handlers raise
with dgr.doors.problems.anthropic)."""

from __future__ import annotations

import contextlib
import json
import uuid
from typing import TYPE_CHECKING, Any, Optional

import attrs
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from dgr import tools as tool_calls
from dgr.doors import chat_turn
from dgr.doors.fields import BadRequest, check_fields, json_object, read_bool
from dgr.doors.request import (GenerationRequest, chat_message, checked_chat, joined_text,
                               named_values, prompt_ending, requester_of, sampling,
                               tool_call)
from dgr.doors.problems import anthropic_error, ended
from dgr.doors.sse import SessionEvents, read_one, sse_event
from dgr.spec import Requester

if TYPE_CHECKING:
    from dgr.doors.context import ServerState

# the Messages API's name of each SamplingParams field it has
_SAMPLING_NAMES = {"max_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p",
                   "top_k": "top_k", "stop_sequences": "stop", "model": "model"}
_STOP_REASONS = {"length": "max_tokens", "stop": "end_turn"}
_TOOL_CHOICES = {"auto": "auto", "any": "required", "none": "none"}


def _text(content: Any, where: str) -> str:
    """A string, or text blocks joined (cache_control on a block is a hint: the
    node caches prefixes by itself)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise BadRequest(f"'{where}' must be a string or a list of text blocks", where)
    parts = []
    for block in content:
        if not isinstance(block, dict) or block.get("type") != "text" \
                or not isinstance(block.get("text"), str):
            kind = block.get("type") if isinstance(block, dict) else None
            raise BadRequest(f"'{where}' blocks of type {kind!r} are not supported here", where)
        parts.append(block["text"])
    return joined_text(parts)


def _messages(body: dict) -> list[dict]:
    """The conversation as chat messages: text, tool_use and tool_result blocks."""
    system = body.get("system")
    out = [chat_message("system", _text(system, "system"))] if system else []
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequest("'messages' must be a non-empty list", "messages")
    for message in messages:
        if not isinstance(message, dict) or message.get("role") not in ("user", "assistant"):
            raise BadRequest("every message needs the role 'user' or 'assistant'", "messages")
        role, content = message["role"], message.get("content")
        if isinstance(content, str):
            out.append(chat_message(role, content))
            continue
        if not isinstance(content, list):
            raise BadRequest("a message's 'content' must be a string or blocks", "messages")
        text, calls, thought = [], [], []
        for block in content:
            kind = block.get("type") if isinstance(block, dict) else None
            if kind == "text" and isinstance(block.get("text"), str):
                text.append(block["text"])
            elif kind == "tool_use" and role == "assistant":
                calls.append(tool_call(block.get("id"), block.get("name"), block.get("input", {})))
            elif kind == "thinking" and role == "assistant" and isinstance(
                    block.get("thinking"), str):
                thought.append(block["thinking"])  # rendered or dropped, as the template does
            elif kind == "redacted_thinking" and role == "assistant":
                continue  # its text is Anthropic's, encrypted
            elif kind == "tool_result" and role == "user":
                out.append(chat_message("tool", _text(block.get("content", ""), "messages"),
                                        answers=block.get("tool_use_id")))
            else:
                raise BadRequest(f"content blocks of type {kind!r} are not supported",
                                 "messages")
        if text or calls:
            out.append(chat_message(role, joined_text(text), calls,
                                    thought=joined_text(thought)))
    return checked_chat(out)


def _tools(body: dict, tool_format) -> Optional[tool_calls.ToolSpec]:
    """`tools` (custom tools: name, description, input_schema) and `tool_choice`."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    if tools is None:
        if choice is not None:
            raise BadRequest("'tool_choice' needs 'tools'", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise BadRequest("'tools' must be a list", "tools")
    for tool in tools:
        if not isinstance(tool, dict) or tool.get("type", "custom") != "custom":
            kind = tool.get("type") if isinstance(tool, dict) else None
            raise BadRequest(f"tools of type {kind!r} (server tools) are not supported",
                             "tools")
    kind = choice.get("type") if isinstance(choice, dict) else None
    if choice is not None and kind not in (*_TOOL_CHOICES, "tool"):
        raise BadRequest("'tool_choice.type' must be auto, any, tool or none", "tool_choice")
    parallel = not (isinstance(choice, dict) and choice.get("disable_parallel_tool_use"))
    try:
        return tool_calls.tool_spec(
            tools, {"name": choice.get("name")} if kind == "tool" else _TOOL_CHOICES.get(kind),
            parallel, tool_format, schema_key="input_schema")
    except tool_calls.ToolsError as exc:
        raise BadRequest(str(exc), exc.field) from None


def parse_messages(body: Any, tool_format=None, door: str = "/v1/messages") -> GenerationRequest:
    """A Messages API body (`door`: /v1/messages or its count_tokens, which takes
    no sampling)."""
    body = json_object(body)
    check_fields(body, door)
    thinking = _thinking(body.get("thinking"))
    messages = _messages(body)
    tools = _tools(body, tool_format)
    values: dict = {}
    if door == "/v1/messages":
        if not isinstance(body.get("max_tokens"), int) or body["max_tokens"] < 1:
            raise BadRequest("'max_tokens' must be a positive integer", "max_tokens")
        values = named_values(body, _SAMPLING_NAMES)
    params = sampling(values, grammar=tools.format.grammar(tools) if tools is not None else None)
    return GenerationRequest(params, messages=messages, tools=tools,
                             stream=read_bool(body, "stream"), **thinking,
                             **prompt_ending(messages))


def _thinking(value: Any) -> dict:
    """`thinking` ({"type": "enabled", "budget_tokens": N} or {"type": "disabled"}) as
    GenerationRequest's fields; absent, a thinking model thinks as its template does."""
    if value is None:
        return {}
    if value == {"type": "disabled"}:
        return {"thinking": False}
    budget = value.get("budget_tokens") if isinstance(value, dict) else None
    if (not isinstance(value, dict) or value.get("type") != "enabled" or set(value) - {
            "type", "budget_tokens"} or type(budget) is not int or budget < 1):
        raise BadRequest("'thinking' must be {\"type\": \"enabled\", \"budget_tokens\": a "
                         "positive integer} or {\"type\": \"disabled\"}", "thinking")
    return {"thinking": True, "thinking_budget": budget}


def _event(kind: str, **fields) -> str:
    return sse_event({"type": kind} | fields, kind)


class _Blocks:
    """The answer's content blocks as they stream, from its parts (dgr.doors.chat_turn):
    a thinking model's thinking, text, then tool_use blocks."""

    def __init__(self):
        self.index = -1
        self.open: Optional[str] = None

    def _start(self, block: dict) -> list[str]:
        events = self.stop()
        self.index += 1
        self.open = block["type"]
        return events + [_event("content_block_start", index=self.index, content_block=block)]

    def stop(self) -> list[str]:
        if self.open is None:
            return []
        self.open = None
        return [_event("content_block_stop", index=self.index)]

    def write(self, parts: list) -> list[str]:
        events = []
        for part in parts:
            if isinstance(part, chat_turn.Thought):
                if self.open != "thinking":
                    events += self._start({"type": "thinking", "thinking": "", "signature": ""})
                delta = {"type": "thinking_delta", "thinking": part.text}
            elif isinstance(part, chat_turn.Answer):
                if self.open != "text":
                    events += self._start({"type": "text", "text": ""})
                delta = {"type": "text_delta", "text": part.text}
            elif isinstance(part, tool_calls.CallStarted):
                events += self._start({"type": "tool_use", "id": part.id, "name": part.name,
                                       "input": {}})
                continue
            else:
                delta = {"type": "input_json_delta", "partial_json": part.text}
            events.append(_event("content_block_delta", index=self.index, delta=delta))
        return events


def _content(answer: chat_turn.WholeChoice) -> list[dict]:
    """The content blocks of a whole answer."""
    blocks = ([{"type": "thinking", "thinking": answer.thought, "signature": ""}]
              if answer.thought else [])
    blocks += [{"type": "text", "text": answer.content}] if answer.content else []
    for call in answer.calls:
        try:
            arguments = json.loads(call["function"]["arguments"], strict=False)
        except ValueError:
            arguments = {}  # cut short by max_tokens
        blocks.append({"type": "tool_use", "id": call["id"], "name": call["function"]["name"],
                       "input": arguments})
    return blocks


def _stop(chunks, tool_use: bool) -> tuple[str, Optional[str]]:
    if tool_use:
        return "tool_use", None
    if chunks.stop_sequence is not None:
        return "stop_sequence", chunks.stop_sequence
    return _STOP_REASONS.get(str(chunks.finish_reason), "end_turn"), None


def anthropic_requester(request: Request, body: dict) -> Requester:
    """A Messages request's requester: its `metadata` (`user_id`, and `priority`
    beside Anthropic's fields), else the X-Tenant and X-Priority headers."""
    metadata = body.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise BadRequest("'metadata' must be an object", "metadata")
    return requester_of(request, metadata.get("user_id"), metadata.get("priority"),
                        ("metadata.user_id", "metadata.priority"))


async def messages(request: Request, server: "ServerState") -> Response:
    """One chat session, answered as a message or as Anthropic's stream events."""
    node = server.ready_node()
    body = await server.read_body(request, "/v1/messages")
    parsed = attrs.evolve(parse_messages(body, node.tool_format),
                          requester=anthropic_requester(request, body))
    turn = chat_turn.render(node, parsed, server.config)
    ids = await turn.tokens(node)
    opened = contextlib.AsyncExitStack()
    chunks, = await opened.enter_async_context(turn.sessions(node, ids))
    message_id = "msg_" + uuid.uuid4().hex
    reader = turn.reader()
    head = {"id": message_id, "type": "message", "role": "assistant",
            "model": server.model_name(parsed.params)}
    cached = chunks.cached_tokens

    def usage(output_tokens: int) -> dict:
        return {"input_tokens": chunks.prompt_tokens - cached, "output_tokens": output_tokens,
                "cache_read_input_tokens": cached, "cache_creation_input_tokens": 0}

    if parsed.stream:
        async def produce(emit) -> None:
            await emit(_event("message_start", message=head | {
                "content": [], "stop_reason": None, "stop_sequence": None, "usage": usage(0)}))
            await emit(_event("ping"))
            blocks = _Blocks()
            generated = 0
            while batch := await chunks.next_chunks():
                events = []
                for chunk in batch:
                    if chunk.token_id is not None:
                        generated += 1
                        request.scope["dgr.tokens"] = generated
                    if chunk.finish_reason != "error":
                        events += blocks.write(reader.feed(chunk.text, chunk.token_id is not None,
                                                           chunk.finish_reason is not None))
                if events:
                    await emit("".join(events))
            problem = ended([chunks])
            if problem is not None:
                await emit(_event("error", error=anthropic_error(problem)["error"]))
                return
            reason, sequence = _stop(chunks, reader.tool_use)
            await emit("".join(blocks.stop()) + _event(
                "message_delta", delta={"stop_reason": reason, "stop_sequence": sequence},
                usage={"output_tokens": generated}) + _event("message_stop"))

        return SessionEvents(produce, close=opened.aclose)
    try:
        got = await read_one(request, chunks)
    finally:
        await opened.aclose()
    answer = reader.whole(got)
    reason, sequence = _stop(chunks, answer.tool_use)
    return JSONResponse(head | {"content": _content(answer), "stop_reason": reason,
                                "stop_sequence": sequence, "usage": usage(
                                    sum(chunk.token_id is not None for chunk in got))})


async def count_tokens(request: Request, server: "ServerState") -> Response:
    """`POST /v1/messages/count_tokens`: the prompt's tokens, as /v1/messages makes it."""
    node = server.ready_node()
    parsed = parse_messages(await server.read_json(request), node.tool_format,
                            "/v1/messages/count_tokens")
    ids = await chat_turn.render(node, parsed, server.config).tokens(node)
    return JSONResponse({"input_tokens": len(ids)})
