"""Wake-ups (issue #51 item 5): an operator's resume or retry reaches a waiting dispatcher at
once, not at its next pass. On both backends (SQLite polls one row, PostgreSQL listens for
its notification), through `execkit serve` (a long poll), and in a running dispatcher whose
pass interval is ten minutes.

Nothing here measures time: each wait is bounded, and what is asserted is the number a wait
returned (a wait that was not woken returns the number it was given) or how many issues ran.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest
from ledger_backends import AnyLedger
from test_remote import ME, Remote, remote  # noqa: F401 - the fixture

from execkit._classify import FailureClass
from execkit._errors import InvalidInput
from execkit.dispatch import BoardIssue, DispatchConfig, Dispatcher, InMemoryBoard, RunOutcome
from execkit.ledger import WAKE_CAPABILITY, open_ledger

LANE = "claude/default"
# Far longer than any test may take: a wait that returns the new number was woken by it.
LONG_S = 120.0


def _stop_lane(ledger: Any, task_id: str) -> None:
    run = ledger.start_run(task_id, request_key=f"stop-{task_id}", actor=ME, lane=LANE)
    ledger.finish_run(
        run.id,
        "failed",
        failure_class=FailureClass.ENVIRONMENT,
        reason="claude refused the credentials; run `claude /login`",
        lane_cause="credentials",
    )


def _waiting(ledger: Any, seen: int) -> tuple[threading.Thread, list[int]]:
    """A thread waiting on `ledger.wait_for_wake(seen, LONG_S)`; its answer lands in the list."""
    got: list[int] = []
    thread = threading.Thread(target=lambda: got.append(ledger.wait_for_wake(seen, LONG_S)))
    thread.start()
    return thread, got


def test_each_operation_that_lets_work_run_moves_the_wake_number(ledger: AnyLedger) -> None:
    assert WAKE_CAPABILITY in ledger.capabilities()
    task = ledger.create_task("t", actor=ME).id
    other = ledger.create_task("u", max_attempts=1, actor=ME).id
    start = ledger.wake_seq()
    _stop_lane(ledger, task)
    assert ledger.wake_seq() == start  # a stop lets nothing run
    ledger.resume_lane(LANE, actor=ME)
    resumed = ledger.wake_seq()
    assert resumed == start + 1
    ledger.retry_task(task, actor=ME, force=True)
    assert ledger.wake_seq() == resumed + 1
    ledger.set_attempt_limit(other, 3, expected_max_attempts=1, actor=ME)
    assert ledger.wake_seq() == resumed + 2
    ledger.set_lane_config(actor=ME, breaker_k=4)
    assert ledger.wake_seq() == resumed + 3
    # A wait with nothing new returns what it was given; bad input is refused.
    assert ledger.wait_for_wake(ledger.wake_seq(), 0) == resumed + 3
    with pytest.raises(InvalidInput) as bad:
        ledger.wait_for_wake(0, 301)
    assert bad.value.field == "timeout_s"


def test_a_wait_returns_as_soon_as_an_operator_resumes_a_lane(
    ledger: AnyLedger, opener: Any
) -> None:
    task = ledger.create_task("t", actor=ME).id
    _stop_lane(ledger, task)
    seen = ledger.wake_seq()
    thread, got = _waiting(ledger, seen)
    with opener() as operator:  # another connection: another process, another host
        operator.resume_lane(LANE, actor=ME)
    thread.join(LONG_S + 30)
    assert got == [seen + 1]


def test_a_wait_through_the_server_returns_when_another_client_retries(
    remote: Remote,  # noqa: F811
) -> None:
    waiting_client, operator = remote.client(), remote.client()
    assert WAKE_CAPABILITY in waiting_client.capabilities()
    task = operator.create_task("t", actor=ME).id
    _stop_lane(operator, task)
    seen = waiting_client.wake_seq()
    got: list[int] = []
    # The server's own cap on a wait (25 s) is below LONG_S: a wait not woken returns
    # `seen`, and the test fails on the value.
    thread = threading.Thread(target=lambda: got.append(waiting_client.wait_for_wake(seen, 20.0)))
    thread.start()
    operator.retry_task(task, actor=ME, force=True)
    thread.join(LONG_S)
    assert got == [seen + 1]


class _Vendor:
    """Refuses the credentials until `logged_in`; then every call succeeds."""

    def __init__(self) -> None:
        self.logged_in = False
        self.calls = 0
        self.lock = threading.Lock()

    def run(self, issue: BoardIssue, slot: Any) -> RunOutcome:
        with self.lock:
            self.calls += 1
        if self.logged_in:
            return RunOutcome("succeeded")
        return RunOutcome(
            "failed",
            FailureClass.ENVIRONMENT,
            "credentials refused",
            precondition="claude refused the credentials; run `claude /login`",
            lane_cause="credentials",
        )


def test_a_running_dispatcher_runs_the_held_issues_when_the_lane_is_resumed(
    tmp_path: Path,
) -> None:
    # The pass interval is ten minutes: without the wake-up the held issues would wait for
    # it (the resume was noticed about 9 s late with the default 10 s interval).
    vendor = _Vendor()
    board = InMemoryBoard([BoardIssue(f"I-{n}", "t", "todo") for n in range(3)])
    db = tmp_path / "ledger.db"
    done = threading.Event()
    with open_ledger(db) as ledger:
        dispatcher = Dispatcher(board, vendor, ledger, DispatchConfig(max_concurrent_agents=1))

        def finished() -> bool:
            if all(issue.state == "done" for issue in board.list_issues()):
                done.set()
            return done.is_set() or dispatcher.stopping

        loop = threading.Thread(
            target=dispatcher.run_forever, args=(600.0,), kwargs={"stop": finished}
        )
        loop.start()
        try:
            for _ in range(12000):  # bounded: until the lane has stopped (the first call)
                if any(lane.state == "stopped" for lane in ledger.list_lanes()):
                    break
                threading.Event().wait(0.01)
            (stopped,) = [lane for lane in ledger.list_lanes() if lane.state == "stopped"]
            vendor.logged_in = True
            with open_ledger(db) as operator:
                operator.resume_lane(stopped.lane, actor=ME)
            assert done.wait(LONG_S), [i.state for i in board.list_issues()]
        finally:
            dispatcher.request_stop(hurry=True)
            loop.join(LONG_S)
        dispatcher.shutdown(0)
    assert {issue.state for issue in board.list_issues()} == {"done"}
    assert vendor.calls == 4  # the one that stopped the lane, then the three after the resume


def test_closing_the_ledger_ends_a_wait_in_progress(ledger: AnyLedger) -> None:
    # A dispatcher's waker thread is waiting when the dispatcher stops and closes its
    # ledger: the close must not wait out the wait (on PostgreSQL it held the listener for
    # the whole wait, so three stopped dispatchers took a minute to exit).
    seen = ledger.wake_seq()
    thread, got = _waiting(ledger, seen)
    closer = threading.Thread(target=ledger.close)
    closer.start()
    closer.join(LONG_S / 2)
    thread.join(LONG_S / 2)
    assert not closer.is_alive(), "close waited for the wait in progress"
    assert not thread.is_alive(), "the wait went on after the close"
    assert got == [seen]
