"""`db check` reads every task with its runs in one streamed statement (`Tx.history_rows`)
and folds the values as stored; a task it doubts is read again and checked the validating
way, so every problem is named as that way names it. On both backends.

Nothing here is timed (benchmarks/bench_bulk.py measures `db check` at 100,000 runs): the
counts are of the statements made and the rows built.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from _support import spy_on_reads
from ledger_backends import AnyLedger, RawSql, is_postgres_url
from test_bulk_projection import _every_kind
from test_ledger_listing import _tasks

import execkit.ledger._core.inspection as inspection
from execkit.ledger import Run
from execkit.ledger._core import HISTORY_ROW, SUMMARY_AT

NOW = 1200.0  # before the running run's lease ends


def _counting_tx(monkeypatch: pytest.MonkeyPatch, ledger: AnyLedger) -> Counter[str]:
    """How many times each `Tx` read is called through the ledger's store, and
    (`"history row"`) how many rows the callers take from `history_rows`."""
    calls: Counter[str] = Counter()

    class Counting:
        def __init__(self, tx: Any) -> None:
            self._tx = tx

        def __getattr__(self, name: str) -> Any:
            calls[name] += 1
            return getattr(self._tx, name)

        def history_rows(self) -> Iterator[tuple[Any, ...]]:
            calls["history_rows"] += 1
            for row in self._tx.history_rows():
                calls["history row"] += 1
                yield row

    spy_on_reads(monkeypatch, ledger._store, Counting)
    return calls


def _runs_built(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    built: list[str] = []
    real = Run.__init__

    def counted(self: Run, *args: Any, **kwargs: Any) -> None:
        built.append("run")
        real(self, *args, **kwargs)

    monkeypatch.setattr(Run, "__init__", counted)
    return built


def test_db_check_reads_every_history_in_one_statement_and_builds_no_run(
    ledger: AnyLedger, monkeypatch: pytest.MonkeyPatch
) -> None:
    _tasks(ledger, 7)  # three with no run, four with one
    calls = _counting_tx(monkeypatch, ledger)
    built = _runs_built(monkeypatch)
    assert ledger.validate(now=5000.0) == []
    task_reads = ("task", "tasks", "task_page", "runs", "runs_of", "all_runs", "run")
    reads = {name: n for name, n in calls.items() if name in task_reads or "history" in name}
    assert reads == {"history_rows": 1, "history row": 7}, "one row a task or a run"
    assert built == [], "a sound history is folded from its values"


def test_the_history_rows_are_every_task_with_its_runs_in_order(ledger: AnyLedger) -> None:
    made = _every_kind(ledger)
    with ledger._store.read() as tx:
        rows = [dict(zip(HISTORY_ROW, row, strict=True)) for row in tx.history_rows()]
        tasks = tx.tasks()
        runs = tx.all_runs()
    with ledger._store.write() as written:  # the same rows in a write transaction
        assert [dict(zip(HISTORY_ROW, row, strict=True)) for row in written.history_rows()] == rows
    expected = []
    for task in tasks:
        own: list[Run | None] = [run for run in runs if run.task_id == task.id] or [None]
        for run in own:
            expected.append(
                {
                    "task_id": task.id,
                    "task_status": task.stored_status,
                    **dict(
                        zip(
                            HISTORY_ROW[2 : 2 + len(task) - SUMMARY_AT],
                            task[SUMMARY_AT:],
                            strict=True,
                        )
                    ),
                    "run_id": None if run is None else run.id,
                    "attempt": None if run is None else run.attempt,
                    "status": None if run is None else str(run.status),
                    "failure_class": None
                    if run is None or run.failure_class is None
                    else str(run.failure_class),
                    "reason": None if run is None else run.reason,
                    "forced": None if run is None else run.forced,
                    "started_at": None if run is None else run.started_at,
                    "ended_at": None if run is None else run.ended_at,
                    "not_before": None if run is None else run.not_before,
                    "lease_expires_at": None if run is None else run.lease_expires_at,
                    "stopped": None if run is None else run.stopped,
                    "lane_held": None if run is None else run.lane_held,
                }
            )
    assert len(rows) == len(expected) > len(made)
    for row, want in zip(rows, expected, strict=True):
        if want["run_id"] is None:  # a task with no run: its run's columns say nothing
            row = {**row, "forced": None, "stopped": None, "lane_held": None}
        # A flag as the backend holds it (SQLite: 0 or 1).
        flags = ("forced", "stopped", "lane_held", "last_forced", "last_stopped", "last_lane_held")
        row = {k: bool(v) if k in flags and v is not None else v for k, v in row.items()}
        want = {k: bool(v) if k in flags and v is not None else v for k, v in want.items()}
        assert row == want


def test_postgresql_streams_the_rows_through_a_server_side_cursor(
    ledger: AnyLedger, ledger_target: str
) -> None:
    if not is_postgres_url(ledger_target):
        pytest.skip("SQLite steps its statement a row at a time as the cursor is iterated")
    _tasks(ledger, 5)
    with ledger._store.read() as tx:
        conn: Any = tx._conn  # type: ignore[attr-defined]  # the PostgreSQL transaction's own
        rows = tx.history_rows()
        assert next(rows)[0] == "t-1"
        opened = "SELECT count(*) FROM pg_cursors WHERE name = 'execkit_history_rows'"
        assert conn.execute(opened).fetchone() == (1,), "the rows are fetched a batch at a time"
        assert len(list(rows)) == 4
        assert conn.execute(opened).fetchone() == (0,), "closed once read"


def _damages(target: str, made: dict[str, str], ledger: AnyLedger) -> dict[str, list[str]]:
    """Hand edits only a bug or another writer could make, each as the SQL that makes it on
    this backend, by name."""
    pg = is_postgres_url(target)

    def summary(task: str, change: str) -> str:
        if pg:
            return f"UPDATE tasks SET {change} WHERE id = '{made[task]}'"
        return f"UPDATE task_summaries SET {change} WHERE task_id = '{made[task]}'"

    def run_of(task: str) -> str:
        return ledger.runs(made[task])[-1].id

    failed = run_of("work failed, backoff over")
    stop = (  # PostgreSQL's CHECK refuses it: an older schema, or a hand edit past it
        [
            "ALTER TABLE runs DROP CONSTRAINT runs_stopped_abandoned",
            f"UPDATE runs SET stopped = true WHERE id = '{failed}'",
        ]
        if pg
        else [f"INSERT INTO run_stops (run_id) VALUES ('{failed}')"]
    )
    return {
        "streak drifted": [summary("upstream, backing off", "uncharged_streak = 3")],
        "charged drifted": [summary("done", "charged_attempts = 0")],
        "last reason drifted": [summary("environment", "last_reason = 'edited'")],
        "last forced flipped": [summary("explicit limit", "last_forced = true")],
        "running forgotten": [summary("running", "running = NULL")],
        "a gap": [f"UPDATE runs SET attempt = 3 WHERE id = '{failed}'"],
        "done with no success": [f"UPDATE tasks SET status = 'done' WHERE id = '{made['new']}'"],
        "open after a success": [f"UPDATE tasks SET status = 'open' WHERE id = '{made['done']}'"],
        "stopped but failed": stop,
    }


@pytest.mark.parametrize(
    "damage",
    [
        "none",
        "streak drifted",
        "charged drifted",
        "last reason drifted",
        "last forced flipped",
        "running forgotten",
        "a gap",
        "done with no success",
        "open after a success",
        "stopped but failed",
        "lease expired",
    ],
)
def test_db_check_names_every_problem_as_the_validating_way_does(
    ledger: AnyLedger,
    raw_sql: RawSql,
    ledger_target: str,
    monkeypatch: pytest.MonkeyPatch,
    damage: str,
) -> None:
    made = _every_kind(ledger)
    for sql in _damages(ledger_target, made, ledger).get(damage, []):
        raw_sql(sql)
    at = 10.0**10 if damage == "lease expired" else NOW
    calls = _counting_tx(monkeypatch, ledger)
    found = ledger.validate(now=at)
    doubted = calls["task"]
    # Every task checked the validating way, as `db check` did before it folded values.
    monkeypatch.setattr(inspection, "_history_is_clean", lambda rows, at: False)
    assert found == ledger.validate(now=at)
    assert (found == []) is (damage == "none")
    assert doubted == len(found), "only a task with a problem is read again"
