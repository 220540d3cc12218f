"""Wake-ups (issue #51): a dispatcher that waits learns at once that an operator let work
run again, instead of at its next pass.

An operation that may let a waiting task run (`resume_lane`, `retry_task`, a raised
`set_attempt_limit`, `set_lane_config`) bumps the ledger's wake number (`ledger_meta` key
`wake`) in its own transaction (`_wake`). `wait_for_wake(seen, timeout_s)` returns as soon as
the number differs from `seen` (at most `timeout_s` later): the store's way of waiting,
PostgreSQL's `LISTEN`/`NOTIFY` (the bump notifies `execkit_wake` at its commit), SQLite's
poll of one row, through a server a long poll. A dispatcher waits on it in a thread of its
own and runs a pass at once when it returns a new number.
"""

from __future__ import annotations

from execkit._errors import InvalidInput
from execkit._validate import is_number
from execkit.ledger._core.base import CoreBase
from execkit.ledger._core.store import Tx

__all__ = ["MAX_WAKE_WAIT_S", "WAKE_CHANNEL", "WAKE_META_KEY", "WakeOps"]

WAKE_META_KEY = "wake"
WAKE_CHANNEL = "execkit_wake"
MAX_WAKE_WAIT_S = 300.0


class WakeOps(CoreBase):
    """The wake number: bumped by operations that let work run, waited on by dispatchers."""

    def _wake(self, tx: Tx) -> None:
        """Inside an operation's transaction: bump the wake number (and notify, where the
        backend can) so every waiting dispatcher runs a pass once it commits."""
        raw = tx.meta(WAKE_META_KEY)
        seq = (int(raw) if raw is not None and raw.isdigit() else 0) + 1
        tx.set_meta(WAKE_META_KEY, str(seq))
        tx.notify(WAKE_CHANNEL, str(seq))

    def wake_seq(self) -> int:
        """The ledger's wake number now (0 before the first wake)."""
        with self._store.read() as tx:
            raw = tx.meta(WAKE_META_KEY)
        return int(raw) if raw is not None and raw.isdigit() else 0

    def wait_for_wake(self, seen: int, timeout_s: float) -> int:
        """The wake number once it differs from `seen`, or after `timeout_s` seconds
        (0..300), whichever comes first. InvalidInput for a timeout out of range."""
        if not is_number(timeout_s) or not 0 <= timeout_s <= MAX_WAKE_WAIT_S:
            raise InvalidInput(
                f"timeout_s must be a number of seconds in 0..{MAX_WAKE_WAIT_S:g}, "
                f"got {timeout_s!r}",
                field="timeout_s",
            )
        if type(seen) is not int:
            raise InvalidInput(f"seen must be an integer, got {seen!r}", field="seen")
        return self._store.wait_for_wake(seen, float(timeout_s), self.wake_seq)
