"""The PostgreSQL ledger: every SQL statement of the PostgreSQL backend lives in this package.

A peer of the SQLite backend, not a port of it: the same rules (`LedgerCore`,
`execkit.ledger._core`) over storage in PostgreSQL's own terms, so that dispatchers on many
hosts share one ledger. The database enforces the ledger's invariants itself (one running
run per task, no run past the limit in force at its admission); admissions on one task
queue on its row lock; a failed transaction rolls back and consumes nothing, and a
connection lost while committing is answered with what the server did (a commit as one, a
rollback only when the server says so, an unknown outcome only when it cannot be asked:
replaying the request key tells). Schema versions are this backend's own; execkit cannot
copy a server's database, so an existing ledger is migrated only when asked, once the
operator took the `pg_dump` it names. Passwords never leave this package.

psycopg (3) is imported when a store is opened, never when this package is imported.

One concern a file:

- `url.py`: which targets name a PostgreSQL ledger, and the URL without its password;
- `schema.py`: the statements of each schema version (what the database enforces), and
  `SCHEMA_VERSION`;
- `migrate.py`: `PostgresMigration`, the version a database holds, the `pg_dump` command,
  and an older ledger brought up to date under the migration lock;
- `tx.py`: `PostgresTx`, every statement of one transaction and the locks it takes;
- `copies.py`: the rows a store's own admissions and results left, which the next one on
  the same task decides on (one round trip) behind a guard that checks them;
- `store.py`: `PostgresStore`, the connection, its transactions and their failures, and
  what opening does;
- `check.py`: the tables, columns and privileges a schema's version and every write need
  (read once at open), and the stored values outside their domain (`db check`);
- `ledger.py`: `PostgresLedger`, the rules over the store, and `migrate_postgres`.

Rooms outside this package import from `execkit.ledger._postgres` only, never from its
files; outside `execkit.ledger`, only `open_ledger` opens one.
"""

from execkit.ledger._postgres.ledger import PostgresLedger, migrate_postgres
from execkit.ledger._postgres.migrate import PostgresMigration
from execkit.ledger._postgres.schema import SCHEMA_VERSION
from execkit.ledger._postgres.store import PostgresStore
from execkit.ledger._postgres.url import INSTALL_HINT, URL_SCHEMES, is_postgres_url, public_url

__all__ = [
    "INSTALL_HINT",
    "SCHEMA_VERSION",
    "URL_SCHEMES",
    "PostgresLedger",
    "PostgresMigration",
    "PostgresStore",
    "is_postgres_url",
    "migrate_postgres",
    "public_url",
]
