"""`execkit decide`: the operator's view of the budget decision (issue 5)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from execkit.cli import main

NOT_FOUND = "codex CLI not found on PATH; install: npm i -g @openai/codex"


def attempt(n: int, status: str = "failed", cls: str | None = None, **kw: Any) -> dict[str, Any]:
    return {
        "number": n,
        "status": status,
        "class": cls,
        "reason": kw.pop("reason", None),
        "started_at": 100.0 * n,
        "ended_at": kw.pop("ended_at", 100.0 * n + 1),
        **kw,
    }


def run_cli(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], history: object, *args: str
) -> tuple[int, str, str]:
    path = tmp_path / "history.json"
    path.write_text(history if isinstance(history, str) else json.dumps(history))
    code = main(["decide", "--history", str(path), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_json_decision_names_the_environment_precondition(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = [
        attempt(1, cls="upstream", reason="http 503"),
        attempt(2, cls="environment", reason=NOT_FOUND),
    ]
    code, out, err = run_cli(tmp_path, capsys, history, "--json", "--now", "1e9")
    assert (code, err) == (0, "")
    data = json.loads(out)
    assert data["state"] == "blocked" and data["blocked_on"] == "environment"
    assert data["next_action"] == "none" and data["reason"] == f"environment: {NOT_FOUND}"
    assert data["attempts_used"] == 2 and data["charged_attempts"] == 0


def test_history_from_stdin_in_a_real_process() -> None:
    history = [attempt(n, cls="upstream", reason="http 503") for n in (1, 2, 3)]
    proc = subprocess.run(
        [sys.executable, "-m", "execkit", "decide", "--history", "-", "--json"],
        input=json.dumps(history),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["blocked_on"] == "upstream"
    assert data["reason"] == (
        "waiting on an outside service: http 503 (3 consecutive upstream attempts)"
    )


def test_human_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    history = [attempt(n, reason="exit 1") for n in (1, 2, 3)]
    code, out, _ = run_cli(tmp_path, capsys, history, "--now", "1e9")
    assert code == 0
    assert "state: blocked on work" in out
    assert "next action: none" in out
    assert "reason: charged budget spent: 3 of 3 attempts" in out
    assert "attempts used: 3, charged: 3, uncharged streak: 0, remaining: 0" in out


def test_human_summary_shows_the_backoff_time(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(tmp_path, capsys, [attempt(1, cls="work")], "--now", "102")
    assert code == 0 and "state: backoff" in out and "next attempt at: 1970-01-01T" in out
    assert "from --now" in out


def test_the_vendors_reset_time_is_read_and_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from execkit._budget import Attempt, AttemptStatus
    from execkit._classify import FailureClass
    from execkit.cli._decide import _parse_attempt, attempt_to_json

    # A 429 whose vendor said "not before t=5000": later than any backoff from t=101.
    limited = attempt(1, cls="upstream", reason="http 429", not_before=5000.0)
    _, out, _ = run_cli(tmp_path, capsys, [limited], "--json", "--now", "102")
    assert json.loads(out)["next_attempt_at"] == 5000.0
    without = {k: v for k, v in limited.items() if k != "not_before"}
    _, out, _ = run_cli(tmp_path, capsys, [without], "--json", "--now", "102")
    assert json.loads(out)["next_attempt_at"] < 5000.0
    # The one writer and the reader agree, reset time included.
    kept = Attempt(
        number=1,
        status=AttemptStatus.FAILED,
        failure_class=FailureClass.UPSTREAM,
        started_at=100.0,
        ended_at=101.0,
        not_before=5000.0,
    )
    assert _parse_attempt(0, attempt_to_json(kept)) == kept


def test_budget_flags_change_the_decision(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = [attempt(n, cls="work") for n in (1, 2, 3)]
    _, out, _ = run_cli(tmp_path, capsys, history, "--json", "--now", "1e9")
    assert json.loads(out)["blocked_on"] == "work"
    _, out, _ = run_cli(tmp_path, capsys, history, "--json", "--now", "1e9", "--max-attempts", "4")
    assert json.loads(out)["state"] == "ready"
    upstream = [attempt(n, cls="upstream") for n in (1, 2)]
    _, out, _ = run_cli(
        tmp_path, capsys, upstream, "--json", "--now", "1e9", "--max-uncharged-attempts", "2"
    )
    assert json.loads(out)["blocked_on"] == "upstream"


def test_limit_blocks_and_raising_it_reopens(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = [attempt(n, cls="work") for n in (1, 2, 3, 4)]
    _, out, _ = run_cli(tmp_path, capsys, history, "--json", "--now", "1e9", "--limit", "4")
    data = json.loads(out)
    assert (data["blocked_on"], data["remaining"]) == ("attempt_limit", 0)
    assert data["reason"] == "attempt limit reached: 4 of 4 runs"
    _, out, _ = run_cli(tmp_path, capsys, history, "--json", "--now", "1e9", "--limit", "5")
    assert json.loads(out)["state"] == "ready"


def test_failure_class_key_and_forced_are_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    history = [
        {"number": 1, "status": "failed", "failure_class": "environment", "reason": NOT_FOUND},
        {
            "number": 2,
            "status": "failed",
            "failure_class": "work",
            "forced": True,
            "started_at": 5,
            "ended_at": 6,
        },
    ]
    _, out, _ = run_cli(tmp_path, capsys, history, "--json", "--now", "1e9")
    data = json.loads(out)
    assert (data["state"], data["charged_attempts"], data["remaining"]) == ("ready", 1, 2)


@pytest.mark.parametrize(
    ("history", "exit_code", "code", "needle"),
    [
        ("[{", 3, "invalid", "not valid JSON"),
        ({"number": 1}, 11, "invalid_history", "expected a JSON list"),
        ([1], 11, "invalid_history", "history[0]: expected an object"),
        ([{"status": "failed"}], 11, "invalid_history", "history[0]: missing field 'number'"),
        (
            [{"number": 1, "status": "failed", "clas": "work"}],
            11,
            "invalid_history",
            "history[0]: unknown field 'clas'",
        ),
        (
            [{"number": 1, "status": "failed", "class": "work", "failure_class": "work"}],
            11,
            "invalid_history",
            "not both",
        ),
        (
            [{"number": 1, "status": "failed"}, {"number": 2, "status": "crashed"}],
            11,
            "invalid_history",
            "history[1].status: 'crashed' is not one of running, succeeded",
        ),
        (
            [{"number": 1, "status": "failed", "class": "flaky"}],
            11,
            "invalid_history",
            "history[0].failure_class: 'flaky' is not one of work, environment, upstream",
        ),
        (
            [{"number": 1, "status": "failed", "ended_at": "noon"}],
            11,
            "invalid_history",
            "history[0].ended_at",
        ),
        (
            [{"number": 1, "status": "failed"}, {"number": 3, "status": "failed"}],
            11,
            "invalid_history",
            "number is 3, expected 2",
        ),
        ([{"number": 0, "status": "failed"}], 11, "invalid_history", "history[0].number"),
    ],
)
def test_bad_history_is_a_clear_error(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    history: object,
    exit_code: int,
    code: str,
    needle: str,
) -> None:
    rc, out, err = run_cli(tmp_path, capsys, history, "--json")
    assert rc == exit_code and out == ""
    error = json.loads(err)["error"]
    assert error["code"] == code and needle in error["message"]
    rc, _, err = run_cli(tmp_path, capsys, history)
    assert rc == exit_code and err.startswith(f"execkit: {code}: ") and "Traceback" not in err


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (("--limit", "0"), "--limit must be 1..10000; got 0"),
        (("--limit", "10001"), "--limit must be 1..10000; got 10001"),
        (("--limit", "2.5"), "--limit must be a whole number, 1..10000; got '2.5'"),
        (("--limit", "-1"), "--limit must be 1..10000; got -1"),
        (("--max-attempts", "0"), "--max-attempts must be >= 1; got 0"),
        (("--max-attempts", "x"), "--max-attempts must be a whole number, >= 1; got 'x'"),
        (("--max-attempts", "abc"), "--max-attempts must be a whole number, >= 1"),
        (("--max-uncharged-attempts", "-1"), "--max-uncharged-attempts must be >= 1; got -1"),
        (("--max-uncharged-attempts", "2.5"), "--max-uncharged-attempts must be a whole number"),
        (("--now", "nan"), "--now must be a finite number of seconds >= 0"),
        (("--now", "soon"), "--now must be a finite number of seconds >= 0, got 'soon'"),
    ],
)
def test_bad_flags_name_the_flag_and_range(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: tuple[str, ...], needle: str
) -> None:
    rc, out, err = run_cli(tmp_path, capsys, [], *args, "--json")
    assert rc == 3 and out == ""
    error = json.loads(err)["error"]
    assert error["code"] == "invalid" and needle in error["message"], error
    rc, out, err = run_cli(tmp_path, capsys, [], *args)
    assert rc == 3 and out == "" and err.startswith("execkit: invalid: ") and needle in err


def test_missing_file_is_not_found(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    rc = main(["decide", "--history", str(tmp_path / "nope.json")])
    assert rc == 4 and "no such file" in capsys.readouterr().err
