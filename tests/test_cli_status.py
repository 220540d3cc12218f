"""The terminal side of issue #31: `execkit status` names each task and, for a card blocked
on work, the last failure; `task show` takes a board issue id; `dispatch --once` says when
nothing was due; `status --watch` redraws in place on a terminal (bounded by a count of
redraws, never by time)."""

from __future__ import annotations

import json
import os
import pty
import subprocess
import sys
from pathlib import Path

import pytest
from _support import REPO, table_columns, write_board

from execkit._classify import FailureClass
from execkit.cli import main
from execkit.cli._output import EXIT_CODES
from execkit.cli._status import REDRAW
from execkit.ledger import open_ledger

BIN = REPO / "fixtures" / "bin"


@pytest.fixture
def board(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A board whose one issue succeeds, over a fresh ledger ($EXECKIT_DB)."""
    state = tmp_path / "state"
    state.mkdir()
    monkeypatch.setenv("EXECKIT_FIXTURE_STATE", str(state))
    monkeypatch.setenv("EXECKIT_DB", str(tmp_path / "ledger.db"))
    issues = [{"id": "OK", "title": "fine", "state": "todo", "argv": [f"{BIN}/fake-agent-ok"]}]
    return write_board(tmp_path / "board.json", issues)


@pytest.fixture
def blocked_on_work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A ledger ($EXECKIT_DB) where issue BAD spent its work budget (3 charged failures) and
    issue OK succeeded, as a dispatcher records them; returns BAD's task id."""
    monkeypatch.setenv("EXECKIT_DB", str(tmp_path / "ledger.db"))
    ledger = open_ledger(tmp_path / "ledger.db")
    try:
        bad = ledger.create_task("board:BAD", actor="dispatcher")
        for n in range(3):
            run = ledger.start_run(
                bad.id, request_key=f"b{n}", actor="dispatcher", ignore_backoff=True
            )
            ledger.finish_run(
                run.id, "failed", failure_class=FailureClass.WORK, reason=f"tests failed: {n}"
            )
        ok = ledger.create_task("board:OK", actor="dispatcher")
        ledger.finish_run(ledger.start_run(ok.id, request_key="o", actor="d").id, "succeeded")
        return bad.id
    finally:
        ledger.close()


def _dispatch_once(board: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["dispatch", "--board", str(board), "--adapter", "generic", "--once"]) == 0
    return capsys.readouterr().out


def test_status_names_the_task_and_the_last_failure_of_a_work_block(
    blocked_on_work: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["status"]) == 0
    rows = {row["ISSUE"]: row for row in table_columns(capsys.readouterr().out)}
    assert rows["BAD"]["TASK"] == blocked_on_work
    assert rows["BAD"]["LEDGER"] == "blocked (work)"
    assert rows["BAD"]["REASON"] == (
        "charged budget spent: 3 of 3 attempts; last failure: tests failed: 2"
    )
    assert rows["OK"]["REASON"] == "-"  # a success has no failure to show

    # `task show` takes the issue id the table shows, and finds the same task.
    assert main(["task", "show", "BAD", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert (shown["id"], shown["title"]) == (blocked_on_work, "board:BAD")
    assert main(["task", "show", blocked_on_work, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == blocked_on_work
    assert main(["task", "show", "NOPE"]) == EXIT_CODES["not_found"]
    assert capsys.readouterr().err == "execkit: not_found: no task 'NOPE'\n"


def test_dispatch_once_says_when_nothing_is_due(
    board: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = _dispatch_once(board, capsys)
    assert "nothing due" not in first and "OK  attempt 1/10  succeeded" in first
    # OK is done: nothing is eligible or backing off (tests/test_cli_dispatch.py has the
    # "next at" line of an issue backing off).
    assert _dispatch_once(board, capsys) == "nothing due: no issue is eligible or backing off\n"


def test_status_watch_off_a_terminal_prints_each_table_and_stops_at_the_count(
    board: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _dispatch_once(board, capsys)
    watch = ["status", "--board", str(board), "--watch", "--interval", "0.05"]
    code = main([*watch, "--count", "3"])
    assert code == 0
    out = capsys.readouterr().out
    assert out.count("ISSUE ") == 3 and REDRAW not in out
    invalid = EXIT_CODES["invalid"]
    assert main(["status", "--board", str(board), "--count", "2"]) == invalid  # no --watch
    assert main([*watch, "--json"]) == invalid


def test_status_watch_redraws_in_place_on_a_terminal(
    board: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _dispatch_once(board, capsys)
    argv = [sys.executable, "-m", "execkit", "status", "--board", str(board), "--watch"]
    leader, follower = pty.openpty()
    try:
        done = subprocess.run(
            [*argv, "--count", "4", "--interval", "0.05"],
            env={**os.environ, "PYTHONPATH": str(REPO)},
            stdin=subprocess.DEVNULL,
            stdout=follower,
            stderr=subprocess.PIPE,
            timeout=120,
        )
        os.close(follower)
        follower = -1
        drawn = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal's other end is closed: all read
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        if follower != -1:
            os.close(follower)
        os.close(leader)
    assert done.returncode == 0, done.stderr
    text = drawn.decode()
    assert text.count(REDRAW) == 4  # each redraw goes home and clears, in place
    assert text.count("ISSUE ") == 4 and "Ctrl-C to stop" in text


def test_the_status_table_is_masked_with_a_board_once_or_watched_and_not_without(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A board's issue ids are outside text: masked in the table printed once and in each
    `--watch` redraw (as in `--json`). Without a board every cell is the ledger's, masked
    when it was stored, and the table is printed as `task list` prints its lines, with no
    redactor run over it."""
    import execkit._mask as mask_module
    import execkit.cli._output as output_module

    secret = "ghp_" + "A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8"
    monkeypatch.setenv("EXECKIT_DB", str(tmp_path / "ledger.db"))
    with open_ledger(tmp_path / "ledger.db") as ledger:
        ledger.create_task(f"board:{secret}", actor="dispatcher")
        ledger.create_task("board:PLAIN", actor="dispatcher")
    issues = [{"id": i, "title": "t", "state": "todo"} for i in (secret, "PLAIN")]
    board = write_board(tmp_path / "board.json", issues)
    masked: list[str] = []
    real = mask_module.mask_text

    def counted(text: str) -> str:
        masked.append(text)
        return real(text)

    monkeypatch.setattr(output_module, "mask_text", counted)
    for argv in (["--board", str(board)], ["--board", str(board), "--watch", "--count", "1"]):
        assert main(["status", *argv]) == 0
        out = capsys.readouterr().out
        assert "PLAIN" in out and secret not in out, argv
    masked.clear()
    assert main(["status"]) == 0
    out = capsys.readouterr().out
    assert "PLAIN" in out and secret not in out  # its title was masked when stored
    assert masked == [], "the ledger's own cells are not masked again"


def test_status_reads_spend_and_announcements_a_page_at_a_time_as_whole(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The SPEND cells and the resumed/fell-back lines are read a page of tasks at a time
    # (memory flat at 100,000 tasks); pages of two say what one page says.
    from execkit._usage import Usage, UsdSource
    from execkit.cli import _status

    db = tmp_path / "ledger.db"
    with open_ledger(db) as ledger:
        for n in range(7):
            task = ledger.create_task(f"board:ISS-{n}", actor="me").id
            run = ledger.start_run(task, request_key=f"{n}a", actor="me")
            usage = Usage(input_tokens=10, usd=0.1 * n, usd_source=UsdSource.REPORTED)
            if n % 3:  # done: no time in its row, which moves between two reads
                ledger.finish_run(run.id, "succeeded", usage=usage if n % 2 else None)
            else:
                ledger.finish_run(
                    run.id, "failed", failure_class=FailureClass.UPSTREAM,
                    reason="usage limit: x", usage=usage if n % 2 else None,
                )  # fmt: skip
                ledger.start_run(
                    task, request_key=f"{n}b", actor="me", ignore_backoff=True,
                    resumed_session=f"s-{n}", fell_back="fell back from a/x to b/y" if n else None,
                )  # fmt: skip

    def shown() -> list[list[str]]:
        assert main(["status", "--db", str(db)]) == 0
        return [line.split() for line in capsys.readouterr().out.splitlines()]

    whole = shown()
    monkeypatch.setattr(_status, "LIST_PAGE", 2)
    assert shown() == whole
    assert "SPEND" in whole[0] and [c for c in whole[6] if c.startswith("$")] == ["$0.50"]
    said = [" ".join(line) for line in whole[9:]]
    assert said == [
        "ISS-0 attempt 2: resumed session s-0 after the usage limit",
        "ISS-3 attempt 2: fell back from a/x to b/y",
        "ISS-3 attempt 2: resumed session s-3 after the usage limit",
        "ISS-6 attempt 2: fell back from a/x to b/y",
        "ISS-6 attempt 2: resumed session s-6 after the usage limit",
    ]
