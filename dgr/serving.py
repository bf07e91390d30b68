"""What every node kind offers the server and a library caller, in one interface
(`ServingNode`): the task it serves, its gate (dgr.admission.Gate: open, draining or
failed, with the reasons every kind refuses with), a drain that waits for its last
piece of work to leave (woken as each one leaves, never polling), its bounds
(`statistics`), its report (`capabilities`: one shape for every kind) and its
metrics (`telemetry.exposition`). dgr.node.Node generates; dgr.embedding.EmbeddingNode
embeds or reranks. The server holds a ServingNode and asks its `task` what it
serves."""

from __future__ import annotations

from typing import Optional

import trio

from dgr.admission import Gate

TASKS = ("generation", "embedding", "rerank")


class ServingNode:
    """A node of any kind (module doc). A kind sets `task`, hands its gate and the
    parking lot it unparks whenever a piece of work (a session, a request) leaves,
    and gives `in_flight`, `statistics`, `report` and its vocabulary's answers."""

    task: str = "generation"

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
