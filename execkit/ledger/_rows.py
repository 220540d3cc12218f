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

A backend whose SELECT names the columns in these orders may read its rows as plain tuples
instead (`TaskRecord._make(row)`, `run_from_values(row)`): SQLite does, for the listings of
100,000 rows, and checks the cursor's column names against `TASK_ROW` and `RUN_COLUMNS`.
"""

from __future__ import annotations

import json
import operator
from typing import Any, Protocol

from execkit._budget import AttemptStatus
from execkit._classify import FailureClass
from execkit._errors import InvalidInput, StorageError
from execkit._lanes import LaneEvent, LaneEventKind, LaneState, LaneSummary
from execkit._usage import UsdSource
from execkit._validate import fields_in_order
from execkit.ledger._core import SUMMARY_AT, TaskRecord, domain, summary_row
from execkit.ledger._model import AuditEvent, Grant, OutboxEntry, Run

__all__ = [
    "AUDIT_COLUMNS",
    "GRANT_COLUMNS",
    "LANE_COLUMNS",
    "LANE_EVENT_COLUMNS",
    "LANE_STOPS",
    "NOTIFY_DELIVERY_COLUMNS",
    "NOTIFY_DELIVERY_UPSERT",
    "NOTIFY_ENDPOINT_COLUMNS",
    "NOTIFY_ENDPOINT_SELECT",
    "NOTIFY_ENDPOINT_UPSERT",
    "NOTIFY_EVENT_SELECT",
    "OUTBOX_COLUMNS",
    "RUN_COLUMNS",
    "SUMMARY_COLUMNS",
    "TASK_COLUMNS",
    "TASK_ROW",
    "USAGE_COLUMNS",
    "NamedRow",
    "audit_event_from_row",
    "domain",
    "grant_from_row",
    "lane_event_from_row",
    "lane_event_row",
    "lane_from_row",
    "lane_row",
    "notify_owed_sql",
    "outbox_from_row",
    "outbox_row",
    "run_from_row",
    "run_from_values",
    "summary_row",
    "task_from_row",
]


class NamedRow(Protocol):
    """A row read by column name (`sqlite3.Row`, a psycopg `dict_row` dict)."""

    def __getitem__(self, column: str, /) -> Any: ...


# What a run cost (issue #45), in `Run`'s field order: a run with no cost stored reads
# 0 tokens, usd NULL, source 'unknown', model NULL.
USAGE_COLUMNS = (
    "input_tokens",
    "output_tokens",
    "cache_read_tokens",
    "cache_write_tokens",
    "usd",
    "usd_source",
    "model",
)
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
    "lane_held",
    "workspace",
    *USAGE_COLUMNS,
    "resumed_session",
    "fell_back",
    "session_id",
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
    "last_lane_held",
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
# The (task, run) of each `stop` event on a lane since its last `resume` (both parameters
# the lane's name; `%s` placeholders, written `?` on SQLite): `Tx.lane_stops`.
LANE_STOPS = (
    "SELECT task_id, run_id FROM lane_events WHERE lane = %s AND kind = 'stop' "
    "AND task_id IS NOT NULL AND run_id IS NOT NULL AND seq > coalesce("
    "(SELECT max(seq) FROM lane_events WHERE lane = %s AND kind = 'resume'), 0) ORDER BY seq"
)


def run_from_row(row: NamedRow) -> Run:
    """A run row by name (`RUN_COLUMNS`)."""
    return run_from_values(_run_row_values(row))


def run_from_values(values: tuple[Any, ...]) -> Run:
    """A run row as the values of `RUN_COLUMNS`, in that order (`Run`'s own field order:
    built positionally); a tuple of another length is a ValueError."""
    (
        run_id,
        task_id,
        attempt,
        status,
        failure_class,
        reason,
        request_key,
        actor,
        forced,
        started_at,
        ended_at,
        owner_host,
        owner_pid,
        lease_expires_at,
        not_before,
        owner_boot_id,
        owner_pid_namespace,
        owner_pid_started_at,
        owner_instance,
        stopped,
        lane_held,
        workspace,
        input_tokens,
        output_tokens,
        cache_read_tokens,
        cache_write_tokens,
        usd,
        usd_source,
        model,
        resumed_session,
        fell_back,
        session_id,
    ) = values
    return Run(
        run_id,
        task_id,
        attempt,
        domain(AttemptStatus, status, "run {!r} status", run_id),
        None
        if failure_class is None
        else domain(FailureClass, failure_class, "run {!r} class", run_id),
        reason,
        request_key,
        actor,
        bool(forced),
        started_at,
        ended_at,
        owner_host,
        owner_pid,
        lease_expires_at,
        not_before,
        owner_boot_id,
        owner_pid_namespace,
        owner_pid_started_at,
        owner_instance,
        bool(stopped),
        bool(lane_held),
        workspace,
        int(input_tokens or 0),
        int(output_tokens or 0),
        int(cache_read_tokens or 0),
        int(cache_write_tokens or 0),
        None if usd is None else float(usd),
        UsdSource.UNKNOWN
        if usd_source is None
        else domain(UsdSource, usd_source, "run {!r} usd_source", run_id),
        model,
        resumed_session,
        fell_back,
        session_id,
    )


_run_row_values = operator.itemgetter(*RUN_COLUMNS)  # by name, in one C call
fields_in_order(Run, RUN_COLUMNS, "run_from_values builds them so")


# The columns of a task row, in the order of `TaskRecord`'s fields: a backend reads a task
# row as `TaskRecord._make(row)` when its SELECT names them in this order (SQLite's does),
# else by name (`task_from_row`).
TASK_ROW = TASK_COLUMNS + SUMMARY_COLUMNS
_RECORD_FIELDS = TaskRecord._fields
if (  # pragma: no cover - a guard for whoever edits either
    len(_RECORD_FIELDS) != len(TASK_ROW) or _RECORD_FIELDS[SUMMARY_AT:] != SUMMARY_COLUMNS
):
    raise ImportError(f"TaskRecord's fields {_RECORD_FIELDS} are not the columns {TASK_ROW}")


def task_from_row(row: NamedRow) -> TaskRecord:
    """A task row by name: `TASK_COLUMNS` and `SUMMARY_COLUMNS` (NULL when it has no
    summary yet), in `TaskRecord`'s order."""
    return TaskRecord._make(_task_row_values(row))


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


# The board outbox (issue #47): one row per (board, item), `payload` a JSON object.
OUTBOX_COLUMNS = (
    "board",
    "item",
    "seq",
    "sent_seq",
    "payload",
    "ref",
    "sends",
    "tries",
    "next_at",
    "claimed_by",
    "claimed_until",
    "last_error",
    "updated_at",
)


def outbox_from_row(row: NamedRow) -> OutboxEntry:
    """An outbox row (`OUTBOX_COLUMNS`); a payload that is not a JSON object, or a count
    that is not a whole number, is a StorageError naming the row."""
    where = f"outbox entry {row['board']!r} {row['item']!r}"
    try:
        payload = row["payload"]
        if isinstance(payload, str):
            payload = json.loads(payload)
        if not isinstance(payload, dict):
            raise TypeError("its payload is not a JSON object")
        counts = [row[name] for name in ("seq", "sent_seq", "sends", "tries")]
        if any(type(count) is not int or count < 0 for count in counts):
            raise TypeError(f"its counts {counts} are not whole numbers >= 0")
        return OutboxEntry(
            board=row["board"],
            item=row["item"],
            seq=row["seq"],
            sent_seq=row["sent_seq"],
            payload=payload,
            ref=row["ref"],
            sends=row["sends"],
            tries=row["tries"],
            next_at=row["next_at"],
            claimed_by=row["claimed_by"],
            claimed_until=row["claimed_until"],
            last_error=row["last_error"],
            updated_at=row["updated_at"],
        )
    except (TypeError, ValueError) as exc:
        raise StorageError(f"{where} holds a value of the wrong shape ({exc})") from None


def outbox_row(entry: OutboxEntry) -> dict[str, Any]:
    """`entry` as the values of `OUTBOX_COLUMNS`, by name (the payload as JSON text)."""
    return {
        "board": entry.board,
        "item": entry.item,
        "seq": entry.seq,
        "sent_seq": entry.sent_seq,
        "payload": json.dumps(dict(entry.payload), sort_keys=True),
        "ref": entry.ref,
        "sends": entry.sends,
        "tries": entry.tries,
        "next_at": entry.next_at,
        "claimed_by": entry.claimed_by,
        "claimed_until": entry.claimed_until,
        "last_error": entry.last_error,
        "updated_at": entry.updated_at,
    }


# Notifications (issue #49): the columns of each table, and the statements both backends
# run, written with `?` placeholders (PostgreSQL's tx swaps them for `%s`).
NOTIFY_ENDPOINT_COLUMNS = (
    "id", "url", "format", "events", "secret", "from_seq", "created_by", "created_at",
    "stopped_reason", "delivered", "failed", "last_error", "last_at", "claimed_by",
    "claimed_until",
)  # fmt: skip
NOTIFY_DELIVERY_COLUMNS = (
    "endpoint_id", "event_seq", "status", "tries", "first_at", "next_at", "last_error",
)  # fmt: skip
NOTIFY_EVENT_SELECT = "SELECT seq, id, kind, subject, payload, at FROM notify_events"
NOTIFY_ENDPOINT_SELECT = f"SELECT {', '.join(NOTIFY_ENDPOINT_COLUMNS)} FROM notify_endpoints"
NOTIFY_ENDPOINT_UPSERT = (
    f"INSERT INTO notify_endpoints ({', '.join(NOTIFY_ENDPOINT_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in NOTIFY_ENDPOINT_COLUMNS)}) "
    "ON CONFLICT (id) DO UPDATE SET "
    + ", ".join(f"{name} = excluded.{name}" for name in NOTIFY_ENDPOINT_COLUMNS[1:])
)
NOTIFY_DELIVERY_UPSERT = (
    f"INSERT INTO notify_deliveries ({', '.join(NOTIFY_DELIVERY_COLUMNS)}) "
    f"VALUES ({', '.join('?' for _ in NOTIFY_DELIVERY_COLUMNS)}) "
    "ON CONFLICT (endpoint_id, event_seq) DO UPDATE SET "
    + ", ".join(f"{name} = excluded.{name}" for name in NOTIFY_DELIVERY_COLUMNS[2:])
)


def notify_owed_sql(kinds: tuple[str, ...] | None, *, count: bool) -> str:
    """What an endpoint is owed (`Tx.notify_owed`; with `count`, how many: its backlog),
    parameters (endpoint id, endpoint id, from_seq, *kinds, endpoint id[, limit])."""
    wanted = "e.kind <> 'notify.test'"
    if kinds is not None:
        wanted = f"e.kind IN ({', '.join('?' for _ in kinds)})"
    head = (
        "SELECT count(*)"
        if count
        else "SELECT e.seq, e.id, e.kind, e.subject, e.payload, e.at, d.tries, d.first_at, "
        "d.next_at"
    )
    return (
        f"{head} FROM notify_events e LEFT JOIN notify_deliveries d "
        "ON d.endpoint_id = ? AND d.event_seq = e.seq "
        "WHERE (d.status IS NULL OR d.status = 'retrying') AND e.seq > ? "
        f"AND ({wanted} OR (e.kind = 'notify.test' AND e.subject = ?))"
        + ("" if count else " ORDER BY e.seq LIMIT ?")
    )
