"""classify on real spawned processes: the structural signals exec reports are the ones read."""

from __future__ import annotations

import sys
from pathlib import Path

from execkit._classify import Classification, FailureClass, classify
from execkit._exec import spawn


def test_a_missing_binary_is_environment(tmp_path: Path) -> None:
    verdict = classify(spawn([str(tmp_path / "no-such-vendor-cli"), "exec"]))
    assert verdict is not None
    assert verdict.failure_class is FailureClass.ENVIRONMENT
    assert verdict.reason == "spawn errno ENOENT"


def test_a_missing_working_directory_is_environment(tmp_path: Path) -> None:
    verdict = classify(spawn([sys.executable, "-c", "pass"], cwd=tmp_path / "gone"))
    assert verdict is not None
    assert verdict.failure_class is FailureClass.ENVIRONMENT
    assert verdict.reason == "missing working directory"


def test_a_shell_exit_127_is_work() -> None:
    result = spawn(["sh", "-c", "no-such-command-for-execkit-tests"])
    assert result.exit_code == 127 and result.spawn_errno is None
    assert classify(result) == Classification(FailureClass.WORK, "default")


def test_an_upstream_refusal_on_stderr_is_upstream() -> None:
    script = (
        "import sys; print('model: gpt-5'); "
        "sys.stderr.write('ERROR: exceeded retry limit, last status: 503 Service Unavailable\\n'); "
        "sys.exit(1)"
    )
    verdict = classify(spawn([sys.executable, "-c", script]))
    assert verdict is not None
    assert (verdict.failure_class, verdict.reason) == (FailureClass.UPSTREAM, "http 503")


def test_a_timed_out_run_is_work_timeout() -> None:
    script = "import time; print('thinking...', flush=True); time.sleep(60)"
    result = spawn([sys.executable, "-c", script], timeout=1.0, kill_grace=1.0)
    assert result.timed_out
    assert classify(result) == Classification(FailureClass.WORK, "timeout")


def _script(path: Path, body: bytes, mode: int) -> Path:
    path.write_bytes(body)
    path.chmod(mode)
    return path


def test_a_program_that_is_not_executable_is_environment(tmp_path: Path) -> None:
    program = _script(tmp_path / "vendor-cli", b"#!/bin/sh\necho hi\n", 0o644)
    verdict = classify(spawn([str(program)]))
    assert verdict is not None
    assert (verdict.failure_class, verdict.reason) == (
        FailureClass.ENVIRONMENT,
        "spawn errno EACCES",
    )


def test_a_program_that_is_not_a_program_is_environment(tmp_path: Path) -> None:
    program = _script(tmp_path / "vendor-cli", b"\x7fELF\x00garbage", 0o755)
    verdict = classify(spawn([str(program)]))
    assert verdict is not None
    assert (verdict.failure_class, verdict.reason) == (
        FailureClass.ENVIRONMENT,
        "spawn errno ENOEXEC",
    )


def test_a_missing_interpreter_is_environment_with_its_own_reason(tmp_path: Path) -> None:
    program = _script(tmp_path / "vendor-cli", b"#!/nonexistent/node\n", 0o755)
    verdict = classify(spawn([str(program)]))
    assert verdict is not None
    assert (verdict.failure_class, verdict.reason) == (
        FailureClass.ENVIRONMENT,
        "missing interpreter",
    )


def test_a_path_through_a_file_is_environment(tmp_path: Path) -> None:
    a_file = _script(tmp_path / "not-a-dir", b"x", 0o644)
    verdict = classify(spawn([str(a_file / "vendor-cli")]))
    assert verdict is not None
    assert (verdict.failure_class, verdict.reason) == (
        FailureClass.ENVIRONMENT,
        "spawn errno ENOTDIR",
    )
