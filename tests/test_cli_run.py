"""`execkit run`: streams through, exits like a shell, --json prints one result object."""

from __future__ import annotations

import io
import json
import os
import selectors
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from _support import gone, wait_gone

from execkit.cli import main

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "exec"
PY = [sys.executable, "-I", "-S"]
EXECKIT = [sys.executable, "-m", "execkit"]


def test_streams_through_and_exits_with_the_child_code(capfd: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--", "sh", "-c", "echo out; echo err >&2; exit 7"])
    captured = capfd.readouterr()
    assert code == 7
    assert captured.out == "out\n" and captured.err == "err\n"


def test_binary_output_passes_through_unchanged(capfdbinary: pytest.CaptureFixture[bytes]) -> None:
    garbage = [*PY, str(FIXTURES / "binary_garbage.py"), "5000", "0", "9"]
    expected = subprocess.run(garbage, capture_output=True, check=True).stdout
    assert main(["run", "--", *garbage]) == 0
    assert capfdbinary.readouterr().out == expected


def test_spawn_failure_exits_127_and_says_why(capfd: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--", "execkit-no-such-binary-xyz"])
    captured = capfd.readouterr()
    assert code == 127
    assert "executable not found: execkit-no-such-binary-xyz" in captured.err
    assert captured.out == ""


def test_shell_127_is_passed_through_as_the_child_code(capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["run", "--", "sh", "-c", "exit 127"]) == 127
    assert "execkit:" not in capfd.readouterr().err


def test_timeout_exits_124(capfd: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--timeout", "0.3", "--kill-grace", "5", "--", "sleep", "60"])
    assert code == 124
    assert "timed out" in capfd.readouterr().err


def test_death_by_signal_exits_128_plus_n() -> None:
    assert main(["run", "--", "sh", "-c", "kill -KILL $$"]) == 128 + signal.SIGKILL
    assert main(["run", "--", "sh", "-c", "kill -TERM $$"]) == 128 + signal.SIGTERM


def test_options_after_the_separator_belong_to_the_command(
    capfd: pytest.CaptureFixture[str],
) -> None:
    code = main(["run", "--", *PY, "-c", "import sys; print(sys.argv[1:])", "--timeout", "-1"])
    assert code == 0
    assert capfd.readouterr().out.strip() == "['--timeout', '-1']"


def test_json_captures_and_prints_one_object(capfd: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--json", "--tail-bytes", "4", "--", "sh", "-c", "printf hello; exit 3"])
    captured = capfd.readouterr()
    assert code == 3
    assert captured.err == ""
    payload = json.loads(captured.out)
    assert payload["exit_code"] == 3 and payload["ok"] is False
    assert payload["stdout_tail"] == "ello" and payload["stdout_truncated"] is True
    assert payload["stdout_bytes"] == 5
    assert payload["argv"] == ["sh", "-c", "printf hello; exit 3"]
    assert captured.out.count("\n") == 1


def test_json_spawn_failure(capfd: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--json", "--", "execkit-no-such-binary-xyz"])
    payload = json.loads(capfd.readouterr().out)
    assert code == 127
    assert payload["spawn_errno"] == 2 and payload["exit_code"] is None
    assert "execkit-no-such-binary-xyz" in payload["spawn_error"]


def test_json_timeout(capfd: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--json", "--timeout", "0.3", "--", "sleep", "60"])
    payload = json.loads(capfd.readouterr().out)
    assert code == 124 and payload["timed_out"] is True


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["--timeout", "-1"], "--timeout"),
        (["--timeout", "0"], "--timeout"),
        (["--timeout", "soon"], "--timeout"),
        (["--timeout", "nan"], "--timeout"),
        (["--tail-bytes", "0"], "--tail-bytes"),
        (["--tail-bytes", "1.5"], "--tail-bytes"),
        (["--tail-bytes", str(2**40)], "--tail-bytes"),
        (["--kill-grace", "-1"], "--kill-grace"),
    ],
)
def test_bad_values_are_invalid_errors_naming_the_flag(
    capfd: pytest.CaptureFixture[str], args: list[str], flag: str, tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    code = main(["run", *args, "--", "touch", str(marker)])
    err = capfd.readouterr().err
    assert code == 3
    assert err.startswith("execkit: invalid: ") and flag in err
    assert not marker.exists()  # nothing ran


def test_bad_value_with_json_is_a_json_error(capfd: pytest.CaptureFixture[str]) -> None:
    code = main(["run", "--json", "--timeout", "-1", "--", "true"])
    error = json.loads(capfd.readouterr().err)["error"]
    assert code == 3 and error["code"] == "invalid" and "--timeout" in error["message"]


def test_a_command_is_required(capfd: pytest.CaptureFixture[str]) -> None:
    assert main(["run"]) == 3
    assert main(["run", "--"]) == 3
    assert "a command is required" in capfd.readouterr().err


def test_python_m_execkit_run() -> None:
    proc = subprocess.run(
        [*EXECKIT, "run", "--", "sh", "-c", "echo via-module; exit 4"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 4 and proc.stdout == "via-module\n"


def test_sigterm_to_execkit_kills_the_child_tree(tmp_path: Path) -> None:
    # The child leads its own session, so only execkit's own cleanup can reach it.
    proc = subprocess.Popen(
        [*EXECKIT, "run", "--", *PY, str(FIXTURES / "ignore_term.py")],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    child = 0
    try:
        assert proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(proc.stdout, selectors.EVENT_READ)
            assert sel.select(120), "the child never said it was ready"
        line = proc.stdout.readline().decode()
        assert line.startswith("ready"), line
        child = int(line.split()[1])
        assert not gone(child)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=120) == 128 + signal.SIGTERM
        assert wait_gone(child), "the child survived execkit's SIGTERM"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
        if child and not gone(child):
            os.kill(child, signal.SIGKILL)
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()


# ---------------------------------------------------------------------------------- stdin


def test_stdin_is_handed_to_the_command_like_timeout_does() -> None:
    proc = subprocess.run(
        [*EXECKIT, "run", "--", "cat"],
        input=b"prompt from a pipe\n",
        capture_output=True,
        timeout=120,
    )
    assert (proc.returncode, proc.stdout) == (0, b"prompt from a pipe\n")


def test_a_stdin_nobody_closes_cannot_hold_execkit_past_its_timeout() -> None:
    proc = subprocess.Popen(
        [*EXECKIT, "run", "--json", "--timeout", "0.5", "--", "cat"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        proc.stdin.write(b"half a prompt")
        proc.stdin.flush()  # and never closed
        code = proc.wait(timeout=120)  # the JSON object is small: the pipe cannot fill
        payload = json.loads(proc.stdout.read())
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()
    assert code == 124
    assert payload["timed_out"] and payload["stdout_tail"] == "half a prompt"


# ---------------------------------------------------------------------------- the stdout side


def test_reader_going_away_exits_141_and_stops_the_command() -> None:
    # `execkit run -- yes | head -1`: the shell reports 141 for a writer killed by SIGPIPE.
    proc = subprocess.Popen(
        [*EXECKIT, "run", "--", "sh", "-c", "echo $$; exec yes"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    child = 0
    try:
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        proc.stdout.close()
        assert proc.wait(timeout=120) == 128 + signal.SIGPIPE
        assert wait_gone(child), "the command outlived execkit"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
        if child and not gone(child):
            os.kill(child, signal.SIGKILL)
        if proc.stderr is not None:
            proc.stderr.close()


def test_a_text_only_stdout_gets_whole_characters(monkeypatch: pytest.MonkeyPatch) -> None:
    # 3-byte characters: pipe reads split some of them; each must still arrive whole.
    text_only = io.StringIO()
    monkeypatch.setattr(sys, "stdout", text_only)
    code = main(["run", "--", *PY, "-c", "import sys; sys.stdout.write('€' * 100000)"])
    assert code == 0
    assert text_only.getvalue() == "€" * 100000
