"""`execkit dispatch` and `execkit status`."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from _support import REPO, run_execkit, table_columns, write_board

from execkit.cli import main
from execkit.cli._output import EXIT_CODES

BIN = REPO / "fixtures" / "bin"


@pytest.fixture
def board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("EXECKIT_FIXTURE_STATE", str(state))
    monkeypatch.setenv("EXECKIT_DB", str(tmp_path / "ledger.db"))
    issues: list[dict[str, object]] = [
        {"id": "OK", "title": "fine", "state": "todo", "argv": [f"{BIN}/fake-agent-ok"]},
        {"id": "ENV", "title": "gone", "state": "todo", "argv": ["acme-not-here"]},
        {"id": "BAD", "title": "wrong", "state": "todo", "argv": [f"{BIN}/fake-agent-wrong"]},
    ]
    return write_board(tmp_path / "board.json", issues, dispatch={"max_attempts": 5})


def states(path: Path) -> dict[str, str]:
    return {i["id"]: i["state"] for i in json.loads(path.read_text())["issues"]}


def test_dispatch_once_then_status(board: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["dispatch", "--board", str(board), "--adapter", "generic", "--once"]) == 0
    out = capsys.readouterr().out
    assert "OK  attempt 1/5  succeeded -> moved to done" in out
    assert "ENV  attempt 1/5  environment (uncharged)" in out
    assert "acme-not-here CLI not found on PATH" in out
    assert "BAD  attempt 1/5  work (charged)" in out and "retry in" in out
    assert states(board) == {"OK": "done", "ENV": "blocked", "BAD": "todo"}

    assert main(["status", "--board", str(board)]) == 0
    out = capsys.readouterr().out
    header = out.splitlines()[0].split("  ")
    assert [h.strip() for h in header if h.strip()] == [
        "ISSUE",
        "TASK",
        "BOARD",
        "LEDGER",
        "STARTED",
        "CHARGED",
        "UNCHARGED",
        "NEXT",
        "LAST CLASS",
        "REASON",
    ]
    rows = {row.pop("ISSUE"): row for row in table_columns(out)}
    # Each row names its task (issue #31): distinct ledger ids, one per issue.
    tasks = {issue: row.pop("TASK") for issue, row in rows.items()}
    assert all(re.fullmatch(r"t-\d+", task) for task in tasks.values())
    assert len(set(tasks.values())) == len(tasks)
    assert rows["OK"] == {
        "BOARD": "done",
        "LEDGER": "done",
        "STARTED": "1/5 cap",
        "CHARGED": "1/3",
        "UNCHARGED": "0/3",
        "NEXT": "-",
        "LAST CLASS": "succeeded",
        "REASON": "-",
    }
    env = rows["ENV"]
    assert [env[c] for c in ("BOARD", "LEDGER", "STARTED", "CHARGED", "NEXT", "LAST CLASS")] == [
        "blocked",
        "blocked (environment)",
        "1/5 cap",
        "0/3",
        "-",
        "environment",
    ]
    assert "acme-not-here CLI not found on PATH" in env["REASON"]
    bad = rows["BAD"]
    assert [bad[c] for c in ("BOARD", "LEDGER", "STARTED", "CHARGED", "LAST CLASS")] == [
        "todo",
        "backoff",
        "1/5 cap",
        "1/3",
        "work",
    ]
    assert re.fullmatch(r"in \d+s", bad["NEXT"])  # the next attempt, relative to now
    assert "check failed: expected 42, got 41" in bad["REASON"]

    # A second pass right away: BAD is in backoff, nothing runs; the one line says so and
    # when the next attempt is due (issue #31: "did it run?"), and no dispatch is printed.
    assert main(["dispatch", "--board", str(board), "--adapter", "generic", "--once"]) == 0
    out = capsys.readouterr().out
    assert re.fullmatch(
        r"nothing due, next at \d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\+00:00 \(in \d+s: BAD\)\n", out
    ), out


def test_status_json(board: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["dispatch", "--board", str(board), "--adapter", "generic", "--once", "--json"])
    events = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert {e["issue_id"]: e["kind"] for e in events} == {
        "OK": "dispatched",
        "ENV": "dispatched",
        "BAD": "dispatched",
    }
    assert main(["status", "--board", str(board), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    by_id = {row["issue_id"]: row for row in doc["issues"]}
    assert by_id["BAD"]["last_class"] == "work"
    assert by_id["BAD"]["charged_attempts"] == 1
    assert by_id["BAD"]["next_attempt_at"] > doc["now"]
    assert by_id["ENV"]["last_class"] == "environment"
    assert doc["config"]["max_attempts"] == 5
    # Without a board: the ledger's dispatched issues.
    assert main(["status", "--json"]) == 0
    ids = {row["issue_id"] for row in json.loads(capsys.readouterr().out)["issues"]}
    assert ids == {"OK", "ENV", "BAD"}


def test_flags_override_the_board_file(
    board: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    argv = ["dispatch", "--board", str(board), "--adapter", "generic", "--once"]
    assert main([*argv, "--max-attempts", "-1", "--failed-state", "none"]) == 0
    assert "attempt 1 " in capsys.readouterr().out  # no cap shown
    assert states(board)["ENV"] == "todo"  # failed_state none: never moved
    assert any("ENV" in m and "failed_state" in m for m in caplog.messages)


@pytest.mark.parametrize(
    ("extra", "code", "message"),
    [
        (["--max-attempts", "0"], 3, "max_attempts"),
        (["--failed-state", ""], 3, "failed_state"),
        (["--adapter", "nope"], 4, "unknown adapter"),
    ],
)
def test_bad_input_is_a_clear_error(
    board: Path, capsys: pytest.CaptureFixture[str], extra: list[str], code: int, message: str
) -> None:
    argv = ["dispatch", "--board", str(board), "--adapter", "generic", "--once", *extra]
    before = board.read_text()
    assert main(argv) == code
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert board.read_text() == before


def test_dispatch_keeps_the_board_file_as_its_author_wrote_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Issue 44, item 16: a pass re-indented the whole file and added a `ledger` key.
    monkeypatch.delenv("EXECKIT_DB", raising=False)
    board = tmp_path / "board.json"
    written = (
        '{"states": [{"name": "todo", "eligible": true}, {"name": "done", "terminal": true},\n'
        '            {"name": "blocked", "terminal": true}],\n'
        ' "team": "parsers",\n'
        ' "issues": [\n'
        f'   {{"id": "OK", "title": "fine", "state": "todo", "argv": ["{BIN}/fake-agent-ok"]}},\n'
        '   {"id": "ENV", "title": "gone", "state": "todo", "argv": ["acme-not-here"]}]}'
    )
    board.write_text(written, encoding="utf-8")
    db = tmp_path / "ledger.db"
    argv = ["dispatch", "--board", str(board), "--adapter", "generic", "--once", "--db", str(db)]
    assert main(argv) == 0
    capsys.readouterr()
    after = board.read_text(encoding="utf-8")
    assert after == written.replace(
        '"OK", "title": "fine", "state": "todo"', '"OK", "title": "fine", "state": "done"'
    ).replace(
        '"state": "todo", "argv": ["acme-not-here"]',
        '"state": "blocked", "given_up_from": "todo", "argv": ["acme-not-here"]',
    )
    # The board still knows its ledger: status needs no --db.
    assert main(["status", "--board", str(board)]) == 0
    rows = {row["ISSUE"]: row for row in table_columns(capsys.readouterr().out)}
    assert (rows["OK"]["LEDGER"], rows["ENV"]["BOARD"]) == ("done", "blocked")
    assert json.loads((tmp_path / "board.json.ledger").read_text())["location"] == str(db)


def test_status_before_any_dispatch_refuses_and_creates_no_ledger(
    board: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # A table of blanks would say "nothing ran" about issues no ledger has seen.
    assert main(["status", "--board", str(board)]) == 4  # the ledger $EXECKIT_DB names
    assert "no ledger database" in capsys.readouterr().err
    monkeypatch.delenv("EXECKIT_DB")
    assert main(["status", "--board", str(board)]) == 4  # none named, none remembered
    assert "has not been dispatched yet" in capsys.readouterr().err
    assert not (tmp_path / "ledger.db").exists()
    monkeypatch.setenv("EXECKIT_DB", str(tmp_path / "ledger.db"))
    # Without a board there is nothing to show: the missing ledger is named.
    assert main(["status"]) == 4
    assert "no ledger database" in capsys.readouterr().err
    assert not (tmp_path / "ledger.db").exists()


def test_missing_board_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["status", "--board", str(tmp_path / "nope.json"), "--db", str(tmp_path / "l.db")]
    assert main(argv) == 4
    assert "no board file" in capsys.readouterr().err


def test_once_and_interval_are_exclusive(board: Path, capsys: pytest.CaptureFixture[str]) -> None:
    argv = ["dispatch", "--board", str(board), "--adapter", "generic", "--once", "--interval", "1"]
    assert main(argv) == 3
    assert "not allowed with argument --once" in capsys.readouterr().err


def test_dispatch_cli_in_a_real_process(board: Path, tmp_path: Path) -> None:
    argv = ["dispatch", "--board", str(board), "--adapter", "generic", "--once"]
    result = run_execkit(*argv, "--db", str(tmp_path / "other.db"))
    assert result.returncode == 0, result.stderr
    assert "OK  attempt 1/5  succeeded" in result.stdout


def test_the_give_up_warning_reaches_stderr(board: Path, tmp_path: Path) -> None:
    argv = ["dispatch", "--board", str(board), "--adapter", "generic", "--once"]
    result = run_execkit(*argv, "--failed-state", "none")
    assert result.returncode == 0, result.stderr
    assert "execkit: WARNING: issue ENV was not moved" in result.stderr
    assert "failed_state" in result.stderr


def test_text_output_escapes_control_characters_from_the_board_and_the_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EXECKIT_DB", str(tmp_path / "ledger.db"))
    hostile = r"printf 'evil \033[2J\rgone\033]0;title\007' >&2; exit 1"
    issues: list[dict[str, object]] = [
        {"id": "X\x1b[31m", "title": "t\x1b[2J", "state": "todo", "argv": ["sh", "-c", hostile]},
    ]
    board = write_board(tmp_path / "board.json", issues)
    assert main(["dispatch", "--board", str(board), "--adapter", "generic", "--once"]) == 0
    dispatched = capsys.readouterr().out
    assert main(["status", "--board", str(board)]) == 0
    table = capsys.readouterr().out
    for out in (dispatched, table):
        assert "X\\x1b[31m" in out
        assert "gone\\x1b]0;title\\x07" in out  # the failure's last line, escaped
        assert not {"\x1b", "\r", "\x07"} & set(out)
    assert len(dispatched.splitlines()) == 1
    rows = table_columns(table)
    assert [row["ISSUE"] for row in rows] == ["X\\x1b[31m"]
    # JSON keeps the values as they are.
    assert main(["status", "--board", str(board), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["issues"][0]["issue_id"] == "X\x1b[31m"


def _dispatcher_process(board: Path, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "execkit", "dispatch", "--board", str(board), *extra],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def _wait_for_descendant(pid: int, name: str) -> psutil.Process:
    for _ in range(6000):
        for child in psutil.Process(pid).children(recursive=True):
            try:
                if child.name() == name:
                    return child
            except psutil.NoSuchProcess:
                continue
        time.sleep(0.01)
    raise AssertionError(f"no {name} under {pid}")


@pytest.mark.parametrize(("signum", "drain"), [(signal.SIGTERM, "0"), (signal.SIGINT, "0")])
def test_a_stopped_dispatcher_leaves_no_agent_and_no_running_run(
    tmp_path: Path, signum: int, drain: str
) -> None:
    # The agent sleeps ten minutes; the dispatcher is told to stop with no drain time. Its
    # agent's tree must go with it, the run must be recorded (not left `running` until its
    # lease ends), and the card must stay where it was.
    db = tmp_path / "ledger.db"
    board = write_board(
        tmp_path / "board.json",
        [{"id": "LONG", "title": "t", "state": "todo", "argv": ["sleep", "600"]}],
    )
    proc = _dispatcher_process(board, "--once", "--db", str(db), "--drain-timeout", drain)
    try:
        agent = _wait_for_descendant(proc.pid, "sleep")
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signum, err
    assert "stopping" in err and "Traceback" not in err
    assert not agent.is_running() or agent.status() == psutil.STATUS_ZOMBIE
    assert states(board) == {"LONG": "todo"}
    listed = run_execkit("task", "runs", "t-1", "--db", str(db), "--json")
    (run,) = json.loads(listed.stdout)["runs"]
    assert (run["status"], run["reason"]) == ("abandoned", "dispatcher stopped")


# The dispatcher's command in this process, and a thread that, once the agent runs, sends
# SIGTERM to itself: the signal's C handler runs in that thread, not the main one.
_SIGNAL_TO_ANOTHER_THREAD = """
import signal, sys, threading, time
import psutil
from execkit.cli import main
from execkit.cli._output import EXIT_CODES

def stop_from_this_thread():
    for _ in range(6000):  # bounded: a minute of 10 ms polls
        if any(c.name() == "sleep" for c in psutil.Process().children(recursive=True)):
            break
        time.sleep(0.01)
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

threading.Thread(target=stop_from_this_thread, daemon=True).start()
sys.exit(main(sys.argv[1:]))
"""


def test_a_stop_signal_delivered_to_another_thread_still_stops_the_dispatcher(
    tmp_path: Path,
) -> None:
    # The kernel gives a process's SIGTERM to any of its threads (a slot's, a lease
    # renewer's); Python runs the handler only when the main thread runs again. A main
    # thread waiting for a slot without a bound slept through it until the agent ended.
    db = tmp_path / "ledger.db"
    board = write_board(
        tmp_path / "board.json",
        [{"id": "LONG", "title": "t", "state": "todo", "argv": ["sleep", "600"]}],
    )
    argv = ["dispatch", "--board", str(board), "--once", "--db", str(db), "--drain-timeout", "0"]
    proc = subprocess.Popen(
        [sys.executable, "-c", _SIGNAL_TO_ANOTHER_THREAD, *argv],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        _, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        err = "still running after 60 s"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "stopping" in err and "Traceback" not in err
    assert states(board) == {"LONG": "todo"}


def test_until_idle_runs_every_retry_then_says_whether_an_issue_ended_blocked(
    board: Path, tmp_path: Path
) -> None:
    # BAD is charged until its budget is spent; the backoffs are short so the loop runs
    # them out. ENV stops at once. Then nothing is ready or backing off: exit 8 (blocked).
    doc = json.loads(board.read_text())
    doc["dispatch"] = {"max_attempts": 3, "base_backoff_s": 0.05, "max_retry_backoff_s": 0.05}
    board.write_text(json.dumps(doc))
    done = run_execkit(
        "dispatch", "--board", str(board), "--until-idle", "--interval", "0.05",
        "--db", str(tmp_path / "ledger.db"),
    )  # fmt: skip
    assert done.returncode == 8, done.stderr
    assert states(board) == {"OK": "done", "ENV": "blocked", "BAD": "blocked"}
    assert "BAD  attempt 3/3" in done.stdout


def test_until_idle_exits_0_when_nothing_ended_blocked(tmp_path: Path) -> None:
    board = write_board(
        tmp_path / "board.json",
        [{"id": "OK", "title": "t", "state": "todo", "argv": ["true"]}],
    )
    done = run_execkit(
        "dispatch", "--board", str(board), "--until-idle", "--db", str(tmp_path / "l.db")
    )
    assert done.returncode == 0, done.stderr
    assert states(board) == {"OK": "done"}


@pytest.mark.parametrize("bad", ["0", "-2", "257", "many"])
def test_a_bad_concurrency_is_one_clear_error(
    board: Path, bad: str, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["dispatch", "--board", str(board), "--once", "--concurrency", bad]
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert "--concurrency" in err and "1 to 256" in err
    assert states(board) == {"OK": "todo", "ENV": "todo", "BAD": "todo"}  # nothing ran


def _missing_agent_board(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(ledger, agent, board): one issue in `doing` whose agent binary is not there yet,
    `blocked` the terminal state a give-up moves it to."""
    db, agent = tmp_path / "ledger.db", tmp_path / "acme-agent"
    board = write_board(
        tmp_path / "board.json",
        [{"id": "ENV", "title": "t", "state": "doing", "argv": [str(agent)]}],
        states=[
            {"name": "todo", "eligible": True},
            {"name": "doing", "eligible": True},
            {"name": "blocked", "terminal": True},
            {"name": "done", "terminal": True},
        ],
    )
    return db, agent, board


def _installed_retried_and_dispatched(
    agent: Path, db: Path, board: Path
) -> subprocess.CompletedProcess[str]:
    """The operator installs the missing agent and retries task t-1; a new dispatcher brings
    the given-up card back and finishes it (asserted): that dispatcher's run."""
    agent.write_text("#!/bin/sh\nexit 0\n")
    agent.chmod(0o700)
    retried = run_execkit("task", "retry", "t-1", "--db", str(db), "--reason", "installed")
    assert retried.returncode == 0, retried.stderr
    again = run_execkit("dispatch", "--board", str(board), "--until-idle", "--db", str(db))
    assert again.returncode == 0, again.stderr
    [issue] = json.loads(board.read_text())["issues"]
    assert issue["state"] == "done" and "given_up_from" not in issue
    return again


def test_a_give_up_whose_record_a_kill_lost_is_still_brought_back(tmp_path: Path) -> None:
    # A give-up moves the card, then records it in the ledger: a dispatcher killed between
    # the two leaves the board's `given_up_from` and no record. The operator's retry still
    # brings the card back (it stayed blocked: seen once in the suite under load).
    import sqlite3

    db, agent, board = _missing_agent_board(tmp_path)
    first = run_execkit("dispatch", "--board", str(board), "--until-idle", "--db", str(db))
    assert first.returncode == 8, first.stderr  # given up: blocked
    with sqlite3.connect(db) as conn:  # the record the kill lost
        assert conn.execute("UPDATE task_extras SET gave_up_at_attempt = NULL").rowcount == 1
    _installed_retried_and_dispatched(agent, db, board)


def test_a_restarted_dispatcher_brings_back_the_card_it_gave_up(tmp_path: Path) -> None:
    # The agent's binary is missing: the dispatcher gives the card up (from `doing` to
    # `blocked`), and the board file keeps where it came from. The dispatcher is killed
    # (SIGKILL: nothing of it survives but the board and the ledger); the operator installs
    # the binary and retries the task; a new dispatcher process moves the card back to
    # `doing`, where it runs and is done.
    db, agent, board = _missing_agent_board(tmp_path)
    proc = _dispatcher_process(board, "--interval", "0.05", "--db", str(db))
    try:
        for _ in range(6000):  # bounded: at most a minute of 10 ms polls
            if states(board)["ENV"] == "blocked" and proc.poll() is None:
                break
            time.sleep(0.01)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    [issue] = json.loads(board.read_text())["issues"]
    assert (issue["state"], issue["given_up_from"]) == ("blocked", "doing")
    again = _installed_retried_and_dispatched(agent, db, board)
    # Only a card back in an eligible column runs: it ran once more, forced, and was done.
    assert "ENV  attempt 2/10  succeeded -> moved to done" in again.stdout


def _wait_for_file(path: Path) -> None:
    for _ in range(12000):  # bounded: two minutes of 10 ms polls
        if path.exists():
            return
        time.sleep(0.01)
    raise AssertionError(f"{path} never appeared")


@pytest.mark.parametrize("json_output", [False, True])
def test_a_result_that_ends_during_the_drain_is_reported_once(
    tmp_path: Path, json_output: bool
) -> None:
    # The agent runs until the test lets it go, which it does only once the dispatcher
    # has said it is stopping: its result arrives during the drain. The ledger has one run;
    # the output must have one line (one JSON event) for it, not one from the event hook
    # and a second from the list `shutdown` returns.
    started, go = tmp_path / "started", tmp_path / "go"
    script = f"touch {started}; while [ ! -e {go} ]; do sleep 0.02; done; exit 0"
    board = write_board(
        tmp_path / "board.json",
        [{"id": "DRAINED", "title": "t", "state": "todo", "argv": ["sh", "-c", script]}],
    )
    extra = ["--json"] if json_output else []
    db = tmp_path / "ledger.db"
    proc = _dispatcher_process(board, "--once", "--db", str(db), "--drain-timeout", "120", *extra)
    try:
        _wait_for_file(started)
        proc.send_signal(signal.SIGTERM)
        assert proc.stderr is not None
        assert "stopping" in proc.stderr.readline()
        go.touch()
        out, err = proc.communicate(timeout=120)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 128 + signal.SIGTERM, err
    lines = [line for line in out.splitlines() if "DRAINED" in line]
    assert len(lines) == 1, out
    assert states(board) == {"DRAINED": "done"}
    listed = run_execkit("task", "runs", "t-1", "--db", str(db), "--json")
    assert [run["status"] for run in json.loads(listed.stdout)["runs"]] == ["succeeded"]


@pytest.mark.parametrize(
    ("limit", "status_cells", "listed", "shown"),
    [
        (
            None,
            ("1/10 cap", "1/3", "0/3"),
            "started 1, charged 1/3",
            "started 1, charged 1/3 (work budget), uncharged streak 0/3; 2 left",
        ),
        (
            5,
            ("1/5 limit", "1", "0/3"),
            "started 1/5 limit, charged 1",
            "started 1/5 (explicit limit), charged 1 (the explicit limit replaces the work "
            "budget), uncharged streak 0/3; 4 left",
        ),
    ],
)
def test_every_surface_names_a_tasks_counts_the_same_way(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    limit: int | None,
    status_cells: tuple[str, str, str],
    listed: str,
    shown: str,
) -> None:
    # One task, one charged failure: `status` showed ATTEMPT 1/10, `task list` attempts
    # 1/-, `task show` limit - ... remaining 2, three numbers naming three bounds unnamed.
    # Now each surface says attempts started against the bound that binds them (the
    # dispatch cap or the explicit limit, named), charged attempts against the work budget
    # (when no limit replaces it) and the uncharged streak against its ceiling.
    db = str(tmp_path / "ledger.db")
    board = write_board(
        tmp_path / "board.json",
        [{"id": "BAD", "title": "t", "state": "todo", "argv": [f"{BIN}/fake-agent-wrong"]}],
        dispatch={"max_attempts": 10},
    )
    assert main(["dispatch", "--board", str(board), "--once", "--db", db]) == 0
    if limit is not None:
        assert (
            main(["task", "set-attempt-limit", "t-1", str(limit), "--expected", "0", "--db", db])
            == 0
        )
    capsys.readouterr()
    assert main(["status", "--board", str(board), "--db", db]) == 0
    (row,) = table_columns(capsys.readouterr().out)
    assert (row["STARTED"], row["CHARGED"], row["UNCHARGED"]) == status_cells
    assert main(["task", "list", "--db", db]) == 0
    assert listed in capsys.readouterr().out
    assert main(["task", "show", "BAD", "--db", db]) == 0
    assert f"  {shown}\n" in capsys.readouterr().out


def test_until_idle_ends_when_only_a_person_can_let_the_rest_run(tmp_path: Path) -> None:
    # The first claude issue meets refused credentials (structured: a 401 envelope): the
    # lane stops, the issue is given up, the other two are held by the stopped lane. Nothing
    # more can run until an operator fixes the login and resumes the lane: `--until-idle`
    # ends (it ran on, printing "refused" lines, for as long as it was let), with the lane's
    # own exit code and one message naming the command; the attempt's line names the same
    # fix (it said "move the card back", which a resume does for it).
    envelope = REPO / "fixtures" / "claude" / "auth_failure.json"
    agent = ["sh", "-c", f"cat {envelope}; exit 1"]
    board = write_board(
        tmp_path / "board.json",
        [
            {"id": f"C-{n}", "title": "t", "state": "todo", "adapter": "claude", "argv": agent}
            for n in range(3)
        ],
        dispatch={"max_concurrent_agents": 1},
    )
    done = run_execkit(
        "dispatch", "--board", str(board), "--until-idle", "--interval", "0.05",
        "--db", str(tmp_path / "ledger.db"),
    )  # fmt: skip
    assert done.returncode == EXIT_CODES["lane_stopped"] == 17, done.stderr
    assert states(board) == {"C-0": "blocked", "C-1": "todo", "C-2": "todo"}
    (message,) = [line for line in done.stderr.splitlines() if "a person acts" in line]
    lane = re.search(r"lane (claude/\S+) is stopped", message)
    assert lane is not None and f"`execkit lane resume {lane.group(1)}`" in message
    (attempt,) = [line for line in done.stdout.splitlines() if line.startswith("C-0")]
    assert f"fix it, then `execkit lane resume {lane.group(1)}`" in attempt
    assert "move the card back" not in attempt
    assert done.stdout.count("waiting") == 1  # the lane's wait, said once


def test_until_idle_with_nothing_due_says_so_in_one_line(tmp_path: Path) -> None:
    board = write_board(
        tmp_path / "board.json", [{"id": "D", "title": "t", "state": "done", "argv": ["true"]}]
    )
    done = run_execkit(
        "dispatch", "--board", str(board), "--until-idle", "--db", str(tmp_path / "l.db")
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "nothing due: no issue is eligible or backing off\n"


def test_a_bad_price_file_stops_dispatch_before_anything_runs(
    board: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    prices = tmp_path / "prices.json"
    prices.write_text('{"models": {"m": {"input": -1}}}')
    monkeypatch.setenv("EXECKIT_PRICES", str(prices))
    assert main(["dispatch", "--board", str(board), "--adapter", "generic", "--once"]) == 3
    err = capsys.readouterr().err
    assert "EXECKIT_PRICES" in err and "Traceback" not in err
    assert not (tmp_path / "ledger.db").exists()
    assert states(board) == {"OK": "todo", "ENV": "todo", "BAD": "todo"}


def test_a_bad_price_file_stops_run_adapter_before_the_agent_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("EXECKIT_PRICES", str(tmp_path / "missing.json"))
    marker = tmp_path / "ran"
    argv = ["run", "--adapter", "generic", "--", "sh", "-c", f"touch {marker}"]
    assert main(argv) == 3
    assert "EXECKIT_PRICES" in capsys.readouterr().err
    assert not marker.exists()
