"""The workspace a run's agent worked in (issue #46), kept on the run: on SQLite, on
PostgreSQL and through `execkit serve` alike, masked as text, refused when it is not a
path, and absent (None) on a run that did not say and on runs from before the column."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from ledger_backends import SQLITE_BUCKETS_UNDONE, AnyLedger
from test_remote import ME, Remote, remote  # noqa: F401 - the fixture

from execkit import InvalidInput
from execkit.ledger import open_ledger
from execkit.ledger._sqlite import schema as sqlite_schema


def test_a_run_keeps_the_workspace_it_was_admitted_with(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", actor="me")
    run = ledger.start_run(task.id, request_key="1", actor="me", workspace="/srv/ws/ISS-7")
    assert run.workspace == "/srv/ws/ISS-7"
    assert ledger.run(run.id).workspace == "/srv/ws/ISS-7"
    ledger.finish_run(run.id, "succeeded")
    assert [r.workspace for r in ledger.runs(task.id)] == ["/srv/ws/ISS-7"]
    other = ledger.create_task("u", actor="me")
    plain = ledger.start_run(other.id, request_key="2", actor="me")
    assert plain.workspace is None and ledger.run(plain.id).workspace is None
    assert ledger.run(plain.id).to_dict()["workspace"] is None


def test_a_workspace_that_is_not_a_path_is_refused_with_nothing_written(
    ledger: AnyLedger,
) -> None:
    task = ledger.create_task("t", actor="me")
    for bad in ("", "x" * 4097, 7):
        with pytest.raises(InvalidInput, match="workspace") as refused:
            ledger.start_run(task.id, request_key="1", actor="me", workspace=bad)  # type: ignore[arg-type]
        assert refused.value.field == "workspace"
    assert ledger.runs(task.id) == []


def test_a_secret_in_a_workspace_path_is_masked(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", actor="me")
    secret = "sk-ant-api03-" + "A" * 93 + "AA"
    run = ledger.start_run(task.id, request_key="1", actor="me", workspace=f"/ws/{secret}")
    assert run.workspace is not None and secret not in run.workspace
    assert secret not in (ledger.run(run.id).workspace or "")


def test_through_the_server(remote: Remote) -> None:  # noqa: F811
    client = remote.client()
    task = client.create_task("t", actor=ME)
    run = client.start_run(task.id, request_key="1", actor=ME, workspace="/srv/ws/A-1")
    assert run.workspace == "/srv/ws/A-1"
    assert remote.ledger.run(run.id).workspace == "/srv/ws/A-1"
    assert client.runs(task.id)[0].workspace == "/srv/ws/A-1"
    client.close()


def test_runs_from_before_the_column_read_as_none(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with open_ledger(path) as ledger:
        task = ledger.create_task("t", actor="me")
        ledger.start_run(task.id, request_key="1", actor="me")
    # Back to the schema before the step: the column and the version row gone.
    conn = sqlite3.connect(path)
    for statement in SQLITE_BUCKETS_UNDONE:  # version 13's
        conn.execute(statement)
    conn.execute("ALTER TABLE run_extras DROP COLUMN workspace")
    conn.execute("ALTER TABLE run_extras DROP COLUMN resumed_session")  # version 10's
    conn.execute("ALTER TABLE run_extras DROP COLUMN fell_back")
    for table in ("notify_events", "notify_endpoints", "notify_deliveries"):  # version 11's
        conn.execute(f"DROP TABLE {table}")
    conn.execute("ALTER TABLE run_extras DROP COLUMN session_id")  # version 12's
    conn.execute("DELETE FROM schema_version WHERE version >= 9")
    conn.commit()
    conn.close()
    with open_ledger(path) as ledger:
        assert ledger.schema_version() == sqlite_schema.SCHEMA_VERSION
        (run,) = ledger.runs(task.id)
        assert run.workspace is None
