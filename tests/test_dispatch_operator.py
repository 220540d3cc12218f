"""The dispatcher as an operator meets it: a card moved back is a forced retry, a board
without a terminal column keeps retrying (loudly), a negative cap retries work forever,
leases are renewed while a run runs, and a board remembers its ledger."""

from __future__ import annotations

import logging
import os
from pathlib import Path

import pytest
from _support import BeatingRunner

from execkit._classify import FailureClass
from execkit._errors import Conflict
from execkit.dispatch import (
    BoardIssue,
    BoardState,
    DispatchConfig,
    Dispatcher,
    DispatchEvent,
    InMemoryBoard,
    JsonFileBoard,
    RunOutcome,
    Slot,
)
from execkit.ledger import open_ledger, user_name

T0 = 1_700_000_000.0
WORK = RunOutcome("failed", FailureClass.WORK, "default", detail="wrong answer")
UPSTREAM = RunOutcome("failed", FailureClass.UPSTREAM, "http 503")
MISSING = RunOutcome(
    "failed",
    FailureClass.ENVIRONMENT,
    "spawn errno ENOENT",
    precondition="acme CLI not found on PATH; install: pip install acme",
)
OK = RunOutcome("succeeded")


class Clock:
    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


class Scripted:
    """Returns the next outcome on each call (the last one repeats)."""

    def __init__(self, *outcomes: RunOutcome) -> None:
        self.outcomes = list(outcomes)
        self.calls = 0

    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        self.calls += 1
        return self.outcomes[min(self.calls, len(self.outcomes)) - 1]


def drive(dispatcher: Dispatcher, clock: Clock, passes: int) -> list[DispatchEvent]:
    """Tick, jumping the clock to the next retry, at most `passes` times."""
    events: list[DispatchEvent] = []
    for _ in range(passes):
        events += dispatcher.tick()
        due = dispatcher.next_due()
        if due is None:
            break
        clock.now = max(clock.now, due)
    return events


def test_a_card_moved_back_after_an_environment_stop_is_run_once_more(
    tmp_path: Path,
) -> None:
    # The operator's loop: missing binary -> blocked -> installed -> moved back -> done.
    board = InMemoryBoard([BoardIssue("ISS-1", "t", "todo")])
    runner, clock = Scripted(MISSING, OK), Clock()
    with open_ledger(tmp_path / "ledger.db") as ledger:
        dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(), clock)
        first = drive(dispatcher, clock, passes=5)
        assert board.get("ISS-1").state == "blocked"
        assert [e.kind for e in first] == ["dispatched"]
        # Another pass while it stands in blocked: nothing happens.
        assert dispatcher.tick() == []
        board.move("ISS-1", "todo")  # the operator installed the CLI and moved the card
        clock.now += 1  # well inside the backoff that failure earned: it runs anyway
        (event,) = dispatcher.tick()
        assert (event.kind, event.status, event.moved_to) == ("dispatched", "succeeded", "done")
        runs = ledger.runs(event.task_id or "")
        assert [(r.attempt, r.forced, r.status) for r in runs] == [
            (1, False, "failed"),
            (2, True, "succeeded"),
        ]
        retry = next(e for e in ledger.audit_events(runs[0].task_id) if e.action == "task.retry")
        assert retry.actor == "dispatcher on behalf of the board's operator"
        assert ledger.get_task(runs[0].task_id).charged_attempts == 1  # the budget was intact


@pytest.mark.parametrize(
    ("outcome", "stop"),
    [(UPSTREAM, "upstream"), (WORK, "work")],
    ids=["after-an-outage", "after-the-budget"],
)
def test_a_card_moved_back_runs_once_and_stops_again_on_the_same_bound(
    tmp_path: Path, outcome: RunOutcome, stop: str
) -> None:
    # Without vendor lanes, as ADR 0046 states the ceiling (with lanes, the refusals after
    # the first three meet the lane closed and are the lane's: the next test).
    board = InMemoryBoard([BoardIssue("ISS-1", "t", "todo")])
    runner, clock = Scripted(outcome), Clock()
    with open_ledger(tmp_path / "ledger.db") as ledger:
        dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(), clock, lanes=False)
        drive(dispatcher, clock, passes=10)
        assert (runner.calls, board.get("ISS-1").state) == (3, "blocked")
        board.move("ISS-1", "todo")
        events = drive(dispatcher, clock, passes=10)
        dispatched = [e for e in events if e.kind == "dispatched"]
        if stop == "upstream":
            # The forced retry started a fresh streak: a whole new ceiling of attempts.
            assert len(dispatched) == 3
        else:
            assert len(dispatched) == 1  # the budget is spent: it ran once
        assert (dispatched[-1].blocked_on, board.get("ISS-1").state) == (stop, "blocked")


def test_a_card_moved_back_during_an_outage_waits_on_its_lane_not_its_own_ceiling(
    tmp_path: Path,
) -> None:
    # With lanes: three 503s in a row are the task's own (the third closes the open lane:
    # the breaker) and block it. Moved back while the vendor still fails, its refusals meet
    # the lane closed (each is the lane's probe): the lane's, not the task's. The card stays
    # eligible while the lane's waits grow (the breaker's doubling cool), and the lane, not
    # the task's ceiling, bounds it: after `max_trips` closings in a row it stops for a person.
    board = InMemoryBoard([BoardIssue("ISS-1", "t", "todo")])
    runner, clock = Scripted(UPSTREAM), Clock()
    with open_ledger(tmp_path / "ledger.db") as ledger:
        ledger.set_lane_config(actor=user_name(os.geteuid()), max_trips=4)
        dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(), clock)
        drive(dispatcher, clock, passes=10)
        assert (runner.calls, board.get("ISS-1").state) == (3, "blocked")
        board.move("ISS-1", "todo")
        drive(dispatcher, clock, passes=30)
        (task,) = ledger.list_tasks()
        runs = ledger.runs(task.id)
        assert [run.lane_held for run in runs] == [False] * 3 + [True] * (len(runs) - 3)
        assert board.get("ISS-1").state == "todo" and task.uncharged_streak == 0
        (lane,) = ledger.list_lanes()
        assert lane.state == "stopped" and "times in a row" in (lane.reason or "")
        assert len(runs) == 3 + 4  # a probe a closing until the fifth closing stops it


def test_the_dispatch_cap_is_lifted_once_by_a_moved_back_card(tmp_path: Path) -> None:
    board = InMemoryBoard([BoardIssue("ISS-1", "t", "todo")])
    runner, clock = Scripted(UPSTREAM, WORK, OK), Clock()
    config = DispatchConfig(max_attempts=2)
    with open_ledger(tmp_path / "ledger.db") as ledger:
        dispatcher = Dispatcher(board, runner, ledger, config, clock)
        events = drive(dispatcher, clock, passes=10)
        assert events[-1].blocked_on == "dispatch_cap"
        board.move("ISS-1", "todo")
        (event,) = dispatcher.tick()
        assert (event.status, board.get("ISS-1").state) == ("succeeded", "done")


def test_a_board_without_a_terminal_column_keeps_retrying_loudly(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # ADR 015 "never strand": no state to give up into means the legacy retry, with a
    # warning at each exhaustion, never a freeze in an eligible column.
    board = InMemoryBoard(
        [BoardIssue("ISS-1", "t", "todo")],
        states=(BoardState("todo", eligible=True), BoardState("done", terminal=True)),
    )
    runner, clock = Scripted(WORK, WORK, WORK, MISSING, WORK, OK), Clock()
    with (
        caplog.at_level(logging.WARNING, logger="execkit.dispatch"),
        open_ledger(tmp_path / "ledger.db") as ledger,
    ):
        dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(), clock)
        events = drive(dispatcher, clock, passes=20)
    dispatched = [e for e in events if e.kind == "dispatched"]
    assert runner.calls == 6
    assert (dispatched[-1].status, board.get("ISS-1").state) == ("succeeded", "done")
    warnings = [r.getMessage() for r in caplog.records if "was not moved" in r.getMessage()]
    # One per exhaustion: after the 3rd work failure, the 4th (environment), the 5th.
    assert len(warnings) == 3
    assert all("remains eligible" in w for w in warnings)


def test_a_negative_cap_retries_doomed_work_without_end_but_not_an_outage(
    tmp_path: Path,
) -> None:
    # ADR 015 "set it negative to restore unbounded retries": work failures keep coming
    # back; ADR 0046's uncharged stops still hold.
    for outcome, calls, stop in ((WORK, 12, None), (UPSTREAM, 3, "upstream")):
        board = InMemoryBoard([BoardIssue("ISS-1", "t", "todo")])
        runner, clock = Scripted(outcome), Clock()
        db = tmp_path / f"{outcome.failure_class}.db"
        with open_ledger(db) as ledger:
            dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(max_attempts=-1), clock)
            events = drive(dispatcher, clock, passes=calls)
        dispatched = [e for e in events if e.kind == "dispatched"]
        assert runner.calls == calls
        assert dispatched[-1].blocked_on == stop


def test_the_lease_is_renewed_while_the_runner_runs(tmp_path: Path) -> None:
    board = InMemoryBoard([BoardIssue("ISS-1", "t", "todo")])
    with open_ledger(tmp_path / "ledger.db") as ledger:
        # A run renewed through its slot, beat after beat: its lease outlives the first.
        runner = BeatingRunner(beats=3)
        dispatcher = Dispatcher(board, runner, ledger, lease_s=0.3)
        (event,) = dispatcher.tick()
        assert event.status == "succeeded" and runner.beats_done == {"ISS-1": 3}
        (run,) = ledger.runs(event.task_id or "")
        assert run.lease_expires_at is not None
        assert run.lease_expires_at > run.started_at + 0.3  # renewed after it started
        assert not any(e.action == "run.abandon" for e in ledger.audit_events())
        assert dispatcher.running == ()  # its slot is gone


def test_a_board_file_remembers_its_ledger_and_refuses_another(tmp_path: Path) -> None:
    board = JsonFileBoard.create(tmp_path / "board.json", [BoardIssue("ISS-1", "t", "todo")])
    assert board.ledger_binding() is None
    with open_ledger(tmp_path / "one.db") as one:
        Dispatcher(board, Scripted(OK), one, clock=Clock()).tick()
        assert board.ledger_binding() == (one.ledger_id(), str((tmp_path / "one.db").resolve()))
    with open_ledger(tmp_path / "two.db") as two, pytest.raises(Conflict, match="belongs to"):
        Dispatcher(board, Scripted(OK), two, clock=Clock()).tick()
