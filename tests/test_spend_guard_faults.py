"""The spend guard's failure branches (issue #45): a ledger that cannot answer while a run
goes (the run goes on, asked again at its next event), one that cannot say a dispatched
run's room before its agent starts (the agent never starts, the run is stopped uncharged,
once a pass), and the calendar windows' cached bounds at their edges."""

from __future__ import annotations

import calendar
import itertools
import logging
import math
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from test_dispatch import ROOMY, Clock
from test_remote import ME
from test_spend_in_run import StreamingOpencode

from execkit import AgentRequest
from execkit._attempt import AttemptOptions, SpendGuard, run_attempt, spend_guard
from execkit._errors import Conflict, ExecKitError, StorageError
from execkit._usage import Usage, UsdSource
from execkit.dispatch import (
    AdapterRunner,
    BoardIssue,
    DispatchConfig,
    Dispatcher,
    EventKind,
    InMemoryBoard,
)
from execkit.ledger import Run, SpendCap, SpendRoom, SpendWindow, SqliteLedger, window_bounds
from execkit.ledger._spend import _CALENDAR

NOW = 1_800_000_000.0  # 2027-01-15 08:00 UTC, a Friday
TOMORROW = 1_800_057_600.0  # 2027-01-16 00:00 UTC
DAY_S = 86400.0
WEEK_S = 7 * DAY_S


def spent(usd: float) -> Usage:
    return Usage(output_tokens=10, usd=usd, usd_source=UsdSource.REPORTED)


def guarded_run(ledger: SqliteLedger, name: str, at: float) -> tuple[Run, SpendGuard]:
    """A new task's run admitted at `at`, and its spend guard (a cap applies to it)."""
    task = ledger.create_task(name, actor=ME).id
    run = ledger.start_run(task, request_key=name, actor=ME, now=at)
    guard = spend_guard(ledger, run.id, lambda: at)
    assert guard is not None
    return run, guard


class FlakyRoomLedger(SqliteLedger):
    """A real SQLite ledger whose `spend_room` raises `fault` once on each call `failing`
    picks, by the USD it is asked about (None: the guard's opening read, with no spend), as
    one busy past its timeout does; `always`: on every call. `calls` counts the calls."""

    calls = 0
    fault: ExecKitError = StorageError("ledger is busy or unwritable: database is locked")
    failing: frozenset[float | None] = frozenset()
    always = False

    def __enter__(self) -> FlakyRoomLedger:
        return self

    def spend_room(
        self, run_id: str, *, spent: Usage | None = None, now: float | None = None
    ) -> SpendRoom:
        self.calls += 1
        # Rounded: a CLI's running total of $0.10 steps is $1.1000000000000003.
        usd = None if spent is None or spent.usd is None else round(spent.usd, 6)
        if self.always or usd in self.failing:
            self.failing = self.failing - {usd}
            raise self.fault
        return super().spend_room(run_id, spent=spent, now=now)


# -- 1. the guard of a running run, its ledger failing --------------------------------------


def test_a_ledger_hiccup_lets_the_run_go_on_and_the_next_event_asks_again(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with FlakyRoomLedger(tmp_path / "ledger.db", budget=ROOMY) as ledger:
        ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=1.0), actor=ME, floor_usd=0.25)
        run, guard = guarded_run(ledger, "1", NOW)
        assert guard.room == SpendRoom(usd=0.25)
        ledger.calls = 0
        ledger.failing = frozenset({0.5, 1.2})
        assert guard.crossed(spent(0.1)) is False and ledger.calls == 0  # within its room
        with caplog.at_level(logging.WARNING, logger="execkit.attempt"):
            # Past its room, the ledger cannot answer: the run goes on, said in the log.
            assert guard.crossed(spent(0.5)) is False
        (warned,) = [r for r in caplog.records if r.levelno == logging.WARNING]
        assert run.id in warned.getMessage() and "database is locked" in warned.getMessage()
        assert (guard.stopped, guard.room, ledger.calls) == (None, SpendRoom(usd=0.25), 1)
        # The next event past the room asks again, and the room grows.
        assert guard.crossed(spent(0.6)) is False
        assert (guard.room, ledger.calls) == (SpendRoom(usd=0.85), 2)
        # A hiccup at the event that crosses the cap: still going; the next one is stopped.
        assert guard.crossed(spent(1.2)) is False and guard.stopped is None
        assert guard.crossed(spent(1.3)) is True
        assert guard.stopped is not None and guard.stopped.cap == "the day's budget"
        assert "this run reached $1.30" in (guard.stopped.stop or "")
        assert ledger.calls == 4
        # Stopped, it says so without asking again; the window holds what it spent.
        assert guard.crossed(spent(1.4)) is True and ledger.calls == 4
        assert ledger.spend_windows(now=NOW)[0].usd == pytest.approx(1.3)
        assert len([r for r in caplog.records if r.levelno == logging.WARNING]) == 2


def test_a_run_no_longer_running_stops_its_agent(tmp_path: Path) -> None:
    with FlakyRoomLedger(tmp_path / "ledger.db", budget=ROOMY) as ledger:
        ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=1.0), actor=ME, floor_usd=0.25)
        run, guard = guarded_run(ledger, "1", NOW)
        # Abandoned meanwhile (its lease, an operator): nothing it spends can be recorded.
        ledger.finish_run(run.id, "abandoned", now=NOW + 1)
        with pytest.raises(Conflict):
            guard.crossed(spent(0.5))
        assert guard.stopped is None
        # Injected as the server would answer it: a Conflict propagates, not logged away.
        _run2, guard = guarded_run(ledger, "2", NOW + 2)
        ledger.fault, ledger.failing = Conflict("only a running run has a room"), frozenset({0.5})
        with pytest.raises(Conflict, match="only a running run"):
            guard.crossed(spent(0.5))


def test_a_real_run_goes_on_past_a_hiccup_and_is_stopped_one_event_later(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with FlakyRoomLedger(tmp_path / "ledger.db", budget=ROOMY) as ledger:
        ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=1.0), actor=ME, floor_usd=0.25)
        task = ledger.create_task("t", actor=ME).id
        # $0.10 a step: the ask at $1.10 (the one that would stop it) fails.
        ledger.failing = frozenset({1.1})
        options = AttemptOptions(actor=ME, lane=None, clock=lambda: NOW)
        # Only a stop ends its agent: the timeout bounds a guard that never stops it.
        request = AgentRequest(prompt="go", timeout_s=60)
        with caplog.at_level(logging.WARNING, logger="execkit.attempt"):
            outcome = run_attempt(ledger, task, StreamingOpencode(usd=0.1), request, options)
        run = ledger.run(outcome.run_id)
        assert "this run reached $1.20" in (outcome.reason or "")
        assert (run.status, run.stopped, run.failure_class) == ("abandoned", True, None)
        assert any("its spend was not checked" in r.getMessage() for r in caplog.records)


# -- 2. a dispatched run whose room cannot be read: its agent never starts ------------------

MARKER_AGENT = (
    "import json, pathlib, sys; pathlib.Path(sys.argv[1]).write_text('ran'); "
    "print(json.dumps({'type': 'step_finish', 'part': {'cost': 0.01, "
    "'tokens': {'output': 10}}}))"
)


class MarkerAgent(StreamingOpencode):
    """A real agent process that leaves `marker` behind as it starts, then one step."""

    def __init__(self, marker: Path) -> None:
        super().__init__()
        self.marker = marker

    def build_argv(self, request: AgentRequest) -> list[str]:
        return [sys.executable, "-c", MARKER_AGENT, str(self.marker)]


def _capped(ledger: SqliteLedger) -> None:
    ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=5.0), actor=ME, floor_usd=0.1)


def test_a_slot_whose_room_is_unknown_never_starts_its_agent(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    marker = tmp_path / "agent-ran"
    with FlakyRoomLedger(tmp_path / "ledger.db", budget=ROOMY) as ledger:
        _capped(ledger)
        ledger.failing = frozenset({None})  # the guard's opening read, once
        board = InMemoryBoard([BoardIssue("ISS-1", "one", "todo", prompt="go", adapter="opencode")])
        runner = AdapterRunner(MarkerAgent(marker), timeout_s=60)
        clock = Clock(NOW)
        dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(max_attempts=3), clock)
        with caplog.at_level(logging.WARNING, logger="execkit.dispatch"):
            events = dispatcher.tick()
        assert not marker.exists()  # the agent never started
        (task,) = ledger.list_tasks()
        (run,) = ledger.runs(task.id)
        # Stopped by its dispatcher, uncharged, no cost reported (the window counts its
        # reservation, as for any run whose result reported none); the card stays put.
        assert (run.status, run.stopped, run.failure_class) == ("abandoned", True, None)
        assert run.usd is None and ledger.spend_windows(now=NOW)[0].usd == pytest.approx(0.1)
        shown = ledger.get_task(task.id, now=clock.now)
        assert (shown.charged_attempts, shown.state) == (0, "ready")
        assert board.get("ISS-1").state == "todo"
        # Said, not silent: an error event naming the issue, and the log naming the run.
        (error,) = events
        assert (error.kind, error.issue_id) == (EventKind.ERROR, "ISS-1")
        assert "database is locked" in (error.reason or "")
        assert any(run.id in r.getMessage() for r in caplog.records)
        # The ledger answers again: the next pass runs the agent.
        clock.now += 60
        (done,) = dispatcher.tick()
        assert marker.read_text() == "ran"
        assert (done.kind, done.attempt, board.get("ISS-1").state) == ("dispatched", 2, "done")
        assert [r.status for r in ledger.runs(task.id)] == ["abandoned", "succeeded"]


def test_a_ledger_that_cannot_say_the_room_gets_one_run_a_pass_not_a_burst(
    tmp_path: Path,
) -> None:
    # A slot that ends at once is refilled at once; one whose agent never started must not
    # be, or `run_forever` admits and stops runs as fast as the ledger takes them until the
    # dispatch cap gives the issue up, no agent having run.
    marker = tmp_path / "agent-ran"
    with FlakyRoomLedger(tmp_path / "ledger.db", budget=ROOMY) as ledger:
        _capped(ledger)
        ledger.always = True
        board = InMemoryBoard([BoardIssue("ISS-1", "one", "todo", prompt="go", adapter="opencode")])
        runner = AdapterRunner(MarkerAgent(marker), timeout_s=60)
        clock = Clock(NOW)
        dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(max_attempts=6), clock)
        waits: list[float] = []

        def sleep(seconds: float) -> None:
            waits.append(seconds)
            clock.now += seconds

        checks = itertools.count()  # a bound of its own: a regression must not hang here
        dispatcher.run_forever(30.0, stop=lambda: len(waits) >= 3 or next(checks) > 40, sleep=sleep)
        (task,) = ledger.list_tasks()
        runs = ledger.runs(task.id)
        assert len(runs) == len(waits) == 3  # one a pass, each pass then waited its interval
        assert all((r.status, r.stopped) == ("abandoned", True) for r in runs)
        assert not marker.exists()
        assert board.get("ISS-1").state == "todo"  # not given up


# -- 3. the calendar windows' cached bounds at their edges ----------------------------------


@pytest.fixture(autouse=True)
def cold_calendar() -> Iterator[None]:
    """Each test starts (and leaves) the calendar windows' cache empty."""
    _CALENDAR.clear()
    yield
    _CALENDAR.clear()


def utc(year: int, month: int, day: int, hour: int) -> float:
    """POSIX seconds of a UTC wall time: the tests' own oracle, no time zone database."""
    return float(calendar.timegm((year, month, day, hour, 0, 0)))


def test_a_days_bounds_flip_at_midnight_whichever_moment_was_asked_first() -> None:
    day = SpendCap(SpendWindow.DAY, usd=1.0)
    today, tomorrow = (TOMORROW - DAY_S, TOMORROW), (TOMORROW, TOMORROW + DAY_S)
    # The last moment a float can say before midnight is still today, the cache cold
    # (hypothesis found it: the local date, read to the rounded microsecond, was tomorrow's).
    assert window_bounds(day, math.nextafter(TOMORROW, 0)) == today
    assert window_bounds(day, TOMORROW - 0.5) == today  # 23:59:59.5
    assert window_bounds(day, TOMORROW + 0.5) == tomorrow  # 00:00:00.5, the cache warm
    assert window_bounds(day, TOMORROW - 0.5) == today  # and back
    assert window_bounds(day, TOMORROW) == tomorrow  # midnight itself opens the next day
    assert window_bounds(day, TOMORROW - 0.001) == today
    assert window_bounds(day, TOMORROW - DAY_S) == today  # the day's own first moment


def test_a_weeks_bounds_flip_at_monday_midnight() -> None:
    week = SpendCap(SpendWindow.WEEK, usd=1.0)
    monday = TOMORROW + 2 * DAY_S  # 2027-01-18 00:00 UTC
    this, next_ = (monday - WEEK_S, monday), (monday, monday + WEEK_S)
    assert window_bounds(week, monday - 0.5) == this
    assert window_bounds(week, monday + 0.5) == next_
    assert window_bounds(week, monday - 0.5) == this
    assert window_bounds(week, monday) == next_
    assert window_bounds(week, math.nextafter(monday, 0)) == this


def test_each_window_and_time_zone_keeps_its_own_bounds() -> None:
    utc_day = SpendCap(SpendWindow.DAY, usd=1.0)
    york_day = SpendCap(SpendWindow.DAY, usd=1.0, tz="America/New_York")
    utc_week = SpendCap(SpendWindow.WEEK, usd=1.0)
    midnight = TOMORROW - DAY_S
    # Interleaved: none of them answers with another's bounds.
    assert window_bounds(utc_day, NOW) == (midnight, TOMORROW)
    assert window_bounds(york_day, NOW) == (midnight + 5 * 3600, TOMORROW + 5 * 3600)
    assert window_bounds(utc_week, NOW) == (midnight - 4 * DAY_S, midnight + 3 * DAY_S)
    assert window_bounds(utc_day, NOW) == (midnight, TOMORROW)


@pytest.mark.parametrize(
    ("window", "start", "end", "after"),
    [
        # 2027-03-14, the day New York springs forward: 23 hours, from 00:00 EST to 00:00 EDT.
        ("day", utc(2027, 3, 14, 5), utc(2027, 3, 15, 4), utc(2027, 3, 16, 4)),
        # 2027-11-07, the day it falls back: 25 hours, from 00:00 EDT to 00:00 EST.
        ("day", utc(2027, 11, 7, 4), utc(2027, 11, 8, 5), utc(2027, 11, 9, 5)),
        # The week of Monday 2027-03-08 holds the spring change: 167 hours.
        ("week", utc(2027, 3, 8, 5), utc(2027, 3, 15, 4), utc(2027, 3, 22, 4)),
        # The week of Monday 2027-11-01 holds the autumn one: 169 hours.
        ("week", utc(2027, 11, 1, 4), utc(2027, 11, 8, 5), utc(2027, 11, 15, 5)),
    ],
)
def test_new_yorks_windows_across_a_dst_change(
    window: str, start: float, end: float, after: float
) -> None:
    cap = SpendCap(window, usd=1.0, tz="America/New_York")
    assert window_bounds(cap, end - 0.5) == (start, end)
    assert window_bounds(cap, end + 0.5) == (end, after)
    assert window_bounds(cap, end - 0.5) == (start, end)
    # The change itself (02:00 local) is inside the window, not an edge of it.
    assert window_bounds(cap, start + 2 * 3600 + 0.5) == (start, end)
    assert window_bounds(cap, start - 0.5)[1] == start
    assert window_bounds(cap, math.nextafter(end, 0)) == (start, end)


ZONES = ["UTC", "America/New_York", "Europe/Paris", "Asia/Kolkata", "Australia/Sydney"]
FIRST_DAY = utc(2026, 1, 1, 0)
# Every local midnight of these zones is a UTC midnight plus a whole number of half hours.
near_a_midnight = st.builds(
    lambda day, half_hours, offset: FIRST_DAY + day * DAY_S + half_hours * 1800 + offset,
    st.integers(0, 2 * 366),
    st.integers(-28, 28),
    st.floats(-1.5, 1.5),
)


@settings(max_examples=200, deadline=None)
@given(
    window=st.sampled_from([SpendWindow.DAY, SpendWindow.WEEK]),
    tz=st.sampled_from(ZONES),
    moments=st.lists(
        st.one_of(near_a_midnight, st.floats(FIRST_DAY, FIRST_DAY + 2 * 366 * DAY_S)),
        min_size=1,
        max_size=12,
    ),
)
@example(window=SpendWindow.DAY, tz="UTC", moments=[TOMORROW + 1, math.nextafter(TOMORROW, 0)])
def test_prop_a_warm_cache_answers_as_a_cold_one(
    window: SpendWindow, tz: str, moments: list[float]
) -> None:
    cap = SpendCap(window, usd=1.0, tz=tz)
    _CALENDAR.clear()
    warm = [window_bounds(cap, at) for at in moments]
    for at, bounds in zip(moments, warm, strict=True):
        _CALENDAR.clear()
        assert window_bounds(cap, at) == bounds
        start, end = bounds
        assert start <= at < end
        span = DAY_S if window is SpendWindow.DAY else WEEK_S
        assert abs((end - start) - span) <= 3600  # a DST change moves it an hour at most
        assert window_bounds(cap, end)[0] == end  # the next window begins where it ends
