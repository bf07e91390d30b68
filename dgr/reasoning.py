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

llama-server's `--reasoning-format`: `none` leaves the text whole (thinking in the
answer); `deepseek` splits it; `auto` splits where the template is of the family.
"""

from __future__ import annotations

import re
from typing import Optional

OPEN, CLOSE = "<think>", "</think>"
FORMATS = ("auto", "deepseek", "none")

_START, _THINKING, _AFTER, _ANSWER = range(4)  # states: where the next text goes


def thinks(template: Optional[str]) -> bool:
    """Whether a chat template is of the `<think>` family."""
    return template is not None and CLOSE in template


def opened_in_prompt(prompt: str) -> bool:
    """Whether the prompt leaves a thinking open (its last `<think>` after its last
    `</think>`): the output starts inside it."""
    return prompt.rfind(OPEN) > prompt.rfind(CLOSE)


def without_thinking(prompt: str) -> str:
    """The prompt with the thinking closed, empty (Qwen3's template's own form when
    enable_thinking is false): the output is the answer."""
    if opened_in_prompt(prompt):
        return prompt + "\n" + CLOSE + "\n\n"
    return prompt + OPEN + "\n\n" + CLOSE + "\n\n"


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


def split(text: str, opened: bool = False) -> tuple[str, str]:
    """(thinking, answer) of a whole answer."""
    return ThinkSplitter(opened).feed(text, final=True)


def thought_tokens(pieces, opened: bool = False) -> int:
    """How many of an answer's tokens (each one's text, in order) went to its thinking,
    the tags included: usage's reasoning_tokens."""
    splitter = ThinkSplitter(opened)
    count = 0
    for piece in pieces:
        splitter.feed(piece)
        count += splitter.thinking
    return count
