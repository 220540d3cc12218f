"""Many dispatchers, one board, one PostgreSQL ledger: what "many hosts" needs.

Real processes share one JSON board file and one ledger on a real server: `execkit
dispatch --db postgresql://...` three times over, and dispatchers driven from a script
(with a short lease) of which one is SIGKILLed while it holds a run. The ledger is the
witness: never two runs of one task at once, attempt numbers gapless, every cap honoured,
nothing stranded, and a dead dispatcher's run abandoned when its lease runs out and taken
up by another with the same history. The last test is the race the first one found, made
deterministic (on both backends).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
from _support import REPO, write_board
from ledger_backends import AnyLedger

from execkit._classify import FailureClass
from execkit.dispatch import BoardIssue, DispatchConfig, Dispatcher, InMemoryBoard, RunOutcome, Slot
from execkit.ledger import Ledger, open_ledger

BIN = REPO / "fixtures" / "bin"
SLOW = str(BIN / "fake-agent-slow")
ENV = {**os.environ, "PYTHONPATH": str(REPO)}
# Short waits so that the retries and the cap come within seconds.
FAST = {"base_backoff_s": 0.05, "max_retry_backoff_s": 0.1}


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def vendor_spans(log: Path) -> tuple[dict[str, list[tuple[float, float]]], list[str]]:
    """Each key's (start, end) runs from the fake agent's log, and the starts never ended."""
    spans: dict[str, list[tuple[float, float]]] = {}
    open_starts: dict[tuple[str, str], float] = {}
    for line in log.read_text().splitlines():
        what, key, pid, at = line.split()
        if what == "start":
            open_starts[(key, pid)] = float(at)
        else:
            spans.setdefault(key, []).append((open_starts.pop((key, pid)), float(at)))
    return spans, sorted(key for key, _ in open_starts)


def assert_never_twice_at_once(spans: dict[str, list[tuple[float, float]]]) -> None:
    for key, intervals in spans.items():
        intervals.sort()
        for (_, end), (start, _) in itertools.pairwise(intervals):
            assert start >= end, f"{key} ran twice at once: {intervals}"


def stop(process: subprocess.Popen[str], *, grace: float = 0.0) -> str:
    """After `grace` seconds to exit on its own: SIGINT, then SIGKILL after a bounded wait;
    the process's stderr."""
    with contextlib.suppress(subprocess.TimeoutExpired):
        _, err = process.communicate(timeout=grace)
        return err or ""
    if process.poll() is None:
        process.send_signal(signal.SIGINT)
    try:
        _, err = process.communicate(timeout=20)
    except subprocess.TimeoutExpired:
        process.kill()
        _, err = process.communicate(timeout=20)
    return err or ""


@pytest.mark.slow
def test_three_cli_dispatchers_share_one_board_and_one_ledger(pg_url: str, tmp_path: Path) -> None:
    log = tmp_path / "vendor.log"
    issues = []
    for n in range(6):
        fail = n % 2  # half succeed at once, half fail until the dispatch cap of 2
        argv = [SLOW, "--seconds", "0.3", "--log", str(log), "--key", f"I{n}"]
        issues.append(
            {
                "id": f"I{n}",
                "title": "t",
                "state": "todo",
                "argv": [*argv, "--exit-code", str(fail)],
            }
        )
    board = write_board(tmp_path / "board.json", issues, dispatch={"max_attempts": 2, **FAST})
    board.chmod(0o600)
    with open_ledger(pg_url):
        pass  # the schema, once, before the race
    command = [sys.executable, "-m", "execkit", "dispatch", "--board", str(board)]
    command += ["--adapter", "generic", "--db", pg_url, "--interval", "0.05"]
    dispatchers = [
        subprocess.Popen(
            command, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
        )
        for _ in range(3)
    ]

    def settled() -> bool:
        states = {i["state"] for i in json.loads(board.read_text())["issues"]}
        return "todo" not in states

    try:
        wait_for(settled, 120, "every issue to reach a terminal state")
    finally:
        errors = [stop(d) for d in dispatchers]
    for err in errors:
        assert "Traceback" not in err, err

    spans, unfinished = vendor_spans(log)
    assert unfinished == []
    assert_never_twice_at_once(spans)
    # One run per success, exactly the cap (2) per failure: nothing ran twice, none stranded.
    assert {k: len(v) for k, v in spans.items()} == {f"I{n}": 2 if n % 2 else 1 for n in range(6)}
    states = {i["id"]: i["state"] for i in json.loads(board.read_text())["issues"]}
    assert states == {f"I{n}": "blocked" if n % 2 else "done" for n in range(6)}
    with open_ledger(pg_url) as ledger:
        assert ledger.validate() == []
        owners = set()
        for task in ledger.list_tasks():
            runs = ledger.runs(task.id)
            assert [r.attempt for r in runs] == list(range(1, len(runs) + 1))
            assert all(r.status != "running" for r in runs)
            assert len(runs) <= 2  # the cap
            for before, after in itertools.pairwise(runs):
                assert before.ended_at is not None and after.started_at >= before.ended_at
            owners |= {r.owner_pid for r in runs}
        assert owners <= {d.pid for d in dispatchers}
        assert len(owners) >= 2, "one dispatcher did all the work: the race was not run"


_DISPATCHER = r"""
import sys, time
from adapters import GenericAdapter
from execkit.dispatch import AdapterRunner, DispatchConfig, Dispatcher, JsonFileBoard
from execkit.ledger import open_ledger

board_path, url, lease_s = sys.argv[1], sys.argv[2], float(sys.argv[3])
board = JsonFileBoard(board_path)
config = DispatchConfig.from_mapping(board.dispatch_settings())
with open_ledger(url, backoff=config.backoff) as ledger:
    dispatcher = Dispatcher(board, AdapterRunner(GenericAdapter()), ledger, config, lease_s=lease_s)
    deadline = time.time() + 120
    while board.list_candidates() and time.time() < deadline:
        dispatcher.tick()
        time.sleep(0.05)
"""

LEASE_S = 1.5


@pytest.mark.slow
def test_a_sigkilled_dispatcher_loses_its_claim_when_the_lease_expires(
    pg_url: str, tmp_path: Path
) -> None:
    log = tmp_path / "vendor.log"
    issues = [
        {
            "id": "LONG",
            "title": "t",
            "state": "todo",
            "argv": [SLOW, "--seconds", "3", "--log", str(log), "--key", "LONG"],
        },
        *(
            {
                "id": f"Q{n}",
                "title": "t",
                "state": "todo",
                "argv": [SLOW, "--seconds", "0.2", "--log", str(log), "--key", f"Q{n}"],
            }
            for n in range(3)
        ),
    ]
    board = write_board(tmp_path / "board.json", issues, dispatch={"max_attempts": 3, **FAST})
    board.chmod(0o600)
    ledger = open_ledger(pg_url)

    def start() -> subprocess.Popen[str]:
        return subprocess.Popen(
            [sys.executable, "-c", _DISPATCHER, str(board), pg_url, str(LEASE_S)],
            env=ENV,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )

    doomed = start()
    survivors: list[subprocess.Popen[str]] = []
    try:
        # The first dispatcher claims LONG (the board's first issue) and runs it.
        def claimed() -> bool:
            task = next((t for t in ledger.list_tasks() if t.title == "board:LONG"), None)
            if task is None:
                return False
            return any(
                r.status == "running" and r.owner_pid == doomed.pid for r in ledger.runs(task.id)
            )

        wait_for(claimed, 60, "the first dispatcher to claim LONG")
        wait_for(lambda: log.exists() and "start LONG" in log.read_text(), 30, "LONG to start")
        survivors = [start(), start()]
        time.sleep(0.5)  # they come while the claim is live: they must leave LONG alone
        # The host dies: the dispatcher and the agent it ran, at once.
        agents = psutil.Process(doomed.pid).children(recursive=True)
        os.kill(doomed.pid, signal.SIGKILL)
        for agent in agents:
            agent.kill()
        killed_at = time.time()
        doomed.wait(30)

        def settled() -> bool:
            states = {i["state"] for i in json.loads(board.read_text())["issues"]}
            return states == {"done"}

        wait_for(settled, 90, "the survivors to finish every issue")
    finally:
        if doomed.poll() is None:
            doomed.kill()
            doomed.wait(30)
        errors = [stop(s, grace=30) for s in survivors]  # they exit once the board is done
    for err in errors:
        assert "Traceback" not in err, err

    (task,) = [t for t in ledger.list_tasks() if t.title == "board:LONG"]
    first, second = ledger.runs(task.id)
    # The dead dispatcher's run was abandoned, and counted: once its lease ran out, or at
    # once by a survivor that started after the kill on this same host and found its owner
    # process gone (on another host only the lease could tell) ...
    assert (first.attempt, first.status, first.owner_pid) == (1, "abandoned", doomed.pid)
    reason = first.reason or ""
    assert "lease expired" in reason or f"pid {doomed.pid} on" in reason, reason
    assert first.ended_at is not None
    assert killed_at - 0.1 <= first.ended_at <= killed_at + LEASE_S + 10
    # ... and another dispatcher picked the work up with that history: attempt 2.
    assert (second.attempt, second.status) == (2, "succeeded")
    assert second.owner_pid in {s.pid for s in survivors}
    assert second.started_at >= first.ended_at
    shown = ledger.get_task(task.id)
    assert (shown.attempts_started, shown.charged_attempts) == (2, 2)
    spans, unfinished = vendor_spans(log)
    assert unfinished == ["LONG"]  # the killed agent's start, never ended
    assert_never_twice_at_once(spans)
    assert len(spans["LONG"]) == 1
    for n in range(3):
        assert [r.status for r in ledger.runs(task_of(ledger, f"Q{n}"))] == ["succeeded"]
    assert ledger.validate() == []
    ledger.close()


def task_of(ledger: Ledger, issue_id: str) -> str:
    return next(t.id for t in ledger.list_tasks() if t.title == f"board:{issue_id}")


class _StaleOnce(InMemoryBoard):
    """A board whose next candidate list is one read before another dispatcher's move."""

    def __init__(self, issues: list[BoardIssue]) -> None:
        super().__init__(issues)
        self.stale: list[BoardIssue] | None = None

    def list_candidates(self) -> list[BoardIssue]:
        if self.stale is not None:
            stale, self.stale = self.stale, None
            return stale
        return super().list_candidates()


class _Failing:
    def __init__(self) -> None:
        self.calls = 0

    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        self.calls += 1
        return RunOutcome("failed", FailureClass.WORK, "default", detail="wrong answer")


def test_an_issue_another_dispatcher_just_gave_up_is_not_taken_for_a_reopen(
    ledger: AnyLedger,
) -> None:
    # Dispatcher B listed the candidates; dispatcher A then ran the issue's last allowed
    # attempt, moved it to the failed state and recorded the give-up. B, reaching the issue
    # in its stale list, finds a give-up at this very count: that is an operator's re-open
    # only if the board still shows the issue eligible now.
    issue = BoardIssue("I1", "t", "todo", prompt="p")
    board = _StaleOnce([issue])
    runner = _Failing()
    config = DispatchConfig(max_attempts=1, base_backoff_s=0.05, max_retry_backoff_s=0.1)
    first = Dispatcher(board, runner, ledger, config).tick()
    assert [e.moved_to for e in first] == ["blocked"], first
    board.stale = [issue]  # what B read before A's move
    assert Dispatcher(board, runner, ledger, config).tick() == []
    (task,) = ledger.list_tasks()
    assert len(ledger.runs(task.id)) == 1  # the cap of 1 holds
    assert runner.calls == 1
