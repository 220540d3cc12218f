"""Two dispatchers through ONE `execkit serve` (a real server process on 127.0.0.1, token
auth) share a vendor lane (issue #28): the vendor answers the first dispatcher with a usage
limit and a structured reset once; the second dispatcher's tasks on that lane are refused
by the server's ledger (lane waiting) before anything reaches the vendor. Counted: vendor
calls, runs in the ledger; no timing."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import attrs
from test_dispatch_fleet import server  # noqa: F401 - the fixture

from execkit._classify import FailureClass
from execkit.dispatch import (
    BoardIssue,
    DispatchConfig,
    Dispatcher,
    EventKind,
    InlineExecutor,
    InMemoryBoard,
    RunOutcome,
    Slot,
)
from execkit.ledger import current_owner, open_ledger
from execkit.remote import RemoteLedger

ISSUES = 3
RESET_S = 3600.0  # far beyond the test: the lane stays parked throughout


class Vendor:
    """The fake vendor: a usage limit with its reset (structured) on the first call, a
    success on every later one. Counts every call, by issue."""

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.lock = threading.Lock()

    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        with self.lock:
            self.calls.append(issue.id)
            first = len(self.calls) == 1
        if first:
            return RunOutcome(
                "failed",
                FailureClass.UPSTREAM,
                "usage limit reached",
                not_before=time.time() + RESET_S,
                lane_cause="reset",
            )
        return RunOutcome("succeeded")


def _board(prefix: str) -> InMemoryBoard:
    return InMemoryBoard(
        [BoardIssue(f"{prefix}-{n}", f"{prefix} {n}", "todo", prompt="go") for n in range(ISSUES)]
    )


def test_two_dispatchers_through_one_server_share_a_lane(
    tmp_path: Path,
    server: tuple[str, str],  # noqa: F811
) -> None:
    url, token = server
    vendor = Vendor()
    config = DispatchConfig(max_concurrent_agents=1)
    first_board, second_board = _board("A"), _board("B")
    with RemoteLedger(url, token) as first, RemoteLedger(url, token) as second:
        one = Dispatcher(first_board, vendor, first, config, executor=InlineExecutor())
        two = Dispatcher(second_board, vendor, second, config, executor=InlineExecutor())
        events_one = one.tick()
        # The first dispatcher met the limit once; its other issues wait on the lane.
        assert vendor.calls == ["A-0"]
        [lane] = first.list_lanes()
        assert lane.state == "parked" and lane.opens_at is not None
        events_two = two.tick()
        # The second dispatcher, another client of the same server: refused by the lane
        # the first one parked, without one vendor call, and no run in the ledger. Its
        # wait is said once, for the issue that met it; the others wait unsaid.
        assert vendor.calls == ["A-0"]
        (waiting,) = [e for e in events_two if e.kind is EventKind.WAITING]
        assert waiting.issue_id == "B-0"
        assert f"task {waiting.task_id} waits on lane {lane.lane}" in (waiting.reason or "")
        theirs = [t for t in second.list_tasks() if t.title.startswith("board:B")]
        assert len(theirs) == ISSUES
        for task in theirs:
            assert second.runs(task.id) == []
            assert (task.attempts_started, task.charged_attempts) == (0, 0)
        # Its next pass does not even ask the ledger: the lane is held until its reset.
        assert two.next_due() == lane.opens_at
        assert [e.kind for e in events_one].count(EventKind.WAITING) == 1
        # Cards stay where they are: waiting on a lane is not the task's fault.
        assert {i.state for i in (*first_board.list_issues(), *second_board.list_issues())} == {
            "todo"
        }
    with open_ledger(tmp_path / "ledger.db") as ledger:
        assert len(ledger.lane_history(lane.lane)) == 1  # the one reset
        assert ledger.validate() == []


class MissingBinary:
    """A host whose vendor CLI is not installed: every call is the environment stop the
    adapter reads from the spawn (`binary_missing`). Counts its calls."""

    def __init__(self) -> None:
        self.calls: list[str] = []

    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        self.calls.append(issue.id)
        return RunOutcome(
            "failed",
            FailureClass.ENVIRONMENT,
            "claude CLI not found on PATH; install it on this host",
            lane_cause="binary_missing",
        )


class Succeeds:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        self.calls.append(issue.id)
        return RunOutcome("succeeded")


def test_a_missing_binary_through_one_server_holds_that_hosts_tasks_only(
    tmp_path: Path,
    server: tuple[str, str],  # noqa: F811
) -> None:
    """Two dispatchers on two hosts (their host names injected as their `RunOwner`) through
    one server process: the binary missing on host A stops the lane on host A, which the
    server checks at A's admissions (A's host, sent with them, not the server's own), and
    B's tasks on the same vendor lane run."""
    url, token = server
    host_a, host_b = (attrs.evolve(current_owner(), host=name) for name in ("host-a", "host-b"))
    missing, works = MissingBinary(), Succeeds()
    config = DispatchConfig(max_concurrent_agents=1)
    board_a, board_b = _board("A"), _board("B")
    with RemoteLedger(url, token) as first, RemoteLedger(url, token) as second:
        on_a = Dispatcher(board_a, missing, first, config, executor=InlineExecutor(), owner=host_a)
        on_b = Dispatcher(board_b, works, second, config, executor=InlineExecutor(), owner=host_b)
        events_a = on_a.tick()
        # One call found the binary missing; A's other tasks are held by the stopped lane
        # on host A, refused at admission (no run), before any reached the host's CLI.
        assert missing.calls == ["A-0"]
        [stopped] = [lane for lane in first.list_lanes() if lane.state == "stopped"]
        assert stopped.lane.endswith("@host-a")
        (waiting,) = [e for e in events_a if e.kind is EventKind.WAITING]
        assert waiting.issue_id == "A-1"
        assert f"task {waiting.task_id} waits on lane {stopped.lane}" in (waiting.reason or "")
        on_b.tick()
        assert works.calls == [f"B-{n}" for n in range(ISSUES)]
        # A's next pass: still held, still no call, and host B's tasks all done.
        on_a.tick()
        assert missing.calls == ["A-0"]
        assert {i.state for i in board_b.list_issues()} == {"done"}
    with open_ledger(tmp_path / "ledger.db") as ledger:
        held = [t for t in ledger.list_tasks() if t.title in ("board:A-1", "board:A-2")]
        assert len(held) == 2 and all(ledger.runs(t.id) == [] for t in held)
        assert ledger.validate() == []
