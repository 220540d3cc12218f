"""Two dispatchers through ONE `execkit serve` (a real server process on 127.0.0.1, token
auth) share a vendor lane (issue #28): the vendor answers the first dispatcher with a usage
limit and a structured reset once; the second dispatcher's tasks on that lane are refused
by the server's ledger (lane waiting) before anything reaches the vendor. Counted: vendor
calls, runs in the ledger; no timing."""

from __future__ import annotations

import threading
import time
from pathlib import Path

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
from execkit.ledger import open_ledger
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
        # the first one parked, without one vendor call, and no run in the ledger.
        assert vendor.calls == ["A-0"]
        refused = [e for e in events_two if e.kind is EventKind.REFUSED]
        assert {e.issue_id for e in refused} == {f"B-{n}" for n in range(ISSUES)}
        assert all(f"waits on lane {lane.lane}" in (e.reason or "") for e in refused)
        theirs = [t for t in second.list_tasks() if t.title.startswith("board:B")]
        assert len(theirs) == ISSUES
        for task in theirs:
            assert second.runs(task.id) == []
            assert (task.attempts_started, task.charged_attempts) == (0, 0)
        # Its next pass does not even ask the ledger: the lane is held until its reset.
        assert two.next_due() == lane.opens_at
        assert [e.kind for e in events_one].count(EventKind.REFUSED) == ISSUES - 1
        # Cards stay where they are: waiting on a lane is not the task's fault.
        assert {i.state for i in (*first_board.list_issues(), *second_board.list_issues())} == {
            "todo"
        }
    with open_ledger(tmp_path / "ledger.db") as ledger:
        assert len(ledger.lane_history(lane.lane)) == 1  # the one reset
        assert ledger.validate() == []
