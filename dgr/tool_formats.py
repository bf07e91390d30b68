"""Which tool-call format a model gets, and the native formats dgr knows.

A model whose GGUF chat template renders tools itself was trained on that
template's way of describing tools and calling them; it calls them best in
it. dgr knows one such family, the Hermes 2 Pro format (Qwen 2.5 and 3, Hermes
2 Pro and 3, and others): the template describes the tools, and the model
answers a call as

    <tool_call>
    {"name": "get_weather", "arguments": {"city": "Paris"}}
    </tool_call>

(several calls one after the other, each in its tags), or answers in text. A
model is given it when its template mentions `<tool_call>` and, rendered in
the sandbox (dgr.jinja_template) with a probe tool, shows that tool; any other
model gets llama.cpp's generic format (dgr.tools), which any template renders.
As in the generic format, the answer is constrained by a grammar: to calls
(tool_choice "required" or a named function) or to calls or text ("auto": a
text answer is one that does not begin with "<"), so a call's arguments
always parse and follow the tool's schema.
"""

from __future__ import annotations

import logging
from typing import Optional

from dgr.jinja_template import ChatTemplate, TemplateError
from dgr.reasoning import ThinkingSwitch
from dgr.tools import (GENERIC, AnswerReader, ContentPiece, MAX_PARALLEL_CALLS, ToolSpec,
                       call_schema, schema_grammar)

log = logging.getLogger("dgr.tools")

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_PROBE = {"type": "function", "function": {
    "name": "dgr_probe_tool", "description": "a probe",
    "parameters": {"type": "object", "properties": {}}}}


def for_template(source: Optional[str], special: dict):
    """The tool-call format of a model with chat template `source` (None: none)
    and special token texts `special` (bos_token, eos_token)."""
    if source is None or OPEN not in source:
        return GENERIC
    try:
        template = ChatTemplate(source, **special)
        probe = template.render([{"role": "user", "content": "hi"}], tools=[_PROBE],
                                thinking=ThinkingSwitch())
    except TemplateError as exc:
        log.warning("the chat template mentions %s but cannot render tools (%s): tools use "
                    "the generic format", OPEN, exc)
        return GENERIC
    if _PROBE["function"]["name"] not in probe:
        return GENERIC
    return HermesFormat(template, special.get("bos_token", ""))


class HermesFormat:
    """The Hermes 2 Pro format (see the module doc), rendered by the model's template."""

    name = "hermes"

    def __init__(self, template: ChatTemplate, bos_token: str = ""):
        self._template = template
        self._bos = bos_token

    def render(self, messages: list[dict], spec: Optional[ToolSpec], apply_template,
               add_generation_prompt: bool, thinking: ThinkingSwitch) -> str:
        """The prompt, by the model's own template: the tools as it describes them,
        calls (their arguments as JSON values) and tool results as it renders
        them. A leading BOS text is left to the tokenizer, which adds it."""
        tools = [{"type": "function", "function": t} for t in spec.tools] if spec else None
        text = self._template.render(messages, tools, add_generation_prompt=add_generation_prompt,
                                     thinking=thinking)
        if self._bos and text.startswith(self._bos):
            text = text[len(self._bos):]
        return text

    @staticmethod
    def grammar(spec: ToolSpec) -> str:
        call = schema_grammar(call_schema(spec.offered))
        call = call.replace("root ::=", "call-json ::=", 1)
        more = MAX_PARALLEL_CALLS - 1 if spec.parallel else 0
        rules = [call,
                 f'tool-call ::= "{OPEN}\\n" call-json "\\n{CLOSE}"',
                 f'calls ::= tool-call ("\\n" tool-call){{0,{more}}}']
        if spec.choice == "auto":
            rules += ["root ::= calls | text", 'text ::= [^<] [^\\x00]*']
        else:
            rules.append("root ::= calls")
        return "\n".join(rules) + "\n"

    @staticmethod
    def reader() -> "HermesReader":
        return HermesReader()


class HermesReader:
    """Reads a Hermes answer as it is generated, with the generic reader's pieces
    and result (dgr.tools.AnswerReader): the calls' JSON is handed to one such
    reader as the generic format's `{"tool_calls": [...]}`, so names and
    arguments stream the same way; a text answer is content as it comes."""

    def __init__(self):
        self._json = AnswerReader()
        self._mode = "start"   # start, text, open (a call's JSON next), call, close, between
        self._pending = ""     # characters that may be a tag
        self._text: list[str] = []
        self._content: list[str] = []
        self.whole = False     # every call begun has its closing tag

    @property
    def text(self) -> str:
        return "".join(self._text)

    @property
    def calls(self) -> int:
        return self._json.calls

    @property
    def sent_any(self) -> bool:
        return self._json.sent_any or bool(self._content)

    def result(self) -> tuple[Optional[str], list[dict]]:
        if self._json.calls:
            return self._json.result()
        if self._mode == "text":
            return "".join(self._content), []
        return self.text, []

    def feed(self, text: str) -> list:
        self._text.append(text)
        content: list[str] = []
        self._json.begin()
        for c in text:
            self._char(c, content)
        out = self._json.end()
        if content:
            self._content.append("".join(content))
            out.insert(0, ContentPiece(self._content[-1]))  # a text answer has no calls
        return out

    def _char(self, c: str, content: list[str]) -> None:
        mode = self._mode
        if mode == "text":
            content.append(c)
        elif mode in ("start", "between"):
            if mode == "between" and not self._pending and c.isspace():
                return
            self._pending += c
            if self._pending == OPEN:
                for j in '{"tool_calls": [' if mode == "start" else ", ":
                    self._json.char(j)
                self._mode, self._pending, self.whole = "open", "", False
            elif not OPEN.startswith(self._pending):
                if mode == "start":
                    content.append(self._pending)
                    self._mode = "text"
                else:
                    self._mode = "after"  # outside the grammar: the rest is ignored
                self._pending = ""
        elif mode == "open":
            if c == "{":
                self._mode = "call"
                self._json.char(c)
        elif mode == "call":
            self._json.char(c)
            if self._json.depth == 2:  # the call's object closed: back in the array
                self._mode = "close"
        elif mode == "close":
            if not self._pending and c.isspace():
                return
            self._pending += c
            if self._pending == CLOSE:
                self._mode, self._pending, self.whole = "between", "", True
            elif not CLOSE.startswith(self._pending):
                self._mode, self._pending = "after", ""
