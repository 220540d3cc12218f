"""The PostgreSQL ledger: every SQL statement of the PostgreSQL backend lives in this module.

A peer of the SQLite backend, not a port of it: the same rules (`LedgerCore`, `_core.py`)
over storage in PostgreSQL's own terms, so that dispatchers on many hosts share one ledger.

What the database itself enforces, whatever a client does:

- `UNIQUE (task_id, attempt)` and `UNIQUE (task_id, request_key)` on runs, and at most one
  running run per task (a partial unique index);
- every run row carries the explicit limit in force when it was admitted
  (`limit_at_admission`, read from the locked task row by the INSERT itself) and
  `CHECK (limit_at_admission = 0 OR attempt <= limit_at_admission)`: no run passes the limit;
- run and task statuses, failure classes and limits inside their domains, and a finished
  run always has an end time.

How admission is serialised (ADR 0033: the count is checked in the transaction that starts
the run). Writes run at READ COMMITTED; `Tx.task(..., lock=True)` is `SELECT ... FOR
UPDATE` on the task row, which also holds the task's history summary, so two admissions
on one task queue on that row lock and the second one reads the first one's committed
summary (READ COMMITTED gives each statement a fresh snapshot) before it decides. Reading a
run inside a write transaction locks its task row first, so finishing, renewing and
abandoning a run serialise with admissions on the same task, and an idempotency key is
looked up under a transaction-scoped advisory lock on the key, so two first uses of one key
(two dispatchers creating the task for one board issue) queue, and the second one replays
the first one's answer. Row locks are always taken in task order and advisory key locks
before any row lock, so the locking cannot deadlock. Reads run at REPEATABLE READ, READ
ONLY: one snapshot per read transaction. A write transaction runs in pipeline mode: the
statements whose results nothing needs (summary, audit, keys) are sent without waiting,
and the client waits only at the next read and before COMMIT, which goes alone.

A failed transaction rolls back and consumes nothing: a connection that breaks in the
middle (the server restarted, the backend was terminated) is a `StorageError` saying the
transaction was rolled back; one that breaks while committing says the outcome is unknown,
and replaying the request key after the reconnect returns the run if it was admitted. A
broken connection is replaced at the start of the next transaction, before anything is
sent. Passwords never leave this module: `location()` and every message carry the URL
without its password.

Schema versions are this backend's own, numbered from 1 and applied in order, each step
additive and in one transaction under a PostgreSQL advisory lock, so concurrent
migrations serialise. A schema newer than this code knows is refused (`SchemaTooNew`)
before anything is written. execkit cannot copy a server's database, so an existing
ledger is migrated only when asked (`upgrade=True` on open, or `migrate(backed_up=True)`);
until then every transaction is refused with the exact `pg_dump` command to take the backup
first.

psycopg (3) is imported when a store is opened, never when this module is imported.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import threading
import time
import urllib.parse
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from execkit._backoff import SCHEDULER_BACKOFF, Backoff
from execkit._budget import AttemptStatus, HistorySummary, WorkBudget
from execkit._classify import FailureClass
from execkit._errors import InvalidInput, NotFound, SchemaTooNew, StorageError
from execkit._json import to_json
from execkit._redact import redact
from execkit.ledger._core import LedgerCore, TaskRecord
from execkit.ledger._model import (
    CAPABILITIES,
    DEFAULT_LEASE_S,
    AuditEntry,
    AuditEvent,
    Grant,
    Run,
    TaskStatus,
    user_name,
)
from execkit.ledger._rows import (
    RUN_COLUMNS,
    SUMMARY_COLUMNS,
    TASK_COLUMNS,
    audit_event_from_row,
    grant_from_row,
    run_from_row,
    summary_row,
    task_from_row,
)

if TYPE_CHECKING:
    import psycopg

__all__ = [
    "INSTALL_HINT",
    "SCHEMA_VERSION",
    "URL_SCHEMES",
    "PostgresLedger",
    "PostgresMigration",
    "PostgresStore",
    "is_postgres_url",
    "migrate_postgres",
    "public_url",
]

URL_SCHEMES = ("postgresql://", "postgres://")
INSTALL_HINT = "pip install 'execkit-runner[postgres]'"

# Version 1: tasks (with their limit, operator state and history summary in the row that
# admission locks), runs (with their lease and the limit in force at admission), audit,
# idempotency keys, role grants and the ledger's identity and owner.
_SCHEMA_STEPS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE schema_version (
            version integer PRIMARY KEY CHECK (version >= 1),
            applied_at double precision NOT NULL
        )""",
        """CREATE TABLE ledger_meta (
            key text PRIMARY KEY,
            value text NOT NULL
        )""",
        "CREATE SEQUENCE task_numbers AS bigint",
        "CREATE SEQUENCE run_numbers AS bigint",
        """CREATE TABLE tasks (
            seq bigint PRIMARY KEY,
            id text NOT NULL UNIQUE CHECK (id = 't-' || seq),
            title text NOT NULL,
            status text NOT NULL CHECK (status IN ('open', 'done', 'cancelled')),
            created_by text NOT NULL,
            created_at double precision NOT NULL,
            updated_at double precision NOT NULL,
            max_attempts integer NOT NULL DEFAULT 0
                CHECK (max_attempts BETWEEN 0 AND 10000),
            limit_updated_by text,
            limit_updated_at double precision,
            max_uncharged_attempts integer
                CHECK (max_uncharged_attempts IS NULL
                       OR max_uncharged_attempts BETWEEN 1 AND 1000),
            retry_requested_by text,
            retry_requested_at double precision,
            gave_up_at_attempt integer CHECK (gave_up_at_attempt >= 0),
            attempts_used integer NOT NULL DEFAULT 0 CHECK (attempts_used >= 0),
            charged_attempts integer NOT NULL DEFAULT 0 CHECK (charged_attempts >= 0),
            uncharged_streak integer NOT NULL DEFAULT 0 CHECK (uncharged_streak >= 0),
            streak_reason text,
            running integer CHECK (running >= 1),
            last_number integer CHECK (last_number >= 1),
            last_status text
                CHECK (last_status IN ('running', 'succeeded', 'failed', 'abandoned')),
            last_class text CHECK (last_class IN ('work', 'environment', 'upstream')),
            last_reason text,
            last_started_at double precision,
            last_ended_at double precision,
            last_forced boolean NOT NULL DEFAULT false,
            last_not_before double precision
        )""",
        """CREATE TABLE runs (
            seq bigint PRIMARY KEY,
            id text NOT NULL UNIQUE CHECK (id = 'r-' || seq),
            task_id text NOT NULL REFERENCES tasks (id),
            attempt integer NOT NULL CHECK (attempt >= 1),
            limit_at_admission integer NOT NULL
                CHECK (limit_at_admission BETWEEN 0 AND 10000),
            status text NOT NULL
                CHECK (status IN ('running', 'succeeded', 'failed', 'abandoned')),
            failure_class text CHECK (failure_class IN ('work', 'environment', 'upstream')),
            reason text,
            request_key text NOT NULL,
            actor text NOT NULL,
            forced boolean NOT NULL DEFAULT false,
            owner_host text NOT NULL,
            owner_pid integer NOT NULL,
            started_at double precision NOT NULL,
            ended_at double precision,
            lease_expires_at double precision,
            lease_s double precision CHECK (lease_s > 0),
            not_before double precision,
            CONSTRAINT runs_attempt_unique UNIQUE (task_id, attempt),
            CONSTRAINT runs_request_key_unique UNIQUE (task_id, request_key),
            CONSTRAINT runs_attempt_within_limit
                CHECK (limit_at_admission = 0 OR attempt <= limit_at_admission),
            CONSTRAINT runs_ended_when_final CHECK ((status = 'running') = (ended_at IS NULL)),
            CONSTRAINT runs_success_unclassed
                CHECK (status <> 'succeeded' OR failure_class IS NULL)
        )""",
        "CREATE UNIQUE INDEX runs_one_running_per_task ON runs (task_id) WHERE status = 'running'",
        "CREATE INDEX runs_running_by_lease ON runs (lease_expires_at) WHERE status = 'running'",
        "CREATE INDEX runs_by_task ON runs (task_id, seq)",
        """CREATE TABLE audit (
            seq bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
            at double precision NOT NULL,
            actor text NOT NULL,
            action text NOT NULL,
            task_id text,
            run_id text,
            detail jsonb NOT NULL
        )""",
        "CREATE INDEX audit_by_task ON audit (task_id, seq)",
        """CREATE TABLE idempotency (
            scope text NOT NULL,
            key text NOT NULL,
            fingerprint text NOT NULL,
            response jsonb NOT NULL,
            created_at double precision NOT NULL,
            PRIMARY KEY (scope, key)
        )""",
        """CREATE TABLE role_grants (
            principal text NOT NULL,
            role text NOT NULL,
            granted_by text NOT NULL,
            granted_at double precision NOT NULL,
            PRIMARY KEY (principal, role)
        )""",
    ),
}
SCHEMA_VERSION = max(_SCHEMA_STEPS)

# Every table a current schema has (`storage_problems` names the missing ones).
_TABLES = (
    "schema_version",
    "ledger_meta",
    "tasks",
    "runs",
    "audit",
    "idempotency",
    "role_grants",
)

# pg_advisory_xact_lock(int, int) keys: the two-int key space never meets the one-bigint
# space the idempotency keys use. 0x65786b74 is "exkt".
_MIGRATION_LOCK = (0x65786B74, 1)

# Rows are read by column name (`_rows.py`); here every column of a row shape is a column
# of one table under the same name.
_RUN_SELECT = f"SELECT {', '.join(RUN_COLUMNS)} FROM runs"
_TASK_SELECT = f"SELECT {', '.join(TASK_COLUMNS + SUMMARY_COLUMNS)} FROM tasks"
_SUMMARY_UPDATE = (
    "UPDATE tasks SET "
    + ", ".join(f"{column} = %({column})s" for column in SUMMARY_COLUMNS)
    + " WHERE id = %(task_id)s"
)
_DEFAULT_BUDGET = WorkBudget()

# Testing seam: the crash tests set this to hold the admission transaction open after the
# INSERT (before COMMIT), then kill the process or its server connection there.
_after_admission_insert: Callable[[], None] | None = None

# --- URLs -------------------------------------------------------------------------------


def is_postgres_url(target: object) -> bool:
    """Whether `target` names a PostgreSQL ledger (a `postgresql://` or `postgres://` URL)."""
    return isinstance(target, str) and target.startswith(URL_SCHEMES)


def _password(url: str) -> str | None:
    parts = urllib.parse.urlsplit(url)
    found = parts.password
    for name, value in urllib.parse.parse_qsl(parts.query, keep_blank_values=True):
        if name == "password":
            found = value
    return found or None


def public_url(url: str) -> str:
    """`url` without its password (in the user part or as a `password=` parameter)."""
    parts = urllib.parse.urlsplit(url)
    netloc = parts.netloc
    if "@" in netloc:
        userinfo, _, hostport = netloc.rpartition("@")
        user = userinfo.split(":", 1)[0]
        netloc = f"{user}@{hostport}" if user else hostport
    query = "&".join(
        piece
        for piece in parts.query.split("&")
        if piece and urllib.parse.unquote_plus(piece.split("=", 1)[0]) != "password"
    )
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, query, parts.fragment))


# --- rows ---------------------------------------------------------------------------------


@attrs.frozen
class PostgresMigration:
    """What `upgrade=True` did to the schema. `backup_command` is the `pg_dump` command
    that backs the ledger up (execkit cannot copy a server's database itself); None for a
    new ledger, which had nothing to back up."""

    from_version: int
    to_version: int
    backup_command: str | None

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


def _text(value: str | None) -> str | None:
    """PostgreSQL text cannot hold NUL: it is stored as U+FFFD (a vendor's binary output
    in a failure reason must not make the run unrecordable)."""
    return None if value is None else value.replace("\x00", "\ufffd")


def _json(value: dict[str, Any]) -> str:
    # jsonb refuses the \u0000 escape as text does NUL.
    return json.dumps(value, sort_keys=True).replace("\\u0000", "\\ufffd")


class _PostgresTx:
    """One transaction on the store's connection (see `Tx` in `_core.py`).

    In a write transaction `task(lock=True)` locks the task row (FOR UPDATE), reading a run
    locks its task row first, `tasks()` locks every task row (in task order) and an
    idempotency key is read under an advisory lock on it: see the module docstring.
    """

    def __init__(self, conn: psycopg.Connection[Any], *, write: bool) -> None:
        self._conn = conn
        self._write = write

    # A write transaction runs in pipeline mode: `_send` queues a statement whose result
    # nothing needs (its errors surface at the next read or at COMMIT, inside the
    # transaction all the same); a read waits for everything queued before it, in order.

    def _send(self, sql: str, params: Sequence[Any] | Mapping[str, Any] = ()) -> None:
        self._conn.execute(sql, params)

    def _one(self, sql: str, params: Sequence[Any] = ()) -> tuple[Any, ...] | None:
        return self._conn.execute(sql, params).fetchone()

    def _all(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        return self._conn.execute(sql, params).fetchall()

    def _named(self, sql: str, params: Sequence[Any] = ()) -> psycopg.Cursor[dict[str, Any]]:
        """`sql` run on a cursor whose rows are dicts by column name (`dict_row`)."""
        from psycopg.rows import dict_row

        return self._conn.cursor(row_factory=dict_row).execute(sql, params)

    def _named_one(self, sql: str, params: Sequence[Any] = ()) -> dict[str, Any] | None:
        return self._named(sql, params).fetchone()

    def _named_all(self, sql: str, params: Sequence[Any] = ()) -> list[dict[str, Any]]:
        return self._named(sql, params).fetchall()

    def _count(self, sql: str, params: Sequence[Any] = ()) -> int:
        """The rows a statement ending in `RETURNING 1` changed."""
        return len(self._all(sql, params))

    def _lock_task_of(self, run_id: str) -> None:
        if self._write:
            self._send(
                "SELECT 1 FROM tasks WHERE id = (SELECT task_id FROM runs WHERE id = %s) "
                "FOR UPDATE",
                (run_id,),
            )

    def task(self, task_id: str, *, lock: bool = False) -> TaskRecord | None:
        suffix = " FOR UPDATE" if lock and self._write else ""
        row = self._named_one(f"{_TASK_SELECT} WHERE id = %s{suffix}", (task_id,))
        return None if row is None else task_from_row(row)

    def tasks(self) -> list[TaskRecord]:
        suffix = " FOR UPDATE" if self._write else ""
        rows = self._named_all(f"{_TASK_SELECT} ORDER BY seq{suffix}")
        return [task_from_row(row) for row in rows]

    def runs(self, task_id: str) -> list[Run]:
        rows = self._named_all(f"{_RUN_SELECT} WHERE task_id = %s ORDER BY seq", (task_id,))
        return [run_from_row(row) for row in rows]

    def all_runs(self) -> list[Run]:
        return [run_from_row(row) for row in self._named_all(f"{_RUN_SELECT} ORDER BY seq")]

    def run(self, run_id: str) -> Run | None:
        self._lock_task_of(run_id)
        row = self._named_one(f"{_RUN_SELECT} WHERE id = %s", (run_id,))
        return None if row is None else run_from_row(row)

    def run_at(self, task_id: str, attempt: int) -> Run | None:
        row = self._named_one(
            f"{_RUN_SELECT} WHERE task_id = %s AND attempt = %s", (task_id, attempt)
        )
        return None if row is None else run_from_row(row)

    def expired_runs(self, now: float) -> list[Run]:
        expired = "status = 'running' AND lease_expires_at <= %s"
        if not self._write:
            rows = self._named_all(f"{_RUN_SELECT} WHERE {expired} ORDER BY seq", (now,))
            return [run_from_row(row) for row in rows]
        locked = [
            row[0]
            for row in self._all(
                f"SELECT id FROM tasks WHERE id IN (SELECT task_id FROM runs WHERE {expired}) "
                "ORDER BY seq FOR UPDATE",
                (now,),
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
        row = self._one(
            "WITH n AS (SELECT nextval('task_numbers') AS seq) "
            "INSERT INTO tasks (seq, id, title, status, created_by, created_at, updated_at, "
            "max_uncharged_attempts) "
            "SELECT n.seq, 't-' || n.seq, %s, 'open', %s, %s, %s, %s FROM n RETURNING id",
            (_text(title), _text(actor), at, at, max_uncharged_attempts),
        )
        assert row is not None
        return str(row[0])

    def set_task_status(self, task_id: str, status: TaskStatus, at: float) -> None:
        self._send(
            "UPDATE tasks SET status = %s, updated_at = %s WHERE id = %s",
            (str(status), at, task_id),
        )

    def set_retry(self, task_id: str, requested_by: str | None, at: float | None) -> None:
        self._send(
            "UPDATE tasks SET retry_requested_by = %s, retry_requested_at = %s WHERE id = %s",
            (_text(requested_by), at, task_id),
        )

    def set_gave_up(self, task_id: str, attempts: int | None) -> None:
        self._send("UPDATE tasks SET gave_up_at_attempt = %s WHERE id = %s", (attempts, task_id))

    def upsert_limit(self, task_id: str, max_attempts: int, actor: str, at: float) -> None:
        self._send(
            "UPDATE tasks SET max_attempts = %s, limit_updated_by = %s, limit_updated_at = %s "
            "WHERE id = %s",
            (max_attempts, _text(actor), at, task_id),
        )

    def write_summary(self, task_id: str, summary: HistorySummary) -> None:
        values = {
            column: _text(value) if isinstance(value, str) else value
            for column, value in summary_row(summary).items()
        }
        self._send(_SUMMARY_UPDATE, {**values, "task_id": task_id})

    def insert_run(self, run: Run, lease_s: float) -> Run:
        # The limit in force is read from the task row this transaction has locked, in the
        # INSERT itself, so the CHECK holds the attempt to the limit the task has now.
        row = self._one(
            "WITH n AS (SELECT nextval('run_numbers') AS seq) "
            "INSERT INTO runs (seq, id, task_id, attempt, limit_at_admission, status, "
            "request_key, actor, forced, owner_host, owner_pid, started_at, "
            "lease_expires_at, lease_s) "
            "SELECT n.seq, 'r-' || n.seq, t.id, %s, t.max_attempts, %s, %s, %s, %s, %s, %s, "
            "%s, %s, %s FROM n, tasks t WHERE t.id = %s RETURNING id",
            (
                run.attempt,
                str(run.status),
                _text(run.request_key),
                _text(run.actor),
                run.forced,
                _text(run.owner_host),
                run.owner_pid,
                run.started_at,
                run.lease_expires_at,
                lease_s,
                run.task_id,
            ),
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
    ) -> bool:
        changed = self._count(
            "UPDATE runs SET status = %s, failure_class = %s, reason = %s, ended_at = %s, "
            "not_before = COALESCE(%s, not_before) WHERE id = %s AND status = 'running' "
            "RETURNING 1",
            (
                str(status),
                None if failure_class is None else str(failure_class),
                _text(reason),
                at,
                not_before,
                run_id,
            ),
        )
        return bool(changed)

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
        self._send(
            "INSERT INTO audit (at, actor, action, task_id, run_id, detail) "
            "VALUES (%s, %s, %s, %s, %s, %s::jsonb)",
            (
                entry.at,
                _text(entry.actor),
                str(entry.action),
                entry.task_id,
                entry.run_id,
                _json(entry.detail),
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
        if self._write:
            # Two first uses of one key queue here; the second reads the first one's answer.
            self._send(
                "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (f"{scope}\x1f{key}",)
            )
        row = self._one(
            "SELECT fingerprint, response FROM idempotency WHERE scope = %s AND key = %s",
            (scope, _text(key)),
        )
        if row is None:
            return None
        return str(row[0]), dict(row[1])

    def remember(
        self, scope: str, key: str, fingerprint: str, response: dict[str, Any], at: float
    ) -> None:
        self._send(
            "INSERT INTO idempotency (scope, key, fingerprint, response, created_at) "
            "VALUES (%s, %s, %s, %s::jsonb, %s)",
            (scope, _text(key), fingerprint, _json(response), at),
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
            (_text(grant.principal), grant.role, _text(grant.granted_by), grant.granted_at),
        )
        return bool(changed)

    def delete_grant(self, principal: str, role: str) -> bool:
        changed = self._count(
            "DELETE FROM role_grants WHERE principal = %s AND role = %s RETURNING 1",
            (principal, role),
        )
        return bool(changed)

    def meta(self, key: str) -> str | None:
        row = self._one("SELECT value FROM ledger_meta WHERE key = %s", (key,))
        return None if row is None else str(row[0])


class PostgresStore:
    """The PostgreSQL backend: one connection, its transactions, schema and migrations.

    `url` is a libpq URL (`postgresql://user[:password]@host[:port]/db?...`); the ledger's
    tables live in the connection's current schema (the first of its `search_path`).
    `create=True` builds the schema in a database (or schema) that has no ledger; a
    database whose current schema holds tables of the same names but no ledger is refused.
    `upgrade=True` migrates an older schema (additive, one transaction under an advisory
    lock) and records the backup command in `self.migration`; without it an older schema
    refuses every transaction, naming the `pg_dump` command to run first. A newer schema is
    `SchemaTooNew`, nothing written. One connection, shared by the threads of one owner: each
    transaction holds the store's lock for its length.
    """

    def __init__(
        self,
        url: str,
        *,
        create: bool = True,
        upgrade: bool = False,
        connect_timeout_s: float = 10.0,
        lock_timeout_s: float = 30.0,
    ) -> None:
        if not is_postgres_url(url):
            raise InvalidInput(
                f"a PostgreSQL ledger is named by a postgresql:// URL, got {redact(str(url))!r}",
                field="url",
            )
        try:
            import psycopg  # noqa: F401  (the driver is an optional extra)
        except ImportError:
            raise StorageError(
                f"a postgresql:// ledger needs psycopg, which is not installed: {INSTALL_HINT}"
            ) from None
        self._url = url
        self._secret = _password(url)
        self._where = public_url(url)
        self._connect_timeout_s = connect_timeout_s
        self._lock_timeout_s = lock_timeout_s
        self._lock = threading.RLock()
        self._conn: psycopg.Connection[Any] | None = None
        self._outdated: int | None = None  # the older schema found, until migrated
        self._owner: str | None = None
        self._schema = ""
        self.migration: PostgresMigration | None = None
        with self._lock:
            self._open(create=create, upgrade=upgrade)

    # -- connections ----------------------------------------------------------------------

    def _clean(self, exc: BaseException) -> str:
        """An error's text for a message: one line, the password and any secret masked."""
        text = " ".join(str(exc).split()) or type(exc).__name__
        if self._secret:
            text = text.replace(self._secret, "[REDACTED]")
        return redact(text, [self._secret] if self._secret else [])

    def _error(self, what: str, exc: BaseException) -> StorageError:
        return StorageError(f"{what} (ledger {self._where}): {self._clean(exc)}")

    def _connect(self) -> psycopg.Connection[Any]:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        try:
            given = conninfo_to_dict(self._url)
        except psycopg.Error as exc:
            raise InvalidInput(
                f"not a usable PostgreSQL URL {self._where}: {self._clean(exc)}", field="url"
            ) from None
        extra: dict[str, Any] = {}
        if "connect_timeout" not in given:
            extra["connect_timeout"] = max(1, round(self._connect_timeout_s))
        if "application_name" not in given:
            extra["application_name"] = "execkit"
        # A server host that vanishes (no reset, no reply) is noticed in about a minute,
        # not after the kernel's two hours (TCP only; a Unix socket ignores these).
        for name, value in (("keepalives_idle", 30), ("keepalives_interval", 10)):
            if name not in given and "keepalives" not in given:
                extra[name] = value
        try:
            conn = psycopg.connect(self._url, autocommit=True, **extra)
        except psycopg.Error as exc:
            raise self._error("cannot connect to the PostgreSQL server", exc) from None
        try:
            conn.execute(f"SET lock_timeout = {int(self._lock_timeout_s * 1000)}")
            # A client that stops in the middle of a transaction must not hold a task's lock
            # forever: every transaction here is a few statements long.
            conn.execute("SET idle_in_transaction_session_timeout = 60000")
        except psycopg.Error as exc:
            conn.close()
            raise self._error("cannot set up the PostgreSQL session", exc) from None
        return conn

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None

    def _usable(self) -> psycopg.Connection[Any]:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            self._drop()
            conn = self._conn = self._connect()
        return conn

    def _begin(self, statement: str) -> psycopg.Connection[Any]:
        """A connection with `statement` (BEGIN ...) run on it. A connection the server
        dropped since the last transaction (a restart, a terminated backend) is replaced
        once: nothing has been sent in this transaction yet, so nothing can be doubled."""
        import psycopg

        conn = self._usable()
        try:
            conn.execute(statement)
            return conn
        except psycopg.OperationalError:
            self._drop()
        conn = self._usable()
        try:
            conn.execute(statement)
        except psycopg.Error as exc:
            self._drop()
            raise self._error("cannot start a transaction", exc) from None
        return conn

    def _rollback(self, conn: psycopg.Connection[Any]) -> None:
        import psycopg

        if conn.broken or conn.closed:
            self._drop()
            return
        try:
            conn.execute("ROLLBACK")
        except psycopg.Error:
            self._drop()

    def _failure(self, conn: psycopg.Connection[Any], exc: BaseException) -> StorageError:
        """A psycopg error inside a transaction, as the StorageError to raise."""
        import psycopg

        if isinstance(exc, psycopg.errors.LockNotAvailable):
            return self._error(
                f"ledger busy: a lock was not granted within {self._lock_timeout_s:g}s; "
                "nothing was written",
                exc,
            )
        if isinstance(exc, psycopg.OperationalError) or conn.broken:
            return self._error(
                "the connection to the PostgreSQL server failed in the middle of a "
                "transaction; it was rolled back and nothing was written",
                exc,
            )
        if isinstance(exc, psycopg.IntegrityError):
            return self._error("the database refused the write; nothing was written", exc)
        return self._error("ledger transaction failed; nothing was written", exc)

    @contextlib.contextmanager
    def _transaction(self, *, write: bool, current: bool = True) -> Iterator[_PostgresTx]:
        import psycopg

        with self._lock:
            if current:
                self._current()
            if not write:
                conn = self._begin("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                try:
                    yield _PostgresTx(conn, write=False)
                    conn.execute("COMMIT")
                except BaseException as exc:
                    self._rollback(conn)
                    if isinstance(exc, psycopg.Error):
                        raise self._failure(conn, exc) from None
                    raise
                return
            # BEGIN alone first: a dropped connection is replaced before anything is sent.
            conn = self._begin("BEGIN ISOLATION LEVEL READ COMMITTED")
            committing = False
            try:
                with conn.pipeline():
                    yield _PostgresTx(conn, write=True)
                # Leaving the pipeline waited for every queued write. COMMIT goes alone, so
                # a failure before it is a certain rollback, and only one during it is not.
                committing = True
                conn.execute("COMMIT")
            except BaseException as exc:
                broken = conn.broken
                self._rollback(conn)
                if not isinstance(exc, psycopg.Error):
                    raise
                if committing and broken:
                    raise self._error(
                        "the connection to the PostgreSQL server failed while committing: the "
                        "transaction may or may not have been applied (replaying its request "
                        "key returns what was done)",
                        exc,
                    ) from None
                raise self._failure(conn, exc) from None

    def write(self) -> contextlib.AbstractContextManager[_PostgresTx]:
        """One write transaction (READ COMMITTED; admissions lock their task row)."""
        return self._transaction(write=True)

    def read(self) -> contextlib.AbstractContextManager[_PostgresTx]:
        """One read transaction (REPEATABLE READ, READ ONLY): one snapshot."""
        return self._transaction(write=False)

    def close(self) -> None:
        with self._lock:
            self._drop()

    # -- schema ---------------------------------------------------------------------------

    def _open(self, *, create: bool, upgrade: bool) -> None:
        with self._transaction(write=False, current=False) as tx:
            found = self._read_version(tx)
        if found > SCHEMA_VERSION:
            self._drop()
            raise SchemaTooNew(
                f"the ledger at {self._where} has schema version {found}, newer than this "
                f"execkit knows ({SCHEMA_VERSION}); upgrade execkit, or restore the dump taken "
                "before the upgrade"
            )
        if found == 0 and not create:
            self._drop()
            raise NotFound(f"no ledger at {self._where} (schema {self._schema or '?'})")
        if found == 0 or (found < SCHEMA_VERSION and upgrade):
            self.migration = self._upgrade()
        elif found < SCHEMA_VERSION:
            self._outdated = found
        if self._outdated is None:
            with self._transaction(write=False, current=False) as tx:
                self._owner = tx.meta("owner")

    def _read_version(self, tx: _PostgresTx) -> int:
        row = tx._one("SELECT current_schema()")
        schema = row[0] if row is not None else None
        if schema is None:
            raise StorageError(
                f"the ledger at {self._where} has no schema to live in: no schema of its "
                "search_path exists"
            )
        self._schema = str(schema)
        names = {
            name
            for (name,) in tx._all(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'v')"
            )
        }
        if "schema_version" not in names:
            clash = sorted(names & set(_TABLES))
            if clash:
                raise StorageError(
                    f"schema {self._schema} of {self._where} holds tables named "
                    f"{', '.join(clash)} but no execkit ledger; give the ledger its own "
                    "database or schema"
                )
            return 0
        row = tx._one("SELECT MAX(version) FROM schema_version")
        return int(row[0] or 0) if row is not None else 0

    def backup_command(self, version: int | None = None) -> str:
        """The exact `pg_dump` command that backs this ledger up (password left out: libpq
        reads it from PGPASSWORD or ~/.pgpass)."""
        stamp = time.strftime("%Y%m%dT%H%M%S")
        shown = version if version is not None else self._outdated or SCHEMA_VERSION
        return shlex.join(
            [
                "pg_dump",
                "--format=custom",
                f"--schema={self._schema}",
                f"--file=execkit-ledger-schema-v{shown}-{stamp}.dump",
                f"--dbname={self._where}",
            ]
        )

    def _current(self) -> None:
        if self._outdated is not None:
            raise StorageError(
                f"the ledger at {self._where} has schema version {self._outdated} and this "
                f"execkit needs {SCHEMA_VERSION}. execkit cannot copy a server's database: "
                f"back it up first with `{self.backup_command(self._outdated)}`, then migrate "
                "it with `execkit db migrate --db URL --backed-up`"
            )

    def _upgrade(self) -> PostgresMigration | None:
        with self._transaction(write=True, current=False) as tx:
            tx._conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", _MIGRATION_LOCK)
            # Re-read under the lock: another process may have created or migrated the
            # ledger meanwhile, and no other migration can start until this one commits.
            current = self._read_version(tx)
            if current > SCHEMA_VERSION:
                raise SchemaTooNew(
                    f"the ledger at {self._where} was upgraded to schema {current} meanwhile"
                )
            if current == SCHEMA_VERSION:
                self._outdated = None
                return None
            command = self.backup_command(current) if current > 0 else None
            now = time.time()
            for version in range(current + 1, SCHEMA_VERSION + 1):
                for statement in _SCHEMA_STEPS[version]:
                    tx._conn.execute(statement)
                if version == 1:
                    tx._conn.execute(
                        "INSERT INTO ledger_meta (key, value) VALUES ('ledger_id', %s), "
                        "('owner', %s)",
                        (uuid.uuid4().hex, _text(user_name(os.geteuid()))),
                    )
                tx._conn.execute(
                    "INSERT INTO schema_version (version, applied_at) VALUES (%s, %s)",
                    (version, now),
                )
        self._outdated = None
        return PostgresMigration(
            from_version=current, to_version=SCHEMA_VERSION, backup_command=command
        )

    def upgrade(self) -> PostgresMigration | None:
        """What `upgrade=True` does on open, for a store opened without it: bring an older
        schema to SCHEMA_VERSION (the caller took the backup `backup_command` names).
        None when it was already current, nothing written."""
        with self._lock:
            done = self._upgrade()
            with self._transaction(write=False, current=False) as tx:
                self._owner = tx.meta("owner")  # not read while the schema was outdated
        if done is not None:
            self.migration = done
        return done

    def schema_version(self) -> int:
        with self._transaction(write=False, current=False) as tx:
            return self._read_version(tx)

    def location(self) -> str:
        return self._where

    def owner(self) -> str | None:
        """The operating-system user who created the ledger (stored at creation)."""
        return self._owner

    def storage_problems(self) -> list[str]:
        """Missing tables, then every row outside its domain, each named (the database's
        constraints keep them out; a hand edit that dropped one could let them in)."""
        problems: list[str] = []
        try:
            with self._transaction(write=False, current=False) as tx:
                present = {
                    name
                    for (name,) in tx._all(
                        "SELECT c.relname FROM pg_class c "
                        "JOIN pg_namespace n ON n.oid = c.relnamespace "
                        "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')"
                    )
                }
                for missing in sorted(set(_TABLES) - present):
                    problems.append(f"storage: table {missing} is missing")
                checks = (
                    ("runs", "status", AttemptStatus, "status of run"),
                    ("runs", "failure_class", FailureClass, "class of run"),
                    ("tasks", "status", TaskStatus, "status of task"),
                )
                for table, column, kind, what in checks:
                    if table not in present:
                        continue
                    allowed = [str(member.value) for member in kind]
                    rows = tx._all(
                        f"SELECT id, {column} FROM {table} "
                        f"WHERE {column} IS NOT NULL AND NOT ({column} = ANY(%s)) ORDER BY seq",
                        (allowed,),
                    )
                    problems += [
                        f"{row[0]}: {what} is {row[1]!r}, not one of {', '.join(allowed)}"
                        for row in rows
                    ]
        except StorageError as exc:
            problems.append(f"storage: {exc.message}")
        return problems

    def info(self) -> dict[str, Any]:
        """Facts for an operator's status view (JSON-safe); works on an older schema too."""
        with self._transaction(write=False, current=False) as tx:
            version = self._read_version(tx)
            counts = tx._one(
                "SELECT (SELECT COUNT(*) FROM tasks), (SELECT COUNT(*) FROM runs), "
                "(SELECT COUNT(*) FROM runs WHERE status = 'running')"
            )
            server = tx._one("SHOW server_version")
        assert counts is not None and server is not None
        return {
            "url": self._where,
            "schema": self._schema,
            "schema_version": version,
            "supported_schema_version": SCHEMA_VERSION,
            "needs_migration": version < SCHEMA_VERSION,
            "server_version": str(server[0]),
            "tasks": int(counts[0]),
            "runs": int(counts[1]),
            "running_runs": int(counts[2]),
            "capabilities": sorted(CAPABILITIES),
        }


class PostgresLedger(LedgerCore):
    """The shared ledger over one PostgreSQL database (see the module docstring and
    `PostgresStore` for what opening creates, migrates or refuses). One per thread or
    process, as `SqliteLedger`; its lease renewals may come from a second thread."""

    def __init__(
        self,
        url: str,
        *,
        budget: WorkBudget = _DEFAULT_BUDGET,
        backoff: Backoff = SCHEDULER_BACKOFF,
        create: bool = True,
        upgrade: bool = False,
        connect_timeout_s: float = 10.0,
        lock_timeout_s: float = 30.0,
    ) -> None:
        store = PostgresStore(
            url,
            create=create,
            upgrade=upgrade,
            connect_timeout_s=connect_timeout_s,
            lock_timeout_s=lock_timeout_s,
        )
        super().__init__(store, budget=budget, backoff=backoff)
        self._postgres = store
        self.url = store.location()
        self.migration = store.migration

    def __enter__(self) -> PostgresLedger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def status_info(self) -> dict[str, Any]:
        """Facts for an operator's status view (JSON-safe); works on an older schema too."""
        return self._postgres.info()

    def where(self) -> tuple[str, str]:
        """Where this ledger is, as a labelled value for an operator: `("url", URL)`, its
        password left out (as `location()`)."""
        return "url", self.url

    def migrate(self, *, backed_up: bool = False) -> PostgresMigration:
        """Bring an older schema to SCHEMA_VERSION once the operator says (`backed_up`)
        they took the dump `backup_command()` names: execkit cannot copy a server's
        database, so without it an outdated ledger is refused with InvalidInput naming the
        exact `pg_dump` command, nothing written. Returns what was done, with
        `backup_command` None when it was already current (nothing written).
        """
        found = self._postgres.schema_version()
        if found < SCHEMA_VERSION and not backed_up:
            raise InvalidInput(
                f"the ledger at {self.url} has schema version {found} and this execkit needs "
                f"{SCHEMA_VERSION}. execkit cannot copy a server's database: back it up with "
                f"`{self.backup_command(found)}`, then run `execkit db migrate --backed-up` "
                "(from Python: `migrate(..., backed_up=True)`)",
                field="backed_up",
            )
        done = self._postgres.upgrade()
        if done is not None:
            self.migration = done
            return done
        return PostgresMigration(
            from_version=SCHEMA_VERSION, to_version=SCHEMA_VERSION, backup_command=None
        )

    def backup_command(self, version: int | None = None) -> str:
        """The `pg_dump` command that backs this ledger up before a migration (execkit
        cannot copy a server's database itself; the password is left to libpq)."""
        return self._postgres.backup_command(version)


def migrate_postgres(url: str) -> PostgresMigration:
    """Bring an existing PostgreSQL ledger to SCHEMA_VERSION, the caller having taken the
    backup its `backup_command()` names: `execkit.ledger.migrate(url, backed_up=True)`, kept
    under the name docs/architecture.md gives it. NotFound when there is no ledger;
    SchemaTooNew when it is newer."""
    with PostgresLedger(url, create=False, upgrade=False) as ledger:
        return ledger.migrate(backed_up=True)
