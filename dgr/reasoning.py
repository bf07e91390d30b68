"""A thinking model's answer split into its thinking and its answer, as text arrives.

Templates of the `<think>` family (Qwen3, DeepSeek-R1 and its distills, SmolLM3, ...)
have the model write `<think>`, its thinking, `</think>`, then the answer; some open
the thinking in the prompt itself (DeepSeek-R1's generation prompt ends with
`<think>`), so the output starts inside it. `ThinkSplitter` reads the pieces of one
answer and returns, for each, the part that is thinking and the part that is answer;
the tags are neither, nor the blank lines the model writes after a tag. The same
pieces give the same parts whatever their boundaries, so a streamed answer's parts
join to the whole answer's (`split`). A thinking never closed is all thinking (the
answer was cut short inside it), as llama.cpp's parser takes it.

gpt-oss's harmony format writes the thinking as messages on an `analysis` channel and
the answer on `final` (`HarmonySplitter`), with control tokens the answer's text
renders only where the session asks for their text (SamplingParams.skip_special_tokens).

llama-server's `--reasoning-format`: `none` leaves the text whole (thinking in the
answer); `deepseek` splits it; `auto` splits where the template is of either family.
"""

from __future__ import annotations

import re
from typing import Optional

import attrs

OPEN, CLOSE = "<think>", "</think>"
FORMATS = ("auto", "deepseek", "none")

_START, _THINKING, _AFTER, _ANSWER = range(4)  # states: where the next text goes
# gpt-oss's harmony format: each message of an answer is a header (the assistant's start,
# its channel, a recipient), `<|message|>`, its text, and an end
HARMONY_CHANNEL, HARMONY_MESSAGE = "<|channel|>", "<|message|>"
HARMONY_ENDS = ("<|end|>", "<|return|>", "<|call|>")
_HEADER, _ANALYSIS, _MESSAGE, _PLAIN = range(4)  # a harmony splitter's states


def thinks(template: Optional[str]) -> bool:
    """Whether a chat template is of the `<think>` family."""
    return template is not None and CLOSE in template


# what chat_template_kwargs / reasoning_effort may say of the effort (OpenAI's values)
EFFORTS = ("minimal", "low", "medium", "high")


@attrs.frozen
class ThinkingSwitch:
    """What a request tells a chat template of its thinking: whether the model may
    think (`enable_thinking`, as llama.cpp and vLLM render templates) and how hard
    (`reasoning_effort`, which gpt-oss's template reads; None: the template's own
    default). A template that reads neither renders as it would without them."""

    enabled: bool = True
    effort: Optional[str] = None

    def template_vars(self) -> dict:
        return {"enable_thinking": self.enabled} | (
            {"reasoning_effort": self.effort} if self.effort is not None else {})


def harmony(template: Optional[str]) -> bool:
    """Whether a chat template writes gpt-oss's harmony channels."""
    return template is not None and HARMONY_CHANNEL in template and HARMONY_MESSAGE in template


def opened_in_prompt(prompt: str) -> bool:
    """Whether the prompt leaves a thinking open (its last `<think>` after its last
    `</think>`): the output starts inside it."""
    return prompt.rfind(OPEN) > prompt.rfind(CLOSE)


def without_thinking(prompt: str) -> str:
    """The prompt with the thinking closed, empty (Qwen3's template's own form when
    enable_thinking is false): the output is the answer."""
    if opened_in_prompt(prompt):
        return close_thinking(prompt)
    return prompt + OPEN + "\n\n" + CLOSE + "\n\n"


def close_thinking(prompt: str) -> str:
    """A prompt that leaves the thinking open, with it closed: the output is the answer
    (llama.cpp's form: the end tag after the open one's line)."""
    return prompt + ("" if prompt.endswith("\n") else "\n") + CLOSE


def after_thinking(grammar: str, opened: bool) -> str:
    """A GBNF grammar of an answer (its root rule `root`, referenced by no other
    rule) as the grammar of a thinking model's whole output: a thinking first (free
    text with no `</` but its end's; opened by the prompt, or by the model if it
    opens one), then the answer."""
    answer = re.sub(r"(?m)^root(\s*::=)", r"dgr-answer\1", grammar)
    close = '"</think>" [ \\t\\n]*'
    root = (f"root ::= dgr-thought {close} dgr-answer" if opened
            else f'root ::= ("<think>" dgr-thought {close})? dgr-answer')
    return "\n".join([root, 'dgr-thought ::= ([^<] | "<" [^/])*', answer])


def _partial(text: str, tag: str) -> int:
    """The length of the longest end of `text` that begins `tag` (held back: the
    tag may be completed by the next piece)."""
    for n in range(min(len(text), len(tag) - 1), 0, -1):
        if tag.startswith(text[-n:]):
            return n
    return 0


class ThinkSplitter:
    """One answer's text, split piece by piece (module doc)."""

    def __init__(self, opened: bool = False):
        self._state = _THINKING if opened else _START
        self._held = ""
        self._started = False  # thinking's leading blank lines are dropped too
        self.thinking = False  # the text fed last went (at least partly) to the thinking

    @property
    def inside(self) -> bool:
        """Whether the text so far leaves the thinking open."""
        return self._state == _THINKING

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        """(thinking, answer) parts of `text`; `final`: nothing follows (what is held
        back goes out)."""
        text = self._held + text
        self._held = ""
        thinking, answer = [], []
        while text:
            if self._state == _START:
                stripped = text.lstrip()
                if stripped.startswith(OPEN):
                    text, self._state = stripped[len(OPEN):], _THINKING
                elif OPEN.startswith(stripped) and not final:
                    self._held, text = text, ""
                else:
                    self._state = _ANSWER
            elif self._state == _THINKING:
                if not self._started:
                    text = text.lstrip("\n")
                    self._started = bool(text)
                    if not text:
                        break
                at = text.find(CLOSE)
                if at >= 0:
                    thinking.append(text[:at])
                    text, self._state = text[at + len(CLOSE):], _AFTER
                    continue
                keep = 0 if final else _partial(text, CLOSE)
                thinking.append(text[:len(text) - keep])
                self._held, text = text[len(text) - keep:], ""
            elif self._state == _AFTER:
                text = text.lstrip()
                if text:
                    self._state = _ANSWER
            else:
                answer.append(text)
                text = ""
        self.thinking = bool(thinking) or self._state in (_START, _THINKING) and bool(self._held)
        return "".join(thinking), "".join(answer)


class HarmonySplitter:
    """One harmony answer's text (its control tokens' text included), split piece by
    piece as ThinkSplitter splits it: the `analysis` channel's messages are the
    thinking, every other channel's the answer, the headers and ends neither. Text
    before any header (a model that writes no channel) is all answer."""

    def __init__(self):
        self._state = _HEADER
        self._held = ""
        self.thinking = False

    @property
    def inside(self) -> bool:
        return self._state == _ANALYSIS

    def feed(self, text: str, final: bool = False) -> tuple[str, str]:
        text = self._held + text
        self._held = ""
        thinking, answer = [], []
        began_inside = self._state == _ANALYSIS  # an analysis message's end is its own
        while text:
            if self._state == _HEADER:
                at = text.find(HARMONY_MESSAGE)
                if not text.startswith("<|") and not "<|".startswith(text):
                    self._state = _PLAIN
                elif at >= 0:
                    analysis = HARMONY_CHANNEL + "analysis" in text[:at]
                    self._state = _ANALYSIS if analysis else _MESSAGE
                    text = text[at + len(HARMONY_MESSAGE):]
                else:  # a header still arriving (one cut short is neither part)
                    self._held, text = ("" if final else text), ""
            elif self._state == _PLAIN:
                answer.append(text)
                text = ""
            else:
                sink = thinking if self._state == _ANALYSIS else answer
                ends = [(text.find(end), end) for end in HARMONY_ENDS if end in text]
                if ends:
                    at, end = min(ends)
                    sink.append(text[:at])
                    text, self._state = text[at + len(end):], _HEADER
                    continue
                keep = 0 if final else max(_partial(text, end) for end in HARMONY_ENDS)
                sink.append(text[:len(text) - keep])
                self._held, text = text[len(text) - keep:], ""
        self.thinking = began_inside or any(thinking) or self._state == _ANALYSIS
        return "".join(thinking), "".join(answer)


@attrs.frozen
class Splitting:
    """How an answer's thinking is found: `<think>` tags (the output starting inside one
    where the prompt `opened` it), or harmony's channels."""

    opened: bool = False
    harmony: bool = False

    def splitter(self):
        """A splitter of one answer, fed as it arrives (ThinkSplitter's interface)."""
        return HarmonySplitter() if self.harmony else ThinkSplitter(self.opened)
