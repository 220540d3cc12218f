"""`AdapterRunner` over real processes: the scripts in fixtures/bin and the generic adapter,
and two dispatcher processes over one ledger never running one issue at the same time."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from _support import REPO, a_slot, write_board

from adapters import GenericAdapter
from execkit._classify import FailureClass
from execkit.dispatch import AdapterRunner, BoardIssue, DispatchConfig, Dispatcher, InMemoryBoard
from execkit.ledger import open_ledger

BIN = REPO / "fixtures" / "bin"


@pytest.fixture
def runner(tmp_path: Path) -> AdapterRunner:
    state = tmp_path / "state"
    state.mkdir()
    hint = "pip install acme-agent"
    return AdapterRunner(
        GenericAdapter(install_hint=hint), env={"EXECKIT_FIXTURE_STATE": str(state)}
    )


def issue(*argv: str) -> BoardIssue:
    return BoardIssue("ISS-1", "t", "todo", prompt="the prompt", argv=list(argv))


def test_success(runner: AdapterRunner) -> None:
    outcome = runner.run(issue(str(BIN / "fake-agent-ok")), a_slot(1))
    assert (outcome.status, outcome.failure_class, outcome.charged) == ("succeeded", None, True)


def test_missing_binary_is_environment_with_the_install_hint(runner: AdapterRunner) -> None:
    outcome = runner.run(issue("acme-agent-that-is-not-installed"), a_slot(1))
    assert outcome.failure_class is FailureClass.ENVIRONMENT
    assert outcome.charged is False
    assert "install: pip install acme-agent" in (outcome.precondition or "")
    assert outcome.ledger_reason() == outcome.precondition


def test_vendor_503_is_upstream_then_recovers(runner: AdapterRunner) -> None:
    flaky = issue(str(BIN / "fake-agent-flaky"), "--fail-times", "2", "--key", "k")
    first, second, third = (runner.run(flaky, a_slot(n)) for n in (1, 2, 3))
    assert [o.failure_class for o in (first, second)] == [FailureClass.UPSTREAM] * 2
    assert first.reason == "http 503"
    assert third.status == "succeeded"


def test_wrong_output_is_charged_work_with_the_detail(runner: AdapterRunner) -> None:
    outcome = runner.run(issue(str(BIN / "fake-agent-wrong")), a_slot(1))
    assert (outcome.failure_class, outcome.charged) == (FailureClass.WORK, True)
    assert outcome.detail == "check failed: expected 42, got 41"


def test_one_dispatch_spawns_once_even_for_upstream(runner: AdapterRunner, tmp_path: Path) -> None:
    # The dispatcher owns retries across dispatches; the in-agent loop must not re-spawn.
    flaky = issue(str(BIN / "fake-agent-flaky"), "--fail-times", "5", "--key", "once")
    runner.run(flaky, a_slot(1))
    count = (tmp_path / "state" / "fake-agent-flaky.once.count").read_text()
    assert count == "1"


def test_dispatcher_over_real_scripts(runner: AdapterRunner, tmp_path: Path) -> None:
    board = InMemoryBoard(
        [
            BoardIssue("OK", "t", "todo", argv=[str(BIN / "fake-agent-ok")]),
            BoardIssue("ENV", "t", "todo", argv=["acme-agent-that-is-not-installed"]),
        ]
    )
    with open_ledger(tmp_path / "l.db") as ledger:
        events = Dispatcher(board, runner, ledger, DispatchConfig()).tick()
    assert {(e.issue_id, e.moved_to) for e in events} == {("OK", "done"), ("ENV", "blocked")}


_WORKER = textwrap.dedent(
    """
    import sys, time
    from adapters import GenericAdapter
    from execkit._budget import WorkBudget
    from execkit.dispatch import AdapterRunner, DispatchConfig, Dispatcher, JsonFileBoard
    from execkit.ledger import open_ledger

    board_path, db_path, start_at = sys.argv[1], sys.argv[2], float(sys.argv[3])
    config = DispatchConfig(max_attempts=3, base_backoff_s=0.05, max_retry_backoff_s=0.1)
    board = JsonFileBoard(board_path)
    budget = WorkBudget(max_attempts=100)
    with open_ledger(db_path, budget=budget) as ledger:
        dispatcher = Dispatcher(board, AdapterRunner(GenericAdapter()), ledger, config)
        while time.time() < start_at:
            time.sleep(0.005)
        deadline = time.time() + 90
        while board.list_candidates() and time.time() < deadline:
            dispatcher.tick()
            time.sleep(0.01)
    """
)


@pytest.mark.slow
def test_two_dispatcher_processes_never_run_one_issue_twice_at_once(tmp_path: Path) -> None:
    log = tmp_path / "vendor.log"
    slow = str(BIN / "fake-agent-slow")
    issues = []
    for n in range(4):
        fail = n % 2  # half succeed at once, half fail until the cap of 3
        argv = [slow, "--seconds", "0.3", "--log", str(log), "--key", f"I{n}"]
        issues.append(
            {
                "id": f"I{n}",
                "title": "t",
                "state": "todo",
                "argv": [*argv, "--exit-code", str(fail)],
            }
        )
    board = write_board(tmp_path / "board.json", issues)
    db = tmp_path / "ledger.db"
    with open_ledger(db):
        pass  # create the schema once, before the race
    start_at = time.time() + 2.0
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, str(board), str(db), str(start_at)],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    for worker in workers:
        _, err = worker.communicate(timeout=180)
        assert worker.returncode == 0, err

    spans: dict[str, list[tuple[float, float]]] = {}
    open_starts: dict[tuple[str, str], float] = {}
    for line in log.read_text().splitlines():
        what, key, pid, at = line.split()
        if what == "start":
            open_starts[(key, pid)] = float(at)
        else:
            spans.setdefault(key, []).append((open_starts.pop((key, pid)), float(at)))
    assert not open_starts
    for key, intervals in spans.items():
        intervals.sort()
        for (_, end), (start, _) in itertools.pairwise(intervals):
            assert start >= end, f"{key} ran twice at once: {intervals}"
    # Exactly one run per success, exactly the cap (3) per failure: nothing ran twice.
    assert {k: len(v) for k, v in spans.items()} == {"I0": 1, "I1": 3, "I2": 1, "I3": 3}
    with open_ledger(db) as ledger:
        for task in ledger.list_tasks():
            runs = ledger.runs(task.id)
            assert [r.attempt for r in runs] == list(range(1, len(runs) + 1))
            assert all(r.status != "running" for r in runs)
    states = {i["id"]: i["state"] for i in json.loads(board.read_text())["issues"]}
    assert states == {"I0": "done", "I1": "blocked", "I2": "done", "I3": "blocked"}
