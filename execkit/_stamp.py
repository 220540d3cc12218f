"""Times and durations as a person reads them: the one printer of each, total.

Every time execkit prints (a lane's opening, a task's next attempt, a lease's end, an
audit entry's moment) goes through `utc_stamp`, and every "in 3m" through `span`. Both
are total: any float, however a vendor, a stored row or a hand-written history made it
(a reset `1e308` seconds away, a negative epoch, NaN), gives a line of text and never
raises, because a printer that raises turns one odd value into a command that exits 70.
The ledger bounds the times it stores (a task never waits longer than a lane's longest
park), so the out-of-range words below are for values that came from elsewhere.
"""

from __future__ import annotations

import datetime
import math

__all__ = ["span", "utc_stamp"]

_LAST = datetime.datetime.max.replace(tzinfo=datetime.UTC).timestamp()
_FIRST = datetime.datetime.min.replace(tzinfo=datetime.UTC).timestamp()


def utc_stamp(at: float) -> str:
    """`at` (POSIX seconds) as an ISO 8601 UTC time to the second
    (`2026-12-03T18:21:51+00:00`); a time beyond what a calendar date can hold as
    `after 9999-12-31T23:59:59+00:00` (or `before 0001-01-01T00:00:00+00:00`), and a
    value that is no time at all (NaN, not a number) as `an unreadable time`."""
    try:
        seconds = float(at)
    except (TypeError, ValueError, OverflowError):
        return "an unreadable time"
    if math.isnan(seconds):
        return "an unreadable time"
    if seconds >= _LAST:
        return "after " + datetime.datetime.max.replace(tzinfo=datetime.UTC).isoformat(
            timespec="seconds"
        )
    if seconds < _FIRST:
        return "before " + datetime.datetime.min.replace(tzinfo=datetime.UTC).isoformat(
            timespec="seconds"
        )
    return datetime.datetime.fromtimestamp(seconds, tz=datetime.UTC).isoformat(timespec="seconds")


def span(seconds: float) -> str:
    """A length of time to a person's precision: `42s`, `17m`, `5.2h`, `3.0d`, then
    `over 100 years`; a negative one as its size; NaN as `an unknown time`."""
    try:
        size = abs(float(seconds))
    except (TypeError, ValueError, OverflowError):
        return "an unknown time"
    if math.isnan(size):
        return "an unknown time"
    if size < 90:
        return f"{size:.0f}s"
    if size < 5400:
        return f"{size / 60:.0f}m"
    if size < 172800:
        return f"{size / 3600:.1f}h"
    if size < 100 * 365.25 * 86400:
        return f"{size / 86400:.1f}d"
    return "over 100 years"
