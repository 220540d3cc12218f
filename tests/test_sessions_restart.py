"""The resumed session survives a restart (issue #46): the vendor session an attempt was
refused in is kept in the ledger (`Run.session_id`), so a NEW dispatcher process, started
after the one that met the usage limit ended (or was killed), resumes it with the adapter's
flag and the same id. On SQLite and on PostgreSQL; `run_attempt` in a new process likewise.

Real processes: `execkit dispatch` twice, and a stand-in `claude` on PATH that replays the
recorded usage limit (claude-code 2.1.332, session 7fe4...) on a fresh start and the
recorded success on `--resume <that session>`, logging each call with its parent's pid."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from _support import REPO, run_execkit, write_board
from test_remote import Remote, remote  # noqa: F401 - the fixture

from execkit._backoff import Backoff
from execkit._classify import FailureClass
from execkit.ledger import SESSIONS_CAPABILITY, open_ledger

SESSION = "7fe4ecce-cba9-4182-98c6-ce5bbc5450ae"  # the recorded usage limit's session
RECORDED = REPO / "fixtures" / "recorded" / "claude"

_FAKE_CLAUDE = f"""#!{sys.executable}
import json, os, pathlib, sys
argv = sys.argv[1:]
with open(os.environ["FAKE_CALLS"], "a") as f:
    f.write(json.dumps({{"argv": argv, "ppid": os.getppid()}}) + "\\n")
rec = pathlib.Path({str(RECORDED)!r})
if "--resume" in argv and argv[argv.index("--resume") + 1] == {SESSION!r}:
    sys.stdout.write((rec / "success" / "stdout").read_text())
    sys.exit(0)
sys.stdout.write((rec / "usage_limit" / "stdout").read_text())
sys.exit(1)
"""


@pytest.fixture
def fake_claude(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "claude").write_text(_FAKE_CLAUDE)
    (bin_dir / "claude").chmod(0o755)
    calls = tmp_path / "calls.jsonl"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_CALLS", str(calls))
    for name in ("ANTHROPIC_API_KEY", "CLAUDE_CODE_OAUTH_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return calls


def _calls(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def _board(path: Path, backoff_s: float) -> Path:
    # The retry's backoff is the board's: an hour while the first dispatcher lives (it
    # never runs the second attempt itself), a few milliseconds for the second one.
    return write_board(
        path,
        [{"id": "R-1", "title": "r", "state": "todo", "prompt": "fix it", "adapter": "claude"}],
        dispatch={"base_backoff_s": backoff_s, "max_retry_backoff_s": backoff_s},
    )


def _runs(target: str) -> list[Any]:
    with open_ledger(target) as ledger:
        tasks = ledger.list_tasks()
        return ledger.runs(tasks[0].id) if tasks else []


def _first_dispatcher(board: Path, target: str, ending: str) -> int:
    """Run the first dispatcher until its one attempt is recorded, then end it: `--once`
    exits by itself; `killed` is SIGKILLed once the ledger holds the attempt's result.
    Returns its pid."""
    args = [sys.executable, "-m", "execkit", "dispatch", "--board", str(board), "--db", target]
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    if ending == "once":
        done = subprocess.run([*args, "--once"], env=env, capture_output=True, text=True,
                              timeout=120)  # fmt: skip
        assert done.returncode == 0, done.stderr
        return int(_calls(Path(os.environ["FAKE_CALLS"]))[0]["ppid"])
    first = subprocess.Popen(
        [*args, "--interval", "3600"], env=env, stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL, start_new_session=True,
    )  # fmt: skip
    try:
        for _ in range(1200):  # bounded: the attempt's result, polled every 50 ms
            runs = _runs(target)
            if runs and runs[0].status != "running":
                break
            assert first.poll() is None, "the first dispatcher ended by itself"
            time.sleep(0.05)
        else:
            raise AssertionError("the first attempt was never recorded")
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=60)
    return first.pid


@pytest.mark.parametrize("ending", ["once", "killed"])
def test_a_new_dispatcher_process_resumes_the_session_a_usage_limit_stopped(
    ledger_target: str, fake_claude: Path, tmp_path: Path, ending: str
) -> None:
    board = _board(tmp_path / "board.json", 3600)
    first_pid = _first_dispatcher(board, ledger_target, ending)
    (refused,) = _runs(ledger_target)
    assert refused.failure_class is FailureClass.UPSTREAM
    assert refused.session_id == SESSION and refused.resumed_session is None
    # A new process, knowing nothing but the ledger and the board.
    _board(board, 0.01)
    second = run_execkit("dispatch", "--board", str(board), "--db", ledger_target, "--until-idle")
    assert second.returncode == 0, (second.stdout, second.stderr)
    assert f"resumed session {SESSION}" in second.stdout
    fresh, resumed = _calls(fake_claude)
    assert "--resume" not in fresh["argv"]
    assert resumed["argv"][resumed["argv"].index("--resume") + 1] == SESSION
    assert fresh["ppid"] == first_pid != resumed["ppid"]
    runs = _runs(ledger_target)
    assert [(r.attempt, r.status, r.resumed_session) for r in runs] == [
        (1, "failed", None),
        (2, "succeeded", SESSION),
    ]
    assert runs[0].owner_pid != runs[1].owner_pid
    assert json.loads(board.read_text())["issues"][0]["state"] == "done"


def test_run_attempt_in_a_new_process_resumes_the_session(
    ledger_target: str, fake_claude: Path
) -> None:
    script = (
        "import sys\n"
        "from adapters import ClaudeAdapter\n"
        "from execkit import AgentRequest\n"
        "from execkit._attempt import AttemptOptions, run_attempt\n"
        "from execkit._backoff import Backoff\n"
        "from execkit.ledger import open_ledger\n"
        "with open_ledger(sys.argv[1]) as ledger:\n"
        "    ledger.backoff = Backoff(base_s=0.001, max_s=0.001)\n"
        "    task = ledger.list_tasks()[0]\n"
        "    done = run_attempt(ledger, task.id, ClaudeAdapter(), AgentRequest(prompt='p'))\n"
        "    print(done.status, done.run_id)\n"
    )
    with open_ledger(ledger_target) as ledger:
        ledger.create_task("t", actor="me")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for _ in range(2):  # two processes, one attempt each
        time.sleep(0.01)  # the first one's backoff (1 ms) is over
        done = subprocess.run(
            [sys.executable, "-c", script, ledger_target], env=env, capture_output=True,
            text=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
    first, second = _calls(fake_claude)
    assert "--resume" not in first["argv"]
    assert second["argv"][second["argv"].index("--resume") + 1] == SESSION
    refused, resumed = _runs(ledger_target)
    assert (refused.failure_class, refused.session_id) == (FailureClass.UPSTREAM, SESSION)
    assert (resumed.status, resumed.resumed_session) == ("succeeded", SESSION)


@pytest.mark.parametrize(
    "remote", [frozenset(), frozenset({SESSIONS_CAPABILITY})], indirect=True, ids=["now", "older"]
)
def test_through_execkit_serve_and_against_an_older_one(
    remote: Remote,  # noqa: F811
    fake_claude: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # Two dispatcher processes on one server: the session goes through the server's finish
    # body. A server without `runs.sessions` is not sent it: the next attempt starts fresh.
    monkeypatch.setenv("EXECKIT_TOKEN", remote.token)
    older = SESSIONS_CAPABILITY not in remote.app.capabilities
    # The server decides the backoff: the board asks for the same one (`--once`: the first
    # process never runs a second attempt itself).
    remote.ledger.backoff = Backoff(base_s=0.01, max_s=0.01)
    board = _board(tmp_path / "board.json", 0.01)
    args = ("dispatch", "--board", str(board), "--remote", remote.url)
    first = run_execkit(*args, "--once")
    assert first.returncode == 0, first.stderr
    (refused,) = remote.ledger.runs(remote.ledger.list_tasks()[0].id)
    assert refused.session_id == (None if older else SESSION)
    for _ in range(5):  # bounded: the older server's fresh start meets the limit again
        second = run_execkit(*args, "--once")
        assert second.returncode == 0, second.stderr
        if len(_calls(fake_claude)) >= 2:
            break
        time.sleep(0.05)
    calls = _calls(fake_claude)
    resumed = calls[1]["argv"]
    if older:
        assert "--resume" not in resumed
    else:
        assert resumed[resumed.index("--resume") + 1] == SESSION
        runs = remote.ledger.runs(refused.task_id)
        assert runs[1].resumed_session == SESSION and runs[1].status == "succeeded"
