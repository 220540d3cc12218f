"""The SQLite store: one connection to one ledger file, its transactions, and what opening
it creates, migrates or refuses.

One connection per store; each process opens its own, and the threads of one owner (a
dispatcher renewing its runs' leases while they run) share it under a lock held for each
transaction. The database runs in WAL mode with a busy timeout, and every write is one
`BEGIN IMMEDIATE` transaction, so two processes admitting runs on one task serialise on the
write lock (ADR 0033: the count is checked in the transaction that starts the run; a failed
transaction consumes no attempt). A busy or failing database is a StorageError with the
transaction rolled back. The statements are `tx.py`'s; the schema `schema.py`'s and its
migrations `migrate.py`'s.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from execkit._errors import InvalidInput, SchemaTooNew, StorageError
from execkit.ledger._core import StaleCopy
from execkit.ledger._model import CAPABILITIES, user_name
from execkit.ledger._sqlite import check, migrate, schema
from execkit.ledger._sqlite.files import prepare_file
from execkit.ledger._sqlite.tx import SqliteTx

__all__ = ["SqliteStore"]

# How often a waiting dispatcher reads the wake number (`wait_for_wake`): one small read,
# a fraction of a millisecond, five times a second.
_WAKE_POLL_S = 0.2


def _not_text(exc: UnicodeEncodeError) -> InvalidInput:
    # A looked-up id from a command line that was not UTF-8 (lone surrogates): no row can
    # match it and SQLite cannot even bind it; the caller's input, not the ledger, is wrong.
    return InvalidInput(f"a value is not valid UTF-8 text (character {exc.start})")


class SqliteStore:
    """The SQLite backend: one connection, its transactions, schema and migrations.

    `create=True` creates a ledger at a path where nothing exists (its file 0600, a new
    folder 0700); an existing file is never re-initialised, an empty one included (it may
    be a truncated ledger): only `init=True` (`execkit db init`) makes an empty file a
    ledger. `upgrade=True` migrates an older schema after writing a backup
    (`self.migration`); `upgrade=False` opens without writing anything, and then only
    inspection works until the schema is current. A newer schema is refused with
    `SchemaTooNew`, nothing written.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        create: bool = True,
        upgrade: bool = True,
        init: bool = False,
        busy_timeout_s: float = 30.0,
    ) -> None:
        self.path = Path(path)
        self.migration: migrate.Migration | None = None
        self._busy_timeout_s = busy_timeout_s
        self._outdated = False
        self._tables_checked = False
        # One connection, shared by the threads of one owner (a dispatcher renewing its
        # runs' leases while they run): each transaction holds this lock for its length.
        self._lock = threading.RLock()
        self._closing = threading.Event()
        prepare_file(self.path, create=create, init=init)
        try:
            self._conn = sqlite3.connect(
                self.path, timeout=busy_timeout_s, isolation_level=None, check_same_thread=False
            )
        except sqlite3.Error as exc:
            raise StorageError(f"cannot open ledger database {self.path}: {exc}") from exc
        try:
            self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout_s * 1000)}")
            self._conn.execute("PRAGMA foreign_keys = ON")
            found = self._read_version()  # reads only: a newer schema must stay untouched
            if found > schema.SCHEMA_VERSION:
                raise SchemaTooNew(
                    f"{self.path} has schema version {found}, newer than this execkit "
                    f"knows ({schema.SCHEMA_VERSION}); upgrade execkit, or restore the backup "
                    "taken before the upgrade"
                )
            if upgrade:
                self.migration = self._bring_up(found)
            else:
                self._outdated = found < schema.SCHEMA_VERSION
        except sqlite3.OperationalError as exc:  # locked past the busy timeout, I/O, ...
            self._conn.close()
            raise StorageError(f"cannot open ledger database {self.path}: {exc}") from exc
        except sqlite3.DatabaseError as exc:  # not an SQLite file at all
            self._conn.close()
            raise StorageError(f"{self.path} is not a usable ledger database: {exc}") from exc
        except BaseException:
            self._conn.close()
            raise

    def close(self) -> None:
        """Close the file; a wait in progress returns what it last read."""
        self._closing.set()
        with self._lock:
            self._conn.close()

    def wait_for_wake(self, seen: int, timeout_s: float, read: Callable[[], int]) -> int:
        """SQLite has no notifications: the wake number is read every `_WAKE_POLL_S`
        (a one-row read), until it differs from `seen`, `timeout_s` has passed or the
        ledger is closed (the number last read: a dispatcher stopping closes its ledger
        while its waker waits)."""
        deadline = time.monotonic() + timeout_s
        while True:
            current = read()
            left = deadline - time.monotonic()
            if current != seen or left <= 0:
                return current
            if self._closing.wait(min(_WAKE_POLL_S, left)):
                return current

    def _current(self) -> None:
        if self._outdated:
            raise StorageError(
                f"{self.path} has schema version {self._read_version()} and this command "
                f"needs {schema.SCHEMA_VERSION}: run `execkit db migrate` (it backs the file up "
                "first)"
            )

    @contextlib.contextmanager
    def write(
        self, *, remembered: bool = False, after: StaleCopy | None = None
    ) -> Iterator[SqliteTx]:
        """One write transaction: BEGIN IMMEDIATE takes the write lock before any read.
        (`remembered` and `after` are ignored: every read is local, there is no round trip
        to save, so no copy, and one wait, the busy timeout at BEGIN.)"""
        with self._lock:
            yield from self._write()

    def _write(self) -> Iterator[SqliteTx]:
        self._current()
        try:
            self._conn.execute("BEGIN IMMEDIATE")
        except sqlite3.Error as exc:
            raise StorageError(f"ledger {self.path} is busy or unwritable: {exc}") from exc
        if not self._tables_checked:
            self._check_tables()
        try:
            yield SqliteTx(self._conn)
        except BaseException as exc:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            if isinstance(exc, sqlite3.Error):
                raise StorageError(f"ledger write failed ({self.path}): {exc}") from exc
            if isinstance(exc, UnicodeEncodeError):
                raise _not_text(exc) from None
            raise
        try:
            self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            if self._conn.in_transaction:
                self._conn.execute("ROLLBACK")
            raise StorageError(f"ledger commit failed ({self.path}): {exc}") from exc

    def _check_tables(self) -> None:
        """Inside the first write transaction, before anything is written: a file missing
        a table its schema needs (a hand edit, a bad restore) takes no write at all, or a
        task could be created in a ledger that can never run it (`db check` names what is
        missing). Checked once per store: tables do not vanish under execkit."""
        try:
            missing = check.missing_tables(self._conn, self.path)
        except sqlite3.Error as exc:
            self._conn.execute("ROLLBACK")
            raise StorageError(f"ledger read failed ({self.path}): {exc}") from exc
        if missing:
            self._conn.execute("ROLLBACK")
            raise StorageError(
                f"{self.path} is not a usable ledger: table(s) {', '.join(missing)} missing; "
                "nothing was written (`execkit db check` lists what is wrong; restore a backup)"
            )
        self._tables_checked = True

    @contextlib.contextmanager
    def read(self) -> Iterator[SqliteTx]:
        """One read transaction, so several SELECTs see one snapshot."""
        with self._lock:
            yield from self._read()

    def _read(self) -> Iterator[SqliteTx]:
        self._current()
        try:
            self._conn.execute("BEGIN")
            try:
                yield SqliteTx(self._conn)
            finally:
                if self._conn.in_transaction:
                    self._conn.execute("COMMIT")
        except sqlite3.Error as exc:
            raise StorageError(f"ledger read failed ({self.path}): {exc}") from exc
        except UnicodeEncodeError as exc:
            raise _not_text(exc) from None

    def schema_version(self) -> int:
        return self._read_version()

    def location(self) -> str:
        return str(self.path.resolve())

    def owner(self) -> str | None:
        """The operating-system user who owns the ledger file."""
        try:
            uid = self.path.stat().st_uid
        except OSError:
            return None
        return user_name(uid)

    def _read_version(self) -> int:
        return migrate.read_version(self._conn, self.path)

    def _bring_up(self, found: int) -> migrate.Migration | None:
        """WAL mode, then the schema brought from `found` to SCHEMA_VERSION (a backup
        first); None when it was already current."""
        if self._conn.execute("PRAGMA journal_mode").fetchone()[0] != "wal":
            self._conn.execute("PRAGMA journal_mode = WAL")
        if found < schema.SCHEMA_VERSION:
            return migrate.upgrade(self._conn, self.path, self._busy_timeout_s)
        return None

    def upgrade(self) -> migrate.Migration | None:
        """What `upgrade=True` does on open, for a store opened without it: bring an older
        schema to SCHEMA_VERSION after writing a backup beside the file. None when it was
        already current (nothing written). SchemaTooNew when it is newer; StorageError
        when the file is busy past the timeout, with nothing migrated."""
        with self._lock:
            try:
                found = self._read_version()
                if found > schema.SCHEMA_VERSION:
                    raise SchemaTooNew(
                        f"{self.path} has schema version {found}, newer than this execkit "
                        f"knows ({schema.SCHEMA_VERSION})"
                    )
                done = self._bring_up(found)
            except sqlite3.Error as exc:
                raise StorageError(f"cannot migrate ledger database {self.path}: {exc}") from exc
            self._outdated = False
            if done is not None:
                self.migration = done
            return done

    def storage_problems(self) -> list[str]:
        """The file's integrity, then every row outside its domain, each named
        (`check.py`)."""
        return check.storage_problems(self._conn, self.path)

    def info(self) -> dict[str, Any]:
        """Facts for `execkit db status` (JSON-safe); works on an older schema too."""
        try:
            (tasks,) = self._conn.execute("SELECT COUNT(*) FROM tasks").fetchone()
            (runs,) = self._conn.execute("SELECT COUNT(*) FROM runs").fetchone()
            (running,) = self._conn.execute(
                "SELECT COUNT(*) FROM runs WHERE status = 'running'"
            ).fetchone()
            (mode,) = self._conn.execute("PRAGMA journal_mode").fetchone()
        except sqlite3.Error as exc:
            raise StorageError(f"ledger read failed ({self.path}): {exc}") from exc
        version = self._read_version()
        return {
            "path": str(self.path),
            "schema_version": version,
            "supported_schema_version": schema.SCHEMA_VERSION,
            "needs_migration": version < schema.SCHEMA_VERSION,
            "journal_mode": mode,
            "tasks": tasks,
            "runs": runs,
            "running_runs": running,
            "capabilities": sorted(CAPABILITIES),
        }
