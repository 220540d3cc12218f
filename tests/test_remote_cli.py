"""`execkit dispatch`, `execkit status` and limit-setting commands through `--remote`, and
the client refusing an older server (one that does not advertise attempt limits)."""

from __future__ import annotations

import json
import logging
import os
import pwd
import re
from collections.abc import Iterator
from pathlib import Path

import attrs
import pytest
from _support import REPO, table_columns, write_board

from execkit._classify import FailureClass
from execkit.cli import main
from execkit.cli._output import EXIT_CODES
from execkit.dispatch import JsonFileBoard
from execkit.ledger import CAPABILITIES, SqliteLedger, open_ledger
from execkit.remote import HttpAnswer, HttpRequest, HTTPTransport
from execkit.server import LedgerApp, ServerThread, TokenFile, add_token

BIN = REPO / "fixtures" / "bin"
ME = pwd.getpwuid(os.geteuid()).pw_name


@attrs.frozen
class Served:
    url: str
    ledger: SqliteLedger


def _serve(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, without: frozenset[str] = frozenset()
) -> Iterator[Served]:
    where = tmp_path / "server"
    where.mkdir()
    ledger = open_ledger(where / "ledger.db")
    tokens = where / "tokens.json"
    monkeypatch.setenv("EXECKIT_TOKEN", add_token(tokens, ME, ["agent.operate", "ledger.admin"]))
    monkeypatch.delenv("EXECKIT_DB", raising=False)
    monkeypatch.delenv("EXECKIT_REMOTE", raising=False)
    # An in-process `execkit serve` run by an earlier test leaves the access log writing to
    # whatever stderr is: this server's lines would mix into the CLI's captured stderr.
    monkeypatch.setattr(logging.getLogger("execkit.server.access"), "handlers", [])
    app = LedgerApp(ledger, TokenFile(tokens), without=without)
    with ServerThread(app) as running:
        yield Served(running.url, ledger)
    app.close()
    ledger.close()


@pytest.fixture
def served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    yield from _serve(tmp_path, monkeypatch)


@pytest.fixture
def older(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Served]:
    yield from _serve(tmp_path, monkeypatch, without=frozenset({"tasks.attempt_limits"}))


@pytest.fixture
def board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("EXECKIT_FIXTURE_STATE", str(state))
    issues: list[dict[str, object]] = [
        {"id": "OK", "title": "fine", "state": "todo", "argv": [f"{BIN}/fake-agent-ok"]},
        {"id": "BAD", "title": "wrong", "state": "todo", "argv": [f"{BIN}/fake-agent-wrong"]},
    ]
    return write_board(tmp_path / "board.json", issues, dispatch={"max_attempts": 5})


def test_dispatch_and_status_through_the_remote(
    served: Served, board: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["dispatch", "--board", str(board), "--adapter", "generic", "--once"]
    assert main([*argv, "--remote", served.url]) == 0
    out = capsys.readouterr().out
    assert "OK  attempt 1/5  succeeded -> moved to done" in out
    assert "BAD  attempt 1/5  work (charged)" in out and "retry in" in out
    tasks = {t.title: t for t in served.ledger.list_tasks()}
    assert tasks["board:OK"].status == "done"
    # The board remembers the server beside itself (FILE.ledger), its own text untouched.
    assert "ledger" not in json.loads(board.read_text())
    assert JsonFileBoard(board).ledger_binding() == (served.ledger.ledger_id(), served.url)
    # The board remembers the server: status finds it without --remote.
    assert main(["status", "--board", str(board)]) == 0
    rows = {row.pop("ISSUE"): row for row in table_columns(capsys.readouterr().out)}
    assert (rows["OK"]["LEDGER"], rows["OK"]["STARTED"]) == ("done", "1/5 cap")
    assert (rows["BAD"]["LEDGER"], rows["BAD"]["LAST CLASS"]) == ("backoff", "work")
    assert re.fullmatch(r"in \d+s", rows["BAD"]["NEXT"])
    assert main(["status", "--remote", served.url, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert {row["issue_id"] for row in doc["issues"]} == {"OK", "BAD"}
    # A second pass at once: BAD backs off, nothing runs.
    assert main([*argv, "--remote", served.url]) == 0
    assert "attempt 2" not in capsys.readouterr().out


def test_a_board_asking_for_another_backoff_is_refused_through_the_remote(
    served: Served, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    issues: list[dict[str, object]] = [
        {"id": "X", "title": "x", "state": "todo", "argv": [f"{BIN}/fake-agent-ok"]}
    ]
    path = write_board(tmp_path / "b.json", issues, dispatch={"base_backoff_s": 1.0})
    argv = ["dispatch", "--board", str(path), "--adapter", "generic", "--once"]
    assert main([*argv, "--remote", served.url]) == EXIT_CODES["invalid"]
    assert "decides the backoff" in capsys.readouterr().err
    assert served.ledger.list_tasks() == []


def test_an_older_server_is_refused_before_a_limit_is_relied_on(
    older: Served, capsys: pytest.CaptureFixture[str]
) -> None:
    where = ["--remote", older.url, "--json"]
    assert main(["task", "create", "limited", "--max-attempts", "3", *where]) == 13
    err = json.loads(capsys.readouterr().err)["error"]
    assert err["code"] == "storage" and "tasks.attempt_limits" in err["message"]
    assert older.ledger.list_tasks() == []
    assert main(["task", "create", "free", *where]) == 0  # no limit: nothing to enforce
    capsys.readouterr()
    assert main(["task", "set-attempt-limit", "t-1", "3", "--expected", "0", *where]) == 13
    capsys.readouterr()
    assert older.ledger.get_task("t-1").max_attempts == 0
    assert main(["capabilities", *where]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert shown["capabilities"] == sorted(CAPABILITIES - {"tasks.attempt_limits"})


def test_status_through_the_remote_makes_as_many_requests_for_50_tasks_as_for_5(
    served: Served, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """`execkit status --remote` reads the tasks a page a request (`/v1/tasks-with-last`),
    never each task again with its history: 5 dispatched tasks or 50 (fewer than a page),
    the same requests. Counted at the client's transport, nothing timed."""
    paths: list[str] = []
    real = HTTPTransport.send

    def counted(self: HTTPTransport, request: HttpRequest) -> HttpAnswer:
        paths.append(request.target.split("?")[0])
        return real(self, request)

    monkeypatch.setattr(HTTPTransport, "send", counted)

    def dispatched(first: int, count: int) -> None:
        for n in range(first, first + count):
            task = served.ledger.create_task(f"board:I-{n}", actor=ME)
            if n % 2:
                run = served.ledger.start_run(task.id, request_key=f"k{n}", actor=ME)
                served.ledger.finish_run(run.id, "failed", failure_class=FailureClass.UPSTREAM)

    def status() -> list[str]:
        paths.clear()
        assert main(["status", "--remote", served.url, "--json"]) == 0
        return list(paths)

    dispatched(0, 5)
    few = status()
    assert len(json.loads(capsys.readouterr().out)["issues"]) == 5
    dispatched(5, 45)
    many = status()
    assert len(json.loads(capsys.readouterr().out)["issues"]) == 50
    assert many == few
    assert many.count("/v1/tasks-with-last") == 1
    assert not [path for path in many if path.startswith("/v1/tasks/")], many
