"""The spend windows' hourly sums (issue #45, SQLite schema 13, PostgreSQL 11): triggers keep
`spend_buckets` equal to what the runs hold, whatever changes a run's effective cost and in
whichever order, so a window's sum reads its whole hours and only a partial first hour run by
run. Checked against a model of every run's holding, on both backends."""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Any

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from ledger_backends import SQLITE_BUCKETS_UNDONE, AnyLedger, open_at
from test_ledger_postgres import BUCKETS_UNDONE, sql
from test_remote import ME

from execkit._classify import FailureClass
from execkit._usage import Usage, UsdSource
from execkit.ledger import SpendCap, SpendWindow, migrate
from execkit.ledger._postgres import schema as pg_schema
from execkit.ledger._postgres.tx import _windows_sql
from execkit.ledger._sqlite import schema as sqlite_schema

HOUR = 3600.0
T0 = 1_800_000_000.0  # 2027-01-15 08:00 UTC: on the hour
LANES = [None, "claude/default", "codex/default"]
BIG = SpendCap(SpendWindow.WEEK, usd=1e9, tokens=10**15)
COST = Usage(input_tokens=70, usd=0.07, usd_source=UsdSource.PRICED)


def window(ledger: AnyLedger, since: float, lane: str | None) -> tuple[float, int]:
    """What the ledger's window sum says the runs started at or after `since` hold."""
    with ledger._store.read() as tx:
        usd, tokens, _first = tx.window_spend(since, lane)
    return usd, tokens


def effective(reserved: tuple[float, int], cost: Usage | None, running: bool) -> tuple[float, int]:
    """The model: what a run holds of its windows."""
    if running or cost is None:
        return reserved
    usd = reserved[0] if cost.usd is None else cost.usd
    tokens = reserved[1] if cost.usd is None and cost.tokens == 0 else cost.tokens
    return usd, tokens


_OP = st.one_of(
    st.tuples(st.just("start"), st.integers(0, 2), st.integers(0, 3 * 3600 - 1)),
    st.tuples(st.just("grow"), st.integers(0, 20), st.integers(1, 300)),
    st.tuples(
        st.just("finish"),
        st.integers(0, 20),
        st.sampled_from(["priced", "tokens", "none", "abandoned", "stopped"]),
    ),
)


@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(ops=st.lists(_OP, min_size=1, max_size=30))
def test_prop_the_hourly_sums_equal_what_the_runs_hold(
    new_target: Callable[[], str], ops: list[tuple[Any, ...]]
) -> None:
    with open_at(new_target()) as ledger:
        ledger.set_spend_cap(BIG, actor=ME, floor_usd=0.25, floor_tokens=100)
        runs: list[dict[str, Any]] = []
        for op in ops:
            if op[0] == "start":
                _kind, lane_index, offset = op
                task = ledger.create_task(f"t{len(runs)}", actor=ME).id
                at = T0 + offset
                lane = LANES[lane_index]
                run = ledger.start_run(task, request_key=task, actor=ME, now=at, lane=lane)
                room = ledger.spend_room(run.id, now=at)
                assert room.usd is not None and room.tokens is not None
                runs.append({"id": run.id, "at": at, "lane": lane, "running": True,
                             "reserved": (room.usd, room.tokens), "cost": None})  # fmt: skip
            elif not runs:
                continue
            elif op[0] == "grow":
                run_model = runs[op[1] % len(runs)]
                if not run_model["running"]:
                    continue
                spent = Usage(output_tokens=op[2] * 10, usd=op[2] / 100,
                              usd_source=UsdSource.REPORTED)  # fmt: skip
                room = ledger.spend_room(run_model["id"], spent=spent, now=T0 + 4 * HOUR)
                assert room.stop is None and room.usd is not None and room.tokens is not None
                run_model["reserved"] = (room.usd, room.tokens)
            else:
                run_model = runs[op[1] % len(runs)]
                if not run_model["running"]:
                    continue
                how = op[2]
                cost = {
                    "priced": Usage(input_tokens=70, usd=0.07, usd_source=UsdSource.PRICED),
                    "tokens": Usage(input_tokens=33),
                }.get(how)
                if how in ("abandoned", "stopped"):
                    ledger.finish_run(run_model["id"], "abandoned", stopped=how == "stopped",
                                      reason="gone", now=T0 + 4 * HOUR)  # fmt: skip
                else:
                    ledger.finish_run(run_model["id"], "failed", failure_class=FailureClass.WORK,
                                      usage=cost, now=T0 + 4 * HOUR)  # fmt: skip
                run_model["running"] = False
                run_model["cost"] = cost
        windows = [
            (since, lane)
            for since in (T0 - HOUR, T0, T0 + 1800, T0 + HOUR + 1, T0 + 2 * HOUR + 3599)
            for lane in [*LANES[1:], None]
        ]
        wanted: list[tuple[float, int]] = []
        for since, lane in windows:
            held = [
                effective(r["reserved"], r["cost"], r["running"])
                for r in runs
                if r["at"] >= since and (lane is None or r["lane"] == lane)
            ]
            wanted.append((sum(u for u, _t in held), sum(t for _u, t in held)))
            usd, tokens = window(ledger, since, lane)
            assert usd == pytest.approx(wanted[-1][0], abs=1e-9)
            assert tokens == wanted[-1][1]
        # As an admission reads them (under the spend lock, in a write transaction): windows
        # of every shape (on the hour or inside one, of a lane or of all) in one statement.
        for shape in (windows[:2], windows[2:7], windows[::-3], windows):
            with ledger._store.write() as tx:
                _recent, together = tx.spend_reads(None, 0, shape)
            for (usd, tokens), (usd_wanted, tokens_wanted) in zip(
                together, [wanted[windows.index(w)] for w in shape], strict=True
            ):
                assert usd == pytest.approx(usd_wanted, abs=1e-9)
                assert tokens == tokens_wanted


def test_a_window_reads_whole_hours_and_only_the_partial_hours_runs(ledger: AnyLedger) -> None:
    ledger.set_spend_cap(BIG, actor=ME, floor_usd=0.5, floor_tokens=10)
    for n in range(6):
        task = ledger.create_task(f"t{n}", actor=ME).id
        ledger.start_run(task, request_key=task, actor=ME, now=T0 + n * 1200, lane=LANES[1])
    # Runs at +0, +20, +40 min (hour 0), +60, +80, +100 min (hour 1).
    assert window(ledger, T0, LANES[1]) == pytest.approx((3.0, 60))
    assert window(ledger, T0 + 1, LANES[1]) == pytest.approx((2.5, 50))  # a partial hour
    assert window(ledger, T0 + HOUR, None) == pytest.approx((1.5, 30))
    assert window(ledger, T0, LANES[2]) == (0.0, 0)


def _ledger_of_step_13(backend: str, target: str) -> None:
    """The ledger at `target` as SQLite's step 13 (PostgreSQL's 11) left it: its buckets
    holding what its running runs reserve too, by that step's own statements."""
    if backend == "sqlite":
        with sqlite3.connect(target, isolation_level=None) as raw:
            # Step 13 kept a running run's reservation in its own run_costs row.
            raw.execute(
                "INSERT INTO run_costs (run_id, task_id, lane, started_at, reserved_usd, "
                "reserved_tokens) SELECT r.id, r.task_id, (SELECT lane FROM run_lanes WHERE "
                "run_id = r.id), r.started_at, x.reserved_usd, x.reserved_tokens FROM runs r "
                "JOIN run_extras x ON x.run_id = r.id WHERE r.status = 'running' "
                "AND x.reserved_usd IS NOT NULL"
            )
            for statement in SQLITE_BUCKETS_UNDONE:
                raw.execute(statement)
            for statement in sqlite_schema.SCHEMA_STEPS[13]:
                raw.execute(statement)
            raw.execute("DELETE FROM schema_version WHERE version = 14")
        return
    for statement in (*BUCKETS_UNDONE, *pg_schema.SCHEMA_STEPS[11]):
        sql(target, statement)
    sql(target, "DELETE FROM schema_version WHERE version >= 12")


def test_a_ledger_whose_buckets_held_running_runs_migrates_to_what_they_hold(
    backend: str, new_target: Callable[[], str]
) -> None:
    # SQLite's step 14 (PostgreSQL's 12): the buckets hold what ended runs hold, and a
    # window reads its running runs' reservations from the runs; a ledger whose buckets
    # held those reservations too is summed again, its windows holding what they held.
    target = new_target()
    with open_at(target) as ledger:
        ledger.set_spend_cap(BIG, actor=ME, floor_usd=0.5, floor_tokens=10)
        tasks = [ledger.create_task(f"t{n}", actor=ME).id for n in range(4)]
        runs = [
            ledger.start_run(task, request_key=task, actor=ME, now=T0 + 600 * n, lane=LANES[1])
            for n, task in enumerate(tasks)
        ]
        for run in runs[:2]:
            ledger.finish_run(run.id, "succeeded", usage=COST, now=T0 + 3000)
        before = [window(ledger, since, lane) for since in (T0, T0 + 1) for lane in LANES]
    assert before[0] == pytest.approx((2 * 0.07 + 2 * 0.5, 2 * 70 + 2 * 10))
    _ledger_of_step_13(backend, target)
    if backend == "postgres":
        done = migrate(target, backed_up=True)
        assert done is not None and done.from_version == 11
    with open_at(target) as ledger:
        if backend == "sqlite":
            assert ledger.migration is not None and ledger.migration.from_version == 13
        after = [window(ledger, since, lane) for since in (T0, T0 + 1) for lane in LANES]
        for (usd, tokens), (usd_before, tokens_before) in zip(after, before, strict=True):
            assert usd == pytest.approx(usd_before) and tokens == tokens_before
        ledger.finish_run(runs[2].id, "succeeded", usage=COST, now=T0 + 3100)
        assert window(ledger, T0, None) == pytest.approx((3 * 0.07 + 0.5, 3 * 70 + 10))


def _rows_read(plan: dict[str, Any], table: str) -> int:
    """The rows every scan of `table` in an EXPLAIN (ANALYZE, FORMAT JSON) plan read: what
    it returned and what its filters removed, over all its loops."""
    read = 0
    if plan.get("Relation Name") == table:
        read += (plan["Actual Rows"] + plan.get("Rows Removed by Filter", 0)) * plan[
            "Actual Loops"
        ] + plan.get("Rows Removed by Index Recheck", 0)
    for child in plan.get("Plans", ()):
        read += _rows_read(child, table)
    return read


def test_each_window_reads_only_its_own_hours(pg_url: str) -> None:
    # PostgreSQL reads the windows' hours in one scan of the buckets and their partial hours
    # in one scan of the runs. The first scan once read every bucket its lanes ever had,
    # and the second ran from the earliest window start to the latest whole hour: both
    # grew with the ledger, read at every capped admission.
    with open_at(pg_url) as ledger:
        ledger.set_spend_cap(BIG, actor=ME, floor_usd=0.5, floor_tokens=10)
        for n in range(40):  # one an hour, from 40 hours before T0 (08:00) to 07:01
            task = ledger.create_task(f"t{n}", actor=ME).id
            at = T0 - (40 - n) * HOUR + 60
            run = ledger.start_run(task, request_key=task, actor=ME, now=at, lane=LANES[1])
            ledger.finish_run(run.id, "succeeded", usage=COST, now=at + 30)
    # The day from 00:00 (its 8 runs' hours), and 5 hours of the lane to 13:30 (none).
    day, rolling = (T0 - 8 * HOUR, None), (T0 + 0.5 * HOUR, LANES[1])
    plan, rows = _windows_read(pg_url, [day, rolling])
    assert (_rows_read(plan, "spend_buckets"), _rows_read(plan, "runs")) == (8, 0)
    assert rows == [(0, pytest.approx(8 * 0.07), 8 * 70), (1, 0.0, 0)]


def _windows_read(
    pg_url: str, windows: list[tuple[float, str | None]]
) -> tuple[dict[str, Any], list[tuple[Any, ...]]]:
    """The windows' statement's plan as it ran (EXPLAIN ANALYZE, as JSON) and its rows."""
    statement, params = _windows_sql(windows)
    with psycopg.connect(pg_url, autocommit=True) as conn:
        # A table this small is read whole whatever the condition: the index shows the range.
        conn.execute("SET enable_seqscan = off")
        [[explained]] = conn.execute(
            "EXPLAIN (ANALYZE, FORMAT JSON) " + statement, params
        ).fetchall()
    return explained[0]["Plan"], sorted(sql(pg_url, statement, params))


def _loops(plan: dict[str, Any], table: str) -> int:
    """How many times an EXPLAIN (ANALYZE, FORMAT JSON) plan's scans of `table` ran."""
    loops = plan["Actual Loops"] if plan.get("Relation Name") == table else 0
    return loops + sum(_loops(child, table) for child in plan.get("Plans", ()))


def test_each_run_a_window_reads_looks_its_lane_up_once(pg_url: str) -> None:
    # A run's lane is read from `run_lanes` for each run a window reads one by one (its
    # partial hour, the running runs). Named in two sums (USD, tokens) of each laned
    # window, it was looked up once per sum: four times a running run with two laned
    # windows, at every capped admission, growing with the fleet's concurrency.
    with open_at(pg_url) as ledger:
        ledger.set_spend_cap(BIG, actor=ME, floor_usd=0.5, floor_tokens=10)
        for n in range(3):  # at 07:40-07:42, in the 5-hour window's partial hour (ended)
            task = ledger.create_task(f"partial{n}", actor=ME).id
            at = T0 - 20 * 60 + 60 * n
            run = ledger.start_run(task, request_key=task, actor=ME, now=at, lane=LANES[1])
            ledger.finish_run(run.id, "succeeded", usage=COST, now=at + 30)
        for n in range(4):  # running, two of them on the windows' lane
            task = ledger.create_task(f"running{n}", actor=ME).id
            lane = LANES[1 + n % 2]
            ledger.start_run(task, request_key=task, actor=ME, now=T0 + 60 * n, lane=lane)
    # The day and the lane's day from 00:00, and 5 hours of the lane from 07:30.
    windows = [(T0 - 8 * HOUR, None), (T0 - 8 * HOUR, LANES[1]), (T0 - 30 * 60, LANES[1])]
    plan, rows = _windows_read(pg_url, windows)
    assert (_rows_read(plan, "runs"), _loops(plan, "run_lanes")) == (3 + 4, 3 + 4)
    # A running run holds the USD floor, and tokens as its lane's runs spent (70 a run on
    # the windows' lane, none yet on the other: the floor); the lane holds two of them.
    held = (pytest.approx(3 * 0.07 + 2 * 0.5), 3 * 70 + 2 * 70)
    assert rows == [
        (0, pytest.approx(3 * 0.07 + 4 * 0.5), 3 * 70 + 2 * 70 + 2 * 10),
        (1, *held),
        (2, *held),
    ]
