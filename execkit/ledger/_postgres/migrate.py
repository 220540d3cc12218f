"""Migrations of a PostgreSQL ledger: the version a database's current schema holds, the
`pg_dump` command that backs it up, and an older one brought to `schema.SCHEMA_VERSION`.

Each migration is one transaction under a PostgreSQL advisory lock, so concurrent
migrations (and concurrent creations of one ledger) serialise, and the version is read again
under that lock. A schema newer than this code knows is refused (`SchemaTooNew`) before
anything is written. execkit cannot copy a server's database, so an existing ledger is
migrated only when asked (`upgrade=True` on open, or `migrate(backed_up=True)`); until
then the store refuses every transaction with the exact `pg_dump` command to take the
backup first (`backup_command`). A database whose current schema holds tables of the
ledger's names but no ledger is another program's (StorageError).

`SCHEMA_VERSION` and `SCHEMA_STEPS` are read from `schema` at each use, so a test can stand
in a newer schema.
"""

from __future__ import annotations

import os
import shlex
import time
import uuid
from typing import Any

import attrs

from execkit._errors import SchemaTooNew, StorageError
from execkit._json import to_json
from execkit._lanes import LaneConfigHistory
from execkit.ledger._core import LANE_CONFIG_META_KEY
from execkit.ledger._model import user_name
from execkit.ledger._postgres import schema
from execkit.ledger._postgres.tx import PostgresTx, nul_free

__all__ = ["PostgresMigration", "backup_command", "read_version", "upgrade"]

# pg_advisory_xact_lock(int, int) keys: the two-int key space never meets the one-bigint
# space the idempotency keys use. 0x65786b74 is "exkt".
_MIGRATION_LOCK = (0x65786B74, 1)


@attrs.frozen
class PostgresMigration:
    """What `upgrade=True` did to the schema. `backup_command` is the `pg_dump` command
    that backs the ledger up (execkit cannot copy a server's database itself); None for a
    new ledger, which had nothing to back up."""

    from_version: int
    to_version: int
    backup_command: str | None

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


def read_version(tx: PostgresTx, where: str) -> tuple[int, str]:
    """The schema version of the ledger in the connection's current schema (0 when there
    is none) and that schema's name. StorageError when no schema of the search_path
    exists, or when the schema holds tables of the ledger's names but no ledger."""
    row = tx._one("SELECT current_schema()")
    current = row[0] if row is not None else None
    if current is None:
        raise StorageError(_no_schema(tx, where))
    name = str(current)
    names = {
        table
        for (table,) in tx._all(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = current_schema() AND c.relkind IN ('r', 'p', 'v')"
        )
    }
    if "schema_version" not in names:
        clash = sorted(names & set(schema.TABLES))
        if clash:
            raise StorageError(
                f"schema {name} of {where} holds tables named "
                f"{', '.join(clash)} but no execkit ledger; give the ledger its own "
                "database or schema"
            )
        return 0, name
    row = tx._one("SELECT MAX(version) FROM schema_version")
    return (int(row[0] or 0) if row is not None else 0), name


def _no_schema(tx: PostgresTx, where: str) -> str:
    """Why the connection has no current schema: the role lacks USAGE on the schemas of
    its search_path (PostgreSQL then skips them), or none of them exists."""
    user = str(tx._conn.info.user)
    row = tx._one("SHOW search_path")
    named = [
        user if name == "$user" else name
        for name in (part.strip().strip('"') for part in str(row[0] if row else "").split(","))
        if name
    ]
    closed = [
        str(name)
        for (name,) in tx._all(
            "SELECT nspname FROM pg_namespace "
            "WHERE nspname = ANY(%s) AND NOT has_schema_privilege(oid, 'USAGE') "
            "ORDER BY array_position(%s, nspname::text)",
            (named, named),
        )
    ]
    if closed:
        return (
            f"the role {user} lacks USAGE on schema {closed[0]} of the ledger at {where}; "
            f"nothing was written. An administrator grants it: GRANT USAGE ON SCHEMA "
            f"{closed[0]} TO {user}"
        )
    return f"the ledger at {where} has no schema to live in: no schema of its search_path exists"


def backup_command(schema_name: str, where: str, version: int) -> str:
    """The exact `pg_dump` command that backs up the ledger in `schema_name` at `where`
    (its URL without the password: libpq reads it from PGPASSWORD or ~/.pgpass), the
    dump's file named after `version`."""
    stamp = time.strftime("%Y%m%dT%H%M%S")
    return shlex.join(
        [
            "pg_dump",
            "--format=custom",
            f"--schema={schema_name}",
            f"--file=execkit-ledger-schema-v{version}-{stamp}.dump",
            f"--dbname={where}",
        ]
    )


def _lane_rules_of_version_1(tx: PostgresTx) -> None:
    """Version 4's data step: the lane events so far keep folding with the lanes' rules of
    version 1 (`LaneConfigHistory.upgraded`), so `db check` recomputes them as stored."""
    row = tx._one("SELECT value FROM ledger_meta WHERE key = %s", (LANE_CONFIG_META_KEY,))
    last = tx._one("SELECT coalesce(max(seq), 0) FROM lane_events")
    history = LaneConfigHistory.from_stored(None if row is None else str(row[0]))
    upgraded = history.upgraded(int(last[0]) if last is not None else 0)
    if upgraded.epochs:
        tx.send_once(
            "INSERT INTO ledger_meta (key, value) VALUES (%s, %s) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (LANE_CONFIG_META_KEY, upgraded.to_stored()),
        )


def upgrade(tx: PostgresTx, where: str) -> PostgresMigration | None:
    """Inside `tx` (a write transaction the caller commits): take the migration lock, then
    bring the ledger to SCHEMA_VERSION, a new one with its identity and owner (the
    operating-system user creating it). None when it was already current."""
    tx.lock_advisory(*_MIGRATION_LOCK)
    # Re-read under the lock: another process may have created or migrated the
    # ledger meanwhile, and no other migration can start until this one commits.
    current, schema_name = read_version(tx, where)
    if current > schema.SCHEMA_VERSION:
        raise SchemaTooNew(f"the ledger at {where} was upgraded to schema {current} meanwhile")
    if current == schema.SCHEMA_VERSION:
        return None
    command = backup_command(schema_name, where, current) if current > 0 else None
    now = time.time()
    for version in range(current + 1, schema.SCHEMA_VERSION + 1):
        for statement in schema.SCHEMA_STEPS[version]:
            tx.send_once(statement)
        if version == 1:
            tx.send_once(
                "INSERT INTO ledger_meta (key, value) VALUES ('ledger_id', %s), ('owner', %s)",
                (uuid.uuid4().hex, nul_free(user_name(os.geteuid()))),
            )
        if version == 4 and current > 0:
            _lane_rules_of_version_1(tx)
        tx.send_once(
            "INSERT INTO schema_version (version, applied_at) VALUES (%s, %s)",
            (version, now),
        )
    return PostgresMigration(
        from_version=current, to_version=schema.SCHEMA_VERSION, backup_command=command
    )
