"""`PostgresLedger`: the rules (`LedgerCore`) over one PostgreSQL database, and what an
operator asks of the database itself (status, where it is, the backup command, a migration
once the backup is taken).
"""

from __future__ import annotations

from typing import Any

from execkit._backoff import SCHEDULER_BACKOFF, Backoff
from execkit._budget import WorkBudget
from execkit._errors import InvalidInput
from execkit.ledger._core import LedgerCore
from execkit.ledger._postgres import schema
from execkit.ledger._postgres.migrate import PostgresMigration
from execkit.ledger._postgres.store import DEFAULT_POOL_SIZE, PostgresStore

__all__ = ["PostgresLedger", "migrate_postgres"]

_DEFAULT_BUDGET = WorkBudget()


class PostgresLedger(LedgerCore):
    """The shared ledger over one PostgreSQL database (see `PostgresStore` for what opening
    creates, migrates or refuses). Thread-safe: its threads' transactions run side by side
    on a pool of at most `pool_size` connections (1..256, default 8; `PostgresStore`)."""

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
        pool_size: int = DEFAULT_POOL_SIZE,
    ) -> None:
        store = PostgresStore(
            url,
            create=create,
            upgrade=upgrade,
            connect_timeout_s=connect_timeout_s,
            lock_timeout_s=lock_timeout_s,
            pool_size=pool_size,
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
        if found < schema.SCHEMA_VERSION and not backed_up:
            raise InvalidInput(
                f"the ledger at {self.url} has schema version {found} and this execkit needs "
                f"{schema.SCHEMA_VERSION}. execkit cannot copy a server's database: back it up "
                f"with `{self.backup_command(found)}`, then run `execkit db migrate --backed-up` "
                "(from Python: `migrate(..., backed_up=True)`)",
                field="backed_up",
            )
        done = self._postgres.upgrade()
        if done is not None:
            self.migration = done
            return done
        return PostgresMigration(
            from_version=schema.SCHEMA_VERSION,
            to_version=schema.SCHEMA_VERSION,
            backup_command=None,
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
