"""The edges a hostile run found (issue #30, "The edges"), each held by a test.

Real processes, real files, a real server on loopback. Nothing here asserts a duration:
a call that must not hang runs in a process with a bounded wait.
"""

from __future__ import annotations

import http.client
import json
import os
import signal
import sqlite3
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
from _support import REPO, write_board

from execkit.cli import main
from execkit.cli._output import EXIT_CODES
from execkit.ledger import open_ledger
from execkit.server import LedgerApp, ServerThread, TokenFile, add_token

_BOUND_S = 60  # a backstop for a call that must not hang, never a measured figure


def _execkit(*args: str | bytes, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    """`python -m execkit ARGS` in a real process, with a bounded wait."""
    return subprocess.run(
        [sys.executable, "-m", "execkit", *args],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=_BOUND_S,
        cwd=cwd,
    )


def _error(done: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(done.stderr)["error"]
    return doc


# ------------------------------------------------------------- files that are not files


def test_a_fifo_as_a_board_file_is_refused_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "board.json"
    os.mkfifo(fifo)
    db = str(tmp_path / "ledger.db")
    for argv in (
        ["status", "--board", str(fifo), "--db", db, "--json"],
        ["dispatch", "--board", str(fifo), "--db", db, "--adapter", "generic", "--once", "--json"],
    ):
        done = _execkit(*argv)
        assert done.returncode == EXIT_CODES["invalid"], done.stderr
        assert "not a regular file" in _error(done)["message"]


def test_a_fifo_as_the_board_lock_file_is_refused_not_waited_on(tmp_path: Path) -> None:
    board = write_board(tmp_path / "board.json", [{"id": "A", "title": "a", "state": "todo"}])
    os.mkfifo(tmp_path / "board.json.lock")
    argv = ["dispatch", "--board", str(board), "--db", str(tmp_path / "l.db"), "--once"]
    done = _execkit(*argv, "--adapter", "generic", "--json")
    assert done.returncode == EXIT_CODES["storage"], done.stderr
    assert "cannot write board file" in _error(done)["message"]


@pytest.mark.parametrize("kind", ["fifo", "random bytes", "foreign sqlite", "empty"])
def test_db_check_on_a_file_that_is_not_a_ledger_is_storage(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "ledger.db"
    if kind == "fifo":
        os.mkfifo(path, 0o600)
    elif kind == "random bytes":
        path.write_bytes(os.urandom(4096))
    elif kind == "foreign sqlite":
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE notes (body TEXT)")
        conn.commit()
        conn.close()
    else:
        path.touch()
    for command in (["db", "check"], ["task", "list"], ["task", "create", "t"]):
        done = _execkit(*command, "--db", str(path), "--json")
        assert done.returncode == EXIT_CODES["storage"], (command, done.stdout, done.stderr)


# ------------------------------------------------------------------- text that is not text


def test_task_create_with_an_argument_that_is_not_utf8_is_invalid(tmp_path: Path) -> None:
    db = str(tmp_path / "ledger.db")
    for argv in (
        [b"task", b"create", b"ab\xe4cd"],
        [b"task", b"create", b"ok", b"--on-behalf-of", b"ab\xe4cd"],
        [b"task", b"show", b"ab\xe4cd"],
        [b"run", b"start", b"ab\xe4cd"],
    ):
        done = _execkit(*argv, "--db", db, "--json")
        assert done.returncode == EXIT_CODES["invalid"], (argv, done.stderr)
        assert _error(done)["code"] == "invalid"


# ------------------------------------------------------------ a ledger missing a table


def test_a_ledger_missing_its_runs_table_takes_no_write(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    with open_ledger(db) as ledger:
        ledger.create_task("first", actor="a")
    conn = sqlite3.connect(db)
    conn.execute("DROP TABLE runs")
    conn.commit()
    conn.close()
    done = _execkit("task", "create", "second", "--db", str(db), "--json")
    assert done.returncode == EXIT_CODES["storage"], done.stderr
    assert "runs" in _error(done)["message"]
    conn = sqlite3.connect(db)
    try:
        assert conn.execute("SELECT title FROM tasks").fetchall() == [("first",)]
        assert conn.execute("SELECT COUNT(*) FROM audit").fetchone() == (1,)
    finally:
        conn.close()
    check = _execkit("db", "check", "--db", str(db), "--json")
    assert check.returncode == EXIT_CODES["storage"]
    assert "storage: table runs is missing" in json.loads(check.stdout)["problems"]


# --------------------------------------------------------------- loose permissions (ssh)


def _made(tmp_path: Path) -> Path:
    folder = tmp_path / "ledgers"
    folder.mkdir(mode=0o700)
    db = folder / "ledger.db"
    with open_ledger(db) as ledger:
        ledger.create_task("t", actor="a")
    return db


def test_a_world_writable_ledger_file_is_refused(tmp_path: Path) -> None:
    db = _made(tmp_path)
    os.chmod(db, 0o606)
    for command in (["task", "list"], ["task", "create", "u"], ["db", "check"]):
        done = _execkit(*command, "--db", str(db), "--json")
        assert done.returncode == EXIT_CODES["storage"], (command, done.stderr)
    assert (
        "writable by other users"
        in _error(_execkit("task", "list", "--db", str(db), "--json"))["message"]
    )
    os.chmod(db, 0o600)
    assert _execkit("task", "list", "--db", str(db), "--json").returncode == 0


def test_a_world_writable_folder_is_refused_unless_sticky(tmp_path: Path) -> None:
    db = _made(tmp_path)
    os.chmod(db.parent, 0o777)
    done = _execkit("task", "list", "--db", str(db), "--json")
    assert done.returncode == EXIT_CODES["storage"]
    assert "folder" in _error(done)["message"]
    # Sticky (as /tmp is): others cannot replace or remove the file they do not own.
    os.chmod(db.parent, 0o777 | stat.S_ISVTX)
    assert _execkit("task", "list", "--db", str(db), "--json").returncode == 0


@pytest.mark.parametrize("plant", ["world-writable", "fifo", "symlink"])
def test_a_planted_sidecar_is_refused(tmp_path: Path, plant: str) -> None:
    db = _made(tmp_path)
    wal = db.with_name(db.name + "-wal")
    if wal.exists():
        wal.unlink()
    if plant == "world-writable":
        wal.touch()
        os.chmod(wal, 0o666)
    elif plant == "fifo":
        os.mkfifo(wal)
    else:
        wal.symlink_to(tmp_path / "elsewhere")
    done = _execkit("task", "list", "--db", str(db), "--json")
    assert done.returncode == EXIT_CODES["storage"], done.stderr
    assert "planted" in _error(done)["message"]


def test_db_check_reports_a_grant_the_audit_does_not_hold(tmp_path: Path) -> None:
    db = _made(tmp_path)
    with open_ledger(db) as ledger:
        owner = ledger._store.owner()
        assert owner is not None
        ledger.grant_role("alice", "agent.operate", actor=owner)
    assert _execkit("db", "check", "--db", str(db)).returncode == 0
    # Another user with write access inserts a grant for themselves with sqlite3.
    conn = sqlite3.connect(db)
    conn.execute(
        "INSERT INTO role_grants (principal, role, granted_by, granted_at) "
        "VALUES ('mallory', 'ledger.admin', 'root', 1.0)"
    )
    conn.commit()
    conn.close()
    done = _execkit("db", "check", "--db", str(db), "--json")
    assert done.returncode == EXIT_CODES["invalid_history"], done.stderr
    (problem,) = json.loads(done.stdout)["problems"]
    assert problem.startswith("grant: mallory holds ledger.admin") and "audit" in problem


# -------------------------------------------------------------- the server's HTTP edges


@pytest.fixture
def server(tmp_path: Path) -> Iterator[tuple[str, int, str]]:
    ledger = open_ledger(tmp_path / "ledger.db")
    tokens = tmp_path / "tokens.json"
    token = add_token(tokens, "op", ["agent.operate", "ledger.admin"])
    app = LedgerApp(ledger, TokenFile(tokens))
    with ServerThread(app) as running:
        host, _, port = running.url.removeprefix("http://").partition(":")
        yield host, int(port), token
    app.close()
    ledger.close()


def _ask(
    server: tuple[str, int, str],
    method: str,
    path: str,
    body: bytes | None = None,
    content_type: str | None = "application/json",
) -> tuple[int, bytes]:
    host, port, token = server
    conn = http.client.HTTPConnection(host, port, timeout=_BOUND_S)
    headers = {"Authorization": f"Bearer {token}"}
    if body is not None and content_type is not None:
        headers["Content-Type"] = content_type
    try:
        conn.request(method, path, body=body, headers=headers)
        answer = conn.getresponse()
        return answer.status, answer.read()
    finally:
        conn.close()


def test_a_trailing_slash_is_404_not_a_redirect(server: tuple[str, int, str]) -> None:
    assert _ask(server, "GET", "/v1/tasks")[0] == 200
    status, body = _ask(server, "GET", "/v1/tasks/")
    assert status == 404 and json.loads(body)["error"]["code"] == "not_found"


def test_head_answers_as_get_without_a_body(server: tuple[str, int, str]) -> None:
    # Issue 44: HEAD answers on every GET route (it was 405 on the API's); POST routes
    # still refuse it.
    for path in ("/v1/tasks", "/v1/capabilities", "/openapi.json"):
        assert _ask(server, "HEAD", path) == (200, b""), path
    assert _ask(server, "HEAD", "/v1/grants/revoke")[0] == 405


def test_a_negative_cap_is_refused_in_a_body_and_a_query(server: tuple[str, int, str]) -> None:
    status, body = _ask(server, "POST", "/v1/tasks", b'{"title": "t"}')
    assert status == 201
    task = json.loads(body)["id"]
    assert _ask(server, "GET", f"/v1/tasks/{task}?cap=-1")[0] == 400
    assert _ask(server, "POST", f"/v1/tasks/{task}/runs", b'{"cap": -1}')[0] == 400
    assert _ask(server, "GET", f"/v1/tasks/{task}/runs")[1] == (
        json.dumps({"runs": [], "task_id": task}, sort_keys=True).encode()
    )
    assert _ask(server, "GET", f"/v1/tasks/{task}?cap=3")[0] == 200


def test_a_body_that_is_not_json_by_its_content_type_is_415(server: tuple[str, int, str]) -> None:
    for kind in ("text/plain", "application/x-www-form-urlencoded", None):
        status, body = _ask(server, "POST", "/v1/tasks", b'{"title": "t"}', content_type=kind)
        assert status == 415, kind
        assert json.loads(body)["error"]["code"] == "invalid"
    assert _ask(server, "GET", "/v1/tasks")[1] == b'{"tasks": []}'
    ok = _ask(server, "POST", "/v1/tasks", b'{"title": "t"}', "application/json; charset=utf-8")
    assert ok[0] == 201


def test_duplicate_json_members_are_refused(server: tuple[str, int, str]) -> None:
    status, body = _ask(server, "POST", "/v1/tasks", b'{"title": "a", "title": "b"}')
    assert status == 400 and "given twice" in json.loads(body)["error"]["message"]
    assert _ask(server, "GET", "/v1/tasks")[1] == b'{"tasks": []}'


def test_an_encoded_slash_in_a_path_is_not_a_slash(server: tuple[str, int, str]) -> None:
    status, body = _ask(server, "POST", "/v1/tasks", b'{"title": "t"}')
    task = json.loads(body)["id"]
    assert _ask(server, "GET", f"/v1/tasks/{task}/runs")[0] == 200
    for path in (f"/v1/tasks/{task}%2Fruns", f"/v1/tasks/{task}%2fruns", "/v1/tasks%2F"):
        status, body = _ask(server, "GET", path)
        assert status == 404, path
        assert json.loads(body)["error"]["code"] == "not_found"


# ------------------------------------------------- execkit dispatch on SIGTERM, for real


def _wait_for(predicate: Any, what: str) -> None:
    deadline = time.monotonic() + _BOUND_S
    while not predicate():
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.05)


@pytest.mark.parametrize("signals", [1, 2], ids=["sigterm-drains-then-stops", "twice-at-once"])
def test_dispatch_on_sigterm_leaves_nothing_it_started_alive(tmp_path: Path, signals: int) -> None:
    pids = tmp_path / "pids"
    # The agent: a shell that starts a grandchild and waits; both write their pids.
    script = f"echo $$ >> {pids}; sleep 300 & echo $! >> {pids}; wait"
    issues: list[dict[str, object]] = [
        {"id": "LONG", "title": "long", "state": "todo", "argv": ["sh", "-c", script]}
    ]
    board = write_board(tmp_path / "board.json", issues)
    db = tmp_path / "ledger.db"
    argv = [sys.executable, "-m", "execkit", "dispatch", "--board", str(board), "--db", str(db)]
    argv += ["--adapter", "generic", "--drain-timeout", "1"]
    process = subprocess.Popen(
        argv,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        _wait_for(lambda: pids.exists() and len(pids.read_text().split()) == 2, "the agent")
        started = [int(pid) for pid in pids.read_text().split()]
        assert all(psutil.pid_exists(pid) for pid in started)
        for _ in range(signals):
            process.send_signal(signal.SIGTERM)
        process.wait(timeout=_BOUND_S)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert process.returncode is not None

    def gone(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    _wait_for(lambda: all(gone(pid) for pid in started), "the agent's tree to be gone")
    with open_ledger(db) as ledger:
        (task,) = ledger.list_tasks()
        (run,) = ledger.runs(task.id)
    assert run.status != "running", run


# ------------------------------------------------------------- a very large board's status


def test_status_parses_a_large_board_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The 200,000-issue board of the issue took 49 s: status read and checked the file six
    # times. Bounded by counts here (benchmarks/bench_status.py has the times): one parse
    # of an unchanged file per command, and a changed file parsed again.
    from execkit.dispatch._board import JsonFileBoard

    issues = [{"id": f"I{k}", "title": f"i{k}", "state": "todo"} for k in range(2000)]
    board = write_board(tmp_path / "board.json", issues)
    db = tmp_path / "ledger.db"
    with open_ledger(db) as ledger:
        ledger.create_task("board:I0", idempotency_key="board:I0", actor="a")
    parsed: list[int] = []
    original = JsonFileBoard._parse

    def counting(self: JsonFileBoard, text: str) -> Any:
        parsed.append(len(text))
        return original(self, text)

    monkeypatch.setattr(JsonFileBoard, "_parse", counting)
    assert main(["status", "--board", str(board), "--db", str(db), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["issues"]
    assert len(rows) == 2000 and len(parsed) == 1
    opened = JsonFileBoard(board)
    assert len(opened.list_issues()) == 2000 and opened.states and opened.list_candidates()
    assert len(parsed) == 2  # one more board object, one more parse; its questions none
    assert opened.move("I1", "done")
    assert opened.list_issues()[1].state == "done"  # the moved file is read again
    assert len(parsed) == 4  # the move's own fresh read, then the new version once
