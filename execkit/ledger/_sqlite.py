"""The embedded SQLite ledger: every SQL statement of the SQLite backend lives in this module.

One connection per `SqliteLedger`; each process opens its own. The database runs in WAL
mode with a busy timeout, and every write is one `BEGIN IMMEDIATE` transaction, so two
processes admitting runs on one task serialise on the write lock and the second one sees
the first one's run when it counts (ADR 0033: the count is checked in the transaction
that starts the run; a failed transaction consumes no attempt). The rules themselves are
`LedgerCore`'s (`_core.py`); this module is storage only.

Schema versions are numbered and applied in order; a fresh database is built by the same
migration steps an old one goes through. Opening a database whose schema is newer than
this code knows raises `SchemaTooNew` before anything is written to it.
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import sqlite3
import stat
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs

from execkit._backoff import SCHEDULER_BACKOFF, Backoff
from execkit._budget import AttemptStatus, HistorySummary, WorkBudget, summarize
from execkit._classify import FailureClass
from execkit._errors import InvalidInput, NotFound, SchemaTooNew, StorageError
from execkit._json import to_json
from execkit.ledger._core import LedgerCore, TaskRecord, attempt_from_run
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
    SUMMARY_COLUMNS,
    audit_event_from_row,
    grant_from_row,
    run_from_row,
    summary_row,
    task_from_row,
)

__all__ = ["SCHEMA_VERSION", "Migration", "SqliteLedger", "SqliteStore"]

# Version 1: the legacy store (no attempt limits). Version 2 (ADR 0033): attempt limits
# keyed by task id and the run-history index by task and creation order. Version 3: run
# leases and reset times, per-task uncharged ceilings and pending operator retries, the
# per-task summary that admission reads instead of the whole history, role grants and
# the ledger's identity. Every step is additive.
_SCHEMA_STEPS: dict[int, tuple[str, ...]] = {
    1: (
        """CREATE TABLE schema_version (
            version INTEGER PRIMARY KEY,
            applied_at REAL NOT NULL
        )""",
        """CREATE TABLE tasks (
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            title TEXT NOT NULL,
            status TEXT NOT NULL CHECK (status IN ('open', 'done', 'cancelled')),
            created_by TEXT NOT NULL,
            created_at REAL NOT NULL,
            updated_at REAL NOT NULL
        )""",
        """CREATE TABLE runs (
            seq INTEGER PRIMARY KEY,
            id TEXT NOT NULL UNIQUE,
            task_id TEXT NOT NULL REFERENCES tasks (id),
            attempt INTEGER NOT NULL CHECK (attempt >= 1),
            status TEXT NOT NULL
                CHECK (status IN ('running', 'succeeded', 'failed', 'abandoned')),
            failure_class TEXT
                CHECK (failure_class IS NULL
                       OR failure_class IN ('work', 'environment', 'upstream')),
            reason TEXT,
            request_key TEXT NOT NULL,
            actor TEXT NOT NULL,
            forced INTEGER NOT NULL DEFAULT 0 CHECK (forced IN (0, 1)),
            owner_host TEXT NOT NULL,
            owner_pid INTEGER NOT NULL,
            owner_started_at REAL,
            started_at REAL NOT NULL,
            ended_at REAL,
            UNIQUE (task_id, attempt)
        )""",
        """CREATE TABLE audit (
            seq INTEGER PRIMARY KEY,
            at REAL NOT NULL,
            actor TEXT NOT NULL,
            action TEXT NOT NULL,
            task_id TEXT,
            run_id TEXT,
            detail TEXT NOT NULL
        )""",
        """CREATE TABLE idempotency (
            scope TEXT NOT NULL,
            key TEXT NOT NULL,
            fingerprint TEXT NOT NULL,
            response TEXT NOT NULL,
            created_at REAL NOT NULL,
            PRIMARY KEY (scope, key)
        )""",
    ),
    2: (
        """CREATE TABLE task_attempt_limits (
            task_id TEXT PRIMARY KEY REFERENCES tasks (id),
            max_attempts INTEGER NOT NULL CHECK (max_attempts BETWEEN 0 AND 10000),
            updated_by TEXT NOT NULL,
            updated_at REAL NOT NULL
        )""",
        "CREATE INDEX runs_by_task_creation ON runs (task_id, seq)",
    ),
    3: (
        # New facts go into new tables keyed by the old rows, so every version-2 object
        # stays defined (and every row stored) exactly as before.
        """CREATE TABLE run_extras (
            run_id TEXT PRIMARY KEY REFERENCES runs (id),
            lease_expires_at REAL,
            lease_s REAL CHECK (lease_s IS NULL OR lease_s > 0),
            not_before REAL
        )""",
        """CREATE TABLE task_extras (
            task_id TEXT PRIMARY KEY REFERENCES tasks (id),
            max_uncharged_attempts INTEGER
                CHECK (max_uncharged_attempts IS NULL
                       OR max_uncharged_attempts BETWEEN 1 AND 1000),
            retry_requested_by TEXT,
            retry_requested_at REAL,
            gave_up_at_attempt INTEGER
        )""",
        """CREATE TABLE task_summaries (
            task_id TEXT PRIMARY KEY REFERENCES tasks (id),
            attempts_used INTEGER NOT NULL CHECK (attempts_used >= 0),
            charged_attempts INTEGER NOT NULL CHECK (charged_attempts >= 0),
            uncharged_streak INTEGER NOT NULL CHECK (uncharged_streak >= 0),
            streak_reason TEXT,
            running INTEGER,
            last_number INTEGER,
            last_status TEXT
                CHECK (last_status IS NULL
                       OR last_status IN ('running', 'succeeded', 'failed', 'abandoned')),
            last_class TEXT
                CHECK (last_class IS NULL OR last_class IN ('work', 'environment', 'upstream')),
            last_reason TEXT,
            last_started_at REAL,
            last_ended_at REAL,
            last_forced INTEGER NOT NULL DEFAULT 0 CHECK (last_forced IN (0, 1)),
            last_not_before REAL
        )""",
        """CREATE TABLE ledger_meta (
            key TEXT PRIMARY KEY,
            value TEXT NOT NULL
        )""",
        """CREATE TABLE role_grants (
            principal TEXT NOT NULL,
            role TEXT NOT NULL,
            granted_by TEXT NOT NULL,
            granted_at REAL NOT NULL,
            PRIMARY KEY (principal, role)
        )""",
        "CREATE UNIQUE INDEX runs_by_task_request_key ON runs (task_id, request_key)",
        "CREATE INDEX run_extras_by_lease ON run_extras (lease_expires_at)",
    ),
}
SCHEMA_VERSION = max(_SCHEMA_STEPS)

# Rows are read by column name (`_rows.py`): each SELECT below names every column of its
# row shape, with the facts schema 3 added taken from the tables it added them in.
_RUN_SELECT = (
    "SELECT r.id, r.task_id, r.attempt, r.status, r.failure_class, r.reason, r.request_key, "
    "r.actor, r.forced, r.started_at, r.ended_at, r.owner_host, r.owner_pid, "
    "x.lease_expires_at, x.not_before "
    "FROM runs r LEFT JOIN run_extras x ON x.run_id = r.id"
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
_SUMMARY_UPSERT = (
    f"INSERT INTO task_summaries (task_id, {', '.join(SUMMARY_COLUMNS)}) "
    f"VALUES (:task_id, {', '.join(f':{column}' for column in SUMMARY_COLUMNS)}) "
    "ON CONFLICT (task_id) DO UPDATE SET "
    + ", ".join(f"{column} = excluded.{column}" for column in SUMMARY_COLUMNS)
)
_DEFAULT_BUDGET = WorkBudget()
# Owner-only: a ledger holds reasons and audit rows that are nobody else's business.
_FILE_MODE = 0o600
_DIR_MODE = 0o700

# Testing seam: the crash test sets this in a child process to hold the admission
# transaction open after the INSERT (before COMMIT) and kills the child there.
_after_admission_insert: Callable[[], None] | None = None


@attrs.frozen
class Migration:
    """What opening (or `migrate`) did to the schema; `backup_path` is None for a new file."""

    from_version: int
    to_version: int
    backup_path: Path | None

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


def _backup_path_for(path: Path, version: int) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S")
    candidate = path.with_name(f"{path.name}.schema-v{version}.{stamp}.bak")
    n = 1
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.schema-v{version}.{stamp}-{n}.bak")
        n += 1
    return candidate


class _SqliteTx:
    """One transaction on the store's connection (see `Tx` in `_core.py`).

    Every write runs under BEGIN IMMEDIATE, which holds the database's write lock for the
    whole transaction, so `lock=True` needs nothing more here.
    """

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def _named(self, sql: str, params: tuple[Any, ...] = ()) -> sqlite3.Cursor:
        """`sql` run on a cursor whose rows are read by column name (`sqlite3.Row`); the
        connection itself keeps plain tuples for everything else."""
        cursor = self._conn.cursor()
        cursor.row_factory = sqlite3.Row
        return cursor.execute(sql, params)

    def task(self, task_id: str, *, lock: bool = False) -> TaskRecord | None:
        row = self._named(f"{_TASK_SELECT} WHERE t.id = ?", (task_id,)).fetchone()
        return None if row is None else task_from_row(row)

    def tasks(self) -> list[TaskRecord]:
        rows = self._named(f"{_TASK_SELECT} ORDER BY t.seq").fetchall()
        return [task_from_row(row) for row in rows]

    def runs(self, task_id: str) -> list[Run]:
        rows = self._named(f"{_RUN_SELECT} WHERE r.task_id = ? ORDER BY r.seq", (task_id,))
        return [run_from_row(row) for row in rows.fetchall()]

    def all_runs(self) -> list[Run]:
        rows = self._named(f"{_RUN_SELECT} ORDER BY r.seq").fetchall()
        return [run_from_row(row) for row in rows]

    def run(self, run_id: str) -> Run | None:
        row = self._named(f"{_RUN_SELECT} WHERE r.id = ?", (run_id,)).fetchone()
        return None if row is None else run_from_row(row)

    def run_at(self, task_id: str, attempt: int) -> Run | None:
        row = self._named(
            f"{_RUN_SELECT} WHERE r.task_id = ? AND r.attempt = ?", (task_id, attempt)
        ).fetchone()
        return None if row is None else run_from_row(row)

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

    def insert_run(self, run: Run, lease_s: float) -> Run:
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
        self._conn.execute(
            "INSERT INTO run_extras (run_id, lease_expires_at, lease_s) VALUES (?, ?, ?)",
            (stored.id, stored.lease_expires_at, lease_s),
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
        return bool(changed)

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


def _after_schema_3(conn: sqlite3.Connection, now: float) -> None:
    """Version 3's data step: the ledger's identity, a summary for every task built from
    its history, and a fresh lease for runs a v2 ledger saw running (their owners were
    tracked by pid; from now on they must renew, or they are abandoned)."""
    conn.execute(
        "INSERT OR IGNORE INTO ledger_meta (key, value) VALUES ('ledger_id', ?)",
        (uuid.uuid4().hex,),
    )
    conn.execute(
        "INSERT INTO run_extras (run_id, lease_expires_at, lease_s) "
        "SELECT id, ?, ? FROM runs WHERE status = 'running'",
        (now + DEFAULT_LEASE_S, DEFAULT_LEASE_S),
    )
    tx = _SqliteTx(conn)
    for (task_id,) in conn.execute("SELECT id FROM tasks ORDER BY seq").fetchall():
        history = [attempt_from_run(run) for run in tx.runs(task_id)]
        try:
            summary = summarize(history)
        except Exception:  # a broken history keeps no summary; `db check` reports it
            continue
        tx.write_summary(task_id, summary)


_DATA_STEPS: dict[int, Callable[[sqlite3.Connection, float], None]] = {3: _after_schema_3}


def _create_owner_only(path: Path) -> None:
    """Make an empty file at `path` readable and writable by its owner only (and its
    folder, when execkit creates it, enterable by its owner only)."""
    parent = path.parent
    if not parent.exists():
        parent.mkdir(parents=True, exist_ok=True)
        os.chmod(parent, _DIR_MODE)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
    os.close(fd)


class SqliteStore:
    """The SQLite backend: one connection, its transactions, schema and migrations.

    `create=True` creates a ledger at a path where nothing exists (its file 0600, a new
    folder 0700); an existing file is never re-initialised, an empty one included (it may
    be a truncated ledger): only `init=True` (`execkit db init`) makes an empty file a
    ledger. `upgrade=True` migrates an older schema after writing a backup
    (`self.migration`); `upgrade=False` opens without writing anything, and then only
    inspection works until the schema is current. A newer schema is refused with
    `SchemaTooNew`, nothing written.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        upgrade: bool = True,
        init: bool = False,
        busy_timeout_s: float = 30.0,
    ) -> None:
        self.path = Path(path)
        self.migration: Migration | None = None
        self._busy_timeout_s = busy_timeout_s
        self._outdated = False
        # One connection, shared by the threads of one owner (a dispatcher renewing its
        # runs' leases while they run): each transaction holds this lock for its length.
        self._lock = threading.RLock()
        self._open_file(create=create, init=init)
        try:
            self._conn = sqlite3.connect(
                self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open ledger database {self.path}: {exc}") from exc
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            self._conn.execute("PRAGMA foreign_keys = ON")
            found = self._read_version()  # reads only: a newer schema must stay untouched
            if found > SCHEMA_VERSION:
                raise SchemaTooNew(
                    f"{self.path} has schema version {found}, newer than this execkit "
                    f"knows ({SCHEMA_VERSION}); upgrade execkit, or restore the backup "
                    "taken before the upgrade"
                )
            if upgrade:
                self.migration = self._bring_up(found)
            else:
                self._outdated = found < SCHEMA_VERSION
        except sqlite3.OperationalError as exc:  # locked past the busy timeout, I/O, ...
            self._conn.close()
            raise StorageError(f"cannot open ledger database {self.path}: {exc}") from exc
        except sqlite3.DatabaseError as exc:  # not an SQLite file at all
            self._conn.close()
            raise StorageError(f"{self.path} is not a usable ledger database: {exc}") from exc
        except BaseException:
            self._conn.close()
            raise

    def _open_file(self, *, create: bool, init: bool) -> None:
        path = self.path
        try:
            info = path.stat()
        except FileNotFoundError:
            info = None
        except NotADirectoryError:
            raise InvalidInput(
                f"{path}: a parent of the ledger path is a file, not a folder", field="path"
            ) from None
        except OSError as exc:
            raise StorageError(f"cannot reach ledger database {path}: {exc}") from exc
        if info is None:
            if not (create or init):
                raise NotFound(f"no ledger database at {path}")
            try:
                _create_owner_only(path)
            except (FileExistsError, NotADirectoryError):
                raise InvalidInput(
                    f"{path}: a parent of the ledger path is a file, not a folder", field="path"
                ) from None
            except OSError as exc:
                raise StorageError(f"cannot create ledger database {path}: {exc}") from exc
            return
        if stat.S_ISDIR(info.st_mode):
            raise InvalidInput(f"{path} is a directory, not a ledger file", field="path")
        if info.st_size == 0 and not init:
            raise StorageError(
                f"{path} is an empty file, not an execkit ledger (a truncated one?): execkit "
                f"will not silently start a new ledger over it; `execkit db init --db {path}` "
                "makes it a new, empty ledger"
            )

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def _current(self) -> None:
        if self._outdated:
            raise StorageError(
                f"{self.path} has schema version {self._read_version()} and this command "
                f"needs {SCHEMA_VERSION}: run `execkit db migrate` (it backs the file up first)"
            )

    @contextlib.contextmanager
    def write(self) -> Iterator[_SqliteTx]:
        """One write transaction: BEGIN IMMEDIATE takes the write lock before any read."""
        with self._lock:
            yield from self._write()

    def _write(self) -> Iterator[_SqliteTx]:
        self._current()
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StorageError(f"ledger {self.path} is busy or unwritable: {exc}") from exc
        try:
            yield _SqliteTx(self._conn)
        except BaseException as exc:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise StorageError(f"ledger write failed ({self.path}): {exc}") from exc
            raise
        try:
            self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise StorageError(f"ledger commit failed ({self.path}): {exc}") from exc

    @contextlib.contextmanager
    def read(self) -> Iterator[_SqliteTx]:
        """One read transaction, so several SELECTs see one snapshot."""
        with self._lock:
            yield from self._read()

    def _read(self) -> Iterator[_SqliteTx]:
        self._current()
        try:
            self._conn.execute("BEGIN")
            try:
                yield _SqliteTx(self._conn)
            finally:
                if self._conn.in_transaction:
                    self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StorageError(f"ledger read failed ({self.path}): {exc}") from exc

    def schema_version(self) -> int:
        return self._read_version()

    def location(self) -> str:
        return str(self.path.resolve())

    def owner(self) -> str | None:
        """The operating-system user who owns the ledger file."""
        try:
            uid = self.path.stat().st_uid
        except OSError:
            return None
        return user_name(uid)

    def _read_version(self) -> int:
        names = {
            row[0]
            for row in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        if "schema_version" not in names:
            if names:
                raise StorageError(f"{self.path} is an SQLite file but not an execkit ledger")
            return 0
        version = self._conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]
        return int(version or 0)

    def _upgrade(self, found: int) -> Migration | None:
        with contextlib.ExitStack() as stack:
            self._conn.execute("BEGIN IMMEDIATE")
            stack.callback(self._end_transaction)
            # Re-read under the write lock: another process may have migrated (or created
            # the file) since `found` was read, and nobody can write from here on, so the
            # backup below is exactly the state the migration starts from.
            current = self._read_version()
            if current > SCHEMA_VERSION:
                raise SchemaTooNew(f"{self.path} was upgraded to schema {current} meanwhile")
            if current == SCHEMA_VERSION:
                return None
            backup = self._backup(current) if current > 0 else None
            now = time.time()
            for version in range(current + 1, SCHEMA_VERSION + 1):
                for statement in _SCHEMA_STEPS[version]:
                    self._conn.execute(statement)
                data_step = _DATA_STEPS.get(version)
                if data_step is not None:
                    data_step(self._conn, now)
                self._conn.execute(
                    "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                    (version, now),
                )
            self._conn.execute("COMMIT")
        return Migration(from_version=current, to_version=SCHEMA_VERSION, backup_path=backup)

    def _bring_up(self, found: int) -> Migration | None:
        """WAL mode, then the schema brought from `found` to SCHEMA_VERSION (a backup
        first); None when it was already current."""
        if self._conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            self._conn.execute("PRAGMA journal_mode = WAL")
        if found < SCHEMA_VERSION:
            return self._upgrade(found)
        return None

    def upgrade(self) -> Migration | None:
        """What `upgrade=True` does on open, for a store opened without it: bring an older
        schema to SCHEMA_VERSION after writing a backup beside the file. None when it was
        already current (nothing written). SchemaTooNew when it is newer; StorageError
        when the file is busy past the timeout, with nothing migrated."""
        with self._lock:
            try:
                found = self._read_version()
                if found > SCHEMA_VERSION:
                    raise SchemaTooNew(
                        f"{self.path} has schema version {found}, newer than this execkit "
                        f"knows ({SCHEMA_VERSION})"
                    )
                done = self._bring_up(found)
            except sqlite3.Error as exc:
                raise StorageError(f"cannot migrate ledger database {self.path}: {exc}") from exc
            self._outdated = False
            if done is not None:
                self.migration = done
            return done

    def _end_transaction(self) -> None:
        if self._conn.in_transaction:
            self._conn.execute("ROLLBACK")

    def _backup(self, version: int) -> Path:
        """Copy the file to a new owner-only backup beside it (ADR 0033: restoring it is the
        way back to an older execkit). Called under our write lock; it reads through a
        second connection because SQLite cannot back up from a connection inside a write
        transaction, and readers are not blocked by that lock."""
        backup = _backup_path_for(self.path, version)
        _create_owner_only(backup)
        source = sqlite3.connect(self.path, timeout=self._busy_timeout_s)
        try:
            target = sqlite3.connect(backup)
            try:
                source.backup(target)
            finally:
                target.close()
        except BaseException:
            backup.unlink(missing_ok=True)
            raise
        finally:
            source.close()
        return backup

    def storage_problems(self) -> list[str]:
        """The file's integrity, then every row outside its domain, each named."""
        problems: list[str] = []
        try:
            for (message,) in self._conn.execute("PRAGMA quick_check"):
                if message != "ok":
                    problems.append(f"storage: {message}")
            for row in self._conn.execute("PRAGMA foreign_key_check"):
                problems.append(f"storage: row {row[1]} of {row[0]} references a missing {row[2]}")
            tables = {
                row[0]
                for row in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            }
            needed = {"tasks", "runs", "audit", "idempotency", "task_attempt_limits"}
            if self.schema_version() >= 3:
                needed |= {
                    "task_summaries",
                    "ledger_meta",
                    "role_grants",
                    "run_extras",
                    "task_extras",
                }
            for missing in sorted(needed - tables):
                problems.append(f"storage: table {missing} is missing")
            if "runs" in tables:
                problems += self._domain_problems(
                    "runs", "id", "status", AttemptStatus, "status of run"
                )
                problems += self._domain_problems(
                    "runs", "id", "failure_class", FailureClass, "class of run"
                )
            if "tasks" in tables:
                problems += self._domain_problems(
                    "tasks", "id", "status", TaskStatus, "status of task"
                )
            problems += self._shape_problems(tables)
        except sqlite3.Error as exc:
            problems.append(f"storage: {exc}")
        return problems

    def _shape_problems(self, tables: set[str]) -> list[str]:
        """Stored values of the wrong type (SQLite keeps whatever it is given)."""
        checks = {
            "runs": (
                ("attempt", "typeof(attempt) != 'integer' OR attempt < 1", "attempt"),
                ("reason", "reason IS NOT NULL AND typeof(reason) != 'text'", "reason"),
                ("started_at", "typeof(started_at) NOT IN ('real', 'integer')", "start time"),
                (
                    "ended_at",
                    "ended_at IS NOT NULL AND typeof(ended_at) NOT IN ('real', 'integer')",
                    "end time",
                ),
            ),
            "tasks": (
                ("title", "typeof(title) != 'text'", "title"),
                ("created_at", "typeof(created_at) NOT IN ('real', 'integer')", "creation time"),
            ),
        }
        problems: list[str] = []
        for table, columns in checks.items():
            if table not in tables:
                continue
            for column, bad, what in columns:
                rows = self._conn.execute(
                    f"SELECT id, {column} FROM {table} WHERE {bad}"
                ).fetchall()
                problems += [f"{row[0]}: the {what} stored is {row[1]!r}" for row in rows]
        return problems

    def _domain_problems(
        self, table: str, key: str, column: str, kind: type[enum.Enum], what: str
    ) -> list[str]:
        allowed = tuple(str(member.value) for member in kind)
        marks = ", ".join("?" * len(allowed))
        rows = self._conn.execute(
            f"SELECT {key}, {column} FROM {table} "
            f"WHERE {column} IS NOT NULL AND {column} NOT IN ({marks})",
            allowed,
        ).fetchall()
        return [f"{row[0]}: {what} is {row[1]!r}, not one of {', '.join(allowed)}" for row in rows]

    def info(self) -> dict[str, Any]:
        """Facts for `execkit db status` (JSON-safe); works on an older schema too."""
        try:
            (tasks,) = self._conn.execute("SELECT COUNT(*) FROM tasks").fetchone()
            (runs,) = self._conn.execute("SELECT COUNT(*) FROM runs").fetchone()
            (running,) = self._conn.execute(
                "SELECT COUNT(*) FROM runs WHERE status = 'running'"
            ).fetchone()
            (mode,) = self._conn.execute("PRAGMA journal_mode").fetchone()
        except sqlite3.Error as exc:
            raise StorageError(f"ledger read failed ({self.path}): {exc}") from exc
        version = self._read_version()
        return {
            "path": str(self.path),
            "schema_version": version,
            "supported_schema_version": SCHEMA_VERSION,
            "needs_migration": version < SCHEMA_VERSION,
            "journal_mode": mode,
            "tasks": tasks,
            "runs": runs,
            "running_runs": running,
            "capabilities": sorted(CAPABILITIES),
        }


class SqliteLedger(LedgerCore):
    """The embedded ledger over one SQLite file (see the module docstring and
    `SqliteStore` for what opening creates, migrates or refuses). Not thread-safe: one per
    thread or process."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        budget: WorkBudget = _DEFAULT_BUDGET,
        backoff: Backoff = SCHEDULER_BACKOFF,
        create: bool = True,
        upgrade: bool = True,
        init: bool = False,
        busy_timeout_s: float = 30.0,
    ) -> None:
        store = SqliteStore(
            path, create=create, upgrade=upgrade, init=init, busy_timeout_s=busy_timeout_s
        )
        super().__init__(store, budget=budget, backoff=backoff)
        self._sqlite = store
        self.path = store.path
        self.migration = store.migration

    def __enter__(self) -> SqliteLedger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def status_info(self) -> dict[str, Any]:
        """Facts for `execkit db status` (JSON-safe); works on an older schema too."""
        return self._sqlite.info()

    def where(self) -> tuple[str, str]:
        """Where this ledger is, as a labelled value for an operator: `("path", FILE)`, the
        file as it was named (not resolved, unlike `location()`)."""
        return "path", str(self.path)

    def migrate(self, *, backed_up: bool = False) -> Migration:
        """Bring an older schema to SCHEMA_VERSION, writing a backup beside the file first
        (a ledger opened with `upgrade=False` is then usable); returns what was done, with
        `backup_path` None (nothing written) when it was already current.

        `backed_up` is a PostgreSQL ledger's business (execkit cannot copy a server's
        database, so there the operator takes the dump): a file is backed up by execkit
        itself, whatever it says. SchemaTooNew when the file is newer than this execkit.
        """
        done = self._sqlite.upgrade()
        if done is not None:
            self.migration = done
            return done
        return Migration(from_version=SCHEMA_VERSION, to_version=SCHEMA_VERSION, backup_path=None)

    @property
    def _conn(self) -> sqlite3.Connection:
        """The raw connection, for tests that look under the rules at the stored rows."""
        return self._sqlite._conn
