"""`execkit classify [FILE|-] [--json]`: in-process for the cases, real processes for the edges."""

from __future__ import annotations

import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from execkit._classify import TAIL_CHARS
from execkit.cli import main

CORPUS = Path(__file__).resolve().parent.parent / "fixtures" / "failures"


def _feed_stdin(monkeypatch: pytest.MonkeyPatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_stdin_is_the_default(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _feed_stdin(monkeypatch, b"banner\nERROR: exceeded retry limit, last status: 503\n")
    assert main(["classify"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out == [
        "upstream: http 503",
        "evidence: ERROR: exceeded retry limit, last status: 503",
    ]


def test_dash_reads_stdin_and_json_prints_one_object(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _feed_stdin(monkeypatch, b"FAILED tests/test_x.py::test_y - assert 1 == 2\n")
    assert main(["classify", "-", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {
        "class": "work",
        "reason": "default",
        "evidence": None,
        "retry_after_s": None,
    }


def test_a_file_argument(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["classify", str(CORPUS / "gemini-429-resource-exhausted.txt"), "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    assert payload["class"] == "upstream"
    assert payload["reason"] == "http 429"
    assert "429" in payload["evidence"]


def test_work_prints_without_evidence_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "t.txt"
    path.write_text("HTTP 404: Not Found\n")
    assert main(["classify", str(path)]) == 0
    assert capsys.readouterr().out == "work: default\n"


def test_only_the_tail_of_a_large_file_is_read(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "big.txt"
    head = "HTTP/1.1 503 Service Unavailable\n"
    path.write_text(head + "é" * (4 * TAIL_CHARS) + "\nERROR: 2 failed\n", encoding="utf-8")
    assert main(["classify", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reason"] == "default"
    path.write_text("x" * (5 * TAIL_CHARS) + "\nstatus 529\n", encoding="utf-8")
    assert main(["classify", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reason"] == "http 529"


def test_a_long_pipe_keeps_its_tail(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    _feed_stdin(monkeypatch, b"status 503\n" + b"ok\n" * 200_000 + b"circuit breaker is open\n")
    assert main(["classify", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reason"] == "circuit open"


def test_a_missing_file_is_not_found(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    assert main(["classify", str(missing), "--json"]) == 4
    captured = capsys.readouterr()
    assert captured.out == ""
    error = json.loads(captured.err)["error"]
    assert error["code"] == "not_found"
    assert str(missing) in error["message"]


def test_a_directory_is_invalid(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert main(["classify", str(tmp_path)]) == 3
    assert "directory" in capsys.readouterr().err


def _run_cli(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "execkit", "classify", *args],
        input=stdin,
        capture_output=True,
        timeout=60,
        check=False,
    )


def test_real_process_reads_non_utf8_stdin_with_replacement() -> None:
    proc = _run_cli("--json", stdin=b"\xff\xfe garbage \xc3\x28\nAPI Error: 529 \x80\n")
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(proc.stdout)
    assert payload["class"] == "upstream"
    assert payload["reason"] == "http 529"
    assert "\ufffd" in payload["evidence"]


def test_real_process_missing_file_has_no_traceback(tmp_path: Path) -> None:
    proc = _run_cli(str(tmp_path / "absent.log"))
    assert proc.returncode == 4
    assert proc.stdout == b""
    assert b"Traceback" not in proc.stderr
    assert b"not_found" in proc.stderr
