"""execkit.spawn against real processes: spawn failures, exits, timeouts, trees, capture."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import signal
import stat
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import FrameType
from typing import Any

import attrs
import psutil
import pytest
from _support import REPO, gone, wait_gone

from execkit import InvalidInput
from execkit._exec import SpawnResult, spawn, supervisor
from execkit._exec.options import SpawnOptions

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "exec"
# -I -S: no site import, so the fixture is up (and has its signal handlers) quickly.
PY = [sys.executable, "-I", "-S"]


def fixture(name: str, *args: str) -> list[str]:
    return [*PY, str(FIXTURES / name), *args]


def kill_quietly(pid: int) -> None:
    with contextlib.suppress(psutil.Error):
        psutil.Process(pid).kill()


def read_pids(path: Path) -> list[int]:
    return [int(p) for p in path.read_text().split()] if path.exists() else []


# ---------------------------------------------------------------- spawn failures vs exits


def test_absent_binary_is_a_spawn_failure_with_enoent() -> None:
    result = spawn(["execkit-no-such-binary-xyz", "--flag"])
    assert result.spawn_errno == errno.ENOENT
    assert result.exit_code is None and result.signal is None and result.pid is None
    assert "execkit-no-such-binary-xyz" in (result.spawn_error or "")
    assert not result.ok
    assert result.failure_text().startswith("executable not found")


def test_absent_absolute_path_names_the_path(tmp_path: Path) -> None:
    missing = tmp_path / "bin" / "codex"
    result = spawn([str(missing)])
    assert result.spawn_errno == errno.ENOENT
    assert str(missing) in (result.spawn_error or "")


def test_missing_cwd_says_it_was_the_directory(tmp_path: Path) -> None:
    missing = tmp_path / "gone"
    result = spawn(["true"], cwd=missing)
    assert result.spawn_errno == errno.ENOENT
    assert result.spawn_error == f"working directory not found: {missing}"
    assert result.exit_code is None


def test_cwd_that_is_a_file_is_a_directory_failure(tmp_path: Path) -> None:
    a_file = tmp_path / "f"
    a_file.write_text("x")
    result = spawn(["true"], cwd=str(a_file))
    assert result.spawn_errno == errno.ENOTDIR
    assert "working directory" in (result.spawn_error or "")


def test_not_executable_keeps_eacces(tmp_path: Path) -> None:
    script = tmp_path / "tool"
    script.write_text("#!/bin/sh\necho hi\n")
    script.chmod(stat.S_IRUSR | stat.S_IWUSR)
    result = spawn([str(script)])
    assert result.spawn_errno == errno.EACCES
    assert str(script) in (result.spawn_error or "")
    assert result.exit_code is None


def test_missing_interpreter_is_enoent_and_names_the_interpreter(tmp_path: Path) -> None:
    # How a vendor CLI installed as a script fails when its runtime is gone.
    script = tmp_path / "codex"
    script.write_text("#!/nonexistent/node --flag\nconsole.log(1)\n")
    script.chmod(0o755)
    result = spawn([str(script)])
    assert result.spawn_errno == errno.ENOENT and result.exit_code is None
    assert (
        result.spawn_error == f"interpreter not found: /nonexistent/node (the #! line of {script})"
    )


def test_shell_missing_command_is_exit_127_not_a_spawn_failure() -> None:
    result = spawn(["sh", "-c", "execkit-no-such-command-xyz"])
    assert result.exit_code == 127
    assert result.spawn_errno is None and result.spawn_error is None
    assert result.pid is not None
    assert "execkit-no-such-command-xyz" in result.stderr_tail


def test_exit_code_and_streams_are_kept_apart() -> None:
    result = spawn(["sh", "-c", "echo out; echo err >&2; exit 3"])
    assert result.exit_code == 3 and result.signal is None and not result.timed_out
    assert result.stdout_tail == "out\n" and result.stderr_tail == "err\n"
    assert (result.stdout_bytes, result.stderr_bytes) == (4, 4)
    assert result.failure_text() == "err\nout"
    assert result.duration_s >= 0


def test_success_is_ok() -> None:
    result = spawn(["true"])
    assert result.ok and result.exit_code == 0 and isinstance(result.pid, int)


def test_death_by_signal_sets_signal_not_exit_code() -> None:
    result = spawn(["sh", "-c", "kill -KILL $$"])
    assert result.signal == signal.SIGKILL
    assert result.exit_code is None and not result.timed_out and not result.ok


def test_argv_is_never_split_or_shell_expanded() -> None:
    args = ["$HOME; echo pwned", "*", "a b", "`id`"]
    result = spawn([*PY, "-c", "import sys; print(repr(sys.argv[1:]))", *args])
    assert result.stdout_tail.strip() == repr(args)


def test_env_replaces_the_environment() -> None:
    result = spawn(
        [*PY, "-c", "import os; print(sorted(k for k in os.environ if k.startswith('EK_')))"],
        env={"EK_ONE": "1", "PATH": os.environ.get("PATH", "/usr/bin:/bin")},
    )
    assert result.stdout_tail.strip() == "['EK_ONE']"


def test_cwd_is_used(tmp_path: Path) -> None:
    result = spawn(["pwd"], cwd=tmp_path)
    assert result.stdout_tail.strip() == str(tmp_path)


# ------------------------------------------------------------------------ input / stdin


# Run in a fresh interpreter whose own stdin is a pipe that already holds a line and is
# never closed: what pytest's fd 0 happens to be cannot make these pass by accident.
_STDIN_SCRIPT = """
import json, sys
sys.path.insert(0, {root!r})
from execkit._exec import spawn
print(json.dumps([
    r.to_dict() for r in (
        spawn(["cat"], timeout=5, kill_grace=0),
        spawn(["head", "-n", "1"], inherit_stdin=True, timeout=30),
        spawn(["cat"], inherit_stdin=True, timeout=0.5, kill_grace=5),
    )
]))
"""


def test_stdin_is_devnull_unless_inherited_and_never_read_by_spawn() -> None:
    script = _STDIN_SCRIPT.format(root=str(REPO))
    proc = subprocess.Popen(
        [sys.executable, "-c", script],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        proc.stdin.write(b"fed\n")
        proc.stdin.flush()  # and left open: nobody ever sends EOF
        proc.wait(timeout=120)  # its output is small: the pipe cannot fill
        out, err = proc.stdout.read(), proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=60)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()
    devnull, inherited, never_closed = json.loads(out)
    assert devnull["ok"] and devnull["stdout_bytes"] == 0, (devnull, err)
    assert inherited["ok"] and inherited["stdout_tail"] == "fed\n"
    # The child waits on the open pipe; spawn does not, and the timeout still ends it.
    assert never_closed["timed_out"] and never_closed["signal"] == signal.SIGTERM


def test_input_and_inherit_stdin_exclude_each_other(fp: object) -> None:
    with pytest.raises(InvalidInput, match="inherit_stdin"):
        spawn(["cat"], input="x", inherit_stdin=True)
    with pytest.raises(TypeError, match="inherit_stdin"):
        spawn(["cat"], inherit_stdin=1)  # type: ignore[arg-type]


def test_large_input_is_written_without_deadlock() -> None:
    # 8 MiB in, 8 MiB out through `cat`: far beyond both pipe buffers.
    payload = b"".join(b"%07d\n" % i for i in range(1024 * 1024))
    result = spawn(["cat"], input=payload, timeout=60, tail_bytes=1024)
    assert result.ok
    assert result.stdout_bytes == len(payload) == 8 * 1024 * 1024
    assert result.stdout_tail == payload[-1024:].decode()
    assert result.stdout_truncated


def test_str_input_is_utf8() -> None:
    result = spawn([*PY, "-c", "import sys; print(sys.stdin.buffer.read().hex())"], input="é")
    assert result.stdout_tail.strip() == "c3a9"


def test_child_that_ignores_its_input_is_not_an_error() -> None:
    result = spawn(["true"], input=b"x" * (4 * 1024 * 1024), timeout=30)
    assert result.ok


# ------------------------------------------------------------------------------- capture


def test_tails_keep_the_last_bytes_exactly() -> None:
    code = "import sys; sys.stdout.write(''.join(f'{i}\\n' for i in range(100000)))"
    expected = "".join(f"{i}\n" for i in range(100000))
    result = spawn([*PY, "-c", code], tail_bytes=1000)
    assert result.stdout_bytes == len(expected)
    assert result.stdout_truncated and not result.stderr_truncated
    assert result.stdout_tail == expected[-1000:]
    assert result.failure_text(20) == "…" + expected.strip()[-19:]


def test_output_exactly_at_the_limit_is_not_truncated() -> None:
    result = spawn(["printf", "abcd"], tail_bytes=4)
    assert result.stdout_tail == "abcd" and not result.stdout_truncated
    result = spawn(["printf", "abcde"], tail_bytes=4)
    assert result.stdout_tail == "bcde" and result.stdout_truncated


def test_binary_garbage_never_raises_and_counts_exactly() -> None:
    result = spawn(fixture("binary_garbage.py", "300000", "7000", "3"), tail_bytes=4096)
    assert result.exit_code == 0
    assert (result.stdout_bytes, result.stderr_bytes) == (300000, 7000)
    assert result.stdout_truncated and result.stderr_truncated
    assert isinstance(result.stdout_tail, str) and result.stdout_tail
    result.to_dict()  # JSON-safe even with replacement characters


def test_binary_output_is_counted_and_the_text_after_it_kept_redacted() -> None:
    # A vendor CLI that dumps binary, then prints its error: the error is what matters,
    # and a value cut from its name by a NUL is still masked (the name is context).
    after = b"hunter2hunter2\nError: 503 Service Unavailable\n"
    code = (
        "import os, sys; out = sys.stdout.buffer; out.write(os.urandom(100000));"
        f" out.write(b'password=\\0' + {after!r})"
    )
    result = spawn([*PY, "-c", code], tail_bytes=65536)
    assert result.ok and result.stdout_bytes == 100000 + len(b"password=\0") + len(after)
    notice = f"[binary output: {65536 - len(after)} bytes not kept]"
    assert result.stdout_tail == notice + "[REDACTED]\nError: 503 Service Unavailable\n"


def test_tail_does_not_open_in_the_middle_of_a_character() -> None:
    # "é" is 2 bytes; an odd limit would start on its second byte without realignment.
    result = spawn([*PY, "-c", "import sys; sys.stdout.write('é' * 1000)"], tail_bytes=11)
    assert result.stdout_truncated
    assert result.stdout_tail == "é" * 5
    assert "\ufffd" not in result.stdout_tail


def test_callbacks_receive_every_byte_without_changing_what_is_kept() -> None:
    out_chunks: list[bytes] = []
    err_chunks: list[bytes] = []
    code = "import sys; sys.stdout.write('o' * 200000); sys.stderr.write('e' * 70000)"
    result = spawn(
        [*PY, "-c", code], tail_bytes=100, on_stdout=out_chunks.append, on_stderr=err_chunks.append
    )
    plain = spawn([*PY, "-c", code], tail_bytes=100)
    assert b"".join(out_chunks) == b"o" * 200000
    assert b"".join(err_chunks) == b"e" * 70000
    assert all(len(c) <= 64 * 1024 for c in out_chunks)
    fields = ("stdout_tail", "stderr_tail", "stdout_bytes", "stderr_bytes", "stdout_truncated")
    assert [getattr(result, f) for f in fields] == [getattr(plain, f) for f in fields]


def test_callbacks_are_live(tmp_path: Path) -> None:
    # The child only finishes early if the callback sees "ready" while it is running.
    flag = tmp_path / "flag"

    def on_stdout(chunk: bytes) -> None:
        if b"ready" in chunk:
            flag.touch()

    result = spawn(fixture("wait_for_file.py", str(flag)), on_stdout=on_stdout, timeout=60)
    assert result.ok, result.failure_text()
    assert result.stdout_tail == "ready\nseen\n"


def test_a_raising_callback_kills_the_child_and_propagates(tmp_path: Path) -> None:
    seen: list[int] = []

    def on_stdout(chunk: bytes) -> None:
        seen.append(int(chunk.split()[1]))
        raise RuntimeError("log sink full")

    with pytest.raises(RuntimeError, match="log sink full"):
        spawn(fixture("ignore_term.py"), on_stdout=on_stdout, timeout=60)
    assert seen and wait_gone(seen[0])


def test_secrets_are_masked_in_tails_but_not_in_live_chunks() -> None:
    live: list[bytes] = []
    code = (
        "import os; print('OPENAI_API_KEY=sk-proj-abcdefghijklmnop1234'); "
        "print('value', os.environ['MY_SERVICE_TOKEN']); "
        "import sys; print('Authorization: Bearer abc.def.ghi12345', file=sys.stderr)"
    )
    env = {"MY_SERVICE_TOKEN": "hunter2hunter2", "PATH": os.environ.get("PATH", "")}
    result = spawn([*PY, "-c", code], env=env, on_stdout=live.append)
    assert "sk-proj" not in result.stdout_tail and "hunter2hunter2" not in result.stdout_tail
    assert result.stdout_tail == "OPENAI_API_KEY=[REDACTED]\nvalue [REDACTED]\n"
    assert result.stderr_tail == "Authorization: Bearer [REDACTED]\n"
    assert b"hunter2hunter2" in b"".join(live)


def test_a_secret_the_tail_cut_in_two_leaves_no_part_behind() -> None:
    key = "sk-proj-" + "AbCdEfGhIjKlMnOpQrStUvWxYz0123456789"
    line = f"OPENAI_API_KEY={key}\n"
    tail_bytes = len(line) - line.index(key) - 12  # the cut falls 12 characters into the key
    code = f"import sys; sys.stdout.write('x' * 100000 + ' ' + {line!r})"
    result = spawn([*PY, "-c", code], tail_bytes=tail_bytes)
    assert result.stdout_truncated
    assert result.stdout_tail == "[REDACTED]\n"


def test_an_env_secret_cut_by_a_tiny_tail_leaves_no_part_behind() -> None:
    secret = "hunter2hunter2hunter2"
    env = {"MY_SERVICE_TOKEN": secret, "PATH": os.environ.get("PATH", "")}
    code = "import os; print(os.environ['MY_SERVICE_TOKEN'])"
    result = spawn([*PY, "-c", code], env=env, tail_bytes=4)  # "er2" and the newline
    assert result.stdout_truncated and result.stdout_tail == "[REDACTED]\n"


def test_secret_in_argv_is_masked_on_the_result() -> None:
    result = spawn(["echo", "--api-key", "abc123secretvalue", "sk-ant-abcdefghijklmnopqrstu"])
    assert result.argv == ("echo", "--api-key", "[REDACTED]", "[REDACTED]")
    assert "abc123secretvalue" not in result.stdout_tail


# ------------------------------------------------------------------ timeouts and trees


def test_timeout_escalates_to_sigkill_when_sigterm_is_ignored() -> None:
    result = spawn(fixture("ignore_term.py"), timeout=1.5, kill_grace=0.3)
    assert result.stdout_tail.startswith("ready"), "fixture was not up before the timeout"
    assert result.timed_out and result.signal == signal.SIGKILL and result.exit_code is None
    assert not result.ok
    assert wait_gone(int(result.stdout_tail.split()[1]))


def test_timed_out_is_true_even_when_the_child_exits_0_on_sigterm() -> None:
    result = spawn(fixture("exit0_on_term.py"), timeout=1.5, kill_grace=30)
    assert result.stdout_tail.startswith("ready"), "fixture was not up before the timeout"
    assert result.timed_out and result.exit_code == 0 and result.signal is None
    assert not result.ok
    # Its last words during the grace were captured, and the 30 s grace was not waited out:
    # it exited by itself (status 0), where a grace run out ends in SIGKILL.
    assert "got SIGTERM" in result.stderr_tail


def test_plain_sigterm_death_on_timeout() -> None:
    result = spawn(["sleep", "60"], timeout=0.3, kill_grace=30)
    # Ended by the SIGTERM at the timeout, not by the SIGKILL after the 30 s grace.
    assert result.timed_out and result.signal == signal.SIGTERM


def test_timeout_kills_the_whole_tree_including_escaped_descendants(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"
    try:
        result = spawn(fixture("tree.py", str(pidfile)), timeout=2.0, kill_grace=0.3)
        pids = read_pids(pidfile)
        assert len(pids) == 3, "fixture was not up before the timeout"
        child, in_group, escaped = pids
        assert result.timed_out and result.pid == child
        assert result.signal == signal.SIGTERM  # the child itself honours SIGTERM
        # Both grandchildren ignore SIGTERM: only the group SIGKILL and the psutil
        # snapshot (for the one in its own session) can have ended them.
        assert wait_gone(in_group), "grandchild in the group survived"
        assert wait_gone(escaped), "grandchild that left the group survived"
    finally:
        for pid in read_pids(pidfile)[1:]:
            kill_quietly(pid)


def test_grandchild_holding_the_pipes_does_not_hang_spawn(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    try:
        result = spawn(fixture("hold_pipes.py", str(pidfile)), timeout=120, keep_descendants=True)
        assert result.ok and not result.timed_out
        assert result.stdout_tail == "parent done\n"
        # The grandchild sleeps 600 s with the pipes open and is still there: spawn returned
        # without waiting for the pipes' end (keep_descendants leaves it running).
        (grandchild,) = read_pids(pidfile)
        assert not gone(grandchild)
    finally:
        for pid in read_pids(pidfile):
            kill_quietly(pid)


def test_a_grandchild_holding_the_pipes_is_ended_with_the_child(tmp_path: Path) -> None:
    pidfile = tmp_path / "pid"
    try:
        result = spawn(fixture("hold_pipes.py", str(pidfile)), timeout=120)
        assert result.ok and result.stdout_tail == "parent done\n"
        (grandchild,) = read_pids(pidfile)
        assert wait_gone(grandchild), "the grandchild outlived its parent's spawn"
    finally:
        for pid in read_pids(pidfile):
            kill_quietly(pid)


def test_keyboard_interrupt_kills_the_child() -> None:
    pids: list[int] = []

    def on_stdout(chunk: bytes) -> None:
        pids.append(int(chunk.split()[1]))
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        spawn(fixture("ignore_term.py"), on_stdout=on_stdout, timeout=60)
    assert pids and wait_gone(pids[0])


# ------------------------------------------------------------------------- bad arguments


@pytest.mark.parametrize(
    ("kwargs", "error", "names"),
    [
        ({"argv": []}, InvalidInput, "argv"),
        ({"argv": ()}, InvalidInput, "argv"),
        ({"argv": "echo hi"}, TypeError, "argv"),
        ({"argv": b"echo"}, TypeError, "argv"),
        ({"argv": ["echo", 1]}, TypeError, "argv[1]"),
        ({"argv": ["echo", None]}, TypeError, "argv[1]"),
        ({"argv": [Path("/bin/echo")]}, TypeError, "argv[0]"),
        ({"argv": [""]}, InvalidInput, "argv[0]"),
        ({"argv": ["echo", "a\0b"]}, InvalidInput, "argv[1]"),
        ({"timeout": 0}, InvalidInput, "timeout"),
        ({"timeout": -1}, InvalidInput, "timeout"),
        ({"timeout": float("nan")}, InvalidInput, "timeout"),
        ({"timeout": float("inf")}, InvalidInput, "timeout"),
        ({"timeout": "5"}, TypeError, "timeout"),
        ({"timeout": True}, TypeError, "timeout"),
        ({"kill_grace": -0.1}, InvalidInput, "kill_grace"),
        ({"tail_bytes": 0}, InvalidInput, "tail_bytes"),
        ({"tail_bytes": 1.5}, TypeError, "tail_bytes"),
        ({"env": {"A": 1}}, TypeError, "env"),
        ({"env": {"A=B": "x"}}, InvalidInput, "env"),
        ({"input": 12}, TypeError, "input"),
        ({"on_stdout": "print"}, TypeError, "on_stdout"),
        ({"cwd": 3}, TypeError, "cwd"),
        ({"keep_descendants": 1}, TypeError, "keep_descendants"),
    ],
)
def test_bad_arguments_name_the_argument_and_spawn_nothing(
    fp: object, kwargs: dict[str, object], error: type[Exception], names: str
) -> None:
    # `fp` has nothing registered: reaching Popen would raise ProcessNotRegisteredError.
    call: dict[str, object] = {"argv": ["echo", "x"], **kwargs}
    argv = call.pop("argv")
    with pytest.raises(error) as info:
        spawn(argv, **call)  # type: ignore[arg-type]
    assert names in str(info.value)
    if error is InvalidInput:
        assert isinstance(info.value, ValueError)


def test_every_default_passes_the_check_a_spawn_skips_for_it() -> None:
    # A field left at its default object is not checked (most of a spawn's checks): that
    # is sound only while each default passes its field's own check.
    plain = SpawnOptions(argv=["true"])
    fields = attrs.fields(SpawnOptions)
    defaulted = [field for field in fields if field.default is not attrs.NOTHING]
    assert len(defaulted) == 16
    for field in defaulted:
        skipped = field.validator.validator  # type: ignore[union-attr]
        skipped(plain, field, getattr(plain, field.name))
    # An equal value that is not the default object is checked as any other.
    with pytest.raises(TypeError, match="tail_bytes"):
        SpawnOptions(argv=["true"], tail_bytes=float(plain.tail_bytes))  # type: ignore[arg-type]


def test_a_spawn_left_at_its_defaults_costs_a_call_per_field_to_check() -> None:
    # Counted in Python calls while the options are built (75 when every check ran in
    # full: a tenth of a spawn's Python work beyond subprocess.run's, in a cold cache;
    # 24 before the stall timeout, issue #46, added a field and its one skipped check).
    SpawnOptions(argv=["true"])
    calls = 0

    def profile(_frame: FrameType, event: str, _arg: object) -> None:
        nonlocal calls
        calls += event == "call"

    sys.setprofile(profile)
    try:
        SpawnOptions(argv=["true"])
    finally:
        sys.setprofile(None)
    assert calls <= 25, calls


def test_a_spawn_of_true_costs_a_bounded_count_of_execkits_own_python_calls() -> None:
    # Its Python work beyond subprocess.run's is most of what a short spawn costs over it
    # (benchmarks/bench_exec.py); counted in calls to execkit's own code (attrs' generated
    # __init__ included): 80 now under the default mechanism (79 before its tree was asked
    # for the child's environment, for a mark), 89 while a spawn's tree hashed itself in
    # Python, 114 while every argument was checked in full. When any other process on the
    # machine was created while the child ran (a busy CI host), its tree lists execkit's
    # children to learn that it left nothing: 85, which the bound allows.
    package = os.path.dirname(os.path.dirname(supervisor.__file__))
    spawn(["true"])
    calls = 0

    def profile(frame: FrameType, event: str, _arg: object) -> None:
        nonlocal calls
        name = frame.f_code.co_filename
        if event == "call" and (name.startswith(package) or name.startswith("<attrs")):
            calls += 1

    sys.setprofile(profile)
    try:
        assert spawn(["true"]).ok
    finally:
        sys.setprofile(None)
    assert calls <= 86, calls


def test_huge_finite_timeout_and_grace_are_honoured_not_overflowed() -> None:
    assert spawn(["true"], timeout=1e300).ok
    result = spawn(["sleep", "60"], timeout=0.3, kill_grace=1e300)
    assert result.timed_out and result.signal == signal.SIGTERM


@pytest.mark.parametrize(("max_chars", "error"), [(-1, InvalidInput), ("5", TypeError)])
def test_failure_text_names_a_bad_max_chars(max_chars: object, error: type[Exception]) -> None:
    with pytest.raises(error, match="max_chars"):
        spawn(["true"]).failure_text(max_chars)  # type: ignore[arg-type]


def test_an_error_after_the_child_started_still_kills_it(monkeypatch: pytest.MonkeyPatch) -> None:
    # Whatever fails between Popen and the end of supervision (here: no fd left while the
    # pipes are registered), the child leads its own session and must not be left running.
    started: list[subprocess.Popen[bytes]] = []
    real_popen = subprocess.Popen

    def recording_popen(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        proc = real_popen(*args, **kwargs)
        started.append(proc)
        return proc

    def no_fd_left(_self: object) -> None:
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(supervisor.Supervisor, "_register", no_fd_left)
    with pytest.raises(OSError, match="Too many open files"):
        spawn(["sleep", "60"], start=recording_popen)
    (proc,) = started
    assert proc.returncode == -signal.SIGKILL  # killed and reaped before the error surfaced
    assert proc.stdout is not None and proc.stdout.closed


def test_zero_kill_grace_is_allowed() -> None:
    result = spawn(fixture("ignore_term.py"), timeout=1.0, kill_grace=0)
    assert result.timed_out and result.signal == signal.SIGKILL


def test_result_contract_holds_for_each_outcome() -> None:
    outcomes = [
        spawn(["execkit-no-such-binary-xyz"]),
        spawn(["sh", "-c", "exit 4"]),
        spawn(["sh", "-c", "kill -TERM $$"]),
    ]
    for result in outcomes:
        assert isinstance(result, SpawnResult)
        set_fields = [result.spawn_errno, result.signal, result.exit_code]
        assert sum(v is not None for v in set_fields) == 1
        data = result.to_dict()
        assert data["argv"] == list(result.argv) and data["ok"] is result.ok


# ---------------------------------------------------------------------------------- memory


@pytest.mark.slow
def test_memory_stays_flat_for_hundreds_of_mib() -> None:
    me = psutil.Process()
    baseline = me.memory_info().rss
    peak = baseline
    done = threading.Event()

    def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, me.memory_info().rss)
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        result = spawn(["head", "-c", str(300 * 1024 * 1024), "/dev/zero"], timeout=300)
    finally:
        done.set()
        sampler.join(10)
    assert result.ok and result.stdout_bytes == 300 * 1024 * 1024
    # NUL bytes are binary output: counted in the tail, not kept as text.
    assert result.stdout_tail == "[binary output: 65536 bytes not kept]"
    # 300 MiB went through; the parent grew by well under 16 MiB (tails are 64 KiB).
    assert peak - baseline < 16 * 1024 * 1024, f"grew {(peak - baseline) >> 20} MiB"


def test_works_without_pidfd(monkeypatch: pytest.MonkeyPatch) -> None:
    # Old kernels have no pidfd_open: the loop must fall back to polling the child.
    def no_pidfd(_pid: int, _flags: int = 0) -> int:
        raise OSError(errno.ENOSYS, "pidfd_open not implemented")

    monkeypatch.setattr(os, "pidfd_open", no_pidfd)
    result = spawn(["sh", "-c", "echo out; echo err >&2; exit 6"])
    assert (result.exit_code, result.stdout_tail, result.stderr_tail) == (6, "out\n", "err\n")
    result = spawn(["sleep", "60"], timeout=0.3, kill_grace=5)
    assert result.timed_out and result.signal == signal.SIGTERM


def test_heartbeat_beats_while_the_child_lives_and_not_after(tmp_path: Path) -> None:
    # Counted against the rounds of the loop's poll, never timed: the child lives until it
    # has had three beats. Each beat comes while the child is still unreaped and after a
    # poll round: the first after the loop waited one interval, and never two in a row (a
    # loaded machine may skip beats, never add them).
    release = tmp_path / "release"
    script = f"import os, time\nwhile not os.path.exists({str(release)!r}): time.sleep(0.01)"
    started: list[subprocess.Popen[bytes]] = []
    events: list[str] = []

    def start(*args: Any, **kwargs: Any) -> subprocess.Popen[bytes]:
        proc: subprocess.Popen[bytes] = subprocess.Popen(*args, **kwargs)
        started.append(proc)
        return proc

    def beat() -> None:
        # Checked here, so that a loop that beats on without polling fails at once.
        (proc,) = started
        assert proc.returncode is None, "a beat after the child was reaped"
        assert events[-1:] == ["poll"], f"a beat without a poll round before it: {events}"
        events.append("beat")
        if events.count("beat") == 3:
            release.touch()

    poll_type = type(select.poll())

    def profile(_frame: object, event: str, arg: object) -> None:
        # A round of the loop: a call of `poll` on a poll object, in this thread.
        if (
            event == "c_call"
            and getattr(arg, "__name__", None) == "poll"
            and isinstance(getattr(arg, "__self__", None), poll_type)
        ):
            events.append("poll")

    sys.setprofile(profile)
    try:
        result = spawn([*PY, "-c", script], heartbeat=beat, heartbeat_s=0.05, start=start)
    finally:
        sys.setprofile(None)
    assert result.exit_code == 0
    assert events.count("beat") >= 3
    assert events.count("poll") > events.count("beat")


def test_a_quick_child_gets_no_heartbeat() -> None:
    beats: list[int] = []
    spawn(["true"], heartbeat=lambda: beats.append(1), heartbeat_s=30)
    assert beats == []


def test_a_failing_heartbeat_ends_the_tree_and_propagates(tmp_path: Path) -> None:
    marker = tmp_path / "pid"
    script = f"import os, time; open({str(marker)!r}, 'w').write(str(os.getpid())); time.sleep(60)"

    def lost() -> None:
        if marker.exists():
            raise LookupError("the run's lease is gone")

    with pytest.raises(LookupError, match="lease is gone"):
        spawn([sys.executable, "-c", script], heartbeat=lost, heartbeat_s=0.05, timeout=30)
    pid = int(marker.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@pytest.mark.parametrize(
    ("kwargs", "error"),
    [
        ({"heartbeat": "renew"}, TypeError),
        ({"heartbeat": print, "heartbeat_s": 0}, InvalidInput),
        ({"heartbeat": print, "heartbeat_s": -1}, InvalidInput),
        ({"heartbeat": print, "heartbeat_s": float("nan")}, InvalidInput),
    ],
)
def test_bad_heartbeat_arguments_are_refused_before_anything_runs(
    kwargs: dict[str, Any], error: type[Exception], tmp_path: Path
) -> None:
    marker = tmp_path / "ran"
    with pytest.raises(error, match="heartbeat"):
        spawn(["touch", str(marker)], **kwargs)
    assert not marker.exists()
