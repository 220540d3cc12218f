"""`execkit task|run start|run finish|capabilities|db` with --json, errors and exit codes."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from execkit.cli import main
from execkit.cli._output import EXIT_CODES
from execkit.ledger import SCHEMA_VERSION, SqliteLedger
from execkit.ledger._sqlite import _SCHEMA_STEPS


class Cli:
    def __init__(self, db: Path, capsys: pytest.CaptureFixture[str]) -> None:
        self.db = db
        self.capsys = capsys

    def __call__(self, *argv: str) -> tuple[int, Any, Any]:
        """Run with --db/--json; return (exit code, stdout JSON or None, stderr JSON or None)."""
        self.capsys.readouterr()
        code = main([*argv, "--db", str(self.db), "--json"])
        out, err = self.capsys.readouterr()
        return code, json.loads(out) if out else None, json.loads(err) if err else None

    def error(self, expected: str, *argv: str) -> str:
        code, out, err = self(*argv)
        assert out is None
        assert err is not None and set(err) == {"error"}, err
        assert set(err["error"]) == {"code", "message"}
        assert err["error"]["code"] == expected, err
        assert code == EXIT_CODES[expected]
        message: str = err["error"]["message"]
        return message


@pytest.fixture
def cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Cli:
    return Cli(tmp_path / "ledger.db", capsys)


def _table_dump(db: Path) -> list[str]:
    conn = sqlite3.connect(db)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def test_the_exit_codes_are_distinct() -> None:
    codes = ["attempt_limit", "conflict", "forbidden", "invalid", "not_found"]
    codes += ["schema_too_new", "finished", "blocked", "invalid_history"]
    assert len({EXIT_CODES[c] for c in codes}) == len(codes)


def test_task_lifecycle_with_json(cli: Cli) -> None:
    code, task, _ = cli(
        "task", "create", "write the parser", "--max-attempts", "2", "--actor", "alice"
    )
    assert code == 0
    assert (task["id"], task["max_attempts"], task["ready"]) == ("t-1", 2, True)
    assert task["created_by"] == "alice"

    code, run, _ = cli("run", "start", "t-1", "--request-key", "k1", "--actor", "bot")
    assert code == 0
    assert (run["id"], run["attempt"], run["status"]) == ("r-1", 1, "running")
    assert cli("run", "start", "t-1", "--request-key", "k1")[1] == run  # replay

    code, finished, _ = cli(
        "run", "finish", "r-1", "failed", "--class", "upstream", "--reason", "http 503"
    )
    assert code == 0
    assert (finished["status"], finished["failure_class"]) == ("failed", "upstream")

    code, shown, _ = cli("task", "show", "t-1")
    assert (shown["attempts_started"], shown["uncharged_streak"]) == (1, 1)
    code, listed, _ = cli("task", "list")
    assert [t["id"] for t in listed["tasks"]] == ["t-1"]
    code, runs, _ = cli("task", "runs", "t-1")
    assert runs["task_id"] == "t-1"
    assert [r["id"] for r in runs["runs"]] == ["r-1"]

    cli("run", "start", "t-1", "--request-key", "k2")
    cli("run", "finish", "r-2", "failed")
    message = cli.error("attempt_limit", "run", "start", "t-1")
    assert "2 of 2" in message

    code, raised, _ = cli(
        "task",
        "set-attempt-limit",
        "t-1",
        "3",
        "--expected",
        "2",
        "--role",
        "agent.operate",
        "--actor",
        "op",
    )
    assert code == 0
    assert (raised["max_attempts"], raised["attempts_started"]) == (3, 2)
    assert cli("run", "start", "t-1")[1]["attempt"] == 3


def test_run_start_belongs_to_the_caller_by_default(cli: Cli) -> None:
    import os

    cli("task", "create", "t")
    run = cli("run", "start", "t-1")[1]
    # In-process here, so "the caller of execkit" is this process's parent.
    assert run["owner_pid"] == os.getppid()


def test_errors_have_one_shape_and_their_own_exit_code(cli: Cli) -> None:
    cli("task", "create", "t", "--max-attempts", "1", "--actor", "alice")
    assert "t-9" in cli.error("not_found", "task", "show", "t-9")
    assert "current limit" in cli.error(
        "conflict", "task", "set-attempt-limit", "t-1", "4", "--expected", "3", "--actor", "alice"
    )
    cli.error(
        "forbidden",
        "task",
        "set-attempt-limit",
        "t-1",
        "4",
        "--expected",
        "1",
        "--actor",
        "mallory",
    )
    cli("run", "start", "t-1")
    assert "still running" in cli.error("blocked", "run", "start", "t-1")
    cli("run", "finish", "r-1", "succeeded")
    cli.error("finished", "run", "start", "t-1")
    cli.error("conflict", "run", "finish", "r-1", "failed")
    cli.error("invalid", "run", "finish", "r-1", "exploded")
    cli.error("not_found", "run", "finish", "r-7", "failed")


@pytest.mark.parametrize("bad", ["0", "10001", "-1", "abc", "2.5", ""])
def test_set_attempt_limit_bad_values_are_invalid_and_change_nothing(cli: Cli, bad: str) -> None:
    cli("task", "create", "t", "--max-attempts", "2", "--actor", "alice")
    before = _table_dump(cli.db)
    message = cli.error(
        "invalid", "task", "set-attempt-limit", "t-1", bad, "--expected", "2", "--actor", "alice"
    )
    assert "1..10000" in message
    assert _table_dump(cli.db) == before


@pytest.mark.parametrize("bad", ["-1", "abc", "2.5", "10001"])
def test_expected_must_be_a_limit_too(cli: Cli, bad: str) -> None:
    cli("task", "create", "t", "--max-attempts", "2", "--actor", "alice")
    before = _table_dump(cli.db)
    assert "--expected" in cli.error(
        "invalid", "task", "set-attempt-limit", "t-1", "3", "--expected", bad, "--actor", "alice"
    )
    assert _table_dump(cli.db) == before


@pytest.mark.parametrize("bad", ["10001", "-1", "abc", "2.5"])
def test_create_with_a_bad_limit_is_invalid_and_creates_nothing(cli: Cli, bad: str) -> None:
    message = cli.error("invalid", "task", "create", "t", "--max-attempts", bad)
    assert "--max-attempts" in message and "1..10000" in message
    assert not cli.db.exists()


def test_create_with_zero_means_no_limit_and_keys_replay(cli: Cli) -> None:
    first = cli("task", "create", "t", "--max-attempts", "0", "--idempotency-key", "k")[1]
    assert first["max_attempts"] == 0
    assert cli("task", "create", "t", "--idempotency-key", "k")[1]["id"] == first["id"]
    cli.error("conflict", "task", "create", "t", "--max-attempts", "3", "--idempotency-key", "k")


def test_reading_commands_do_not_create_a_ledger(cli: Cli) -> None:
    for argv in (
        ("task", "show", "t-1"),
        ("task", "list"),
        ("db", "status"),
        ("db", "check"),
        ("db", "migrate"),
        ("run", "start", "t-1"),
    ):
        assert "no ledger" in cli.error("not_found", *argv)
    assert not cli.db.exists()


def test_capabilities(cli: Cli) -> None:
    code, out, _ = cli("capabilities")
    assert code == 0
    assert out == {"capabilities": ["tasks.attempt_limits"], "schema_version": SCHEMA_VERSION}


def test_db_status_check_and_migrate(cli: Cli) -> None:
    cli("task", "create", "t")
    code, status, _ = cli("db", "status")
    assert code == 0
    assert (status["schema_version"], status["tasks"], status["journal_mode"]) == (2, 1, "wal")
    code, check, _ = cli("db", "check")
    assert (code, check) == (0, {"ok": True, "problems": []})
    code, migrated, _ = cli("db", "migrate")
    assert code == 0
    assert (migrated["from_version"], migrated["backup_path"]) == (2, None)


def test_db_check_reports_problems_with_its_exit_code(cli: Cli) -> None:
    cli("task", "create", "t")
    conn = sqlite3.connect(cli.db)
    conn.execute("UPDATE tasks SET status = 'done'")
    conn.commit()
    conn.close()
    code, check, _ = cli("db", "check")
    assert code == EXIT_CODES["invalid_history"]
    assert check == {"ok": False, "problems": ["t-1: task is done but no run succeeded"]}


def test_db_migrate_upgrades_a_version_1_file_and_names_the_backup(cli: Cli) -> None:
    conn = sqlite3.connect(cli.db, isolation_level=None)
    for statement in _SCHEMA_STEPS[1]:
        conn.execute(statement)
    conn.execute("INSERT INTO schema_version VALUES (1, 1.0)")
    conn.close()
    status = cli("db", "status")[1]
    assert (status["schema_version"], status["needs_migration"]) == (1, True)
    code, migrated, _ = cli("db", "migrate")
    assert code == 0
    assert (migrated["from_version"], migrated["to_version"]) == (1, 2)
    backup = Path(migrated["backup_path"])
    assert backup.is_file() and backup.parent == cli.db.parent
    assert cli("db", "status")[1]["schema_version"] == 2


def test_a_newer_file_is_refused_by_every_command(cli: Cli) -> None:
    with SqliteLedger(cli.db) as ledger:
        ledger.create_task("t", actor="a")
    conn = sqlite3.connect(cli.db)
    conn.execute("INSERT INTO schema_version VALUES (99, 1.0)")
    conn.commit()
    conn.close()
    image = cli.db.read_bytes()
    for argv in (
        ("task", "show", "t-1"),
        ("task", "create", "x"),
        ("db", "migrate"),
        ("db", "status"),
        ("run", "start", "t-1"),
    ):
        assert "99" in cli.error("schema_too_new", *argv)
    assert cli.db.read_bytes() == image


def test_the_real_binary_prints_json_errors_on_stderr(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    base = [sys.executable, "-m", "execkit"]
    made = subprocess.run(
        [*base, "task", "create", "t", "--db", str(db), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["id"] == "t-1"
    bad = subprocess.run(
        [
            *base,
            "task",
            "set-attempt-limit",
            "t-1",
            "2.5",
            "--expected",
            "0",
            "--db",
            str(db),
            "--json",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert bad.returncode == EXIT_CODES["invalid"]
    assert bad.stdout == ""
    assert json.loads(bad.stderr)["error"]["code"] == "invalid"
    plain = subprocess.run(
        [*base, "task", "show", "t-9", "--db", str(db)], capture_output=True, text=True, timeout=120
    )
    assert plain.returncode == EXIT_CODES["not_found"]
    assert plain.stderr.startswith("execkit: not_found: ")
    assert "Traceback" not in plain.stderr


def test_human_output(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "ledger.db")
    assert main(["task", "create", "hello", "--max-attempts", "2", "--db", db]) == 0
    assert "t-1  hello" in capsys.readouterr().out
    assert main(["run", "start", "t-1", "--db", db]) == 0
    assert capsys.readouterr().out.startswith("r-1  t-1 attempt 1  running")
    assert main(["run", "finish", "r-1", "failed", "--reason", "boom", "--db", db]) == 0
    assert main(["task", "list", "--db", db]) == 0
    assert "attempts 1/2" in capsys.readouterr().out
    assert main(["db", "check", "--db", db]) == 0
    assert "ok" in capsys.readouterr().out


def test_env_var_selects_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EXECKIT_DB", str(tmp_path / "env.db"))
    assert main(["task", "create", "t", "--json"]) == 0
    assert (tmp_path / "env.db").is_file()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("run", "start", "t-1", "--owner-pid", "abc"), "--owner-pid must be a whole number"),
        (("run", "start", "t-1", "--owner-pid", "0"), "--owner-pid must be a process id >= 1"),
        (("run", "start", "t-1", "--owner-pid", "2.5"), "--owner-pid"),
        (("run", "finish", "r-1", "failed", "--class", "cosmic"), "failure_class"),
        (("run", "finish", "r-1", "running"), "status must be one of"),
    ],
)
def test_bad_run_flags_are_invalid_and_change_nothing(
    cli: Cli, argv: tuple[str, ...], needle: str
) -> None:
    cli("task", "create", "t", "--max-attempts", "2")
    if argv[1] == "finish":
        cli("run", "start", "t-1")
    before = _table_dump(cli.db)
    assert needle in cli.error("invalid", *argv)
    assert _table_dump(cli.db) == before
