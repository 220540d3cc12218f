"""Where a ledger is, and the one place that opens it: a target becomes a backend here only.

A target is a file path (the embedded SQLite backend, `_sqlite`), a `postgresql://` or
`postgres://` URL string (the PostgreSQL backend, `_postgres`: imported, with psycopg, only
when such a ledger is opened), or None for `$EXECKIT_DB`, else `./.execkit/ledger.db`. A
`Path` always names a file. Everything that opens a ledger (the CLI, the server, the
dispatcher's command, the tests) comes through `open_ledger`, and the ledger-level
`migrate` and `ledger_status` open it here too, so what may happen on open is decided by the
caller's options and nowhere else:

- `create`: make a ledger where none is (a missing file, a database schema holding no
  ledger), or refuse with NotFound;
- `init`: also make an empty file a ledger (`execkit db init`; `create` refuses one, as it
  may be a truncated ledger);
- `upgrade`: migrate an older schema on open. A file is backed up by execkit beside itself
  first, so it is migrated by default; a server's database execkit cannot copy, so it is
  migrated only when asked (`upgrade=True`, or `migrate(..., backed_up=True)`), and until
  then every transaction is refused naming the `pg_dump` command to run first. With
  `upgrade=False` nothing is written on open, and only inspection (`status_info`,
  `validate`) works on an older schema.

A newer schema is refused on open (SchemaTooNew), nothing written.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, overload

from execkit._budget import Backoff, WorkBudget
from execkit._errors import InvalidInput
from execkit.ledger._sqlite import Migration, SqliteLedger

if TYPE_CHECKING:
    from execkit.ledger._postgres import PostgresLedger, PostgresMigration

__all__ = ["DB_ENV_VAR", "default_db_path", "ledger_status", "migrate", "open_ledger"]

DB_ENV_VAR = "EXECKIT_DB"

_URL_SCHEMES = ("postgresql://", "postgres://")

# How long a call waits for other writers (SQLite's busy timeout; on PostgreSQL the whole
# wait, for a pooled connection and every lock) before it is a StorageError, nothing written.
_LOCK_TIMEOUT_S = 30.0
_CONNECT_TIMEOUT_S = 10.0


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
    create: bool = True,
    init: bool = False,
    upgrade: bool | None = None,
    lock_timeout_s: float = _LOCK_TIMEOUT_S,
    connect_timeout_s: float = _CONNECT_TIMEOUT_S,
) -> SqliteLedger: ...


@overload
def open_ledger(
    path: str | None = None,
    *,
    budget: WorkBudget | None = None,
    backoff: Backoff | None = None,
    create: bool = True,
    init: bool = False,
    upgrade: bool | None = None,
    lock_timeout_s: float = _LOCK_TIMEOUT_S,
    connect_timeout_s: float = _CONNECT_TIMEOUT_S,
) -> SqliteLedger | PostgresLedger: ...


def open_ledger(
    path: str | os.PathLike[str] | None = None,
    *,
    budget: WorkBudget | None = None,
    backoff: Backoff | None = None,
    create: bool = True,
    init: bool = False,
    upgrade: bool | None = None,
    lock_timeout_s: float = _LOCK_TIMEOUT_S,
    connect_timeout_s: float = _CONNECT_TIMEOUT_S,
) -> SqliteLedger | PostgresLedger:
    """Open the ledger `path` names (else `$EXECKIT_DB`, else `./.execkit/ledger.db`): a
    `postgresql://` or `postgres://` URL (a string) opens the PostgreSQL backend, anything
    else the SQLite file at that path; a `Path` always names a file.

    `create` (default) makes a ledger where none is, else NotFound; `init` also makes an
    empty file one. `upgrade` migrates an older schema: None (default) does for a file
    (after writing a backup beside it) and not for a server's ledger (take the `pg_dump`
    its `backup_command()` names, then pass True or call `migrate`); False writes nothing
    on open. `lock_timeout_s` bounds how long a call waits for other writers (PostgreSQL: its
    whole wait, for a pooled connection and every lock);
    `connect_timeout_s` how long a PostgreSQL server may take to answer (a file has none).

    Raises SchemaTooNew, writing nothing, when the ledger was written by a newer execkit;
    NotFound without `create` when there is no ledger; StorageError naming
    `pip install 'execkit-runner[postgres]'` for a URL when psycopg is not installed.
    """
    target = _target(path)
    budget = WorkBudget() if budget is None else budget
    backoff = Backoff() if backoff is None else backoff
    if isinstance(target, str):
        from execkit.ledger._postgres import PostgresLedger

        return PostgresLedger(
            target,
            budget=budget,
            backoff=backoff,
            create=create or init,
            upgrade=upgrade is True,
            connect_timeout_s=connect_timeout_s,
            lock_timeout_s=lock_timeout_s,
        )
    return SqliteLedger(
        target,
        budget=budget,
        backoff=backoff,
        create=create,
        init=init,
        upgrade=upgrade is not False,
        busy_timeout_s=lock_timeout_s,
    )


@overload
def migrate(
    path: os.PathLike[str],
    *,
    backed_up: bool = False,
    budget: WorkBudget | None = None,
    backoff: Backoff | None = None,
) -> Migration: ...


@overload
def migrate(
    path: str | None = None,
    *,
    backed_up: bool = False,
    budget: WorkBudget | None = None,
    backoff: Backoff | None = None,
) -> Migration | PostgresMigration: ...


def migrate(
    path: str | os.PathLike[str] | None = None,
    *,
    backed_up: bool = False,
    budget: WorkBudget | None = None,
    backoff: Backoff | None = None,
) -> Migration | PostgresMigration:
    """Bring an existing ledger (as `open_ledger` names it) to its backend's current schema.

    A file is backed up beside itself first (`Migration.backup_path`). A PostgreSQL ledger
    is migrated only with `backed_up=True`, once the operator took the dump its
    `backup_command()` names: without it an outdated one is InvalidInput naming that exact
    `pg_dump` command, nothing written. Returns what was done; nothing is written when the
    ledger is already current (`from_version == to_version`). NotFound when there is no
    ledger; SchemaTooNew when it is newer. `budget` and `backoff` are accepted for callers
    of the older signature; a migration reads neither.
    """
    with open_ledger(path, budget=budget, backoff=backoff, create=False, upgrade=False) as ledger:
        return ledger.migrate(backed_up=backed_up)


def ledger_status(path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """Facts about the ledger `path` names, for an operator (`execkit db status`; JSON-safe):
    where it is, its schema version and the one this execkit needs, whether it needs a
    migration, counts. Opens it without writing anything (an older schema is reported, not
    migrated); NotFound when there is none, SchemaTooNew when it is newer."""
    with open_ledger(path, create=False, upgrade=False) as ledger:
        return ledger.status_info()
