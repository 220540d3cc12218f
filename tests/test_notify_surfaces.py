"""Who sends (issue #49): `execkit dispatch` and `execkit serve` each run a sender while
they run, and a dispatcher's give-up reaches a receiver before the command returns; a
dispatcher that ends on a signal says so (`dispatcher.stopped`)."""

from __future__ import annotations

import getpass
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from _support import REPO, write_board
from notify_receiver import receiving

from execkit.cli import main
from execkit.ledger import open_ledger
from execkit.server import add_token

BIN = REPO / "fixtures" / "bin"
OWNER = getpass.getuser()


def test_a_dispatchers_give_up_is_sent_before_it_returns(tmp_path: Path) -> None:
    db = str(tmp_path / "l.db")
    board = write_board(
        tmp_path / "board.json",
        [{"id": "ENV", "title": "gone", "state": "todo", "argv": ["acme-not-here"]}],
        dispatch={"max_attempts": 5},
    )
    with receiving() as receiver:
        with open_ledger(db) as ledger:
            ledger.add_notify_endpoint(
                receiver.url("/hook"), events=["issue.blocked"], actor=OWNER, now=1
            )
        assert (
            main(["dispatch", "--board", str(board), "--adapter", "generic", "--db", db, "--once"])
            == 0
        )
        kinds = [r["body"]["kind"] for r in receiver.got]
        assert kinds == ["issue.blocked"], kinds
        data = receiver.got[0]["body"]["data"]
        assert data["class"] == "environment" and data["fix"]
    with open_ledger(db) as ledger:
        [listed] = ledger.notify_endpoints()
        assert (listed.delivered, listed.backlog) == (1, 0)


def test_execkit_serve_sends_what_its_ledger_owes(tmp_path: Path) -> None:
    tokens = tmp_path / "tokens.json"
    add_token(tokens, "me", ["agent.operate"])
    db = tmp_path / "ledger.db"
    with receiving() as receiver:
        with open_ledger(db) as ledger:
            endpoint = ledger.add_notify_endpoint(
                receiver.url("/hook"), events=["*"], actor=OWNER, now=1
            )
            ledger.notify_test(endpoint.id, actor=OWNER)
        argv = [sys.executable, "-m", "execkit", "serve", "--db", str(db), "--tokens"]
        argv += [str(tokens), "--listen", "127.0.0.1:0", "--json"]
        process = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
        try:
            assert process.stdout is not None
            url = json.loads(process.stdout.readline())["url"]
            for _ in range(600):  # bounded by a count of polls, not a time
                if receiver.got:
                    break
                time.sleep(0.05)
        finally:
            process.send_signal(signal.SIGINT)
            process.wait(timeout=60)
            assert process.stdout is not None
            process.stdout.close()
        [got] = receiver.got
        assert got["body"]["kind"] == "notify.test" and url.startswith("http://127.0.0.1:")


def test_a_dispatcher_stopped_by_a_signal_with_work_left_says_so(tmp_path: Path) -> None:
    db = tmp_path / "l.db"
    open_ledger(db).close()
    board = write_board(
        tmp_path / "board.json",
        [
            {"id": "OK", "title": "fine", "state": "todo", "argv": [f"{BIN}/fake-agent-ok"]},
            {"id": "BAD", "title": "wrong", "state": "todo", "argv": [f"{BIN}/fake-agent-wrong"]},
        ],
        dispatch={"max_attempts": 5},
    )
    argv = [sys.executable, "-m", "execkit", "dispatch", "--board", str(board), "--db", str(db)]
    argv += ["--adapter", "generic"]
    argv += ["--interval", "3600", "--json"]
    process = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert process.stdout is not None
        # Both issues ran once: BAD waits for its retry, work left when the signal comes.
        assert process.stdout.readline() and process.stdout.readline()
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
        assert process.stdout is not None
        process.stdout.close()
    with open_ledger(db) as ledger:
        kinds = [e.kind for e in ledger.notify_events()]
    assert kinds == ["dispatcher.stopped"], kinds
