"""What a session's caller receives: chunks while it streams, a result at its end.

Below the node: the HTTP layer and library users import these without it.
"""

from __future__ import annotations

import collections
from typing import Callable, Optional

import attrs
import trio

from dgr.sequence import FinishReason, Session

TopLogprobs = list[tuple[int, float]]


@attrs.frozen
class PromptProgress:
    """How far a session's prompt is (SessionSpec.reports_progress): of `total`
    tokens, `cached` came from the cache and `processed` (cached included) are in
    its KV, at `at` (time.monotonic())."""

    total: int
    cached: int
    processed: int
    at: float


@attrs.define(slots=True)
class Chunk:
    """One streamed piece. `text` holds only whole UTF-8 characters. The last
    chunk of a stream has finish_reason set (and may carry text or a token).

    Slotted and not frozen, as the batch loop's events (dgr.events): the pump
    makes one a token, and a frozen class's __init__ costs several times more;
    nobody changes a chunk once made."""

    token_id: Optional[int]
    text: str
    logprob: Optional[float] = None
    top_logprobs: Optional[TopLogprobs] = None
    finish_reason: Optional[FinishReason] = None
    error: Optional[str] = None
    stop_sequence: Optional[str] = None  # the stop string that ended the session
    progress: Optional[PromptProgress] = None  # a report of the prompt's prefill (no token)


@attrs.frozen
class GenerationResult:
    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    prompt_tokens: int
    logprobs: Optional[list[TopLogprobs]] = None
    token_logprobs: Optional[list[float]] = None
    cached_tokens: int = 0  # prompt tokens whose KV came from the prefix cache or a session

    @property
    def completion_tokens(self) -> int:
        return len(self.token_ids)


class SessionStream:
    """Async iterator over a session's chunks; see Node.stream. Each chunk with a
    token taken hands the session a credit (`took_token`): the batch loop gives a
    session a row only while its reader is within `reply_buffer` tokens."""

    def __init__(self, session: Session, chunks: trio.MemoryReceiveChannel,
                 took_token: Callable[[], None]):
        self.session = session
        self._chunks = chunks
        self._took_token = took_token
        self._pending: collections.deque[Chunk] = collections.deque()  # taken, not yet read
        self.finish_reason: Optional[FinishReason] = None
        self.error: Optional[str] = None
        self.stop_sequence: Optional[str] = None  # the stop string that ended it, if one did

    @property
    def prompt_tokens(self) -> int:
        return len(self.session.spec.prompt)

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens whose KV the session took from the prefix cache or from
        another session instead of computing it (OpenAI's usage
        prompt_tokens_details.cached_tokens)."""
        return self.session.prompt_reused

    @property
    def prompt_logprobs(self):
        """With SamplingParams.prompt_logprobs: each prompt token's (log-probability,
        alternatives) given the tokens before it, None for the first (complete
        once the first chunk has come)."""
        return [None, *self.session.prompt_scores]

    def __aiter__(self) -> "SessionStream":
        return self

    async def __anext__(self) -> Chunk:
        if self._pending:
            return self._pending.popleft()
        if self.finish_reason is not None:
            raise StopAsyncIteration
        try:
            batch = self._taken(await self._chunks.receive())
        except (trio.EndOfChannel, trio.ClosedResourceError):
            self._ended()
            raise StopAsyncIteration from None
        self._pending.extend(batch[1:])
        return batch[0]

    async def next_chunks(self) -> list[Chunk]:
        """Every chunk there is to take, waiting for the first; [] once the stream
        has ended. A reader writing to a socket makes one write of them: when it
        falls behind the node, its writes grow instead of multiplying."""
        if self._pending:
            batch = list(self._pending)
            self._pending.clear()
            return batch
        if self.finish_reason is not None:
            return []
        try:
            batch = self._taken(await self._chunks.receive())
        except (trio.EndOfChannel, trio.ClosedResourceError):
            self._ended()
            return []
        while self.finish_reason is None:
            try:
                batch += self._taken(self._chunks.receive_nowait())
            except trio.WouldBlock:
                break
            except (trio.EndOfChannel, trio.ClosedResourceError):
                self._ended()
        return batch

    async def read_all(self) -> list[Chunk]:
        """Every chunk to the stream's end, the final one last (a whole answer's come
        in one piece)."""
        chunks = []
        while batch := await self.next_chunks():
            chunks += batch
        return chunks

    def _taken(self, item: Chunk | list[Chunk]) -> list[Chunk]:
        """What came through the channel: a token's chunk, the final one, or a whole
        answer's chunks (the final one last) in one list, whose reader hands back no
        credits (its session has them all)."""
        if type(item) is list:
            last = item[-1]
            self.finish_reason, self.error = last.finish_reason, last.error
            self.stop_sequence = last.stop_sequence
            return item
        if item.finish_reason is not None:
            self.finish_reason, self.error = item.finish_reason, item.error
            self.stop_sequence = item.stop_sequence
        elif item.token_id is not None:
            self._took_token()
        return [item]

    def _ended(self) -> None:
        """The channel closed without a final chunk (the node shut down first)."""
        self.finish_reason = self.session.finish_reason or FinishReason.CANCELLED
