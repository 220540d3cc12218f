"""One PostgreSQL transaction's reads and writes: every SQL statement the rules need, no
rules (`Tx` in `execkit.ledger._core`).

How admission is serialised (ADR 0033: the count is checked in the transaction that starts
the run). Writes run at READ COMMITTED (`store.py`); `task(..., lock=True)` is `SELECT ...
FOR UPDATE` on the task row, which also holds the task's history summary, so two admissions
on one task queue on that row lock and the second one reads the first one's committed
summary (READ COMMITTED gives each statement a fresh snapshot) before it decides. Reading a
run inside a write transaction locks its task row first, so finishing, renewing and
abandoning a run serialise with admissions on the same task, and an idempotency key is
looked up under a transaction-scoped advisory lock on the key, so two first uses of one key
(two dispatchers creating the task for one board issue) queue, and the second one replays
the first one's answer. Row locks are always taken in task order and advisory key locks
before any row lock, so the locking cannot deadlock.

A write transaction runs in pipeline mode: the statements whose results nothing needs
(summary, audit, keys) are sent without waiting, and the client waits only at the next read
and at COMMIT (`store.py` sends BEGIN with the first read and COMMIT with the last writes).
Plain INSERTs and UPDATEs are queued (`_queue`) and sent together before the next statement
or with COMMIT, folded into as few statements as keeps their effect (`_groups`, `_folded`:
data-modifying `WITH` queries): an admission's four writes are one statement, a result's
three another (issue #33: each statement costs the client and the server more than the
rows it writes). An admission and a run's result make two round trips (issue #33): the rules say
first what they are about to read (`expect_admission`, `expect_result`), and every one of
those reads, with its lock, goes in one batch in the order the rules take them (advisory key
lock, task row, its running run, the lane rows, and the number of the run to admit); the
rules then read the answers from memory and decide in Python (one source of the rule), and
their writes go with COMMIT. An answer is kept until the first write of the transaction (a
run's lane, written only at its admission, until that write): a read after a write goes to
the server. The run's number is drawn before the decision, so a refused admission leaves a
gap in the run numbers, as a rolled-back one always did. A run read running under its
task's lock cannot change before this transaction ends, so finishing it waits for nothing.
Those reads are not even sent when the store holds a copy of the task as its own last
admission or result left it (`copies.py`, `Store.write(remembered=True)`): the rules decide
on the copy, and the whole transaction is one batch, its guards first (the key's lock, then
the task row, the run and the admission's lanes, each locked and checked to be what the
copy says), then the writes, the task read back for the next copy, and COMMIT; a guard that
finds its row changed fails its statement, the server skips the rest, and the store raises
`StaleCopy` for the rules to decide again on rows read (two round trips, as above).
Every statement that asks for a lock (a row's FOR UPDATE, an advisory lock; a table's
lock, in a statement of its own before it) sets its own `lock_timeout` first (`_WAIT`): what
is left of the caller's wait, counted down by the server from when the transaction began,
so a caller waits at most its one timeout however many locks it meets (PostgreSQL's
timeout bounds each lock wait alone). Several rows locked in one statement are asked for a
row at a time (a LATERAL subquery) where an admission locks them; a repair's and an
abandonment sweep's rows are each given what was left when they were read.
PostgreSQL text cannot hold NUL: text is stored with U+FFFD in its place (`nul_free`,
`jsonb`).
"""

from __future__ import annotations

import itertools
import json
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import attrs

from execkit._budget import AttemptStatus, HistorySummary
from execkit._classify import FailureClass
from execkit._errors import StorageError
from execkit._lanes import LaneEvent, LaneGate, LaneSummary, open_lane
from execkit._usage import Usage
from execkit.ledger._core import (
    FINISHED_STATUSES,
    LANE_CONFIG_META_KEY,
    SpendPlan,
    TaskRecord,
    summary_values,
)
from execkit.ledger._model import (
    DEFAULT_LEASE_S,
    AuditEntry,
    AuditEvent,
    Grant,
    OutboxEntry,
    Run,
    TaskStatus,
)
from execkit.ledger._postgres.copies import UNREAD, Copies, TaskCopy
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
    TASK_COLUMNS,
    TASK_ROW,
    USAGE_COLUMNS,
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
    task_from_row,
)
from execkit.ledger._spend import SPEND_META_KEY, SpendRow, TaskBudget

if TYPE_CHECKING:
    import psycopg

    from execkit.ledger._postgres.wire import Answer, Wire

__all__ = ["Opener", "PostgresTx", "jsonb", "nul_free"]

_T = TypeVar("_T")


class Opener(Protocol):
    """How a write transaction gets its connection, on libpq's pipeline (`wire.py`), with
    BEGIN queued to go in its first batch; called again, it replaces the connection
    (`_first_batch`)."""

    def __call__(self) -> tuple[psycopg.Connection[Any], Wire]: ...


# Rows are read by column name (`_rows.py`); here every column of a row shape is a column
# of one table under the same name.
_RUN_SELECT = f"SELECT {', '.join(RUN_COLUMNS)} FROM runs"
_TASK_SELECT = f"SELECT {', '.join(TASK_COLUMNS + SUMMARY_COLUMNS)} FROM tasks"
# The hours `spend_buckets` keeps the spend windows in (schema step 11).
_HOUR = 3600
_TOKENS_OF = "(r.input_tokens + r.output_tokens + r.cache_read_tokens + r.cache_write_tokens)"
# A run's effective cost (`Tx`'s spend section), what run row `r` holds of its windows: its
# reservation while it runs or when its result reported no USD (no tokens either, for the
# tokens), else what it reported; `_EFFECTIVE` sums it over the rows.
_HELD_USD_OF = "CASE WHEN r.status = 'running' OR r.usd IS NULL THEN r.reserved_usd ELSE r.usd END"
_HELD_TOKENS_OF = (
    f"CASE WHEN r.status = 'running' OR (r.usd IS NULL AND {_TOKENS_OF} = 0) "
    f"THEN r.reserved_tokens ELSE {_TOKENS_OF} END"
)
_EFFECTIVE = f"coalesce(sum({_HELD_USD_OF}), 0), coalesce(sum({_HELD_TOKENS_OF}), 0)"
# pg_advisory_xact_lock(int, int) key, beside the lane configuration's: the admissions
# that read the spend windows queue on it (`lock_spend`).
_SPEND_LOCK = (0x65786B74, 3)
# A run's cost as its result reported it (issue #45), set with the result.
_COST_SET = "".join(f", {column} = %s" for column in USAGE_COLUMNS)
# The values of `summary_values`, in `SUMMARY_COLUMNS` order, then the task's id.
_SUMMARY_UPDATE = (
    "UPDATE tasks SET "
    + ", ".join(f"{column} = %s" for column in SUMMARY_COLUMNS)
    + " WHERE id = %s"
)

# The spend configuration's stored text (issue #45), read with an admission's last read.
_SPEND_VALUE = f"SELECT value FROM ledger_meta WHERE key = '{SPEND_META_KEY}'"
# Read again, in `expect_admission`, only when the key is new: a replayed key locks no task
# (the run it names may be another task's, and task locks are taken in task order).
_KEY_IS_NEW = "NOT EXISTS (SELECT 1 FROM idempotency WHERE scope = %s AND key = %s)"
_ABSENT = object()
# Answers read ahead that stay true through this transaction's own writes (`_written`).
_HELD = frozenset({"run_lane", "locked_lane", "meta"})
_RUN_OF_KEY = ", ".join(
    f"r.{column} AS r_{column}" for column in RUN_COLUMNS
)  # an answer not read ahead (None is an answer: no such row)

# An admission's last read, after its locks: the transaction's id, the run's number drawn
# (none for a task that is finished or gone, or a key already used) and the task's running
# run (its columns NULL when it has none).
_FINISHED = [str(status) for status in FINISHED_STATUSES]


def _number_and_running(spend_lock: str = "") -> str:
    """An admission's number and running run (above), with `spend_lock` (its targets)
    evaluated after the rest: the spend lock of a capped admission, taken in the same
    statement (the reads it guards are the statements after: each takes its snapshot
    when it starts, after the lock)."""
    return (
        "SELECT txid_current() AS tx_xid, (SELECT nextval('run_numbers') FROM tasks "
        f"WHERE id = %s AND status <> ALL(%s) AND {_KEY_IS_NEW}) AS tx_number, "
        f"({_SPEND_VALUE}) AS tx_spend, "
        + ", ".join(f"r.{column}" for column in RUN_COLUMNS)
        + spend_lock
        + " FROM (SELECT 1) AS one LEFT JOIN runs r ON r.task_id = %s "
        f"AND r.attempt = (SELECT t.running FROM tasks t WHERE t.id = %s) AND {_KEY_IS_NEW}"
    )


# What every statement that asks for a lock gives itself as its lock timeout (issue #50):
# what is left of the caller's wait, on the server's clock, as the statement asks. `%s`
# is what was left (ms) when the transaction began (`PostgresTx.waits`: the pool's wait
# already spent), less the time since (`now()` is when it began), at least 1 ms (0 would
# be no timeout). PostgreSQL's `lock_timeout` bounds each lock wait on its own and
# restarts at the next: given this way, a caller's waits, however many, end by its one
# deadline. Placed where the server evaluates it before the lock it bounds (a row's filter,
# a target before the lock's), and for several rows one at a time (a LATERAL per row).
_WAIT = (
    "set_config('lock_timeout', greatest(1, %s::float8 - 1000 * extract(epoch FROM "
    "clock_timestamp() - now()))::bigint::text, true)"
)
_WAITS = f"{_WAIT} IS NOT NULL"  # as a condition
_NUMBER_AND_RUNNING = _number_and_running()
_NUMBER_AND_RUNNING_SPEND_LOCKED = _number_and_running(
    f", {_WAIT} AS tx_wait, pg_advisory_xact_lock(%s, %s) AS tx_spend_lock"
)
# Its parameter in a statement's values, until the statement is sent: what was left when
# the transaction began is known only once its connection is open (`PostgresTx.waits`).
_LEFT: Any = object()
# A transaction answered from the store's copy of its task (`copies.py`) sends these
# first, in its one batch: each locks a row and checks it is still the version the copy
# was taken at. `1 / count(*)` fails (division_by_zero) when it is not, and a pipeline
# skips everything after a failed statement, COMMIT included: nothing is written, and the
# store says `StaleCopy`. A run's guard comes after its task's, in a statement of its own:
# it reads what committed while the task's lock was waited for.
_KEY_LOCK = f"SELECT {_WAIT}, pg_advisory_xact_lock(hashtextextended(%s, 0))"


def _guard(table: str, condition: str = "") -> str:
    """The row of `table` with the id and version (`xmin`) given, locked, failing its
    statement (division_by_zero) unless it is there and meets `condition` too."""
    return (
        f"SELECT 1 / count(*) FROM (SELECT 1 FROM {table} WHERE id = %s "
        f"AND xmin = %s::text::xid{condition} AND {_WAITS} FOR UPDATE) AS fresh"
    )


_TASK_GUARD = _guard("tasks")
# An admission on a copy also finds the spend configuration as the copy's store last read
# it (issue #45: its text, or none), or decides again on what is stored.
_NEW_KEY_TASK_GUARD = _guard(
    "tasks", f" AND {_KEY_IS_NEW} AND ({_SPEND_VALUE}) IS NOT DISTINCT FROM %s"
)
_RUN_GUARD = _guard("runs", " AND status = 'running'")


@lru_cache(maxsize=16)
def _lanes_named(count: int) -> str:
    """`count` lanes as rows `n(lane, at)`, one parameter each, in the order given.

    A VALUES list, not `unnest` of an array: PostgreSQL plans `unnest` of a parameter for
    ten rows, so the plan it could keep (a generic one) always looked ten times dearer
    than the one it made for the array it was given, and it planned the statement again
    at every admission (about 60 µs, issue #45's measurements). A list of `count` rows is
    planned for `count` rows: one statement per count, planned once."""
    return (
        "(VALUES "
        + ", ".join(f"(%s::text, {at})" for at in range(1, count + 1))
        + ") AS n(lane, at)"
    )


@lru_cache(maxsize=16)
def _open_lanes_guard(count: int) -> str:
    """An admission's `count` lanes (sorted names), on a copy: every one that has a row is
    open, so it admits with no probe (`admission`, `_lanes.py`); locked, in name order, as
    `expect_admission` locks them."""
    return (
        "SELECT 1 / (count(*) FILTER (WHERE state <> 'open') = 0)::int "
        f"FROM {_lanes_named(count)} CROSS JOIN LATERAL (SELECT state FROM "
        f"lane_summaries l WHERE l.lane = n.lane AND {_WAITS} FOR UPDATE) AS gates"
    )


@lru_cache(maxsize=32)
def _lane_gates(count: int, condition: str = "") -> str:
    """The gates of `count` lanes named (sorted names), each row locked in that order and
    given what is left of the wait as it is asked for; in that order."""
    return (
        f"SELECT g.lane, g.state, g.until_at, g.probe_run FROM {_lanes_named(count)} "
        "CROSS JOIN LATERAL (SELECT lane, state, until_at, "
        f"probe_run FROM lane_summaries l WHERE l.lane = n.lane{condition} AND {_WAITS} "
        "FOR UPDATE) AS g ORDER BY n.at"
    )


_NEW_KEY = f" AND {_KEY_IS_NEW}"
_STALE = "22012"  # division_by_zero: a guard's, and nothing else in its statement divides


# Sent before COMMIT by an admission or a result, under its task's lock: the task row as
# the transaction leaves it, with its version, its running run (with the run's version and
# lane), and the next run's number for an open task with none running (the store's copy).
# Read by position: these four, then `TASK_ROW`, then `RUN_COLUMNS` (all NULL: none running).
# The number is drawn only by a store that worked the task before (`_DRAWING`): a number
# never used is a gap in the run ids, and a store that met the task once (a CLI command,
# one process a transaction) would leave one at every result.
def _read_back(number: str) -> str:
    return (
        f"SELECT t.xmin::text::bigint, {number}, r.xmin::text::bigint, "
        "(SELECT lane FROM run_lanes WHERE run_id = r.id), "
        + ", ".join(f"t.{column}" for column in TASK_ROW)
        + ", "
        + ", ".join(f"r.{column}" for column in RUN_COLUMNS)
        # The running run by its number as a value (an InitPlan), both columns of its
        # unique index: joined on `t.running`, a planner without statistics (a new ledger,
        # until autovacuum analyses it) scans every run of the task and filters them, a
        # read-back that grew with the task's history.
        + " FROM tasks t LEFT JOIN runs r ON r.task_id = t.id "
        "AND r.attempt = (SELECT running FROM tasks WHERE id = %s) WHERE t.id = %s"
    )


_DRAWING = _read_back(
    "CASE WHEN t.running IS NULL AND t.status NOT IN ("
    + ", ".join(f"'{status}'" for status in FINISHED_STATUSES)
    + ") THEN nextval('run_numbers') END"
)
_NOT_DRAWING = _read_back("NULL::bigint")
_RUN_AT = 4 + len(TASK_ROW)
_STATUS_AT = TASK_ROW.index("status")
# pg_advisory_xact_lock(int, int) key, beside migrate.py's (0x65786b74, 1): held shared by
# a result that reads the lane configuration ahead of its lane event, exclusively by a
# configuration change (`lane_event_barrier`).
_LANE_CONFIG_LOCK = (0x65786B74, 2)
# A result's read after its task's lock: the transaction's id, the run's lane and the run;
# for a run bound to a lane, the configuration's lock taken (shared) on the way.
_RUN_AND_LANE = (
    "SELECT txid_current() AS tx_xid, "
    "(SELECT lane FROM run_lanes WHERE run_id = %s) AS tx_lane, "
    "(SELECT pg_advisory_xact_lock_shared(%s, %s) IS NULL FROM run_lanes "
    f"WHERE run_id = %s AND {_WAITS}) AS tx_lane_lock, "
    + ", ".join(f"r.{column}" for column in RUN_COLUMNS)
    + " FROM (SELECT 1) AS one LEFT JOIN runs r ON r.id = %s"
)

_LANE_SELECT = f"SELECT {', '.join(LANE_COLUMNS)} FROM lane_summaries"
# A result's lane row, locked, and the lane configuration (None: no lane, or no row yet).
# After the lane events' lock: no configuration change commits between the two.
_LANE_OF_RUN = (
    f"SELECT {', '.join(LANE_COLUMNS)}, "
    "(SELECT value FROM ledger_meta WHERE key = %s) AS tx_config FROM lane_summaries "
    f"WHERE lane = (SELECT lane FROM run_lanes WHERE run_id = %s) AND {_WAITS} FOR UPDATE"
)
_LANE_UPSERT = (
    f"INSERT INTO lane_summaries ({', '.join(LANE_COLUMNS)}) "
    f"VALUES ({', '.join(f'%({column})s' for column in LANE_COLUMNS)}) "
    "ON CONFLICT (lane) DO UPDATE SET "
    + ", ".join(f"{column} = excluded.{column}" for column in LANE_COLUMNS[1:])
)
_LANE_CREATE = (
    f"INSERT INTO lane_summaries ({', '.join(LANE_COLUMNS)}) "
    f"VALUES ({', '.join(f'%({column})s' for column in LANE_COLUMNS)}) "
    "ON CONFLICT (lane) DO NOTHING"
)
_LANE_EVENT_INSERT = (
    f"INSERT INTO lane_events ({', '.join(LANE_EVENT_COLUMNS)}) "
    f"VALUES ({', '.join(f'%({column})s' for column in LANE_EVENT_COLUMNS)})"
)

# Testing seam: the crash tests set this to hold the admission transaction open after the
# INSERT (before COMMIT), then kill the process or its server connection there.
_after_admission_insert: Callable[[], None] | None = None

# A write waiting to be sent (`_queue`): its SQL (positional parameters), their values, the
# table it writes and the other tables it reads (a foreign key's included).
_Write = tuple[str, tuple[Any, ...], str, frozenset[str]]
_NAMED = re.compile(r"%\((\w+)\)s")


@lru_cache(maxsize=64)
def _positional(sql: str) -> tuple[str, tuple[str, ...]]:
    """`sql` with its `%(name)s` placeholders as `%s`, and the names in their order."""
    return _NAMED.sub("%s", sql), tuple(_NAMED.findall(sql))


@lru_cache(maxsize=256)
def _folded(statements: tuple[str, ...]) -> str:
    """Plain INSERT and UPDATE statements as one: every one but the last a data-modifying
    `WITH` query. PostgreSQL runs each of them once, all on the statement's one snapshot,
    and checks foreign keys at its end."""
    if len(statements) == 1:
        return statements[0]
    head = ", ".join(f"w{n} AS ({sql})" for n, sql in enumerate(statements[:-1]))
    return f"WITH {head} {statements[-1]}"


def _groups(writes: list[_Write]) -> list[list[_Write]]:
    """Consecutive writes, grouped so that each group can run as one statement with the
    effect they have one after another: a write joins the group before it unless it reads
    or writes a table an earlier write of the group wrote (on one snapshot it would not
    see that write, and one row changed twice in a statement keeps one change only)."""
    groups: list[list[_Write]] = []
    written: set[str] = set()
    for write in writes:
        _sql, _values, table, reads = write
        if groups and table not in written and written.isdisjoint(reads):
            groups[-1].append(write)
        else:
            groups.append([write])
            written = set()
        written.add(table)
    return groups


# A run's lane, looked up by its key: a join let the planner hash every run's lane (a
# scan of run_lanes, growing with the volume) for the handful of runs a window reads.
_LANE_OF_R = "(SELECT l.lane FROM run_lanes l WHERE l.run_id = r.id)"


# The running runs, each with its lane looked up once, read once by every window (a
# handful, whatever the volume: `runs_running_by_lease`).
_RUNNING = (
    "running AS MATERIALIZED (SELECT r.started_at, r.reserved_usd, r.reserved_tokens, "
    f"{_LANE_OF_R} AS lane FROM runs r WHERE r.status = 'running')"
)
# A window `w` (its start `s`, its first whole hour `h`, its lane `l`: NULL for every
# lane) matches a run `r` of its lane; the lane is read only for a laned window.
_OF_LANE = f"(w.l IS NULL OR {_LANE_OF_R} = w.l)"


def _windows_sql(
    windows: Sequence[tuple[float, str | None]], *, first: bool = False
) -> tuple[str, tuple[Any, ...]]:
    """What each window (since, lane: None for every lane) holds, as one statement, a row
    (n, USD, tokens) per window n: the ended runs of its whole hours from `spend_buckets`
    (kept by a trigger: a range of the primary key), the runs of the partial hour before
    them one by one (a range of the start index: empty for a window that starts on the
    hour, as a day or a week in UTC does), and the reservations of the running runs after
    that hour. The same work whatever the volume or the ledger's age. `first`: each row
    then ends with the earliest start in its window.

    Each window is a row of values, so the text depends only on how many there are: built
    once per count (`_windows_text`), prepared once per connection, and small to plan and
    to start (the windows were once columns of one row, each a FILTER of every sum: 68 µs
    of the server's time at a capped admission in the bench, against 42-59 µs)."""
    params: list[Any] = []
    for since, lane in windows:
        params += [since, math.ceil(since / _HOUR) * _HOUR, lane]
    return _windows_text(len(windows), first), tuple(params)


@lru_cache(maxsize=16)
def _windows_text(count: int, first: bool) -> str:
    """`_windows_sql`'s text for `count` windows, the rows `w` (n, s, h, l)."""
    rows = ", ".join(f"({n}, %s::float8, %s::bigint, %s::text)" for n in range(count))
    earliest = (
        f", (SELECT r.started_at FROM runs r WHERE r.started_at >= w.s AND {_OF_LANE} "
        "ORDER BY r.started_at LIMIT 1)"
        if first
        else ""
    )
    # Summed as float8 and bigint: a sum of bigints is a numeric, read as a Decimal.
    return (
        f"WITH {_RUNNING} SELECT w.n, held.usd, held.tokens{earliest} "
        f"FROM (VALUES {rows}) AS w(n, s, h, l) CROSS JOIN LATERAL ("
        "SELECT coalesce(sum(x.usd), 0)::float8 AS usd, coalesce(sum(x.tokens), 0)::bigint "
        "AS tokens FROM (SELECT b.usd, b.tokens FROM spend_buckets b "
        "WHERE b.lane = coalesce(w.l, '*') AND b.bucket >= w.h "
        f"UNION ALL SELECT {_HELD_USD_OF}, {_HELD_TOKENS_OF} FROM runs r "
        f"WHERE r.started_at >= w.s AND r.started_at < w.h AND {_OF_LANE} "
        "UNION ALL SELECT q.reserved_usd, q.reserved_tokens FROM running q "
        "WHERE q.started_at >= w.h AND (w.l IS NULL OR q.lane = w.l)) x) held"
    )


def _held_rows(rows: list[tuple[Any, ...]], count: int) -> list[tuple[Any, ...]]:
    """`_windows_sql`'s rows in window order, less the window's number."""
    ordered: list[tuple[Any, ...]] = [()] * count
    for row in rows:
        ordered[row[0]] = row[1:]
    return ordered


def _held_sums(rows: list[tuple[Any, ...]], count: int) -> list[tuple[float, int]]:
    return [(float(usd), int(tokens)) for usd, tokens, *_ in _held_rows(rows, count)]


def _recent_sql(lane: str | None, limit: int) -> tuple[str, tuple[Any, ...]]:
    """The costs of up to `limit` runs that reported one (a running run, or one that ended
    with none, reports nothing a percentile could read), the latest first."""
    if lane is None:
        return (
            f"SELECT r.usd, {_TOKENS_OF} FROM runs r WHERE (r.usd IS NOT NULL "
            f"OR {_TOKENS_OF} > 0) ORDER BY r.started_at DESC LIMIT %s",
            (limit,),
        )
    return (
        f"SELECT r.usd, {_TOKENS_OF} FROM runs r JOIN run_lanes l ON l.run_id = r.id "
        f"WHERE l.lane = %s AND (r.usd IS NOT NULL OR {_TOKENS_OF} > 0) "
        "ORDER BY r.started_at DESC LIMIT %s",
        (lane, limit),
    )


def _recent_rows(rows: list[tuple[Any, ...]]) -> list[tuple[float | None, int]]:
    return [(None if row[0] is None else float(row[0]), int(row[1])) for row in rows]


def nul_free(value: str | None) -> str | None:
    """PostgreSQL text cannot hold NUL: it is stored as U+FFFD (a vendor's binary output
    in a failure reason must not make the run unrecordable)."""
    return None if value is None else value.replace("\x00", "\ufffd")


def jsonb(value: dict[str, Any]) -> str:
    # jsonb refuses the \u0000 escape as text does NUL.
    return json.dumps(value, sort_keys=True).replace("\\u0000", "\\ufffd")


class PostgresTx:
    """One transaction on the store's connection.

    In a write transaction `task(lock=True)` locks the task row (FOR UPDATE), reading a run
    locks its task row first, `tasks()` locks every task row (in task order) and an
    idempotency key is read under an advisory lock on it: see the module docstring.
    """

    def __init__(
        self,
        conn: psycopg.Connection[Any] | None,
        *,
        write: bool,
        opener: Opener | None = None,
        copies: Copies | None = None,
        remembered: bool = False,
        left: Callable[[], float] | None = None,
    ) -> None:
        self._connection = conn
        self._write = write
        self._wire: Wire | None = None  # a write transaction's statements go on it
        self._opener = opener
        # What is left of the caller's wait (ms), read as the transaction begins: what the
        # server counts down from at every lock this transaction asks for (`_WAIT`).
        self._left = left
        self.waits = 0.0
        # Answers read ahead (`expect_*`), by the call they answer; each is taken once.
        self._ahead: dict[tuple[Any, ...], Any] = {}
        self._locked_tasks: set[str] = set()  # task rows locked in this transaction
        self._held_runs: set[str] = set()  # runs read running under their task's lock
        self._run_number: int | None = None  # drawn ahead for the admission's INSERT
        self._queued: list[_Write] = []  # writes not sent yet (`_queue`)
        # The transaction's id, read in its first batch (none when it decided on a copy:
        # its one batch carries COMMIT): what the store asks the server about when the
        # batch with COMMIT loses its answer.
        self.xid: int | None = None
        # The store's copies (`copies.py`): read back at COMMIT (`_read_back_task`), and,
        # when `remembered`, the hints answered from one (`copied`: its task) behind the
        # guards sent first.
        self._copies = copies
        self._remembered = remembered and copies is not None
        self.copied: str | None = None
        self._guards: list[tuple[str, tuple[Any, ...]]] = []
        self._guard_answers: list[Answer] = []
        self._read_back_task: str | None = None
        self._read_back: Answer | None = None

    @property
    def _conn(self) -> psycopg.Connection[Any]:
        """The transaction's connection, every queued write sent on it first (anything
        sent after them must see them); a write transaction opens it at its first
        statement: BEGIN and the transaction's id, one round trip (a dropped connection
        replaced once first), or, decided on a copy, BEGIN and its guards, sent with the
        rest of the transaction."""
        if self._connection is None:
            assert self._opener is not None
            if self._guards:
                # A copy's guards go first, with BEGIN, before anything it checks for.
                wire = self._open()
                guards, self._guards = self._guards, []
                for sql, params in guards:
                    self._guard_answers.append(wire.execute(sql, self._waiting(params)))
            else:
                self._first_batch(self._begun)
        if self._queued:
            self.send_writes()
        assert self._connection is not None
        return self._connection

    def _open(self) -> Wire:
        """The connection opened (BEGIN queued on its wire), and what is left of the
        caller's wait as it begins (`waits`)."""
        assert self._opener is not None
        self._connection, self._wire = self._opener()
        if self._left is not None:
            self.waits = self._left()
        return self._wire

    def _waiting(self, params: Sequence[Any]) -> Sequence[Any]:
        """`params` with what is left of the wait in place of `_LEFT`."""
        if any(value is _LEFT for value in params):
            return tuple(self.waits if value is _LEFT else value for value in params)
        return params

    def _begun(self) -> None:
        """The first batch of a transaction the rules gave no hint for: BEGIN, and the
        transaction's id, so that the batch with COMMIT, should it lose its answer, can be
        asked about (`txid_current` gives it an id now; it would take one at its first
        write anyway)."""
        wire = self._wire
        assert wire is not None
        xid = wire.execute("SELECT txid_current()")
        wire.sync()
        row = xid.one()
        assert row is not None
        self.xid = int(row[0])

    def _queue(
        self,
        table: str,
        sql: str,
        params: Sequence[Any] | Mapping[str, Any],
        reads: frozenset[str] = frozenset(),
    ) -> None:
        """Queue a plain INSERT or UPDATE of `table` whose result nothing needs (`reads`:
        the other tables it reads, a referenced one included). Queued writes go out
        together, as few statements as `_groups` allows, before the next statement or
        with COMMIT (`send_writes`); their errors surface there, inside the transaction
        all the same."""
        self._written()
        if isinstance(params, Mapping):
            sql, names = _positional(sql)
            values = tuple(params[name] for name in names)
        else:
            values = tuple(params)
        self._queued.append((sql, values, table, reads))

    def send_writes(self) -> None:
        """Send the queued writes (`_queue`), in the pipeline, without waiting."""
        if not self._queued:
            return
        queued, self._queued = self._queued, []
        wire = self._on_wire()
        for group in _groups(queued):
            wire.execute(
                _folded(tuple(write[0] for write in group)),
                tuple(itertools.chain.from_iterable(write[1] for write in group)),
            )

    def closing(self) -> None:
        """Before COMMIT: the queued writes sent, and the task's row read back for the
        store's copy (an admission's or a result's; `copies.py`)."""
        self.send_writes()
        task_id = self._read_back_task
        sent = self._connection is not None or self.copied is not None
        if task_id is not None and self._copies is not None and sent:
            worked = self.copied is not None or self._copies.of_task(task_id) is not None
            read_back = _DRAWING if worked else _NOT_DRAWING
            self._read_back = self._on_wire().execute(read_back, (task_id, task_id))

    def committed(self) -> None:
        """After COMMIT: the store's copy of the task replaced by the row read back."""
        if self._read_back is None or self._copies is None:
            return
        row = self._read_back.one()
        if row is None or row[4 + _STATUS_AT] in _FINISHED:
            self._copies.drop(self._read_back_task or "")
            return
        record = TaskRecord._make(row[4:_RUN_AT])
        version, number, run_version, run_lane = row[:4]
        run = None if row[_RUN_AT] is None else run_from_values(row[_RUN_AT:])
        self._copies.put(
            TaskCopy(
                record=record,
                version=int(version),
                next_number=None if number is None else int(number),
                run=run,
                run_version=None if run_version is None else int(run_version),
                run_lane=None if run_lane is None else str(run_lane),
            )
        )

    def unchecked(self) -> bool:
        """Whether this transaction decided on a copy and sent nothing the database could
        check it with (its outcome must not stand)."""
        return self.copied is not None and self._connection is None

    def stale(self) -> bool:
        """Whether a guard found the copy this transaction decided on changed."""
        return any(answer.sqlstate() == _STALE for answer in self._guard_answers)

    def drop_copy(self) -> None:
        if self._copies is not None and self.copied is not None:
            self._copies.drop(self.copied)

    def _on_wire(self) -> Wire:
        """A write transaction's wire, its connection opened (`_conn`)."""
        self._conn  # noqa: B018  (opens it, and sends the queued writes)
        assert self._wire is not None
        return self._wire

    def _answer(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> Answer:
        """`sql` queued on the write transaction's wire; its answer read when needed."""
        wire = self._on_wire()
        if isinstance(params, Mapping):
            sql, names = _positional(sql)
            params = tuple(params[name] for name in names)
        return wire.execute(sql, self._waiting(params))

    def _first_batch(self, send: Callable[[], _T]) -> _T:
        """`send()` (statements queued, then one sync) as the transaction's first batch,
        BEGIN in it. Such a batch only reads and locks: when the connection turns out to
        have been dropped since the last transaction (a terminated backend, a restart),
        it is replaced and the batch sent again, once; nothing can be doubled."""
        import psycopg

        if self._connection is not None:
            return send()
        assert self._opener is not None
        try:
            self._open()
            return send()
        except psycopg.OperationalError:
            if self._connection is not None and not self._connection.broken:
                raise
        self._ahead.clear()
        self._locked_tasks.clear()
        self._held_runs.clear()
        self._run_number = None
        self.xid = None
        self._open()
        return send()

    def _take(self, key: tuple[Any, ...]) -> Any:
        """The answer read ahead for `key`, or `_ABSENT`."""
        return self._ahead.pop(key, _ABSENT)

    def _written(self) -> None:
        """A write (or a lock) was sent: every answer read ahead may be stale now, but those
        no other transaction can change while this one lives and this one changes only
        through the method that drops them: a run's lane (written once, at its admission:
        `set_run_lane`), a lane row read locked (`lane`, `write_lane`), the lane
        configuration read under the lane events' lock (`set_meta`)."""
        self._ahead = {key: value for key, value in self._ahead.items() if key[0] in _HELD}

    def _batch(self) -> bool:
        """Whether reads can be sent ahead here (a write transaction, in a pipeline)."""
        return self._write and self._opener is not None

    def expect_admission(
        self,
        scope: str,
        key: str,
        task_id: str,
        lanes: tuple[str, ...],
        spend: SpendPlan | None = None,
    ) -> None:
        if not self._batch():
            return
        if self._remembered and self._admission_from_copy(scope, key, task_id, lanes):
            return
        self._first_batch(lambda: self._expect_admission(scope, key, task_id, lanes, spend))

    def _admission_from_copy(
        self, scope: str, key: str, task_id: str, lanes: tuple[str, ...]
    ) -> bool:
        """Answer an admission's reads from the store's copy of its task, when there is
        one to admit on (open, nothing running, its next run's number drawn): the key taken
        for new, the task as copied and its lanes open, checked by the guards sent first."""
        assert self._copies is not None
        copy = self._copies.of_task(task_id)
        spend = self._copies.spend
        if (
            copy is None
            or copy.next_number is None
            or copy.record.running is not None
            or spend is UNREAD
        ):
            return False
        self._ahead[("meta", SPEND_META_KEY)] = spend
        self._ahead[("idempotent", scope, key)] = None
        self._ahead[("task", task_id)] = copy.record
        self._locked_tasks.add(task_id)  # by the guard, the first statement sent
        self._run_number = copy.next_number
        self._guards = [
            (_KEY_LOCK, (_LEFT, f"{scope}\x1f{key}")),
            (_NEW_KEY_TASK_GUARD, (task_id, copy.version, scope, nul_free(key), spend, _LEFT)),
        ]
        if lanes:
            self._ahead[("lane_gates", lanes)] = []  # none stored that is not open
            self._guards.append((_open_lanes_guard(len(lanes)), (*sorted(lanes), _LEFT)))
        self.copied = self._read_back_task = task_id
        return True

    def _expect_admission(
        self, scope: str, key: str, task_id: str, lanes: tuple[str, ...], spend: SpendPlan | None
    ) -> None:
        stored_key = nul_free(key)
        new = (scope, stored_key)
        wire = self._on_wire()
        execute = wire.execute
        waits = self.waits
        execute(_KEY_LOCK, (waits, f"{scope}\x1f{key}"))
        # With the key, the run it admitted: a replay reads it (no write follows, no lock).
        found = execute(
            f"SELECT i.fingerprint, i.response, {_RUN_OF_KEY} FROM idempotency i "
            "LEFT JOIN runs r ON r.id = i.response->>'run_id' WHERE i.scope = %s AND i.key = %s",
            new,
        )
        task = execute(
            f"{_TASK_SELECT} WHERE id = %s AND {_KEY_IS_NEW} AND {_WAITS} FOR UPDATE",
            (task_id, *new, waits),
        )
        gates = (
            execute(_lane_gates(len(lanes), _NEW_KEY), (*sorted(lanes), *new, waits))
            if lanes
            else None
        )
        # Issue #45: with the spend configuration this store last saw, a capped admission's
        # spend lock and reads go here too, after every row lock it takes (the order the
        # gate takes them in), and are kept when that configuration is still the one read.
        known = None if self._copies is None else self._copies.spend
        planned = spend(known) if spend is not None and isinstance(known, str) else None
        # Drawn after the task's lock: a task's runs are numbered in their order. With
        # it, the task's running run, if any (read under that lock), and the spend lock.
        number = (
            execute(
                _NUMBER_AND_RUNNING,
                (task_id, _FINISHED, *new, task_id, task_id, *new),
            )
            if planned is None
            else execute(
                _NUMBER_AND_RUNNING_SPEND_LOCKED,
                (task_id, _FINISHED, *new, waits, *_SPEND_LOCK, task_id, task_id, *new),
            )
        )
        if planned is not None:
            of, limit, windows = planned
            recent = execute(*_recent_sql(of, limit)) if limit else None
            sums = execute(*_windows_sql(windows))
        wire.sync()
        drawn = number.named_one()
        assert drawn is not None
        self.xid = int(drawn["tx_xid"])
        stored = drawn.pop("tx_spend")
        self._ahead[("meta", SPEND_META_KEY)] = stored
        if self._copies is not None:
            self._copies.spend = stored
        if planned is not None and stored == known:
            self._ahead[("spend_reads", *planned)] = (
                [] if recent is None else _recent_rows(recent.rows()),
                _held_sums(sums.rows(), len(windows)),
            )
        row = found.named_one()
        self._ahead[("idempotent", scope, key)] = (
            None if row is None else (str(row["fingerprint"]), dict(row["response"]))
        )
        if row is not None:
            if row["r_id"] is not None:
                replayed = run_from_row({column: row[f"r_{column}"] for column in RUN_COLUMNS})
                self._ahead[("run", replayed.id)] = replayed
            return
        task_row = task.named_one()
        record = None if task_row is None else task_from_row(task_row)
        self._ahead[("task", task_id)] = record
        if record is None:
            return
        self._locked_tasks.add(task_id)
        self._read_back_task = task_id
        if record.running is not None:
            run = None if drawn["id"] is None else run_from_row(drawn)
            self._ahead[("run_at", task_id, record.running)] = run
            if run is not None and run.status is AttemptStatus.RUNNING:
                self._held_runs.add(run.id)
        if gates is not None:
            self._ahead[("lane_gates", lanes)] = [LaneGate(*gate) for gate in gates.rows()]
        self._run_number = None if drawn["tx_number"] is None else int(drawn["tx_number"])

    def expect_result(self, run_id: str) -> None:
        if not self._batch():
            return
        if self._remembered and self._result_from_copy(run_id):
            return
        self._first_batch(lambda: self._expect_result(run_id))

    def _result_from_copy(self, run_id: str) -> bool:
        """Answer a result's reads from the store's copy of the run's task, when the run
        is its running run, bound to no lane: the task and the run as copied, checked by
        the guards sent first."""
        assert self._copies is not None
        copy = self._copies.of_run(run_id)
        if (
            copy is None
            or copy.run is None
            or copy.run.id != run_id
            or copy.run_version is None
            or copy.run_lane is not None
            or copy.run.status is not AttemptStatus.RUNNING
        ):
            return False
        task_id = copy.record.id
        self._ahead[("task", task_id)] = copy.record
        self._ahead[("run", run_id)] = copy.run
        self._ahead[("run_lane", run_id)] = None
        self._locked_tasks.add(task_id)
        self._held_runs.add(run_id)
        self._guards = [
            (_TASK_GUARD, (task_id, copy.version, _LEFT)),
            (_RUN_GUARD, (run_id, copy.run_version, _LEFT)),
        ]
        self.copied = self._read_back_task = task_id
        return True

    def _expect_result(self, run_id: str) -> None:
        wire = self._on_wire()
        waits = self.waits
        task = wire.execute(
            f"{_TASK_SELECT} WHERE id = (SELECT task_id FROM runs WHERE id = %s) "
            f"AND {_WAITS} FOR UPDATE",
            (run_id, waits),
        )
        run = wire.execute(_RUN_AND_LANE, (run_id, *_LANE_CONFIG_LOCK, run_id, waits, run_id))
        # A run bound to a lane feeds it an event (`_lane_result`): its row, locked, and
        # the configuration the event folds with are read here too, in a statement after
        # the one that took the configuration's lock (a statement reads what committed
        # before it began): a configuration change (`lane_event_barrier`) waits for this
        # transaction, or ended before the read.
        summary = wire.execute(_LANE_OF_RUN, (LANE_CONFIG_META_KEY, run_id, waits))
        wire.sync()
        task_row, run_row, summary_row = task.named_one(), run.named_one(), summary.named_one()
        assert run_row is not None
        self.xid = int(run_row["tx_xid"])
        if task_row is None or run_row["id"] is None:
            return  # no such run: `run()` asks the server, and finds none
        record, found = task_from_row(task_row), run_from_row(run_row)
        self._locked_tasks.add(record.id)
        self._read_back_task = record.id
        self._ahead[("task", record.id)] = record
        self._ahead[("run", run_id)] = found
        lane = run_row["tx_lane"]
        self._ahead[("run_lane", run_id)] = None if lane is None else str(lane)
        if summary_row is not None:  # none: no lane, or a lane's first event creates its row
            config = summary_row.pop("tx_config")
            self._ahead[("locked_lane", str(lane))] = lane_from_row(summary_row)
            self._ahead[("meta", LANE_CONFIG_META_KEY)] = None if config is None else str(config)
        if found.status is AttemptStatus.RUNNING and found.task_id == record.id:
            self._held_runs.add(run_id)

    # A write transaction runs on libpq's pipeline (`wire.py`): `_send` queues a statement
    # whose result nothing needs (its errors surface at the next read or at COMMIT, inside
    # the transaction all the same); a read sends everything queued before it, in order,
    # and waits. A read transaction runs on psycopg's cursors.

    def _send(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> None:
        self._written()
        if self._batch():
            self._answer(sql, params)
        else:
            self._conn.execute(sql, params)

    def lock_advisory(self, first: int, second: int) -> None:
        """Take the transaction-scoped advisory lock (`first`, `second`), waiting at most
        what is left of the caller's wait."""
        self._send(f"SELECT {_WAIT}, pg_advisory_xact_lock(%s, %s)", (_LEFT, first, second))

    def send_once(self, sql: str, params: Sequence[Any] = ()) -> None:
        """`_send` for a statement run once (a migration's): never prepared."""
        self._written()
        if self._batch():
            self._on_wire().execute(sql, params, prepare=False)
        else:
            self._conn.execute(sql, params)

    def _one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        if self._batch():
            return self._answer(sql, params).one()
        return self._conn.execute(sql, params).fetchone()

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        if self._batch():
            return self._answer(sql, params).rows()
        return self._conn.execute(sql, params).fetchall()

    def _named_all(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        """`sql`'s rows as dicts by column name."""
        if self._batch():
            return self._answer(sql, params).named()
        from psycopg.rows import dict_row

        return self._conn.cursor(row_factory=dict_row).execute(sql, params).fetchall()

    def _named_one(self, sql: str, params: Sequence[Any] = ()) -> dict[str, Any] | None:
        if self._batch():
            return self._answer(sql, params).named_one()
        from psycopg.rows import dict_row

        return self._conn.cursor(row_factory=dict_row).execute(sql, params).fetchone()

    def _count(self, sql: str, params: Sequence[Any] = ()) -> int:
        """The rows a statement ending in `RETURNING 1` changed."""
        self._written()
        return len(self._all(sql, params))

    def _lock_task_of(self, run_id: str) -> None:
        if self._write:
            self._send(
                "SELECT 1 FROM tasks WHERE id = (SELECT task_id FROM runs WHERE id = %s) "
                f"AND {_WAITS} FOR UPDATE",
                (run_id, _LEFT),
            )

    def task(self, task_id: str, *, lock: bool = False) -> TaskRecord | None:
        ahead = self._take(("task", task_id))  # read locked
        if ahead is not _ABSENT:
            record: TaskRecord | None = ahead
            return record
        if lock and self._write:
            self._locked_tasks.add(task_id)
            row = self._named_one(
                f"{_TASK_SELECT} WHERE id = %s AND {_WAITS} FOR UPDATE", (task_id, _LEFT)
            )
        else:
            row = self._named_one(f"{_TASK_SELECT} WHERE id = %s", (task_id,))
        return None if row is None else task_from_row(row)

    def tasks(self) -> list[TaskRecord]:
        if self._write:
            # Every row: each one's wait is given what was left as the rows were read.
            rows = self._named_all(
                f"{_TASK_SELECT} WHERE {_WAITS} ORDER BY seq FOR UPDATE", (_LEFT,)
            )
        else:
            rows = self._named_all(f"{_TASK_SELECT} ORDER BY seq")
        return [task_from_row(row) for row in rows]

    def task_page(
        self, after: str | None, limit: int, status: TaskStatus | None
    ) -> list[TaskRecord]:
        clauses: list[str] = []
        params: list[Any] = []
        if after is not None:  # an unknown id matches nothing; the caller checked it
            clauses.append("seq > (SELECT seq FROM tasks WHERE id = %s)")
            params.append(after)
        if status is not None:
            clauses.append("status = %s")
            params.append(str(status))
        where = " WHERE " + " AND ".join(clauses) if clauses else ""
        rows = self._named_all(f"{_TASK_SELECT}{where} ORDER BY seq LIMIT %s", (*params, limit))
        return [task_from_row(row) for row in rows]

    def runs(self, task_id: str) -> list[Run]:
        rows = self._named_all(f"{_RUN_SELECT} WHERE task_id = %s ORDER BY seq", (task_id,))
        return [run_from_row(row) for row in rows]

    def runs_of(self, task_ids: list[str]) -> list[Run]:
        rows = self._named_all(f"{_RUN_SELECT} WHERE task_id = ANY(%s) ORDER BY seq", (task_ids,))
        return [run_from_row(row) for row in rows]

    def announced_runs(self, task_ids: list[str]) -> list[Run]:
        rows = self._named_all(
            f"{_RUN_SELECT} WHERE task_id IN (SELECT l.task_id FROM runs l WHERE l.task_id = "
            "ANY(%s) AND (l.resumed_session IS NOT NULL OR l.fell_back IS NOT NULL) AND l.seq = "
            "(SELECT max(m.seq) FROM runs m WHERE m.task_id = l.task_id)) ORDER BY seq",
            (task_ids,),
        )
        return [run_from_row(row) for row in rows]

    def all_runs(self) -> list[Run]:
        return [run_from_row(row) for row in self._named_all(f"{_RUN_SELECT} ORDER BY seq")]

    def history_rows(self) -> Iterator[tuple[Any, ...]]:
        # `HISTORY_ROW`'s columns, in its order: every one a column of tasks or runs.
        sql = (
            "SELECT t.id AS task_id, t.status AS task_status, "
            + ", ".join(f"t.{column}" for column in SUMMARY_COLUMNS)
            + ", r.id AS run_id, r.attempt, r.status, r.failure_class, r.reason, r.forced, "
            "r.started_at, r.ended_at, r.not_before, r.lease_expires_at, r.stopped, "
            "r.lane_held FROM tasks t LEFT JOIN runs r ON r.task_id = t.id ORDER BY t.seq, r.seq"
        )
        if self._batch():  # a write transaction's pipeline has no server-side cursor
            yield from self._all(sql)
            return
        # A server-side cursor: the rows come a batch at a time (FETCH), so memory does not
        # grow with the ledger; closed when the iteration ends or is dropped.
        with self._conn.cursor(name="execkit_history_rows") as cursor:
            cursor.itersize = 2000
            cursor.execute(sql)
            yield from cursor

    def run(self, run_id: str) -> Run | None:
        ahead = self._take(("run", run_id))
        if ahead is not _ABSENT:
            found: Run | None = ahead
            return found
        self._lock_task_of(run_id)
        row = self._named_one(f"{_RUN_SELECT} WHERE id = %s", (run_id,))
        if row is None:
            return None
        run = run_from_row(row)
        if self._write and run.status is AttemptStatus.RUNNING:
            self._held_runs.add(run.id)  # its task is locked: nothing else can finish it
        return run

    def run_at(self, task_id: str, attempt: int) -> Run | None:
        ahead = self._take(("run_at", task_id, attempt))
        if ahead is not _ABSENT:
            found: Run | None = ahead
            return found
        row = self._named_one(
            f"{_RUN_SELECT} WHERE task_id = %s AND attempt = %s", (task_id, attempt)
        )
        return None if row is None else run_from_row(row)

    def running_runs(self) -> list[Run]:
        rows = self._named_all(f"{_RUN_SELECT} WHERE status = 'running' ORDER BY seq")
        return [run_from_row(row) for row in rows]

    def expired_runs(self, now: float) -> list[Run]:
        expired = "status = 'running' AND lease_expires_at <= %s"
        if not self._write:
            rows = self._named_all(f"{_RUN_SELECT} WHERE {expired} ORDER BY seq", (now,))
            return [run_from_row(row) for row in rows]
        locked = [
            row[0]
            for row in self._all(
                f"SELECT id FROM tasks WHERE id IN (SELECT task_id FROM runs WHERE {expired}) "
                f"AND {_WAITS} ORDER BY seq FOR UPDATE",
                (now, _LEFT),
            )
        ]
        if not locked:
            return []
        # Read again now that the tasks are locked: a run finished meanwhile is not expired.
        rows = self._named_all(
            f"{_RUN_SELECT} WHERE {expired} AND task_id = ANY(%s) ORDER BY seq", (now, locked)
        )
        return [run_from_row(row) for row in rows]

    def insert_task(
        self, title: str, actor: str, at: float, max_uncharged_attempts: int | None
    ) -> str:
        self._written()
        row = self._one(
            "WITH n AS (SELECT nextval('task_numbers') AS seq) "
            "INSERT INTO tasks (seq, id, title, status, created_by, created_at, updated_at, "
            "max_uncharged_attempts) "
            "SELECT n.seq, 't-' || n.seq, %s, 'open', %s, %s, %s, %s FROM n RETURNING id",
            (nul_free(title), nul_free(actor), at, at, max_uncharged_attempts),
        )
        assert row is not None
        return str(row[0])

    def set_task_status(self, task_id: str, status: TaskStatus, at: float) -> None:
        self._queue(
            "tasks",
            "UPDATE tasks SET status = %s, updated_at = %s WHERE id = %s",
            (str(status), at, task_id),
        )

    def set_retry(self, task_id: str, requested_by: str | None, at: float | None) -> None:
        self._queue(
            "tasks",
            "UPDATE tasks SET retry_requested_by = %s, retry_requested_at = %s WHERE id = %s",
            (nul_free(requested_by), at, task_id),
        )

    def set_gave_up(self, task_id: str, attempts: int | None) -> None:
        self._queue(
            "tasks", "UPDATE tasks SET gave_up_at_attempt = %s WHERE id = %s", (attempts, task_id)
        )

    def upsert_limit(self, task_id: str, max_attempts: int, actor: str, at: float) -> None:
        self._queue(
            "tasks",
            "UPDATE tasks SET max_attempts = %s, limit_updated_by = %s, limit_updated_at = %s "
            "WHERE id = %s",
            (max_attempts, nul_free(actor), at, task_id),
        )

    def write_summary(self, task_id: str, summary: HistorySummary) -> None:
        values = [
            nul_free(value) if type(value) is str else value for value in summary_values(summary)
        ]
        self._queue("tasks", _SUMMARY_UPDATE, (*values, task_id))

    def insert_run(
        self, run: Run, lease_s: float, reserved: tuple[float, int] | None = None
    ) -> Run:
        # The limit in force is read from the task row this transaction has locked, in the
        # INSERT itself, so the CHECK holds the attempt to the limit the task has now.
        values = (
            run.attempt,
            str(run.status),
            nul_free(run.request_key),
            nul_free(run.actor),
            run.forced,
            nul_free(run.owner_host),
            run.owner_pid,
            run.started_at,
            run.lease_expires_at,
            lease_s,
            nul_free(run.owner_boot_id),
            run.owner_pid_namespace,
            run.owner_pid_started_at,
            nul_free(run.owner_instance),
            None if run.workspace is None else nul_free(run.workspace),
            None if run.resumed_session is None else nul_free(run.resumed_session),
            None if run.fell_back is None else nul_free(run.fell_back),
            *((0.0, 0) if reserved is None else reserved),
            run.task_id,
        )
        number, self._run_number = self._run_number, None
        if number is not None and run.task_id in self._locked_tasks:
            # Its number was drawn ahead and its task is locked: nothing to wait for. (A
            # task that vanished would make the limit NULL, which the table refuses.)
            self._queue(
                "runs",
                "INSERT INTO runs (seq, id, task_id, attempt, limit_at_admission, status, "
                "request_key, actor, forced, owner_host, owner_pid, started_at, "
                "lease_expires_at, lease_s, owner_boot_id, owner_pid_namespace, "
                "owner_pid_started_at, owner_instance, workspace, resumed_session, fell_back, "
                "reserved_usd, reserved_tokens) "
                "SELECT %s, %s, %s, %s, (SELECT max_attempts FROM tasks WHERE id = %s), "
                "%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s",
                (number, f"r-{number}", run.task_id, run.attempt, run.task_id, *values[1:-1]),
                reads=frozenset({"tasks"}),
            )
            stored = attrs.evolve(run, id=f"r-{number}")
            if _after_admission_insert is not None:
                self.send_writes()
                self._on_wire().sync()  # the seam holds the transaction after the INSERT ran
                _after_admission_insert()
            return stored
        self._written()
        row = self._one(
            "WITH n AS (SELECT nextval('run_numbers') AS seq) "
            "INSERT INTO runs (seq, id, task_id, attempt, limit_at_admission, status, "
            "request_key, actor, forced, owner_host, owner_pid, started_at, "
            "lease_expires_at, lease_s, owner_boot_id, owner_pid_namespace, "
            "owner_pid_started_at, owner_instance, workspace, resumed_session, fell_back, "
            "reserved_usd, reserved_tokens) "
            "SELECT n.seq, 'r-' || n.seq, t.id, %s, t.max_attempts, %s, %s, %s, %s, %s, %s, "
            "%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s FROM n, tasks t WHERE t.id = %s "
            "RETURNING id",
            values,
        )
        if row is None:
            raise StorageError(f"task {run.task_id} vanished during its admission")
        stored = attrs.evolve(run, id=str(row[0]))
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
        costs: tuple[Any, ...] = ()
        if usage is not None:
            costs = (
                usage.input_tokens,
                usage.output_tokens,
                usage.cache_read_tokens,
                usage.cache_write_tokens,
                usage.usd,
                str(usage.usd_source),
                nul_free(usage.model),
            )
        sql = (
            "UPDATE runs SET status = %s, failure_class = %s, reason = %s, ended_at = %s, "
            "not_before = COALESCE(%s, not_before), stopped = %s, lane_held = %s, "
            "session_id = %s"
            + (_COST_SET if costs else "")
            + " WHERE id = %s AND status = 'running'"
        )
        params = (
            str(status),
            None if failure_class is None else str(failure_class),
            nul_free(reason),
            at,
            not_before,
            stopped,
            lane_held,
            None if session_id is None else nul_free(session_id),
            *costs,
            run_id,
        )
        if run_id in self._held_runs:
            # Read running under its task's lock in this transaction: it still is.
            self._held_runs.discard(run_id)
            self._queue("runs", sql, params)
            return True
        return bool(self._count(sql + " RETURNING 1", params))

    def renew_lease(self, run_id: str, expires_at: float, lease_s: float | None) -> bool:
        changed = self._count(
            "UPDATE runs SET lease_expires_at = %s, lease_s = COALESCE(%s, lease_s) WHERE id = %s "
            "RETURNING 1",
            (expires_at, lease_s, run_id),
        )
        return bool(changed)

    def lease_of(self, run_id: str) -> float:
        row = self._one("SELECT lease_s FROM runs WHERE id = %s", (run_id,))
        return float(row[0]) if row is not None and row[0] is not None else DEFAULT_LEASE_S

    def audit(self, entry: AuditEntry) -> None:
        self._queue(
            "audit",
            "INSERT INTO audit (at, actor, action, task_id, run_id, detail) "
            "VALUES (%s, %s, %s, %s, %s, %s::jsonb)",
            (
                entry.at,
                nul_free(entry.actor),
                str(entry.action),
                entry.task_id,
                entry.run_id,
                jsonb(entry.detail),
            ),
        )

    def audit_events(self, task_id: str | None) -> list[AuditEvent]:
        sql = "SELECT seq AS id, at, actor, action, task_id, run_id, detail FROM audit"
        params: tuple[str, ...] = ()
        if task_id is not None:
            sql += " WHERE task_id = %s"
            params = (task_id,)
        rows = self._named_all(sql + " ORDER BY seq", params)
        return [audit_event_from_row(row, dict(row["detail"])) for row in rows]

    def idempotent(self, scope: str, key: str) -> tuple[str, dict[str, Any]] | None:
        ahead = self._take(("idempotent", scope, key))  # read under the key's lock
        if ahead is not _ABSENT:
            found: tuple[str, dict[str, Any]] | None = ahead
            return found
        if self._write:
            # Two first uses of one key queue here; the second reads the first one's answer.
            self._send(_KEY_LOCK, (_LEFT, f"{scope}\x1f{key}"))
        row = self._one(
            "SELECT fingerprint, response FROM idempotency WHERE scope = %s AND key = %s",
            (scope, nul_free(key)),
        )
        if row is None:
            return None
        return str(row[0]), dict(row[1])

    def remember(
        self, scope: str, key: str, fingerprint: str, response: dict[str, Any], at: float
    ) -> None:
        self._queue(
            "idempotency",
            "INSERT INTO idempotency (scope, key, fingerprint, response, created_at) "
            "VALUES (%s, %s, %s, %s::jsonb, %s)",
            (scope, nul_free(key), fingerprint, jsonb(response), at),
        )

    def grants(self, principal: str | None) -> list[Grant]:
        sql = "SELECT principal, role, granted_by, granted_at FROM role_grants"
        params: tuple[str, ...] = ()
        if principal is not None:
            sql += " WHERE principal = %s"
            params = (principal,)
        rows = self._named_all(sql + " ORDER BY principal, role", params)
        return [grant_from_row(row) for row in rows]

    def put_grant(self, grant: Grant) -> bool:
        changed = self._count(
            "INSERT INTO role_grants (principal, role, granted_by, granted_at) "
            "VALUES (%s, %s, %s, %s) ON CONFLICT (principal, role) DO NOTHING RETURNING 1",
            (nul_free(grant.principal), grant.role, nul_free(grant.granted_by), grant.granted_at),
        )
        return bool(changed)

    def delete_grant(self, principal: str, role: str) -> bool:
        changed = self._count(
            "DELETE FROM role_grants WHERE principal = %s AND role = %s RETURNING 1",
            (principal, role),
        )
        return bool(changed)

    def meta(self, key: str) -> str | None:
        ahead = self._take(("meta", key))
        if ahead is not _ABSENT:
            value: str | None = ahead
            return value
        row = self._one("SELECT value FROM ledger_meta WHERE key = %s", (key,))
        return None if row is None else str(row[0])

    def set_meta(self, key: str, value: str) -> None:
        self._ahead.pop(("meta", key), None)
        self._queue(
            "ledger_meta",
            "INSERT INTO ledger_meta (key, value) VALUES (%s, %s) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (key, nul_free(value)),
        )

    # -- vendor lanes (issue #28) --------------------------------------------------------
    # A lane's row is locked after the task rows of the transaction (admission and a
    # run's result lock their task first; an operator's resume locks the task it retries
    # before the lane), so the lock order stays tasks, then lanes, and cannot deadlock.

    def lane(self, name: str, *, lock: bool = False, create: bool = False) -> LaneSummary | None:
        ahead = self._take(("locked_lane", name))  # read locked: nobody else changed it
        if ahead is not _ABSENT:
            locked: LaneSummary = ahead
            return locked
        if create and self._write:
            # Two first results on one lane: the second INSERT waits on the first one's
            # key, then does nothing, and the SELECT below reads (and locks) its row.
            # (A wait too: what is left of it is given in a statement of its own first.)
            self._send(f"SELECT {_WAIT}", (_LEFT,))
            self._send(_LANE_CREATE, _clean(lane_row(open_lane(name))))
        if (lock or create) and self._write:
            row = self._named_one(
                f"{_LANE_SELECT} WHERE lane = %s AND {_WAITS} FOR UPDATE", (name, _LEFT)
            )
        else:
            row = self._named_one(f"{_LANE_SELECT} WHERE lane = %s", (name,))
        return None if row is None else lane_from_row(row)

    def lane_gates(self, names: tuple[str, ...], *, lock: bool) -> list[LaneGate]:
        ahead = self._take(("lane_gates", names))  # read locked
        if ahead is not _ABSENT:
            gates: list[LaneGate] = ahead
            return gates
        if lock and self._write:
            rows = self._all(_lane_gates(len(names)), (*sorted(names), _LEFT))
        else:
            rows = self._all(
                "SELECT lane, state, until_at, probe_run FROM lane_summaries "
                "WHERE lane = ANY(%s) ORDER BY lane",
                (list(names),),
            )
        return [LaneGate(*row) for row in rows]

    def lanes(self) -> list[LaneSummary]:
        return [lane_from_row(row) for row in self._named_all(f"{_LANE_SELECT} ORDER BY lane")]

    def lane_events(self, name: str | None) -> list[LaneEvent]:
        sql = f"SELECT {', '.join(LANE_EVENT_COLUMNS)} FROM lane_events"
        params: tuple[str, ...] = ()
        if name is not None:
            sql += " WHERE lane = %s"
            params = (name,)
        return [lane_event_from_row(row) for row in self._named_all(sql + " ORDER BY seq", params)]

    def notify(self, channel: str, payload: str) -> None:
        # NOTIFY is delivered at COMMIT, and dropped with a rollback: a waiter never wakes
        # for a change that was not made.
        self._send("SELECT pg_notify(%s, %s)", (channel, payload))

    def lane_stops(self, name: str) -> list[tuple[str, str]]:
        rows = self._all(LANE_STOPS, (name, name))
        return [(str(task), str(run)) for task, run in rows]

    def numbered_lane_events(self) -> list[tuple[int, LaneEvent]]:
        sql = f"SELECT seq, {', '.join(LANE_EVENT_COLUMNS)} FROM lane_events ORDER BY seq"
        return [(int(row["seq"]), lane_event_from_row(row)) for row in self._named_all(sql)]

    def lane_event_barrier(self) -> int:
        # SHARE conflicts with the ROW EXCLUSIVE lock an INSERT takes: this waits for every
        # transaction that added a lane event to end, and an INSERT after it waits for this
        # one to commit and only then draws its number, above the maximum read here. A lane
        # event's transaction reads the configuration after its INSERT (`_lane_event`), or
        # after taking the configuration's lock, shared (`_expect_result`: waited for
        # here, before the table's lock), so it folds with the configuration its number
        # says.
        self.lock_advisory(*_LANE_CONFIG_LOCK)
        self._send(f"SELECT {_WAIT}", (_LEFT,))  # for the table's lock: a statement of its own
        self._send("LOCK TABLE lane_events IN SHARE MODE")
        row = self._one("SELECT coalesce(max(seq), 0) FROM lane_events")
        assert row is not None
        return int(row[0])

    def add_lane_event(self, event: LaneEvent) -> None:
        self._queue("lane_events", _LANE_EVENT_INSERT, _clean(lane_event_row(event)))

    def write_lane(self, summary: LaneSummary) -> None:
        self._ahead.pop(("locked_lane", summary.lane), None)
        self._queue("lane_summaries", _LANE_UPSERT, _clean(lane_row(summary)))

    def set_run_lane(self, run_id: str, lane: str) -> None:
        self._ahead.pop(("run_lane", run_id), None)
        self._queue(
            "run_lanes",
            "INSERT INTO run_lanes (run_id, lane) VALUES (%s, %s)",
            (run_id, lane),
            reads=frozenset({"runs"}),  # its run, by foreign key
        )

    def run_lane(self, run_id: str) -> str | None:
        ahead = self._take(("run_lane", run_id))
        if ahead is not _ABSENT:
            lane: str | None = ahead
            return lane
        row = self._one("SELECT lane FROM run_lanes WHERE run_id = %s", (run_id,))
        return None if row is None else str(row[0])

    def task_lane(self, task_id: str) -> str | None:
        row = self._one(
            "SELECT l.lane FROM run_lanes l JOIN runs r ON r.id = l.run_id "
            "WHERE r.task_id = %s ORDER BY r.seq DESC LIMIT 1",
            (task_id,),
        )
        return None if row is None else str(row[0])

    # -- spend (issue #45) ---------------------------------------------------------------

    def task_budget(self, task_id: str) -> TaskBudget | None:
        row = self._one(
            "SELECT budget_usd, budget_tokens FROM task_budgets WHERE task_id = %s", (task_id,)
        )
        return None if row is None else TaskBudget(task_id, row[0], row[1])

    def put_task_budget(self, budget: TaskBudget, actor: str, at: float) -> None:
        self._queue(
            "task_budgets",
            "INSERT INTO task_budgets (task_id, budget_usd, budget_tokens, updated_by, "
            "updated_at) VALUES (%s, %s, %s, %s, %s) ON CONFLICT (task_id) DO UPDATE SET "
            "budget_usd = excluded.budget_usd, budget_tokens = excluded.budget_tokens, "
            "updated_by = excluded.updated_by, updated_at = excluded.updated_at",
            (budget.task_id, budget.usd, budget.tokens, nul_free(actor), at),
            reads=frozenset({"tasks"}),
        )

    def lock_spend(self) -> None:
        # Exclusive, transaction-scoped, taken after every row lock of the admission, and
        # nothing waits for a lock after it: the admissions that read the windows' sums
        # queue on it, each sum read (a statement after the lock) sees every admission
        # that committed before.
        self.lock_advisory(*_SPEND_LOCK)

    def reservation(self, run_id: str) -> tuple[float, int]:
        row = self._one("SELECT reserved_usd, reserved_tokens FROM runs WHERE id = %s", (run_id,))
        return (0.0, 0) if row is None else (float(row[0]), int(row[1]))

    def set_reservation(self, run_id: str, usd: float, tokens: int) -> None:
        self._queue(
            "runs",
            "UPDATE runs SET reserved_usd = %s, reserved_tokens = %s WHERE id = %s",
            (usd, tokens, run_id),
        )

    def window_spend(self, since: float, lane: str | None) -> tuple[float, int, float | None]:
        ((usd, tokens, earliest),) = _held_rows(
            self._all(*_windows_sql([(since, lane)], first=True)), 1
        )
        return float(usd), int(tokens), None if earliest is None else float(earliest)

    def spend_reads(
        self, lane: str | None, limit: int, windows: Sequence[tuple[float, str | None]]
    ) -> tuple[list[tuple[float | None, int]], list[tuple[float, int]]]:
        ahead = self._take(("spend_reads", lane, limit, tuple(windows)))
        if ahead is not _ABSENT:
            return ahead  # type: ignore[no-any-return]
        if not self._batch():
            if windows:
                self.lock_spend()
            return self.recent_costs(lane, limit) if limit else [], self._window_sums(windows)
        # One round trip: the lock, then every read, sent together; each read's snapshot
        # is taken when it starts, after the lock.
        if windows:
            self.lock_spend()
        recent = self._answer(*_recent_sql(lane, limit)) if limit else None
        sums = self._answer(*_windows_sql(windows)) if windows else None
        return (
            [] if recent is None else _recent_rows(recent.rows()),
            [] if sums is None else _held_sums(sums.rows(), len(windows)),
        )

    def _window_sums(self, windows: Sequence[tuple[float, str | None]]) -> list[tuple[float, int]]:
        return _held_sums(self._all(*_windows_sql(windows)), len(windows)) if windows else []

    def task_spend(self, task_id: str) -> tuple[float, int]:
        row = self._one(f"SELECT {_EFFECTIVE} FROM runs r WHERE r.task_id = %s", (task_id,))
        assert row is not None
        return float(row[0]), int(row[1])

    def task_budgets_of(self, task_ids: Sequence[str]) -> list[tuple[TaskBudget, float, int]]:
        rows = self._all(
            "SELECT b.task_id, b.budget_usd, b.budget_tokens, s.usd, s.tokens FROM task_budgets "
            f"b CROSS JOIN LATERAL (SELECT {_EFFECTIVE} FROM runs r WHERE r.task_id = "
            "b.task_id) AS s(usd, tokens) WHERE b.task_id = ANY(%s) AND (b.budget_usd IS NOT "
            "NULL OR b.budget_tokens IS NOT NULL) ORDER BY b.task_id",
            (list(task_ids),),
        )
        return [(TaskBudget(row[0], row[1], row[2]), float(row[3]), int(row[4])) for row in rows]

    def recent_costs(self, lane: str | None, limit: int) -> list[tuple[float | None, int]]:
        return _recent_rows(self._all(*_recent_sql(lane, limit)))

    def note_spend_warning(self, cap: str, window_start: float, at: float) -> bool:
        return bool(
            self._count(
                "INSERT INTO spend_warnings (cap, window_start, at) VALUES (%s, %s, %s) "
                "ON CONFLICT (cap, window_start) DO NOTHING RETURNING 1",
                (nul_free(cap), window_start, at),
            )
        )

    def task_costs(self, task_ids: list[str]) -> list[tuple[str, int, float, int, int]]:
        rows = self._all(
            "SELECT r.task_id, count(*), coalesce(sum(r.usd), 0), count(*) FILTER (WHERE "
            f"r.usd IS NULL), coalesce(sum({_TOKENS_OF}), 0) FROM runs r WHERE r.task_id = "
            "ANY(%s) GROUP BY r.task_id",
            (task_ids,),
        )
        return [(row[0], int(row[1]), float(row[2]), int(row[3]), int(row[4])) for row in rows]

    def costs_reported(self) -> bool:
        found = self._one(
            f"SELECT 1 FROM runs r WHERE r.usd IS NOT NULL OR {_TOKENS_OF} > 0 LIMIT 1"
        )
        return found is not None

    def spend_rows(self, since: float) -> list[SpendRow]:
        rows = self._all(
            "SELECT r.id, r.task_id, t.title, t.status, r.status, l.lane, r.started_at, "
            "r.input_tokens, r.output_tokens, r.cache_read_tokens, r.cache_write_tokens, "
            "r.usd, r.usd_source, r.model FROM runs r JOIN tasks t ON t.id = r.task_id "
            "LEFT JOIN run_lanes l ON l.run_id = r.id WHERE r.started_at >= %s ORDER BY r.seq",
            (since,),
        )
        return [SpendRow(*row[:7], *(int(count) for count in row[7:11]), *row[11:]) for row in rows]

    def task_lanes(self, task_ids: list[str]) -> dict[str, tuple[str, str]]:
        if not task_ids:
            return {}
        # Each task's last run with a lane, and its last run (`runs_by_task`'s order).
        lanes = {
            str(task_id): str(lane)
            for task_id, lane in self._all(
                "SELECT DISTINCT ON (r.task_id) r.task_id, l.lane FROM run_lanes l "
                "JOIN runs r ON r.id = l.run_id WHERE r.task_id = ANY(%s) "
                "ORDER BY r.task_id, r.seq DESC",
                (task_ids,),
            )
        }
        if not lanes:
            return {}
        hosts = {
            str(task_id): str(host)
            for task_id, host in self._all(
                "SELECT DISTINCT ON (task_id) task_id, owner_host FROM runs "
                "WHERE task_id = ANY(%s) ORDER BY task_id, seq DESC",
                (list(lanes),),
            )
        }
        return {task_id: (lane, hosts[task_id]) for task_id, lane in lanes.items()}

    # -- the board outbox (issue #47) ----------------------------------------------------
    # A row is read FOR UPDATE by the write that changes it; `due_outbox` skips the rows
    # another drainer holds locked (it is claiming them), so two never claim one entry.

    def outbox(self, board: str, item: str, *, lock: bool = False) -> OutboxEntry | None:
        suffix = " FOR UPDATE" if lock and self._write else ""
        row = self._named_one(
            f"{_OUTBOX_SELECT} WHERE board = %s AND item = %s{suffix}",
            (nul_free(board), nul_free(item)),
        )
        return None if row is None else outbox_from_row(row)

    def outbox_rows(self, board: str, *, pending: bool) -> list[OutboxEntry]:
        where = " AND sent_seq < seq" if pending else ""
        rows = self._named_all(
            f"{_OUTBOX_SELECT} WHERE board = %s{where} ORDER BY item", (nul_free(board),)
        )
        return [outbox_from_row(row) for row in rows]

    def due_outbox(
        self, board: str, at: float, owner: str, limit: int, max_tries: int
    ) -> list[OutboxEntry]:
        suffix = " FOR UPDATE SKIP LOCKED" if self._write else ""
        rows = self._named_all(
            f"{_OUTBOX_SELECT} WHERE board = %s AND sent_seq < seq AND tries < %s "
            "AND (next_at IS NULL OR next_at <= %s) "
            "AND (claimed_by IS NULL OR claimed_by = %s OR claimed_until <= %s) "
            f"ORDER BY updated_at, item LIMIT %s{suffix}",
            (nul_free(board), max_tries, at, nul_free(owner), at, limit),
        )
        return [outbox_from_row(row) for row in rows]

    def write_outbox(self, entry: OutboxEntry) -> None:
        row = _clean(outbox_row(entry))
        self._send(_OUTBOX_UPSERT, tuple(row[name] for name in OUTBOX_COLUMNS))

    # -- notifications (issue #49) -------------------------------------------------------
    # An endpoint's row is read FOR UPDATE by a claim and a settle: one sender at a time.

    def add_notify_event(
        self, event_id: str, kind: str, subject: str, payload: str, at: float
    ) -> None:
        self._send(
            "INSERT INTO notify_events (id, kind, subject, payload, at) "
            "VALUES (%s, %s, %s, %s, %s)",
            (event_id, kind, nul_free(subject), nul_free(payload), at),
        )

    def notify_event(self, event_id: str) -> dict[str, Any] | None:
        return self._named_one(_pg(f"{NOTIFY_EVENT_SELECT} WHERE id = ?"), (event_id,))

    def notify_max_seq(self) -> int:
        row = self._one("SELECT coalesce(max(seq), 0) FROM notify_events")
        return int(row[0]) if row is not None else 0

    def notify_events_after(self, after: int, limit: int) -> list[dict[str, Any]]:
        return self._named_all(
            _pg(f"{NOTIFY_EVENT_SELECT} WHERE seq > ? ORDER BY seq LIMIT ?"), (after, limit)
        )

    def notify_endpoint_rows(self, endpoint_id: str | None, *, lock: bool) -> list[dict[str, Any]]:
        suffix = " FOR UPDATE" if lock and self._write else ""
        if endpoint_id is None:
            return self._named_all(f"{NOTIFY_ENDPOINT_SELECT} ORDER BY id{suffix}")
        return self._named_all(
            _pg(f"{NOTIFY_ENDPOINT_SELECT} WHERE id = ?{suffix}"), (nul_free(endpoint_id),)
        )

    def put_notify_endpoint(self, row: Mapping[str, Any]) -> None:
        clean = _clean(dict(row))
        self._send(
            _pg(NOTIFY_ENDPOINT_UPSERT), tuple(clean[name] for name in NOTIFY_ENDPOINT_COLUMNS)
        )

    def delete_notify_endpoint(self, endpoint_id: str) -> bool:
        self._send("DELETE FROM notify_deliveries WHERE endpoint_id = %s", (nul_free(endpoint_id),))
        return bool(
            self._count(
                "DELETE FROM notify_endpoints WHERE id = %s RETURNING 1", (nul_free(endpoint_id),)
            )
        )

    def notify_owed(
        self, endpoint_id: str, from_seq: int, kinds: tuple[str, ...] | None, limit: int
    ) -> list[dict[str, Any]]:
        params = (endpoint_id, from_seq, *(kinds or ()), endpoint_id, limit)
        return self._named_all(_pg(notify_owed_sql(kinds, count=False)), params)

    def notify_backlog(self, endpoint_id: str, from_seq: int, kinds: tuple[str, ...] | None) -> int:
        params = (endpoint_id, from_seq, *(kinds or ()), endpoint_id)
        row = self._one(_pg(notify_owed_sql(kinds, count=True)), params)
        return int(row[0]) if row is not None else 0

    def notify_delivery(self, endpoint_id: str, event_seq: int) -> dict[str, Any] | None:
        return self._named_one(
            f"SELECT {', '.join(NOTIFY_DELIVERY_COLUMNS)} FROM notify_deliveries "
            "WHERE endpoint_id = %s AND event_seq = %s",
            (nul_free(endpoint_id), event_seq),
        )

    def put_notify_delivery(self, row: Mapping[str, Any]) -> None:
        clean = _clean(dict(row))
        self._send(
            _pg(NOTIFY_DELIVERY_UPSERT), tuple(clean[name] for name in NOTIFY_DELIVERY_COLUMNS)
        )


def _pg(sql: str) -> str:
    """A statement written with `?` placeholders (`_rows`' shared ones) in psycopg's."""
    return sql.replace("?", "%s")


def _clean(row: dict[str, Any]) -> dict[str, Any]:
    return {key: nul_free(value) if isinstance(value, str) else value for key, value in row.items()}


_OUTBOX_SELECT = f"SELECT {', '.join(OUTBOX_COLUMNS)} FROM board_outbox"
_OUTBOX_UPSERT = (
    f"INSERT INTO board_outbox ({', '.join(OUTBOX_COLUMNS)}) "
    f"VALUES ({', '.join('%s' for _ in OUTBOX_COLUMNS)}) "
    "ON CONFLICT (board, item) DO UPDATE SET "
    + ", ".join(f"{name} = excluded.{name}" for name in OUTBOX_COLUMNS[2:])
)
