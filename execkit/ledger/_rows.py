"""The row shapes both SQL backends share, mapped by column name: a run row, a task row with
its summary, an audit row and a grant row.

Each backend writes its own SELECT (its joins and placeholders differ) and returns each row
as a mapping from column name to value (`sqlite3.Row`, psycopg's `dict_row`): the names
below, never positions, so a column added to a table or a SELECT cannot shift the others.
`run_from_row` reads `RUN_COLUMNS`, `task_from_row` reads `TASK_COLUMNS` and
`SUMMARY_COLUMNS`; `summary_row` gives a summary to write back as a mapping keyed by
`SUMMARY_COLUMNS`, which the backends' statements name as parameters (`:name`,
`%(name)s`). A column missing from a row is a KeyError: a bug in a SELECT, which the contract
tests meet on their first read. A stored value outside its enum (a newer writer, a hand
edit) is a StorageError naming the row, never a traceback.
"""

from __future__ import annotations

import enum
import functools
import json
import operator
from typing import Any, Protocol, TypeVar

import attrs

from execkit._budget import Attempt, AttemptStatus, HistorySummary
from execkit._classify import FailureClass
from execkit._errors import InvalidInput, StorageError
from execkit._lanes import LaneEvent, LaneEventKind, LaneState, LaneSummary
from execkit.ledger._core import TaskRecord
from execkit.ledger._model import AuditEvent, Grant, Run, TaskStatus

__all__ = [
    "AUDIT_COLUMNS",
    "GRANT_COLUMNS",
    "LANE_COLUMNS",
    "LANE_EVENT_COLUMNS",
    "RUN_COLUMNS",
    "SUMMARY_COLUMNS",
    "TASK_COLUMNS",
    "TASK_ROW",
    "NamedRow",
    "audit_event_from_row",
    "domain",
    "grant_from_row",
    "lane_event_from_row",
    "lane_event_row",
    "lane_from_row",
    "lane_row",
    "run_from_row",
    "summary_row",
    "task_from_row",
    "task_from_values",
]


class NamedRow(Protocol):
    """A row read by column name (`sqlite3.Row`, a psycopg `dict_row` dict)."""

    def __getitem__(self, column: str, /) -> Any: ...


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
    "owner_boot_id",
    "owner_pid_namespace",
    "owner_pid_started_at",
    "owner_instance",
    "stopped",
)
TASK_COLUMNS = (
    "id",
    "title",
    "status",
    "created_by",
    "created_at",
    "max_attempts",  # 0: no explicit limit
    "max_uncharged_attempts",
    "retry_requested_by",
    "gave_up_at_attempt",
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
    "last_stopped",
)
AUDIT_COLUMNS = ("id", "at", "actor", "action", "task_id", "run_id", "detail")
GRANT_COLUMNS = ("principal", "role", "granted_by", "granted_at")
# A lane's stored state (the fold of its events) and one row of its history (issue #28).
LANE_COLUMNS = (
    "lane",
    "state",
    "until_at",
    "reason",
    "trips",
    "failures",  # JSON text: the upstream failure times inside the breaker's window
    "probe_run",
    "stopped_task",
    "capped",
    "events",
    "updated_at",
)
LANE_EVENT_COLUMNS = ("lane", "kind", "at", "actor", "run_id", "task_id", "until_at", "reason")

_E = TypeVar("_E", bound=enum.Enum)


@functools.cache
def _members(kind: type[_E]) -> dict[Any, _E]:
    return {member.value: member for member in kind}


def domain(kind: type[_E], value: Any, where: str, *keys: object) -> _E:
    """A stored value as its enum; one this execkit does not know is a StorageError
    naming the row: `where`, formatted with `keys` (`"run {!r} status", run_id`) only
    then, as every row read passes through here (a dict lookup, not the enum's call)."""
    member: _E | None = _members(kind).get(value)
    if member is not None:
        return member
    try:
        return kind(value)
    except ValueError:
        allowed = ", ".join(str(member.value) for member in kind)
        raise StorageError(
            f"{where.format(*keys)} holds {value!r}, which is not one of {allowed}; "
            "`execkit db check` lists every such row"
        ) from None


def run_from_row(row: NamedRow) -> Run:
    run_id = row["id"]
    failure_class = row["failure_class"]
    return Run(
        id=run_id,
        task_id=row["task_id"],
        attempt=row["attempt"],
        status=domain(AttemptStatus, row["status"], "run {!r} status", run_id),
        failure_class=None
        if failure_class is None
        else domain(FailureClass, failure_class, "run {!r} class", run_id),
        reason=row["reason"],
        request_key=row["request_key"],
        actor=row["actor"],
        forced=bool(row["forced"]),
        started_at=row["started_at"],
        ended_at=row["ended_at"],
        owner_host=row["owner_host"],
        owner_pid=row["owner_pid"],
        lease_expires_at=row["lease_expires_at"],
        not_before=row["not_before"],
        owner_boot_id=row["owner_boot_id"],
        owner_pid_namespace=row["owner_pid_namespace"],
        owner_pid_started_at=row["owner_pid_started_at"],
        owner_instance=row["owner_instance"],
        stopped=bool(row["stopped"]),
    )


_ATTEMPT_FIELDS = tuple(field.name for field in attrs.fields(Attempt))
# `_stored_attempt` sets the fields in this order, and `task_from_values` builds a summary
# and a record positionally: a change to `Attempt`, `HistorySummary` or `TaskRecord` must
# change them (the guards below fail at import otherwise).
_ATTEMPT_ORDER = (
    "number",
    "status",
    "failure_class",
    "reason",
    "started_at",
    "ended_at",
    "forced",
    "not_before",
    "stopped",
)
if _ATTEMPT_FIELDS != _ATTEMPT_ORDER:  # pragma: no cover - a guard for whoever edits Attempt
    raise ImportError(f"Attempt's fields are {_ATTEMPT_FIELDS}; _rows.py reads {_ATTEMPT_ORDER}")
_SUMMARY_ORDER = (
    "attempts_used",
    "charged_attempts",
    "uncharged_streak",
    "streak_reason",
    "running",
    "last",
)
if tuple(f.name for f in attrs.fields(HistorySummary)) != _SUMMARY_ORDER:  # pragma: no cover
    raise ImportError(f"HistorySummary's fields changed; _rows.py builds {_SUMMARY_ORDER}")
_RECORD_ORDER = (*TASK_COLUMNS, "summary")
if tuple(f.name for f in attrs.fields(TaskRecord)) != _RECORD_ORDER:  # pragma: no cover
    raise ImportError("TaskRecord's fields changed; _rows.py builds TASK_COLUMNS, summary")
_SET = object.__setattr__
# Each stored enum's members by value, looked up first on every row (`domain` is the
# fallback that names a value this execkit does not know).
_ATTEMPT_STATUSES = _members(AttemptStatus)
_FAILURE_CLASSES = _members(FailureClass)
_TASK_STATUSES = _members(TaskStatus)


def _stored_attempt(
    number: int,
    status: AttemptStatus,
    failure_class: FailureClass | None,
    reason: str | None,
    started_at: float | None,
    ended_at: float | None,
    forced: bool,
    not_before: float | None,
    stopped: bool,
) -> Attempt:
    """A summary's last attempt as its columns hold it, without `Attempt`'s validators:
    every listed task has one, and validating it cost half of listing 100,000 tasks. What
    they check is held by the schema (the enums, each read through `domain`; the number;
    the flag) or was checked when the attempt was written; `db check` validates every
    history and compares each stored summary with it, so a summary edited by hand is
    reported there. One statement a field (no loop): the fields are `_ATTEMPT_ORDER`."""
    attempt = _NEW(Attempt)
    _SET(attempt, "number", number)
    _SET(attempt, "status", status)
    _SET(attempt, "failure_class", failure_class)
    _SET(attempt, "reason", reason)
    _SET(attempt, "started_at", started_at)
    _SET(attempt, "ended_at", ended_at)
    _SET(attempt, "forced", forced)
    _SET(attempt, "not_before", not_before)
    _SET(attempt, "stopped", stopped)
    return attempt


_NEW = object.__new__
_EMPTY_SUMMARY = HistorySummary()
# The columns of a task row in the order `task_from_values` reads them: a SELECT that
# names `TASK_ROW` in this order may give its rows as plain tuples (SQLite's listing does:
# building a dict a row cost more than reading it).
TASK_ROW = TASK_COLUMNS + SUMMARY_COLUMNS


def task_from_values(values: tuple[Any, ...]) -> TaskRecord:
    """A task row as the values of `TASK_ROW`, in that order (NULL summary columns when
    it has no summary yet); a tuple of another length is a ValueError."""
    (
        task_id,
        title,
        status,
        created_by,
        created_at,
        max_attempts,
        max_uncharged_attempts,
        retry_requested_by,
        gave_up_at_attempt,
        attempts_used,
        charged_attempts,
        uncharged_streak,
        streak_reason,
        running,
        last_number,
        last_status,
        last_class,
        last_reason,
        last_started_at,
        last_ended_at,
        last_forced,
        last_not_before,
        last_stopped,
    ) = values
    if attempts_used is None:  # no summary row (a left join): no history yet
        summary = _EMPTY_SUMMARY
    else:
        last = None
        if last_number is not None:
            last = _stored_attempt(
                last_number,
                _ATTEMPT_STATUSES.get(last_status)
                or domain(AttemptStatus, last_status, "summary last_status"),
                None
                if last_class is None
                else _FAILURE_CLASSES.get(last_class)
                or domain(FailureClass, last_class, "summary last_class"),
                last_reason,
                last_started_at,
                last_ended_at,
                bool(last_forced),
                last_not_before,
                bool(last_stopped),
            )
        # Positional, in the field order (HistorySummary has no validators to skip).
        summary = HistorySummary(
            attempts_used, charged_attempts, uncharged_streak, streak_reason, running, last
        )
    return TaskRecord(
        task_id,
        title,
        _TASK_STATUSES.get(status) or domain(TaskStatus, status, "task {!r} status", task_id),
        created_by,
        created_at,
        max_attempts,
        max_uncharged_attempts,
        retry_requested_by,
        gave_up_at_attempt,
        summary,
    )


def summary_row(summary: HistorySummary) -> dict[str, Any]:
    """`summary` as the values of `SUMMARY_COLUMNS`, by name (enums as their strings)."""
    last = summary.last
    return {
        "attempts_used": summary.attempts_used,
        "charged_attempts": summary.charged_attempts,
        "uncharged_streak": summary.uncharged_streak,
        "streak_reason": summary.streak_reason,
        "running": summary.running,
        "last_number": None if last is None else last.number,
        "last_status": None if last is None else str(last.status),
        "last_class": None
        if last is None or last.failure_class is None
        else str(last.failure_class),
        "last_reason": None if last is None else last.reason,
        "last_started_at": None if last is None else last.started_at,
        "last_ended_at": None if last is None else last.ended_at,
        "last_forced": last is not None and last.forced,
        "last_not_before": None if last is None else last.not_before,
        "last_stopped": last is not None and last.stopped,
    }


def task_from_row(row: NamedRow) -> TaskRecord:
    """A task row by name: `TASK_COLUMNS` and `SUMMARY_COLUMNS` (NULL when it has no
    summary yet), read as `task_from_values` reads them in order."""
    return task_from_values(_task_row_values(row))


_task_row_values = operator.itemgetter(*TASK_ROW)  # by name, in one C call


def audit_event_from_row(row: NamedRow, detail: dict[str, Any]) -> AuditEvent:
    """An audit row (`AUDIT_COLUMNS`); `detail` is its `detail` column as the backend
    decoded it (JSON text on SQLite, jsonb on PostgreSQL)."""
    return AuditEvent(
        id=row["id"],
        at=row["at"],
        actor=row["actor"],
        action=row["action"],
        task_id=row["task_id"],
        run_id=row["run_id"],
        detail=detail,
    )


def grant_from_row(row: NamedRow) -> Grant:
    """A role grant row (`GRANT_COLUMNS`)."""
    return Grant(
        principal=row["principal"],
        role=row["role"],
        granted_by=row["granted_by"],
        granted_at=row["granted_at"],
    )


def lane_from_row(row: NamedRow) -> LaneSummary:
    """A lane row (`LANE_COLUMNS`); a value outside its domain is a StorageError."""
    name = row["lane"]
    try:
        failures = json.loads(row["failures"])
        return LaneSummary(
            lane=name,
            state=domain(LaneState, row["state"], "lane {!r} state", name),
            until=row["until_at"],
            reason=row["reason"],
            trips=row["trips"],
            failures=tuple(failures),
            probe_run=row["probe_run"],
            stopped_task=row["stopped_task"],
            capped=bool(row["capped"]),
            events=row["events"],
            updated_at=row["updated_at"],
        )
    except (InvalidInput, TypeError, ValueError) as exc:
        raise StorageError(f"lane {name!r} holds a value of the wrong shape ({exc})") from None


def lane_row(summary: LaneSummary) -> dict[str, Any]:
    """`summary` as the values of `LANE_COLUMNS`, by name."""
    return {
        "lane": summary.lane,
        "state": str(summary.state),
        "until_at": summary.until,
        "reason": summary.reason,
        "trips": summary.trips,
        "failures": json.dumps(list(summary.failures)),
        "probe_run": summary.probe_run,
        "stopped_task": summary.stopped_task,
        "capped": summary.capped,
        "events": summary.events,
        "updated_at": summary.updated_at,
    }


def lane_event_from_row(row: NamedRow) -> LaneEvent:
    """A lane history row (`LANE_EVENT_COLUMNS`)."""
    try:
        return LaneEvent(
            lane=row["lane"],
            kind=domain(LaneEventKind, row["kind"], "lane event of {!r} kind", row["lane"]),
            at=row["at"],
            actor=row["actor"],
            run_id=row["run_id"],
            task_id=row["task_id"],
            until=row["until_at"],
            reason=row["reason"],
        )
    except InvalidInput as exc:
        raise StorageError(f"a lane event of {row['lane']!r}: {exc.message}") from None


def lane_event_row(event: LaneEvent) -> dict[str, Any]:
    """`event` as the values of `LANE_EVENT_COLUMNS`, by name."""
    return {
        "lane": event.lane,
        "kind": str(event.kind),
        "at": event.at,
        "actor": event.actor,
        "run_id": event.run_id,
        "task_id": event.task_id,
        "until_at": event.until,
        "reason": event.reason,
    }
