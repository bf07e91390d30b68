"""What every node kind offers the server and a library caller, in one interface
(`ServingNode`): the task it serves, its gate (dgr.admission.Gate: open, draining or
failed, with the reasons every kind refuses with), a drain that waits for its last
piece of work to leave (woken as each one leaves, never polling), its bounds
(`statistics`), its report (`capabilities`: one shape for every kind) and its
metrics (`telemetry.exposition`). dgr.node.Node generates; dgr.embedding.EmbeddingNode
embeds or reranks. The server holds a ServingNode and asks its `task` what it
serves."""

from __future__ import annotations

import functools
from typing import Optional

import trio

from dgr.admission import Gate
from dgr.errors import InvalidRequest

# Texts up to this many characters are tokenized on the Trio thread: tokenizing them
# takes less of its time than the hop to a worker thread and back would
TOKENIZE_INLINE_CHARS = 256


class ServingNode:
    """A node of any kind (module doc). A kind sets `task`, hands its gate and the
    parking lot it unparks whenever a piece of work (a session, a request) leaves,
    and gives `in_flight`, `statistics`, `report` and its vocabulary's answers."""

    task: str  # "generation", "embedding" or "rerank": set by each kind

    def __init__(self, gate: Gate, departures: trio.lowlevel.ParkingLot) -> None:
        self.gate = gate
        self._departures = departures

    @property
    def generates(self) -> bool:
        """Whether it serves sessions that generate (else vectors or scores)."""
        return self.task == "generation"

    @property
    def draining(self) -> bool:
        return self.gate.draining

    @property
    def failure(self) -> Optional[str]:
        """Why the node can serve nothing until restarted, or None while it is healthy."""
        return self.gate.failure

    @property
    def in_flight(self) -> int:
        """The pieces of work admitted that have not left: sessions, or requests."""
        raise NotImplementedError

    async def drain(self, grace_s: float) -> bool:
        """Admit nothing more; wait up to grace_s for the work in the node to leave (a
        session's last chunk is in its reader's channel when it leaves). True if all
        left."""
        self.gate.start_draining()
        with trio.move_on_after(grace_s):
            while self.in_flight:
                await self._departures.park()
            return True
        return False

    # ------------------------------------------------------------------ vocabulary

    def _vocabulary(self):
        """The model's vocabulary (dgr._vocab.Vocabulary), while the node is open."""
        raise NotImplementedError

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = False) -> list[int]:
        """Token ids of text; parse_special reads control-token text (chat templates)."""
        return self._vocabulary().tokenize(text, add_special=add_special,
                                           parse_special=parse_special).tolist()

    async def tokenize_off_loop(self, text: str, add_special: bool = True,
                                parse_special: bool = False) -> list[int]:
        """`tokenize` on a worker thread: a long text does not stall the Trio loop,
        which meanwhile hands other sessions their tokens; a short one
        (TOKENIZE_INLINE_CHARS) costs less than the hop and is tokenized at once.
        Prompts given as text to a generation node's `stream`, `stream_group` and
        `generate` are tokenized this way."""
        if len(text) <= TOKENIZE_INLINE_CHARS:
            await trio.lowlevel.checkpoint()
            return self.tokenize(text, add_special, parse_special)
        return await trio.to_thread.run_sync(
            functools.partial(self.tokenize, text, add_special, parse_special))

    def detokenize(self, tokens: list[int]) -> str:
        """The text of token ids, as a prompt given as ids reads (special tokens removed)."""
        try:
            return self._vocabulary().detokenize(tokens)
        except ValueError as exc:
            raise InvalidRequest(str(exc)) from None

    def token_text(self, token: int) -> str:
        """One token's text, special tokens rendered (for logprobs reports)."""
        return self.token_bytes(token).decode("utf-8", "replace")

    def token_bytes(self, token: int) -> bytes:
        """One token's raw bytes: a byte-fallback token (part of a multi-byte
        character) is its own byte, not a replacement character."""
        return bytes(self._vocabulary().token_to_piece(token, special=True))

    # ------------------------------------------------------------------ reports

    def statistics(self) -> dict:
        """Each bound in use and in all ({"used", "capacity"} by name)."""
        raise NotImplementedError

    def report(self) -> dict:
        """The kind's part of the capability report: model, engine, budgets, load,
        invariance, and whatever else the kind serves."""
        raise NotImplementedError

    def capabilities(self) -> dict:
        """Model facts, budgets, live load and bounds: what a coordinator routes on."""
        return self.report() | {"task": self.task, "bounds": self.statistics()}
