"""Plain helpers for the ledger contract suite: one name for "a ledger of either backend",
opening one at a target (a file path or a postgresql:// URL), and raw SQL beneath the rules.

The fixtures that hand these out (`backend`, `ledger_target`, `opener`, `ledger`,
`raw_sql`, and the PostgreSQL cluster) live in conftest.py.
"""

from __future__ import annotations

import itertools
import os
import sqlite3
from collections.abc import Callable
from typing import Any

from pgcluster import Cluster

from execkit.ledger import PostgresLedger, SqliteLedger, open_ledger

BACKENDS = ("sqlite", "postgres")

AnyLedger = SqliteLedger | PostgresLedger
"""A ledger of either backend: the `Ledger` interface, a context manager, `status_info`."""

Opener = Callable[..., AnyLedger]
"""Opens (creating as needed) the test's ledger again: `opener(budget=..., backoff=...)`."""

RawSql = Callable[[str], list[tuple[Any, ...]]]
"""Runs one SQL statement on the test's ledger through a connection of its own (committed
at once) and returns the rows: for damage only a bug or a hand edit could do."""


def open_at(target: str, **options: Any) -> AnyLedger:
    """The ledger at `target` (`open_ledger`: PostgreSQL for a URL, else the SQLite file at
    that path), with `open_ledger`'s options."""
    return open_ledger(target, **options)


def is_postgres_url(target: str) -> bool:
    return target.startswith(("postgresql://", "postgres://"))


def raw_sql_at(target: str) -> RawSql:
    """A `RawSql` for the ledger at `target`."""

    def run(sql: str) -> list[tuple[Any, ...]]:
        if is_postgres_url(target):
            import psycopg

            with psycopg.connect(target, autocommit=True) as conn:
                cursor = conn.execute(sql)
                return cursor.fetchall() if cursor.description else []
        lite = sqlite3.connect(target, isolation_level=None)
        try:
            return lite.execute(sql).fetchall()
        finally:
            lite.close()

    return run


class PgSchemas:
    """Fresh, empty schemas in the cluster's database, each named by a URL."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster = cluster
        self._numbers = itertools.count(1)

    def new(self) -> str:
        import psycopg

        name = f"t{os.getpid()}_{next(self._numbers)}"
        with psycopg.connect(self.cluster.url(), autocommit=True) as conn:
            conn.execute(f'CREATE SCHEMA "{name}"')
        return self.cluster.url(options=f"-csearch_path={name}")


# SQLite's versions 13 and 14 (issue #45's spend buckets), undone before anything they read is.
SQLITE_BUCKETS_UNDONE = (
    "DROP TRIGGER run_costs_on_end",  # step 14's
    "DROP TRIGGER spend_buckets_on_cost_insert",
    "DROP TRIGGER spend_buckets_on_cost_update",
    "DROP INDEX runs_running",
    "ALTER TABLE run_extras DROP COLUMN reserved_usd",
    "ALTER TABLE run_extras DROP COLUMN reserved_tokens",
    "DROP INDEX run_costs_by_lane",  # step 13's
    "DROP TABLE spend_buckets",
)
