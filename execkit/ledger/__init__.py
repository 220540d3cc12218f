"""The durable ledger (ADR 0033): tasks, runs, attempt limits, audit, idempotency.

`open_ledger()` is the entry point and the one place that names a backend; the SQLite
backend (`_sqlite`) is the embedded default. Callers code against `Ledger` (`_model`), so
another backend can replace it without touching them. `import execkit` does not import
this package: it loads on first use of a ledger name.
"""

from __future__ import annotations

import os
from pathlib import Path

from execkit._budget import Backoff, WorkBudget
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
    AuditEvent,
    Grant,
    Ledger,
    Run,
    Task,
    TaskState,
    TaskStatus,
)
from execkit.ledger._sqlite import SCHEMA_VERSION, Migration, SqliteLedger, migrate

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
    "AuditEvent",
    "Grant",
    "Ledger",
    "Migration",
    "Run",
    "SqliteLedger",
    "Task",
    "TaskState",
    "TaskStatus",
    "default_db_path",
    "migrate",
    "open_ledger",
]

DB_ENV_VAR = "EXECKIT_DB"


def default_db_path(path: str | os.PathLike[str] | None = None) -> Path:
    """The ledger file: `path` if given, else `$EXECKIT_DB`, else `./.execkit/ledger.db`."""
    if path is not None and str(path):
        return Path(path)
    from_env = os.environ.get(DB_ENV_VAR)
    if from_env:
        return Path(from_env)
    return Path.cwd() / ".execkit" / "ledger.db"


def open_ledger(
    path: str | os.PathLike[str] | None = None,
    *,
    budget: WorkBudget | None = None,
    backoff: Backoff | None = None,
) -> SqliteLedger:
    """Open (creating or migrating as needed) the ledger at `default_db_path(path)`.

    Raises SchemaTooNew, writing nothing, when the file was written by a newer execkit.
    """
    return SqliteLedger(
        default_db_path(path),
        budget=WorkBudget() if budget is None else budget,
        backoff=Backoff() if backoff is None else backoff,
    )
