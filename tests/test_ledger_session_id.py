"""The vendor session each run's agent ran in (issue #46), written with the run's result
(`finish_run(session_id=...)`) and read back on `Run.session_id`: on SQLite, on PostgreSQL
and through `execkit serve` alike; kept verbatim (never masked), bounded and refused with
control characters; None on runs that said none and on runs from before the column (SQLite
step 12, PostgreSQL step 10)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from ledger_backends import SQLITE_BUCKETS_UNDONE, AnyLedger
from test_ledger_postgres import BUCKETS_UNDONE, sql
from test_remote import ME, Remote, remote  # noqa: F401 - the fixture

from execkit import FailureClass, InvalidInput
from execkit.ledger import SESSIONS_CAPABILITY, migrate, open_ledger
from execkit.ledger._postgres import schema as pg_schema
from execkit.ledger._sqlite import schema as sqlite_schema

SESSION = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"


def test_a_run_keeps_the_session_its_result_named(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", actor="me")
    run = ledger.start_run(task.id, request_key="1", actor="me")
    assert run.session_id is None
    ended = ledger.finish_run(
        run.id, "failed", failure_class=FailureClass.UPSTREAM, reason="usage limit",
        session_id=SESSION,
    )  # fmt: skip
    assert ended.session_id == SESSION
    assert ledger.run(run.id).session_id == SESSION
    assert ledger.run(run.id).to_dict()["session_id"] == SESSION
    # The same result again is the same run; another session is a Conflict.
    again = ledger.finish_run(
        run.id, "failed", failure_class=FailureClass.UPSTREAM, reason="usage limit",
        session_id=SESSION,
    )  # fmt: skip
    assert again.session_id == SESSION
    second = ledger.start_run(task.id, request_key="2", actor="me", ignore_backoff=True)
    ledger.finish_run(second.id, "succeeded")
    assert [r.session_id for r in ledger.runs(task.id)] == [SESSION, None]
    assert SESSIONS_CAPABILITY in ledger.capabilities()


def test_a_session_that_looks_like_a_secret_is_kept_verbatim(ledger: AnyLedger) -> None:
    # A resume hands the id back to the vendor: a masked id would resume nothing.
    task = ledger.create_task("t", actor="me")
    run = ledger.start_run(task.id, request_key="1", actor="me")
    odd = "thread_" + "A" * 40
    assert ledger.finish_run(run.id, "succeeded", session_id=odd).session_id == odd


def test_a_session_that_is_not_one_is_refused_with_nothing_written(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", actor="me")
    run = ledger.start_run(task.id, request_key="1", actor="me")
    for bad in ("", "x" * 201, 7, "abc\ndef", "a\x1bb", "a\x7f"):
        with pytest.raises(InvalidInput, match="session_id") as refused:
            ledger.finish_run(run.id, "succeeded", session_id=bad)  # type: ignore[arg-type]
        assert refused.value.field == "session_id"
    assert ledger.run(run.id).status == "running"
    assert ledger.finish_run(run.id, "succeeded", session_id="x" * 200).session_id == "x" * 200


def test_through_the_server(remote: Remote) -> None:  # noqa: F811
    client = remote.client()
    assert SESSIONS_CAPABILITY in client.capabilities()
    task = client.create_task("t", actor=ME)
    run = client.start_run(task.id, request_key="1", actor=ME)
    ended = client.finish_run(
        run.id, "failed", failure_class=FailureClass.UPSTREAM, session_id=SESSION
    )
    assert ended.session_id == SESSION
    assert remote.ledger.run(run.id).session_id == SESSION
    assert client.runs(task.id)[0].session_id == SESSION
    with pytest.raises(InvalidInput, match="session_id"):
        other = client.start_run(task.id, request_key="2", actor=ME, ignore_backoff=True)
        client.finish_run(other.id, "succeeded", session_id="a\nb")
    client.close()


def test_runs_from_before_the_column_read_as_none(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with open_ledger(path) as ledger:
        task = ledger.create_task("t", actor="me")
        run = ledger.start_run(task.id, request_key="1", actor="me")
        ledger.finish_run(run.id, "failed", failure_class=FailureClass.UPSTREAM)
    # Back to version 11: the column, version 13's buckets and the version rows gone.
    conn = sqlite3.connect(path)
    for statement in SQLITE_BUCKETS_UNDONE:
        conn.execute(statement)
    conn.execute("ALTER TABLE run_extras DROP COLUMN session_id")
    conn.execute("DELETE FROM schema_version WHERE version >= 12")
    conn.commit()
    conn.close()
    with open_ledger(path) as ledger:
        assert ledger.migration is not None and ledger.migration.from_version == 11
        assert ledger.schema_version() == sqlite_schema.SCHEMA_VERSION == 14
        (old,) = ledger.runs(task.id)
        assert old.session_id is None
        new = ledger.start_run(task.id, request_key="2", actor="me", ignore_backoff=True)
        assert ledger.finish_run(new.id, "succeeded", session_id=SESSION).session_id == SESSION


def test_a_postgres_ledger_from_before_the_column_migrates(pg_url: str) -> None:
    with open_ledger(pg_url) as ledger:
        task = ledger.create_task("t", actor="me")
        run = ledger.start_run(task.id, request_key="1", actor="me")
        ledger.finish_run(run.id, "failed", failure_class=FailureClass.UPSTREAM)
    for statement in BUCKETS_UNDONE:  # version 11's
        sql(pg_url, statement)
    sql(pg_url, "ALTER TABLE runs DROP COLUMN session_id")
    sql(pg_url, "DELETE FROM schema_version WHERE version >= 10")
    done = migrate(pg_url, backed_up=True)
    assert done is not None and done.from_version == 9
    with open_ledger(pg_url) as ledger:
        assert ledger.schema_version() == pg_schema.SCHEMA_VERSION == 13
        (old,) = ledger.runs(task.id)
        assert old.session_id is None
        new = ledger.start_run(task.id, request_key="2", actor="me", ignore_backoff=True)
        assert ledger.finish_run(new.id, "succeeded", session_id=SESSION).session_id == SESSION
