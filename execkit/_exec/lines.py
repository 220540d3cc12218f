"""The line hook: each complete line of a child's output handed to one callback as it
arrives, and the callback's one way to answer, `StopTree`.

`spawn(on_line=hook)` calls `hook(Line(stream, text, cut))` in the spawn's thread for every
complete line of stdout and of stderr, in the order the poll loop reads them, while the
child runs (and for what is left in the pipes after it exits). A line is the bytes up to a
newline, without it (and without a `\\r` before it), decoded as UTF-8 with replacement and
**not redacted**: the hook reads what the CLI printed, as `on_stdout` does, and must mask
whatever of it it keeps or prints. A stream's last line without a newline is handed over
when the stream ends. Blank lines are not handed over.

The cost is bounded by the bytes read: each byte is searched once for a newline (in C),
and a line is copied at most once into a pending buffer, which never holds more than
`LINE_BYTES`; a longer line is cut: its first `LINE_BYTES` are handed over with
`cut=True` and the rest of it, up to its newline, is skipped. Memory stays flat whatever
the child prints.

The hook returns None to go on, or a `StopTree` to end the spawn now: the tree is stopped
as on a timeout (SIGTERM, `kill_grace`, SIGKILL), what the pipes still hold is read, and
the result says so (`SpawnResult.stopped_by`, the `StopTree`'s `why`; `timed_out` stays
False). A stop asked after the child exited by itself changes nothing; after the first,
later stops are ignored, though lines are still handed over. A hook that raises ends the
tree at once and the exception propagates (as a raising `on_stdout` does).

One mechanism for every concern that reads output as it is printed: a vendor adapter's
watch for its CLI's announced retry sleeps (`execkit._adapter`), a spend meter reading
usage events from stdout, a stall watchdog (no line for S seconds: an appointment of the
poll loop, beside the heartbeat, answering with the same `StopTree`). A caller that wants
several composes them into the one hook a spawn takes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal, NamedTuple

import attrs

__all__ = ["LINE_BYTES", "Line", "LineHook", "LineSplitter", "StopTree"]

LINE_BYTES = 8 * 1024
"""The longest line handed over whole: a longer one is cut to its first `LINE_BYTES`."""

Stream = Literal["stdout", "stderr"]


class Line(NamedTuple):
    """One complete line of a child's output, as the line hook receives it."""

    stream: Stream
    """`stdout` or `stderr`."""
    text: str
    """The line without its line ending, decoded as UTF-8 with replacement; not redacted."""
    cut: bool = False
    """The line was longer than `LINE_BYTES`: `text` is only its start."""


@attrs.frozen
class StopTree:
    """A line hook's answer that ends the spawn: the tree is stopped as on a timeout and
    `why` (masked) is kept as `SpawnResult.stopped_by`."""

    why: str = attrs.field(validator=attrs.validators.instance_of(str))


LineHook = Callable[[Line], "StopTree | None"]
"""`spawn(on_line=...)`: called with each complete line; returns None or a `StopTree`."""


class LineSplitter:
    """One stream's bytes cut into lines for a hook; `stop` is the hook's first `StopTree`.

    `feed(chunk)` for each chunk read, `end()` once the stream is at its end. What the hook
    raises propagates.
    """

    __slots__ = ("_hook", "_pending", "_skipping", "_stream", "stop")

    def __init__(self, stream: Stream, hook: LineHook) -> None:
        self._stream: Stream = stream
        self._hook = hook
        self._pending = bytearray()
        # The current line was already handed over cut: skip it up to its newline.
        self._skipping = False
        self.stop: StopTree | None = None

    def feed(self, chunk: bytes) -> StopTree | None:
        """Hand over every line `chunk` completes; keep the unfinished rest (bounded).
        Returns the hook's first `StopTree` once there is one."""
        start = 0
        size = len(chunk)
        find = chunk.find
        while start < size:
            newline = find(b"\n", start)
            if newline < 0:
                self._hold(chunk, start, size)
                break
            self._complete(chunk, start, newline)
            start = newline + 1
        return self.stop

    def end(self) -> StopTree | None:
        """The stream ended: hand over its last line if it had no newline."""
        if self._pending and not self._skipping:
            self._hand(bytes(self._pending), cut=False)
        self._pending.clear()
        self._skipping = False
        return self.stop

    def _hold(self, chunk: bytes, start: int, stop: int) -> None:
        """Keep `chunk[start:stop]` (no newline in it) as the start of the current line."""
        if self._skipping:
            return
        room = LINE_BYTES - len(self._pending)
        if stop - start <= room:
            self._pending += chunk[start:stop]
            return
        # The line is longer than a line may be: hand over its start now, skip the rest.
        self._pending += chunk[start : start + room]
        self._hand(bytes(self._pending), cut=True)
        self._pending.clear()
        self._skipping = True

    def _complete(self, chunk: bytes, start: int, newline: int) -> None:
        """The current line ends at `chunk[newline]`."""
        if self._skipping:
            self._skipping = False
            return
        room = LINE_BYTES - len(self._pending)
        cut = newline - start > room
        piece = chunk[start : start + room] if cut else chunk[start:newline]
        if self._pending:
            self._pending += piece
            data = bytes(self._pending)
            self._pending.clear()
        else:
            data = piece
        self._hand(data, cut=cut)

    def _hand(self, data: bytes, *, cut: bool) -> None:
        if data.endswith(b"\r"):
            data = data[:-1]
        if not data or data.isspace():
            return
        answer = self._hook(Line(self._stream, data.decode("utf-8", "replace"), cut))
        if answer is not None and self.stop is None:
            if not isinstance(answer, StopTree):
                raise TypeError(
                    f"a line hook returns None or a StopTree, got {type(answer).__name__}"
                )
            self.stop = answer
