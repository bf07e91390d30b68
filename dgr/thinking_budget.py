"""A thinking budget: a session's thinking closed after `budget` tokens, and its
answer following (llama-server's --reasoning-budget, Anthropic's budget_tokens).

`BudgetedStream` reads a session's stream (dgr.stream.SessionStream) through a
`dgr.reasoning.ThinkSplitter`. When the session has written `budget` tokens of
thinking and is still inside it, the stream goes on with a second session whose
prompt is the first's prompt, the tokens it wrote up to there and the end of the
thinking (the request's reasoning_budget_message, then `CLOSE_TEXT`), those closing
tokens reported as output; the first session
is cancelled. The cut depends on the session's own tokens alone, and the second
session takes the first's KV from the prefix cache (bitwise what computing it
gives), so the output is the session's own whatever shares its steps.
"""

from __future__ import annotations

import contextlib
from typing import Optional

import attrs

from dgr.reasoning import CLOSE, ThinkSplitter
from dgr.sequence import FinishReason
from dgr.stream import Chunk

CLOSE_TEXT = "\n" + CLOSE + "\n\n"


class BudgetedStream:
    """A session's stream (`first`, already open) of a chat turn (`turn`:
    dgr.doors.chat_turn.ChatTurn, its thinking's budget) with its thinking bounded;
    read it as a SessionStream (next_chunks, read_all, finish_reason, the usage
    figures); `aclose` ends the session that follows the cut, if one did. The
    second session's grammar is the request's own, of the answer (the first's
    applies after its thinking: dgr.reasoning.after_thinking)."""

    def __init__(self, node, first, turn):
        thinking = turn.thinking
        self._node = node
        self._first = self._current = first
        self._budget = thinking.budget
        # the second session's: it writes the answer
        self._answer_grammar = thinking.answer_grammar
        self._splitter = ThinkSplitter(thinking.opened)
        # what the thinking ends with at the cut: the request's message, then its end
        self._closing = turn.request.reasoning_budget_message + CLOSE_TEXT
        self._tokens: list[int] = []  # the output's tokens up to the cut
        self._thought = 0
        self._cut = False
        self._exit = contextlib.AsyncExitStack()
        self.session = first.session  # the first's: its prompt and timings

    @property
    def prompt_tokens(self) -> int:
        return self._first.prompt_tokens

    @property
    def cached_tokens(self) -> int:
        return self._first.cached_tokens

    @property
    def prompt_logprobs(self):
        return self._first.prompt_logprobs

    @property
    def finish_reason(self) -> Optional[FinishReason]:
        return self._current.finish_reason

    @property
    def error(self) -> Optional[str]:
        return self._current.error

    @property
    def stop_sequence(self) -> Optional[str]:
        return self._current.stop_sequence

    async def next_chunks(self) -> list[Chunk]:
        batch = await self._current.next_chunks()
        if self._cut:
            return batch
        for i, chunk in enumerate(batch):
            if chunk.token_id is not None:
                self._tokens.append(chunk.token_id)
            self._splitter.feed(chunk.text)
            self._thought += self._splitter.thinking and chunk.token_id is not None
            if (chunk.finish_reason is None and self._thought >= self._budget
                    and self._splitter.inside):
                return batch[:i + 1] + await self._close_thinking()
        return batch

    async def read_all(self) -> list[Chunk]:
        chunks = []
        while batch := await self.next_chunks():
            chunks += batch
        return chunks

    async def _close_thinking(self) -> list[Chunk]:
        """End the first session and follow it with the second; the closing tokens'
        chunks (and the final one, where no token is left)."""
        self._cut = True
        first = self._first.session
        # its final chunk comes once its KV, output included, is a cache entry
        self._node.cancel(self._first)
        await self._first.read_all()
        closing = self._node.tokenize(self._closing, add_special=False, parse_special=True)
        chunks = [Chunk(token, self._node.token_text(token)) for token in closing]
        left = first.spec.params.max_tokens - len(self._tokens) - len(closing)
        if left < 1:
            self._current = _Ended(FinishReason.LENGTH)
            return chunks + [Chunk(None, "", finish_reason=FinishReason.LENGTH)]
        # the request's max_tokens, min_tokens and stops go on; its seed as it was
        params = attrs.evolve(first.spec.params, max_tokens=left, grammar=self._answer_grammar,
                              min_tokens=max(0, first.spec.params.min_tokens
                                             - len(self._tokens) - len(closing)))
        prompt = [*first.spec.prompt, *self._tokens, *closing]
        self._current = await self._exit.enter_async_context(
            self._node.stream(prompt, params, whole=False, requester=first.spec.requester))
        return chunks

    async def aclose(self) -> None:
        await self._exit.aclose()


@attrs.define
class _Ended:
    """The stream after a cut that left no token for the answer."""

    finish_reason: FinishReason
    error: Optional[str] = None
    stop_sequence: Optional[str] = None

    async def next_chunks(self) -> list[Chunk]:
        return []
