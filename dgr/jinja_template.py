"""A GGUF's own chat template (`tokenizer.chat_template`, Jinja) rendered in a
sandbox. The template is untrusted input: llama-cpp-python's CVE-2024-34359 was
a GGUF whose template ran code when rendered. Jinja's immutable sandbox refuses
attribute access to internals (`__class__`, `__globals__`, ...) and any call
that mutates a value, so a template can only compute text from the messages and
tools it is given; its output is bounded too. Used for tool calls in a model's
native format (dgr.tool_formats) and for a template file given in place of the
model's (dgr.chat); other chats keep llama.cpp's own templates.
"""

from __future__ import annotations

import datetime
import json
from typing import Any, Optional

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment

from dgr.reasoning import ThinkingSwitch

# A rendered prompt longer than this (characters) is refused: no context holds it,
# and a template that loops over its input must not fill the memory.
MAX_RENDERED = 8 * 1024 * 1024


class TemplateError(ValueError):
    """The template does not parse, refuses the chat (raise_exception), breaks the
    sandbox's rules, or renders more than MAX_RENDERED characters."""


def _raise(message: str):
    raise TemplateError(f"the chat template refused the chat: {message}")


def _tojson(value: Any, indent: Optional[int] = None, ensure_ascii: bool = False,
            separators=None, sort_keys: bool = False) -> str:
    """Hugging Face's `tojson` (Jinja's own escapes HTML, which templates do not expect)."""
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii, separators=separators,
                      sort_keys=sort_keys)


def _strftime_now(fmt: str) -> str:
    return datetime.datetime.now().strftime(fmt)


class _Undefined(jinja2.Undefined):
    """A name the template's context lacks adds nothing to a text it is added to,
    as llama.cpp's template engine renders it (Jinja's own raises)."""

    def __add__(self, other):
        return other

    def __radd__(self, other):
        return other


class ChatTemplate:
    """One template, compiled once; render() is pure (no I/O, no state)."""

    def __init__(self, source: str, bos_token: str = "", eos_token: str = ""):
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                            extensions=["jinja2.ext.loopcontrols"],
                                            undefined=_Undefined, autoescape=False)
        env.filters["tojson"] = _tojson
        env.globals.update(raise_exception=_raise, strftime_now=_strftime_now)
        try:
            self._template = env.from_string(source)
        except jinja2.TemplateError as exc:
            raise TemplateError(f"the chat template does not parse: {exc}") from None
        self._special = {"bos_token": bos_token, "eos_token": eos_token}

    def render(self, messages: list[dict], tools: Optional[list[dict]] = None,
               add_generation_prompt: bool = True, *, thinking: ThinkingSwitch) -> str:
        # the request's thinking switch and effort, as llama.cpp and vLLM render templates
        # (dgr.reasoning.ThinkingSwitch)
        # and today's date, in the two forms llama.cpp gives templates
        now = datetime.datetime.now()
        context = self._special | {"messages": messages, "add_generation_prompt":
                                   add_generation_prompt, **thinking.template_vars(),
                                   "date_string": now.strftime("%d %b %Y"),
                                   "datetime": now.strftime("%b %d %Y")}
        if tools is not None:
            context["tools"] = tools
        out, size = [], 0
        try:
            for piece in self._template.generate(**context):
                size += len(piece)
                if size > MAX_RENDERED:
                    raise TemplateError(f"the chat template rendered more than {MAX_RENDERED} "
                                        "characters")
                out.append(piece)
        except TemplateError:
            raise
        except jinja2.exceptions.SecurityError as exc:
            raise TemplateError(f"the chat template broke the sandbox's rules: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - any failure of untrusted code is the template's
            raise TemplateError(f"the chat template failed: {type(exc).__name__}: {exc}") from None
        return "".join(out)
