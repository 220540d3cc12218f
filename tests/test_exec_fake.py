"""execkit.spawn with a faked vendor CLI: `fake_vendor.start` injected as `start=`."""

from __future__ import annotations

import errno
import signal
import subprocess
from typing import Any, NoReturn

import pytest

from execkit._exec import spawn
from execkit.testing import FakeVendor


def test_a_faked_vendor_cli_reports_exit_and_output(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("codex", stdout="answer\n", stderr="a warning\n", exit_code=2)
    result = spawn(["codex", "exec", "hi"], start=fake_vendor.start)
    assert result.exit_code == 2 and result.spawn_errno is None
    assert result.stdout_tail == "answer\n" and result.stderr_tail == "a warning\n"
    assert (result.stdout_bytes, result.stderr_bytes) == (7, 10)
    assert result.pid is not None
    assert fake_vendor.calls("codex") == [("codex", "exec", "hi")]


def test_the_fake_is_started_like_a_real_spawn(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("claude")
    result = spawn(["claude", "-p", "x"], cwd="/", env={"A": "b"}, start=fake_vendor.start)
    assert result.ok
    (call,) = fake_vendor.calls("claude")
    assert list(call) == ["claude", "-p", "x"]


def test_a_fake_raising_file_not_found_is_a_spawn_failure(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("codex", missing=True)
    result = spawn(["codex", "exec"], start=fake_vendor.start)
    assert result.spawn_errno == errno.ENOENT
    assert result.exit_code is None and result.pid is None
    assert result.spawn_error == "executable not found: codex"
    assert fake_vendor.call_count("codex") == 1


def test_popen_raising_without_an_errno_still_gets_one() -> None:
    def popen_that_raises(*_args: Any, **_kwargs: Any) -> NoReturn:
        raise FileNotFoundError("gemini is not installed")

    result = spawn(["gemini", "--version"], start=popen_that_raises)
    assert result.spawn_errno == errno.ENOENT
    assert result.spawn_error == "executable not found: gemini"


def test_a_fake_permission_error_keeps_eacces(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("/opt/bin/opencode", start_errno=errno.EACCES)
    result = spawn(["/opt/bin/opencode"], start=fake_vendor.start)
    assert result.spawn_errno == errno.EACCES
    assert "/opt/bin/opencode" in (result.spawn_error or "")


def test_fake_input_reaches_the_fake(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("codex", stdout="got it")
    result = spawn(["codex", "exec", "-"], input="the prompt", start=fake_vendor.start)
    assert fake_vendor.inputs("codex") == [b"the prompt"]
    assert result.stdout_tail == "got it"


def test_fake_death_by_signal(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("codex", exit_code=-signal.SIGKILL)
    result = spawn(["codex"], start=fake_vendor.start)
    assert result.signal == signal.SIGKILL and result.exit_code is None


def test_fake_output_is_bounded_and_streamed(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("codex", stdout="x" * 200_000 + "END")
    chunks: list[bytes] = []
    result = spawn(["codex"], tail_bytes=10, on_stdout=chunks.append, start=fake_vendor.start)
    assert result.stdout_tail == "xxxxxxxEND" and result.stdout_truncated
    assert result.stdout_bytes == 200_003
    assert b"".join(chunks) == b"x" * 200_000 + b"END"


def test_fake_secrets_are_redacted(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("codex", stderr="error: invalid api_key=sk-abcdefghijklmnopqrstuvwx")
    result = spawn(["codex"], start=fake_vendor.start)
    assert result.stderr_tail == "error: invalid api_key=[REDACTED]"


def test_fake_that_outlives_its_timeout_is_timed_out(fake_vendor: FakeVendor) -> None:
    fake_vendor.register("codex", hang=True)
    result = spawn(["codex"], timeout=0.1, kill_grace=0.1, start=fake_vendor.start)
    assert result.timed_out and not result.ok
    assert result.signal in (signal.SIGTERM, signal.SIGKILL)


def test_a_starter_returning_no_popen_is_a_clear_type_error() -> None:
    def not_a_popen(*_args: Any, **_kwargs: Any) -> Any:
        return object()

    with pytest.raises(TypeError, match=r"start must return a started subprocess\.Popen"):
        spawn(["codex"], start=not_a_popen)


def test_a_starter_must_be_callable() -> None:
    with pytest.raises(TypeError, match="start must be a callable"):
        spawn(["codex"], start="subprocess.Popen")  # type: ignore[arg-type]


def test_a_starter_that_drops_the_pipes_is_refused_and_its_process_killed() -> None:
    started: list[subprocess.Popen[bytes]] = []

    def without_pipes(args: list[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        kwargs.update(stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        proc = subprocess.Popen(args, **kwargs)
        started.append(proc)
        return proc

    with pytest.raises(TypeError, match="lacks a pipe"):
        spawn(["sleep", "60"], start=without_pipes)
    (proc,) = started
    assert proc.returncode == -signal.SIGKILL  # killed and reaped before the error surfaced


def test_a_fake_popen_from_fp_is_refused_by_type(fp: Any) -> None:
    # Registered on pytest-subprocess directly: its FakePopen has no real pipes.
    fp.register(["codex", fp.any()])
    with pytest.raises(TypeError, match="fake_vendor"):
        spawn(["codex", "exec"], start=subprocess.Popen)


def test_without_start_spawn_uses_the_real_popen_even_under_fp(fp: Any) -> None:
    # `fp` has nothing registered: a patched Popen would raise ProcessNotRegisteredError.
    result = spawn(["sh", "-c", "echo real"])
    assert result.ok and result.stdout_tail == "real\n"
    assert not fp.calls


def test_fake_vendor_refuses_a_command_registered_on_fp_directly(
    fake_vendor: FakeVendor, fp: Any
) -> None:
    fp.register(["mycli", fp.any()])
    with pytest.raises(TypeError, match=r"register it with fake_vendor\.register\('mycli'"):
        spawn(["mycli", "--flag"], start=fake_vendor.start)
