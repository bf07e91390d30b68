"""The Responses API's bounded store of recent conversations by response id, which
`previous_response_id` continues (dgr.doors.responses); the server owns one
(dgr.doors.context)."""

from __future__ import annotations

import collections
import json
from typing import Optional


class ResponseStore:
    """Recent conversations by response id, least recently used out beyond
    `max_count` entries or `max_bytes` of JSON text (0 keeps none)."""

    def __init__(self, max_count: int, max_bytes: int):
        self._max_count, self._max_bytes = max_count, max_bytes
        self._entries: collections.OrderedDict[str, tuple[list[dict], int]] = \
            collections.OrderedDict()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def bytes(self) -> int:
        return self._bytes

    def statistics(self) -> dict:
        """Its bounds in use and in all (beside Node.statistics under /capabilities'
        "bounds")."""
        return {"response_store_entries": {"used": len(self._entries),
                                           "capacity": self._max_count},
                "response_store_bytes": {"used": self._bytes, "capacity": self._max_bytes}}

    def put(self, response_id: str, messages: list[dict]) -> None:
        size = len(json.dumps(messages, ensure_ascii=False).encode())
        if size > self._max_bytes or self._max_count == 0:
            return
        self._entries[response_id] = (messages, size)
        self._bytes += size
        while len(self._entries) > self._max_count or self._bytes > self._max_bytes:
            _, (_, dropped) = self._entries.popitem(last=False)
            self._bytes -= dropped

    def get(self, response_id: str) -> Optional[list[dict]]:
        entry = self._entries.get(response_id)
        if entry is None:
            return None
        self._entries.move_to_end(response_id)
        return entry[0]
