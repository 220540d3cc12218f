"""The dispatcher (ADR 015 + ADR 0033's orchestrator part) over a real SQLite ledger."""

from __future__ import annotations

import getpass
import logging
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from execkit._budget import AttemptStatus, WorkBudget
from execkit._classify import FailureClass
from execkit._errors import ExecKitError, UnsupportedMove
from execkit._usage import Usage
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
    issue_statuses,
    task_key,
)
from execkit.ledger import Run, SqliteLedger, open_ledger

T0 = 1_700_000_000.0
# A charged budget far above every cap these tests use, so the dispatch cap is what binds.
ROOMY = WorkBudget(max_attempts=1000, max_uncharged_attempts=1000)

WORK = RunOutcome("failed", FailureClass.WORK, "default", detail="wrong answer")
UPSTREAM = RunOutcome("failed", FailureClass.UPSTREAM, "http 503")
ENVIRONMENT = RunOutcome(
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


class ScriptedRunner:
    """Returns `outcomes[n]` on the n-th call (the last one repeats); records the calls."""

    def __init__(self, *outcomes: RunOutcome) -> None:
        self.outcomes = outcomes
        self.calls: list[tuple[str, int]] = []

    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        attempt = slot.attempt
        self.calls.append((issue.id, attempt))
        return self.outcomes[min(len(self.calls), len(self.outcomes)) - 1]


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "ledger.db"


@pytest.fixture
def ledger(db: Path) -> Iterator[SqliteLedger]:
    with open_ledger(db, budget=ROOMY) as opened:
        yield opened


def one_issue_board(states: tuple[BoardState, ...] | None = None) -> InMemoryBoard:
    issue = BoardIssue("ISS-1", "the issue", "todo", prompt="do it")
    if states is None:
        return InMemoryBoard([issue])
    return InMemoryBoard([issue], states)


def drive(
    dispatcher: Dispatcher, clock: Clock, *, passes: int, until: Callable[[], bool] = lambda: False
) -> list[DispatchEvent]:
    """Tick, jumping the clock to the next retry when nothing is due; bounded."""
    events: list[DispatchEvent] = []
    for _ in range(passes):
        events.extend(dispatcher.tick())
        if until():
            break
        due = dispatcher.next_due()
        if due is not None:
            clock.now = max(clock.now, due)
    return events


def dispatched(events: list[DispatchEvent]) -> list[DispatchEvent]:
    return [e for e in events if e.kind == "dispatched"]


def test_cap_reached_at_exactly_max_attempts_and_the_issue_moves(ledger: SqliteLedger) -> None:
    board, runner, clock = one_issue_board(), ScriptedRunner(WORK), Clock()
    dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(max_attempts=4), clock)
    events = drive(dispatcher, clock, passes=20)
    assert len(runner.calls) == 4
    last = dispatched(events)[-1]
    assert (last.attempt, last.blocked_on, last.moved_to) == (4, "dispatch_cap", "blocked")
    assert board.get("ISS-1").state == "blocked"
    assert board.list_candidates() == []
    # Off the eligible set: later passes dispatch nothing.
    clock.now += 10_000
    assert dispatcher.tick() == []
    assert len(runner.calls) == 4


def test_attempt_counter_advances_every_cycle(ledger: SqliteLedger) -> None:
    # ADR 015's bug: the counter reset to 1 every cycle, so the dashboard and the cap never
    # moved. The attempt number comes from the ledger's history.
    board, runner, clock = one_issue_board(), ScriptedRunner(WORK), Clock()
    dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(max_attempts=6), clock)
    events = dispatched(drive(dispatcher, clock, passes=20))
    assert [attempt for _, attempt in runner.calls] == [1, 2, 3, 4, 5, 6]
    assert [e.attempt for e in events] == [1, 2, 3, 4, 5, 6]
    assert all(e.max_attempts == 6 for e in events)
    rows = issue_statuses(ledger, DispatchConfig(max_attempts=6), board=board, now=clock.now)
    assert (rows[0].attempts, rows[0].max_attempts) == (6, 6)


def test_negative_cap_keeps_retrying_past_ten(ledger: SqliteLedger) -> None:
    board, runner, clock = one_issue_board(), ScriptedRunner(WORK), Clock()
    dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(max_attempts=-1), clock)
    events = dispatched(drive(dispatcher, clock, passes=25))
    assert len(runner.calls) == 25
    assert [e.attempt for e in events] == list(range(1, 26))
    assert all(e.max_attempts is None and e.moved_to is None for e in events)
    assert board.get("ISS-1").state == "todo"


def test_failed_state_none_keeps_retrying_and_warns_every_time(
    ledger: SqliteLedger, caplog: pytest.LogCaptureFixture
) -> None:
    board, runner, clock = one_issue_board(), ScriptedRunner(WORK), Clock()
    config = DispatchConfig(max_attempts=3, failed_state=None)
    dispatcher = Dispatcher(board, runner, ledger, config, clock)
    with caplog.at_level(logging.WARNING, logger="execkit.dispatch"):
        events = dispatched(drive(dispatcher, clock, passes=7))
    assert len(runner.calls) == 7  # never stranded: past the cap of 3
    assert [e.attempt for e in events] == list(range(1, 8))
    assert board.get("ISS-1").state == "todo"
    warnings = [r for r in caplog.records if r.name == "execkit.dispatch"]
    # Every exhaustion warns once: after attempts 3, 4, 5, 6 and 7 (the check before each
    # retry past the cap finds the same history and does not repeat it).
    exhaustions = [e for e in events if e.blocked_on == "dispatch_cap"]
    assert [e.attempt for e in exhaustions] == [3, 4, 5, 6, 7]
    assert len(warnings) == len(exhaustions)
    assert all(r.levelno == logging.WARNING for r in warnings)
    assert all("ISS-1" in r.getMessage() and "failed_state" in r.getMessage() for r in warnings)
    # The retry past the cap is scheduled, and the dashboard shows it rather than a stop.
    assert all(e.next_attempt_at is not None and e.moved_to is None for e in exhaustions)
    (row,) = issue_statuses(ledger, config, board=board, now=exhaustions[-1].at)
    assert (row.ledger_state, row.attempts, row.max_attempts) == ("backoff", 7, 3)
    assert row.next_attempt_at == exhaustions[-1].next_attempt_at


def test_a_blocked_issue_that_cannot_move_warns_once_not_every_pass(
    ledger: SqliteLedger, caplog: pytest.LogCaptureFixture
) -> None:
    board, runner, clock = one_issue_board(), ScriptedRunner(ENVIRONMENT), Clock()
    config = DispatchConfig(failed_state=None)
    dispatcher = Dispatcher(board, runner, ledger, config, clock)
    with caplog.at_level(logging.WARNING, logger="execkit.dispatch"):
        events = [dispatcher.tick() for _ in range(5)]
    assert len(runner.calls) == 1  # environment stops at once, move or no move
    assert [e.kind for e in events[0]] == ["dispatched"]
    assert [[e.kind for e in later] for later in events[1:]] == [["blocked"]] * 4
    assert all(later[0].blocked_on == "environment" for later in events[1:])
    (warning,) = [r.getMessage() for r in caplog.records if r.name == "execkit.dispatch"]
    assert "ISS-1" in warning and "failed_state" in warning


class RefusingBoard(InMemoryBoard):
    """A tracker that does not support moving into `refused`."""

    def __init__(self, refused: str) -> None:
        super().__init__([BoardIssue("ISS-1", "the issue", "todo")])
        self.refused = refused

    def move(self, issue_id: str, state: str) -> bool:
        if state == self.refused:
            raise UnsupportedMove(f"this tracker cannot move issues to {state!r}")
        return super().move(issue_id, state)


@pytest.mark.parametrize("how", ["raises UnsupportedMove", "board lacks the state"])
def test_unavailable_move_keeps_retrying_and_warns(
    how: str, ledger: SqliteLedger, caplog: pytest.LogCaptureFixture
) -> None:
    if how == "raises UnsupportedMove":
        board: InMemoryBoard = RefusingBoard("blocked")
    else:
        board = one_issue_board((BoardState("todo", eligible=True), BoardState("done")))
    runner, clock = ScriptedRunner(WORK), Clock()
    dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(max_attempts=2), clock)
    with caplog.at_level(logging.WARNING, logger="execkit.dispatch"):
        drive(dispatcher, clock, passes=5)
    assert len(runner.calls) == 5
    assert board.get("ISS-1").state == "todo"
    messages = [r.getMessage() for r in caplog.records if r.name == "execkit.dispatch"]
    assert len(messages) == 4  # one per exhaustion: after attempts 2, 3, 4 and 5
    assert all("ISS-1" in m and "'blocked'" in m for m in messages)


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(
    base=st.floats(min_value=0.5, max_value=60),
    spread=st.floats(min_value=1, max_value=30),
    failures=st.integers(min_value=1, max_value=12),
)
def test_backoff_never_exceeds_the_cap(
    tmp_path_factory: pytest.TempPathFactory, base: float, spread: float, failures: int
) -> None:
    config = DispatchConfig(max_attempts=-1, base_backoff_s=base, max_retry_backoff_s=base * spread)
    path = tmp_path_factory.mktemp("backoff") / "ledger.db"
    with open_ledger(path, budget=ROOMY) as ledger:
        board, runner, clock = one_issue_board(), ScriptedRunner(WORK), Clock()
        dispatcher = Dispatcher(board, runner, ledger, config, clock)
        events = dispatched(drive(dispatcher, clock, passes=failures))
    assert len(events) == failures
    for event in events:
        assert event.next_attempt_at is not None
        # Compared as the ledger computes it (end + delay): float addition is monotone, so
        # a delay within the cap can never land past end + cap.
        assert event.at < event.next_attempt_at <= event.at + config.max_retry_backoff_s


def test_restart_in_the_middle_of_a_backoff_does_not_dispatch_early(db: Path) -> None:
    board, clock = one_issue_board(), Clock()
    first_runner = ScriptedRunner(WORK)
    with open_ledger(db, budget=ROOMY) as ledger:
        first = Dispatcher(board, first_runner, ledger, DispatchConfig(), clock)
        (event,) = first.tick()
    assert event.next_attempt_at is not None
    due = event.next_attempt_at
    # A new process: new ledger connection, new dispatcher, no memory of the first.
    clock.now = (event.at + due) / 2
    second_runner = ScriptedRunner(WORK)
    with open_ledger(db, budget=ROOMY) as ledger:
        second = Dispatcher(board, second_runner, ledger, DispatchConfig(), clock)
        assert second.tick() == []
        assert second.next_due() == pytest.approx(due)
        clock.now = due - 0.001
        assert second.tick() == []
        clock.now = due
        (retry,) = second.tick()
    assert second_runner.calls == [("ISS-1", 2)]
    assert retry.attempt == 2


def test_environment_stops_at_once_naming_the_precondition(ledger: SqliteLedger) -> None:
    board, runner, clock = one_issue_board(), ScriptedRunner(ENVIRONMENT), Clock()
    dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(), clock)
    events = drive(dispatcher, clock, passes=5)
    assert len(runner.calls) == 1
    (event,) = events
    assert event.failure_class is FailureClass.ENVIRONMENT
    assert event.charged is False
    assert event.blocked_on == "environment"
    assert event.moved_to == "blocked"
    assert "install: pip install acme" in (event.precondition or "")
    assert "install: pip install acme" in (event.reason or "")
    (row,) = issue_statuses(ledger, DispatchConfig(), board=board, now=clock.now)
    assert row.charged_attempts == 0
    assert "install: pip install acme" in (row.reason or "")


def test_upstream_is_uncharged_up_to_its_own_bound(db: Path) -> None:
    board, runner, clock = one_issue_board(), ScriptedRunner(UPSTREAM), Clock()
    # A charged budget of 1: every retry past the first is possible only because upstream
    # attempts do not charge; the uncharged bound of 3 is what stops it.
    budget = WorkBudget(max_attempts=1, max_uncharged_attempts=3)
    with open_ledger(db, budget=budget) as ledger:
        dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(), clock)
        events = dispatched(drive(dispatcher, clock, passes=10))
        (row,) = issue_statuses(ledger, DispatchConfig(), board=board, now=clock.now)
    assert len(runner.calls) == 3
    assert all(e.charged is False for e in events)
    assert [e.blocked_on for e in events[:-1]] == [None] * (len(events) - 1)
    assert (events[-1].blocked_on, events[-1].moved_to) == ("upstream", "blocked")
    assert (row.charged_attempts, row.uncharged_streak) == (0, len(runner.calls))


def test_upstream_twice_then_success_moves_to_done(ledger: SqliteLedger) -> None:
    board, runner, clock = one_issue_board(), ScriptedRunner(UPSTREAM, UPSTREAM, OK), Clock()
    dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(), clock)
    events = dispatched(drive(dispatcher, clock, passes=10))
    assert [(e.status, e.charged) for e in events] == [
        ("failed", False),
        ("failed", False),
        ("succeeded", True),
    ]
    assert events[-1].moved_to == "done"
    assert board.get("ISS-1").state == "done"


def test_work_budget_blocks_and_moves(db: Path) -> None:
    board, runner, clock = one_issue_board(), ScriptedRunner(WORK), Clock()
    with open_ledger(db) as ledger:  # the default charged budget: 3
        dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(), clock)
        events = dispatched(drive(dispatcher, clock, passes=10))
    assert len(runner.calls) == 3
    assert (events[-1].blocked_on, events[-1].moved_to) == ("work", "blocked")


def test_attempt_limit_stays_in_progress_and_resumes_when_raised(ledger: SqliteLedger) -> None:
    board, runner, clock = one_issue_board(), ScriptedRunner(WORK), Clock()
    dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(), clock)
    dispatcher.tick()
    task_id = issue_statuses(ledger, DispatchConfig(), board=board)[0].task_id
    assert task_id is not None
    ledger.grant_role("ops", "agent.operate", actor=getpass.getuser())
    ledger.set_attempt_limit(task_id, 2, expected_max_attempts=0, actor="ops")
    events = drive(dispatcher, clock, passes=4)
    assert len(runner.calls) == 2
    assert dispatched(events)[-1].blocked_on == "attempt_limit"
    assert dispatched(events)[-1].moved_to is None
    limits = [e for e in events if e.kind == "attempt_limit"]
    assert limits and all(e.moved_to is None for e in limits)
    # The explicit limit binds before the dispatch cap (10), so it is the n/max shown.
    assert [e.max_attempts for e in dispatched(events)] == [2]
    (row,) = issue_statuses(ledger, DispatchConfig(), board=board, now=clock.now)
    assert (row.ledger_state, row.blocked_on, row.attempts, row.max_attempts) == (
        "blocked",
        "attempt_limit",
        2,
        2,
    )
    assert board.get("ISS-1").state == "todo"  # not cancelled, not moved
    # The operator raises the limit: same task, same history, attempt 3 next.
    ledger.set_attempt_limit(task_id, 4, expected_max_attempts=2, actor="ops")
    runner.outcomes = (OK,)
    events = dispatched(drive(dispatcher, clock, passes=4))
    assert runner.calls[-1] == ("ISS-1", 3)
    assert events[-1].task_id == task_id
    assert events[-1].moved_to == "done"


def test_a_succeeded_task_whose_move_failed_is_moved_later(ledger: SqliteLedger) -> None:
    board = RefusingBoard("done")
    runner, clock = ScriptedRunner(OK), Clock()
    dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(), clock)
    (event,) = dispatcher.tick()
    assert (event.status, event.moved_to) == ("succeeded", None)
    board.refused = ""
    (synced,) = dispatcher.tick()
    assert (synced.kind, synced.moved_to) == ("done", "done")
    assert len(runner.calls) == 1  # never dispatched again


def test_a_runner_that_raises_is_a_charged_work_failure(ledger: SqliteLedger) -> None:
    class Broken:
        def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
            raise RuntimeError("boom")

    clock = Clock()
    dispatcher = Dispatcher(one_issue_board(), Broken(), ledger, DispatchConfig(), clock)
    (event,) = dispatcher.tick()
    assert (event.failure_class, event.charged) == (FailureClass.WORK, True)
    assert "RuntimeError: boom" in (event.reason or "")
    (run,) = ledger.runs(event.task_id or "")
    assert (run.status, run.failure_class) == ("failed", FailureClass.WORK)


class FlakyFinishLedger(SqliteLedger):
    """A real ledger whose next `finish_run` fails, as one busy past its timeout does."""

    fail_next_finish = False

    def finish_run(
        self,
        run_id: str,
        status: AttemptStatus | str,
        *,
        failure_class: FailureClass | None = None,
        reason: str | None = None,
        not_before: float | None = None,
        now: float | None = None,
        stopped: bool = False,
        lane_cause: str | None = None,
        usage: Usage | None = None,
        session_id: str | None = None,
    ) -> Run:
        if self.fail_next_finish:
            self.fail_next_finish = False
            raise ExecKitError(f"ledger {self.path} is busy or unwritable: database is locked")
        return super().finish_run(
            run_id,
            status,
            failure_class=failure_class,
            reason=reason,
            not_before=not_before,
            now=now,
            stopped=stopped,
            lane_cause=lane_cause,
            usage=usage,
            session_id=session_id,
        )


def test_a_result_the_ledger_could_not_take_is_recorded_on_the_next_pass(db: Path) -> None:
    board, runner, clock = one_issue_board(), ScriptedRunner(WORK, OK), Clock()
    ledger = FlakyFinishLedger(db, budget=ROOMY)
    with ledger:
        dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(), clock)
        ledger.fail_next_finish = True
        (error,) = dispatcher.tick()
        assert (error.kind, error.issue_id) == ("error", "ISS-1")
        assert "busy" in (error.reason or "")
        (run,) = ledger.runs(error.task_id or ledger.list_tasks()[0].id)
        assert run.status == "running"  # the work happened; its result is not stored yet
        # The next pass stores it (with the time it ended) and the issue goes on: it is not
        # left `running` for as long as this process lives.
        assert dispatcher.tick() == []  # recorded; now in backoff
        (run,) = ledger.runs(run.task_id)
        assert (run.status, run.failure_class, run.ended_at) == ("failed", FailureClass.WORK, T0)
        events = drive(dispatcher, clock, passes=3)
    assert runner.calls == [("ISS-1", 1), ("ISS-1", 2)]
    assert dispatched(events)[-1].moved_to == "done"


def test_each_issue_is_one_task_across_restarts(db: Path) -> None:
    board, clock = one_issue_board(), Clock()
    for _ in range(3):
        with open_ledger(db, budget=ROOMY) as ledger:
            Dispatcher(board, ScriptedRunner(WORK), ledger, DispatchConfig(), clock).tick()
            clock.now += 10_000
    with open_ledger(db) as ledger:
        tasks = [t for t in ledger.list_tasks() if t.title == task_key("ISS-1")]
        assert len(tasks) == 1
        assert [r.attempt for r in ledger.runs(tasks[0].id)] == [1, 2, 3]


def test_the_dispatcher_sets_the_ledger_backoff_from_the_config(ledger: SqliteLedger) -> None:
    config = DispatchConfig(base_backoff_s=2, max_retry_backoff_s=5)
    Dispatcher(one_issue_board(), ScriptedRunner(OK), ledger, config, Clock())
    assert (ledger.backoff.base_s, ledger.backoff.max_s) == (2.0, 5.0)


def test_run_forever_stops_and_does_not_oversleep_a_due_retry(ledger: SqliteLedger) -> None:
    board, runner, clock = one_issue_board(), ScriptedRunner(WORK, OK), Clock()
    dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(), clock)
    slept: list[float] = []

    def sleep(seconds: float) -> None:
        slept.append(seconds)
        clock.now += seconds

    dispatcher.run_forever(3600, stop=lambda: board.list_candidates() == [], sleep=sleep)
    assert len(runner.calls) == 2
    assert board.get("ISS-1").state == "done"
    assert slept and slept[0] <= DispatchConfig().max_retry_backoff_s


def test_run_forever_rejects_a_bad_interval(ledger: SqliteLedger) -> None:
    dispatcher = Dispatcher(one_issue_board(), ScriptedRunner(OK), ledger)
    with pytest.raises(ValueError, match="interval_s"):
        dispatcher.run_forever(0)


def test_run_forever_survives_a_board_caught_mid_edit(
    ledger: SqliteLedger, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "board.json"
    board = JsonFileBoard.create(path, [BoardIssue("ISS-1", "t", "todo")])
    good = path.read_text()
    path.write_text("{ half written")
    runner, clock = ScriptedRunner(OK), Clock()
    dispatcher = Dispatcher(board, runner, ledger, DispatchConfig(), clock)
    sleeps: list[float] = []

    def sleep(seconds: float) -> None:
        sleeps.append(seconds)
        path.write_text(good)  # the operator finishes the edit

    dispatcher.run_forever(5, stop=lambda: bool(runner.calls), sleep=sleep)
    assert sleeps == [5]
    assert runner.calls == [("ISS-1", 1)]
    assert any("not valid JSON" in m for m in caplog.messages)
