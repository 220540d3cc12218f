"""The line `execkit dispatch --once` prints when its pass ran nothing (issue #31: "did it
run?"): when the next issue is due, or that none is waiting. Apart from `_dispatch` so that
module gains one call, not a formatter."""

from __future__ import annotations

import time

from execkit.cli._output import safe_text, utc_stamp
from execkit.dispatch import Board, DispatchConfig, issue_statuses
from execkit.ledger import Ledger

__all__ = ["nothing_due_line"]


def nothing_due_line(
    board: Board, ledger: Ledger, config: DispatchConfig, now: float | None = None
) -> str:
    """`nothing due, next at <UTC time> (in <n>s: <issue>)` for the earliest backoff among
    the board's issues, else `nothing due: no issue is eligible or backing off`."""
    at = time.time() if now is None else now
    waiting = [
        (row.next_attempt_at, row.issue_id)
        for row in issue_statuses(ledger, config, board=board, now=at)
        if row.next_attempt_at is not None
    ]
    if not waiting:
        return "nothing due: no issue is eligible or backing off"
    next_at, issue_id = min(waiting)
    return safe_text(
        f"nothing due, next at {utc_stamp(next_at)} (in {max(0.0, next_at - at):.0f}s: {issue_id})"
    )
