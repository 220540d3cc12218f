"""The PostgreSQL backend's own part of `db check`: the tables a current schema needs, then
every stored status and failure class outside its domain, each named.

The database's constraints keep such rows out; a hand edit that dropped a constraint could
let them in, and a row the code cannot read would only crash the checks that follow
(`InspectionOps.validate` stops at these). Reads only, inside the store's read transaction.
"""

from __future__ import annotations

from collections.abc import Iterator

from execkit._budget import AttemptStatus
from execkit._classify import FailureClass
from execkit.ledger._model import TaskStatus
from execkit.ledger._postgres import schema
from execkit.ledger._postgres.tx import PostgresTx

__all__ = ["problems_in"]


def problems_in(tx: PostgresTx) -> Iterator[str]:
    """Missing tables, then every row outside its domain, one message each, in that order
    (the store keeps those found before a failure, and names the failure)."""
    present = {
        name
        for (name,) in tx._all(
            "SELECT c.relname FROM pg_class c "
            "JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p')"
        )
    }
    for missing in sorted(set(schema.TABLES) - present):
        yield f"storage: table {missing} is missing"
    checks = (
        ("runs", "status", AttemptStatus, "status of run"),
        ("runs", "failure_class", FailureClass, "class of run"),
        ("tasks", "status", TaskStatus, "status of task"),
    )
    for table, column, kind, what in checks:
        if table not in present:
            continue
        allowed = [str(member.value) for member in kind]
        rows = tx._all(
            f"SELECT id, {column} FROM {table} "
            f"WHERE {column} IS NOT NULL AND NOT ({column} = ANY(%s)) ORDER BY seq",
            (allowed,),
        )
        for row in rows:
            yield f"{row[0]}: {what} is {row[1]!r}, not one of {', '.join(allowed)}"
