"""The PostgreSQL backend's check of a ledger's schema: what opening verifies before any
write (the tables and columns of its version, the privileges every write needs: one
query, `fitness`), and its own part of `db check`: the tables and columns a current schema
needs, then every stored status and failure class outside its domain, each named.

The database's constraints keep such rows out; a hand edit that dropped a constraint could
let them in, and a row the code cannot read would only crash the checks that follow
(`InspectionOps.validate` stops at these). Reads only, inside the store's read transaction.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import attrs

from execkit._budget import AttemptStatus
from execkit._classify import FailureClass
from execkit.ledger._model import TaskStatus
from execkit.ledger._postgres import schema
from execkit.ledger._postgres.tx import PostgresTx

__all__ = ["WRITE_PRIVILEGES", "Fitness", "expected_columns", "fitness", "problems_in"]


def problems_in(tx: PostgresTx) -> Iterator[str]:
    """Missing tables and columns, then every row outside its domain, one message each, in
    that order (the store keeps those found before a failure, and names the failure)."""
    missing = fitness(tx, schema.SCHEMA_VERSION, "").missing
    for what in missing:
        yield f"storage: {what} is missing"
    present = set(expected_columns(schema.SCHEMA_VERSION)) - {
        what.removeprefix("table ") for what in missing
    }
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


# The privileges every write path of `tx.py` may need: creating a task, admitting and
# finishing a run, its lane and its audit row. SELECT ... FOR UPDATE needs UPDATE, and an
# upsert (ON CONFLICT DO UPDATE) both. Granting and revoking roles and the lane
# configuration (role_grants, ledger_meta) are an administrator's writes, left out so a
# least-privilege worker role is not refused; a missing one is still named when the
# statement fails (`store.py`).
WRITE_PRIVILEGES: dict[str, tuple[str, ...]] = {
    "schema_version": ("SELECT",),
    "ledger_meta": ("SELECT",),
    "role_grants": ("SELECT",),
    "tasks": ("SELECT", "INSERT", "UPDATE"),
    "runs": ("SELECT", "INSERT", "UPDATE"),
    "audit": ("SELECT", "INSERT"),
    "idempotency": ("SELECT", "INSERT"),
    "lane_events": ("SELECT", "INSERT"),
    "lane_summaries": ("SELECT", "INSERT", "UPDATE"),
    "run_lanes": ("SELECT", "INSERT"),
}
# nextval() on the task and run numbers needs USAGE (or UPDATE) on the sequence.
SEQUENCES = ("task_numbers", "run_numbers")

_CREATE_TABLE = re.compile(r"\s*CREATE\s+TABLE\s+(\w+)\s*\((.*)\)\s*$", re.IGNORECASE | re.DOTALL)
_ALTER_TABLE = re.compile(r"\s*ALTER\s+TABLE\s+(\w+)\s+(.*)$", re.IGNORECASE | re.DOTALL)
_ADD_COLUMN = re.compile(r"\bADD\s+COLUMN\s+(?:IF\s+NOT\s+EXISTS\s+)?(\w+)", re.IGNORECASE)
_DROP_COLUMN = re.compile(r"\bDROP\s+COLUMN\s+(?:IF\s+EXISTS\s+)?(\w+)", re.IGNORECASE)
_NOT_A_COLUMN = {"constraint", "primary", "unique", "check", "foreign", "exclude", "like"}


def _top_level_items(body: str) -> Iterator[str]:
    """The comma-separated items of a CREATE TABLE body, commas inside parentheses kept."""
    depth, start = 0, 0
    for at, char in enumerate(body):
        if char == "(":
            depth += 1
        elif char == ")":
            depth -= 1
        elif char == "," and depth == 0:
            yield body[start:at].strip()
            start = at + 1
    yield body[start:].strip()


def expected_columns(version: int) -> dict[str, frozenset[str]]:
    """Every table schema `version` has and its columns, read from the statements of
    `schema.SCHEMA_STEPS` up to it (CREATE TABLE and ALTER TABLE ... ADD/DROP COLUMN), so a
    new step is checked without a second list to keep in step with it."""
    tables: dict[str, set[str]] = {}
    for step in range(1, version + 1):
        for statement in schema.SCHEMA_STEPS.get(step, ()):
            created = _CREATE_TABLE.match(statement)
            if created is not None:
                tables[created[1]] = {
                    item.split()[0].strip('"')
                    for item in _top_level_items(created[2])
                    if item and item.split()[0].lower() not in _NOT_A_COLUMN
                }
                continue
            altered = _ALTER_TABLE.match(statement)
            if altered is not None and altered[1] in tables:
                tables[altered[1]] |= set(_ADD_COLUMN.findall(altered[2]))
                tables[altered[1]] -= set(_DROP_COLUMN.findall(altered[2]))
    return {name: frozenset(columns) for name, columns in tables.items()}


@attrs.frozen
class Fitness:
    """What the role connected to a ledger's schema finds there against what this execkit
    needs: `missing` the tables and columns of the schema's version that are not there
    (`table runs`, `column runs.stopped`), `lacking` the write privileges the role does not
    hold (`INSERT on table runs`), `grants` the statements that give them, each sorted;
    `role` the role connected."""

    role: str
    missing: tuple[str, ...]
    lacking: tuple[str, ...]
    grants: tuple[str, ...]


def fitness(tx: PostgresTx, version: int, schema_name: str) -> Fitness:
    """One query: the tables, columns and privileges of the current schema, compared with
    what schema `version` and every write path need (`expected_columns`,
    `WRITE_PRIVILEGES`, `SEQUENCES`). Reads only; psycopg errors propagate."""
    rows = tx._all(
        "SELECT c.relname, c.relkind, "
        "ARRAY(SELECT a.attname::text FROM pg_attribute a "
        "      WHERE a.attrelid = c.oid AND a.attnum > 0 AND NOT a.attisdropped), "
        "CASE WHEN c.relkind = 'S' THEN ARRAY[has_sequence_privilege(c.oid, 'USAGE') "
        "     OR has_sequence_privilege(c.oid, 'UPDATE')] "
        "ELSE ARRAY[has_any_column_privilege(c.oid, 'SELECT'), "
        "           has_any_column_privilege(c.oid, 'INSERT'), "
        "           has_any_column_privilege(c.oid, 'UPDATE')] END "
        "FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
        "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'S')"
    )
    columns = {str(name): set(found) for name, kind, found, _ in rows if kind != "S"}
    held: dict[str, set[str]] = {}
    for name, kind, _, flags in rows:
        kinds = ("USAGE",) if kind == "S" else ("SELECT", "INSERT", "UPDATE")
        held[str(name)] = {what for what, has in zip(kinds, flags, strict=True) if has}
    missing: list[str] = []
    for table, needed in sorted(expected_columns(version).items()):
        if table not in columns:
            missing.append(f"table {table}")
            continue
        missing += [f"column {table}.{column}" for column in sorted(needed - columns[table])]
    lacking: list[str] = []
    grants: list[str] = []
    role = _quoted(str(tx._conn.info.user))
    wanted = [(table, "table", needed) for table, needed in sorted(WRITE_PRIVILEGES.items())]
    wanted += [(sequence, "sequence", ("USAGE",)) for sequence in SEQUENCES]
    for name, kind, privileges in wanted:
        if name not in held:
            continue  # a missing table is named in `missing`
        absent = [what for what in privileges if what not in held[name]]
        lacking += [f"{what} on {kind} {name}" for what in absent]
        if absent:
            target = f"{'SEQUENCE ' if kind == 'sequence' else ''}{_quoted(schema_name)}.{name}"
            grants.append(f"GRANT {', '.join(absent)} ON {target} TO {role}")
    return Fitness(role=role, missing=tuple(missing), lacking=tuple(lacking), grants=tuple(grants))


def _quoted(identifier: str) -> str:
    """`identifier` as SQL writes it: bare when it is a plain lower-case name."""
    if re.fullmatch(r"[a-z_][a-z0-9_]*", identifier):
        return identifier
    return '"' + identifier.replace('"', '""') + '"'
