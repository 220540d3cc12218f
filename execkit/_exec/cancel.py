"""`Cancellation`: a one-shot signal, from any thread, that ends work in flight.

A spawn watches it as it watches its pipes (the read end of a pipe is in the supervisor's
poll set), so a cancel is noticed within one turn of the loop wherever the child is: the
whole tree is SIGKILLed and reaped, then `SpawnCancelled` is raised. Code that waits
between spawns (a retry's backoff) asks `wait(seconds)`, which returns early on a cancel.

Why a pipe and not a `threading.Event`: the supervisor blocks in `poll`, and only a file
descriptor can wake it; the event is kept beside it for cheap checks and waits.
"""

from __future__ import annotations

import contextlib
import os
import threading

__all__ = ["Cancellation"]


class Cancellation:
    """A cancel signal for spawns and the loops around them (see the module docstring).

    `cancel()` is idempotent and safe from any thread (a dispatcher's stop, an asyncio
    task's cancel); `cancelled` says whether it happened; `wait(s)` sleeps up to `s`
    seconds and returns True as soon as it is cancelled. `close()` (or the context manager)
    gives back the two descriptors; a closed cancellation still reports `cancelled`.
    """

    def __init__(self) -> None:
        self._read, self._write = os.pipe()
        os.set_blocking(self._write, False)
        self._event = threading.Event()
        self._lock = threading.Lock()
        self._closed = False

    def fileno(self) -> int:
        """The descriptor that becomes readable on a cancel (for a poll loop)."""
        return self._read

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()

    def cancel(self) -> None:
        with self._lock:
            if self._event.is_set():
                return
            self._event.set()
            if not self._closed:
                with contextlib.suppress(OSError):  # a full pipe is readable already
                    os.write(self._write, b"x")

    def wait(self, seconds: float) -> bool:
        """Sleep up to `seconds`; True at once when cancelled (before or during)."""
        return self._event.wait(max(0.0, seconds))

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                os.close(self._read)
                os.close(self._write)

    def __enter__(self) -> Cancellation:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Cancellation cancelled={self.cancelled}>"
