"""Spend in the ledger (issue #45): a run's cost recorded with its result, on SQLite,
PostgreSQL and through `execkit serve`, and a ledger from before the spend schema migrated
with its runs' cost unknown."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path

import pytest
from ledger_backends import SQLITE_BUCKETS_UNDONE, AnyLedger
from test_ledger_postgres import SPEND_UNDONE, sql
from test_remote import ME, Remote, remote  # noqa: F401 - the fixture

from execkit._budget import AttemptStatus
from execkit._classify import FailureClass
from execkit._errors import Conflict, InvalidInput, StorageError
from execkit._usage import Usage, UsdSource
from execkit.cli import main
from execkit.ledger import (
    LIST_PAGE,
    SPEND_CAPABILITY,
    PostgresMigration,
    Run,
    Spend,
    TaskCost,
    migrate,
    open_ledger,
    spend_of,
    task_cost_reader,
    task_costs_of,
)
from execkit.ledger._core.spend import with_usage
from execkit.ledger._postgres.schema import SCHEMA_VERSION as PG_SCHEMA_VERSION
from execkit.ledger._sqlite import schema as sqlite_schema

COST = Usage(
    input_tokens=1200,
    output_tokens=300,
    cache_read_tokens=4000,
    cache_write_tokens=500,
    usd=0.42,
    usd_source=UsdSource.REPORTED,
    model="claude-sonnet-4",
)


def test_a_runs_cost_is_recorded_with_its_result(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", actor=ME)
    run = ledger.start_run(task.id, request_key="1", actor=ME)
    assert run.usage == Usage() and run.usd_source is UsdSource.UNKNOWN
    ended = ledger.finish_run(
        run.id, "failed", failure_class=FailureClass.WORK, reason="tests fail", usage=COST
    )
    assert ended.usage == COST
    assert ledger.run(run.id).usage == COST
    assert ledger.runs(task.id)[0].usage == COST
    shown = ledger.run(run.id).to_dict()
    assert (shown["usd"], shown["usd_source"], shown["input_tokens"]) == (0.42, "reported", 1200)
    # The same result again is a replay; another cost for it is a Conflict.
    again = ledger.finish_run(
        run.id, "failed", failure_class=FailureClass.WORK, reason="tests fail", usage=COST
    )
    assert again.usage == COST
    with pytest.raises(Conflict):
        ledger.finish_run(
            run.id,
            "failed",
            failure_class=FailureClass.WORK,
            reason="tests fail",
            usage=Usage(input_tokens=1),
        )
    assert ledger.run(run.id).usage == COST


def test_a_run_ended_without_a_report_costs_unknown_never_zero(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", actor=ME)
    run = ledger.start_run(task.id, request_key="1", actor=ME)
    ended = ledger.finish_run(run.id, "abandoned", stopped=True)
    assert ended.usd is None and ended.usd_source is UsdSource.UNKNOWN
    second = ledger.start_run(task.id, request_key="2", actor=ME)
    abandoned = ledger.abandon_run(second.id, reason="host gone", actor=ME)
    assert abandoned.usage == Usage()


def test_a_cost_that_is_not_a_usage_is_refused_naming_it(ledger: AnyLedger) -> None:
    task = ledger.create_task("t", actor=ME)
    run = ledger.start_run(task.id, request_key="1", actor=ME)
    with pytest.raises(InvalidInput) as refused:
        ledger.finish_run(run.id, "succeeded", usage={"usd": 1.0})  # type: ignore[arg-type]
    assert refused.value.field == "usage"
    assert ledger.run(run.id).status is AttemptStatus.RUNNING


def test_a_cost_comes_back_through_the_server(remote: Remote) -> None:  # noqa: F811
    client = remote.client()
    task = client.create_task("t", actor=ME)
    run = client.start_run(task.id, request_key="1", actor=ME)
    ended = client.finish_run(run.id, AttemptStatus.SUCCEEDED, usage=COST)
    assert ended.usage == COST and ended == remote.ledger.run(run.id)
    tokens_only = Usage(input_tokens=10, output_tokens=2, model="gpt-5")
    other = client.create_task("u", actor=ME)
    second = client.start_run(other.id, request_key="2", actor=ME)
    assert client.finish_run(second.id, "succeeded", usage=tokens_only).usage == tokens_only


def test_a_ledger_from_before_spend_migrates_with_its_runs_cost_unknown(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    with open_ledger(db) as ledger:
        task = ledger.create_task("t", actor=ME)
        run = ledger.start_run(task.id, request_key="1", actor=ME)
        ledger.finish_run(run.id, "failed", failure_class=FailureClass.WORK)
    # The file as version 7 left it: step 8 only adds tables (and their indexes); the
    # later steps (issue #46's) add columns of `run_extras`.
    raw = sqlite3.connect(db, isolation_level=None)
    for statement in SQLITE_BUCKETS_UNDONE:  # version 13's, first
        raw.execute(statement)
    for table in ("run_costs", "task_budgets", "spend_warnings"):
        raw.execute(f"DROP TABLE {table}")
    for table in ("notify_events", "notify_endpoints", "notify_deliveries"):  # issue #49's
        raw.execute(f"DROP TABLE {table}")
    for column in ("workspace", "resumed_session", "fell_back", "session_id"):
        raw.execute(f"ALTER TABLE run_extras DROP COLUMN {column}")
    raw.execute("DELETE FROM schema_version WHERE version >= 8")
    raw.close()
    with open_ledger(db) as ledger:
        assert ledger.migration is not None and ledger.migration.from_version == 7
        assert ledger.schema_version() == sqlite_schema.SCHEMA_VERSION
        (stored,) = ledger.runs(task.id)
        assert stored.usage == Usage() and stored.usd_source is UsdSource.UNKNOWN
        second = ledger.start_run(task.id, request_key="2", actor=ME, ignore_backoff=True)
        assert ledger.finish_run(second.id, "succeeded", usage=COST).usage == COST


def test_a_postgres_ledger_from_before_spend_migrates_with_its_runs_cost_unknown(
    pg_url: str,
) -> None:
    with open_ledger(pg_url) as ledger:
        task = ledger.create_task("t", actor=ME)
        run = ledger.start_run(task.id, request_key="1", actor=ME)
        ledger.finish_run(run.id, "failed", failure_class=FailureClass.WORK)
    later = "ALTER TABLE runs DROP COLUMN workspace, DROP COLUMN resumed_session, " + (
        "DROP COLUMN fell_back, DROP COLUMN session_id"  # issue #46's steps, after spend's
    )
    notify = "DROP TABLE notify_events, notify_endpoints, notify_deliveries"  # issue #49's
    undone = (*SPEND_UNDONE, later, notify, "DELETE FROM schema_version WHERE version >= 6")
    for statement in undone:
        sql(pg_url, statement)
    done = migrate(pg_url, backed_up=True)
    assert isinstance(done, PostgresMigration) and done.from_version == 5
    with open_ledger(pg_url) as ledger:
        assert ledger.schema_version() == PG_SCHEMA_VERSION
        (stored,) = ledger.runs(task.id)
        assert stored.usage == Usage() and stored.usd_source is UsdSource.UNKNOWN
        second = ledger.start_run(task.id, request_key="2", actor=ME, ignore_backoff=True)
        assert ledger.finish_run(second.id, "succeeded", usage=COST).usage == COST


def test_spend_sums_runs_each_once_and_says_when_usd_is_unknown() -> None:
    priced = Usage(input_tokens=1000, usd=0.01, usd_source=UsdSource.PRICED, model="gpt-5")
    first = _run("r-1", COST)
    second = _run("r-2", priced)
    unreported = _run("r-3", None)
    both = spend_of([first, second])
    assert both.runs == 2 and both.unknown_usd == 0
    assert both.usage.usd == pytest.approx(0.43) and both.usage.tokens == COST.tokens + 1000
    assert both.usage.usd_source is UsdSource.PRICED  # the less certain of the two
    three = spend_of([first, second, unreported])
    assert (three.runs, three.unknown_usd) == (3, 1)
    assert three.usage.usd == pytest.approx(0.43) and three.usage.usd_source is UsdSource.UNKNOWN
    assert three.phrase() == "$0.43+?, 7,000 tokens over 3 runs (1 with unknown USD)"
    assert spend_of([]) == Spend() and spend_of([unreported]).usage.usd is None


def _run(run_id: str, usage: Usage | None) -> Run:
    run = Run(run_id, "t-1", 1, AttemptStatus.SUCCEEDED, None, None, run_id, ME, False, 1.0, 2.0)
    return run if usage is None else with_usage(run, usage)


def _costed(ledger: AnyLedger) -> list[str]:
    """Tasks whose runs reported: USD and tokens, then tokens alone; $0.00 exactly; an
    unfinished run; no run at all. Their ids."""
    tasks = [ledger.create_task(f"t{n}", actor=ME).id for n in range(4)]
    paid = Usage(input_tokens=100, usd=0.25, usd_source=UsdSource.REPORTED)
    unpriced = Usage(output_tokens=500, usd_source=UsdSource.UNKNOWN)
    free = Usage(usd=0.0, usd_source=UsdSource.REPORTED)
    for key, (task, usage) in enumerate(
        [(tasks[0], paid), (tasks[0], unpriced), (tasks[1], free), (tasks[2], None)]
    ):
        run = ledger.start_run(task, request_key=str(key), actor=ME, ignore_backoff=True)
        if usage is not None:
            ledger.finish_run(run.id, "failed", failure_class=FailureClass.WORK, usage=usage)
    return tasks


def test_task_costs_sum_each_tasks_runs_as_its_spend_rows_do(ledger: AnyLedger) -> None:
    tasks = [ledger.create_task("quiet", actor=ME).id]
    ledger.start_run(tasks[0], request_key="q", actor=ME)
    assert ledger.costs_reported() is False and task_cost_reader(ledger) is None
    tasks += _costed(ledger)
    assert ledger.costs_reported() is True
    costs = ledger.task_costs([*tasks, "t-404"])
    assert costs == task_costs_of(ledger.spend_rows())
    assert costs[tasks[1]] == TaskCost(runs=2, usd=0.25, unknown_usd=1, tokens=600)
    assert costs[tasks[2]] == TaskCost(runs=1, usd=0.0, unknown_usd=0, tokens=0)
    assert costs[tasks[3]] == TaskCost(runs=1, usd=0.0, unknown_usd=1, tokens=0)  # running
    assert tasks[4] not in costs  # no run
    read = task_cost_reader(ledger)
    assert read is not None and read(tasks[1:3]) == {t: costs[t] for t in tasks[1:3]}
    assert ledger.task_costs([]) == {}
    with pytest.raises(InvalidInput) as refused:
        ledger.task_costs(["t-1"] * (LIST_PAGE + 1))
    assert refused.value.field == "task_ids"


def test_task_costs_through_the_server_are_the_ledgers(remote: Remote) -> None:  # noqa: F811
    client = remote.client()
    assert task_cost_reader(client) is None
    tasks = _costed(remote.ledger)
    here, there = task_cost_reader(remote.ledger), task_cost_reader(client)
    assert here is not None and there is not None
    assert there([*tasks, "t-404"]) == here([*tasks, "t-404"]) != {}
    client.close()


def test_run_finish_takes_a_cost_and_task_show_sums_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "ledger.db")
    assert main(["task", "create", "t", "--db", db]) == 0
    assert main(["run", "start", "t-1", "--request-key", "k", "--db", db]) == 0
    capsys.readouterr()
    usage = '{"input_tokens": 1200, "output_tokens": 300, "usd": 0.42, "usd_source": "reported"}'
    assert main(["run", "finish", "r-1", "succeeded", "--usage", usage, "--db", db, "--json"]) == 0
    finished = json.loads(capsys.readouterr().out)
    assert (finished["usd"], finished["usd_source"], finished["output_tokens"]) == (
        0.42,
        "reported",
        300,
    )
    assert main(["task", "show", "t-1", "--db", db, "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["spend"]["usage"]["usd"] == 0.42 and shown["spend"]["tokens"] == 1500
    assert main(["task", "show", "t-1", "--db", db]) == 0
    shown = capsys.readouterr().out
    assert "spend $0.42, 1,500 tokens over 1 run" in shown and "spend budget" not in shown
    # A cost that does not read is `invalid`, naming the flag, and nothing is written.
    assert main(["task", "create", "u", "--db", db]) == 0
    assert main(["run", "start", "t-2", "--request-key", "k2", "--db", db]) == 0
    capsys.readouterr()
    assert main(["run", "finish", "r-2", "succeeded", "--usage", "{", "--db", db]) == 3
    assert "--usage" in capsys.readouterr().err
    assert main(["run", "finish", "r-2", "succeeded", "--usage", '{"usd": -1}', "--db", db]) == 3


@pytest.mark.parametrize("remote", [frozenset({SPEND_CAPABILITY})], indirect=True)
def test_a_server_without_spend_is_never_sent_a_cost(remote: Remote) -> None:  # noqa: F811
    client = remote.client()
    task = client.create_task("t", actor=ME)
    run = client.start_run(task.id, request_key="1", actor=ME)
    with pytest.raises(StorageError, match=r"spend\.caps"):
        client.finish_run(run.id, "succeeded", usage=COST)
    assert remote.ledger.run(run.id).status is AttemptStatus.RUNNING  # nothing sent
    with pytest.raises(StorageError, match=r"spend\.caps"):
        client.spend_config()
    assert client.finish_run(run.id, "succeeded").usage == Usage()  # without: as before
