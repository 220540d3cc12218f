"""The dispatcher on vendor lanes (issue #28), counted on a virtual clock: 50 tasks on one
lane meet a usage limit with a structured reset, or refused credentials; with lanes the
vendor is asked once before the lane opens, nothing is charged, and the other tasks wait
without their cards moving. The scenarios are benchmarks/bench_lanes.py's (counts only)."""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_lanes.py"


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    spec = importlib.util.spec_from_file_location("bench_lanes", BENCH)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_lanes"] = module
    spec.loader.exec_module(module)
    return module


def test_a_usage_limit_is_met_once_with_lanes_and_fifty_times_without(
    bench: ModuleType, tmp_path: Path
) -> None:
    on = bench.scenario(lanes=True, db=tmp_path / "on.db")
    off = bench.scenario(lanes=False, db=tmp_path / "off.db")
    assert on["calls_before_open"] <= 2 and off["calls_before_open"] >= 50
    assert on["charged_failures"] == off["charged_failures"] == 0
    assert on["done"] == off["done"] == 50


def test_an_expired_credential_is_met_once_until_the_lane_is_resumed(
    bench: ModuleType, tmp_path: Path
) -> None:
    on = bench.scenario(lanes=True, credentials=True, db=tmp_path / "on.db")
    off = bench.scenario(lanes=False, credentials=True, db=tmp_path / "off.db")
    assert on["calls_before_open"] == 1 and off["calls_before_open"] == 50
    # The task that hit the stop was blocked (its card moved); the resume let it run once
    # (its card came back) and the 49 held ones ran: all 50 done, nothing charged.
    assert on["done"] == 50 and on["charged_failures"] == 0


@contextlib.contextmanager
def _after_a_usage_limit(bench: ModuleType, db: Path) -> Iterator[tuple[Any, ...]]:
    """bench_lanes.py's 50 issues after one pass on a virtual clock, whose first call met a
    usage limit with a reset an hour away: (ledger, board, config, clock, vendor)."""
    from execkit.dispatch import DispatchConfig, Dispatcher, InlineExecutor
    from execkit.ledger import open_ledger

    clock = bench.Clock()
    vendor = bench.LimitedVendor(clock, clock.now + 3600)
    board = bench._board()
    config = DispatchConfig(max_concurrent_agents=8)
    with open_ledger(db) as ledger:
        Dispatcher(board, vendor, ledger, config, clock, executor=InlineExecutor()).tick()
        yield ledger, board, config, clock, vendor


def test_the_dashboard_says_which_lane_an_issue_waits_on(bench: ModuleType, tmp_path: Path) -> None:
    from execkit.dispatch import issue_statuses

    with _after_a_usage_limit(bench, tmp_path / "l.db") as (ledger, board, config, clock, vendor):
        rows = issue_statuses(ledger, config, board=board, now=clock.now + 1)
    assert len(vendor.calls) == 1
    waiting = [row for row in rows if (row.reason or "").startswith("waiting on lane ")]
    assert len(waiting) == len(rows) == 50  # the one that met the limit waits on it too
    assert all(row.board_state == "todo" for row in rows)  # no card was moved


@pytest.mark.parametrize("with_board", [True, False])
def test_the_dashboard_reads_the_lanes_a_page_of_tasks_at_a_time(
    bench: ModuleType, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_board: bool
) -> None:
    # While a lane is closed each open task's row says what it waits on: its lane is read
    # with a page of others (`Ledger.task_lanes`), not a read a task (50 tasks, pages of 8:
    # 7 reads, where `task_lane` was asked 50 times).
    import execkit.dispatch._status as status
    from execkit.dispatch import issue_statuses

    monkeypatch.setattr(status, "LIST_PAGE", 8, raising=False)
    with _after_a_usage_limit(bench, tmp_path / "l.db") as (ledger, board, config, clock, _):
        asked: dict[str, list[int]] = {"task_lane": [], "task_lanes": []}
        for name, calls in asked.items():
            read = getattr(ledger, name)
            monkeypatch.setattr(
                ledger,
                name,
                lambda first, *rest, _read=read, _calls=calls, **named: (
                    _calls.append(len(first) if isinstance(first, list) else 1),
                    _read(first, *rest, **named),
                )[1],
            )
        rows = issue_statuses(
            ledger, config, board=board if with_board else None, now=clock.now + 1
        )
    assert asked == {"task_lane": [], "task_lanes": [8, 8, 8, 8, 8, 8, 2]}
    assert len(rows) == 50
    # Without the board no issue names its adapter: only the task that ran on the lane
    # (the one that met the limit) is known to wait on it.
    waiting = [row for row in rows if (row.reason or "").startswith("waiting on lane ")]
    assert len(waiting) == (50 if with_board else 1)


def test_a_card_blocked_by_a_lane_stop_comes_back_after_lane_resume(
    bench: ModuleType, tmp_path: Path
) -> None:
    from execkit.dispatch import DispatchConfig, Dispatcher, InlineExecutor, InMemoryBoard
    from execkit.dispatch._board import BoardIssue, BoardState
    from execkit.ledger import open_ledger

    clock = bench.Clock()
    vendor = bench.LimitedVendor(clock, clock.now + 3600, credentials=True)
    board = InMemoryBoard(
        [BoardIssue(f"I-{n}", f"issue {n}", "doing", prompt="do it") for n in range(3)],
        states=[
            BoardState("todo", eligible=True),
            BoardState("doing", eligible=True),
            BoardState("blocked", terminal=True),
            BoardState("done", terminal=True),
        ],
    )
    config = DispatchConfig(max_concurrent_agents=1)
    with open_ledger(tmp_path / "l.db") as ledger:
        dispatcher = Dispatcher(board, vendor, ledger, config, clock, executor=InlineExecutor())
        dispatcher.tick()
        states = {issue.id: issue.state for issue in board.list_issues()}
        assert states == {"I-0": "blocked", "I-1": "doing", "I-2": "doing"}
        assert len(vendor.calls) == 1
        # The operator logs in again and resumes the lane: every task may run, the blocked
        # one once; its card goes back to the column it came from and it runs.
        vendor.opens_at = clock.now
        [lane] = ledger.list_lanes(now=clock.now)
        ledger.resume_lane(lane.lane, actor=bench.user_name_now(), now=clock.now)
        clock.now += 1
        for _ in range(5):
            dispatcher.tick()
            clock.now += 1
        states = {issue.id: issue.state for issue in board.list_issues()}
        assert states == {"I-0": "done", "I-1": "done", "I-2": "done"}
        assert ("I-0", "doing") in board.moves
        assert len(vendor.calls) == 4  # the one refusal, then each task once


def test_a_card_given_up_comes_back_after_task_retry_and_no_card_is_read_without_one(
    bench: ModuleType, tmp_path: Path
) -> None:
    from execkit._classify import FailureClass
    from execkit.dispatch import (
        DispatchConfig,
        Dispatcher,
        InlineExecutor,
        InMemoryBoard,
        RunOutcome,
    )
    from execkit.dispatch._board import BoardIssue, BoardState
    from execkit.ledger import open_ledger

    answers = [RunOutcome("failed", FailureClass.ENVIRONMENT, "no disk", precondition="df")]

    class Vendor:
        calls = 0

        def run(self, issue: BoardIssue, slot: object) -> RunOutcome:
            Vendor.calls += 1
            return answers.pop(0) if answers else RunOutcome("succeeded")

    clock = bench.Clock()
    board = InMemoryBoard(
        [BoardIssue("I-0", "issue", "doing", prompt="do it")],
        states=[
            BoardState("todo", eligible=True),
            BoardState("doing", eligible=True),
            BoardState("blocked", terminal=True),
            BoardState("done"),
        ],
    )
    config = DispatchConfig(max_concurrent_agents=1)
    with open_ledger(tmp_path / "l.db") as ledger:
        dispatcher = Dispatcher(board, Vendor(), ledger, config, clock, executor=InlineExecutor())
        dispatcher.tick()
        assert [i.state for i in board.list_issues()] == ["blocked"]
        dispatcher.tick()  # nothing pending: the card stays where it is
        assert [i.state for i in board.list_issues()] == ["blocked"] and Vendor.calls == 1
        [task] = ledger.list_tasks(now=clock.now)
        ledger.retry_task(task.id, actor=bench.user_name_now(), force=True, now=clock.now)
        assert not dispatcher.idle()  # the retry is due: `--until-idle` waits for it
        dispatcher.tick()
        assert [i.state for i in board.list_issues()] == ["done"]
        assert ("I-0", "doing") in board.moves and Vendor.calls == 2
        assert dispatcher.idle()


def test_a_lanes_wait_is_said_once_for_the_issue_that_met_it_and_again_when_it_changes(
    bench: ModuleType, tmp_path: Path
) -> None:
    # 50 issues, one lane, a usage limit with a reset 60 s (virtual) away. Each pass before
    # the reset finds the 49 held issues again: no event for them (the status lists them).
    # The one event names its own issue's task. At the reset the probe goes; the vendor
    # still refuses with a later reset: that is a new wait, said once more.
    import re

    from execkit.dispatch import DispatchConfig, Dispatcher, EventKind, InlineExecutor
    from execkit.ledger import open_ledger

    clock = bench.Clock()
    vendor = bench.LimitedVendor(clock, clock.now + 60)
    events: list[Any] = []
    with open_ledger(tmp_path / "ledger.db") as ledger:
        dispatcher = Dispatcher(
            bench._board(),
            vendor,
            ledger,
            DispatchConfig(max_concurrent_agents=8),
            clock,
            on_event=events.append,
            executor=InlineExecutor(),
        )
        for _ in range(5):  # five passes while the lane is parked
            dispatcher.tick()
            clock.now += 5
        said = [e for e in events if e.kind is EventKind.WAITING]
        assert len(said) == 1, [e.reason for e in said]
        assert not [e for e in events if e.kind is EventKind.REFUSED]
        (waiting,) = said
        named = re.search(r"task (t-\d+) waits on lane", waiting.reason or "")
        assert named is not None and named.group(1) == waiting.task_id
        # The reset passes, but the vendor moved its reset on: the probe meets a new wait.
        vendor.opens_at = clock.now + 600
        clock.now = bench.T0 + 60 + 10
        for _ in range(3):
            dispatcher.tick()
            clock.now += 5
        said = [e for e in events if e.kind is EventKind.WAITING]
        assert len(said) == 2, [e.reason for e in said]
        for event in said:
            named = re.search(r"task (t-\d+) waits on lane", event.reason or "")
            assert named is not None and named.group(1) == event.task_id


def test_after_one_resume_every_card_a_lane_stop_blocked_or_held_runs_again(
    tmp_path: Path,
) -> None:
    # Four issues run at once and all four meet refused credentials (the first stops the
    # lane, three meet the stop after it: each card moved to blocked); eight more are held.
    # After one `lane resume` and a fixed login, all twelve run and end done: the three
    # late ones stayed blocked until their cards were moved by hand.
    import threading

    from execkit._classify import FailureClass
    from execkit.dispatch import (
        BoardIssue,
        DispatchConfig,
        Dispatcher,
        InMemoryBoard,
        RunOutcome,
        Slot,
    )
    from execkit.ledger import open_ledger, user_name

    class Vendor:
        def __init__(self) -> None:
            self.logged_in = False
            self.calls = 0
            self.lock = threading.Lock()
            self.together = threading.Barrier(4)

        def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
            with self.lock:
                self.calls += 1
                first_four = self.calls <= 4
            if first_four:
                self.together.wait(timeout=60)  # the four are in flight together
            if self.logged_in:
                return RunOutcome("succeeded")
            return RunOutcome(
                "failed",
                FailureClass.ENVIRONMENT,
                "credentials refused",
                precondition="claude refused the credentials; run `claude /login`",
                lane_cause="credentials",
            )

    import os

    vendor = Vendor()
    board = InMemoryBoard([BoardIssue(f"I-{n}", f"issue {n}", "todo") for n in range(12)])
    with open_ledger(tmp_path / "ledger.db") as ledger:
        dispatcher = Dispatcher(board, vendor, ledger, DispatchConfig(max_concurrent_agents=4))
        dispatcher.tick()
        assert vendor.calls == 4
        assert sum(1 for i in board.list_issues() if i.state == "blocked") == 4
        (stopped,) = [lane for lane in ledger.list_lanes() if lane.state == "stopped"]
        vendor.logged_in = True
        ledger.resume_lane(stopped.lane, actor=user_name(os.geteuid()))
        for _ in range(10):  # bounded: each pass runs up to four
            dispatcher.tick()
            if all(i.state == "done" for i in board.list_issues()):
                break
        assert {i.state for i in board.list_issues()} == {"done"}
        assert vendor.calls == 16
        assert sum(t.charged_attempts for t in ledger.list_tasks()) == 12  # the successes


class _Deferred:
    """A slot executor that runs nothing until the test says which slot runs (`run`): the
    order in which in-flight attempts report is the test's, not the threads'."""

    def __init__(self) -> None:
        from concurrent.futures import Future

        self.pending: list[tuple[Any, Future[Any]]] = []

    def submit(self, work: Any, /) -> Any:
        from concurrent.futures import Future

        future: Future[Any] = Future()
        self.pending.append((work, future))
        return future

    def run(self, index: int = 0) -> None:
        work, future = self.pending.pop(index)
        future.set_result(work())


def test_no_slot_on_a_lane_is_refilled_until_its_attempts_in_flight_have_reported(
    tmp_path: Path,
) -> None:
    # A 429 storm with no stated reset (the breaker, K = 3) at concurrency 4: the first
    # refusal comes while three more attempts are in flight. The freed slot is not refilled
    # on that lane until those three have reported (it was: 6-7 vendor calls for 4 slots);
    # the third failure trips the breaker and the lane cools. Vendor calls before the lane
    # closed: the four in flight, no more. Another lane's issue still takes the free slot.
    from execkit._classify import FailureClass
    from execkit.dispatch import BoardIssue, DispatchConfig, Dispatcher, InMemoryBoard, RunOutcome
    from execkit.ledger import open_ledger

    class Storm:
        def __init__(self) -> None:
            self.calls: list[str] = []

        def run(self, issue: BoardIssue, slot: Any) -> RunOutcome:
            self.calls.append(issue.id)
            if issue.adapter == "codex":
                return RunOutcome("succeeded")
            return RunOutcome("failed", FailureClass.UPSTREAM, "http 429: rate limited")

    vendor, slots = Storm(), _Deferred()
    issues = [BoardIssue(f"I-{n}", "t", "todo", adapter="claude") for n in range(8)]
    issues.append(BoardIssue("OTHER", "t", "todo", adapter="codex"))
    board = InMemoryBoard(issues)
    config = DispatchConfig(max_concurrent_agents=4)
    with open_ledger(tmp_path / "ledger.db") as ledger:
        dispatcher = Dispatcher(board, vendor, ledger, config, executor=slots)
        dispatcher.pass_once()
        assert len(slots.pending) == 4  # I-0..I-3 in flight, nothing ran yet
        slots.run()  # I-0 reports the first refusal
        dispatcher.pass_once()
        # The free slot went to the other lane's issue, not to a fifth claude attempt.
        assert [work.args[0].id for work, _ in slots.pending] == ["I-1", "I-2", "I-3", "OTHER"]
        while slots.pending:
            slots.run()
            dispatcher.pass_once()
        (lane,) = [lane for lane in ledger.list_lanes() if lane.lane.startswith("claude/")]
        assert lane.state == "cooling"
    assert [call for call in vendor.calls if call != "OTHER"] == ["I-0", "I-1", "I-2", "I-3"]


def test_refusals_a_lane_absorbed_never_block_a_task_on_upstream(tmp_path: Path) -> None:
    # One issue and a vendor whose usage limit lifts 50 s after the reset it states (a
    # late vendor, or codex's rounded time): the park, then probes that meet the limit
    # still. The park was the task's own refusal; each probe's was the lane's (it found the
    # lane closed still): the task's own ceiling of three upstream attempts in a row is
    # not spent on them (it was: blocked on upstream before the vendor recovered), and a
    # later probe succeeds. No wait is the breaker's doubled cool.
    from execkit._classify import FailureClass
    from execkit.dispatch import (
        BoardIssue,
        DispatchConfig,
        Dispatcher,
        InlineExecutor,
        InMemoryBoard,
        RunOutcome,
    )
    from execkit.ledger import open_ledger

    T0 = 1_800_000_000.0
    clock = [T0]
    stated, lifted = T0 + 10, T0 + 60
    calls: list[float] = []

    class LateVendor:
        def run(self, issue: BoardIssue, slot: Any) -> RunOutcome:
            calls.append(clock[0])
            if clock[0] >= lifted:
                return RunOutcome("succeeded")
            return RunOutcome(
                "failed",
                FailureClass.UPSTREAM,
                "usage limit",
                not_before=stated,
                lane_cause="reset",
            )

    board = InMemoryBoard([BoardIssue("I-1", "t", "todo")])
    with open_ledger(tmp_path / "ledger.db") as ledger:
        dispatcher = Dispatcher(
            board,
            LateVendor(),
            ledger,
            DispatchConfig(),
            lambda: clock[0],
            executor=InlineExecutor(),
        )
        for _ in range(20):  # bounded: each pass at the next due time
            dispatcher.tick()
            if board.list_issues()[0].state != "todo":
                break
            due = dispatcher.next_due()
            assert due is not None
            clock[0] = max(clock[0] + 0.5, due)
        (issue,) = board.list_issues()
        assert issue.state == "done", [t.reason for t in ledger.list_tasks()]
        (task,) = ledger.list_tasks()
        runs = ledger.runs(task.id)
        # The park was the task's own refusal (it closed the open lane); every probe after
        # it met the lane closed: the lane's.
        assert [run.lane_held for run in runs[:-1]] == [False] + [True] * (len(runs) - 2)
        assert len(runs) >= 4 and task.charged_attempts == 1  # the success alone
    # Every call after the park waited past the stated reset; none waited a breaker's cool.
    assert all(at >= stated for at in calls[1:])
    assert max(b - a for a, b in itertools.pairwise(calls)) < 60
