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


def chat_text(node, chat, field: str = "messages",
              thinking: reasoning.ThinkingSwitch = reasoning.ThinkingSwitch()) -> str:
    """`chat`: a chat's GenerationRequest (its messages, tools, add_generation_prompt,
    continue_final)."""
    try:
        return node.chat_prompt(chat.messages, chat.tools, chat.add_generation_prompt,
                                chat.continue_final, thinking)
    except ValueError as exc:
        raise BadRequest(f"cannot apply the chat template: {exc}", field) from None


@attrs.frozen
class Thinking:
    """How a chat's thinking is handled (dgr.reasoning): `on`, the model may think;
    `split`, the thinking is returned apart from the answer; `opened`, the output
    starts inside it; `harmony`, the template writes gpt-oss's channels; `budget`, the
    tokens it may take (None: no bound; dgr.thinking_budget); `answer_grammar`, the
    request's grammar, of its answer."""

    on: bool = False
    split: bool = False
    opened: bool = False
    harmony: bool = False
    budget: Optional[int] = None
    answer_grammar: Optional[str] = None

    @property
    def splitting(self) -> reasoning.Splitting:
        return reasoning.Splitting(self.opened, self.harmony)

    def request(self, chat):
        """The chat's GenerationRequest with its grammar (of the answer: its tools, a
        response format) applying after the thinking; a grammar that names the
        thinking's end is the whole output's, as given. Harmony's channels are control
        tokens: a split answer's text carries their text, which the split takes out;
        a grammar there is the whole output's."""
        if self.harmony:
            if not self.split:
                return chat
            return attrs.evolve(chat, params=attrs.evolve(chat.params, skip_special_tokens=False))
        if not self.on or self.answer_grammar is None or reasoning.CLOSE in self.answer_grammar:
            return chat
        grammar = reasoning.after_thinking(self.answer_grammar, self.opened)
        return attrs.evolve(chat, params=attrs.evolve(chat.params, grammar=grammar))

    def splitter(self):
        """A splitter of one answer's thinking from its text."""
        return self.splitting.splitter()

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
    template = node.chat_template()
    if reasoning.harmony(template):
        # gpt-oss always thinks (reasoning_effort sets how much); no budget cuts it
        prompt = chat_text(node, chat, field, reasoning.ThinkingSwitch(effort=chat.effort))
        fmt = chat.reasoning_format or server_config.reasoning_format
        return prompt, Thinking(on=True, split=fmt != "none", harmony=True,
                                answer_grammar=chat.params.grammar)
    family = reasoning.thinks(template)
    budget = chat.thinking_budget
    if budget is None or budget < 0:
        budget = server_config.reasoning_budget
    off = chat.thinking is False or budget == 0
    prompt = chat_text(node, chat, field, reasoning.ThinkingSwitch(not off, chat.effort))
    fmt = chat.reasoning_format or server_config.reasoning_format
    opened = reasoning.opened_in_prompt(prompt)
    on = family and not off
    return prompt, Thinking(on=on, split=fmt == "deepseek" or (fmt == "auto" and family),
                            opened=opened, budget=budget if on and budget > 0 else None,
                            answer_grammar=chat.params.grammar)


async def chat_ids(node, chat, field: str = "messages") -> list[int]:
    text = chat_text(node, chat, field)
    return await node.tokenize_off_loop(text, add_special=True, parse_special=True)
