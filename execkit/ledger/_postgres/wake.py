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


class WakeListener:
    """One LISTEN connection, opened with `connect` on the first wait, used by one waiter at
    a time (a lock: a dispatcher has one waker thread)."""

    def __init__(self, connect: Callable[[], Any]) -> None:
        self._connect = connect
        self._conn: Any = None
        self._lock = threading.Lock()

    def wait(self, seen: int, timeout_s: float, read: Callable[[], int]) -> int:
        """The wake number once it differs from `seen`, or after `timeout_s`."""
        deadline = time.monotonic() + timeout_s
        with self._lock:
            conn = self._listening()
            current = read()
            while current == seen:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                if conn is None:
                    time.sleep(min(_FALLBACK_POLL_S, left))
                else:
                    try:
                        for _note in conn.notifies(timeout=left, stop_after=1):
                            break
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
        with self._lock:
            self._drop()
