"""The write transactions' transport (`execkit/ledger/_postgres/wire.py`) on a real server:
a batch's answers in order, its first error raised as psycopg's own class once the batch is
read, a statement prepared once per connection and prepared again when its Parse was
skipped, and a connection that leaves the pipeline usable."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from _support import protocol_trace

from execkit.ledger._postgres.wire import Wire, _numbered


@pytest.fixture
def conn(pg_url: str) -> Iterator[Any]:
    import psycopg

    with psycopg.connect(pg_url, autocommit=True) as connection:
        connection.execute("CREATE TABLE w (id integer PRIMARY KEY, note text, at float8)")
        yield connection


def _messages(conn: Any, call: Any) -> list[str]:
    """The kinds of the protocol messages the client sent during `call` (libpq's trace)."""
    return [kind for side, kind in protocol_trace(conn, call) if side == "F"]


def test_placeholders_are_numbered_and_percent_signs_kept() -> None:
    assert _numbered("SELECT %s, %s WHERE a LIKE 'x%%'") == b"SELECT $1, $2 WHERE a LIKE 'x%'"
    assert _numbered("SELECT 1") == b"SELECT 1"


def test_a_batch_answers_in_order_with_rows_loaded_by_psycopg(conn: Any) -> None:
    wire = Wire(conn)
    wire.execute("BEGIN")
    wire.execute("INSERT INTO w VALUES (%s, %s, %s)", (1, "one", 1.5))
    wire.execute("INSERT INTO w VALUES (%s, %s, %s)", (2, None, 2.5))
    rows = wire.execute("SELECT id, note, at FROM w WHERE id = ANY(%s) ORDER BY id", ([1, 2],))
    nothing = wire.execute("SELECT id FROM w WHERE id = %s", (3,))
    wire.sync()
    assert rows.rows() == [(1, "one", 1.5), (2, None, 2.5)]
    assert rows.named() == [{"id": 1, "note": "one", "at": 1.5}, {"id": 2, "note": None, "at": 2.5}]
    assert nothing.one() is None
    wire.execute("COMMIT")
    wire.close()
    assert conn.execute("SELECT count(*) FROM w").fetchone() == (2,)


def test_reading_an_answer_sends_its_batch(conn: Any) -> None:
    wire = Wire(conn)
    answer = wire.execute("SELECT %s::int + 1", (41,))
    assert answer.one() == (42,)  # synced by the read
    wire.close()


def test_the_first_error_is_raised_once_the_batch_is_read(conn: Any) -> None:
    import psycopg

    wire = Wire(conn)
    wire.execute("BEGIN")
    wire.execute("INSERT INTO w VALUES (%s, %s, %s)", (1, "one", 1.0))
    wire.execute("INSERT INTO w VALUES (%s, %s, %s)", (1, "again", 1.0))  # the key is taken
    skipped = wire.execute("SELECT 7 WHERE %s::int = 1", (1,))  # first use: a Parse, skipped
    with pytest.raises(psycopg.errors.UniqueViolation) as refused:
        wire.sync()
    assert "w_pkey" in str(refused.value)
    assert skipped.rows() == []  # the server skipped it (the pipeline was aborted)
    wire.execute("ROLLBACK")
    wire.sync()
    # The statement whose Parse was skipped is parsed again at its next use, and runs.
    sent = _messages(conn, lambda: wire.execute("SELECT 7 WHERE %s::int = 1", (1,)).one())
    assert sent.count("Parse") == 1
    assert wire.execute("SELECT 7 WHERE %s::int = 1", (1,)).one() == (7,)
    wire.close()
    assert conn.execute("SELECT count(*) FROM w").fetchone() == (0,)  # rolled back


def test_a_statement_is_parsed_once_per_connection_and_a_batch_ends_in_one_sync(
    conn: Any,
) -> None:
    def batch() -> None:
        wire = Wire(conn)
        wire.execute("BEGIN")
        for n in range(3):
            wire.execute("INSERT INTO w VALUES (%s, %s, %s)", (n, "x", 0.0))
        wire.execute("ROLLBACK")
        wire.close()

    first, second = _messages(conn, batch), _messages(conn, batch)
    assert first.count("Parse") == 3  # BEGIN, the INSERT, ROLLBACK
    assert second.count("Parse") == 0
    assert second.count("Bind") == 5
    assert second.count("Sync") == 1
    assert conn.execute("SELECT 1").fetchone() == (1,)  # out of pipeline mode, usable
