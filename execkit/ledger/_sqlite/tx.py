"""One SQLite transaction's reads and writes: every SQL statement the rules need, no rules
(`Tx` in `execkit.ledger._core`).

Each write transaction runs under BEGIN IMMEDIATE (`store.py`), which holds the database's
write lock for the whole transaction, so two processes admitting runs on one task serialise
on it and the second one sees the first one's run when it counts; `task(lock=True)` needs
nothing more here. Rows are read by column name (`_rows.py`).
"""

from __future__ import annotations

import functools
import json
import math
import sqlite3
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs

from execkit._budget import AttemptStatus, HistorySummary
from execkit._classify import FailureClass
from execkit._lanes import LaneEvent, LaneGate, LaneSummary
from execkit._usage import Usage
from execkit.ledger._core import HISTORY_ROW, SpendPlan, TaskRecord
from execkit.ledger._model import (
    DEFAULT_LEASE_S,
    AuditEntry,
    AuditEvent,
    Grant,
    OutboxEntry,
    Run,
    TaskStatus,
)
from execkit.ledger._rows import (
    LANE_COLUMNS,
    LANE_EVENT_COLUMNS,
    LANE_STOPS,
    NOTIFY_DELIVERY_COLUMNS,
    NOTIFY_DELIVERY_UPSERT,
    NOTIFY_ENDPOINT_COLUMNS,
    NOTIFY_ENDPOINT_SELECT,
    NOTIFY_ENDPOINT_UPSERT,
    NOTIFY_EVENT_SELECT,
    OUTBOX_COLUMNS,
    RUN_COLUMNS,
    SUMMARY_COLUMNS,
    TASK_ROW,
    audit_event_from_row,
    grant_from_row,
    lane_event_from_row,
    lane_event_row,
    lane_from_row,
    lane_row,
    notify_owed_sql,
    outbox_from_row,
    outbox_row,
    run_from_row,
    run_from_values,
    summary_row,
)
from execkit.ledger._spend import SpendRow, TaskBudget

__all__ = ["SqliteTx"]

# Rows are read by column name (`_rows.py`): each SELECT below names every column of its
# row shape, with the facts schema 3 added taken from the tables it added them in. A task's
# row is read in order instead (`TASK_ROW`), and `_task_rows` checks the names of that order.
_RUN_SELECT = (
    "SELECT r.id, r.task_id, r.attempt, r.status, r.failure_class, r.reason, r.request_key, "
    "r.actor, r.forced, r.started_at, r.ended_at, r.owner_host, r.owner_pid, "
    "x.lease_expires_at, x.not_before, o.boot_id AS owner_boot_id, "
    "o.pid_namespace AS owner_pid_namespace, o.pid_started_at AS owner_pid_started_at, "
    "o.instance AS owner_instance, st.run_id IS NOT NULL AS stopped, "
    "lh.run_id IS NOT NULL AS lane_held, x.workspace, "
    "COALESCE(c.input_tokens, 0) AS input_tokens, "
    "COALESCE(c.output_tokens, 0) AS output_tokens, "
    "COALESCE(c.cache_read_tokens, 0) AS cache_read_tokens, "
    "COALESCE(c.cache_write_tokens, 0) AS cache_write_tokens, c.usd, "
    "COALESCE(c.usd_source, 'unknown') AS usd_source, c.model, x.resumed_session, x.fell_back, "
    "x.session_id "
    "FROM runs r LEFT JOIN run_extras x ON x.run_id = r.id "
    "LEFT JOIN run_owners o ON o.run_id = r.id LEFT JOIN run_stops st ON st.run_id = r.id "
    "LEFT JOIN run_lane_holds lh ON lh.run_id = r.id LEFT JOIN run_costs c ON c.run_id = r.id"
)
# A run's cost as its result reported it (issue #45), recorded after its status: its row
# made if its end made none (a run with no reservation: admitted with no cap).
_COST_UPSERT = (
    "INSERT INTO run_costs (run_id, task_id, started_at, lane, input_tokens, output_tokens, "
    "cache_read_tokens, cache_write_tokens, usd, usd_source, model) "
    "SELECT r.id, r.task_id, r.started_at, (SELECT lane FROM run_lanes WHERE run_id = r.id), "
    "?, ?, ?, ?, ?, ?, ? FROM runs r WHERE r.id = ? "
    "ON CONFLICT (run_id) DO UPDATE SET input_tokens = excluded.input_tokens, "
    "output_tokens = excluded.output_tokens, cache_read_tokens = excluded.cache_read_tokens, "
    "cache_write_tokens = excluded.cache_write_tokens, usd = excluded.usd, "
    "usd_source = excluded.usd_source, model = excluded.model"
)
_TASK_SELECT = (
    "SELECT t.id, t.title, t.status, t.created_by, t.created_at, "
    "COALESCE(l.max_attempts, 0) AS max_attempts, e.max_uncharged_attempts, "
    "e.retry_requested_by, e.gave_up_at_attempt, "
    + ", ".join(f"s.{column}" for column in SUMMARY_COLUMNS)
    + " FROM tasks t LEFT JOIN task_attempt_limits l ON l.task_id = t.id "
    "LEFT JOIN task_extras e ON e.task_id = t.id "
    "LEFT JOIN task_summaries s ON s.task_id = t.id"
)
# Every task with its runs, in order (`Tx.history_rows`): the summary's and the runs'
# tables only, never the task's other facts or a run's owner (`db check` folds none of them).
_HISTORY_SELECT = (
    "SELECT t.id AS task_id, t.status AS task_status, "
    + ", ".join(f"s.{column}" for column in SUMMARY_COLUMNS)
    + ", r.id AS run_id, r.attempt, r.status, r.failure_class, r.reason, r.forced, "
    "r.started_at, r.ended_at, x.not_before, x.lease_expires_at, "
    "st.run_id IS NOT NULL AS stopped, lh.run_id IS NOT NULL AS lane_held FROM tasks t "
    "LEFT JOIN task_summaries s ON s.task_id = t.id LEFT JOIN runs r ON r.task_id = t.id "
    "LEFT JOIN run_extras x ON x.run_id = r.id LEFT JOIN run_stops st ON st.run_id = r.id "
    "LEFT JOIN run_lane_holds lh ON lh.run_id = r.id "
    "ORDER BY t.seq, r.seq"
)
_SUMMARY_UPSERT = (
    f"INSERT INTO task_summaries (task_id, {', '.join(SUMMARY_COLUMNS)}) "
    f"VALUES (:task_id, {', '.join(f':{column}' for column in SUMMARY_COLUMNS)}) "
    "ON CONFLICT (task_id) DO UPDATE SET "
    + ", ".join(f"{column} = excluded.{column}" for column in SUMMARY_COLUMNS)
)

_LANE_SELECT = f"SELECT {', '.join(LANE_COLUMNS)} FROM lane_summaries"
_LANE_UPSERT = (
    f"INSERT INTO lane_summaries ({', '.join(LANE_COLUMNS)}) "
    f"VALUES ({', '.join(f':{column}' for column in LANE_COLUMNS)}) "
    "ON CONFLICT (lane) DO UPDATE SET "
    + ", ".join(f"{column} = excluded.{column}" for column in LANE_COLUMNS[1:])
)
_LANE_EVENT_INSERT = (
    f"INSERT INTO lane_events ({', '.join(LANE_EVENT_COLUMNS)}) "
    f"VALUES ({', '.join(f':{column}' for column in LANE_EVENT_COLUMNS)})"
)

# The hours `spend_buckets` keeps a window's spend in (schema step 13).
_HOUR = 3600
_TOKENS_OF = "c.input_tokens + c.output_tokens + c.cache_read_tokens + c.cache_write_tokens"
# A run's effective cost (`Tx`'s spend section): its reservation while it runs (on its
# run_extras row: `_RUNNING`), else, on its run_costs row `c` (only ended runs have one,
# schema step 14), what it reported, or its reservation when it reported no USD (no
# tokens either, for the tokens).
_HELD_USD = "COALESCE(SUM(CASE WHEN c.usd IS NULL THEN c.reserved_usd ELSE c.usd END), 0)"
_HELD_TOKENS = (
    f"COALESCE(SUM(CASE WHEN c.usd IS NULL AND {_TOKENS_OF} = 0 THEN c.reserved_tokens "
    f"ELSE {_TOKENS_OF} END), 0)"
)
# Running runs' reservations (`x`: their run_extras rows), from the index of running runs
# first: CROSS JOIN keeps SQLite's planner in that order.
_RUNNING = "FROM runs r CROSS JOIN run_extras x ON x.run_id = r.id"
_RUNNING_OF_LANE = f"{_RUNNING} CROSS JOIN run_lanes l ON l.run_id = r.id AND l.lane = ?"


def _task_held(task: str) -> str:
    """What a task's runs hold (`Tx.task_spend`), its USD then its tokens, as two SQL
    expressions: the ended runs' costs plus the running runs' reservations of the task
    `task` names (a parameter, or a column of the statement around them)."""
    ended = f"FROM run_costs c WHERE c.task_id = {task}"
    running = f"{_RUNNING} WHERE r.status = 'running' AND r.task_id = {task}"
    return (
        f"(SELECT {_HELD_USD} {ended}) + (SELECT COALESCE(SUM(x.reserved_usd), 0) {running}), "
        f"(SELECT {_HELD_TOKENS} {ended}) + "
        f"(SELECT COALESCE(SUM(x.reserved_tokens), 0) {running})"
    )


@functools.lru_cache(maxsize=64)
def _windows_sql(of_lane: tuple[bool, ...]) -> str:
    """What each window holds, as one statement of scalar subqueries (`_windows_params`),
    its USD then its tokens: the ended runs of its whole hours from `spend_buckets`, those
    of the partial hour before them one by one, and the reservations of its running runs.
    As tables joined in FROM, SQLite planned the same reads five times slower."""
    columns = []
    for lane in of_lane:
        where = " AND c.lane = ?" if lane else ""
        running = _RUNNING_OF_LANE if lane else _RUNNING
        for bucket, held, reserved in (
            ("usd", _HELD_USD, "x.reserved_usd"),
            ("tokens", _HELD_TOKENS, "x.reserved_tokens"),
        ):
            columns.append(
                f"(SELECT COALESCE(SUM({bucket}), 0) FROM spend_buckets WHERE lane = ? "
                f"AND bucket >= ?) + (SELECT {held} FROM run_costs c WHERE c.started_at >= ? "
                f"AND c.started_at < ?{where}) + (SELECT COALESCE(SUM({reserved}), 0) "
                f"{running} WHERE r.status = 'running' AND r.started_at >= ?)"
            )
    return "SELECT " + ", ".join(columns)


def _windows_params(windows: Sequence[tuple[float, str | None]]) -> tuple[Any, ...]:
    params: list[Any] = []
    for since, lane in windows:
        whole = math.ceil(since / _HOUR) * _HOUR
        of = () if lane is None else (lane,)
        params += [("*" if lane is None else lane), whole, since, whole, *of, *of, since] * 2
    return tuple(params)


# A row as its `TaskRecord` (`TaskRecord._make`, without the classmethod's own call: a
# listing makes one a task).
_record_of = functools.partial(tuple.__new__, TaskRecord)

# Testing seam: the crash test sets this in a child process to hold the admission
# transaction open after the INSERT (before COMMIT) and kills the child there.
_after_admission_insert: Callable[[], None] | None = None


def _page_filter(
    prefix: str, after: str | None, status: TaskStatus | None
) -> tuple[str, tuple[str, ...]]:
    """The WHERE clause of a page of tasks: after task `after` in creation order (an
    unknown id matches nothing; the caller checked it), of `status` only."""
    clauses: list[str] = []
    params: list[str] = []
    if after is not None:
        clauses.append(f"{prefix}seq > (SELECT seq FROM tasks WHERE id = ?)")
        params.append(after)
    if status is not None:
        clauses.append(f"{prefix}status = ?")
        params.append(str(status))
    return (" WHERE " + " AND ".join(clauses) if clauses else ""), tuple(params)


class SqliteTx:
    """One transaction on the store's connection (see the module docstring): `lock=True`
    needs nothing here, as BEGIN IMMEDIATE already holds the database's write lock."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def _named(self, sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        """`sql` run on a cursor whose rows are read by column name (`sqlite3.Row`); the
        connection itself keeps plain tuples for everything else."""
        cursor = self._conn.cursor()
        cursor.row_factory = sqlite3.Row
        return cursor.execute(sql, params)

    def _dicts(self, sql: str, params: tuple[Any, ...] = ()) -> list[dict[str, Any]]:
        """`sql`'s rows as dicts by column name, for reads of many rows: `sqlite3.Row`
        finds a column by comparing names, which costs more than the rest of a row's read
        once a SELECT has twenty columns."""
        cursor = self._conn.execute(sql, params)
        names = [column[0] for column in cursor.description]
        return [dict(zip(names, row, strict=True)) for row in cursor.fetchall()]

    # SQLite reads in-process: a hint has no round trip to save.
    def expect_admission(
        self,
        scope: str,
        key: str,
        task_id: str,
        lanes: tuple[str, ...],
        spend: SpendPlan | None = None,
    ) -> None:
        pass

    def expect_result(self, run_id: str) -> None:
        pass

    def _task_rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[TaskRecord]:
        """The tasks `sql` (a `_TASK_SELECT`) reads: its rows are plain tuples in the order
        of `TASK_ROW`, each a `TaskRecord` as it is (checked against the cursor's column
        names, once a statement)."""
        cursor = self._conn.execute(sql, params)
        if tuple(column[0] for column in cursor.description) != TASK_ROW:
            raise AssertionError(f"{sql!r} does not read TASK_ROW in its order")
        return list(map(_record_of, cursor.fetchall()))

    def task(self, task_id: str, *, lock: bool = False) -> TaskRecord | None:
        found = self._task_rows(f"{_TASK_SELECT} WHERE t.id = ?", (task_id,))
        return found[0] if found else None

    def tasks(self) -> list[TaskRecord]:
        return self._task_rows(f"{_TASK_SELECT} ORDER BY t.seq")

    def task_page(
        self, after: str | None, limit: int, status: TaskStatus | None
    ) -> list[TaskRecord]:
        where, params = _page_filter("t.", after, status)
        return self._task_rows(f"{_TASK_SELECT}{where} ORDER BY t.seq LIMIT ?", (*params, limit))

    def _run_rows(self, sql: str, params: tuple[Any, ...] = ()) -> list[Run]:
        """The runs `sql` (a `_RUN_SELECT`) reads, as plain tuples in the order of
        `RUN_COLUMNS` (checked against the cursor's column names, once a statement)."""
        cursor = self._conn.execute(sql, params)
        if tuple(column[0] for column in cursor.description) != RUN_COLUMNS:
            raise AssertionError(f"{sql!r} does not read RUN_COLUMNS in their order")
        return [run_from_values(row) for row in cursor.fetchall()]

    def runs(self, task_id: str) -> list[Run]:
        return self._run_rows(f"{_RUN_SELECT} WHERE r.task_id = ? ORDER BY r.seq", (task_id,))

    def runs_of(self, task_ids: list[str]) -> list[Run]:
        marks = ", ".join("?" * len(task_ids))
        sql = f"{_RUN_SELECT} WHERE r.task_id IN ({marks}) ORDER BY r.seq"
        return self._run_rows(sql, tuple(task_ids))

    def announced_runs(self, task_ids: list[str]) -> list[Run]:
        marks = ", ".join("?" * len(task_ids))
        return self._run_rows(
            f"{_RUN_SELECT} WHERE r.task_id IN (SELECT l.task_id FROM runs l CROSS JOIN "
            f"run_extras e ON e.run_id = l.id WHERE l.task_id IN ({marks}) AND "
            "(e.resumed_session IS NOT NULL OR e.fell_back IS NOT NULL) AND l.seq = (SELECT "
            "MAX(m.seq) FROM runs m WHERE m.task_id = l.task_id)) ORDER BY r.seq",
            tuple(task_ids),
        )

    def all_runs(self) -> list[Run]:
        return self._run_rows(f"{_RUN_SELECT} ORDER BY r.seq")

    def history_rows(self) -> Iterator[tuple[Any, ...]]:
        # The cursor itself: sqlite3 steps the statement a row at a time as it is iterated
        # (tasks in `seq` order, each task's runs through `runs_by_task_creation`: no sort).
        cursor = self._conn.execute(_HISTORY_SELECT)
        if tuple(column[0] for column in cursor.description) != HISTORY_ROW:
            raise AssertionError(f"{_HISTORY_SELECT!r} does not read HISTORY_ROW in its order")
        return cursor

    def run(self, run_id: str) -> Run | None:
        row = self._named(f"{_RUN_SELECT} WHERE r.id = ?", (run_id,)).fetchone()
        return None if row is None else run_from_row(row)

    def run_at(self, task_id: str, attempt: int) -> Run | None:
        row = self._named(
            f"{_RUN_SELECT} WHERE r.task_id = ? AND r.attempt = ?", (task_id, attempt)
        ).fetchone()
        return None if row is None else run_from_row(row)

    def running_runs(self) -> list[Run]:
        rows = self._named(f"{_RUN_SELECT} WHERE r.status = 'running' ORDER BY r.seq")
        return [run_from_row(row) for row in rows.fetchall()]

    def expired_runs(self, now: float) -> list[Run]:
        rows = self._named(
            f"{_RUN_SELECT} WHERE r.status = 'running' AND x.lease_expires_at <= ? ORDER BY r.seq",
            (now,),
        ).fetchall()
        return [run_from_row(row) for row in rows]

    def insert_task(
        self, title: str, actor: str, at: float, max_uncharged_attempts: int | None
    ) -> str:
        seq = self._conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM tasks").fetchone()[0]
        task_id = f"t-{seq}"
        self._conn.execute(
            "INSERT INTO tasks (seq, id, title, status, created_by, created_at, updated_at)"
            " VALUES (?, ?, ?, 'open', ?, ?, ?)",
            (seq, task_id, title, actor, at, at),
        )
        if max_uncharged_attempts is not None:
            self._conn.execute(
                "INSERT INTO task_extras (task_id, max_uncharged_attempts) VALUES (?, ?)",
                (task_id, max_uncharged_attempts),
            )
        return task_id

    def set_task_status(self, task_id: str, status: TaskStatus, at: float) -> None:
        self._conn.execute(
            "UPDATE tasks SET status = ?, updated_at = ? WHERE id = ?", (status, at, task_id)
        )

    def set_retry(self, task_id: str, requested_by: str | None, at: float | None) -> None:
        self._conn.execute(
            "INSERT INTO task_extras (task_id, retry_requested_by, retry_requested_at) "
            "VALUES (?, ?, ?) ON CONFLICT (task_id) DO UPDATE SET "
            "retry_requested_by = excluded.retry_requested_by, "
            "retry_requested_at = excluded.retry_requested_at",
            (task_id, requested_by, at),
        )

    def set_gave_up(self, task_id: str, attempts: int | None) -> None:
        self._conn.execute(
            "INSERT INTO task_extras (task_id, gave_up_at_attempt) VALUES (?, ?) "
            "ON CONFLICT (task_id) DO UPDATE SET gave_up_at_attempt = excluded.gave_up_at_attempt",
            (task_id, attempts),
        )

    def upsert_limit(self, task_id: str, max_attempts: int, actor: str, at: float) -> None:
        self._conn.execute(
            "INSERT INTO task_attempt_limits (task_id, max_attempts, updated_by, updated_at)"
            " VALUES (?, ?, ?, ?) ON CONFLICT (task_id) DO UPDATE SET "
            "max_attempts = excluded.max_attempts, updated_by = excluded.updated_by, "
            "updated_at = excluded.updated_at",
            (task_id, max_attempts, actor, at),
        )

    def write_summary(self, task_id: str, summary: HistorySummary) -> None:
        self._conn.execute(_SUMMARY_UPSERT, {"task_id": task_id, **summary_row(summary)})

    def insert_run(
        self, run: Run, lease_s: float, reserved: tuple[float, int] | None = None
    ) -> Run:
        seq = self._conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM runs").fetchone()[0]
        stored = attrs.evolve(run, id=f"r-{seq}")
        self._conn.execute(
            "INSERT INTO runs (seq, id, task_id, attempt, status, request_key, actor, "
            "forced, owner_host, owner_pid, started_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (
                seq,
                stored.id,
                stored.task_id,
                stored.attempt,
                stored.status,
                stored.request_key,
                stored.actor,
                int(stored.forced),
                stored.owner_host,
                stored.owner_pid,
                stored.started_at,
            ),
        )
        usd, tokens = (None, None) if reserved is None else reserved
        self._conn.execute(
            "INSERT INTO run_extras (run_id, lease_expires_at, lease_s, workspace, "
            "resumed_session, fell_back, reserved_usd, reserved_tokens) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            (
                stored.id,
                stored.lease_expires_at,
                lease_s,
                stored.workspace,
                stored.resumed_session,
                stored.fell_back,
                usd,
                tokens,
            ),
        )
        if stored.owner is not None:
            self._conn.execute(
                "INSERT INTO run_owners (run_id, boot_id, pid_namespace, pid_started_at, "
                "instance) VALUES (?, ?, ?, ?, ?)",
                (
                    stored.id,
                    stored.owner_boot_id,
                    stored.owner_pid_namespace,
                    stored.owner_pid_started_at,
                    stored.owner_instance,
                ),
            )
        if _after_admission_insert is not None:
            _after_admission_insert()
        return stored

    def finish_run(
        self,
        run_id: str,
        status: AttemptStatus,
        failure_class: FailureClass | None,
        reason: str | None,
        not_before: float | None,
        at: float,
        stopped: bool = False,
        lane_held: bool = False,
        usage: Usage | None = None,
        session_id: str | None = None,
    ) -> bool:
        changed = self._conn.execute(
            "UPDATE runs SET status = ?, failure_class = ?, reason = ?, ended_at = ? "
            "WHERE id = ? AND status = 'running'",
            (status, failure_class, reason, at, run_id),
        ).rowcount
        if changed and not_before is not None:
            self._conn.execute(
                "INSERT INTO run_extras (run_id, not_before) VALUES (?, ?) "
                "ON CONFLICT (run_id) DO UPDATE SET not_before = excluded.not_before",
                (run_id, not_before),
            )
        if changed and stopped:
            self._conn.execute("INSERT INTO run_stops (run_id) VALUES (?)", (run_id,))
        if changed and lane_held:
            self._conn.execute("INSERT INTO run_lane_holds (run_id) VALUES (?)", (run_id,))
        if changed and usage is not None:
            self._record_cost(run_id, usage)
        if changed and session_id is not None:
            self._conn.execute(
                "INSERT INTO run_extras (run_id, session_id) VALUES (?, ?) "
                "ON CONFLICT (run_id) DO UPDATE SET session_id = excluded.session_id",
                (run_id, session_id),
            )
        return bool(changed)

    def task_budget(self, task_id: str) -> TaskBudget | None:
        row = self._conn.execute(
            "SELECT budget_usd, budget_tokens FROM task_budgets WHERE task_id = ?", (task_id,)
        ).fetchone()
        return None if row is None else TaskBudget(task_id, row[0], row[1])

    def put_task_budget(self, budget: TaskBudget, actor: str, at: float) -> None:
        self._conn.execute(
            "INSERT INTO task_budgets (task_id, budget_usd, budget_tokens, updated_by, "
            "updated_at) VALUES (?, ?, ?, ?, ?) ON CONFLICT (task_id) DO UPDATE SET "
            "budget_usd = excluded.budget_usd, budget_tokens = excluded.budget_tokens, "
            "updated_by = excluded.updated_by, updated_at = excluded.updated_at",
            (budget.task_id, budget.usd, budget.tokens, actor, at),
        )

    def lock_spend(self) -> None:
        """Nothing: a write transaction holds the database's write lock from BEGIN."""

    def reservation(self, run_id: str) -> tuple[float, int]:
        row = self._conn.execute(
            "SELECT COALESCE(reserved_usd, 0), COALESCE(reserved_tokens, 0) FROM run_extras "
            "WHERE run_id = ?",
            (run_id,),
        ).fetchone()
        return (0.0, 0) if row is None else (float(row[0]), int(row[1]))

    def set_reservation(self, run_id: str, usd: float, tokens: int) -> None:
        self._conn.execute(
            "UPDATE run_extras SET reserved_usd = ?, reserved_tokens = ? WHERE run_id = ?",
            (usd, tokens, run_id),
        )

    def window_spend(self, since: float, lane: str | None) -> tuple[float, int, float | None]:
        ((usd, tokens),) = self._window_sums([(since, lane)])
        # The earliest start it counts: an ended run's row, or a running run's reservation.
        where = "" if lane is None else " AND lane = ?"
        running = _RUNNING_OF_LANE if lane else _RUNNING
        of: tuple[Any, ...] = () if lane is None else (lane,)
        first = self._conn.execute(
            f"SELECT MIN(m) FROM (SELECT MIN(started_at) AS m FROM run_costs WHERE "
            f"started_at >= ?{where} UNION ALL SELECT MIN(r.started_at) {running} WHERE "
            "r.status = 'running' AND r.started_at >= ? AND x.reserved_usd IS NOT NULL)",
            (since, *of, *of, since),
        ).fetchone()[0]
        return usd, tokens, first

    def _window_sums(self, windows: Sequence[tuple[float, str | None]]) -> list[tuple[float, int]]:
        if not windows:
            return []
        sql = _windows_sql(tuple(lane is not None for _since, lane in windows))
        row = self._conn.execute(sql, _windows_params(windows)).fetchone()
        return [(float(row[2 * n]), int(row[2 * n + 1])) for n in range(len(windows))]

    def spend_reads(
        self, lane: str | None, limit: int, windows: Sequence[tuple[float, str | None]]
    ) -> tuple[list[tuple[float | None, int]], list[tuple[float, int]]]:
        # The write lock is held from BEGIN (`lock_spend`): every window in one statement.
        return self.recent_costs(lane, limit) if limit else [], self._window_sums(windows)

    def task_spend(self, task_id: str) -> tuple[float, int]:
        usd, tokens = self._conn.execute(f"SELECT {_task_held('?1')}", (task_id,)).fetchone()
        return float(usd), int(tokens)

    def task_budgets_of(self, task_ids: Sequence[str]) -> list[tuple[TaskBudget, float, int]]:
        marks = ", ".join("?" * len(task_ids))
        rows = self._conn.execute(
            f"SELECT b.task_id, b.budget_usd, b.budget_tokens, {_task_held('b.task_id')} FROM "
            f"task_budgets b WHERE b.task_id IN ({marks}) AND (b.budget_usd IS NOT NULL OR "
            "b.budget_tokens IS NOT NULL) ORDER BY b.task_id",
            tuple(task_ids),
        ).fetchall()
        return [(TaskBudget(row[0], row[1], row[2]), float(row[3]), int(row[4])) for row in rows]

    def recent_costs(self, lane: str | None, limit: int) -> list[tuple[float | None, int]]:
        # The runs whose result reported a cost (a running run, or one that ended with none,
        # reports nothing a percentile could read): one index, no join.
        where = "" if lane is None else " AND c.lane = ?"
        rows = self._conn.execute(
            f"SELECT c.usd, {_TOKENS_OF} FROM run_costs c WHERE (c.usd IS NOT NULL "
            f"OR {_TOKENS_OF} > 0){where} ORDER BY c.started_at DESC LIMIT ?",
            (limit,) if lane is None else (lane, limit),
        ).fetchall()
        return [(row[0], int(row[1])) for row in rows]

    def note_spend_warning(self, cap: str, window_start: float, at: float) -> bool:
        return bool(
            self._conn.execute(
                "INSERT INTO spend_warnings (cap, window_start, at) VALUES (?, ?, ?) "
                "ON CONFLICT (cap, window_start) DO NOTHING",
                (cap, window_start, at),
            ).rowcount
        )

    def spend_rows(self, since: float) -> list[SpendRow]:
        rows = self._conn.execute(
            "SELECT r.id, r.task_id, t.title, t.status, r.status, l.lane, r.started_at, "
            "COALESCE(c.input_tokens, 0), COALESCE(c.output_tokens, 0), "
            "COALESCE(c.cache_read_tokens, 0), COALESCE(c.cache_write_tokens, 0), c.usd, "
            "COALESCE(c.usd_source, 'unknown'), c.model FROM runs r "
            "JOIN tasks t ON t.id = r.task_id LEFT JOIN run_lanes l ON l.run_id = r.id "
            "LEFT JOIN run_costs c ON c.run_id = r.id WHERE r.started_at >= ? ORDER BY r.seq",
            (since,),
        ).fetchall()
        return [SpendRow(*row) for row in rows]

    def task_costs(self, task_ids: list[str]) -> list[tuple[str, int, float, int, int]]:
        marks = ", ".join("?" * len(task_ids))
        return self._conn.execute(
            "SELECT r.task_id, COUNT(*), COALESCE(SUM(c.usd), 0.0), SUM(c.usd IS NULL), "
            f"COALESCE(SUM({_TOKENS_OF}), 0) FROM runs r LEFT JOIN run_costs c ON "
            f"c.run_id = r.id WHERE r.task_id IN ({marks}) GROUP BY r.task_id",
            tuple(task_ids),
        ).fetchall()

    def costs_reported(self) -> bool:
        # Only an ended run that reported something has a run_costs row (schema step 14).
        found = self._conn.execute(
            f"SELECT 1 FROM run_costs c WHERE c.usd IS NOT NULL OR {_TOKENS_OF} > 0 LIMIT 1"
        ).fetchone()
        return found is not None

    def _record_cost(self, run_id: str, usage: Usage) -> None:
        self._conn.execute(
            _COST_UPSERT,
            (
                usage.input_tokens,
                usage.output_tokens,
                usage.cache_read_tokens,
                usage.cache_write_tokens,
                usage.usd,
                str(usage.usd_source),
                usage.model,
                run_id,
            ),
        )

    def renew_lease(self, run_id: str, expires_at: float, lease_s: float | None) -> bool:
        changed = self._conn.execute(
            "INSERT INTO run_extras (run_id, lease_expires_at, lease_s) VALUES (?, ?, ?) "
            "ON CONFLICT (run_id) DO UPDATE SET lease_expires_at = excluded.lease_expires_at, "
            "lease_s = COALESCE(excluded.lease_s, run_extras.lease_s)",
            (run_id, expires_at, lease_s),
        ).rowcount
        return bool(changed)

    def lease_of(self, run_id: str) -> float:
        row = self._conn.execute(
            "SELECT lease_s FROM run_extras WHERE run_id = ?", (run_id,)
        ).fetchone()
        return float(row[0]) if row is not None and row[0] is not None else DEFAULT_LEASE_S

    def audit(self, entry: AuditEntry) -> None:
        self._conn.execute(
            "INSERT INTO audit (at, actor, action, task_id, run_id, detail) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (
                entry.at,
                entry.actor,
                str(entry.action),
                entry.task_id,
                entry.run_id,
                json.dumps(entry.detail, sort_keys=True),
            ),
        )

    def audit_events(self, task_id: str | None) -> list[AuditEvent]:
        sql = "SELECT seq AS id, at, actor, action, task_id, run_id, detail FROM audit"
        params: tuple[str, ...] = ()
        if task_id is not None:
            sql += " WHERE task_id = ?"
            params = (task_id,)
        rows = self._named(sql + " ORDER BY seq", params).fetchall()
        return [audit_event_from_row(row, json.loads(row["detail"])) for row in rows]

    def idempotent(self, scope: str, key: str) -> tuple[str, dict[str, Any]] | None:
        row = self._conn.execute(
            "SELECT fingerprint, response FROM idempotency WHERE scope = ? AND key = ?",
            (scope, key),
        ).fetchone()
        if row is None:
            return None
        response: dict[str, Any] = json.loads(row[1])
        return str(row[0]), response

    def remember(
        self, scope: str, key: str, fingerprint: str, response: dict[str, Any], at: float
    ) -> None:
        self._conn.execute(
            "INSERT INTO idempotency (scope, key, fingerprint, response, created_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (scope, key, fingerprint, json.dumps(response, sort_keys=True), at),
        )

    def grants(self, principal: str | None) -> list[Grant]:
        sql = "SELECT principal, role, granted_by, granted_at FROM role_grants"
        params: tuple[str, ...] = ()
        if principal is not None:
            sql += " WHERE principal = ?"
            params = (principal,)
        rows = self._named(sql + " ORDER BY principal, role", params).fetchall()
        return [grant_from_row(row) for row in rows]

    def put_grant(self, grant: Grant) -> bool:
        changed = self._conn.execute(
            "INSERT INTO role_grants (principal, role, granted_by, granted_at) "
            "VALUES (?, ?, ?, ?) ON CONFLICT (principal, role) DO NOTHING",
            (grant.principal, grant.role, grant.granted_by, grant.granted_at),
        ).rowcount
        return bool(changed)

    def delete_grant(self, principal: str, role: str) -> bool:
        changed = self._conn.execute(
            "DELETE FROM role_grants WHERE principal = ? AND role = ?", (principal, role)
        ).rowcount
        return bool(changed)

    def meta(self, key: str) -> str | None:
        row = self._conn.execute("SELECT value FROM ledger_meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        self._conn.execute(
            "INSERT INTO ledger_meta (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, value),
        )

    # -- vendor lanes (issue #28) --------------------------------------------------------

    def lane(self, name: str, *, lock: bool = False, create: bool = False) -> LaneSummary | None:
        row = self._named(f"{_LANE_SELECT} WHERE lane = ?", (name,)).fetchone()
        return None if row is None else lane_from_row(row)

    def lane_gates(self, names: tuple[str, ...], *, lock: bool) -> list[LaneGate]:
        marks = ", ".join("?" for _ in names)
        rows = self._conn.execute(
            "SELECT lane, state, until_at, probe_run FROM lane_summaries "
            f"WHERE lane IN ({marks}) ORDER BY lane",
            names,
        ).fetchall()
        return [LaneGate(*row) for row in rows]

    def lanes(self) -> list[LaneSummary]:
        rows = self._named(f"{_LANE_SELECT} ORDER BY lane").fetchall()
        return [lane_from_row(row) for row in rows]

    def lane_events(self, name: str | None) -> list[LaneEvent]:
        sql = f"SELECT {', '.join(LANE_EVENT_COLUMNS)} FROM lane_events"
        params: tuple[str, ...] = ()
        if name is not None:
            sql += " WHERE lane = ?"
            params = (name,)
        rows = self._named(sql + " ORDER BY seq", params).fetchall()
        return [lane_event_from_row(row) for row in rows]

    def notify(self, channel: str, payload: str) -> None:
        """SQLite has no notifications: its waiters poll (`SqliteStore.wait_for_wake`)."""

    def lane_stops(self, name: str) -> list[tuple[str, str]]:
        rows = self._conn.execute(LANE_STOPS.replace("%s", "?"), (name, name)).fetchall()
        return [(str(task), str(run)) for task, run in rows]

    def numbered_lane_events(self) -> list[tuple[int, LaneEvent]]:
        sql = f"SELECT seq, {', '.join(LANE_EVENT_COLUMNS)} FROM lane_events ORDER BY seq"
        return [(int(row["seq"]), lane_event_from_row(row)) for row in self._named(sql)]

    def lane_event_barrier(self) -> int:
        # A write transaction holds the file's write lock: no other one adds a lane event.
        row = self._conn.execute("SELECT coalesce(max(seq), 0) FROM lane_events").fetchone()
        return int(row[0])

    def add_lane_event(self, event: LaneEvent) -> None:
        self._conn.execute(_LANE_EVENT_INSERT, lane_event_row(event))

    def write_lane(self, summary: LaneSummary) -> None:
        row = lane_row(summary)
        row["capped"] = int(row["capped"])
        self._conn.execute(_LANE_UPSERT, row)

    def set_run_lane(self, run_id: str, lane: str) -> None:
        self._conn.execute("INSERT INTO run_lanes (run_id, lane) VALUES (?, ?)", (run_id, lane))

    def run_lane(self, run_id: str) -> str | None:
        row = self._conn.execute(
            "SELECT lane FROM run_lanes WHERE run_id = ?", (run_id,)
        ).fetchone()
        return None if row is None else str(row[0])

    def task_lane(self, task_id: str) -> str | None:
        row = self._conn.execute(
            "SELECT l.lane FROM run_lanes l JOIN runs r ON r.id = l.run_id "
            "WHERE r.task_id = ? ORDER BY r.seq DESC LIMIT 1",
            (task_id,),
        ).fetchone()
        return None if row is None else str(row[0])

    def task_lanes(self, task_ids: list[str]) -> dict[str, tuple[str, str]]:
        if not task_ids:
            return {}
        marks = ", ".join("?" * len(task_ids))
        # In run order: each task's last run with a lane, and its last run, come last.
        lanes = {
            str(task_id): str(lane)
            for task_id, lane in self._conn.execute(
                "SELECT r.task_id, l.lane FROM run_lanes l JOIN runs r ON r.id = l.run_id "
                f"WHERE r.task_id IN ({marks}) ORDER BY r.seq",
                tuple(task_ids),
            )
        }
        if not lanes:
            return {}
        laned = tuple(lanes)
        hosts = {
            str(task_id): str(host)
            for task_id, host in self._conn.execute(
                f"SELECT task_id, owner_host FROM runs WHERE task_id IN "
                f"({', '.join('?' * len(laned))}) ORDER BY seq",
                laned,
            )
        }
        return {task_id: (lane, hosts[task_id]) for task_id, lane in lanes.items()}

    # -- the board outbox (issue #47) ----------------------------------------------------
    # Every write here runs under the database's write lock (BEGIN IMMEDIATE): a row read
    # in a write transaction is the row the transaction writes back.

    def outbox(self, board: str, item: str, *, lock: bool = False) -> OutboxEntry | None:
        row = self._named(f"{_OUTBOX_SELECT} WHERE board = ? AND item = ?", (board, item))
        found = row.fetchone()
        return None if found is None else outbox_from_row(found)

    def outbox_rows(self, board: str, *, pending: bool) -> list[OutboxEntry]:
        where = " AND sent_seq < seq" if pending else ""
        rows = self._named(f"{_OUTBOX_SELECT} WHERE board = ?{where} ORDER BY item", (board,))
        return [outbox_from_row(row) for row in rows]

    def due_outbox(
        self, board: str, at: float, owner: str, limit: int, max_tries: int
    ) -> list[OutboxEntry]:
        rows = self._named(
            f"{_OUTBOX_SELECT} WHERE board = ? AND sent_seq < seq AND tries < ? "
            "AND (next_at IS NULL OR next_at <= ?) "
            "AND (claimed_by IS NULL OR claimed_by = ? OR claimed_until <= ?) "
            "ORDER BY updated_at, item LIMIT ?",
            (board, max_tries, at, owner, at, limit),
        )
        return [outbox_from_row(row) for row in rows]

    def write_outbox(self, entry: OutboxEntry) -> None:
        self._conn.execute(_OUTBOX_UPSERT, outbox_row(entry))

    # -- notifications (issue #49) -------------------------------------------------------

    def add_notify_event(
        self, event_id: str, kind: str, subject: str, payload: str, at: float
    ) -> None:
        self._conn.execute(
            "INSERT INTO notify_events (id, kind, subject, payload, at) VALUES (?, ?, ?, ?, ?)",
            (event_id, kind, subject, payload, at),
        )

    def notify_event(self, event_id: str) -> dict[str, Any] | None:
        rows = self._dicts(f"{NOTIFY_EVENT_SELECT} WHERE id = ?", (event_id,))
        return rows[0] if rows else None

    def notify_max_seq(self) -> int:
        row = self._conn.execute("SELECT max(seq) FROM notify_events").fetchone()
        return int(row[0] or 0)

    def notify_events_after(self, after: int, limit: int) -> list[dict[str, Any]]:
        return self._dicts(
            f"{NOTIFY_EVENT_SELECT} WHERE seq > ? ORDER BY seq LIMIT ?", (after, limit)
        )

    def notify_endpoint_rows(self, endpoint_id: str | None, *, lock: bool) -> list[dict[str, Any]]:
        if endpoint_id is None:
            return self._dicts(f"{NOTIFY_ENDPOINT_SELECT} ORDER BY id")
        return self._dicts(f"{NOTIFY_ENDPOINT_SELECT} WHERE id = ?", (endpoint_id,))

    def put_notify_endpoint(self, row: Mapping[str, Any]) -> None:
        self._conn.execute(
            NOTIFY_ENDPOINT_UPSERT, tuple(row[name] for name in NOTIFY_ENDPOINT_COLUMNS)
        )

    def delete_notify_endpoint(self, endpoint_id: str) -> bool:
        self._conn.execute("DELETE FROM notify_deliveries WHERE endpoint_id = ?", (endpoint_id,))
        gone = self._conn.execute("DELETE FROM notify_endpoints WHERE id = ?", (endpoint_id,))
        return gone.rowcount > 0

    def notify_owed(
        self, endpoint_id: str, from_seq: int, kinds: tuple[str, ...] | None, limit: int
    ) -> list[dict[str, Any]]:
        params = (endpoint_id, from_seq, *(kinds or ()), endpoint_id, limit)
        return self._dicts(notify_owed_sql(kinds, count=False), params)

    def notify_backlog(self, endpoint_id: str, from_seq: int, kinds: tuple[str, ...] | None) -> int:
        params = (endpoint_id, from_seq, *(kinds or ()), endpoint_id)
        row = self._conn.execute(notify_owed_sql(kinds, count=True), params).fetchone()
        return int(row[0])

    def notify_delivery(self, endpoint_id: str, event_seq: int) -> dict[str, Any] | None:
        rows = self._dicts(
            f"SELECT {', '.join(NOTIFY_DELIVERY_COLUMNS)} FROM notify_deliveries "
            "WHERE endpoint_id = ? AND event_seq = ?",
            (endpoint_id, event_seq),
        )
        return rows[0] if rows else None

    def put_notify_delivery(self, row: Mapping[str, Any]) -> None:
        self._conn.execute(
            NOTIFY_DELIVERY_UPSERT, tuple(row[name] for name in NOTIFY_DELIVERY_COLUMNS)
        )


_OUTBOX_SELECT = f"SELECT {', '.join(OUTBOX_COLUMNS)} FROM board_outbox"
_OUTBOX_UPSERT = (
    f"INSERT INTO board_outbox ({', '.join(OUTBOX_COLUMNS)}) "
    f"VALUES ({', '.join(':' + name for name in OUTBOX_COLUMNS)}) "
    "ON CONFLICT (board, item) DO UPDATE SET "
    + ", ".join(f"{name} = excluded.{name}" for name in OUTBOX_COLUMNS[2:])
)
