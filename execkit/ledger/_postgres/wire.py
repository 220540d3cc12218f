"""A write transaction's statements on libpq's pipeline, each batch sent in one write.

psycopg's own pipeline sends every statement as it is executed (two polls and a send each)
and wakes the server for each; here statements are queued in libpq's buffer and a batch
goes at `sync()`: one send, one wake, then every answer read in order (issue #33: psycopg's
per-statement work was most of an admission's time on a Unix socket). Statements are
prepared once per connection (named `ek_N`, by their text and parameter types) and
executed by name after that. Parameters are adapted and rows loaded by psycopg's own
adapters (`Transformer`), errors raised as the psycopg exception the server's SQLSTATE
names (`error_from_result`): what a caller catches is what psycopg would have raised.

A batch that meets an error stops there (the server skips the rest until the sync) and
`sync()` raises that first error once every answer of the batch is read. A connection lost
raises `psycopg.OperationalError` and leaves the connection `broken`. `close()` leaves
pipeline mode; a connection that cannot leave it is closed, never lent again. `commit()`
queues COMMIT, whose answer (`Answer.command`) says whether the transaction committed even
when the batch failed after it was read.
"""

from __future__ import annotations

import itertools
import select
import threading
import weakref
from collections.abc import Callable, Iterator, Sequence
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psycopg
    from psycopg import pq

__all__ = ["Answer", "Wire", "ready"]

# Prepared statements per connection (they live as long as its session): text and
# parameter types -> name, and the numbers names are drawn from (never one used twice).
# Bounded: past it a statement is sent unnamed, parsed each time.
_MAX_PREPARED = 200
_Names = dict[tuple[str, tuple[int, ...]], bytes]

# Testing seam: called once a batch has left and before the sync that asks for its answers,
# with its backend's pid, the connection's socket and whether the batch carries COMMIT.
# The tests hold the window there (the server runs the batch, its answers not yet read) and
# end the backend, or the connection, in it.
_sent: Callable[[int, int, bool], None] | None = None


class _Session:
    """What a connection keeps across its transactions: its prepared statements, and
    psycopg's adapters for it (a Transformer caches the dumper of each type it met)."""

    __slots__ = ("columns", "names", "numbers", "transformer")

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        from psycopg.adapt import Transformer

        self.names: _Names = {}
        self.columns: dict[bytes, list[str]] = {}  # a prepared statement's column names
        self.numbers: Iterator[int] = itertools.count()
        self.transformer = Transformer(conn)


_sessions: weakref.WeakKeyDictionary[Any, _Session] = weakref.WeakKeyDictionary()
_sessions_lock = threading.Lock()  # a store's threads each hold a connection of their own


def ready(fd: int, *, write: bool = False, timeout_ms: int | None = None) -> bool:
    """Whether `fd` can be read (or written), waiting at most `timeout_ms` (None: until it
    can). poll(2), not select(2): a process holding many files (a server, a dispatcher
    with many agents) has sockets numbered past select's limit of 1024."""
    if not hasattr(select, "poll"):  # pragma: no cover (Windows)
        wanted = ([], [fd]) if write else ([fd], [])
        wait = None if timeout_ms is None else timeout_ms / 1000
        return any(select.select(*wanted, [], wait)[:2])
    poller = select.poll()
    poller.register(fd, select.POLLOUT if write else select.POLLIN)
    return bool(poller.poll(timeout_ms))


@lru_cache(maxsize=256)
def _numbered(sql: str) -> bytes:
    """`sql` with its `%s` placeholders as `$1`, `$2`, ... (and `%%` as `%`)."""
    parts = sql.split("%%")
    count = 0
    out: list[str] = []
    for part in parts:
        pieces = part.split("%s")
        numbered = pieces[0]
        for piece in pieces[1:]:
            count += 1
            numbered += f"${count}{piece}"
        out.append(numbered)
    return "%".join(out).encode()


class Answer:
    """One statement's answer, read when its batch is synced (reading it syncs)."""

    __slots__ = ("_name", "_result", "_wire")

    def __init__(self, wire: Wire, name: bytes | None) -> None:
        self._wire = wire
        self._name = name  # the prepared statement's, None when sent unnamed
        self._result: pq.abc.PGresult | None = None

    def _ready(self) -> pq.abc.PGresult | None:
        if self in self._wire._waiting:
            self._wire.sync()
        return self._result

    def rows(self) -> list[tuple[Any, ...]]:
        """Its rows as tuples (none for a statement that returns none)."""
        result = self._ready()
        if result is None or not result.ntuples:
            return []
        loader = self._wire._transformer
        loader.set_pgresult(result)
        return loader.load_rows(0, result.ntuples, tuple)

    def one(self) -> tuple[Any, ...] | None:
        rows = self.rows()
        return rows[0] if rows else None

    def named(self) -> list[dict[str, Any]]:
        """Its rows as dicts by column name."""
        result = self._ready()
        if result is None or not result.ntuples:
            return []
        names = None if self._name is None else self._wire._columns.get(self._name)
        if names is None:
            names = [(result.fname(n) or b"").decode() for n in range(result.nfields)]
            if self._name is not None:
                self._wire._columns[self._name] = names
        return [dict(zip(names, row, strict=True)) for row in self.rows()]

    def named_one(self) -> dict[str, Any] | None:
        rows = self.named()
        return rows[0] if rows else None

    def command(self) -> str | None:
        """How the server ended this statement, as far as its answers tell, once its batch
        was read: its command tag ("COMMIT"; "ROLLBACK" for a COMMIT in a failed
        transaction); "" when the server refused it, or skipped it after refusing one
        before it (a session ended at an earlier statement included: this one never
        ran); None when they cannot tell: its answer never came back, it is the client's
        own error (the connection was lost), or the session ended as it ran."""
        from psycopg import pq

        result = self._result
        if result is None:
            return None
        status = result.status
        if status == pq.ExecStatus.COMMAND_OK:
            return (result.command_status or b"").decode()
        if status == pq.ExecStatus.FATAL_ERROR:
            code = result.error_field(pq.DiagnosticField.SQLSTATE)
            return None if code is None or code.startswith((b"08", b"57P")) else ""
        if status == pq.ExecStatus.PIPELINE_ABORTED:
            return "" if self._wire._refused else None
        return ""

    def sqlstate(self) -> str | None:
        """The SQLSTATE of the error this statement met; None when it met none (or its
        batch never came back)."""
        from psycopg import pq

        result = None if self in self._wire._waiting else self._result
        if result is None or result.status != pq.ExecStatus.FATAL_ERROR:
            return None
        code = result.error_field(pq.DiagnosticField.SQLSTATE)
        return None if code is None else code.decode()


class Wire:
    """libpq's pipeline mode on `conn` (a psycopg connection, idle, not in psycopg's
    own pipeline), entered now and left by `close()`."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self._conn = conn
        self._pgconn = conn.pgconn
        with _sessions_lock:
            session = _sessions.get(conn)
            if session is None:
                session = _sessions[conn] = _Session(conn)
        self._transformer = session.transformer
        self._names, self._numbers = session.names, session.numbers
        self._columns = session.columns
        # What each queued command answers, in order: an Answer, or the key of a statement
        # being prepared (dropped from the names if its Parse was skipped or refused).
        self._queue: list[Answer | tuple[str, tuple[int, ...]]] = []
        self._waiting: set[Answer] = set()
        self._commits = False  # COMMIT is queued (`commit`)
        # The last batch's first error was the server's own (an error it answered), not
        # the client's (a lost connection): the statements after it were not run.
        self._refused = False
        # Waited on for each answer the server has not sent yet: one poller, registered
        # once (poll(2), as `ready`).
        self._readable: Any = None
        if hasattr(select, "poll"):
            self._readable = select.poll()
            self._readable.register(self._pgconn.socket, select.POLLIN)
        self._pgconn.enter_pipeline_mode()

    def execute(self, sql: str, params: Sequence[Any] = (), *, prepare: bool = True) -> Answer:
        """Queue `sql` (`%s` placeholders, none without `params`) with `params`; nothing
        is sent until `sync()`. `prepare=False`: sent unnamed (a statement run once)."""
        from psycopg.adapt import PyFormat

        if params:
            values = self._transformer.dump_sequence(params, [PyFormat.AUTO] * len(params))
            types = tuple(self._transformer.types or ())
            formats: Sequence[pq.Format] | None = self._transformer.formats
            text = _numbered(sql)
        else:
            values, types, formats, text = [], (), None, sql.encode()
        key = (sql, types)
        name = self._names.get(key)
        if name is None and prepare and len(self._names) < _MAX_PREPARED:
            name = f"ek_{next(self._numbers)}".encode()
            self._names[key] = name
            self._pgconn.send_prepare(name, text, param_types=types)
            self._queue.append(key)
        answer = Answer(self, name)
        if name is None:
            self._pgconn.send_query_params(text, values, param_types=types, param_formats=formats)
        else:
            self._pgconn.send_query_prepared(name, values, param_formats=formats)
        self._queue.append(answer)
        self._waiting.add(answer)
        return answer

    def commit(self) -> Answer:
        """Queue COMMIT. Its answer, once read, says whether the transaction committed
        (`Answer.command`), even when the connection is lost before the batch's sync is."""
        self._commits = True
        return self.execute("COMMIT")

    def sync(self) -> None:
        """Send everything queued and a sync, in one write, and read every answer; the
        batch's first error is raised once they all are."""
        import psycopg
        from psycopg import pq

        pgconn = self._pgconn
        if _sent is not None:
            while pgconn.flush():
                ready(pgconn.socket, write=True)
            _sent(pgconn.backend_pid, pgconn.socket, self._commits)
        pgconn.pipeline_sync()
        while pgconn.flush():  # the socket's buffer is full: wait until it drains
            ready(pgconn.socket, write=True)
        queue, self._queue = self._queue, []
        self._waiting.clear()
        self._refused = False
        first: psycopg.Error | None = None
        for waiting in queue:
            result = self._next()
            if result is None:
                raise psycopg.OperationalError("the server's answers ended before the sync")
            if isinstance(waiting, Answer):
                waiting._result = result  # kept even if the connection is lost next
            elif result.status != pq.ExecStatus.COMMAND_OK:
                self._names.pop(waiting, None)  # not prepared: prepared again next time
            while self._next() is not None:  # the NULL that ends each command's results
                pass
            if result.status == pq.ExecStatus.FATAL_ERROR and first is None:
                encoding = self._conn.info.encoding
                first = psycopg.errors.error_from_result(result, encoding=encoding)
                self._refused = result.error_field(pq.DiagnosticField.SQLSTATE) is not None
        synced = self._next()
        if synced is None or synced.status != pq.ExecStatus.PIPELINE_SYNC:
            raise psycopg.OperationalError("the server's answers did not end at the sync")
        if first is not None:
            raise first

    def _next(self) -> pq.abc.PGresult | None:
        """The next result libpq has, waiting for the server while it has none; a lost
        connection is an OperationalError (`consume_input` raises it)."""
        pgconn = self._pgconn
        while pgconn.is_busy():
            if self._readable is None:  # pragma: no cover (Windows)
                ready(pgconn.socket)
            else:
                self._readable.poll()
            pgconn.consume_input()
        return pgconn.get_result()

    def close(self) -> None:
        """Sync what is still queued, then leave pipeline mode. A broken connection is left
        as it is (its owner discards it); one that cannot leave the mode (its answers
        unread, after an interruption) is closed, never lent again. When the sync failed,
        its error is the one raised (not the mode's that follows from it)."""
        synced = False
        try:
            if self._queue:
                self.sync()
            synced = True
        finally:
            if not (self._conn.closed or self._conn.broken):
                try:
                    self._pgconn.exit_pipeline_mode()
                except BaseException:
                    self._conn.close()
                    if synced:
                        raise
