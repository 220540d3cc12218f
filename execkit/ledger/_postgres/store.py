"""The PostgreSQL store: a small pool of connections to one server, its transactions, and
what opening a ledger there creates, migrates or refuses.

A store's threads (a dispatcher renewing its runs' leases from a second thread, the worker
threads of `execkit serve`) each take a connection of their own for one transaction and
give it back: at most `pool_size` at once, opened when first needed and kept open while
idle, so threads do not wait on one another's transactions, only on the database's own
locks. A caller's whole wait, the pool's and every lock's, is bounded by the one lock
timeout (issue #50): a deadline taken when its call begins (carried to the transaction
run again after a stale copy); a thread that finds every connection taken waits for one
until it, and every statement that asks for a lock is given what is left of it (`tx.py`).
Past it: a StorageError saying the ledger is busy, nothing written.
Writes run at READ COMMITTED, on libpq's pipeline (`wire.py`: one send per batch, statements
prepared once per connection), BEGIN sent with the first reads and COMMIT with the last
writes; reads run at
REPEATABLE READ, READ ONLY: one snapshot per read transaction (the locks a write takes are
`tx.py`'s).

A failed transaction rolls back and consumes nothing: a connection that breaks before
COMMIT is sent (the server restarted, the backend was terminated) is a `StorageError`
saying the transaction was rolled back. Once COMMIT is sent, any failure before its answer
is read leaves the outcome to the server (issue #50): COMMIT's own answer when it came
back, else the transaction's status asked on a new connection (`txid_status`). A commit
is answered as one (the block's result, as a replay by its key would return it), a
rollback only when the server says so, and "may or may not have been applied" only when
it cannot be asked; replaying the request key then returns what was done. A
broken connection is replaced at the start of the next transaction, before anything is
sent. A lock not granted within the lock timeout is a StorageError, nothing written.
Passwords never leave this backend: `location()` and every message carry the URL without
its password, and a server's error text has it masked.

psycopg (3) is imported when a store is opened, never when this module is imported.
"""

from __future__ import annotations

import contextlib
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from execkit._errors import InvalidInput, NotFound, SchemaTooNew, StorageError
from execkit._redact import redact
from execkit.ledger._core import StaleCopy
from execkit.ledger._model import CAPABILITIES, user_name
from execkit.ledger._postgres import check, migrate, schema
from execkit.ledger._postgres.copies import Copies
from execkit.ledger._postgres.tx import PostgresTx
from execkit.ledger._postgres.url import INSTALL_HINT, is_postgres_url, password_of, public_url
from execkit.ledger._postgres.wake import WakeListener
from execkit.ledger._postgres.wire import Answer, Wire, ready

if TYPE_CHECKING:
    import psycopg

__all__ = ["DEFAULT_POOL_SIZE", "MAX_POOL_SIZE", "PostgresStore"]

DEFAULT_POOL_SIZE = 8
MAX_POOL_SIZE = 256


def _lost(exc: BaseException) -> bool:
    """Whether `exc` says the connection failed rather than a statement: the client's own
    error (the stream ended, an answer missing: no SQLSTATE), a connection exception (08)
    or the server ending the session (57P: shut down, terminated)."""
    import psycopg

    if not isinstance(exc, psycopg.Error):
        return False
    code = exc.sqlstate
    if code is None:
        return isinstance(exc, psycopg.OperationalError)
    return code.startswith(("08", "57P"))


def _unasked(conn: psycopg.Connection[Any]) -> bool:
    """Whether the server sent something nobody asked for yet (no round trip): a closed
    connection's farewell or end of stream, or, in a pipeline, an answer it sent early."""
    try:
        return ready(conn.fileno(), timeout_ms=0)
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
    `SchemaTooNew`, nothing written. A schema missing a table or column of its version, or
    a role lacking a privilege every write needs, is found at open (one query,
    `check.fitness`) and refuses every write transaction with a StorageError naming it and
    the fix. Thread-safe: each transaction runs on a connection of its own from a pool of
    at most `pool_size` (1..256; InvalidInput otherwise), see the module docstring.
    `lock_timeout_s` bounds a caller's whole wait, read on `clock` (monotonic seconds).
    """

    def __init__(
        self,
        url: str,
        *,
        create: bool = True,
        upgrade: bool = False,
        connect_timeout_s: float = 10.0,
        lock_timeout_s: float = 30.0,
        pool_size: int = DEFAULT_POOL_SIZE,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if (
            isinstance(pool_size, bool)
            or not isinstance(pool_size, int)
            or not 1 <= pool_size <= MAX_POOL_SIZE
        ):
            raise InvalidInput(
                f"pool_size must be a whole number in 1..{MAX_POOL_SIZE}, got {pool_size!r}",
                field="pool_size",
            )
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
        self._clock = clock  # what the deadlines are read on
        # `_lock` guards the schema state (open, migrate); `_pool` the idle connections.
        self._lock = threading.RLock()
        self._pool = threading.Condition(threading.Lock())
        self._pool_size = pool_size
        self._idle: list[psycopg.Connection[Any]] = []
        self._opened = 0  # connections open now, idle or lent
        self._closed = False
        self._outdated: int | None = None  # the older schema found, until migrated
        self._owner: str | None = None
        self._schema = ""
        self._fitness = check.Fitness(role="", missing=(), lacking=(), grants=())
        self.migration: migrate.PostgresMigration | None = None
        # The rows its admissions and results left (`copies.py`): the next one on the
        # same task decides on its copy, in one round trip, when `write(remembered=True)`.
        self._copies = Copies()
        self._listener: WakeListener | None = None  # opened by the first wait_for_wake
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
            denied = re.search(r'permission denied for database "([^"]+)"', str(exc))
            if denied is not None:
                role = given.get("user") or user_name(os.geteuid())
                raise self._error(
                    f"the role {role} lacks CONNECT on database {denied[1]}; an administrator "
                    f"grants it: GRANT CONNECT ON DATABASE {denied[1]} TO {role}",
                    exc,
                ) from None
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

    def _deadline(self, after: StaleCopy | None = None) -> float:
        """When the wait of a caller who starts now ends, on the store's clock: the lock
        timeout from now, or, for a transaction that repeats one that raised `after`, the
        one that began its call (a caller's whole wait is one timeout)."""
        if after is not None and after.deadline is not None:
            return after.deadline
        return self._clock() + self._lock_timeout_s

    def _left_ms(self, deadline: float) -> float:
        """What is left of a caller's wait, in milliseconds (none: 0)."""
        return max(0.0, deadline - self._clock()) * 1000

    def _take(self, deadline: float) -> psycopg.Connection[Any] | None:
        """An idle connection, or None when a new one may be opened; waits (until the
        caller's `deadline`) while all `pool_size` are lent."""
        with self._pool:
            while True:
                if self._closed:
                    raise StorageError(f"the ledger {self._where} is closed")
                if self._idle:
                    return self._idle.pop()
                if self._opened < self._pool_size:
                    self._opened += 1
                    return None
                left = deadline - self._clock()
                if left <= 0:
                    raise StorageError(
                        f"ledger busy: none of the {self._pool_size} connections to "
                        f"{self._where} was free within {self._lock_timeout_s:g}s; "
                        "nothing was written"
                    )
                self._pool.wait(left)

    def _give_back(self, conn: psycopg.Connection[Any] | None) -> None:
        """Return a lent connection (None: one that was dropped) and wake a waiter."""
        with self._pool:
            if conn is not None and not (conn.closed or conn.broken) and not self._closed:
                self._idle.append(conn)
            else:
                self._opened -= 1
                if conn is not None:
                    with contextlib.suppress(Exception):
                        conn.close()
            self._pool.notify()

    @staticmethod
    def _discard(conn: psycopg.Connection[Any] | None) -> None:
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()

    def _begin(self, statement: str, deadline: float) -> psycopg.Connection[Any]:
        """A connection of the pool's with `statement` (BEGIN ...) run on it; the caller
        gives it back (`_give_back`). A connection the server dropped since its last
        transaction (a restart, a terminated backend) is replaced once: nothing has been
        sent in this transaction yet, so nothing can be doubled."""
        import psycopg

        conn = self._take(deadline)
        try:
            if conn is not None and not (conn.closed or conn.broken):
                try:
                    conn.execute(statement)
                    return conn
                except psycopg.OperationalError:
                    pass
            self._discard(conn)
            conn = None
            conn = self._connect()
            try:
                conn.execute(statement)
            except psycopg.Error as exc:
                self._discard(conn)
                conn = None
                raise self._error("cannot start a transaction", exc) from None
            return conn
        except BaseException:
            self._give_back(conn)
            raise

    def _fresh(self, deadline: float) -> psycopg.Connection[Any]:
        """A connection to start a write transaction on, without a round trip of its own.
        One the server closed since the last transaction (a restart, a terminated backend)
        has something to read while idle (its farewell, or the end of the stream): it is
        replaced before anything is sent, so nothing can be doubled. (Anything else unasked
        for, a notice say, costs a reconnection, never a write.)"""
        conn = self._take(deadline)
        if conn is not None and not (conn.closed or conn.broken) and not _unasked(conn):
            return conn
        self._discard(conn)  # its place in the pool is kept for the new one
        try:
            return self._connect()
        except BaseException:
            self._give_back(None)
            raise

    def _committed(self, xid: int | None) -> bool | None:
        """Whether transaction `xid`, whose batch with COMMIT lost its answer, committed,
        asked on a new connection (`txid_status`; a backend that is still ending is waited
        for, a bounded number of times). None when nothing can be known: no id (it decided
        on a copy), the server unreachable, or still in progress after the waits."""
        import psycopg

        if xid is None:
            return None
        conn = None
        try:
            conn = self._connect()  # outside the pool: asked once, then closed
            for _ in range(100):
                row = conn.execute("SELECT txid_status(%s)", (xid,)).fetchone()
                status = None if row is None else row[0]
                if status == "committed":
                    return True
                if status == "aborted":
                    return False
                if status != "in progress":
                    return None  # too old to be known (never: it was just asked)
                conn.execute("SELECT pg_sleep(0.01)")  # its backend is still ending
        except (psycopg.Error, StorageError):
            pass
        finally:
            self._discard(conn)
        return None

    def _rollback(self, conn: psycopg.Connection[Any]) -> None:
        import psycopg
        from psycopg import pq

        if conn.broken or conn.closed:
            return
        if conn.info.transaction_status == pq.TransactionStatus.IDLE:
            return  # the ROLLBACK went with the pipeline's last batch
        # Sent by libpq itself: psycopg, seeing a ROLLBACK go through its own `execute`,
        # deallocates every prepared statement of the session when it prepared any (its
        # own, after a few reads), and with them the wire's (`wire.py`), which would then
        # be executed by names the server no longer knows.
        try:
            result = conn.pgconn.exec_(b"ROLLBACK")
        except psycopg.Error:
            self._discard(conn)
            return
        if result.status != pq.ExecStatus.COMMAND_OK:
            self._discard(conn)

    def _failure(
        self, conn: psycopg.Connection[Any], exc: BaseException, *, lost: bool = False
    ) -> StorageError:
        """A psycopg error inside a transaction that did not commit, as the StorageError to
        raise (`lost`: the connection failed, not a statement)."""
        import psycopg

        if isinstance(exc, psycopg.errors.LockNotAvailable):
            return self._error(
                f"ledger busy: a lock was not granted within {self._lock_timeout_s:g}s; "
                "nothing was written",
                exc,
            )
        if lost or isinstance(exc, psycopg.OperationalError) or conn.broken:
            return self._error(
                "the connection to the PostgreSQL server failed in the middle of a "
                "transaction; it was rolled back and nothing was written",
                exc,
            )
        if isinstance(exc, psycopg.errors.InsufficientPrivilege):
            # A privilege opening does not check (an administrator's write) or one revoked
            # since: the server's message names the table.
            role = conn.info.user
            denied = re.search(r"permission denied for (\w+) (\S+)", str(exc))
            target = f"{denied[1]} {denied[2]}" if denied else "the object named below"
            return self._error(
                f"the role {role} lacks a privilege on {target} (schema {self._schema}); "
                "nothing was written; an administrator grants it with GRANT",
                exc,
            )
        if isinstance(exc, psycopg.IntegrityError):
            return self._error("the database refused the write; nothing was written", exc)
        return self._error("ledger transaction failed; nothing was written", exc)

    @contextlib.contextmanager
    def _transaction(
        self,
        *,
        write: bool,
        current: bool = True,
        remembered: bool = False,
        after: StaleCopy | None = None,
    ) -> Iterator[PostgresTx]:
        import psycopg

        if current:
            self._current()
            if write:
                self._fit_to_write()
        # The caller's whole wait (the pool's, then every lock a statement asks for) ends
        # here: one lock timeout from now, or from the call's first transaction.
        deadline = self._deadline(after)
        if not write:
            conn = self._begin("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", deadline)
            try:
                yield PostgresTx(conn, write=False)
                conn.execute("COMMIT")
            except BaseException as exc:
                self._rollback(conn)
                if isinstance(exc, psycopg.Error):
                    raise self._failure(conn, exc) from None
                raise
            finally:
                self._give_back(conn)
            return
        # BEGIN goes with the first reads, and COMMIT with the last writes (two round
        # trips for an admission, `tx.py`), on libpq's pipeline (`wire.py`). A failure
        # before COMMIT is sent is a certain rollback. Once it is sent, whatever fails
        # before its answer is read leaves the outcome to the server: `_settle`.
        lent: list[psycopg.Connection[Any]] = []  # the pool's connection this one holds

        def opener() -> tuple[psycopg.Connection[Any], Wire]:
            if lent:
                # Dropped in the first batch: closed, never put back idle mid-transaction;
                # its place in the pool goes to the next one.
                self._discard(lent.pop())
                self._give_back(None)
            conn = self._fresh(deadline)
            lent.append(conn)
            wire = Wire(conn)
            wire.execute("BEGIN ISOLATION LEVEL READ COMMITTED")
            return conn, wire

        tx = PostgresTx(
            None,
            write=True,
            opener=opener,
            copies=self._copies,
            remembered=remembered,
            left=lambda: self._left_ms(deadline),
        )
        commit: Answer | None = None  # COMMIT's answer, once it is queued
        try:
            try:
                yield tx
            except BaseException as exc:
                if tx.unchecked() and isinstance(exc, Exception):
                    # Decided on a copy, and nothing sent that could check it: whatever
                    # the block concluded, it concludes again on rows read under the lock.
                    raise StaleCopy(deadline=deadline) from None
                # A refusal: its writes are never sent; the ROLLBACK goes in the batch
                # that ends the pipeline (after a failed statement the server skips it:
                # `_rollback`).
                if tx._wire is not None:
                    with contextlib.suppress(psycopg.Error):
                        tx._wire.execute("ROLLBACK")
                raise
            tx.closing()  # the writes still queued go in the batch with COMMIT
            last, wire = tx._connection, tx._wire
            if last is None or wire is None:
                return  # nothing was sent
            if _unasked(last):
                # The server spoke before this batch asked: a terminated backend's
                # farewell, or a refused write. One batch without COMMIT first, so
                # that such a failure is a certain rollback, not an unknown.
                wire.sync()
            commit = wire.commit()
            wire.close()  # the last batch, and its answers
            tx.committed()
        except BaseException as exc:
            used = tx._connection
            if used is None:
                raise
            if tx._wire is not None:
                with contextlib.suppress(Exception):
                    tx._wire.close()
            # Lost: the connection, not a statement, failed (a statement's own error
            # leaves it working; the wire closes one it cannot read to the end).
            lost = used.broken or used.closed or _lost(exc)
            self._rollback(used)
            if (
                commit is not None
                and isinstance(exc, Exception)
                and self._settle(tx, used, commit, exc, lost, deadline)
            ):
                return  # it committed: the block's result is what was done
            if tx.copied is not None and isinstance(exc, Exception) and (tx.stale() or lost):
                # A guard found the row changed, or the connection was lost before COMMIT
                # went: nothing was written, and the block is decided again on rows read.
                tx.drop_copy()
                raise StaleCopy(deadline=deadline) from None
            if not isinstance(exc, psycopg.Error):
                raise
            raise self._failure(used, exc, lost=lost) from None
        finally:
            if lent:
                self._give_back(lent.pop())

    def _settle(
        self,
        tx: PostgresTx,
        used: psycopg.Connection[Any],
        commit: Answer,
        exc: Exception,
        lost: bool,
        deadline: float,
    ) -> bool:
        """A transaction whose batch with COMMIT failed: True when it committed (COMMIT's
        own answer said so, or the server, asked about its id on a new connection: the
        caller is answered as if nothing had failed). Otherwise raises what the caller is
        told: a refused write or a certain rollback as such (decided again on rows read
        when it decided on a copy, `StaleCopy`), and an outcome nobody can tell as one
        that may or may not have been applied (decided again on rows read, which find
        what it did, when it decided on a copy)."""
        import psycopg

        said = commit.command()
        committed = (said == "COMMIT") if said is not None else self._committed(tx.xid)
        if committed:
            if tx._read_back is not None:
                tx.committed()  # the row read back, when its answer came; else dropped
            return True
        if committed is False:
            if tx.copied is not None and (tx.stale() or lost):
                tx.drop_copy()
                raise StaleCopy(deadline=deadline) from None
            if isinstance(exc, psycopg.Error):
                raise self._failure(used, exc, lost=lost) from None
            raise exc
        unknown = self._error(
            "the connection to the PostgreSQL server failed while committing, and the "
            "server could not be asked how the transaction ended: it may or may not have "
            "been applied (replaying its request key returns what was done)",
            exc,
        )
        if tx.copied is not None:
            tx.drop_copy()
            raise StaleCopy(unknown, deadline=deadline) from None
        raise unknown from None

    def write(
        self, *, remembered: bool = False, after: StaleCopy | None = None
    ) -> contextlib.AbstractContextManager[PostgresTx]:
        """One write transaction (READ COMMITTED; admissions lock their task row).
        `remembered`: its hinted reads may be answered from this store's copies
        (`copies.py`), checked when it writes; `StaleCopy` (nothing written) when they
        changed: see `Store.write`. `after`: the `StaleCopy` of the transaction this one
        repeats, whose caller's wait goes on (its deadline)."""
        return self._transaction(write=True, remembered=remembered, after=after)

    def read(self) -> contextlib.AbstractContextManager[PostgresTx]:
        """One read transaction (REPEATABLE READ, READ ONLY): one snapshot."""
        return self._transaction(write=False)

    def wait_for_wake(self, seen: int, timeout_s: float, read: Callable[[], int]) -> int:
        """`LISTEN` for the wake notification on a connection of its own (`wake.py`)."""
        with self._pool:
            if self._listener is None:
                self._listener = WakeListener(self._connect)
            listener = self._listener
        return listener.wait(seen, timeout_s, read)

    def close(self) -> None:
        """Close the idle connections; a lent one is closed when given back."""
        listener, self._listener = self._listener, None
        if listener is not None:
            listener.close()
        with self._pool:
            self._closed = True
            idle, self._idle = self._idle, []
            self._opened -= len(idle)
            self._pool.notify_all()
        for conn in idle:
            self._discard(conn)

    def _open(self, *, create: bool, upgrade: bool) -> None:
        with self._transaction(write=False, current=False) as tx:
            found = self._read_version(tx)
        if found > schema.SCHEMA_VERSION:
            self.close()
            raise SchemaTooNew(
                f"the ledger at {self._where} has schema version {found}, newer than this "
                f"execkit knows ({schema.SCHEMA_VERSION}); upgrade execkit, or restore the dump "
                "taken before the upgrade"
            )
        if found == 0 and not create:
            self.close()
            raise NotFound(
                f"no ledger at {self._where} (schema {self._schema or '?'}); `execkit db "
                "init` with this --db or $EXECKIT_DB makes a new one there"
            )
        if found == 0 or (found < schema.SCHEMA_VERSION and upgrade):
            self.migration = self._upgrade()
        elif found < schema.SCHEMA_VERSION:
            self._outdated = found
        self._read_fitness()

    def _read_fitness(self) -> None:
        """The one query opening adds: the tables, columns and privileges found against
        those the schema's version and every write need (`check.fitness`), kept for
        `_fit_to_write`; then the owner, when the schema is current and lets it be read."""
        with self._transaction(write=False, current=False) as tx:
            version = self._outdated or schema.SCHEMA_VERSION
            self._fitness = check.fitness(tx, version, self._schema)
            unreadable = "table ledger_meta" in self._fitness.missing or (
                "SELECT on table ledger_meta" in self._fitness.lacking
            )
            if self._outdated is None and not unreadable:
                self._owner = tx.meta("owner")

    def _unfit(self, fitness: check.Fitness) -> StorageError | None:
        """The error that names what a write would lack, None when nothing is lacking."""
        if fitness.missing:
            return StorageError(
                f"the ledger at {self._where} (schema {self._schema}) is not usable: "
                f"{', '.join(fitness.missing)} missing; nothing was written. "
                "`execkit db check --db URL` lists what is wrong: restore the ledger from "
                "its last dump (pg_restore), or use the execkit version that wrote it"
            )
        if fitness.lacking:
            return StorageError(
                f"the role {fitness.role} of the ledger at {self._where} lacks "
                f"{', '.join(fitness.lacking)} (schema {self._schema}); nothing was written. "
                f"An administrator grants it: {'; '.join(fitness.grants)}"
            )
        return None

    def _fit_to_write(self) -> None:
        """Before a write transaction begins: refuse it when opening found a table or
        column missing, or a privilege every write needs not held, so nothing is half
        written and the error names what to fix (checked once, at open: schemas and
        grants do not change under a running execkit)."""
        refused = self._unfit(self._fitness)
        if refused is not None:
            raise refused

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
            self._read_fitness()  # the owner was not read while the schema was outdated
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
        """Facts for an operator's status view (JSON-safe); works on an older schema too.
        StorageError naming what is missing when a table or column of the schema's version
        is, or the role lacks a privilege every write needs."""
        with self._transaction(write=False, current=False) as tx:
            version = self._read_version(tx)
            refused = self._unfit(check.fitness(tx, version, self._schema))
            if refused is not None:
                raise refused
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
