"""The CLI surface end to end: usage errors are `invalid`, `run` carries the class, and
`run --adapter` goes through the vendor adapter. Real `python -m execkit` processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import execkit.cli as cli
from execkit.cli import main

EXECKIT = [sys.executable, "-m", "execkit"]


def execkit(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*EXECKIT, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **(env or {})},
    )


@pytest.mark.parametrize(
    "args",
    [
        ["no-such-command"],
        ["decide", "--history"],
        ["dispatch", "--board", "b.json", "--once", "--interval", "1"],
        ["run", "--no-such-flag", "--", "true"],
    ],
)
def test_a_usage_error_is_invalid_input_with_exit_3_and_no_traceback(args: list[str]) -> None:
    done = execkit(*args)
    assert done.returncode == 3
    assert done.stderr.startswith("execkit: invalid: ")
    assert "see 'execkit" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_usage_error_with_json_is_one_json_error_object() -> None:
    done = execkit("decide", "--history", "h.json", "--max-attempts", "many", "--json")
    assert done.returncode == 3
    error = json.loads(done.stderr)["error"]
    assert error["code"] == "invalid"
    assert "--max-attempts" in error["message"]


def test_json_after_the_double_dash_belongs_to_the_child() -> None:
    # `--json` after `--` is an argument of CMD, so the usage error is reported as text.
    done = execkit("run", "--bogus", "--", "echo", "--json")
    assert done.returncode == 3
    assert done.stderr.startswith("execkit: invalid: ")


def test_everything_after_the_double_dash_belongs_to_the_command() -> None:
    done = execkit("run", "--", "echo", "--json", "--db", "x.db", "--actor", "a")
    assert (done.returncode, done.stdout) == (0, "--json --db x.db --actor a\n")
    # `--json` before the command is execkit's; the one after `--` is still the child's.
    captured = execkit("--json", "run", "--", "echo", "--json")
    assert captured.returncode == 0, captured.stderr
    assert json.loads(captured.stdout)["stdout_tail"] == "--json\n"


def test_run_json_carries_the_class_reason_and_evidence() -> None:
    ok = json.loads(execkit("run", "--json", "--", "true").stdout)
    assert (ok["class"], ok["reason"], ok["evidence"]) == (None, None, None)

    missing = execkit("run", "--json", "--", "no-such-binary-execkit")
    assert missing.returncode == 127
    payload = json.loads(missing.stdout)
    assert payload["class"] == "environment"
    assert payload["reason"] == "spawn errno ENOENT"

    refused = execkit(
        "run", "--json", "--", sys.executable, "-c",
        "import sys; sys.exit('Error: HTTP/1.1 503 Service Unavailable')",
    )  # fmt: skip
    payload = json.loads(refused.stdout)
    assert refused.returncode == 1
    assert payload["class"] == "upstream"
    assert "503" in payload["evidence"]

    wrong = execkit("run", "--json", "--", "sh", "-c", "echo 'processed 500 files' >&2; exit 1")
    assert json.loads(wrong.stdout)["class"] == "work"


def test_run_with_an_adapter_reports_the_missing_binary_and_its_install_hint(
    tmp_path: Path,
) -> None:
    done = execkit(
        "run", "--adapter", "codex", "--json", "--", "fix the test",
        env={"PATH": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 127
    proof = json.loads(done.stdout)
    assert proof["class"] == "environment"
    assert proof["precondition"].startswith("codex CLI not found on PATH; install:")


def test_run_with_an_adapter_runs_the_vendor_binary(tmp_path: Path) -> None:
    fake = tmp_path / "claude"
    envelope = {"type": "result", "is_error": False, "result": "fixed", "session_id": "s-1"}
    fake.write_text(f"#!/bin/sh\necho '{json.dumps(envelope)}'\n")
    fake.chmod(0o755)
    done = execkit(
        "run", "--adapter", "claude", "--json", "--", "fix it",
        env={"PATH": f"{tmp_path}{os.pathsep}{os.environ['PATH']}"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    proof = json.loads(done.stdout)
    assert proof["status"] == "succeeded"
    assert proof["class"] is None
    assert proof["session_id"] == "s-1"


def test_an_unknown_adapter_names_the_known_ones() -> None:
    done = execkit("run", "--adapter", "nope", "--", "x")
    assert done.returncode != 0
    assert "codex" in done.stderr and "Traceback" not in done.stderr


def test_a_reader_that_goes_away_ends_execkit_like_sigpipe(tmp_path: Path) -> None:
    # Enough tasks that the listing overflows the pipe after `head` has gone.
    db = str(tmp_path / "l.db")
    script = (
        "from execkit.ledger import open_ledger\n"
        f"ledger = open_ledger({db!r})\n"
        "for n in range(1500): ledger.create_task('a long enough task title ' * 3, actor='a')\n"
    )
    subprocess.run([sys.executable, "-c", script], check=True, timeout=120)
    pipeline = subprocess.run(
        ["bash", "-c", f"{sys.executable} -m execkit task list --db {db} | head -n 1;"
         " echo status=${PIPESTATUS[0]} >&2"],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert pipeline.stdout.startswith("t-1 ")
    assert "status=141" in pipeline.stderr
    assert "Traceback" not in pipeline.stderr and "BrokenPipe" not in pipeline.stderr


# -- --db naming a directory ----------------------------------------------------------

# Every command that takes --db, with whatever else it requires.
DB_COMMANDS = [
    ["task", "create", "x"],
    ["task", "show", "t-1"],
    ["task", "list"],
    ["task", "runs", "t-1"],
    ["task", "set-attempt-limit", "t-1", "2", "--expected", "0"],
    ["task", "set-budget", "t-1", "--usd", "1"],
    ["task", "cancel", "t-1"],
    ["task", "retry", "t-1"],
    ["role", "grant", "bob", "agent.operate"],
    ["role", "revoke", "bob", "agent.operate"],
    ["role", "list"],
    ["run", "start", "t-1"],
    ["run", "finish", "r-1", "failed"],
    ["run", "list", "--running"],
    ["run", "heartbeat", "r-1"],
    ["capabilities"],
    ["db", "init"],
    ["db", "migrate"],
    ["db", "status"],
    ["db", "check"],
    ["lane", "list"],
    ["lane", "show", "claude/default"],
    ["lane", "resume", "claude/default"],
    ["lane", "park", "claude/default", "--for", "60"],
    ["lane", "config"],
    ["budget", "show"],
    ["budget", "set", "--day-usd", "1"],
    ["spend"],
    ["notify", "add", "http://127.0.0.1:9/hook", "--events", "*"],
    ["notify", "list"],
    ["notify", "test", "ep_1"],
    ["notify", "remove", "ep_1"],
    ["notify", "enable", "ep_1"],
    ["budget", "override", "--window", "day"],
    ["budget", "subscription", "claude/default", "on"],
    ["dispatch", "--board", "board.json", "--adapter", "generic", "--once"],
    ["status"],
    ["status", "--board", "board.json"],
    ["serve", "--tokens", "tokens.json"],
]


def _commands_with_db() -> set[str]:
    """The prog of every parser that has a --db option, found by walking the parsers."""
    import argparse

    found: set[str] = set()

    def walk(parser: argparse.ArgumentParser) -> None:
        for action in parser._actions:
            if "--db" in action.option_strings:
                found.add(parser.prog)
            if isinstance(action, argparse._SubParsersAction):
                for child in action.choices.values():
                    walk(child)

    for module in {m for m, _ in cli._COMMANDS.values()} | set(cli._INTERNAL.values()):
        parser = argparse.ArgumentParser(prog="execkit")
        __import__(f"execkit.cli.{module}", fromlist=["register"]).register(parser.add_subparsers())
        walk(parser)
    return found


def test_the_db_list_covers_every_command_that_takes_db() -> None:
    covered = set()
    for argv in DB_COMMANDS:
        words = [w for w in argv[:2] if not w.startswith("-")]
        if words[0] in {"task", "db", "run", "role", "lane", "budget", "notify"}:
            covered.add(f"execkit {' '.join(words[:2])}")
        else:
            covered.add(f"execkit {words[0]}")
    assert covered == _commands_with_db()


@pytest.mark.parametrize("argv", DB_COMMANDS, ids=lambda argv: " ".join(argv[:2]))
@pytest.mark.parametrize("before", [False, True], ids=["after", "before"])
def test_a_db_that_is_a_directory_is_invalid_before_any_ledger_opens(
    argv: list[str],
    before: bool,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("EXECKIT_DB", raising=False)
    (tmp_path / "board.json").write_text('{"states": [], "issues": []}')
    directory = tmp_path / "ledgers"
    directory.mkdir()
    full = ["--db", str(directory), *argv] if before else [*argv, "--db", str(directory)]
    assert main(full) == 3
    out, err = capsys.readouterr()
    assert out == ""
    assert err == f"execkit: invalid: --db must name a ledger file, got the directory {directory}\n"
    assert list(directory.iterdir()) == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["board.json", "ledgers"]
    assert main([*full, "--json"]) == 3
    assert json.loads(capsys.readouterr().err)["error"]["code"] == "invalid"


def test_an_execkit_db_that_is_a_directory_is_invalid_too(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("EXECKIT_DB", str(tmp_path))
    assert main(["task", "list"]) == 3
    err = capsys.readouterr().err
    assert "$EXECKIT_DB names a directory" in err and str(tmp_path) in err
    assert list(tmp_path.iterdir()) == []


# -- what an error message may print ------------------------------------------------


def test_an_error_message_is_redacted(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    token = "sk-proj-" + "a1B2c3D4e5F6g7H8i9J0" * 2
    db = str(tmp_path / "l.db")
    assert main(["task", "create", "x", "--db", db]) == 0
    capsys.readouterr()
    assert main(["task", "show", token, "--db", db]) == 4
    err = capsys.readouterr().err
    assert err.startswith("execkit: not_found: ") and "[REDACTED]" in err
    assert token not in err and "a1B2c3D4e5F6" not in err
    assert main(["task", "show", token, "--db", db, "--json"]) == 4
    assert token not in capsys.readouterr().err


def test_an_error_message_cannot_rewrite_the_terminal(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "no\x1b[2Jsuch\rfile\n")
    assert main(["classify", missing]) == 4
    err = capsys.readouterr().err
    assert err.startswith("execkit: not_found: ")
    assert "no\\x1b[2Jsuch\\rfile\\n" in err
    assert "\x1b" not in err and "\r" not in err
    assert err.count("\n") == 1 and err.endswith("\n")
    # JSON carries the message as it is (json escapes control characters itself).
    assert main(["classify", missing, "--json"]) == 4
    assert missing in json.loads(capsys.readouterr().err)["error"]["message"]


def _hostile_files(root: Path) -> None:
    (root / "empty.db").write_bytes(b"")
    (root / "foreign.db").write_bytes(b"not sqlite at all\n")
    (root / "afile").write_bytes(b"")
    (root / "bad.json").write_bytes(b"\xff\xfe")
    (root / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (root / "nul.json").write_text(
        '{"states": ["todo"], "issues": [{"id": "a", "state": "todo", "argv": ["a\\u0000b"]}]}'
    )


@pytest.mark.parametrize(
    ("args", "exit_code"),
    [
        (["task", "list", "--db", "empty.db"], 13),
        (["task", "list", "--db", "foreign.db"], 13),
        (["task", "create", "x", "--db", "afile/sub.db"], 3),
        (["status", "--board", "bad.json"], 3),
        (["status", "--board", "deep.json"], 3),
        (["dispatch", "--board", "nul.json", "--adapter", "generic", "--once"], 3),
        (["dispatch", "--board", ".", "--adapter", "generic", "--once"], 3),
        (["decide", "--history", "deep.json"], 3),
        (["decide", "--history", "bad.json"], 3),
        (["classify", "."], 3),
    ],
)
def test_hostile_files_get_one_clear_error_and_change_nothing(
    tmp_path: Path, args: list[str], exit_code: int
) -> None:
    _hostile_files(tmp_path)
    before = sorted((p.name, p.stat().st_size) for p in tmp_path.iterdir())
    done = subprocess.run(
        [*EXECKIT, *args, "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "EXECKIT_DB"},
    )
    assert done.returncode == exit_code, done.stderr
    (line,) = done.stderr.splitlines()  # one JSON error object, no traceback
    assert json.loads(line)["error"]["code"] in {"invalid", "storage"}
    after = sorted((p.name, p.stat().st_size) for p in tmp_path.iterdir())
    assert after == before


def test_a_json_error_names_what_the_server_names(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--json` errors carry the error's details (the bad value's field, a refusal's
    ready_at): the same object the server answers with, so a script reads one shape."""
    db = str(tmp_path / "l.db")
    # A flag's value, checked by the CLI; a value checked by the library.
    assert main(["--db", db, "task", "create", "t", "--max-attempts", "-2", "--json"]) == 3
    flag = json.loads(capsys.readouterr().err)["error"]
    assert flag["field"] == "--max-attempts"
    assert main(["--db", db, "task", "create", "x" * 5000, "--json"]) == 3
    library = json.loads(capsys.readouterr().err)["error"]
    assert library["field"] == "title"
    # A refusal with a time: a failed attempt backs the task off.
    assert main(["--db", db, "task", "create", "t", "--json"]) == 0
    task_id = json.loads(capsys.readouterr().out)["id"]
    assert main(["--db", db, "run", "start", task_id, "--json"]) == 0
    run_id = json.loads(capsys.readouterr().out)["id"]
    assert main(["--db", db, "run", "finish", run_id, "failed", "--class", "work"]) == 0
    capsys.readouterr()
    assert main(["--db", db, "run", "start", task_id, "--json"]) == 14
    refusal = json.loads(capsys.readouterr().err)["error"]
    assert refusal["code"] == "backoff"
    assert isinstance(refusal["ready_at"], float)
    # The server's error document for the same errors says the same.
    from execkit._errors import InvalidInput, TaskBackingOff
    from execkit.server._app import error_answer

    for said, exc in (
        (library, InvalidInput(library["message"], field="title")),
        (refusal, TaskBackingOff(refusal["message"], ready_at=refusal["ready_at"])),
    ):
        assert error_answer(exc)[1] == {"error": said}
