"""The server's stored responses for `Idempotency-Key` (docs/remote.md, "Idempotency").

Why a file of the server's own, and not the ledger: the ledger's idempotency table is
keyed per operation and stores what the ledger needs to replay (a task or run id), not an
HTTP response, and its interface has no place for one; the ledger package is not the
server's to change. So the server keeps (ledger id, actor, key) -> (fingerprint, status,
body) in a small owner-only SQLite file (`--idempotency-db`, by default beside the tokens
file). It survives a server restart as the ledger does, and the ledger id in the key keeps
two ledgers served with one tokens file apart.

Only a 2xx answer is stored. A refusal changed nothing (every ledger operation is one
transaction), so repeating it is safe and answers from the current state: a `backoff`
refusal replayed with its key is not frozen past its `ready_at`. Entries older than
`retention_s` (24 hours) are pruned; a client retries within seconds.

Two requests with one key at once (a client's retry while its first attempt is still being
served) queue on a per-key lock in this process: the second waits, then replays the first
one's stored answer. Keys are also passed to the ledger where it has its own (a run's
request key, a task's or a limit's idempotency key), so an answer the server lost between
the ledger's commit and this store's write (a crash) is still replayed by the ledger.
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import attrs

from execkit._errors import StorageError

__all__ = ["DEFAULT_RETENTION_S", "IdempotencyStore", "StoredResponse"]

DEFAULT_RETENTION_S = 24 * 3600.0
_PRUNE_EVERY = 200  # writes between two prunes
_FILE_MODE = 0o600


@attrs.frozen
class StoredResponse:
    fingerprint: str
    status: int
    body: str  # the JSON text as it was sent


class _Claim:
    """One key's lock, and how many requests hold or wait for it."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.waiting = 0


class IdempotencyStore:
    """Stored responses in one SQLite file (":memory:" keeps them in memory). Thread-safe."""

    def __init__(
        self, path: str | os.PathLike[str], *, retention_s: float = DEFAULT_RETENTION_S
    ) -> None:
        self.path = str(path)
        self.retention_s = retention_s
        self._lock = threading.Lock()
        self._claims_lock = threading.Lock()
        self._claims: dict[tuple[str, str, str], _Claim] = {}
        self._writes = 0
        try:
            if self.path != ":memory:":
                target = Path(self.path)
                if not target.exists():
                    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _FILE_MODE)
                    os.close(fd)
            self._conn = sqlite3.connect(
                self.path, timeout=30.0, isolation_level=None, check_same_thread=False
            )
            self._conn.execute("PRAGMA busy_timeout = 30000")
            if self.path != ":memory:":
                self._conn.execute("PRAGMA journal_mode = WAL")
                # A stored answer lost to a power cut (not to a crash) is answered by the
                # ledger's own keys on replay; it does not need an fsync of its own.
                self._conn.execute("PRAGMA synchronous = NORMAL")
            self._conn.execute(
                "CREATE TABLE IF NOT EXISTS responses ("
                " ledger_id TEXT NOT NULL, actor TEXT NOT NULL, key TEXT NOT NULL,"
                " fingerprint TEXT NOT NULL, status INTEGER NOT NULL, body TEXT NOT NULL,"
                " created_at REAL NOT NULL, PRIMARY KEY (ledger_id, actor, key))"
            )
            self._conn.execute(
                "CREATE INDEX IF NOT EXISTS responses_by_age ON responses (created_at)"
            )
        except (OSError, sqlite3.Error) as exc:
            raise StorageError(f"cannot open the idempotency store {self.path}: {exc}") from exc

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    @contextlib.contextmanager
    def claim(self, ledger_id: str, actor: str, key: str, *, timeout_s: float) -> Iterator[None]:
        """Hold the key for one request: a second request with it waits here (at most
        `timeout_s`, then StorageError) until the first has stored its answer."""
        ident = (ledger_id, actor, key)
        with self._claims_lock:
            entry = self._claims.setdefault(ident, _Claim())
            entry.waiting += 1
        try:
            if not entry.lock.acquire(timeout=timeout_s):
                raise StorageError(
                    f"a request with Idempotency-Key {key!r} is still being served; "
                    "repeat this one later with the same key"
                )
            try:
                yield
            finally:
                entry.lock.release()
        finally:
            with self._claims_lock:
                entry.waiting -= 1
                if entry.waiting == 0:
                    del self._claims[ident]

    def get(self, ledger_id: str, actor: str, key: str) -> StoredResponse | None:
        cutoff = time.time() - self.retention_s
        try:
            with self._lock:
                row = self._conn.execute(
                    "SELECT fingerprint, status, body FROM responses "
                    "WHERE ledger_id = ? AND actor = ? AND key = ? AND created_at >= ?",
                    (ledger_id, actor, key, cutoff),
                ).fetchone()
        except sqlite3.Error as exc:
            raise StorageError(f"cannot read the idempotency store: {exc}") from exc
        if row is None:
            return None
        return StoredResponse(fingerprint=row[0], status=int(row[1]), body=row[2])

    def put(self, ledger_id: str, actor: str, key: str, response: StoredResponse) -> None:
        now = time.time()
        try:
            with self._lock:
                self._conn.execute(
                    "INSERT OR REPLACE INTO responses "
                    "(ledger_id, actor, key, fingerprint, status, body, created_at) "
                    "VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (
                        ledger_id,
                        actor,
                        key,
                        response.fingerprint,
                        response.status,
                        response.body,
                        now,
                    ),
                )
                self._writes += 1
                if self._writes % _PRUNE_EVERY == 1:
                    self._conn.execute(
                        "DELETE FROM responses WHERE created_at < ?", (now - self.retention_s,)
                    )
        except sqlite3.Error as exc:
            raise StorageError(f"cannot write the idempotency store: {exc}") from exc

    def __len__(self) -> int:
        with self._lock:
            (count,) = self._conn.execute("SELECT COUNT(*) FROM responses").fetchone()
        return int(count)
