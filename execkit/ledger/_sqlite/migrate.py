"""Migrations of an SQLite ledger: the version a file holds, and an older one brought to
`schema.SCHEMA_VERSION` after a backup beside the file.

A migration is one BEGIN IMMEDIATE transaction: the version is read again under the write
lock (another process may have migrated or created the file meanwhile), the file is copied
to an owner-only backup (ADR 0033: restoring it is the way back to an older execkit), and
each missing version's statements (`schema.py`) and data step run in order. A failure
rolls everything back and leaves the file as it was. A file whose schema is newer than this
code knows is never written (`SchemaTooNew`); a file with tables but no `schema_version`
is another program's (StorageError).

`SCHEMA_VERSION` and `SCHEMA_STEPS` are read from `schema` at each use, so a test can stand
in a newer schema.
"""

from __future__ import annotations

import contextlib
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from execkit._budget import summarize
from execkit._errors import SchemaTooNew, StorageError
from execkit._json import to_json
from execkit._lanes import LaneConfigHistory
from execkit.ledger._core import LANE_CONFIG_META_KEY, attempt_from_run
from execkit.ledger._model import DEFAULT_LEASE_S
from execkit.ledger._sqlite import schema
from execkit.ledger._sqlite.files import create_owner_only
from execkit.ledger._sqlite.tx import SqliteTx

__all__ = ["Migration", "read_version", "upgrade"]


@attrs.frozen
class Migration:
    """What opening (or `migrate`) did to the schema; `backup_path` is None for a new file."""

    from_version: int
    to_version: int
    backup_path: Path | None

    def to_dict(self) -> dict[str, Any]:
        return to_json(self)


def read_version(conn: sqlite3.Connection, path: Path) -> int:
    """The schema version of the database `conn` is open on: 0 for an empty file;
    StorageError for an SQLite file of another program. Reads only."""
    names = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    if "schema_version" not in names:
        if names:
            raise StorageError(f"{path} is an SQLite file but not an execkit ledger")
        return 0
    version = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()[0]
    return int(version or 0)


def upgrade(conn: sqlite3.Connection, path: Path, busy_timeout_s: float) -> Migration | None:
    """Bring the file to SCHEMA_VERSION in one transaction, backing it up first (see the
    module docstring); None when it was already current, nothing written. sqlite3 errors
    propagate, with the transaction rolled back."""
    with contextlib.ExitStack() as stack:
        conn.execute("BEGIN IMMEDIATE")
        stack.callback(_end_transaction, conn)
        # Re-read under the write lock: another process may have migrated (or created
        # the file) since the caller read its version, and nobody can write from here on,
        # so the backup below is exactly the state the migration starts from.
        current = read_version(conn, path)
        if current > schema.SCHEMA_VERSION:
            raise SchemaTooNew(f"{path} was upgraded to schema {current} meanwhile")
        if current == schema.SCHEMA_VERSION:
            return None
        backup = _backup(path, current, busy_timeout_s) if current > 0 else None
        now = time.time()
        steps = range(current + 1, schema.SCHEMA_VERSION + 1)
        for version in steps:
            for statement in schema.SCHEMA_STEPS[version]:
                conn.execute(statement)
        # The data steps read and write with today's code (`SqliteTx`), which knows only
        # the current schema: they run once every statement has been applied.
        for version in steps:
            data_step = _DATA_STEPS.get(version)
            if data_step is not None:
                data_step(conn, now)
            conn.execute(
                "INSERT INTO schema_version (version, applied_at) VALUES (?, ?)",
                (version, now),
            )
        conn.execute("COMMIT")
    return Migration(from_version=current, to_version=schema.SCHEMA_VERSION, backup_path=backup)


def _end_transaction(conn: sqlite3.Connection) -> None:
    if conn.in_transaction:
        conn.execute("ROLLBACK")


def _backup_path_for(path: Path, version: int) -> Path:
    stamp = time.strftime("%Y%m%dT%H%M%S")
    candidate = path.with_name(f"{path.name}.schema-v{version}.{stamp}.bak")
    n = 1
    while candidate.exists():
        candidate = path.with_name(f"{path.name}.schema-v{version}.{stamp}-{n}.bak")
        n += 1
    return candidate


def _backup(path: Path, version: int, busy_timeout_s: float) -> Path:
    """Copy the file to a new owner-only backup beside it. Called under the migration's
    write lock; it reads through a second connection because SQLite cannot back up from a
    connection inside a write transaction, and readers are not blocked by that lock."""
    backup = _backup_path_for(path, version)
    create_owner_only(backup)
    source = sqlite3.connect(path, timeout=busy_timeout_s)
    try:
        target = sqlite3.connect(backup)
        try:
            source.backup(target)
        finally:
            target.close()
    except BaseException:
        backup.unlink(missing_ok=True)
        raise
    finally:
        source.close()
    return backup


def _after_schema_3(conn: sqlite3.Connection, now: float) -> None:
    """Version 3's data step: the ledger's identity, a summary for every task built from
    its history, and a fresh lease for runs a v2 ledger saw running (their owners were
    tracked by pid; from now on they must renew, or they are abandoned)."""
    conn.execute(
        "INSERT OR IGNORE INTO ledger_meta (key, value) VALUES ('ledger_id', ?)",
        (_new_id(),),
    )
    conn.execute(
        "INSERT INTO run_extras (run_id, lease_expires_at, lease_s) "
        "SELECT id, ?, ? FROM runs WHERE status = 'running'",
        (now + DEFAULT_LEASE_S, DEFAULT_LEASE_S),
    )
    tx = SqliteTx(conn)
    for (task_id,) in conn.execute("SELECT id FROM tasks ORDER BY seq").fetchall():
        history = [attempt_from_run(run) for run in tx.runs(task_id)]
        try:
            summary = summarize(history)
        except Exception:  # a broken history keeps no summary; `db check` reports it
            continue
        tx.write_summary(task_id, summary)


# The data a version's statements cannot write by themselves, by version.
def _after_schema_6(conn: sqlite3.Connection, _now: float) -> None:
    """Version 6's data step: the lane events so far keep folding with the lanes' rules of
    version 1 (`LaneConfigHistory.upgraded`), so `db check` recomputes them as stored."""
    row = conn.execute("SELECT value FROM ledger_meta WHERE key = ?", (LANE_CONFIG_META_KEY,))
    found = row.fetchone()
    (last_seq,) = conn.execute("SELECT coalesce(max(seq), 0) FROM lane_events").fetchone()
    history = LaneConfigHistory.from_stored(None if found is None else str(found[0]))
    upgraded = history.upgraded(int(last_seq))
    if upgraded.epochs:
        conn.execute(
            "INSERT INTO ledger_meta (key, value) VALUES (?, ?) "
            "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
            (LANE_CONFIG_META_KEY, upgraded.to_stored()),
        )


_DATA_STEPS: dict[int, Callable[[sqlite3.Connection, float], None]] = {
    3: _after_schema_3,
    6: _after_schema_6,
}


def _new_id() -> str:
    import uuid  # only a new ledger needs an id: opening one does not import uuid

    return uuid.uuid4().hex
