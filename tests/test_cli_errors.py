"""The CLI surface end to end: usage errors are `invalid`, `run` carries the class, and
`run --adapter` goes through the vendor adapter. Real `python -m execkit` processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
        "run", "--adapter", "codex", "--json", "--", "exec", "fix the test",
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
        "run", "--adapter", "claude", "--json", "--", "-p", "fix it",
        "--output-format", "json",
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
