"""The stall watchdog (issue #46): no byte on stdout or stderr for S seconds stops the whole
tree. Real agents that print one line and then sleep (with a descendant of their own) are
stopped by the stall timeout, never by the run's much longer timeout; the attempt is `work`
("stalled: no output for S s") unless the adapter read that a vendor request was in flight.
Nothing here asserts a duration: which deadline fired is read from the result."""

from __future__ import annotations

import json
import stat
import sys
import uuid
from pathlib import Path

import pytest
from _support import REPO, kill_marked, marked_left, run_execkit, write_board

from adapters import ClaudeAdapter, GenericAdapter
from execkit import AgentRequest, AttemptOptions, InvalidInput, run_attempt, spawn
from execkit._agent import run_agent, stall_timeout_of
from execkit._classify import FailureClass, classify
from execkit._proof import AgentFailed
from execkit.ledger import open_ledger

# Far beyond the stall timeouts below: a run this test sees end was ended by the stall.
RUN_TIMEOUT_S = 600.0


def _silent_agent(marker: str, *, first_line: str = "working on it") -> list[str]:
    """An agent that prints `first_line`, leaves a descendant named `marker` asleep, and
    sleeps itself: silent from then on."""
    code = (
        "import subprocess, sys, time\n"
        f"subprocess.Popen(['bash', '-c', 'exec -a {marker} sleep 600'])\n"
        f"print({first_line!r}, flush=True)\n"
        "time.sleep(600)\n"
    )
    return [sys.executable, "-c", code]


@pytest.fixture
def marker() -> object:
    name = f"execkit-stall-{uuid.uuid4().hex[:8]}"
    yield name
    kill_marked(name)


def test_a_silent_child_is_stopped_by_the_stall_timeout_with_its_tree(marker: str) -> None:
    result = spawn(_silent_agent(marker), timeout=RUN_TIMEOUT_S, stall_timeout=1, kill_grace=1)
    assert result.stalled_after_s == 1
    assert not result.timed_out and not result.ok
    assert result.stdout_tail.strip() == "working on it"
    assert marked_left(marker) == []
    verdict = classify(result)
    assert verdict is not None
    assert (verdict.failure_class, verdict.reason) == (
        FailureClass.WORK,
        "stalled: no output for 1 s",
    )


def test_a_child_that_keeps_printing_is_never_stalled() -> None:
    # Twelve lines, one every 0.1 s, against a stall timeout thirty times that gap.
    code = "import time\nfor i in range(12):\n    print(i, flush=True)\n    time.sleep(0.1)\n"
    result = spawn([sys.executable, "-c", code], stall_timeout=3, timeout=RUN_TIMEOUT_S)
    assert result.ok and result.stalled_after_s is None
    assert result.stdout_tail.split() == [str(i) for i in range(12)]


def test_bytes_on_stderr_count_as_output_too() -> None:
    code = (
        "import sys, time\nfor i in range(12):\n    sys.stderr.write('.')\n"
        "    sys.stderr.flush()\n    time.sleep(0.1)\n"
    )
    result = spawn([sys.executable, "-c", code], stall_timeout=3)
    assert result.ok and result.stderr_tail == "." * 12


@pytest.mark.parametrize("value", [0, -1, float("nan"), float("inf")])
def test_a_bad_stall_timeout_is_refused_before_anything_runs(value: float) -> None:
    with pytest.raises(InvalidInput, match="stall_timeout must be"):
        spawn(["true"], stall_timeout=value)
    with pytest.raises(InvalidInput, match="stall_timeout_s must be"):
        run_agent(
            GenericAdapter(), AgentRequest(prompt="", extra_args=["true"]), stall_timeout_s=value
        )


def test_a_stalled_attempt_is_charged_work_and_recorded(tmp_path: Path, marker: str) -> None:
    ledger = open_ledger(tmp_path / "l.db")
    task = ledger.create_task("t", actor="runner")
    request = AgentRequest(prompt="", extra_args=_silent_agent(marker), timeout_s=RUN_TIMEOUT_S)
    options = AttemptOptions(stall_timeout_s=1, kill_grace=1, lane=None)
    outcome = run_attempt(ledger, task.id, GenericAdapter(), request, options)
    assert (outcome.failure_class, outcome.charged) == (FailureClass.WORK, True)
    assert outcome.proof.reason == "stalled: no output for 1 s"
    (run,) = ledger.runs(task.id)
    assert run.reason is not None and run.reason.startswith("stalled: no output for 1 s")
    assert ledger.get_task(task.id).charged_attempts == 1
    assert marked_left(marker) == []


def _fake_claude(path: Path, events: list[dict[str, object]], marker: str) -> ClaudeAdapter:
    """A `claude` that prints `events` (stream-json) and then hangs, its sleeper named."""
    lines = "".join(f"print({json.dumps(json.dumps(e))}, flush=True)\n" for e in events)
    path.write_text(
        f"#!{sys.executable}\nimport subprocess, time\n"
        f"subprocess.Popen(['bash', '-c', 'exec -a {marker} sleep 600'])\n"
        f"{lines}time.sleep(600)\n"
    )
    path.chmod(path.stat().st_mode | stat.S_IXUSR)
    return ClaudeAdapter(binary=str(path))


INIT = {"type": "system", "subtype": "init", "session_id": "s-1"}
TOOL_USE = {
    "type": "assistant",
    "message": {"content": [{"type": "tool_use", "id": "t1", "name": "Bash", "input": {}}]},
}
TOOL_RESULT = {"type": "user", "message": {"content": [{"type": "tool_result"}]}}


@pytest.mark.parametrize(
    ("events", "failure_class"),
    [
        # The request went out and nothing came back: the vendor left it waiting.
        ([INIT], FailureClass.UPSTREAM),
        ([INIT, TOOL_USE, TOOL_RESULT], FailureClass.UPSTREAM),
        # A tool runs after the answer: nothing says the vendor is the one that hangs.
        ([INIT, TOOL_USE], FailureClass.WORK),
        # Nothing at all the adapter could read.
        ([], FailureClass.WORK),
    ],
)
def test_the_adapter_names_a_request_in_flight_else_the_stall_is_work(
    tmp_path: Path, marker: str, events: list[dict[str, object]], failure_class: FailureClass
) -> None:
    claude = _fake_claude(tmp_path / "claude", events, marker)
    request = AgentRequest(prompt="p", timeout_s=RUN_TIMEOUT_S)
    with pytest.raises(AgentFailed) as failed:
        run_agent(claude, request, max_attempts=1, stall_timeout_s=1, kill_grace=1)
    proof = failed.value.proof
    assert proof.failure_class is failure_class
    assert proof.reason is not None and proof.reason.startswith("stalled: no output for 1 s")
    assert ("in flight" in proof.reason) is (failure_class is FailureClass.UPSTREAM)
    assert marked_left(marker) == []


def test_an_adapter_sets_the_default_and_the_options_override_it() -> None:
    assert stall_timeout_of(ClaudeAdapter(), None) == 900.0
    assert stall_timeout_of(ClaudeAdapter(), 5) == 5
    assert stall_timeout_of(GenericAdapter(), None) is None


def test_execkit_run_stall_timeout_exits_124_and_names_the_stall(marker: str) -> None:
    done = run_execkit(
        "run", "--stall-timeout", "1", "--kill-grace", "1", "--", *_silent_agent(marker)
    )
    assert done.returncode == 124
    assert "execkit: stalled: no output for 1 s; process tree stopped" in done.stderr
    as_json = run_execkit(
        "run", "--json", "--stall-timeout", "1", "--kill-grace", "1", "--", *_silent_agent(marker)
    )
    payload = json.loads(as_json.stdout)
    assert (payload["class"], payload["reason"], payload["stalled_after_s"]) == (
        "work",
        "stalled: no output for 1 s",
        1,
    )
    assert marked_left(marker) == []
    bad = run_execkit("run", "--stall-timeout", "0", "--", "true")
    assert bad.returncode != 0 and "--stall-timeout" in bad.stderr


def test_dispatch_stall_timeout_records_the_stall(tmp_path: Path, marker: str) -> None:
    board = write_board(
        tmp_path / "board.json",
        [{"id": "S-1", "title": "s", "state": "todo", "argv": _silent_agent(marker)}],
    )
    db = tmp_path / "l.db"
    done = run_execkit(
        "dispatch", "--board", str(board), "--db", str(db), "--once", "--stall-timeout", "1"
    )
    assert done.returncode == 0, done.stderr
    ledger = open_ledger(db)
    (task,) = ledger.list_tasks()
    (run,) = ledger.runs(task.id)
    assert run.failure_class is FailureClass.WORK
    assert run.reason is not None and run.reason.startswith("stalled: no output for 1 s")
    assert marked_left(marker) == []


def test_the_recorded_claude_hang_stalls_as_upstream(tmp_path: Path, marker: str) -> None:
    """claude 2.1.332 against an API that accepts and never answers (the recorded cell
    `claude/hang`) prints its `init` event and nothing more: replayed, then silent, the
    stall is the vendor's (a request in flight), uncharged."""
    recorded = REPO / "fixtures" / "recorded" / "claude" / "hang" / "stdout"
    events = [json.loads(line) for line in recorded.read_text().splitlines() if line.strip()]
    claude = _fake_claude(tmp_path / "claude", events, marker)
    with pytest.raises(AgentFailed) as failed:
        request = AgentRequest(prompt="p", timeout_s=RUN_TIMEOUT_S)
        run_agent(claude, request, max_attempts=1, stall_timeout_s=1, kill_grace=1)
    proof = failed.value.proof
    assert (proof.failure_class, proof.reason) == (
        FailureClass.UPSTREAM,
        "stalled: no output for 1 s (a vendor request in flight)",
    )
    assert marked_left(marker) == []
