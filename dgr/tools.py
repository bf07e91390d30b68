"""Tool calls in chat completions: the request's tools and history, and
llama.cpp's "generic" format, which any model's template can render: the tools
are described to the model in a system message and its answer is constrained
by a grammar to one JSON object, either `{"tool_calls": [{"name": ...,
"arguments": {...}}]}` or `{"response": "..."}` (only the first with
tool_choice "required" or a named function), so a call's arguments always
parse and follow the tool's schema. A history's assistant tool calls are
rendered back in the same JSON, tool results as `tool` messages. A model whose
own template renders tools in a format dgr knows uses that instead
(dgr.tool_formats). No I/O.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Optional

import attrs

from dgr.errors import InvalidRequest
from dgr.reasoning import ThinkingSwitch


# Calls in one answer with parallel_tool_calls: a bound, so that a model repeating
# calls (a base model does) ends its JSON and the answer parses
MAX_PARALLEL_CALLS = 8


class ToolsError(InvalidRequest):
    """A request's tools, tool_choice or tool messages are unusable (`field`)."""


@attrs.frozen
class ToolSpec:
    tools: tuple[dict, ...]        # {"name", "description", "parameters"}
    choice: str                    # "auto", "required", or a tool's name
    parallel: bool
    format: Any = attrs.field(factory=lambda: GENERIC)  # how the model sees tools and calls

    @property
    def names(self) -> list[str]:
        return [t["name"] for t in self.tools]

    @property
    def offered(self) -> list[dict]:
        """The tools the answer may call (all, or the named choice's)."""
        return [t for t in self.tools if self.choice in ("auto", "required")
                or t["name"] == self.choice]


def parse_tools(body: dict, tool_format: Any = None) -> Optional[ToolSpec]:
    """OpenAI's `tools`, `tool_choice` and `parallel_tool_calls` (`tool_spec`)."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if tools is None:
        if choice not in (None, "none", "auto"):
            raise ToolsError("'tool_choice' needs 'tools'", "tool_choice")
        return None
    if not isinstance(tools, list):
        raise ToolsError("'tools' must be a list", "tools")
    specs = []
    for tool in tools:
        function = tool.get("function") if isinstance(tool, dict) else None
        if (not isinstance(tool, dict) or tool.get("type") != "function"
                or not isinstance(function, dict)):
            raise ToolsError("every tool must be {\"type\": \"function\", \"function\": "
                             "{\"name\": ...}}", "tools")
        specs.append(function)
    if isinstance(choice, dict):
        named = choice.get("function") if choice.get("type") == "function" else None
        choice = {"name": named.get("name") if isinstance(named, dict) else None}
    return tool_spec(specs, choice, parallel, tool_format)


def tool_spec(tools: list, choice: Any, parallel: Any, tool_format: Any = None,
              schema_key: str = "parameters") -> Optional[ToolSpec]:
    """The tools a request offers, whatever its protocol, or None when it offers
    none or tool_choice is "none": each tool {"name", "description", schema_key: its
    arguments' JSON schema}; `choice` "none", "auto", "required", {"name": a tool's
    name} or None (auto with tools); the tools in `tool_format` (None: the generic
    one)."""
    if not isinstance(parallel, bool):
        raise ToolsError("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
    specs = []
    for tool in tools:
        name = tool.get("name") if isinstance(tool, dict) else None
        if not isinstance(name, str) or not name:
            raise ToolsError("every tool needs a name", "tools")
        parameters = tool.get(schema_key) or {"type": "object", "properties": {}}
        if not isinstance(parameters, dict):
            raise ToolsError(f"tool {name!r}: '{schema_key}' must be a JSON schema object",
                             "tools")
        specs.append({"name": name, "description": tool.get("description") or "",
                      "parameters": parameters})
    names = [t["name"] for t in specs]
    if len(set(names)) != len(names):
        raise ToolsError("tool names must be distinct", "tools")
    if choice is None:
        choice = "auto" if specs else "none"
    if isinstance(choice, dict):
        if choice.get("name") not in names:
            raise ToolsError(f"'tool_choice' names no given tool ({choice.get('name')!r})",
                             "tool_choice")
        choice = choice["name"]
    elif choice not in ("none", "auto", "required"):
        raise ToolsError("'tool_choice' must be none, auto, required or a named function",
                         "tool_choice")
    if choice == "none" or not specs:
        return None
    return ToolSpec(tuple(specs), choice, parallel, tool_format or GENERIC)


def call_schema(tools: list[dict]) -> dict:
    """JSON schema of one call, {"name": ..., "arguments": {...}}, of one of `tools`."""
    return {"anyOf": [{"type": "object",
                       "properties": {"name": {"const": t["name"]}, "arguments": t["parameters"]},
                       "required": ["name", "arguments"]} for t in tools]}


# llama-cpp-python's converter lets a string hold raw control characters, which no
# strict JSON parser takes (the anthropic SDK's, Python's json.loads): its string
# character, and llama.cpp's own converter's, which leaves them out
_LOOSE_CHAR = 'char ::= [^"\\\\] |'
_STRICT_CHAR = 'char ::= [^"\\\\\\x7F\\x00-\\x1F] |'


def json_grammar(schema: dict) -> str:
    """GBNF of a JSON schema (llama-cpp-python's converter; root rule "root"), its
    strings without raw control characters. Raises what the converter raises."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    return json_schema_to_gbnf(json.dumps(schema)).replace(_LOOSE_CHAR, _STRICT_CHAR)


def schema_grammar(schema: dict) -> str:
    """json_grammar, a ToolsError naming what the converter cannot express."""
    try:
        return json_grammar(schema)
    except Exception as exc:  # the converter's message names what it cannot express
        raise ToolsError(f"a tool's parameters cannot be turned into a grammar: {exc}",
                         "tools") from None


def _call_schema(tools: list[dict], parallel: bool) -> dict:
    array = {"type": "array", "items": call_schema(tools), "minItems": 1,
             "maxItems": MAX_PARALLEL_CALLS if parallel else 1}
    return {"type": "object", "properties": {"tool_calls": array}, "required": ["tool_calls"]}


def grammar(spec: ToolSpec) -> str:
    """GBNF for the answer: a tool call (of the named tool, for a named choice) or,
    with "auto", a text response."""
    schema = _call_schema(spec.offered, spec.parallel)
    if spec.choice == "auto":
        schema = {"anyOf": [schema, {"type": "object", "properties": {
            "response": {"type": "string"}}, "required": ["response"]}]}
    return schema_grammar(schema)


def system_prompt(spec: ToolSpec) -> str:
    described = json.dumps([{"name": t["name"], "description": t["description"],
                             "parameters": t["parameters"]} for t in spec.tools], indent=2)
    if spec.choice == "auto":
        how = ('Respond in JSON: {"tool_calls": [{"name": <tool name>, "arguments": {...}}]} to '
               'call tools, or {"response": <your answer>} to answer directly.')
    else:
        how = 'Respond in JSON: {"tool_calls": [{"name": <tool name>, "arguments": {...}}]}.'
    return f"You can call these tools:\n{described}\n{how}"


class GenericFormat:
    """llama.cpp's generic format (see the module doc): rendered by any template."""

    name = "generic"

    @staticmethod
    def render(messages: list[dict], spec: Optional[ToolSpec], apply_template,
               add_generation_prompt: bool, thinking: ThinkingSwitch) -> str:
        """The prompt of a chat (messages as dgr.doors.request.chat_message makes them) through
        `apply_template` (messages of role and content, add_generation_prompt -> text): the tools
        described in the system message, the calls as the JSON the model answers in."""
        plain = []
        for m in messages:
            if m.get("tool_calls"):
                calls = [{"name": c["function"]["name"], "arguments": c["function"]["arguments"]}
                         for c in m["tool_calls"]]
                plain.append({"role": "assistant", "content": json.dumps({"tool_calls": calls})})
            else:
                plain.append({"role": m["role"], "content": m["content"]})
            if m.get("reasoning_content"):  # a thinking model's template renders it or not
                plain[-1]["reasoning_content"] = plain[-1]["thinking"] = m["reasoning_content"]
        if spec is not None:
            described = system_prompt(spec)
            if plain[0]["role"] == "system":
                plain[0] = {"role": "system", "content": plain[0]["content"] + "\n\n" + described}
            else:
                plain.insert(0, {"role": "system", "content": described})
        return apply_template(plain, add_generation_prompt, thinking)

    @staticmethod
    def grammar(spec: ToolSpec) -> str:
        return grammar(spec)

    @staticmethod
    def reader() -> "AnswerReader":
        return AnswerReader()


GENERIC = GenericFormat()


def call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@attrs.frozen
class ContentPiece:
    text: str


@attrs.frozen
class CallStarted:
    index: int
    id: str
    name: str


@attrs.frozen
class ArgumentsPiece:
    index: int
    text: str


class _Frame:
    """An open JSON container of the answer: `{` or `[`, the last key read in an
    object, and whether a key comes next."""

    __slots__ = ("kind", "key", "want_key")

    def __init__(self, kind: str):
        self.kind, self.key, self.want_key = kind, None, kind == "{"


class AnswerReader:
    """Reads a constrained answer as it is generated and says what a stream sends
    of it, as OpenAI streams: the text of a `{"response": ...}` answer as it
    comes; each tool call once its name is whole (CallStarted), then its
    arguments' JSON text piece by piece as written (ArgumentsPiece; the pieces
    together are the arguments). It scans the JSON one character at a time,
    tracking only the containers open, so a piece of text may end anywhere (in a
    key, an escape, a number)."""

    def __init__(self):
        self.calls = 0                    # tool calls started
        self.whole = False                # the answer's JSON object has ended
        self._text: list[str] = []        # everything read (the fallback)
        self._stack: list[_Frame] = []
        self._in_string = self._escape = self._is_key = self._in_primitive = False
        self._string: list[str] = []      # the open string's characters, raw
        self._arming = False              # "arguments": read, its value not begun
        self._capture_depth: Optional[int] = None  # stack depth of the arguments' value
        self._content_sent = 0            # characters of the response string decoded and sent
        self._content: list[str] = []     # the response's text sent
        self._calls: list[dict] = []      # the calls started, in OpenAI's shape
        self._out: list = []              # the pieces of the text being fed
        self._piece: list[str] = []       # the arguments' characters read in it

    @property
    def text(self) -> str:
        return "".join(self._text)

    @property
    def sent_any(self) -> bool:
        return self.calls > 0 or self._content_sent > 0

    def result(self) -> tuple[Optional[str], list[dict]]:
        """(content, tool_calls) of what was read: the calls (their arguments as
        written; cut short where the answer is not whole), else the response's
        text, else (an answer cut short before it said anything) the text read."""
        if self._calls:
            return None, self._calls
        if self.whole or self._content_sent:
            return "".join(self._content), []
        return self.text, []

    def feed(self, text: str) -> list:
        """The pieces `text` completes (ContentPiece, CallStarted, ArgumentsPiece)."""
        self._text.append(text)
        self.begin()
        for c in text:
            self.char(c)
        return self.end()

    @property
    def depth(self) -> int:
        """JSON containers open."""
        return len(self._stack)

    # A reader of a format that wraps the JSON (dgr.tool_formats) feeds its JSON one
    # character at a time between begin() and end(), which returns the pieces.

    def begin(self) -> None:
        self._out, self._piece = [], []

    def end(self) -> list:
        self._flush_arguments()
        if self._in_string and self._in_response():
            self._flush_content(final=False)
        for piece in self._out:
            if isinstance(piece, CallStarted):
                self._calls.append({"id": piece.id, "type": "function",
                                    "function": {"name": piece.name, "arguments": ""}})
            elif isinstance(piece, ArgumentsPiece):
                self._calls[piece.index]["function"]["arguments"] += piece.text
            else:
                self._content.append(piece.text)
        return self._out

    def char(self, c: str) -> None:
        capturing = self._capture_depth is not None
        if self._in_string:
            if capturing:
                self._piece.append(c)
            if self._escape:
                self._escape = False
            elif c == "\\":
                self._escape = True
            elif c == '"':
                self._in_string = False
                self._string_ended()
                return
            self._string.append(c)
            return
        if self._in_primitive:
            if c not in ",}] \t\n\r":
                if capturing:
                    self._piece.append(c)
                return
            self._in_primitive = False
            self._value_ended()
            capturing = self._capture_depth is not None
        if c in " \t\n\r":
            if capturing:
                self._piece.append(c)
            return
        if self._arming:
            self._arming = False
            self._capture_depth = len(self._stack)
            capturing = True
        if capturing:
            self._piece.append(c)
        top = self._stack[-1] if self._stack else None
        if c in "{[":
            self._stack.append(_Frame(c))
        elif c in "}]":
            if self._stack:
                self._stack.pop()
            if not self._stack:
                self.whole = True
            self._value_ended()
        elif c == ":":
            if top is not None and self._in_call() and top.key == "arguments":
                self._arming = True
        elif c == ",":
            if top is not None and top.kind == "{":
                top.want_key = True
        elif c == '"':
            self._in_string, self._string = True, []
            self._is_key = top is not None and top.kind == "{" and top.want_key
        else:
            self._in_primitive = True

    def _in_call(self) -> bool:
        """The innermost container is a tool call's object."""
        s = self._stack
        return len(s) == 3 and s[0].key == "tool_calls" and s[1].kind == "[" and s[2].kind == "{"

    def _in_response(self) -> bool:
        return (not self._is_key and len(self._stack) == 1 and self._stack[0].key == "response")

    def _string_ended(self) -> None:
        top = self._stack[-1] if self._stack else None
        if self._is_key:
            top.key, top.want_key = _decode("".join(self._string)), False
            return
        if self._in_call() and top.key == "name" and self._capture_depth is None:
            self._out.append(CallStarted(self.calls, call_id(), _decode("".join(self._string))))
            self.calls += 1
        elif self._in_response():
            self._flush_content(final=True)
        self._value_ended()

    def _value_ended(self) -> None:
        if self._capture_depth is not None and len(self._stack) == self._capture_depth:
            self._flush_arguments()
            self._capture_depth = None

    def _flush_arguments(self) -> None:
        if self._piece:
            self._out.append(ArgumentsPiece(self.calls - 1, "".join(self._piece)))
            self._piece = []

    def _flush_content(self, final: bool) -> None:
        """Send the response string's characters decoded so far (an escape or a
        surrogate pair cut by the piece's end waits for the next)."""
        raw = "".join(self._string)
        decoded = _decode(raw if final else raw[:_whole_escapes(raw)], final)
        if len(decoded) > self._content_sent:
            self._out.append(ContentPiece(decoded[self._content_sent:]))
            self._content_sent = len(decoded)


def _decode(raw: str, final: bool = True) -> str:
    """A JSON string's characters (without its quotes, its escapes whole) as text;
    a string's control characters are taken as they are (the grammar allows
    them), a lone surrogate escape becomes U+FFFD. Not final: a high surrogate
    at the end waits for its pair."""
    text = json.loads('"' + raw + '"', strict=False)
    if not final and text and "\ud800" <= text[-1] <= "\udbff":
        text = text[:-1]
    return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")


def _whole_escapes(raw: str) -> int:
    """The length of raw's longest prefix that ends with no escape cut short."""
    i, n = 0, len(raw)
    while i < n:
        if raw[i] == "\\":
            need = 6 if raw[i + 1:i + 2] == "u" else 2
            if i + need > n:
                return i
            i += need
        else:
            i += 1
    return n
