"""A PostgreSQL store decides the next admission or result of a task on its copy of the row
its own last transaction left (issue #33: one round trip each), and the database admits it
only if the row is still that copy (`execkit/ledger/_postgres/copies.py`). These tests
change the row from another store between the two and check that nothing is decided on a
stale copy: the guard refuses it, nothing is written, and the transaction runs again on
rows read under the lock. Round trips are counted on the wire, as in
test_postgres_round_trips.py; nothing is timed.
"""

from __future__ import annotations

import functools
import getpass
from collections.abc import Iterator
from typing import Any

import pytest
from test_postgres_round_trips import round_trips

from execkit._classify import FailureClass
from execkit._errors import LaneWaiting
from execkit.ledger import PostgresLedger
from execkit.ledger._core import TaskRecord
from execkit.ledger._postgres import copies as pg_copies


@pytest.fixture
def two(pg_url: str) -> Iterator[tuple[PostgresLedger, PostgresLedger]]:
    """Two stores on one ledger (two dispatchers), each with a pool of one connection."""
    here, there = PostgresLedger(pg_url, pool_size=1), PostgresLedger(pg_url, pool_size=1)
    with here, there:
        yield here, there


def test_an_admission_on_a_copy_another_store_made_stale_is_decided_on_the_row(
    two: tuple[PostgresLedger, PostgresLedger],
) -> None:
    here, there = two
    task = here.create_task("t", max_attempts=10, actor="a")
    run = here.start_run(task.id, request_key="h1", actor="a", now=1000.0)
    here.finish_run(run.id, "failed", now=1001.0)  # here's copy: one attempt, none running
    run = there.start_run(task.id, request_key="t1", actor="a", now=5000.0)
    there.finish_run(run.id, "failed", now=5001.0)
    # The guard finds the row changed (its failed batch and the rollback), then the
    # admission on rows read: 2 more. Decided on the copy, it would be attempt 2 again.
    trips = round_trips(here, lambda: here.start_run(task.id, request_key="h2", actor="a"))
    assert trips == 4
    assert [(r.attempt, r.request_key) for r in here.runs(task.id)] == [
        (1, "h1"),
        (2, "t1"),
        (3, "h2"),
    ]
    assert here.validate() == []


def test_a_refusal_decided_on_a_copy_is_decided_again_on_the_row(
    two: tuple[PostgresLedger, PostgresLedger],
) -> None:
    """A copy that says the task is stopped is no reason to refuse: an operator may have
    asked for a retry through another store since."""
    here, there = two
    task = here.create_task("t", actor="a")
    run = here.start_run(task.id, request_key="h1", actor="a", now=1000.0)
    here.finish_run(
        run.id, "failed", failure_class=FailureClass.ENVIRONMENT, reason="no key", now=1001.0
    )
    there.retry_task(task.id, actor=getpass.getuser(), reason="key installed", now=1002.0)
    retried = here.start_run(task.id, request_key="h2", actor="a", now=1003.0)
    assert (retried.attempt, retried.forced) == (2, True)
    assert here.validate(now=1004.0) == []


def test_a_stale_copy_leaves_the_connection_working_when_psycopg_prepared_on_it(
    two: tuple[PostgresLedger, PostgresLedger],
) -> None:
    """The failed guard's transaction is rolled back on the connection the wire prepared
    its statements on, where psycopg, after a few reads, prepared its own: a ROLLBACK sent
    through psycopg would make it deallocate them all, the wire's too."""
    here, there = two
    task = here.create_task("t", max_attempts=10, actor="a")
    run = here.start_run(task.id, request_key="h1", actor="a", now=1000.0)
    here.finish_run(run.id, "failed", now=1001.0)
    for _ in range(6):  # psycopg prepares a statement at its fifth use
        here.get_task(task.id)
    run = there.start_run(task.id, request_key="t1", actor="a", now=5000.0)
    there.finish_run(run.id, "failed", now=5001.0)
    for n in range(3):  # the stale one, then on rows read, then on its own copy again
        run = here.start_run(task.id, request_key=f"h{n + 2}", actor="a", now=9000.0 + n * 3600)
        here.finish_run(run.id, "failed", now=9001.0 + n * 3600)
    assert [r.attempt for r in here.runs(task.id)] == [1, 2, 3, 4, 5]
    assert here.validate() == []


def test_runs_drawn_for_copies_keep_each_task_s_runs_in_their_order(
    two: tuple[PostgresLedger, PostgresLedger],
) -> None:
    """A copy holds the number of the task's next run, drawn under its lock; the two stores
    take turns (and each keeps a copy) so that numbers drawn for copies and numbers drawn on
    rows read interleave. Runs read in number order are in attempt order."""
    here, there = two
    tasks = [here.create_task(f"t{n}", max_attempts=100, actor="a").id for n in range(3)]
    turns = [here, here, there, here, there, there, here, there, here, here, there, here]
    for n, ledger in enumerate(turns):
        for task_id in tasks[n % 2 :]:
            at = 1000.0 + n * 3600
            run = ledger.start_run(task_id, request_key=f"{task_id}-{n}", actor="a", now=at)
            ledger.finish_run(run.id, "failed", now=at + 1)
    for task_id in tasks:
        attempts = [r.attempt for r in here.runs(task_id)]  # in the order of their numbers
        assert attempts == list(range(1, len(attempts) + 1))
    assert here.validate() == []


def _record(task_id: str) -> TaskRecord:
    unset: list[Any] = [None] * (len(TaskRecord._fields) - 1)
    return TaskRecord(task_id, *unset)


def test_a_store_keeps_a_bounded_number_of_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pg_copies, "MAX_COPIES", 3)
    kept = pg_copies.Copies()
    for n in range(5):
        kept.put(pg_copies.TaskCopy(_record(f"t{n}"), n, n, None, None, None))
    assert len(kept) == 3
    assert [kept.of_task(f"t{n}") is not None for n in range(5)] == [False, False, True, True, True]


def test_an_admission_on_a_lane_is_decided_on_a_copy_only_while_the_lane_is_open(
    two: tuple[PostgresLedger, PostgresLedger],
) -> None:
    """On a copy, a lane is taken for open; the guard checks that every lane of the
    admission that has a row is open (locked). A lane another store parked since is read
    under its lock, and refuses."""
    here, there = two
    lane = "claude/default"
    task = here.create_task("t", max_attempts=10, actor="a")
    run = here.start_run(task.id, request_key="h1", actor="a", now=1000.0, lane=lane)
    here.finish_run(run.id, "failed", now=1001.0)  # the lane's first event: its row, open
    run = here.start_run(task.id, request_key="h2", actor="a", now=2000.0, lane=lane)
    here.finish_run(run.id, "failed", now=2001.0)
    start = functools.partial(here.start_run, task.id, actor="a", lane=lane)
    assert round_trips(here, lambda: start(request_key="h3", now=3000.0)) == 1
    here.finish_run(here.runs(task.id)[-1].id, "failed", now=3001.0)
    other = there.create_task("o", actor="a")
    parked = there.start_run(other.id, request_key="o1", actor="a", now=3002.0, lane=lane)
    there.finish_run(
        parked.id,
        "failed",
        failure_class=FailureClass.UPSTREAM,
        not_before=9000.0,
        lane_cause="reset",
        now=3003.0,
    )
    with pytest.raises(LaneWaiting):
        start(request_key="h4", now=4000.0)
    assert [r.attempt for r in here.runs(task.id)] == [1, 2, 3]


def test_a_store_that_meets_a_task_once_draws_no_run_number(pg_url: str) -> None:
    """One process a command (the CLI): each transaction's store is new, keeps its copy
    of nothing it uses again, and draws no number for it: the run ids have no gaps."""
    with PostgresLedger(pg_url) as ledger:
        task = ledger.create_task("t", max_attempts=10, actor="a")
    ids = []
    for n in range(3):
        with PostgresLedger(pg_url) as ledger:
            run = ledger.start_run(task.id, request_key=f"k{n}", actor="a", now=1000.0 + n * 3600)
            ids.append(run.id)
        with PostgresLedger(pg_url) as ledger:
            ledger.finish_run(run.id, "failed", now=1001.0 + n * 3600)
    assert ids == ["r-1", "r-2", "r-3"]


def _rows_visited(plan: dict[str, Any], table: str) -> int:
    """The rows the nodes of an `EXPLAIN (ANALYZE, FORMAT JSON)` plan read from `table`."""
    own = plan["Actual Rows"] * plan["Actual Loops"] if plan.get("Relation Name") == table else 0
    return own + sum(_rows_visited(child, table) for child in plan.get("Plans", ()))


@pytest.mark.parametrize("plans", ["force_custom_plan", "force_generic_plan"])
def test_reading_a_task_back_visits_its_running_run_only_whatever_its_history(
    pg_url: str, plans: str
) -> None:
    """The copy's read-back (`tx._read_back`), on a new ledger whose tables have no
    statistics yet, finds the task's running run by its number: one row of the task's
    runs, not all of them (joined on `t.running` it read all 121 and filtered them)."""
    import psycopg
    from psycopg import sql

    from execkit.ledger._postgres import tx as pg_tx

    with PostgresLedger(pg_url) as ledger:
        with psycopg.connect(pg_url, autocommit=True) as conn:
            # No statistics, whenever autovacuum would have come by.
            conn.execute("ALTER TABLE runs SET (autovacuum_enabled = false)")
            conn.execute("ALTER TABLE tasks SET (autovacuum_enabled = false)")
        task = ledger.create_task("t", max_attempts=1000, actor="a")
        for n in range(120):
            at = 1000.0 + n * 3600
            run = ledger.start_run(task.id, request_key=f"k{n}", actor="a", now=at)
            ledger.finish_run(run.id, "failed", now=at + 1.0)
        ledger.start_run(task.id, request_key="last", actor="a", now=1000.0 + 120 * 3600)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        conn.execute(sql.SQL("SET plan_cache_mode = {}").format(sql.SQL(plans)))
        conn.execute(f"PREPARE read_back(text) AS {pg_tx._NOT_DRAWING.replace('%s', '$1')}")
        found = conn.execute(
            sql.SQL("EXPLAIN (ANALYZE, FORMAT JSON) EXECUTE read_back({})").format(
                sql.Literal(task.id)
            )
        ).fetchone()
    assert found is not None
    assert _rows_visited(found[0][0]["Plan"], "runs") == 1
