"""A session's tokens into its reader's chunks, in the step loop's pump.

The pump turns each sampled token into a `Chunk` (incremental detokenizer, stop
strings, stop token ids) and puts it straight into the reader's channel: no task
sits between the batch loop's events and the reader, since a task hop per token
is what Python costs most per token. The reader hands a credit back for each
token it takes (`SessionStream`), so a session has at most `reply_buffer`
token chunks unread, and its channel holds them and the final chunk.

A reader of the whole answer (a non-streamed request) takes nothing before the
end: its reply holds the tokens and hands the chunks over in one piece with the
final one, so the reader wakes once, not once a step, and the session has
credits for all its tokens (at most max_tokens are held, as the answer holds
them anyway). Without stop strings nothing needs a token's text before the end:
the tokens wait as they came and become chunks there, in one pass.
"""

from __future__ import annotations

import contextlib
from typing import Callable, Optional

import trio

from dgr.detok import IncrementalDetokenizer
from dgr.sequence import FinishReason, Session
from dgr.stops import StopMatcher
from dgr.stream import Chunk, PromptProgress, TopLogprobs

# Prefill reports a reader may leave unread (SessionSpec.reports_progress): its
# channel has room for them beside its tokens; one more is dropped, the next says more.
PROGRESS_SLOTS = 2


class Reply:
    """The writing end of one session's stream.

    `token` is called for each sampled token, `finish` once at the end;
    `stop(reason)` asks the node to end the session (a stop string or id).
    After the final chunk, or once the reader has left, nothing more is written.
    """

    def __init__(self, session: Session, chunks: trio.MemorySendChannel,
                 token_to_piece: Callable[[int], bytes],
                 stop: Callable[[FinishReason], None], credits: int, whole: bool = False):
        """`credits`: the token chunks the reader may leave unread (its channel holds
        them and the final one); `whole`: the reader takes the chunks only at the end,
        as one list (its channel holds that list)."""
        self.credits = credits
        self._chunks = chunks
        self._stop = stop
        self._detok = IncrementalDetokenizer(token_to_piece)
        self._stops = StopMatcher(session.spec.params.stop)
        self._held: Optional[list[Chunk]] = [] if whole else None
        # a whole answer without stop strings: (token, logprob, top) as sampled
        self._raw: Optional[list] = [] if whole and not self._stops.active else None
        self._stop_ids = frozenset(session.spec.params.stop_token_ids)
        self._min_tokens = session.spec.params.min_tokens
        self._prompt = session.spec.prompt
        self._cached = 0
        self._n = 0
        self.closed = False

    def token(self, token: int, logprob: Optional[float], top: Optional[TopLogprobs]) -> None:
        if self.closed:
            return
        self._n += 1
        if token in self._stop_ids:  # the engine bans them below min_tokens
            self._stop(FinishReason.STOP)
            self._end(self._final(FinishReason.STOP))
            return
        if self._raw is not None:
            self._raw.append((token, logprob, top))
            return
        text = self._detok.push(token)
        if self._n <= self._min_tokens:  # no stop string ends it yet
            self._keep(Chunk(token, text, logprob, top))
            return
        text, stopped = self._stops.feed(text)
        if stopped:
            self._stop(FinishReason.STOP)
            self._end(Chunk(token, text, logprob, top, finish_reason=FinishReason.STOP,
                            stop_sequence=self._stops.matched))
            return
        self._keep(Chunk(token, text, logprob, top))

    def progress(self, processed: int, now: float) -> None:
        """The prompt is in the KV up to position `processed` (a streamed session
        that reports its progress; before its first token, so the report takes no
        token's room)."""
        if self.closed or self._held is not None:
            return
        if self._chunks.statistics().current_buffer_used < PROGRESS_SLOTS:
            self._send(Chunk(None, "", progress=PromptProgress(
                len(self._prompt), self._cached, processed, now)))

    def started(self, cached: int) -> None:
        """The session reached the batch loop with `cached` prompt tokens in its KV."""
        self._cached = cached

    def _keep(self, chunk: Chunk) -> None:
        """A token's chunk: to the reader now, or held for the end (whole)."""
        if self._held is None:
            self._send(chunk)
        else:
            self._held.append(chunk)

    def credits_left(self) -> int:
        """Tokens the reader has room for now: all its credits but the chunks it has
        not read (a resumed session's start; 0 where it has read none of them)."""
        if self._held is not None:
            return self.credits
        return max(0, self.credits - self._chunks.statistics().current_buffer_used)

    def statistics(self) -> trio.MemoryChannelStatistics:
        """The reader's channel: chunks written and not yet read, and its bound."""
        return self._chunks.statistics()

    def finish(self, reason: FinishReason, error: Optional[str]) -> None:
        if not self.closed:
            self._end(self._final(reason, error))

    def _final(self, reason: FinishReason, error: Optional[str] = None) -> Chunk:
        """The last chunk, with the text held back until the end."""
        if self._raw:  # their text first (no stop string: nothing to cut)
            push = self._detok.push
            self._held.extend([Chunk(token, push(token), logprob, top)
                               for token, logprob, top in self._raw])
            self._raw = []
        tail, _ = self._stops.feed(self._detok.flush())
        return Chunk(None, tail + self._stops.flush(), finish_reason=reason, error=error)

    def _send(self, chunk: Chunk | list[Chunk]) -> None:
        try:
            self._chunks.send_nowait(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            self.closed = True  # the reader left: the node cancels the session

    def _end(self, chunk: Chunk) -> None:
        if self._held is None:
            self._send(chunk)
        else:
            self._held.append(chunk)
            self._send(self._held)
            self._held = None
        self.closed = True
        with contextlib.suppress(trio.ClosedResourceError):
            self._chunks.close()
