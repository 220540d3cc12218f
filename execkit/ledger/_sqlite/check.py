"""The SQLite backend's own part of `db check`: the file's integrity, the tables its schema
version needs, and every stored value outside its domain or of the wrong type, each named.

SQLite keeps whatever it is given (a hand edit, a newer writer), so these are read before
the rules look at any row: a row the code cannot read would only crash the checks that
follow (`InspectionOps.validate` stops at these). Reads only; an sqlite3 error is reported
as a problem, not raised.
"""

from __future__ import annotations

import enum
import sqlite3
from pathlib import Path

from execkit._budget import AttemptStatus
from execkit._classify import FailureClass
from execkit.ledger._model import TaskStatus
from execkit.ledger._sqlite.migrate import read_version

__all__ = ["missing_tables", "storage_problems"]


def _tables(conn: sqlite3.Connection) -> set[str]:
    return {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}


def missing_tables(conn: sqlite3.Connection, path: Path) -> list[str]:
    """The tables the file's schema version needs that it does not have, sorted. Reads
    only; sqlite3 errors propagate."""
    needed = {"tasks", "runs", "audit", "idempotency", "task_attempt_limits"}
    if read_version(conn, path) >= 3:
        needed |= {"task_summaries", "ledger_meta", "role_grants", "run_extras", "task_extras"}
    if read_version(conn, path) >= 4:
        needed |= {"run_owners", "run_stops"}
    if read_version(conn, path) >= 5:
        needed |= {"lane_events", "lane_summaries", "run_lanes"}
    if read_version(conn, path) >= 6:
        needed |= {"run_lane_holds"}
    if read_version(conn, path) >= 8:
        needed |= {"run_costs", "task_budgets", "spend_warnings"}
    return sorted(needed - _tables(conn))


def storage_problems(conn: sqlite3.Connection, path: Path) -> list[str]:
    """The file's integrity, then every row outside its domain, each named."""
    problems: list[str] = []
    try:
        for (message,) in conn.execute("PRAGMA quick_check"):
            if message != "ok":
                problems.append(f"storage: {message}")
        for row in conn.execute("PRAGMA foreign_key_check"):
            problems.append(f"storage: row {row[1]} of {row[0]} references a missing {row[2]}")
        tables = _tables(conn)
        for missing in missing_tables(conn, path):
            problems.append(f"storage: table {missing} is missing")
        problems += _value_problems(conn, tables)
    except sqlite3.Error as exc:
        problems.append(f"storage: {exc}")
    return problems


def _domain(column: str, kind: type[enum.Enum], what: str) -> tuple[str, str, str, str]:
    """A check that `column` holds one of `kind`'s values (or NULL)."""
    allowed = ", ".join(str(member.value) for member in kind)
    quoted = ", ".join(f"'{member.value}'" for member in kind)  # execkit's own constants
    bad = f"{column} IS NOT NULL AND {column} NOT IN ({quoted})"
    return column, bad, f"{what} is {{!r}}, not one of {allowed}", "domain"


def _shape(column: str, bad: str, what: str) -> tuple[str, str, str, str]:
    """A check that `column` holds a value of its type (SQLite keeps whatever it is given)."""
    return column, bad, f"the {what} stored is {{!r}}", "shape"


# Per table, each check of a stored value: its column, the SQL that finds a bad one, the
# message (formatted with the value) and its kind. The domain problems are reported
# first, then the shapes, each table's in this order.
_VALUE_CHECKS = {
    "runs": (
        _domain("status", AttemptStatus, "status of run"),
        _domain("failure_class", FailureClass, "class of run"),
        _shape("attempt", "typeof(attempt) != 'integer' OR attempt < 1", "attempt"),
        _shape("reason", "reason IS NOT NULL AND typeof(reason) != 'text'", "reason"),
        _shape("started_at", "typeof(started_at) NOT IN ('real', 'integer')", "start time"),
        _shape(
            "ended_at",
            "ended_at IS NOT NULL AND typeof(ended_at) NOT IN ('real', 'integer')",
            "end time",
        ),
    ),
    "tasks": (
        _domain("status", TaskStatus, "status of task"),
        _shape("title", "typeof(title) != 'text'", "title"),
        _shape("created_at", "typeof(created_at) NOT IN ('real', 'integer')", "creation time"),
    ),
}


def _value_problems(conn: sqlite3.Connection, tables: set[str]) -> list[str]:
    """Every stored value outside its domain or of the wrong type (`_VALUE_CHECKS`): one
    scan a table, each row that fails a check named once for each check it fails."""
    found: dict[str, dict[str, list[str]]] = {"domain": {}, "shape": {}}
    for table, checks in _VALUE_CHECKS.items():
        if table not in tables:
            continue
        columns = ", ".join(column for column, _, _, _ in checks)
        flags = ", ".join(f"({bad})" for _, bad, _, _ in checks)
        where = " OR ".join(f"({bad})" for _, bad, _, _ in checks)
        rows = conn.execute(f"SELECT id, {columns}, {flags} FROM {table} WHERE {where}")
        lists = [found[kind].setdefault(f"{table}.{column}", []) for column, _, _, kind in checks]
        for row in rows.fetchall():
            for n, (_, _, message, _) in enumerate(checks):
                if row[1 + len(checks) + n]:
                    lists[n].append(f"{row[0]}: {message.format(row[1 + n])}")
    return [
        line for kind in ("domain", "shape") for lines in found[kind].values() for line in lines
    ]
