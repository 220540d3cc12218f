"""The PostgreSQL store: one connection to one server, its transactions, and what opening
a ledger there creates, migrates or refuses.

One connection per store, shared by the threads of one owner (a dispatcher renewing its
runs' leases from a second thread): each transaction holds the store's lock for its length.
Writes run at READ COMMITTED, in pipeline mode, BEGIN sent with the first reads and COMMIT
with the last writes; reads run at
REPEATABLE READ, READ ONLY: one snapshot per read transaction (the locks a write takes are
`tx.py`'s).

A failed transaction rolls back and consumes nothing: a connection that breaks in the
middle (the server restarted, the backend was terminated) is a `StorageError` saying the
transaction was rolled back; one that breaks in the batch that commits says the outcome is
unknown,
and replaying the request key after the reconnect returns the run if it was admitted. A
broken connection is replaced at the start of the next transaction, before anything is
sent. A lock not granted within the lock timeout is a StorageError, nothing written.
Passwords never leave this backend: `location()` and every message carry the URL without
its password, and a server's error text has it masked.

psycopg (3) is imported when a store is opened, never when this module is imported.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from execkit._errors import InvalidInput, NotFound, SchemaTooNew, StorageError
from execkit._redact import redact
from execkit.ledger._model import CAPABILITIES
from execkit.ledger._postgres import check, migrate, schema
from execkit.ledger._postgres.tx import PostgresTx
from execkit.ledger._postgres.url import INSTALL_HINT, is_postgres_url, password_of, public_url

if TYPE_CHECKING:
    import psycopg

__all__ = ["PostgresStore"]


def _unasked(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server sent something nobody asked for yet (no round trip): a closed
    connection's farewell or end of stream, or, in a pipeline, an answer it sent early."""
    import select

    try:
        return bool(select.select([conn.fileno()], [], [], 0)[0])
    except (OSError, ValueError):
        return True


class PostgresStore:
    """The PostgreSQL backend: one connection, its transactions, schema and migrations.

    `url` is a libpq URL (`postgresql://user[:password]@host[:port]/db?...`); the ledger's
    tables live in the connection's current schema (the first of its `search_path`).
    `create=True` builds the schema in a database (or schema) that has no ledger; a
    database whose current schema holds tables of the same names but no ledger is refused.
    `upgrade=True` migrates an older schema (additive, one transaction under an advisory
    lock) and records the backup command in `self.migration`; without it an older schema
    refuses every transaction, naming the `pg_dump` command to run first. A newer schema is
    `SchemaTooNew`, nothing written. One connection, shared by the threads of one owner: each
    transaction holds the store's lock for its length.
    """

    def __init__(
        self,
        url: str,
        *,
        create: bool = True,
        upgrade: bool = False,
        connect_timeout_s: float = 10.0,
        lock_timeout_s: float = 30.0,
    ) -> None:
        if not is_postgres_url(url):
            raise InvalidInput(
                f"a PostgreSQL ledger is named by a postgresql:// URL, got {redact(str(url))!r}",
                field="url",
            )
        try:
            import psycopg  # noqa: F401  (the driver is an optional extra)
        except ImportError:
            raise StorageError(
                f"a postgresql:// ledger needs psycopg, which is not installed: {INSTALL_HINT}"
            ) from None
        self._url = url
        self._secret = password_of(url)
        self._where = public_url(url)
        self._connect_timeout_s = connect_timeout_s
        self._lock_timeout_s = lock_timeout_s
        self._lock = threading.RLock()
        self._conn: psycopg.Connection[Any] | None = None
        self._outdated: int | None = None  # the older schema found, until migrated
        self._owner: str | None = None
        self._schema = ""
        self.migration: migrate.PostgresMigration | None = None
        with self._lock:
            self._open(create=create, upgrade=upgrade)

    def _clean(self, exc: BaseException) -> str:
        """An error's text for a message: one line, the password and any secret masked."""
        text = " ".join(str(exc).split()) or type(exc).__name__
        if self._secret:
            text = text.replace(self._secret, "[REDACTED]")
        return redact(text, [self._secret] if self._secret else [])

    def _error(self, what: str, exc: BaseException) -> StorageError:
        return StorageError(f"{what} (ledger {self._where}): {self._clean(exc)}")

    def _connect(self) -> psycopg.Connection[Any]:
        import psycopg
        from psycopg.conninfo import conninfo_to_dict

        try:
            given = conninfo_to_dict(self._url)
        except psycopg.Error as exc:
            raise InvalidInput(
                f"not a usable PostgreSQL URL {self._where}: {self._clean(exc)}", field="url"
            ) from None
        extra: dict[str, Any] = {}
        if "connect_timeout" not in given:
            extra["connect_timeout"] = max(1, round(self._connect_timeout_s))
        if "application_name" not in given:
            extra["application_name"] = "execkit"
        # A server host that vanishes (no reset, no reply) is noticed in about a minute,
        # not after the kernel's two hours (TCP only; a Unix socket ignores these).
        for name, value in (("keepalives_idle", 30), ("keepalives_interval", 10)):
            if name not in given and "keepalives" not in given:
                extra[name] = value
        try:
            conn = psycopg.connect(self._url, autocommit=True, **extra)
        except psycopg.Error as exc:
            raise self._error("cannot connect to the PostgreSQL server", exc) from None
        try:
            conn.execute(f"SET lock_timeout = {int(self._lock_timeout_s * 1000)}")
            # A client that stops in the middle of a transaction must not hold a task's lock
            # forever: every transaction here is a few statements long.
            conn.execute("SET idle_in_transaction_session_timeout = 60000")
        except psycopg.Error as exc:
            conn.close()
            raise self._error("cannot set up the PostgreSQL session", exc) from None
        return conn

    def _drop(self) -> None:
        if self._conn is not None:
            with contextlib.suppress(Exception):
                self._conn.close()
        self._conn = None

    def _usable(self) -> psycopg.Connection[Any]:
        conn = self._conn
        if conn is None or conn.closed or conn.broken:
            self._drop()
            conn = self._conn = self._connect()
        return conn

    def _begin(self, statement: str) -> psycopg.Connection[Any]:
        """A connection with `statement` (BEGIN ...) run on it. A connection the server
        dropped since the last transaction (a restart, a terminated backend) is replaced
        once: nothing has been sent in this transaction yet, so nothing can be doubled."""
        import psycopg

        conn = self._usable()
        try:
            conn.execute(statement)
            return conn
        except psycopg.OperationalError:
            self._drop()
        conn = self._usable()
        try:
            conn.execute(statement)
        except psycopg.Error as exc:
            self._drop()
            raise self._error("cannot start a transaction", exc) from None
        return conn

    def _fresh(self) -> psycopg.Connection[Any]:
        """A connection to start a write transaction on, without a round trip of its own.
        One the server closed since the last transaction (a restart, a terminated backend)
        has something to read while idle (its farewell, or the end of the stream): it is
        replaced before anything is sent, so nothing can be doubled. (Anything else unasked
        for, a notice say, costs a reconnection, never a write.)"""
        conn = self._usable()
        if _unasked(conn):
            self._drop()
            conn = self._usable()
        return conn

    def _aborted(self, xid: int | None) -> bool:
        """Whether transaction `xid`, whose connection broke in its COMMIT batch, is known
        to have been rolled back: asked on a new connection (a backend that is still
        ending is waited for, a bounded number of times). False when it committed or
        nothing can be known (no id, the server unreachable)."""
        import psycopg

        if xid is None:
            return False
        self._drop()
        try:
            conn = self._usable()
            for _ in range(100):
                row = conn.execute("SELECT txid_status(%s)", (xid,)).fetchone()
                status = None if row is None else row[0]
                if status != "in progress":
                    return status == "aborted"
                conn.execute("SELECT pg_sleep(0.01)")  # its backend is still ending
        except (psycopg.Error, StorageError):
            self._drop()
        return False

    def _rollback(self, conn: psycopg.Connection[Any]) -> None:
        import psycopg
        from psycopg import pq

        if conn.broken or conn.closed:
            self._drop()
            return
        if conn.info.transaction_status == pq.TransactionStatus.IDLE:
            return  # the ROLLBACK went with the pipeline's last batch
        try:
            conn.execute("ROLLBACK")
        except psycopg.Error:
            self._drop()

    def _failure(self, conn: psycopg.Connection[Any], exc: BaseException) -> StorageError:
        """A psycopg error inside a transaction, as the StorageError to raise."""
        import psycopg

        if isinstance(exc, psycopg.errors.LockNotAvailable):
            return self._error(
                f"ledger busy: a lock was not granted within {self._lock_timeout_s:g}s; "
                "nothing was written",
                exc,
            )
        if isinstance(exc, psycopg.OperationalError) or conn.broken:
            return self._error(
                "the connection to the PostgreSQL server failed in the middle of a "
                "transaction; it was rolled back and nothing was written",
                exc,
            )
        if isinstance(exc, psycopg.IntegrityError):
            return self._error("the database refused the write; nothing was written", exc)
        return self._error("ledger transaction failed; nothing was written", exc)

    @contextlib.contextmanager
    def _transaction(self, *, write: bool, current: bool = True) -> Iterator[PostgresTx]:
        import psycopg

        with self._lock:
            if current:
                self._current()
            if not write:
                conn = self._begin("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
                try:
                    yield PostgresTx(conn, write=False)
                    conn.execute("COMMIT")
                except BaseException as exc:
                    self._rollback(conn)
                    if isinstance(exc, psycopg.Error):
                        raise self._failure(conn, exc) from None
                    raise
                return
            # BEGIN goes with the first reads, and COMMIT with the last writes (two round
            # trips for an admission, `tx.py`). A failure before the last batch is a
            # certain rollback; in it, a write the server refused skips the COMMIT after
            # it (a pipeline stops at its first error), so only a connection lost during
            # that batch leaves the outcome unknown.
            stack = contextlib.ExitStack()  # the pipeline of the connection in use

            def opener(*, batched: bool) -> tuple[psycopg.Connection[Any], psycopg.Pipeline]:
                with contextlib.suppress(psycopg.Error):
                    stack.close()  # again: the connection was dropped in the first batch
                if batched:
                    conn = self._fresh()
                else:
                    conn = self._begin("BEGIN ISOLATION LEVEL READ COMMITTED")
                pipeline = stack.enter_context(conn.pipeline())
                if batched:
                    conn.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
                return conn, pipeline

            tx = PostgresTx(None, write=True, opener=opener)
            committing = False
            try:
                try:
                    yield tx
                except BaseException:
                    # A refusal: the ROLLBACK goes in the batch that ends the pipeline
                    # (after a failed statement the server skips it: `_rollback`).
                    if tx._connection is not None:
                        with contextlib.suppress(psycopg.Error):
                            tx._connection.execute("ROLLBACK")
                    raise
                last = tx._connection
                if last is None:
                    return  # nothing was sent
                if _unasked(last) and tx._pipeline is not None:
                    # The server spoke before this batch asked: a terminated backend's
                    # farewell, or a refused write. One batch without COMMIT first, so
                    # that such a failure is a certain rollback, not an unknown.
                    tx._pipeline.sync()
                committing = True
                last.execute("COMMIT")
                stack.close()  # the last batch, and its answers
            except BaseException as exc:
                with contextlib.suppress(psycopg.Error):
                    stack.close()
                used = tx._connection
                if used is None:
                    raise
                broken = used.broken
                self._rollback(used)
                if not isinstance(exc, psycopg.Error):
                    raise
                if committing and broken and self._aborted(tx.xid):
                    raise self._failure(used, exc) from None
                if committing and broken:
                    raise self._error(
                        "the connection to the PostgreSQL server failed while committing: the "
                        "transaction may or may not have been applied (replaying its request "
                        "key returns what was done)",
                        exc,
                    ) from None
                raise self._failure(used, exc) from None

    def write(self) -> contextlib.AbstractContextManager[PostgresTx]:
        """One write transaction (READ COMMITTED; admissions lock their task row)."""
        return self._transaction(write=True)

    def read(self) -> contextlib.AbstractContextManager[PostgresTx]:
        """One read transaction (REPEATABLE READ, READ ONLY): one snapshot."""
        return self._transaction(write=False)

    def close(self) -> None:
        with self._lock:
            self._drop()

    def _open(self, *, create: bool, upgrade: bool) -> None:
        with self._transaction(write=False, current=False) as tx:
            found = self._read_version(tx)
        if found > schema.SCHEMA_VERSION:
            self._drop()
            raise SchemaTooNew(
                f"the ledger at {self._where} has schema version {found}, newer than this "
                f"execkit knows ({schema.SCHEMA_VERSION}); upgrade execkit, or restore the dump "
                "taken before the upgrade"
            )
        if found == 0 and not create:
            self._drop()
            raise NotFound(f"no ledger at {self._where} (schema {self._schema or '?'})")
        if found == 0 or (found < schema.SCHEMA_VERSION and upgrade):
            self.migration = self._upgrade()
        elif found < schema.SCHEMA_VERSION:
            self._outdated = found
        if self._outdated is None:
            with self._transaction(write=False, current=False) as tx:
                self._owner = tx.meta("owner")

    def _read_version(self, tx: PostgresTx) -> int:
        version, self._schema = migrate.read_version(tx, self._where)
        return version

    def backup_command(self, version: int | None = None) -> str:
        """The exact `pg_dump` command that backs this ledger up (password left out: libpq
        reads it from PGPASSWORD or ~/.pgpass)."""
        shown = version if version is not None else self._outdated or schema.SCHEMA_VERSION
        return migrate.backup_command(self._schema, self._where, shown)

    def _current(self) -> None:
        if self._outdated is not None:
            raise StorageError(
                f"the ledger at {self._where} has schema version {self._outdated} and this "
                f"execkit needs {schema.SCHEMA_VERSION}. execkit cannot copy a server's database: "
                f"back it up first with `{self.backup_command(self._outdated)}`, then migrate "
                "it with `execkit db migrate --db URL --backed-up`"
            )

    def _upgrade(self) -> migrate.PostgresMigration | None:
        with self._transaction(write=True, current=False) as tx:
            done = migrate.upgrade(tx, self._where)
            if done is None:  # already current: it wrote nothing, whatever COMMIT does
                self._outdated = None
        self._outdated = None
        return done

    def upgrade(self) -> migrate.PostgresMigration | None:
        """What `upgrade=True` does on open, for a store opened without it: bring an older
        schema to SCHEMA_VERSION (the caller took the backup `backup_command` names).
        None when it was already current, nothing written."""
        with self._lock:
            done = self._upgrade()
            with self._transaction(write=False, current=False) as tx:
                self._owner = tx.meta("owner")  # not read while the schema was outdated
        if done is not None:
            self.migration = done
        return done

    def schema_version(self) -> int:
        with self._transaction(write=False, current=False) as tx:
            return self._read_version(tx)

    def location(self) -> str:
        return self._where

    def owner(self) -> str | None:
        """The operating-system user who created the ledger (stored at creation)."""
        return self._owner

    def storage_problems(self) -> list[str]:
        """Missing tables, then every row outside its domain, each named (`check.py`)."""
        problems: list[str] = []
        try:
            with self._transaction(write=False, current=False) as tx:
                for problem in check.problems_in(tx):
                    problems.append(problem)
        except StorageError as exc:
            problems.append(f"storage: {exc.message}")
        return problems

    def info(self) -> dict[str, Any]:
        """Facts for an operator's status view (JSON-safe); works on an older schema too."""
        with self._transaction(write=False, current=False) as tx:
            version = self._read_version(tx)
            counts = tx._one(
                "SELECT (SELECT COUNT(*) FROM tasks), (SELECT COUNT(*) FROM runs), "
                "(SELECT COUNT(*) FROM runs WHERE status = 'running')"
            )
            server = tx._one("SHOW server_version")
        assert counts is not None and server is not None
        return {
            "url": self._where,
            "schema": self._schema,
            "schema_version": version,
            "supported_schema_version": schema.SCHEMA_VERSION,
            "needs_migration": version < schema.SCHEMA_VERSION,
            "server_version": str(server[0]),
            "tasks": int(counts[0]),
            "runs": int(counts[1]),
            "running_runs": int(counts[2]),
            "capabilities": sorted(CAPABILITIES),
        }
