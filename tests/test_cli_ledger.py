"""`execkit task|run start|run finish|capabilities|db` with --json, errors and exit codes.

The suite runs twice where it can: on a local ledger file (`--db`), and through a real
`execkit serve` on loopback (`--remote`, the token in $EXECKIT_TOKEN), which must print the
same and exit the same. The server is one subprocess for the session (started on a free
port, stopped whatever happens); each remote test starts from an empty ledger (its rows
deleted beneath the server). Tests of local-only things (file modes and owners, raw files,
`db init|migrate|status`) use `local_cli`.
"""

from __future__ import annotations

import json
import os
import pwd
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest

from execkit.cli import main
from execkit.cli._output import EXIT_CODES
from execkit.ledger import CAPABILITIES, SCHEMA_VERSION, open_ledger
from execkit.ledger._sqlite.schema import SCHEMA_STEPS

ME = pwd.getpwuid(os.geteuid()).pw_name  # who the CLI says acts: the OS user, no flag
REPO = Path(__file__).resolve().parent.parent


def hand_over(db: Path) -> str:
    """Make the ledger someone else's file (as on a shared host), so that the user running
    the tests is not its owner and holds only the roles granted to them. Returns the owner."""
    owner = "nobody"
    os.chown(db, pwd.getpwnam(owner).pw_uid, -1)
    return owner


# What a `--json` error object may hold: its code and message, and the details it names.
_ERROR_KEYS = {
    "code",
    "message",
    "field",
    "ready_at",
    "lane",
    "opens_at",
    "fix",
    "cap",
    "reopens_at",
}


@attrs.frozen
class Server:
    """`execkit serve` in a subprocess, on a free loopback port."""

    url: str
    token: str
    db: Path
    log: Path  # its stderr
    process: subprocess.Popen[str]


@pytest.fixture(scope="session")
def remote_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    from execkit.server import add_token

    where = tmp_path_factory.mktemp("serve")
    tokens = where / "tokens.json"
    token = add_token(tokens, ME, ["agent.operate", "ledger.admin"])
    db = where / "ledger.db"
    log = where / "serve.log"
    argv = [sys.executable, "-m", "execkit", "serve", "--db", str(db), "--tokens", str(tokens)]
    with log.open("w") as err:
        process = subprocess.Popen(
            [*argv, "--listen", "127.0.0.1:0", "--json"],
            stdout=subprocess.PIPE,
            stderr=err,
            text=True,
            env={**os.environ, "PYTHONPATH": str(REPO)},
        )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line, f"execkit serve did not start: {log.read_text()}"
        url = json.loads(line)["url"]
        assert url.startswith("http://127.0.0.1:")
        yield Server(url, token, db, log, process)
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=30)


def _empty(db: Path) -> None:
    """Delete every row of the served ledger but its schema and identity (the server
    keeps its connection; ids start again at t-1 and r-1)."""
    conn = sqlite3.connect(db, timeout=30, isolation_level=None)
    try:
        tables = [
            name
            for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
            if name not in ("schema_version", "ledger_meta") and not name.startswith("sqlite_")
        ]
        conn.execute("BEGIN IMMEDIATE")
        for name in tables:
            conn.execute(f'DELETE FROM "{name}"')
        conn.execute("COMMIT")
    finally:
        conn.close()


class Cli:
    def __init__(
        self, db: Path, capsys: pytest.CaptureFixture[str], *, remote: str | None = None
    ) -> None:
        self.db = db
        self.capsys = capsys
        self.remote = remote
        # The flags that name this ledger, for tests that call `main` themselves.
        self.flags = ["--db", str(db)] if remote is None else ["--remote", remote]

    def __call__(self, *argv: str) -> tuple[int, Any, Any]:
        """Run with --db/--json; return (exit code, stdout JSON or None, stderr JSON or None)."""
        self.capsys.readouterr()
        code = main([*argv, *self.flags, "--json"])
        out, err = self.capsys.readouterr()
        return code, json.loads(out) if out else None, json.loads(err) if err else None

    def error(self, expected: str, *argv: str) -> str:
        code, out, err = self(*argv)
        assert out is None
        assert err is not None and set(err) == {"error"}, err
        # Code and message, and beside them only the details an error may name.
        assert {"code", "message"} <= set(err["error"]) <= _ERROR_KEYS, err
        assert err["error"]["code"] == expected, err
        assert code == EXIT_CODES[expected]
        message: str = err["error"]["message"]
        return message

    def state(self) -> list[str] | None:
        """Every row of the ledger file (None when there is no file)."""
        return _table_dump(self.db) if self.db.exists() else None


@pytest.fixture(params=["local", "remote"])
def cli(
    request: pytest.FixtureRequest,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> Cli:
    monkeypatch.delenv("EXECKIT_REMOTE", raising=False)
    if request.param == "local":
        monkeypatch.delenv("EXECKIT_TOKEN", raising=False)
        return Cli(tmp_path / "ledger.db", capsys)
    server: Server = request.getfixturevalue("remote_server")
    return _through(server, capsys, monkeypatch)


def _through(
    server: Server, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Cli:
    os.chown(server.db, os.geteuid(), -1)  # ours again, if a test handed it over
    _empty(server.db)
    monkeypatch.setenv("EXECKIT_TOKEN", server.token)
    return Cli(server.db, capsys, remote=server.url)


@pytest.fixture
def remote_cli(
    remote_server: Server, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> Cli:
    monkeypatch.delenv("EXECKIT_REMOTE", raising=False)
    return _through(remote_server, capsys, monkeypatch)


@pytest.fixture
def local_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> Cli:
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
    code, task, _ = cli("task", "create", "write the parser", "--max-attempts", "2")
    assert code == 0
    assert (task["id"], task["max_attempts"], task["ready"]) == ("t-1", 2, True)
    assert task["created_by"] == ME

    code, run, _ = cli(
        "run", "start", "t-1", "--request-key", "k1", "--on-behalf-of", "the build bot"
    )
    assert code == 0
    assert (run["id"], run["attempt"], run["status"]) == ("r-1", 1, "running")
    assert run["actor"] == f"{ME} on behalf of the build bot"
    replay = cli("run", "start", "t-1", "--request-key", "k1", "--on-behalf-of", "the build bot")
    assert replay[1] == run

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

    cli("run", "start", "t-1", "--request-key", "k2", "--ignore-backoff")
    cli("run", "finish", "r-2", "failed")
    message = cli.error("attempt_limit", "run", "start", "t-1")
    assert "2 of 2" in message

    # After the first run the limit needs agent.operate: a grant in the ledger, which its
    # owner (the user owning the file: us) may make.
    code, grants, _ = cli("role", "grant", "op", "agent.operate")
    assert (code, [g["principal"] for g in grants["grants"]]) == (0, ["op"])
    code, raised, _ = cli("task", "set-attempt-limit", "t-1", "3", "--expected", "2")
    assert code == 0  # we own the file: every role is ours already
    assert (raised["max_attempts"], raised["attempts_started"]) == (3, 2)
    assert cli("run", "start", "t-1", "--ignore-backoff")[1]["attempt"] == 3
    code, listed, _ = cli("role", "list")
    assert [(g["principal"], g["role"], g["granted_by"]) for g in listed["grants"]] == [
        ("op", "agent.operate", ME)
    ]
    # A person reads times, not epoch seconds: the text lines print them in UTC.
    cli.capsys.readouterr()
    assert main(["role", "list", *cli.flags]) == 0
    line = cli.capsys.readouterr().out
    assert re.fullmatch(
        rf"op  agent\.operate  granted by {re.escape(ME)} at \d{{4}}-\d\d-\d\dT[\d:]{{8}}\+00:00\n",
        line,
    ), line
    cli("task", "create", "backs off")
    cli("run", "start", "t-2")
    cli("run", "finish", "r-4", "failed", "--class", "upstream")
    assert main(["task", "show", "t-2", *cli.flags]) == 0
    shown_text = cli.capsys.readouterr().out
    assert re.search(r"next attempt at \d{4}-\d\d-\d\dT[\d:]{8}\+00:00$", shown_text, re.M), (
        shown_text
    )


def test_roles_are_grants_in_the_ledger_not_claims(cli: Cli) -> None:
    cli("task", "create", "t", "--max-attempts", "1")
    cli("run", "start", "t-1")
    owner = hand_over(cli.db)  # now we are one user among others
    assert "agent.operate" in cli.error(
        "forbidden", "task", "set-attempt-limit", "t-1", "4", "--expected", "1"
    )
    assert "owner" in cli.error("forbidden", "role", "grant", ME, "agent.operate")
    with open_ledger(cli.db) as ledger:
        ledger.grant_role(ME, "agent.operate", actor=owner)
    code, raised, _ = cli("task", "set-attempt-limit", "t-1", "4", "--expected", "1")
    assert (code, raised["max_attempts"]) == (0, 4)
    cli.error("invalid", "role", "grant", ME, "root")


def test_a_retry_after_a_stop_and_a_lease_from_the_command_line(cli: Cli) -> None:
    cli("task", "create", "t")
    run = cli("run", "start", "t-1", "--lease", "60")[1]
    assert run["lease_expires_at"] == pytest.approx(run["started_at"] + 60)
    beat = cli("run", "heartbeat", "r-1", "--lease", "120")[1]
    assert beat["lease_expires_at"] > run["lease_expires_at"]
    cli("run", "finish", "r-1", "failed", "--class", "environment", "--reason", "no codex")
    assert "no codex" in cli.error("blocked", "run", "start", "t-1")
    code, retried, _ = cli("task", "retry", "t-1", "--reason", "installed codex")
    assert (code, retried["ready"], retried["retry_pending"]) == (0, True, True)
    forced = cli("run", "start", "t-1")[1]
    assert (forced["attempt"], forced["forced"]) == (2, True)
    cli("run", "finish", "r-2", "failed", "--class", "work")
    cli("run", "start", "t-1", "--ignore-backoff")
    cli("run", "finish", "r-3", "failed")
    cli("run", "start", "t-1", "--ignore-backoff")
    cli("run", "finish", "r-4", "failed")
    assert "--force" in cli.error("blocked", "task", "retry", "t-1")
    assert cli("task", "retry", "t-1", "--force")[1]["ready"] is True
    cli.error("invalid", "run", "heartbeat", "r-1", "--lease", "0")
    cli.error("conflict", "run", "heartbeat", "r-1")


def test_errors_have_one_shape_and_their_own_exit_code(cli: Cli) -> None:
    cli("task", "create", "t", "--max-attempts", "1")
    assert "t-9" in cli.error("not_found", "task", "show", "t-9")
    assert "current limit" in cli.error(
        "conflict", "task", "set-attempt-limit", "t-1", "4", "--expected", "3"
    )
    cli("run", "start", "t-1")
    hand_over(cli.db)
    cli.error("forbidden", "task", "set-attempt-limit", "t-1", "4", "--expected", "1")
    assert "still running" in cli.error("blocked", "run", "start", "t-1")
    cli("run", "finish", "r-1", "succeeded")
    cli.error("finished", "run", "start", "t-1")
    cli.error("conflict", "run", "finish", "r-1", "failed")
    cli.error("invalid", "run", "finish", "r-1", "exploded")
    cli.error("not_found", "run", "finish", "r-7", "failed")


@pytest.mark.parametrize("bad", ["0", "10001", "-1", "abc", "2.5", ""])
def test_set_attempt_limit_bad_values_are_invalid_and_change_nothing(cli: Cli, bad: str) -> None:
    cli("task", "create", "t", "--max-attempts", "2")
    before = _table_dump(cli.db)
    message = cli.error("invalid", "task", "set-attempt-limit", "t-1", bad, "--expected", "2")
    assert "1..10000" in message
    assert _table_dump(cli.db) == before


@pytest.mark.parametrize("bad", ["-1", "abc", "2.5", "10001"])
def test_expected_must_be_a_limit_too(cli: Cli, bad: str) -> None:
    cli("task", "create", "t", "--max-attempts", "2")
    before = _table_dump(cli.db)
    assert "--expected" in cli.error(
        "invalid", "task", "set-attempt-limit", "t-1", "3", "--expected", bad
    )
    assert _table_dump(cli.db) == before


@pytest.mark.parametrize("bad", ["10001", "-1", "abc", "2.5"])
def test_create_with_a_bad_limit_is_invalid_and_creates_nothing(cli: Cli, bad: str) -> None:
    before = cli.state()  # locally: no file at all
    message = cli.error("invalid", "task", "create", "t", "--max-attempts", bad)
    assert "--max-attempts" in message and "1..10000" in message
    assert cli.state() == before


def test_create_with_zero_means_no_limit_and_keys_replay(cli: Cli) -> None:
    first = cli("task", "create", "t", "--max-attempts", "0", "--idempotency-key", "k")[1]
    assert first["max_attempts"] == 0
    assert cli("task", "create", "t", "--idempotency-key", "k")[1]["id"] == first["id"]
    cli.error("conflict", "task", "create", "t", "--max-attempts", "3", "--idempotency-key", "k")


def test_reading_commands_do_not_create_a_ledger(local_cli: Cli) -> None:
    for argv in (
        ("task", "show", "t-1"),
        ("task", "list"),
        ("db", "status"),
        ("db", "check"),
        ("db", "migrate"),
        ("run", "start", "t-1"),
    ):
        assert "no ledger" in local_cli.error("not_found", *argv)
    assert not local_cli.db.exists()


def test_capabilities(cli: Cli) -> None:
    code, out, _ = cli("capabilities")
    assert code == 0
    assert out == {"capabilities": sorted(CAPABILITIES), "schema_version": SCHEMA_VERSION}
    assert "tasks.attempt_limits" in out["capabilities"]


def test_db_status_check_and_migrate(local_cli: Cli) -> None:
    local_cli("task", "create", "t")
    code, status, _ = local_cli("db", "status")
    assert code == 0
    assert (status["schema_version"], status["tasks"], status["journal_mode"]) == (
        SCHEMA_VERSION,
        1,
        "wal",
    )
    code, check, _ = local_cli("db", "check")
    assert (code, check) == (0, {"ok": True, "problems": [], "repaired": []})
    code, migrated, _ = local_cli("db", "migrate")
    assert code == 0
    assert (migrated["from_version"], migrated["backup_path"]) == (SCHEMA_VERSION, None)


def test_db_check_reports_problems_with_its_exit_code(cli: Cli) -> None:
    cli("task", "create", "t")
    conn = sqlite3.connect(cli.db)
    conn.execute("UPDATE tasks SET status = 'done'")
    conn.commit()
    conn.close()
    code, check, _ = cli("db", "check")
    assert code == EXIT_CODES["invalid_history"]
    assert check == {
        "ok": False,
        "problems": ["t-1: task is done but no run succeeded"],
        "repaired": [],
    }


def test_db_check_names_an_empty_file_and_db_init_is_the_only_way_over_it(local_cli: Cli) -> None:
    local_cli.db.touch()
    code, check, _ = local_cli("db", "check")
    assert code == EXIT_CODES["storage"]  # not a ledger: storage, as for every command
    assert check["ok"] is False and "empty file" in check["problems"][0]
    assert "empty file" in local_cli.error("storage", "task", "create", "t")
    assert local_cli.db.stat().st_size == 0  # nothing silently re-initialised it
    code, made, _ = local_cli("db", "init")
    assert (code, made["created"]) == (0, True)
    assert local_cli("task", "create", "t")[0] == 0
    assert local_cli("db", "init")[1]["created"] is False


def test_db_check_repair_abandons_an_expired_run(cli: Cli) -> None:
    cli("task", "create", "t")
    with open_ledger(cli.db) as ledger:
        ledger.start_run("t-1", request_key="k", actor="a", now=100.0, lease_s=10)
    code, check, _ = cli("db", "check")
    assert code == EXIT_CODES["invalid_history"]
    assert "lease expired" in check["problems"][0]
    code, repaired, _ = cli("db", "check", "--repair")
    assert (code, repaired["ok"]) == (0, True)
    assert repaired["repaired"] == ["t-1: abandoned run r-1 (lease expired)"]


def test_db_migrate_upgrades_a_version_1_file_and_names_the_backup(local_cli: Cli) -> None:
    conn = sqlite3.connect(local_cli.db, isolation_level=None)
    for statement in SCHEMA_STEPS[1]:
        conn.execute(statement)
    conn.execute("INSERT INTO schema_version VALUES (1, 1.0)")
    conn.close()
    status = local_cli("db", "status")[1]
    assert (status["schema_version"], status["needs_migration"]) == (1, True)
    code, migrated, _ = local_cli("db", "migrate")
    assert code == 0
    assert (migrated["from_version"], migrated["to_version"]) == (1, SCHEMA_VERSION)
    backup = Path(migrated["backup_path"])
    assert backup.is_file() and backup.parent == local_cli.db.parent
    assert backup.stat().st_mode & 0o077 == 0  # owner-only, as the ledger
    assert local_cli("db", "status")[1]["schema_version"] == SCHEMA_VERSION


def test_a_newer_file_is_refused_by_every_command(local_cli: Cli) -> None:
    with open_ledger(local_cli.db) as ledger:
        ledger.create_task("t", actor="a")
    conn = sqlite3.connect(local_cli.db)
    conn.execute("INSERT INTO schema_version VALUES (99, 1.0)")
    conn.commit()
    conn.close()
    image = local_cli.db.read_bytes()
    for argv in (
        ("task", "show", "t-1"),
        ("task", "create", "x"),
        ("db", "migrate"),
        ("db", "status"),
        ("run", "start", "t-1"),
    ):
        assert "99" in local_cli.error("schema_too_new", *argv)
    assert local_cli.db.read_bytes() == image


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


def test_human_output(cli: Cli, capsys: pytest.CaptureFixture[str]) -> None:
    where = cli.flags
    assert main(["task", "create", "hello", "--max-attempts", "2", *where]) == 0
    assert "t-1  hello" in capsys.readouterr().out
    assert main(["run", "start", "t-1", *where]) == 0
    assert capsys.readouterr().out.startswith("r-1  t-1 attempt 1  running")
    assert main(["run", "finish", "r-1", "failed", "--reason", "boom", *where]) == 0
    assert main(["task", "list", *where]) == 0
    assert "started 1/2 limit, charged 1  hello" in capsys.readouterr().out
    assert main(["db", "check", *where]) == 0
    assert "ok" in capsys.readouterr().out
    assert main(["task", "show", "t-9", *where]) == EXIT_CODES["not_found"]
    assert capsys.readouterr().err == "execkit: not_found: no task 't-9'\n"


def test_env_var_selects_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EXECKIT_DB", str(tmp_path / "env.db"))
    assert main(["task", "create", "t", "--json"]) == 0
    assert (tmp_path / "env.db").is_file()


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (("run", "start", "t-1", "--lease", "abc"), "--lease must be a finite number"),
        (("run", "start", "t-1", "--lease", "0"), "--lease must be a finite number"),
        (("run", "start", "t-1", "--lease", "1e9"), "--lease must be at most"),
        (("task", "create", "u", "--max-uncharged-attempts", "0"), "--max-uncharged-attempts"),
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


# -- the common flags before the command, and terminal-safe text ------------------------


def test_json_and_db_work_before_or_after_the_command(
    cli: Cli, capsys: pytest.CaptureFixture[str]
) -> None:
    flag, db = cli.flags  # --db PATH, or --remote URL: the same rules
    assert main([flag, db, "task", "create", "hello"]) == 0
    capsys.readouterr()
    outputs = []
    for argv in (
        ["--json", "task", "show", "t-1", flag, db],
        ["task", "show", "t-1", "--json", flag, db],
        ["--json", flag, db, "task", "show", "t-1"],
        [f"{flag}={db}", "--json", "task", "show", "t-1"],
        ["--json", "task", "show", "--json", "t-1", flag, db],
    ):
        assert main(argv) == 0, argv
        outputs.append(capsys.readouterr().out)
    assert json.loads(outputs[0])["title"] == "hello"
    assert outputs == [outputs[0]] * len(outputs)
    # And with `run start|finish`, reached through `run`.
    assert main(["--json", flag, db, "run", "start", "t-1"]) == 0
    assert json.loads(capsys.readouterr().out)["id"] == "r-1"
    assert main([flag, db, "task", "list"]) == 0
    assert capsys.readouterr().out.startswith("t-1  running")


def test_an_error_is_json_when_json_comes_before_the_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "ledger.db")
    assert main(["--json", "--db", db, "task", "show", "t-9"]) == EXIT_CODES["not_found"]
    assert json.loads(capsys.readouterr().err)["error"]["code"] == "not_found"
    assert main(["--json", "task", "show"]) == EXIT_CODES["invalid"]  # a usage error
    assert json.loads(capsys.readouterr().err)["error"]["code"] == "invalid"


def test_on_behalf_of_works_before_the_command(
    cli: Cli, capsys: pytest.CaptureFixture[str]
) -> None:
    where = cli.flags
    assert main(["--on-behalf-of", "alice", "task", "create", "x", *where, "--json"]) == 0
    # Recorded as both, never as alice alone: the identity is ours.
    assert json.loads(capsys.readouterr().out)["created_by"] == f"{ME} on behalf of alice"
    assert main(["--on-behalf-of=bob", "run", "start", "t-1", *where, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["actor"] == f"{ME} on behalf of bob"


def test_no_flag_or_variable_can_claim_an_identity_or_a_role(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    db = str(tmp_path / "ledger.db")
    monkeypatch.setenv("EXECKIT_ACTOR", "alice")
    assert main(["task", "create", "x", "--db", db, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["created_by"] == ME
    for argv in (
        ["task", "create", "y", "--actor", "alice", "--db", db],
        ["task", "set-attempt-limit", "t-1", "2", "--expected", "0", "--role", "x", "--db", db],
    ):
        assert main(argv) == EXIT_CODES["invalid"]
    capsys.readouterr()


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--db", "x.db", "run", "--", "true"], "execkit run: --db does not apply"),
        (
            ["--on-behalf-of", "a", "task", "show", "t-1"],
            "execkit task show: --on-behalf-of does not apply",
        ),
        (["--db", "a.db", "task", "list", "--db", "b.db"], "given both before and after"),
        (["--bogus", "task", "list"], "unrecognized option before the command: '--bogus'"),
        (["--db"], "argument --db: expected one argument"),
        (["--json"], "the following arguments are required: COMMAND"),
    ],
)
def test_a_misplaced_common_flag_is_invalid(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    assert main(argv) == EXIT_CODES["invalid"]
    out, err = capsys.readouterr()
    assert out == ""
    assert message in err


HOSTILE = "evil \x1b[2J\rgone\nfake line\x9b31m\x07"
ESCAPED = "evil \\x1b[2J\\rgone\\nfake line\\x9b31m\\x07"


def test_text_output_escapes_control_characters_in_titles_and_reasons(
    cli: Cli, capsys: pytest.CaptureFixture[str]
) -> None:
    where = cli.flags
    assert main(["task", "create", HOSTILE, *where]) == 0
    assert main(["run", "start", "t-1", *where]) == 0
    assert main(["run", "finish", "r-1", "failed", "--reason", HOSTILE, *where]) == 0
    capsys.readouterr()
    for argv in (["task", "show", "t-1"], ["task", "list"], ["task", "runs", "t-1"]):
        assert main([*argv, *where]) == 0
        out = capsys.readouterr().out
        assert ESCAPED in out, argv
        assert not {"\x1b", "\r", "\x9b", "\x07"} & set(out), argv
        assert "\nfake line" not in out
    # JSON keeps the text as it is (json escapes control characters itself).
    assert main(["task", "show", "t-1", *where, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["title"] == HOSTILE


# -- through a remote only ------------------------------------------------------------


@pytest.mark.parametrize("action", ["init", "migrate", "status"])
def test_db_init_migrate_and_status_refuse_a_remote(
    remote_cli: Cli, action: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    before = remote_cli.state()
    message = remote_cli.error("invalid", "db", action)
    assert "local ledger file only" in message and "--remote" in message
    assert remote_cli.remote is not None
    monkeypatch.setenv("EXECKIT_REMOTE", remote_cli.remote)
    code = main(["db", action, "--json"])
    assert code == EXIT_CODES["invalid"]
    assert "$EXECKIT_REMOTE" in remote_cli.capsys.readouterr().err
    assert remote_cli.state() == before


def test_the_remote_comes_from_the_environment_unless_db_is_given(
    remote_cli: Cli, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    assert remote_cli.remote is not None
    monkeypatch.setenv("EXECKIT_REMOTE", remote_cli.remote)
    assert main(["task", "create", "via env", "--json"]) == 0
    assert json.loads(remote_cli.capsys.readouterr().out)["id"] == "t-1"
    local = tmp_path / "mine.db"
    assert main(["task", "list", "--db", str(local), "--json"]) == EXIT_CODES["not_found"]
    remote_cli.capsys.readouterr()
    message = remote_cli.error("invalid", "task", "list", "--db", str(local))
    assert "--db and --remote" in message


def test_a_remote_needs_the_token_in_the_environment(
    remote_cli: Cli, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("EXECKIT_TOKEN")
    assert "EXECKIT_TOKEN" in remote_cli.error("invalid", "task", "list")
    monkeypatch.setenv("EXECKIT_TOKEN", "not-the-token")
    assert "unknown token" in remote_cli.error("unauthenticated", "task", "list")


def test_the_real_binary_through_the_remote(remote_cli: Cli, remote_server: Server) -> None:
    env = {**os.environ, "PYTHONPATH": str(REPO), "EXECKIT_TOKEN": remote_server.token}
    base = [sys.executable, "-m", "execkit", "--remote", remote_server.url]
    made = subprocess.run(
        [*base, "task", "create", "t", "--json"],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert made.returncode == 0, made.stderr
    assert json.loads(made.stdout)["id"] == "t-1"
    plain = subprocess.run(
        [*base, "task", "show", "t-9"], capture_output=True, text=True, timeout=120, env=env
    )
    assert plain.returncode == EXIT_CODES["not_found"]
    assert plain.stderr == "execkit: not_found: no task 't-9'\n"


def test_the_server_logs_no_token(remote_cli: Cli, remote_server: Server) -> None:
    remote_cli("task", "create", "t")
    remote_cli.error("not_found", "task", "show", "t-9")
    time.sleep(0.1)
    assert remote_server.token not in remote_server.log.read_text()
    assert remote_server.process.poll() is None  # still serving
