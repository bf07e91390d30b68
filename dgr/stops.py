"""Stop strings over a stream of text pieces."""

from __future__ import annotations

from typing import Sequence


class StopMatcher:
    """Holds back text that could be the start of a stop string.

    `feed(text)` returns (visible, stopped): visible text is safe to show; once
    a stop string appears, the text before it is returned and stopped is True
    (the stop string itself is never shown, as in the OpenAI API).
    """

    def __init__(self, stops: Sequence[str]):
        self._stops = [s for s in stops if s]
        self._held = ""
        self.matched: str | None = None  # the stop string that ended the text

    @property
    def active(self) -> bool:
        """There is a stop string to match."""
        return bool(self._stops)

    def feed(self, text: str) -> tuple[str, bool]:
        if not self._stops:
            return text, False
        self._held += text
        hits = [(i, s) for i, s in ((self._held.find(s), s) for s in self._stops) if i >= 0]
        if hits:
            at, self.matched = min(hits, key=lambda hit: hit[0])
            visible = self._held[:at]
            self._held = ""
            return visible, True
        keep = self._longest_stop_prefix_suffix()
        visible, self._held = self._held[:len(self._held) - keep], self._held[len(self._held) - keep:]
        return visible, False

    def flush(self) -> str:
        held, self._held = self._held, ""
        return held

    def _longest_stop_prefix_suffix(self) -> int:
        best = 0
        for stop in self._stops:
            for n in range(min(len(stop) - 1, len(self._held)), best, -1):
                if self._held.endswith(stop[:n]):
                    best = n
                    break
        return best
