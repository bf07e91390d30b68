"""A chat's prompt, as every chat door makes it: a GenerationRequest's messages
(dgr.doors.request) rendered by the node's chat template
with the request's tools, ending as the request asks (the assistant's turn
opened, or its last message continued), and tokenized off the Trio thread when
long. A template that refuses the chat is a 400 naming `field`."""

from __future__ import annotations

import contextlib
from typing import Optional

import attrs

from dgr import reasoning
from dgr.thinking_budget import BudgetedStream
from dgr.doors.fields import BadRequest


def chat_text(node, chat, field: str = "messages", enable_thinking: bool = True) -> str:
    """`chat`: a chat's GenerationRequest (its messages, tools, add_generation_prompt,
    continue_final)."""
    try:
        return node.chat_prompt(chat.messages, chat.tools, chat.add_generation_prompt,
                                chat.continue_final, enable_thinking)
    except ValueError as exc:
        raise BadRequest(f"cannot apply the chat template: {exc}", field) from None


@attrs.frozen
class Thinking:
    """How a chat's thinking is handled (dgr.reasoning): `on`, the model may think;
    `split`, the thinking is returned apart from the answer; `opened`, the output
    starts inside it; `budget`, the tokens it may take (None: no bound;
    dgr.thinking_budget); `answer_grammar`, the request's grammar, of its answer."""

    on: bool = False
    split: bool = False
    opened: bool = False
    budget: Optional[int] = None
    answer_grammar: Optional[str] = None

    def request(self, chat):
        """The chat's GenerationRequest with its grammar (of the answer: its tools, a
        response format) applying after the thinking; a grammar that names the
        thinking's end is the whole output's, as given."""
        if not self.on or self.answer_grammar is None or reasoning.CLOSE in self.answer_grammar:
            return chat
        grammar = reasoning.after_thinking(self.answer_grammar, self.opened)
        return attrs.evolve(chat, params=attrs.evolve(chat.params, grammar=grammar))

    def splitter(self) -> reasoning.ThinkSplitter:
        """A splitter of one answer's thinking from its text."""
        return reasoning.ThinkSplitter(self.opened)

    @contextlib.asynccontextmanager
    async def bounded(self, node, streams: list):
        """The chat's streams (open), each with its thinking bounded where a budget is."""
        if self.budget is None:
            yield streams
            return
        bounded = [BudgetedStream(node, stream, self.budget, self.opened, self.answer_grammar)
                   for stream in streams]
        try:
            yield bounded
        finally:
            for stream in bounded:
                await stream.aclose()


def thinking_prompt(node, chat, server_config, field: str = "messages") -> tuple[str, Thinking]:
    """A chat's prompt and how its thinking is handled, for a model whose template
    thinks (--reasoning-format, --reasoning-budget, and the request's own): the
    thinking closed in the prompt where the request switches it off (or gives it a
    budget of 0), split off from the answer unless the format is none (auto: where
    the template is of the family)."""
    family = reasoning.thinks(node.chat_template())
    budget = chat.thinking_budget
    if budget is None or budget < 0:
        budget = server_config.reasoning_budget
    off = chat.thinking is False or budget == 0
    prompt = chat_text(node, chat, field, enable_thinking=not off)
    fmt = chat.reasoning_format or server_config.reasoning_format
    opened = reasoning.opened_in_prompt(prompt)
    on = family and not off
    return prompt, Thinking(on=on, split=fmt == "deepseek" or (fmt == "auto" and family),
                            opened=opened, budget=budget if on and budget > 0 else None,
                            answer_grammar=chat.params.grammar)


async def chat_ids(node, chat, field: str = "messages") -> list[int]:
    text = chat_text(node, chat, field)
    return await node.tokenize_off_loop(text, add_special=True, parse_special=True)
