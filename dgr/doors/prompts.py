"""A chat's prompt, as every chat door makes it: a GenerationRequest's messages
(dgr.doors.request) rendered by the node's chat template
with the request's tools, ending as the request asks (the assistant's turn
opened, or its last message continued), and tokenized off the Trio thread when
long. A template that refuses the chat is a 400 naming `field`."""

from __future__ import annotations

from typing import Optional

from dgr import reasoning
from dgr.doors.fields import BadRequest


def chat_text(node, chat, field: str = "messages") -> str:
    """`chat`: a chat's GenerationRequest (its messages, tools, add_generation_prompt,
    continue_final)."""
    try:
        return node.chat_prompt(chat.messages, chat.tools, chat.add_generation_prompt,
                                chat.continue_final)
    except ValueError as exc:
        raise BadRequest(f"cannot apply the chat template: {exc}", field) from None


def thinking_prompt(node, chat, default_format: str,
                    field: str = "messages") -> tuple[str, Optional[bool]]:
    """(prompt, opened) of a chat that may be a thinking model's (dgr.reasoning): its
    prompt with the thinking closed where the request switches it off, and whether
    the output starts inside a thinking, or None where its thinking is not split off
    (--reasoning-format none, or auto with a template that does not think)."""
    prompt = chat_text(node, chat, field)
    family = reasoning.thinks(node.chat_template())
    if chat.thinking is False and family and not chat.continue_final:
        prompt = reasoning.without_thinking(prompt)
    fmt = chat.reasoning_format or default_format
    if fmt == "none" or (fmt == "auto" and not family):
        return prompt, None
    return prompt, reasoning.opened_in_prompt(prompt)


async def chat_ids(node, chat, field: str = "messages") -> list[int]:
    text = chat_text(node, chat, field)
    return await node.tokenize_off_loop(text, add_special=True, parse_special=True)
