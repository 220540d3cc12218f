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
        if "runs" in tables:
            problems += _domain_problems(
                conn, "runs", "id", "status", AttemptStatus, "status of run"
            )
            problems += _domain_problems(
                conn, "runs", "id", "failure_class", FailureClass, "class of run"
            )
        if "tasks" in tables:
            problems += _domain_problems(
                conn, "tasks", "id", "status", TaskStatus, "status of task"
            )
        problems += _shape_problems(conn, tables)
    except sqlite3.Error as exc:
        problems.append(f"storage: {exc}")
    return problems


def _shape_problems(conn: sqlite3.Connection, tables: set[str]) -> list[str]:
    """Stored values of the wrong type (SQLite keeps whatever it is given)."""
    checks = {
        "runs": (
            ("attempt", "typeof(attempt) != 'integer' OR attempt < 1", "attempt"),
            ("reason", "reason IS NOT NULL AND typeof(reason) != 'text'", "reason"),
            ("started_at", "typeof(started_at) NOT IN ('real', 'integer')", "start time"),
            (
                "ended_at",
                "ended_at IS NOT NULL AND typeof(ended_at) NOT IN ('real', 'integer')",
                "end time",
            ),
        ),
        "tasks": (
            ("title", "typeof(title) != 'text'", "title"),
            ("created_at", "typeof(created_at) NOT IN ('real', 'integer')", "creation time"),
        ),
    }
    problems: list[str] = []
    for table, columns in checks.items():
        if table not in tables:
            continue
        for column, bad, what in columns:
            rows = conn.execute(f"SELECT id, {column} FROM {table} WHERE {bad}").fetchall()
            problems += [f"{row[0]}: the {what} stored is {row[1]!r}" for row in rows]
    return problems


def _domain_problems(
    conn: sqlite3.Connection, table: str, key: str, column: str, kind: type[enum.Enum], what: str
) -> list[str]:
    allowed = tuple(str(member.value) for member in kind)
    marks = ", ".join("?" * len(allowed))
    rows = conn.execute(
        f"SELECT {key}, {column} FROM {table} "
        f"WHERE {column} IS NOT NULL AND {column} NOT IN ({marks})",
        allowed,
    ).fetchall()
    return [f"{row[0]}: {what} is {row[1]!r}, not one of {', '.join(allowed)}" for row in rows]
