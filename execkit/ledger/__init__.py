"""The durable ledger (ADR 0033): tasks, runs, attempt limits, audit, idempotency.

`open_ledger()` is the entry point and the one place that names a backend: a file path
opens the embedded SQLite backend (`_sqlite`), a `postgresql://` (or `postgres://`) URL the
PostgreSQL one (`_postgres`, shared by dispatchers on many hosts; psycopg is the optional
extra `execkit-runner[postgres]`, imported only when such a ledger is opened). Callers code
against `Ledger` (`_model`), so either backend serves them unchanged. `import execkit` does
not import this package: it loads on first use of a ledger name.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, overload

from execkit._budget import Backoff, WorkBudget
from execkit._errors import InvalidInput
from execkit.ledger._model import (
    ADMIN_ROLE,
    CAPABILITIES,
    DEFAULT_LEASE_S,
    KNOWN_ROLES,
    MAX_ATTEMPT_LIMIT,
    MAX_LEASE_S,
    MAX_UNCHARGED_LIMIT,
    OPERATE_ROLE,
    Actor,
    AuditAction,
    AuditEntry,
    AuditEvent,
    Grant,
    Ledger,
    Role,
    Run,
    Task,
    TaskState,
    TaskStatus,
    user_name,
)
from execkit.ledger._sqlite import SCHEMA_VERSION, Migration, SqliteLedger, migrate

if TYPE_CHECKING:
    from execkit.ledger._postgres import PostgresLedger

__all__ = [
    "ADMIN_ROLE",
    "CAPABILITIES",
    "DB_ENV_VAR",
    "DEFAULT_LEASE_S",
    "KNOWN_ROLES",
    "MAX_ATTEMPT_LIMIT",
    "MAX_LEASE_S",
    "MAX_UNCHARGED_LIMIT",
    "OPERATE_ROLE",
    "SCHEMA_VERSION",
    "Actor",
    "AuditAction",
    "AuditEntry",
    "AuditEvent",
    "Grant",
    "Ledger",
    "Migration",
    "Role",
    "Run",
    "SqliteLedger",
    "Task",
    "TaskState",
    "TaskStatus",
    "default_db_path",
    "migrate",
    "open_ledger",
    "user_name",
]

DB_ENV_VAR = "EXECKIT_DB"


_URL_SCHEMES = ("postgresql://", "postgres://")


def _target(path: str | os.PathLike[str] | None) -> str | Path:
    """What a ledger argument names: `path` if given, else `$EXECKIT_DB`, else
    `./.execkit/ledger.db`; a PostgreSQL URL stays a string, anything else is a file path."""
    if path is not None and str(path):
        given: str | os.PathLike[str] = path
    elif os.environ.get(DB_ENV_VAR):
        given = os.environ[DB_ENV_VAR]
    else:
        return Path.cwd() / ".execkit" / "ledger.db"
    if isinstance(given, str) and given.startswith(_URL_SCHEMES):
        return given
    return Path(given)


def default_db_path(path: str | os.PathLike[str] | None = None) -> Path:
    """The ledger file: `path` if given, else `$EXECKIT_DB`, else `./.execkit/ledger.db`.

    A `postgresql://` URL names no file: InvalidInput (open it with `open_ledger`).
    """
    target = _target(path)
    if isinstance(target, str):
        raise InvalidInput(
            "this names a PostgreSQL ledger, not a ledger file: open it with `open_ledger`",
            field="db",
        )
    return target


@overload
def open_ledger(
    path: os.PathLike[str],
    *,
    budget: WorkBudget | None = None,
    backoff: Backoff | None = None,
) -> SqliteLedger: ...


@overload
def open_ledger(
    path: str | None = None,
    *,
    budget: WorkBudget | None = None,
    backoff: Backoff | None = None,
) -> SqliteLedger | PostgresLedger: ...


def open_ledger(
    path: str | os.PathLike[str] | None = None,
    *,
    budget: WorkBudget | None = None,
    backoff: Backoff | None = None,
) -> SqliteLedger | PostgresLedger:
    """Open the ledger `path` names (else `$EXECKIT_DB`, else `./.execkit/ledger.db`),
    creating it as needed: a `postgresql://` or `postgres://` URL (a string) opens the
    PostgreSQL backend, anything else the SQLite file at that path (migrated as needed,
    after a backup); a `Path` always names a file.

    Raises SchemaTooNew, writing nothing, when the ledger was written by a newer execkit;
    StorageError naming `pip install 'execkit-runner[postgres]'` for a URL when psycopg is
    not installed.
    """
    target = _target(path)
    budget = WorkBudget() if budget is None else budget
    backoff = Backoff() if backoff is None else backoff
    if isinstance(target, str):
        from execkit.ledger._postgres import PostgresLedger

        return PostgresLedger(target, budget=budget, backoff=backoff)
    return SqliteLedger(target, budget=budget, backoff=backoff)
