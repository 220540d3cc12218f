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
import json
import os
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs

from execkit._backoff import SCHEDULER_BACKOFF, Backoff
from execkit._budget import AttemptStatus, WorkBudget
from execkit._classify import FailureClass
from execkit._errors import InvalidInput, NotFound, SchemaTooNew, StorageError
from execkit._json import to_json
from execkit.ledger._core import LedgerCore, TaskRecord
from execkit.ledger._model import CAPABILITIES, AuditEvent, Run, TaskStatus

__all__ = ["SCHEMA_VERSION", "Migration", "SqliteLedger", "SqliteStore", "migrate"]

# Version 1: the legacy store (no attempt limits). Version 2 (ADR 0033): attempt limits
# keyed by task id and the run-history index by task and creation order; additive only.
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
}
SCHEMA_VERSION = max(_SCHEMA_STEPS)

_RUN_COLUMNS = (
    "id, task_id, attempt, status, failure_class, reason, request_key, actor, forced, "
    "started_at, ended_at, owner_host, owner_pid"
)
_TASK_SELECT = (
    "SELECT t.id, t.title, t.status, t.created_by, t.created_at, "
    "COALESCE(l.max_attempts, 0) FROM tasks t "
    "LEFT JOIN task_attempt_limits l ON l.task_id = t.id"
)
_DEFAULT_BUDGET = WorkBudget()

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


def _run_from_row(row: Sequence[Any]) -> Run:
    return Run(
        id=row[0],
        task_id=row[1],
        attempt=row[2],
        status=AttemptStatus(row[3]),
        failure_class=FailureClass(row[4]) if row[4] is not None else None,
        reason=row[5],
        request_key=row[6],
        actor=row[7],
        forced=bool(row[8]),
        started_at=row[9],
        ended_at=row[10],
        owner_host=row[11],
        owner_pid=row[12],
    )


def _backup_path_for(path: Path, version: int) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S")
    candidate = path.with_name(f"{path.name}.schema-v{version}.{stamp}.bak")
    n = 1
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.schema-v{version}.{stamp}-{n}.bak")
        n += 1
    return candidate


class _SqliteTx:
    """One transaction on the store's connection (see `Tx` in `_core.py`)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn

    def task(self, task_id: str) -> TaskRecord | None:
        row = self._conn.execute(f"{_TASK_SELECT} WHERE t.id = ?", (task_id,)).fetchone()
        return None if row is None else TaskRecord(*row)

    def tasks(self) -> list[TaskRecord]:
        return [TaskRecord(*row) for row in self._conn.execute(f"{_TASK_SELECT} ORDER BY t.seq")]

    def runs(self, task_id: str) -> list[Run]:
        rows = self._conn.execute(
            f"SELECT {_RUN_COLUMNS} FROM runs WHERE task_id = ? ORDER BY seq", (task_id,)
        ).fetchall()
        return [_run_from_row(row) for row in rows]

    def all_runs(self) -> list[Run]:
        return [
            _run_from_row(row)
            for row in self._conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs ORDER BY seq")
        ]

    def run(self, run_id: str) -> Run | None:
        row = self._conn.execute(
            f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,)
        ).fetchone()
        return None if row is None else _run_from_row(row)

    def running_runs(self, host: str) -> list[tuple[Run, float | None]]:
        rows = self._conn.execute(
            f"SELECT {_RUN_COLUMNS}, owner_started_at FROM runs "
            "WHERE status = 'running' AND owner_host = ? ORDER BY seq",
            (host,),
        ).fetchall()
        return [(_run_from_row(row), row[-1]) for row in rows]

    def run_count(self, task_id: str) -> int:
        (count,) = self._conn.execute(
            "SELECT COUNT(*) FROM runs WHERE task_id = ?", (task_id,)
        ).fetchone()
        return int(count)

    def insert_task(self, title: str, actor: str, at: float) -> str:
        seq = self._conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM tasks").fetchone()[0]
        task_id = f"t-{seq}"
        self._conn.execute(
            "INSERT INTO tasks (seq, id, title, status, created_by, created_at, updated_at)"
            " VALUES (?, ?, ?, 'open', ?, ?, ?)",
            (seq, task_id, title, actor, at, at),
        )
        return task_id

    def set_task_status(self, task_id: str, status: TaskStatus, at: float) -> None:
        self._conn.execute(
            "UPDATE tasks SET status = ?, updated_at = ? WHERE id = ?", (status, at, task_id)
        )

    def upsert_limit(self, task_id: str, max_attempts: int, actor: str, at: float) -> None:
        self._conn.execute(
            "INSERT INTO task_attempt_limits (task_id, max_attempts, updated_by, updated_at)"
            " VALUES (?, ?, ?, ?) ON CONFLICT (task_id) DO UPDATE SET "
            "max_attempts = excluded.max_attempts, updated_by = excluded.updated_by, "
            "updated_at = excluded.updated_at",
            (task_id, max_attempts, actor, at),
        )

    def insert_run(self, run: Run, owner_started_at: float | None) -> Run:
        seq = self._conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM runs").fetchone()[0]
        stored = attrs.evolve(run, id=f"r-{seq}")
        self._conn.execute(
            "INSERT INTO runs (seq, id, task_id, attempt, status, request_key, actor, "
            "forced, owner_host, owner_pid, owner_started_at, started_at) "
            "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
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
                owner_started_at,
                stored.started_at,
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
        at: float,
    ) -> bool:
        changed = self._conn.execute(
            "UPDATE runs SET status = ?, failure_class = ?, reason = ?, ended_at = ? "
            "WHERE id = ? AND status = 'running'",
            (status, failure_class, reason, at, run_id),
        ).rowcount
        return bool(changed)

    def audit(
        self,
        at: float,
        actor: str,
        action: str,
        task_id: str | None,
        run_id: str | None,
        detail: dict[str, Any],
    ) -> None:
        self._conn.execute(
            "INSERT INTO audit (at, actor, action, task_id, run_id, detail) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (at, actor, action, task_id, run_id, json.dumps(detail, sort_keys=True)),
        )

    def audit_events(self, task_id: str | None) -> list[AuditEvent]:
        sql = "SELECT seq, at, actor, action, task_id, run_id, detail FROM audit"
        params: tuple[str, ...] = ()
        if task_id is not None:
            sql += " WHERE task_id = ?"
            params = (task_id,)
        rows = self._conn.execute(sql + " ORDER BY seq", params).fetchall()
        return [
            AuditEvent(
                id=row[0],
                at=row[1],
                actor=row[2],
                action=row[3],
                task_id=row[4],
                run_id=row[5],
                detail=json.loads(row[6]),
            )
            for row in rows
        ]

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


class SqliteStore:
    """The SQLite backend: one connection, its transactions, schema and migrations.

    Opening creates the file (and its folder) unless `create=False`, migrates an older
    schema after writing a backup (`self.migration`), and refuses a newer one with
    `SchemaTooNew` without writing anything. `upgrade=False` opens without writing at all.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        upgrade: bool = True,
        busy_timeout_s: float = 30.0,
    ) -> None:
        self.path = Path(path)
        self.migration: Migration | None = None
        self._busy_timeout_s = busy_timeout_s
        if not self.path.exists():
            if not create:
                raise NotFound(f"no ledger database at {self.path}")
            self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = sqlite3.connect(self.path, timeout=busy_timeout_s, isolation_level=None)
        except sqlite3.Error as exc:
            raise InvalidInput(
                f"cannot open ledger database {self.path}: {exc}", field="path"
            ) from exc
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
                if self._conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
                    self._conn.execute("PRAGMA journal_mode = WAL")
                if found < SCHEMA_VERSION:
                    self.migration = self._upgrade(found)
        except sqlite3.OperationalError as exc:  # locked past the busy timeout, I/O, ...
            self._conn.close()
            raise StorageError(f"cannot open ledger database {self.path}: {exc}") from exc
        except sqlite3.DatabaseError as exc:  # not an SQLite file at all
            self._conn.close()
            raise InvalidInput(
                f"{self.path} is not a usable ledger database: {exc}", field="path"
            ) from exc
        except BaseException:
            self._conn.close()
            raise

    def close(self) -> None:
        self._conn.close()

    @contextlib.contextmanager
    def write(self) -> Iterator[_SqliteTx]:
        """One write transaction: BEGIN IMMEDIATE takes the write lock before any read."""
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

    def _read_version(self) -> int:
        names = {
            row[0]
            for row in self._conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
        }
        if "schema_version" not in names:
            if names:
                raise InvalidInput(
                    f"{self.path} is an SQLite file but not an execkit ledger", field="path"
                )
            return 0
        version = self._conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]
        return int(version or 0)

    def _upgrade(self, found: int) -> Migration | None:
        with self.write():
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
                self._conn.execute(
                    "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                    (version, now),
                )
        return Migration(from_version=current, to_version=SCHEMA_VERSION, backup_path=backup)

    def _backup(self, version: int) -> Path:
        """Copy the file to a new backup beside it (ADR 0033: restoring it is the way back
        to an older execkit). Called under our write lock; it reads through a second
        connection because SQLite cannot back up from a connection inside a write
        transaction, and readers are not blocked by that lock."""
        backup = _backup_path_for(self.path, version)
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
        problems: list[str] = []
        with self.read():
            for (message,) in self._conn.execute("PRAGMA quick_check"):
                if message != "ok":
                    problems.append(f"storage: {message}")
            for row in self._conn.execute("PRAGMA foreign_key_check"):
                problems.append(f"storage: row {row[1]} of {row[0]} references a missing {row[2]}")
        return problems

    def info(self) -> dict[str, Any]:
        """Facts for `execkit db status` (JSON-safe)."""
        with self.read():
            (tasks,) = self._conn.execute("SELECT COUNT(*) FROM tasks").fetchone()
            (runs,) = self._conn.execute("SELECT COUNT(*) FROM runs").fetchone()
            (running,) = self._conn.execute(
                "SELECT COUNT(*) FROM runs WHERE status = 'running'"
            ).fetchone()
            (mode,) = self._conn.execute("PRAGMA journal_mode").fetchone()
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
    """The embedded ledger over one SQLite file (see the module docstring).

    Opening creates the file (and its folder) unless `create=False`, migrates an older
    schema after writing a backup (`self.migration` says what happened), and refuses a
    newer one with `SchemaTooNew` without writing anything. `upgrade=False` opens without
    writing at all (for inspection: `status_info`); other operations then need the
    current schema. Not thread-safe: one per thread or process.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        budget: WorkBudget = _DEFAULT_BUDGET,
        backoff: Backoff = SCHEDULER_BACKOFF,
        create: bool = True,
        upgrade: bool = True,
        busy_timeout_s: float = 30.0,
    ) -> None:
        store = SqliteStore(path, create=create, upgrade=upgrade, busy_timeout_s=busy_timeout_s)
        super().__init__(store, budget=budget, backoff=backoff)
        self._sqlite = store
        self.path = store.path
        self.migration = store.migration

    def __enter__(self) -> SqliteLedger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def status_info(self) -> dict[str, Any]:
        """Facts for `execkit db status` (JSON-safe)."""
        return self._sqlite.info()

    @property
    def _conn(self) -> sqlite3.Connection:
        """The raw connection, for tests that look under the rules at the stored rows."""
        return self._sqlite._conn


def migrate(
    path: str | os.PathLike[str],
    *,
    budget: WorkBudget = _DEFAULT_BUDGET,
    backoff: Backoff = SCHEDULER_BACKOFF,
) -> Migration:
    """Bring an existing ledger file to `SCHEMA_VERSION`, writing a backup first.

    Returns what was done; `backup_path` is None (and nothing is written) when the file is
    already current. NotFound when there is no file; SchemaTooNew when it is newer.
    """
    with SqliteLedger(path, budget=budget, backoff=backoff, create=False) as ledger:
        if ledger.migration is not None:
            return ledger.migration
        return Migration(from_version=SCHEMA_VERSION, to_version=SCHEMA_VERSION, backup_path=None)
