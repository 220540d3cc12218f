"""A bounded tail buffer: keep the LAST `limit` bytes of a stream and count all of them.

It also keeps up to `context` bytes from just before the tail, so a redactor can see a
credential that the cut sliced in two. Memory stays below `2 * (limit + context)` plus
one fed chunk whatever the stream length: the buffer is compacted only when it doubles,
so each byte is copied a bounded number of times.
"""

from __future__ import annotations

__all__ = ["TailBuffer"]

# A UTF-8 continuation byte is 0b10xxxxxx; a character is at most 4 bytes long, so at
# most 3 of them can precede the first character boundary of a cut tail.
_MAX_CONTINUATION_SKIP = 3


def _is_continuation(byte: int) -> bool:
    return byte & 0xC0 == 0x80


class TailBuffer:
    """The last `limit` bytes fed, the exact byte total, and whether anything was dropped.

    Raises ValueError when `limit` < 1 or `context` < 0.
    """

    __slots__ = ("_buf", "_keep", "_limit", "total")

    def __init__(self, limit: int, context: int = 0) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        if context < 0:
            raise ValueError(f"context must be >= 0, got {context}")
        self._limit = limit
        self._keep = limit + context
        self._buf = bytearray()
        self.total = 0

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def truncated(self) -> bool:
        """True when more bytes were fed than the buffer keeps."""
        return self.total > self._limit

    def feed(self, chunk: bytes) -> None:
        """Append one chunk, dropping the oldest bytes beyond the limit."""
        size = len(chunk)
        if not size:
            return
        self.total += size
        if size >= self._keep:
            self._buf[:] = chunk[-self._keep :]
            return
        self._buf += chunk
        if len(self._buf) >= 2 * self._keep:
            del self._buf[: len(self._buf) - self._keep]

    def tail_bytes(self) -> bytes:
        """The last `limit` bytes (fewer when fewer were fed), exactly as received."""
        return bytes(self._buf[-self._limit :])

    def context_bytes(self) -> bytes:
        """Up to `context` bytes fed just before the tail (fewer when fewer were dropped)."""
        return bytes(self._buf[-self._keep : -self._limit])

    def text(self) -> str:
        """The tail decoded as UTF-8 with replacement; never raises.

        When the tail was cut, leading continuation bytes of a character whose start was
        dropped are skipped, so the text does not open with a replacement character.
        """
        data = self._buf[-self._limit :]
        start = 0
        if self.truncated:
            while (
                start < len(data)
                and start < _MAX_CONTINUATION_SKIP
                and _is_continuation(data[start])
            ):
                start += 1
        return data[start:].decode("utf-8", errors="replace")
