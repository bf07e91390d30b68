"""Tool calls in chat completions, in llama.cpp's "generic" format: the tools
are described to the model in a system message and its answer is constrained
by a grammar to one JSON object, either `{"tool_calls": [{"name": ...,
"arguments": {...}}]}` or `{"response": "..."}` (only the first with
tool_choice "required" or a named function), so a call's arguments always
parse and follow the tool's schema. A history's assistant tool calls are
rendered back in the same JSON, tool results as `tool` messages. No I/O.
"""

from __future__ import annotations

import json
import uuid
from typing import Any, Optional

import attrs

from dgr.errors import InvalidRequest


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

    @property
    def names(self) -> list[str]:
        return [t["name"] for t in self.tools]


def parse_tools(body: dict) -> Optional[ToolSpec]:
    """The request's tools, or None when it has none or tool_choice is "none"."""
    tools, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if not isinstance(parallel, bool):
        raise ToolsError("'parallel_tool_calls' must be a boolean", "parallel_tool_calls")
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
                or not isinstance(function, dict) or not isinstance(function.get("name"), str)
                or not function["name"]):
            raise ToolsError("every tool must be {\"type\": \"function\", \"function\": "
                             "{\"name\": ...}}", "tools")
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, dict):
            raise ToolsError(f"tool {function['name']!r}: 'parameters' must be a JSON schema "
                             "object", "tools")
        specs.append({"name": function["name"], "description": function.get("description") or "",
                      "parameters": parameters})
    names = [t["name"] for t in specs]
    if len(set(names)) != len(names):
        raise ToolsError("tool names must be distinct", "tools")
    if choice is None:
        choice = "auto" if specs else "none"
    if isinstance(choice, dict):
        named = choice.get("function") if choice.get("type") == "function" else None
        name = named.get("name") if isinstance(named, dict) else None
        if name not in names:
            raise ToolsError(f"'tool_choice' names no given tool ({name!r})", "tool_choice")
        choice = name
    elif choice not in ("none", "auto", "required"):
        raise ToolsError("'tool_choice' must be none, auto, required or a named function",
                         "tool_choice")
    if choice == "none" or not specs:
        return None
    return ToolSpec(tuple(specs), choice, parallel)


def _call_schema(tools: list[dict], parallel: bool) -> dict:
    calls = {"anyOf": [{"type": "object",
                        "properties": {"name": {"const": t["name"]}, "arguments": t["parameters"]},
                        "required": ["name", "arguments"]} for t in tools]}
    array = {"type": "array", "items": calls, "minItems": 1,
             "maxItems": MAX_PARALLEL_CALLS if parallel else 1}
    return {"type": "object", "properties": {"tool_calls": array}, "required": ["tool_calls"]}


def grammar(spec: ToolSpec) -> str:
    """GBNF for the answer: a tool call (of the named tool, for a named choice) or,
    with "auto", a text response."""
    from llama_cpp.llama_grammar import json_schema_to_gbnf

    tools = [t for t in spec.tools if spec.choice in ("auto", "required") or t["name"] == spec.choice]
    schema = _call_schema(tools, spec.parallel)
    if spec.choice == "auto":
        schema = {"anyOf": [schema, {"type": "object", "properties": {
            "response": {"type": "string"}}, "required": ["response"]}]}
    try:
        return json_schema_to_gbnf(json.dumps(schema))
    except Exception as exc:  # the converter's message names what it cannot express
        raise ToolsError(f"a tool's parameters cannot be turned into a grammar: {exc}",
                         "tools") from None


def system_prompt(spec: ToolSpec) -> str:
    described = json.dumps([{"name": t["name"], "description": t["description"],
                             "parameters": t["parameters"]} for t in spec.tools], indent=2)
    if spec.choice == "auto":
        how = ('Respond in JSON: {"tool_calls": [{"name": <tool name>, "arguments": {...}}]} to '
               'call tools, or {"response": <your answer>} to answer directly.')
    else:
        how = 'Respond in JSON: {"tool_calls": [{"name": <tool name>, "arguments": {...}}]}.'
    return f"You can call these tools:\n{described}\n{how}"


def history(messages: list[Any]) -> list[dict]:
    """Chat messages with their tool calls and tool results as text the template
    renders: an assistant's tool calls as the JSON the model answers in, a tool
    result as a `tool` message; a tool message must answer an earlier call."""
    out, call_ids = [], set()
    for m in messages:
        calls = m.get("tool_calls") if isinstance(m, dict) else None
        if calls is not None:
            if m.get("role") != "assistant" or not isinstance(calls, list):
                raise ToolsError("'tool_calls' belong to assistant messages, as a list",
                                 "messages")
            rendered = []
            for call in calls:
                function = call.get("function") if isinstance(call, dict) else None
                if not isinstance(function, dict) or not isinstance(function.get("name"), str):
                    raise ToolsError("a tool call needs a function name", "messages")
                try:
                    arguments = json.loads(function.get("arguments") or "{}")
                except (TypeError, ValueError):
                    raise ToolsError("a tool call's arguments must be JSON text",
                                     "messages") from None
                call_ids.add(call.get("id"))
                rendered.append({"name": function["name"], "arguments": arguments})
            out.append({"role": "assistant", "content": json.dumps({"tool_calls": rendered})})
            continue
        if isinstance(m, dict) and m.get("role") == "tool":
            if m.get("tool_call_id") not in call_ids:
                raise ToolsError(f"tool message for {m.get('tool_call_id')!r} answers no earlier "
                                 "tool call", "messages")
        out.append(m)
    return out


def parse_answer(text: str, spec: ToolSpec) -> tuple[Optional[str], list[dict]]:
    """(content, tool_calls in OpenAI's shape) of the model's constrained answer.
    An answer cut short (max_tokens) that does not parse is returned as content."""
    try:
        answer = json.loads(text)
    except ValueError:
        return text, []
    if isinstance(answer, dict) and "tool_calls" in answer:
        return None, [{"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
                       "function": {"name": call["name"],
                                    "arguments": json.dumps(call["arguments"])}}
                      for call in answer["tool_calls"]]
    if isinstance(answer, dict) and isinstance(answer.get("response"), str):
        return answer["response"], []
    return text, []
