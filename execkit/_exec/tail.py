"""A bounded tail buffer: keep the LAST `limit` bytes of a stream and count all of them.

It also keeps up to `context` bytes from just before the tail, so a redactor can see a
credential that the cut sliced in two. Memory never exceeds `limit + context` bytes plus
one fed chunk, whatever the stream length: the buffer grows until it holds that much and
from then on is a ring that is overwritten in place, so each byte is copied once.

`fill(fd)` reads straight from a file descriptor into the ring (no intermediate `bytes`
per read), which is what the supervisor does for a stream nobody watches live.

`kept()` is what of the tail is stored as text. A tail that is binary output (more than a
quarter of it NUL bytes or bytes that are not UTF-8: random data, compressed or
executable files, text in a legacy 8-bit encoding) is not kept as text: decoded, it
would be replacement characters an operator cannot read, it can hold a credential in a
form no text rule recognises (a DER key, a memory dump), and it costs the redactor most
(every character it looks for occurs somewhere in it). Only the text after its last NUL or
undecodable byte is kept, with the count of the bytes dropped before it, as journald
shows "[blob data]" and grep "binary file matches".
"""

from __future__ import annotations

import os
from typing import NamedTuple

__all__ = ["KeptText", "TailBuffer"]

# A UTF-8 continuation byte is 0b10xxxxxx; a character is at most 4 bytes long, so at
# most 3 of them can precede the first character boundary of a cut tail.
_MAX_CONTINUATION_SKIP = 3

# Bytes read at once while the buffer is still growing (a full pipe's worth by default).
_GROW_READ = 64 * 1024

# A tail is binary output when more than one byte in this many is a NUL or not UTF-8.
# Text in UTF-8 has none; Latin-1 French or German has 1 in 6 to 1 in 11; random or
# compressed data has about 2 in 5, an executable 1 in 3 besides its NULs.
_BINARY_SHARE = 4


def _decode(data: bytes | memoryview) -> str:
    """UTF-8 with replacement: the one way bytes of a tail become text (tests count the
    bytes that pass here: each kept byte is decoded once)."""
    return str(data, "utf-8", "replace")


class KeptText(NamedTuple):
    """What of a tail is kept as text (see `TailBuffer.kept`)."""

    text: str
    """The kept text, decoded as UTF-8 with replacement (not yet redacted)."""
    context: str
    """What came just before `text`, so a redactor can see a credential cut in two."""
    binary_bytes: int
    """Bytes of binary output just before `text` that are not kept (0: none)."""


_NOTHING = KeptText("", "", 0)


class TailBuffer:
    """The last `limit` bytes fed, the exact byte total, and whether anything was dropped.

    Raises ValueError when `limit` < 1 or `context` < 0.
    """

    __slots__ = ("_buf", "_keep", "_limit", "_pos", "_view", "total")

    def __init__(self, limit: int, context: int = 0) -> None:
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        if context < 0:
            raise ValueError(f"context must be >= 0, got {context}")
        self._limit = limit
        self._keep = limit + context
        self._buf = bytearray()
        # -1 while the buffer grows; once it holds `_keep` bytes, the index of the oldest
        # byte in the ring (where the next byte is written).
        self._pos = -1
        self._view: memoryview | None = None
        self.total = 0

    @property
    def limit(self) -> int:
        return self._limit

    @property
    def truncated(self) -> bool:
        """True when more bytes were fed than the buffer keeps."""
        return self.total > self._limit

    def _become_ring(self) -> None:
        # From now on the length never changes, so the exported view is safe to hold.
        self._pos = 0
        self._view = memoryview(self._buf)

    def feed(self, chunk: bytes | bytearray | memoryview) -> None:
        """Append one chunk, dropping the oldest bytes beyond the limit."""
        size = len(chunk)
        if not size:
            return
        self.total += size
        keep = self._keep
        buf = self._buf
        pos = self._pos
        if pos < 0:
            if size >= keep:
                buf[:] = memoryview(chunk)[size - keep :]
                self._become_ring()
                return
            buf += chunk
            if len(buf) >= keep:
                del buf[: len(buf) - keep]
                self._become_ring()
            return
        if size >= keep:
            buf[:] = memoryview(chunk)[size - keep :]  # same length: overwritten in place
            self._pos = 0
            return
        end = pos + size
        if end <= keep:
            buf[pos:end] = chunk
            self._pos = 0 if end == keep else end
        else:
            first = keep - pos
            view = memoryview(chunk)
            buf[pos:] = view[:first]
            buf[: size - first] = view[first:]
            self._pos = size - first

    def fill(self, fd: int) -> int:
        """Read once from `fd` into the buffer; return the byte count (0 at end of file).

        Raises what `os.read`/`os.readv` raise (BlockingIOError on an empty non-blocking
        pipe). Once the buffer is full (and at least 64 KiB), the kernel copies straight
        into the ring; reads are at most 64 KiB while it grows, and at most the ring.
        """
        pos = self._pos
        if pos < 0 or self._keep < _GROW_READ:  # growing, or a ring smaller than a read
            chunk = os.read(fd, _GROW_READ)
            if chunk:  # an end of file (the last read of every stream) feeds nothing
                self.feed(chunk)
            return len(chunk)
        view = self._view
        assert view is not None
        count = os.readv(fd, [view[pos:], view[:pos]] if pos else [view])
        if count:
            self.total += count
            self._pos = (pos + count) % self._keep
        return count

    def _segments(self, start: int, stop: int) -> list[memoryview]:
        """Views of the kept bytes [start, stop) in stream order (0 is the oldest kept)."""
        buf = memoryview(self._buf)
        pos = self._pos
        if pos <= 0:
            return [buf[start:stop]]
        size = len(buf)
        lo, hi = pos + start, pos + stop
        if hi <= size:
            return [buf[lo:hi]]
        if lo >= size:
            return [buf[lo - size : hi - size]]
        return [buf[lo:], buf[: hi - size]]

    def _tail_span(self) -> tuple[int, int]:
        kept = len(self._buf)
        return max(0, kept - self._limit), kept

    def tail_bytes(self) -> bytes:
        """The last `limit` bytes (fewer when fewer were fed), exactly as received."""
        return b"".join(self._segments(*self._tail_span()))

    def context_bytes(self) -> bytes:
        """Up to `context` bytes fed just before the tail (fewer when fewer were dropped)."""
        return b"".join(self._segments(0, self._tail_span()[0]))

    def text(self) -> str:
        """The tail decoded as UTF-8 with replacement; never raises.

        When the tail was cut, leading continuation bytes of a character whose start was
        dropped are skipped, so the text does not open with a replacement character.
        """
        return _decode(self._text_bytes())

    def _text_bytes(self) -> bytes | memoryview:
        start, stop = self._tail_span()
        if self.truncated:
            head = b"".join(self._segments(start, min(stop, start + _MAX_CONTINUATION_SKIP)))
            for byte in head:
                if byte & 0xC0 != 0x80:
                    break
                start += 1
        segments = self._segments(start, stop)
        # A wrapped ring is joined as bytes and decoded once: joining two decoded halves
        # would copy the text again, at up to four bytes per character.
        return segments[0] if len(segments) == 1 else b"".join(segments)

    def kept(self) -> KeptText:
        """The tail as `text()` decodes it, with the bytes before it as `context` when it
        was cut; or, when the tail is binary output, only the text after its last NUL or
        undecodable byte, with the text before that as `context`. Never raises.
        """
        if not self.total:
            return _NOTHING  # a silent stream (most stderr): nothing to slice or decode
        raw = self._text_bytes()
        text = _decode(raw)
        binary = text.count("\ufffd")  # no cost on text that cannot hold one (ASCII)
        if "\0" in text:  # a memchr; counting costs more than the decode
            binary += text.count("\0")
        if binary * _BINARY_SHARE <= len(raw):
            context = "" if not self.truncated else _decode(self.context_bytes())
            return KeptText(text, context, 0)
        cut = max(text.rfind("\ufffd"), text.rfind("\0")) + 1
        after = text[cut:]
        # `after` holds no replacement character, so it encodes back to exactly its bytes;
        # the rest of the tail (a cut character's skipped bytes included) is dropped.
        start, stop = self._tail_span()
        dropped = stop - start - len(after.encode("utf-8"))
        return KeptText(after, text[max(0, cut - self._keep + self._limit) : cut], dropped)
