"""Waiting for a wake-up on PostgreSQL: `LISTEN execkit_wake` on a connection of its own.

The operation that bumps the ledger's wake number also sends `pg_notify('execkit_wake',
N)` in its transaction (`PostgresTx.notify`), delivered when it commits. A waiter listens
first, then reads the number (a bump that committed before the LISTEN is seen by the read,
one after it by the notification), then waits for a notification at most the time left.
The connection is kept for the next wait; one that fails is dropped and the next wait opens
another, and a wait whose connection cannot be opened falls back to reading the number once
a second, so a lost server costs latency, never a missed wake.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable
from typing import Any

__all__ = ["WakeListener"]

_CHANNEL = "execkit_wake"
_FALLBACK_POLL_S = 1.0
# A wait listens in slices this long, so that `close` (the ledger closing at the end of a
# dispatcher) waits at most one slice for a waiter, never its whole timeout; a notification
# ends a slice at once, so the slices cost no latency.
_SLICE_S = 0.25


class WakeListener:
    """One LISTEN connection, opened with `connect` on the first wait, used by one waiter at
    a time (a lock: a dispatcher has one waker thread). After `close`, a wait in progress
    ends within a slice and every later wait answers at once."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._conn: Any = None
        self._lock = threading.Lock()
        self._closing = threading.Event()

    def wait(self, seen: int, timeout_s: float, read: Callable[[], int]) -> int:
        """The wake number once it differs from `seen`, or after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            conn = None if self._closing.is_set() else self._listening()
            current = read()
            while current == seen and not self._closing.is_set():
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if conn is None:
                    self._closing.wait(min(_FALLBACK_POLL_S, left))
                else:
                    try:
                        notified = False
                        for _note in conn.notifies(timeout=min(_SLICE_S, left), stop_after=1):
                            notified = True
                        if not notified:
                            continue  # a quiet slice: nothing to read again
                    except Exception:  # any failure of the listener: poll from here on
                        self._drop()
                        conn = None
                current = read()
            return current

    def _listening(self) -> Any:
        if self._conn is not None and not self._conn.closed:
            return self._conn
        try:
            conn = self._connect()
            conn.execute(f"LISTEN {_CHANNEL}")
        except Exception:  # no listener: the wait polls instead
            return None
        self._conn = conn
        return conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):  # closing a broken connection
                conn.close()

    def close(self) -> None:
        """Drop the connection, after the wait in progress (if any) has seen the close."""
        self._closing.set()
        with self._lock:
            self._drop()
