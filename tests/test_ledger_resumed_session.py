"""The vendor session a run's agent continued (issue #46), kept on the run: on SQLite, on
PostgreSQL and through `execkit serve` alike, refused when it is not a session id, and
absent (None) on a fresh run and on runs from before the column."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from ledger_backends import SQLITE_BUCKETS_UNDONE, AnyLedger
from test_remote import ME, Remote, remote  # noqa: F401 - the fixture

from execkit import FailureClass, InvalidInput
from execkit.ledger import LIST_PAGE, open_ledger
from execkit.ledger._sqlite import schema as sqlite_schema

SESSION = "1b4e28ba-2fa1-11d2-883f-0016d3cca427"


def test_a_run_keeps_the_session_it_resumed(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", actor="me")
    run = ledger.start_run(task.id, request_key="1", actor="me", resumed_session=SESSION)
    assert run.resumed_session == SESSION
    assert ledger.run(run.id).resumed_session == SESSION
    ledger.finish_run(run.id, "succeeded")
    assert [r.resumed_session for r in ledger.runs(task.id)] == [SESSION]
    other = ledger.create_task("u", actor="me")
    fresh = ledger.start_run(other.id, request_key="2", actor="me")
    assert fresh.resumed_session is None and ledger.run(fresh.id).resumed_session is None
    assert ledger.run(fresh.id).to_dict()["resumed_session"] is None


def test_a_session_that_is_not_one_is_refused_with_nothing_written(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", actor="me")
    for bad in ("", "x" * 201, 7):
        with pytest.raises(InvalidInput, match="resumed_session") as refused:
            ledger.start_run(task.id, request_key="1", actor="me", resumed_session=bad)  # type: ignore[arg-type]
        assert refused.value.field == "resumed_session"
    assert ledger.runs(task.id) == []


def test_through_the_server(remote: Remote) -> None:  # noqa: F811
    client = remote.client()
    task = client.create_task("t", actor=ME)
    run = client.start_run(task.id, request_key="1", actor=ME, resumed_session=SESSION)
    assert run.resumed_session == SESSION
    assert remote.ledger.run(run.id).resumed_session == SESSION
    assert client.runs(task.id)[0].resumed_session == SESSION
    client.close()


def _announcing(ledger: AnyLedger) -> dict[str, list[str]]:
    """Five tasks: the latest run resumed a session, the latest fell back, an earlier run
    resumed but the latest did not, no run announced anything, no run at all. Returns each
    task's id by what it is, and the run ids of the two that announce, in order."""
    ids: dict[str, list[str]] = {}

    def run(task: str, key: str, resumed: str | None = None, fell_back: str | None = None) -> str:
        started = ledger.start_run(
            task,
            request_key=key,
            actor=ME,
            ignore_backoff=True,
            resumed_session=resumed,
            fell_back=fell_back,
        )
        ledger.finish_run(
            started.id, "failed", failure_class=FailureClass.UPSTREAM, reason="usage limit"
        )
        return started.id

    for name in ("resumed", "fell back", "resumed before", "plain", "no run"):
        ids[name] = [ledger.create_task(name, actor=ME).id]
    first = run(ids["resumed"][0], "r1")
    ids["resumed"] += [first, run(ids["resumed"][0], "r2", resumed=SESSION)]
    ids["fell back"].append(run(ids["fell back"][0], "f1", fell_back="fell back from a to b"))
    run(ids["resumed before"][0], "b1", resumed=SESSION)
    run(ids["resumed before"][0], "b2")
    run(ids["plain"][0], "p1")
    return ids


def test_announced_runs_reads_the_tasks_whose_latest_run_says_something(
    ledger: AnyLedger,
) -> None:
    ids = _announcing(ledger)
    asked = [task_ids[0] for task_ids in ids.values()] + ["t-404"]
    found = ledger.announced_runs(asked)
    assert {task: [run.id for run in runs] for task, runs in found.items()} == {
        ids["resumed"][0]: ids["resumed"][1:],
        ids["fell back"][0]: ids["fell back"][1:],
    }
    assert found[ids["resumed"][0]] == ledger.runs(ids["resumed"][0])  # whole, as `runs`
    assert ledger.announced_runs([]) == {}
    with pytest.raises(InvalidInput) as refused:
        ledger.announced_runs(["t-1"] * (LIST_PAGE + 1))
    assert refused.value.field == "task_ids"
    with pytest.raises(InvalidInput):
        ledger.announced_runs([7])  # type: ignore[list-item]


def test_announced_runs_through_the_server(remote: Remote) -> None:  # noqa: F811
    ids = _announcing(remote.ledger)
    asked = [task_ids[0] for task_ids in ids.values()] + ["t-404"]
    client = remote.client()
    assert client.announced_runs(asked) == remote.ledger.announced_runs(asked)
    assert set(client.announced_runs(asked)) == {ids["resumed"][0], ids["fell back"][0]}
    client.close()


def test_runs_from_before_the_column_read_as_none(tmp_path: Path) -> None:
    path = tmp_path / "old.db"
    with open_ledger(path) as ledger:
        task = ledger.create_task("t", actor="me")
        ledger.start_run(task.id, request_key="1", actor="me")
    conn = sqlite3.connect(path)
    for statement in SQLITE_BUCKETS_UNDONE:  # version 13's
        conn.execute(statement)
    conn.execute("ALTER TABLE run_extras DROP COLUMN resumed_session")
    conn.execute("ALTER TABLE run_extras DROP COLUMN fell_back")
    for table in ("notify_events", "notify_endpoints", "notify_deliveries"):  # version 11's
        conn.execute(f"DROP TABLE {table}")
    conn.execute("ALTER TABLE run_extras DROP COLUMN session_id")  # version 12's
    conn.execute("DELETE FROM schema_version WHERE version >= 10")
    conn.commit()
    conn.close()
    with open_ledger(path) as ledger:
        assert ledger.schema_version() == sqlite_schema.SCHEMA_VERSION
        (run,) = ledger.runs(task.id)
        assert run.resumed_session is None


FELL_BACK = "fell back from claude/a1 (stopped until an operator resumes it) to codex/b2"


def test_a_run_keeps_its_fallback_announcement(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", actor="me")
    run = ledger.start_run(task.id, request_key="1", actor="me", fell_back=FELL_BACK)
    assert run.fell_back == FELL_BACK and ledger.run(run.id).fell_back == FELL_BACK
    assert ledger.run(run.id).to_dict()["fell_back"] == FELL_BACK
    for bad in ("", "x" * 2001):
        with pytest.raises(InvalidInput) as refused:
            ledger.start_run(task.id, request_key="2", actor="me", fell_back=bad)
        assert refused.value.field == "fell_back"


def test_a_fallback_through_the_server(remote: Remote) -> None:  # noqa: F811
    client = remote.client()
    task = client.create_task("t", actor=ME)
    run = client.start_run(task.id, request_key="1", actor=ME, fell_back=FELL_BACK)
    assert run.fell_back == FELL_BACK
    assert remote.ledger.run(run.id).fell_back == FELL_BACK
    client.close()
