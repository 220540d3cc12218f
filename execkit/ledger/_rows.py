"""The row shapes both SQL backends share: a run row and a task row with its summary.

Each backend writes its own SELECT (its joins and placeholders differ) but returns the
columns in the order named here, so one mapping reads them: `run_from_row` for
`RUN_COLUMNS`, `task_from_row` for the task columns followed by `SUMMARY_COLUMNS`, and
`summary_values` writes a summary back in `SUMMARY_COLUMNS` order. A stored value outside
its enum (a newer writer, a hand edit) is a StorageError naming the row, never a traceback.
"""

from __future__ import annotations

import enum
from collections.abc import Sequence
from typing import Any, TypeVar

from execkit._budget import Attempt, AttemptStatus, HistorySummary
from execkit._classify import FailureClass
from execkit._errors import StorageError
from execkit.ledger._core import TaskRecord
from execkit.ledger._model import Run, TaskStatus

__all__ = [
    "RUN_COLUMNS",
    "SUMMARY_COLUMNS",
    "domain",
    "run_from_row",
    "summary_values",
    "task_from_row",
]

RUN_COLUMNS = (
    "id",
    "task_id",
    "attempt",
    "status",
    "failure_class",
    "reason",
    "request_key",
    "actor",
    "forced",
    "started_at",
    "ended_at",
    "owner_host",
    "owner_pid",
    "lease_expires_at",
    "not_before",
)
SUMMARY_COLUMNS = (
    "attempts_used",
    "charged_attempts",
    "uncharged_streak",
    "streak_reason",
    "running",
    "last_number",
    "last_status",
    "last_class",
    "last_reason",
    "last_started_at",
    "last_ended_at",
    "last_forced",
    "last_not_before",
)

_E = TypeVar("_E", bound=enum.Enum)


def domain(kind: type[_E], value: Any, where: str) -> _E:
    """A stored value as its enum; one this execkit does not know is a StorageError
    naming the row (`where`)."""
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(str(member.value) for member in kind)
        raise StorageError(
            f"{where} holds {value!r}, which is not one of {allowed}; "
            "`execkit db check` lists every such row"
        ) from None


def run_from_row(row: Sequence[Any]) -> Run:
    where = f"run {row[0]!r}"
    return Run(
        id=row[0],
        task_id=row[1],
        attempt=row[2],
        status=domain(AttemptStatus, row[3], f"{where} status"),
        failure_class=None if row[4] is None else domain(FailureClass, row[4], f"{where} class"),
        reason=row[5],
        request_key=row[6],
        actor=row[7],
        forced=bool(row[8]),
        started_at=row[9],
        ended_at=row[10],
        owner_host=row[11],
        owner_pid=row[12],
        lease_expires_at=row[13],
        not_before=row[14],
    )


def _summary_from_row(row: Sequence[Any]) -> HistorySummary:
    if row[0] is None:  # no summary row (a left join): the task has no history yet
        return HistorySummary()
    last = None
    if row[5] is not None:
        last = Attempt(
            number=row[5],
            status=domain(AttemptStatus, row[6], "summary last_status"),
            failure_class=None
            if row[7] is None
            else domain(FailureClass, row[7], "summary last_class"),
            reason=row[8],
            started_at=row[9],
            ended_at=row[10],
            forced=bool(row[11]),
            not_before=row[12],
        )
    return HistorySummary(
        attempts_used=row[0],
        charged_attempts=row[1],
        uncharged_streak=row[2],
        streak_reason=row[3],
        running=row[4],
        last=last,
    )


def summary_values(summary: HistorySummary) -> tuple[Any, ...]:
    """`summary` as the values of `SUMMARY_COLUMNS` (enums as their strings)."""
    last = summary.last
    return (
        summary.attempts_used,
        summary.charged_attempts,
        summary.uncharged_streak,
        summary.streak_reason,
        summary.running,
        None if last is None else last.number,
        None if last is None else str(last.status),
        None if last is None or last.failure_class is None else str(last.failure_class),
        None if last is None else last.reason,
        None if last is None else last.started_at,
        None if last is None else last.ended_at,
        last is not None and last.forced,
        None if last is None else last.not_before,
    )


def task_from_row(row: Sequence[Any]) -> TaskRecord:
    """A task row: id, title, status, created_by, created_at, max_attempts (0: none),
    max_uncharged_attempts, retry_requested_by, gave_up_at_attempt, then the summary."""
    return TaskRecord(
        id=row[0],
        title=row[1],
        status=domain(TaskStatus, row[2], f"task {row[0]!r} status"),
        created_by=row[3],
        created_at=row[4],
        max_attempts=row[5],
        max_uncharged_attempts=row[6],
        retry_requested_by=row[7],
        gave_up_at_attempt=row[8],
        summary=_summary_from_row(row[9:]),
    )
