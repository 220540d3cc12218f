"""The embedded SQLite ledger: every SQL statement of the SQLite backend lives in this package.

`SqliteLedger` is the rules (`LedgerCore`, `execkit.ledger._core`) over an `SqliteStore`:
this package is storage only, a peer of the PostgreSQL backend with its own SQL, locking
and schema numbers. One connection per ledger; each process opens its own. The database
runs in WAL mode with a busy timeout, and every write is one `BEGIN IMMEDIATE` transaction,
so two processes admitting runs on one task serialise on the write lock and the second one
sees the first one's run when it counts (ADR 0033: the count is checked in the transaction
that starts the run; a failed transaction consumes no attempt).

Schema versions are numbered and applied in order; a fresh database is built by the same
migration steps an old one goes through, after a backup of an existing file beside it.
Opening a database whose schema is newer than this code knows raises `SchemaTooNew` before
anything is written to it.

One concern a file:

- `schema.py`: the statements of each schema version, and `SCHEMA_VERSION`;
- `migrate.py`: `Migration`, the version a file holds, and an older one brought up to date
  (backup, statements, data steps) in one transaction;
- `files.py`: what a ledger path may be, and files created owner-only;
- `tx.py`: `SqliteTx`, every statement of one transaction (the `Tx` the rules call);
- `store.py`: `SqliteStore`, the connection, its transactions, and what opening does;
- `check.py`: the file's integrity and every stored value outside its domain (`db check`);
- `ledger.py`: `SqliteLedger`, the rules over the store.

Rooms outside this package import from `execkit.ledger._sqlite` only, never from its files.
"""

from execkit.ledger._sqlite.ledger import SqliteLedger
from execkit.ledger._sqlite.migrate import Migration
from execkit.ledger._sqlite.schema import SCHEMA_VERSION
from execkit.ledger._sqlite.store import SqliteStore

__all__ = ["SCHEMA_VERSION", "Migration", "SqliteLedger", "SqliteStore"]
