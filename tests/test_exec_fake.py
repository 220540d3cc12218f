"""execkit.spawn under pytest-subprocess: how adapter tests fake a vendor CLI."""

from __future__ import annotations

import errno
import signal
import subprocess
from typing import Any

import pytest

from execkit._exec import spawn


def test_a_faked_vendor_cli_reports_exit_and_output(fp: Any) -> None:
    fp.register(["codex", "exec", "hi"], stdout="answer\n", stderr="a warning\n", returncode=2)
    result = spawn(["codex", "exec", "hi"])
    assert result.exit_code == 2 and result.spawn_errno is None
    assert result.stdout_tail == "answer\n" and result.stderr_tail == "a warning\n"
    assert (result.stdout_bytes, result.stderr_bytes) == (7, 10)
    assert result.pid is not None
    assert fp.call_count(["codex", "exec", "hi"]) == 1


def test_the_fake_is_started_like_a_real_spawn(fp: Any) -> None:
    fp.register(["claude", "-p", "x"])
    spawn(["claude", "-p", "x"], cwd="/", env={"A": "b"})
    (call,) = fp.calls
    assert list(call) == ["claude", "-p", "x"]


def test_a_fake_raising_file_not_found_is_a_spawn_failure(fp: Any) -> None:
    def missing(_process: Any) -> None:
        raise FileNotFoundError(errno.ENOENT, "No such file or directory", "codex")

    fp.register(["codex", "exec"], callback=missing)
    result = spawn(["codex", "exec"])
    assert result.spawn_errno == errno.ENOENT
    assert result.exit_code is None and result.pid is None
    assert result.spawn_error == "executable not found: codex"


def test_popen_raising_without_an_errno_still_gets_one(monkeypatch: pytest.MonkeyPatch) -> None:
    def popen(*_args: Any, **_kwargs: Any) -> Any:
        raise FileNotFoundError("gemini is not installed")

    monkeypatch.setattr(subprocess, "Popen", popen)
    result = spawn(["gemini", "--version"])
    assert result.spawn_errno == errno.ENOENT
    assert result.spawn_error == "executable not found: gemini"


def test_a_fake_permission_error_keeps_eacces(fp: Any) -> None:
    def denied(_process: Any) -> None:
        raise PermissionError(errno.EACCES, "Permission denied", "/opt/bin/opencode")

    fp.register(["opencode"], callback=denied)
    result = spawn(["opencode"])
    assert result.spawn_errno == errno.EACCES
    assert "/opt/bin/opencode" in (result.spawn_error or "")


def test_fake_input_reaches_stdin_callable(fp: Any) -> None:
    seen: list[bytes] = []

    def on_input(data: bytes) -> dict[str, str]:
        seen.append(data)
        return {"stdout": "got it"}

    fp.register(["codex", "exec", "-"], stdin_callable=on_input)
    result = spawn(["codex", "exec", "-"], input="the prompt")
    assert seen == [b"the prompt"]
    assert result.stdout_tail == "got it"


def test_fake_death_by_signal(fp: Any) -> None:
    fp.register(["codex"], returncode=-signal.SIGKILL)
    result = spawn(["codex"])
    assert result.signal == signal.SIGKILL and result.exit_code is None


def test_fake_output_is_bounded_and_streamed(fp: Any) -> None:
    fp.register(["codex"], stdout="x" * 200_000 + "END")
    chunks: list[bytes] = []
    result = spawn(["codex"], tail_bytes=10, on_stdout=chunks.append)
    assert result.stdout_tail == "xxxxxxxEND" and result.stdout_truncated
    assert result.stdout_bytes == 200_003
    assert b"".join(chunks) == b"x" * 200_000 + b"END"


def test_fake_secrets_are_redacted(fp: Any) -> None:
    fp.register(["codex"], stderr="error: invalid api_key=sk-abcdefghijklmnopqrstuvwx")
    result = spawn(["codex"])
    assert result.stderr_tail == "error: invalid api_key=[REDACTED]"


def test_fake_that_outlives_its_timeout_is_timed_out(fp: Any) -> None:
    def on_signal(process: Any, sig: int) -> None:
        process.returncode = -sig

    # A short `wait`: its sleeping thread outlives the test, and pytest waits for it at exit.
    fp.register(["codex"], wait=2, signal_callback=on_signal)
    result = spawn(["codex"], timeout=0.1, kill_grace=0.1)
    assert result.timed_out and not result.ok
    assert result.signal in (signal.SIGTERM, signal.SIGKILL)
