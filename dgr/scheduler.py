"""The scheduler: which rows go into the next llama_decode.

Policy (re-planned every step, sessions join and leave between steps):

1. Decode first. Every running session that has a token to decode and whose
   reader can take one more token gets exactly one row, in ascending slot
   order (llama.cpp evaluates out-of-order sequence ids in several ubatches).
   A session whose reply channel is full (slow reader) is skipped, so
   backpressure reaches the model step instead of memory.
2. Prefill fills what the step's token budget leaves, oldest session first,
   in chunks of `prefill_chunk` tokens. Chunk boundaries are multiples of
   `prefill_chunk` from position 0, a function of the session alone, never of
   what other sessions left in the budget (DESIGN.md, correctness bar): a
   chunk that does not fit waits for the next step, and so do younger
   sessions' chunks (strict age order, so a long prompt is never starved).
   Since decode rows come first and a chunk is at most `prefill_chunk`
   tokens, a long prompt delays decoders by at most one chunk per step.
3. All decode rows of a step go to one llama_decode. With dgr's llama.cpp
   patch stack (patches/) a row's logits are bitwise the same whatever else
   shares the call: how many rows, which sequences, how long their contexts.
4. At most `prefill_sessions` sessions prefill in one step, and each chunk
   runs in a llama_decode of its own, apart from the decode rows
   (`StepPlan.calls`), exactly as it runs when its session is alone: a chunk
   of 64 rows or more takes llama.cpp's tiled flash attention, a reduction of
   its own that the patch stack leaves as it is, so neither a chunk's
   boundaries nor its company may depend on other sessions. With split KV a
   mixed call costs two graph evaluations anyway, so separate calls cost
   nothing extra.

Bounds: rows per step <= token_budget (<= n_batch); output rows per step <=
number of running sessions (one sampled token each); prefill chunks per step
<= prefill_sessions; llama_decode calls per step <= 1 + prefill_sessions.

Pure Python: no I/O, no Trio, no llama.cpp.
"""

from __future__ import annotations

from typing import Sequence

import attrs
import numpy as np

from dgr.sequence import Phase, Session

# Engine.step's `want` flags (dgr._batch.WANT_*), repeated so that the scheduler
# stays importable and testable without the compiled engine.
WANT_SAMPLE = 1
WANT_LOGPROBS = 2


@attrs.frozen
class PrefillChunk:
    session: Session
    start: int
    end: int

    @property
    def last(self) -> bool:
        return self.end == len(self.session.prompt)


@attrs.frozen
class StepPlan:
    decode: tuple[Session, ...]
    prefill: tuple[PrefillChunk, ...]
    token_budget: int

    @property
    def n_rows(self) -> int:
        return len(self.decode) + sum(c.end - c.start for c in self.prefill)

    @property
    def empty(self) -> bool:
        return not self.decode and not self.prefill

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
        """(tokens, positions, seq_ids, want, n_logprobs) for Engine.step."""
        n = self.n_rows
        tokens = np.empty(n, dtype=np.int32)
        positions = np.empty(n, dtype=np.int32)
        seq_ids = np.empty(n, dtype=np.int32)
        want = np.zeros(n, dtype=np.int8)
        n_logprobs = 0
        row = 0
        for session in self.decode:
            tokens[row] = session.pending_token
            positions[row] = session.n_past
            seq_ids[row] = session.slot
            want[row] = _want(session)
            n_logprobs = max(n_logprobs, session.params.logprobs)
            row += 1
        for chunk in self.prefill:
            size = chunk.end - chunk.start
            tokens[row:row + size] = chunk.session.prompt[chunk.start:chunk.end]
            positions[row:row + size] = np.arange(chunk.start, chunk.end, dtype=np.int32)
            seq_ids[row:row + size] = chunk.session.slot
            if chunk.last:
                want[row + size - 1] = _want(chunk.session)
                n_logprobs = max(n_logprobs, chunk.session.params.logprobs)
            row += size
        return tokens, positions, seq_ids, want, n_logprobs

    def calls(self) -> list[tuple[int, int]]:
        """Row ranges [start, end) of the step's llama_decode calls: all decode
        rows in one, then one call per prefill chunk, alone."""
        n_decode = len(self.decode)
        bounds = [(0, n_decode)] if n_decode else []
        start = n_decode
        for chunk in self.prefill:
            bounds.append((start, start + chunk.end - chunk.start))
            start += chunk.end - chunk.start
        return bounds

    def output_rows(self) -> list[tuple[Session, int]]:
        """(session, row) for every row that yields a sampled token, in row order."""
        rows = [(session, i) for i, session in enumerate(self.decode)]
        row = len(self.decode)
        for chunk in self.prefill:
            row += chunk.end - chunk.start
            if chunk.last:
                rows.append((chunk.session, row - 1))
        return rows


def _want(session: Session) -> int:
    return WANT_SAMPLE | (WANT_LOGPROBS if session.params.logprobs else 0)


def plan_step(running: Sequence[Session], token_budget: int, prefill_chunk: int,
              prefill_sessions: int = 1 << 30) -> StepPlan:
    """Plan the next step over `running` (in arrival order)."""
    # Rows in ascending slot (sequence id) order: with split KV, llama.cpp splits a
    # batch whose sequence ids are out of order into several ubatches, one graph
    # evaluation each (measured, 16 decode rows: 72 ms ascending, 183 ms shuffled,
    # 347 ms descending). Slots come back in any order as sessions finish.
    decode = sorted((s for s in running
                     if s.phase is Phase.DECODE and not s.done and s.reader_ready()),
                    key=lambda s: s.slot)
    left = token_budget - len(decode)
    prefill = []
    for session in running:
        if session.phase is not Phase.PREFILL or session.done:
            continue
        start = session.n_prefilled
        end = min(len(session.prompt), (start // prefill_chunk + 1) * prefill_chunk)
        if end - start > left or len(prefill) == prefill_sessions:
            break
        prefill.append(PrefillChunk(session, start, end))
        left -= end - start
    return StepPlan(tuple(decode), tuple(prefill), token_budget)
