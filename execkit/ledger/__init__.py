"""The durable ledger (ADR 0033): tasks, runs, attempt limits, audit, idempotency.

`open_ledger()` is the entry point; the SQLite backend is the embedded default. Callers
code against `Ledger` (model.py) so another backend can replace it without touching them.
"""

from __future__ import annotations

import os
from pathlib import Path

from execkit.budget import Backoff, WorkBudget
from execkit.ledger.model import (
    CAPABILITIES,
    MAX_ATTEMPT_LIMIT,
    OPERATE_ROLE,
    AuditEvent,
    Ledger,
    Run,
    Task,
)
from execkit.ledger.sqlite import SCHEMA_VERSION, Migration, SqliteLedger, migrate

__all__ = [
    "CAPABILITIES",
    "DB_ENV_VAR",
    "MAX_ATTEMPT_LIMIT",
    "OPERATE_ROLE",
    "SCHEMA_VERSION",
    "AuditEvent",
    "Ledger",
    "Migration",
    "Run",
    "SqliteLedger",
    "Task",
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
