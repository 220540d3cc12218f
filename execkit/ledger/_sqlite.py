"""The embedded SQLite ledger: every SQL statement of the SQLite backend lives in this module.

One connection per `SqliteLedger`; each process opens its own. The database runs in WAL
mode with a busy timeout, and every write is one `BEGIN IMMEDIATE` transaction, so two
processes admitting runs on one task serialise on the write lock and the second one sees
the first one's run when it counts (ADR 0033: the count is checked in the transaction
that starts the run; a failed transaction consumes no attempt).

Schema versions are numbered and applied in order; a fresh database is built by the same
migration steps an old one goes through. Opening a database whose schema is newer than
this code knows raises `SchemaTooNew` before anything is written to it.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import socket
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import attrs
import psutil

from execkit._backoff import SCHEDULER_BACKOFF
from execkit._budget import (
    Attempt,
    AttemptStatus,
    Backoff,
    BlockedOn,
    Decision,
    DecisionState,
    DispatchCap,
    ExplicitLimit,
    WorkBudget,
    decide,
    validate_history,
)
from execkit._classify import FailureClass
from execkit._errors import (
    AdmissionRefused,
    AttemptLimitReached,
    Conflict,
    Forbidden,
    HistoryError,
    InvalidInput,
    NotFound,
    SchemaTooNew,
    StorageError,
    TaskBlocked,
    TaskFinished,
)
from execkit._json import to_json
from execkit._redact import redact
from execkit._validate import is_integer, is_number
from execkit.ledger._model import (
    CAPABILITIES,
    MAX_ATTEMPT_LIMIT,
    OPERATE_ROLE,
    AuditEvent,
    Run,
    Task,
    TaskState,
    TaskStatus,
)

__all__ = ["SCHEMA_VERSION", "Migration", "SqliteLedger", "migrate"]

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
_FINISHED_STATUSES = (TaskStatus.DONE, TaskStatus.CANCELLED)
_FINAL_RUN_STATUSES = (AttemptStatus.SUCCEEDED, AttemptStatus.FAILED, AttemptStatus.ABANDONED)
_MAX_TITLE = 1000
_MAX_KEY = 200
_MAX_REASON = 4000
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


@attrs.frozen
class _TaskRow:
    id: str
    title: str
    status: TaskStatus = attrs.field(converter=TaskStatus)
    created_by: str
    created_at: float
    max_attempts: int


def _check_text(field: str, value: object, max_len: int) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidInput(f"{field} must be a non-empty string", field=field)
    if len(value) > max_len:
        raise InvalidInput(
            f"{field} must be at most {max_len} characters, got {len(value)}", field=field
        )
    return value


def _check_limit(field: str, value: object, *, allow_zero: bool) -> int:
    low = 0 if allow_zero else 1
    allowed = (
        f"0 (no explicit limit) or 1..{MAX_ATTEMPT_LIMIT}"
        if allow_zero
        else (f"1..{MAX_ATTEMPT_LIMIT}")
    )
    if not is_integer(value):
        raise InvalidInput(
            f"{field} must be a whole number in {allowed}, got {value!r}", field=field
        )
    if not low <= value <= MAX_ATTEMPT_LIMIT:
        raise InvalidInput(f"{field} must be {allowed}, got {value}", field=field)
    return value


def _fingerprint(request: dict[str, Any]) -> str:
    canonical = json.dumps(request, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()


def _creation_fingerprint(title: str, max_attempts: int) -> str:
    # ADR 0033: the legacy fingerprint (title only) is unchanged when there is no limit.
    if max_attempts == 0:
        return _fingerprint({"title": title})
    return _fingerprint({"title": title, "max_attempts": max_attempts})


def _clean_reason(reason: str | None) -> str | None:
    if reason is None:
        return None
    if not isinstance(reason, str):
        raise InvalidInput(
            f"reason must be a string or None, got {type(reason).__name__}", field="reason"
        )
    cleaned = redact(reason)
    if len(cleaned) > _MAX_REASON:
        # Keep the end: the last lines of a failure say the most about it.
        cleaned = "…" + cleaned[-(_MAX_REASON - 1) :]
    return cleaned


def _failure_class(value: FailureClass | str | None) -> FailureClass | None:
    if value is None or isinstance(value, FailureClass):
        return value
    try:
        return FailureClass(value)
    except ValueError:
        allowed = ", ".join(FailureClass)
        raise InvalidInput(
            f"failure_class must be one of {allowed}, got {value!r}", field="failure_class"
        ) from None


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


def _attempt_from_run(run: Run) -> Attempt:
    return Attempt(
        number=run.attempt,
        status=run.status,
        failure_class=run.failure_class,
        reason=run.reason,
        started_at=run.started_at,
        ended_at=run.ended_at,
        forced=run.forced,
    )


def _process_started_at(pid: int) -> float | None:
    if pid == os.getpid():
        return _own_start_time(pid)
    try:
        return psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


@functools.lru_cache(maxsize=1)
def _own_start_time(pid: int) -> float:
    # Keyed by pid so a forked child asks again; saves two /proc reads per admission.
    return psutil.Process(pid).create_time()


def _moment(now: float | None) -> float:
    """`now`, or the clock; a time that is not a finite number is refused before any write
    (a NaN stored as a start or end time would make the task's history unreadable)."""
    if now is None:
        return time.time()
    if not is_number(now):
        raise InvalidInput(
            f"now must be a finite number of POSIX seconds, got {now!r}", field="now"
        )
    return float(now)


def _check_roles(roles: Sequence[str]) -> tuple[str, ...]:
    # A bare string would turn the role check into a substring test ("agent.operate" is
    # "in" "not-agent.operate"), so only a collection of names is accepted.
    if not isinstance(roles, str):
        with contextlib.suppress(TypeError):
            names = tuple(roles)
            if all(isinstance(name, str) for name in names):
                return names
    raise InvalidInput(f"roles must be a list of role names, got {roles!r}", field="roles")


def _owner_alive(pid: int, started_at: float | None) -> bool:
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        # A different start time means the pid was reused by another process.
        return started_at is None or abs(proc.create_time() - started_at) < 1.0
    except psutil.NoSuchProcess:
        return False
    except psutil.AccessDenied:
        return True  # it exists; we may not look at it, so we must not abandon its run


def _refusal(task_id: str, runs: Sequence[Run], decision: Decision) -> AdmissionRefused | None:
    """Why `decision` admits no run now, as the error `start_run` raises; None to admit.

    Backoff does not refuse: waiting is the scheduler's business.
    """
    if decision.state is DecisionState.DONE:
        return TaskFinished(f"task {task_id} already succeeded")
    if decision.state is DecisionState.RUNNING:
        active = next(run for run in runs if run.status is AttemptStatus.RUNNING)
        return TaskBlocked(
            f"run {active.id} (attempt {active.attempt}) of task {task_id} is still running; "
            "finish it (or abandon it) before starting another",
        )
    if decision.state is not DecisionState.BLOCKED:
        return None
    if decision.blocked_on is BlockedOn.ATTEMPT_LIMIT:
        return AttemptLimitReached(
            f"{decision.reason} of task {task_id}; an operator can raise it (set-attempt-limit)",
        )
    return TaskBlocked(decision.reason or f"task {task_id} is blocked on {decision.blocked_on}")


def _backup_path_for(path: Path, version: int) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S")
    candidate = path.with_name(f"{path.name}.schema-v{version}.{stamp}.bak")
    n = 1
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.schema-v{version}.{stamp}-{n}.bak")
        n += 1
    return candidate


class SqliteLedger:
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
        self.path = Path(path)
        self.budget = budget
        self.backoff = backoff
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

    # -- plumbing ---------------------------------------------------------------------

    def __enter__(self) -> SqliteLedger:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the connection; the ledger object is unusable afterwards."""
        self._conn.close()

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction: BEGIN IMMEDIATE takes the write lock before any read."""
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StorageError(f"ledger {self.path} is busy or unwritable: {exc}") from exc
        try:
            yield self._conn
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
    def _read(self) -> Iterator[sqlite3.Connection]:
        """One read transaction, so several SELECTs see one snapshot."""
        try:
            self._conn.execute("BEGIN")
            try:
                yield self._conn
            finally:
                if self._conn.in_transaction:
                    self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StorageError(f"ledger read failed ({self.path}): {exc}") from exc

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
        with self._write() as conn:
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
                    conn.execute(statement)
                conn.execute(
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

    def _audit(
        self,
        conn: sqlite3.Connection,
        *,
        at: float,
        actor: str,
        action: str,
        task_id: str | None,
        run_id: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None:
        conn.execute(
            "INSERT INTO audit (at, actor, action, task_id, run_id, detail) "
            "VALUES (?, ?, ?, ?, ?, ?)",
            (at, actor, action, task_id, run_id, json.dumps(detail or {}, sort_keys=True)),
        )

    def _replayed(
        self, conn: sqlite3.Connection, scope: str, key: str | None, fingerprint: str
    ) -> dict[str, Any] | None:
        """The stored response for (scope, key); Conflict when the request differs."""
        if key is None:
            return None
        row = conn.execute(
            "SELECT fingerprint, response FROM idempotency WHERE scope = ? AND key = ?",
            (scope, key),
        ).fetchone()
        if row is None:
            return None
        if row[0] != fingerprint:
            raise Conflict(
                f"idempotency key {key!r} was already used for a different {scope} request"
            )
        response: dict[str, Any] = json.loads(row[1])
        return response

    def _remember(
        self,
        conn: sqlite3.Connection,
        scope: str,
        key: str | None,
        fingerprint: str,
        response: dict[str, Any],
        now: float,
    ) -> None:
        if key is None:
            return
        conn.execute(
            "INSERT INTO idempotency (scope, key, fingerprint, response, created_at) "
            "VALUES (?, ?, ?, ?, ?)",
            (scope, key, fingerprint, json.dumps(response, sort_keys=True), now),
        )

    def _store_limit(
        self, conn: sqlite3.Connection, task_id: str, max_attempts: int, actor: str, at: float
    ) -> None:
        """Set the task's explicit limit row, creating it on the first limit."""
        conn.execute(
            "INSERT INTO task_attempt_limits (task_id, max_attempts, updated_by, updated_at)"
            " VALUES (?, ?, ?, ?) ON CONFLICT (task_id) DO UPDATE SET "
            "max_attempts = excluded.max_attempts, updated_by = excluded.updated_by, "
            "updated_at = excluded.updated_at",
            (task_id, max_attempts, actor, at),
        )

    def _task_row(self, conn: sqlite3.Connection, task_id: str) -> _TaskRow:
        row = conn.execute(f"{_TASK_SELECT} WHERE t.id = ?", (task_id,)).fetchone()
        if row is None:
            raise NotFound(f"no task {task_id!r}")
        return _TaskRow(*row)

    def _task_runs(self, conn: sqlite3.Connection, task_id: str) -> list[Run]:
        rows = conn.execute(
            f"SELECT {_RUN_COLUMNS} FROM runs WHERE task_id = ? ORDER BY seq", (task_id,)
        ).fetchall()
        return [_run_from_row(row) for row in rows]

    def _run(self, conn: sqlite3.Connection, run_id: str) -> Run:
        row = conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs WHERE id = ?", (run_id,)).fetchone()
        if row is None:
            raise NotFound(f"no run {run_id!r}")
        return _run_from_row(row)

    def _decide(
        self,
        task: _TaskRow,
        runs: Sequence[Run],
        now: float,
        cap: DispatchCap | None,
        *,
        force: bool = False,
    ) -> Decision:
        limit = ExplicitLimit(task.max_attempts) if task.max_attempts else None
        history = [_attempt_from_run(run) for run in runs]
        return decide(history, self.budget, limit, self.backoff, now, cap, force=force)

    def _project(
        self, task: _TaskRow, runs: Sequence[Run], now: float, cap: DispatchCap | None
    ) -> Task:
        decision = self._decide(task, runs, now, cap)
        if task.status in _FINISHED_STATUSES:
            state, blocked_on, reason, next_at = TaskState(task.status), None, None, None
        else:
            state, blocked_on = TaskState(decision.state), decision.blocked_on
            reason, next_at = decision.reason, decision.next_attempt_at
        return Task(
            id=task.id,
            title=task.title,
            status=task.status,
            state=state,
            blocked_on=blocked_on,
            reason=reason,
            # ADR 0033: `ready` includes that an attempt is still available: a used-up
            # limit is the policy's `attempt_limit` bound, never `ready`.
            ready=state is TaskState.READY,
            max_attempts=task.max_attempts,
            attempts_started=len(runs),
            charged_attempts=decision.charged_attempts,
            uncharged_streak=decision.uncharged_streak,
            remaining=decision.remaining,
            next_attempt_at=next_at,
            created_by=task.created_by,
            created_at=task.created_at,
        )

    def _load_task(
        self, conn: sqlite3.Connection, task_id: str, now: float, cap: DispatchCap | None
    ) -> Task:
        task = self._task_row(conn, task_id)
        return self._project(task, self._task_runs(conn, task_id), now, cap)

    # -- the Ledger interface --------------------------------------------------------

    def capabilities(self) -> frozenset[str]:
        """What this backend enforces; includes "tasks.attempt_limits"."""
        return CAPABILITIES

    def schema_version(self) -> int:
        return self._read_version()

    def create_task(
        self,
        title: str,
        *,
        max_attempts: int = 0,
        idempotency_key: str | None = None,
        actor: str,
        now: float | None = None,
    ) -> Task:
        """Create an open task; `max_attempts` 0 = no explicit limit, else 1..10000.

        Replaying `idempotency_key` with the same request returns the same task (as it is
        now); with a different request it is a Conflict. InvalidInput changes nothing.
        """
        _check_text("title", title, _MAX_TITLE)
        _check_limit("max_attempts", max_attempts, allow_zero=True)
        _check_text("actor", actor, _MAX_KEY)
        if idempotency_key is not None:
            _check_text("idempotency_key", idempotency_key, _MAX_KEY)
        at = _moment(now)
        fingerprint = _creation_fingerprint(title, max_attempts)
        with self._write() as conn:
            replay = self._replayed(conn, "task.create", idempotency_key, fingerprint)
            if replay is not None:
                return self._load_task(conn, replay["task_id"], at, None)
            seq = conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM tasks").fetchone()[0]
            task_id = f"t-{seq}"
            conn.execute(
                "INSERT INTO tasks (seq, id, title, status, created_by, created_at, updated_at)"
                " VALUES (?, ?, ?, 'open', ?, ?, ?)",
                (seq, task_id, title, actor, at, at),
            )
            if max_attempts:
                self._store_limit(conn, task_id, max_attempts, actor, at)
            self._audit(
                conn,
                at=at,
                actor=actor,
                action="task.create",
                task_id=task_id,
                detail={"title": title, "max_attempts": max_attempts},
            )
            self._remember(
                conn, "task.create", idempotency_key, fingerprint, {"task_id": task_id}, at
            )
            return self._load_task(conn, task_id, at, None)

    def get_task(
        self, task_id: str, *, now: float | None = None, cap: DispatchCap | None = None
    ) -> Task:
        """The task with the budget projection of its history at `now`; NotFound if absent."""
        at = _moment(now)
        with self._read() as conn:
            return self._load_task(conn, task_id, at, cap)

    def list_tasks(self, *, now: float | None = None) -> list[Task]:
        """Every task in creation order."""
        at = _moment(now)
        with self._read() as conn:
            tasks = [_TaskRow(*row) for row in conn.execute(f"{_TASK_SELECT} ORDER BY t.seq")]
            runs_by_task: dict[str, list[Run]] = {task.id: [] for task in tasks}
            for row in conn.execute(f"SELECT {_RUN_COLUMNS} FROM runs ORDER BY seq"):
                run = _run_from_row(row)
                runs_by_task.setdefault(run.task_id, []).append(run)
        return [self._project(task, runs_by_task[task.id], at, None) for task in tasks]

    def runs(self, task_id: str) -> list[Run]:
        """The task's runs in creation order (attempt 1..N); NotFound if no such task."""
        with self._read() as conn:
            self._task_row(conn, task_id)
            return self._task_runs(conn, task_id)

    def run(self, run_id: str) -> Run:
        """One run by id; NotFound if absent."""
        with self._read() as conn:
            return self._run(conn, run_id)

    def history(self, task_id: str) -> list[Attempt]:
        """The task's runs as the `Attempt` history the budget policies read."""
        return [_attempt_from_run(run) for run in self.runs(task_id)]

    def start_run(
        self,
        task_id: str,
        *,
        request_key: str,
        actor: str,
        forced: bool = False,
        now: float | None = None,
        cap: DispatchCap | None = None,
        owner_pid: int | None = None,
    ) -> Run:
        """Admit one run of the task, in one transaction, or refuse with AdmissionRefused.

        Refusal codes: `finished` (task done or cancelled), `attempt_limit` (the explicit
        limit is used up), `blocked` (a run is still running, or the budget/environment/
        upstream/dispatch-cap bound holds); when several hold, the one `get_task` shows as
        `blocked_on` (the policy's order). Backoff does not refuse: waiting is the
        scheduler's business. `forced` lets an operator start past an environment stop
        (audited), never past a limit. Replaying an accepted `request_key` returns the same
        run and creates none. `owner_pid` (default: this process) names the process whose
        death makes the run abandoned (`abandon_stale_runs`).
        """
        _check_text("request_key", request_key, _MAX_KEY)
        _check_text("actor", actor, _MAX_KEY)
        if not isinstance(forced, bool):
            # Anything truthy would lift an environment stop: only a real True may.
            raise InvalidInput(f"forced must be true or false, got {forced!r}", field="forced")
        owner = os.getpid() if owner_pid is None else owner_pid
        owner_started_at = _process_started_at(owner)
        if owner_started_at is None:
            raise InvalidInput(f"owner_pid {owner} is not a running process", field="owner_pid")
        at = _moment(now)
        fingerprint = _fingerprint({"task_id": task_id})
        with self._write() as conn:
            replay = self._replayed(conn, "run.start", request_key, fingerprint)
            if replay is not None:
                return self._run(conn, replay["run_id"])
            task = self._task_row(conn, task_id)
            if task.status in _FINISHED_STATUSES:
                raise TaskFinished(f"task {task_id} is {task.status}; it admits no more runs")
            runs = self._task_runs(conn, task_id)
            # One rule set: the policy's decision, `force` lifting the environment stop and
            # nothing else, so not even a forced start passes the explicit limit.
            decision = self._decide(task, runs, at, cap, force=forced)
            refusal = _refusal(task_id, runs, decision)
            if refusal is not None:
                raise refusal
            seq = conn.execute("SELECT COALESCE(MAX(seq), 0) + 1 FROM runs").fetchone()[0]
            run = Run(
                id=f"r-{seq}",
                task_id=task_id,
                attempt=len(runs) + 1,
                status=AttemptStatus.RUNNING,
                failure_class=None,
                reason=None,
                request_key=request_key,
                actor=actor,
                forced=forced,
                started_at=at,
                ended_at=None,
                owner_host=socket.gethostname(),
                owner_pid=owner,
            )
            conn.execute(
                "INSERT INTO runs (seq, id, task_id, attempt, status, request_key, actor, "
                "forced, owner_host, owner_pid, owner_started_at, started_at) "
                "VALUES (?, ?, ?, ?, 'running', ?, ?, ?, ?, ?, ?, ?)",
                (
                    seq,
                    run.id,
                    task_id,
                    run.attempt,
                    request_key,
                    actor,
                    int(run.forced),
                    run.owner_host,
                    owner,
                    owner_started_at,
                    at,
                ),
            )
            if _after_admission_insert is not None:
                _after_admission_insert()
            self._audit(
                conn,
                at=at,
                actor=actor,
                action="run.start",
                task_id=task_id,
                run_id=run.id,
                detail={
                    "attempt": run.attempt,
                    "forced": run.forced,
                    "state_before": decision.state,
                    "request_key": request_key,
                },
            )
            self._remember(conn, "run.start", request_key, fingerprint, {"run_id": run.id}, at)
            return run

    def finish_run(
        self,
        run_id: str,
        status: AttemptStatus | str,
        *,
        failure_class: FailureClass | None = None,
        reason: str | None = None,
        now: float | None = None,
    ) -> Run:
        """Record how a running run ended: succeeded | failed | abandoned.

        A succeeded run is never classed and marks its task done. The reason is redacted
        before it is stored. Finishing a finished run again with the same values returns
        it unchanged; with different values it is a Conflict.
        """
        if status not in _FINAL_RUN_STATUSES:
            raise InvalidInput(
                f"status must be one of {', '.join(_FINAL_RUN_STATUSES)}, got {status!r}",
                field="status",
            )
        status = AttemptStatus(status)
        klass = _failure_class(failure_class)
        if status == "succeeded" and klass is not None:
            raise InvalidInput(
                "failure_class must be empty for a succeeded run", field="failure_class"
            )
        stored_reason = _clean_reason(reason)
        at = _moment(now)
        with self._write() as conn:
            run = self._run(conn, run_id)
            if run.status != "running":
                if (run.status, run.failure_class, run.reason) == (status, klass, stored_reason):
                    return run
                shown = run.failure_class.value if run.failure_class else "-"
                raise Conflict(
                    f"run {run_id} already finished as {run.status} (class {shown}); "
                    "a finished run is immutable"
                )
            conn.execute(
                "UPDATE runs SET status = ?, failure_class = ?, reason = ?, ended_at = ? "
                "WHERE id = ? AND status = 'running'",
                (status, klass.value if klass else None, stored_reason, at, run_id),
            )
            if status == "succeeded":
                conn.execute(
                    "UPDATE tasks SET status = 'done', updated_at = ? "
                    "WHERE id = ? AND status = 'open'",
                    (at, run.task_id),
                )
            self._audit(
                conn,
                at=at,
                actor=run.actor,
                action="run.finish",
                task_id=run.task_id,
                run_id=run_id,
                detail={"status": status, "failure_class": klass.value if klass else None},
            )
            return attrs.evolve(
                run, status=status, failure_class=klass, reason=stored_reason, ended_at=at
            )

    def abandon_stale_runs(self, *, now: float | None = None) -> list[Run]:
        """Mark abandoned the running runs whose owner process on this host is gone.

        Abandoned runs still count against every limit. Runs owned by other hosts are left
        alone (their liveness cannot be seen from here).
        """
        at = _moment(now)
        host = socket.gethostname()
        rows = self._conn.execute(
            "SELECT id, owner_pid, owner_started_at FROM runs "
            "WHERE status = 'running' AND owner_host = ?",
            (host,),
        ).fetchall()
        dead = [(row[0], row[1]) for row in rows if not _owner_alive(row[1], row[2])]
        if not dead:
            return []
        abandoned: list[Run] = []
        with self._write() as conn:
            for run_id, pid in dead:
                reason = f"owner process {pid} on {host} exited while the run was running"
                changed = conn.execute(
                    "UPDATE runs SET status = 'abandoned', reason = ?, ended_at = ? "
                    "WHERE id = ? AND status = 'running'",
                    (reason, at, run_id),
                ).rowcount
                if not changed:
                    continue  # finished meanwhile by someone else
                run = self._run(conn, run_id)
                self._audit(
                    conn,
                    at=at,
                    actor="execkit",
                    action="run.abandon",
                    task_id=run.task_id,
                    run_id=run_id,
                    detail={"owner_pid": pid, "owner_host": host},
                )
                abandoned.append(run)
        return abandoned

    def set_attempt_limit(
        self,
        task_id: str,
        max_attempts: int,
        *,
        expected_max_attempts: int,
        actor: str,
        roles: Sequence[str] = (),
        idempotency_key: str | None = None,
        now: float | None = None,
    ) -> Task:
        """Compare-and-set the task's explicit limit (1..10000).

        `expected_max_attempts` must equal the current limit (0 = none), else Conflict
        naming the current value. The creator may change it before the first run;
        afterwards the actor needs the role `agent.operate` (Forbidden). A done or
        cancelled task refuses (code `finished`). Limit, audit event and keyed response
        are written in one transaction. Lowering never touches a running run; raising
        makes an `attempt_limit` task ready again with its history intact.
        """
        _check_limit("max_attempts", max_attempts, allow_zero=False)
        _check_limit("expected_max_attempts", expected_max_attempts, allow_zero=True)
        _check_text("actor", actor, _MAX_KEY)
        held_roles = _check_roles(roles)
        if idempotency_key is not None:
            _check_text("idempotency_key", idempotency_key, _MAX_KEY)
        at = _moment(now)
        fingerprint = _fingerprint(
            {
                "task_id": task_id,
                "max_attempts": max_attempts,
                "expected_max_attempts": expected_max_attempts,
            }
        )
        with self._write() as conn:
            replay = self._replayed(conn, "task.set_attempt_limit", idempotency_key, fingerprint)
            if replay is not None:
                return self._load_task(conn, replay["task_id"], at, None)
            task = self._task_row(conn, task_id)
            if task.status in _FINISHED_STATUSES:
                raise TaskFinished(
                    f"task {task_id} is {task.status}; its attempt policy can no longer change"
                )
            (started,) = conn.execute(
                "SELECT COUNT(*) FROM runs WHERE task_id = ?", (task_id,)
            ).fetchone()
            creator_before_first_run = started == 0 and actor == task.created_by
            if not creator_before_first_run and OPERATE_ROLE not in held_roles:
                who = "after its first run" if started else "by anyone but its creator"
                raise Forbidden(
                    f"changing the attempt limit of task {task_id} {who} needs the role "
                    f"{OPERATE_ROLE}"
                )
            if task.max_attempts != expected_max_attempts:
                raise Conflict(
                    f"expected_max_attempts {expected_max_attempts} does not match the current "
                    f"limit of task {task_id}: {task.max_attempts}"
                )
            self._store_limit(conn, task_id, max_attempts, actor, at)
            self._audit(
                conn,
                at=at,
                actor=actor,
                action="task.set_attempt_limit",
                task_id=task_id,
                detail={
                    "from": task.max_attempts,
                    "to": max_attempts,
                    "attempts_started": started,
                    "roles": sorted(held_roles),
                },
            )
            self._remember(
                conn,
                "task.set_attempt_limit",
                idempotency_key,
                fingerprint,
                {"task_id": task_id, "max_attempts": max_attempts},
                at,
            )
            return self._load_task(conn, task_id, at, None)

    def cancel_task(self, task_id: str, *, actor: str, now: float | None = None) -> Task:
        """Cancel an open task (idempotent); a done task refuses with code `finished`.

        A running run is not touched: it finishes and is recorded as usual.
        """
        _check_text("actor", actor, _MAX_KEY)
        at = _moment(now)
        with self._write() as conn:
            task = self._task_row(conn, task_id)
            if task.status == "done":
                raise TaskFinished(f"task {task_id} is done; it cannot be cancelled")
            if task.status == "open":
                conn.execute(
                    "UPDATE tasks SET status = 'cancelled', updated_at = ? WHERE id = ?",
                    (at, task_id),
                )
                self._audit(conn, at=at, actor=actor, action="task.cancel", task_id=task_id)
            return self._load_task(conn, task_id, at, None)

    def audit_events(self, task_id: str | None = None) -> list[AuditEvent]:
        """Audit records in order, all or one task's."""
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

    def validate(self) -> list[str]:
        """Every problem found: storage integrity, and `validate_history` on every task."""
        problems: list[str] = []
        with self._read() as conn:
            for (message,) in conn.execute("PRAGMA quick_check"):
                if message != "ok":
                    problems.append(f"storage: {message}")
            for row in conn.execute("PRAGMA foreign_key_check"):
                problems.append(f"storage: row {row[1]} of {row[0]} references a missing {row[2]}")
            tasks = [_TaskRow(*row) for row in conn.execute(f"{_TASK_SELECT} ORDER BY t.seq")]
            for task in tasks:
                runs = self._task_runs(conn, task.id)
                try:
                    validate_history([_attempt_from_run(run) for run in runs])
                except HistoryError as exc:
                    problems.append(f"{task.id}: {exc.message}")
                succeeded = any(run.status == "succeeded" for run in runs)
                if task.status == "done" and not succeeded:
                    problems.append(f"{task.id}: task is done but no run succeeded")
                if task.status == "open" and succeeded:
                    problems.append(f"{task.id}: a run succeeded but the task is still open")
        return problems

    def status_info(self) -> dict[str, Any]:
        """Facts for `execkit db status` (JSON-safe)."""
        with self._read() as conn:
            (tasks,) = conn.execute("SELECT COUNT(*) FROM tasks").fetchone()
            (runs,) = conn.execute("SELECT COUNT(*) FROM runs").fetchone()
            (running,) = conn.execute(
                "SELECT COUNT(*) FROM runs WHERE status = 'running'"
            ).fetchone()
            (mode,) = conn.execute("PRAGMA journal_mode").fetchone()
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
