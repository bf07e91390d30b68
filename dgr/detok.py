"""Incremental detokenization: text that never ends inside a UTF-8 character."""

from __future__ import annotations

import codecs
from typing import Callable


class IncrementalDetokenizer:
    """Turns token ids into text one token at a time.

    A token may carry only part of a character (byte-fallback tokens do); the
    bytes wait in the decoder until the character is whole, so a stream never
    shows half a character. `flush()` ends the stream; an incomplete tail then
    becomes U+FFFD.
    """

    def __init__(self, token_to_piece: Callable[[int], bytes]):
        self._piece = token_to_piece
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token: int) -> str:
        return self._decoder.decode(self._piece(token))

    def flush(self) -> str:
        return self._decoder.decode(b"", final=True)
