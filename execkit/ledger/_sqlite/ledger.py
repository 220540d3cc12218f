"""`SqliteLedger`: the rules (`LedgerCore`) over one SQLite file, and what an operator asks
of the file itself (status, where it is, a migration).
"""

from __future__ import annotations

import os
import sqlite3
from typing import Any

from execkit._backoff import SCHEDULER_BACKOFF, Backoff
from execkit._budget import WorkBudget
from execkit.ledger._core import LedgerCore
from execkit.ledger._sqlite import schema
from execkit.ledger._sqlite.migrate import Migration
from execkit.ledger._sqlite.store import SqliteStore

__all__ = ["SqliteLedger"]

_DEFAULT_BUDGET = WorkBudget()


class SqliteLedger(LedgerCore):
    """The embedded ledger over one SQLite file (see `SqliteStore` for what opening creates,
    migrates or refuses). Not thread-safe: one per thread or process."""

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
        return Migration(
            from_version=schema.SCHEMA_VERSION, to_version=schema.SCHEMA_VERSION, backup_path=None
        )

    @property
    def _conn(self) -> sqlite3.Connection:
        """The raw connection, for tests that look under the rules at the stored rows."""
        return self._sqlite._conn
