"""A chat's prompt, as every chat door makes it: a GenerationRequest's messages
(dgr.doors.request) rendered by the node's chat template
with the request's tools, ending as the request asks (the assistant's turn
opened, or its last message continued), and tokenized off the Trio thread when
long. A template that refuses the chat is a 400 naming `field`."""

from __future__ import annotations

from dgr.doors.fields import BadRequest


def chat_text(node, chat, field: str = "messages") -> str:
    """`chat`: a chat's GenerationRequest (its messages, tools, add_generation_prompt,
    continue_final)."""
    try:
        return node.chat_prompt(chat.messages, chat.tools, chat.add_generation_prompt,
                                chat.continue_final)
    except ValueError as exc:
        raise BadRequest(f"cannot apply the chat template: {exc}", field) from None


async def chat_ids(node, chat, field: str = "messages") -> list[int]:
    text = chat_text(node, chat, field)
    return await node.tokenize_off_loop(text, add_special=True, parse_special=True)
