"""The exec wrapper: spawn a vendor CLI and keep every fact about how it ended.

`spawn` never raises for a process that could not be started: the errno is kept on the
result (`spawn_errno`), because it is the durable structural signal the classifier needs
(ADR 0046: ENOENT from a direct spawn is not the same as a shell exiting 127).

How it runs a real process: the `start` seam (`subprocess.Popen` unless the caller injects
another `ProcessStarter`, such as the `fake_vendor` fixture's) with the child leading its own
session, stdin from `input` or /dev/null, and one selector loop in the calling thread over
stdout, stderr, stdin and a pidfd for the child's exit. There is one supervision path, over
real file descriptors: a starter must hand back a real `subprocess.Popen`. Reads are fixed
64 KiB chunks into bounded tail buffers, so memory stays flat whatever the child prints.
Once the child is reaped the pipes are read for at most `_DRAIN_S` more: a descendant that
inherited them cannot keep `spawn` waiting.

`spawn_async` runs that same loop in a dedicated thread per call (not the default executor,
whose small pool would serialise concurrent agents). Cancelling the awaiting task wakes the
loop through a pipe; it SIGKILLs the whole process tree and reaps the child before the
`CancelledError` propagates.
"""

from __future__ import annotations

import contextlib
import enum
import errno
import os
import selectors
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias, cast

import attrs

from execkit._errors import InvalidInput
from execkit._json import to_json
from execkit._redact import (
    MIN_ENV_SECRET_LEN,
    redact,
    redact_argv,
    redact_tail,
    secret_env_values,
)
from execkit._tail import TailBuffer
from execkit._validate import integer_arg, is_integer, number_arg

if TYPE_CHECKING:
    import psutil

__all__ = [
    "MAX_TAIL_BYTES",
    "OutputCallback",
    "ProcessStarter",
    "SpawnFailure",
    "SpawnResult",
    "spawn",
    "spawn_async",
]

OutputCallback = Callable[[bytes], object]
"""Receives each raw chunk of a stream as it arrives (not redacted, not decoded)."""

ProcessStarter: TypeAlias = Callable[..., "subprocess.Popen[bytes]"]
"""How `spawn` starts a process: a callable with `subprocess.Popen`'s signature.

It is called as `start(argv_list, stdin=..., stdout=PIPE, stderr=PIPE, cwd=..., env=...,
start_new_session=True, bufsize=0)` and must return a started `subprocess.Popen[bytes]`
that honours those arguments (real pipes, its own session), or raise OSError when the
program could not be started (its errno, or its type for an OSError without one, becomes
`spawn_errno`). Anything else it raises propagates out of `spawn` unchanged.
"""

# The real class, for the type check of what a starter returns. In a tuple, not bound to a
# name of its own: while its fixture is active, pytest-subprocess (1.6) rebinds every
# module-level name bound to `subprocess.Popen` itself to its fake.
_POPEN_TYPES: tuple[type[subprocess.Popen[bytes]]] = (subprocess.Popen,)

_CUT = "…"
_CHUNK = 64 * 1024
_READS_PER_WAKE = 16
# After the child is reaped: how long pipes held open by a surviving descendant are still
# read before they are closed. Data the child itself wrote is already in the pipe by then.
_DRAIN_S = 0.5
# Where pidfd_open is unavailable the loop polls the child's exit this often.
_POLL_S = 0.05
# The longest single wait in the loop: a huge timeout or grace (1e300 s is finite and
# valid) would overflow the selector's clock, so long waits are taken in slices.
_MAX_WAIT_S = 3600.0
# Linux reads at most this much of a #! line.
_SHEBANG_MAX = 256
# Bytes kept from before each cut tail so a credential the cut sliced in two is still
# recognised: longer than any key shape, long enough for most bearer tokens.
_REDACT_CONTEXT = 4096
MAX_TAIL_BYTES = 256 * 1024 * 1024
"""The largest `tail_bytes` spawn accepts (each stream's tail is held in memory)."""

# A starter (a test's fake, a wrapper) may raise an OSError without an errno; the exception
# type still says which.
_ERRNO_BY_TYPE: tuple[tuple[type[OSError], int], ...] = (
    (FileNotFoundError, errno.ENOENT),
    (NotADirectoryError, errno.ENOTDIR),
    (IsADirectoryError, errno.EISDIR),
    (PermissionError, errno.EACCES),
)


def _keep_tail(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    if max_chars <= 1:
        return _CUT[:max_chars]
    return _CUT + text[-(max_chars - 1) :]


class SpawnFailure(enum.StrEnum):
    """Why a process never started, as a fact the classifier reads (never parsed from text)."""

    PROGRAM_NOT_FOUND = "program_not_found"  # ENOENT: no such program on PATH or at the path
    INTERPRETER_NOT_FOUND = "interpreter_not_found"  # ENOENT: its #! interpreter or loader
    CWD_NOT_FOUND = "cwd_not_found"  # the working directory does not exist
    CWD_NOT_DIRECTORY = "cwd_not_directory"  # the working directory is a file
    CWD_UNUSABLE = "cwd_unusable"  # the working directory exists but cannot be entered
    PERMISSION_DENIED = "permission_denied"  # EACCES: the program is not executable
    EXEC_FORMAT = "exec_format"  # ENOEXEC: not a program the kernel can run
    OTHER = "other"  # any other errno from the start


@attrs.frozen
class SpawnResult:
    """How one spawned process ended.

    Exactly one of these holds: `spawn_errno` is set (it never started; `exit_code`,
    `signal` and `pid` are None), `signal` is set (death by signal; `exit_code` is None),
    or `exit_code` is set. `timed_out` is independent: the process was killed (or asked to
    stop) because its timeout elapsed, whatever it then exited with. `argv`, the tails and
    `spawn_error` have credentials masked (`execkit._redact`). `spawn_failure` says, as a
    value, what `spawn_errno` meant for this start (a missing program or a missing working
    directory share ENOENT but name different preconditions).
    """

    argv: tuple[str, ...]
    pid: int | None
    exit_code: int | None
    signal: int | None
    spawn_errno: int | None
    spawn_error: str | None
    timed_out: bool
    duration_s: float
    stdout_tail: str
    stderr_tail: str
    stdout_bytes: int
    stderr_bytes: int
    stdout_truncated: bool
    stderr_truncated: bool
    spawn_failure: SpawnFailure | None = None

    @property
    def ok(self) -> bool:
        """True when the process started, was not timed out and exited 0."""
        return (
            self.spawn_errno is None
            and not self.timed_out
            and self.signal is None
            and self.exit_code == 0
        )

    def failure_text(self, max_chars: int = 500) -> str:
        """The spawn error, then stderr, then stdout, keeping the LAST `max_chars`.

        A stream whose tail was already cut at capture starts with `…`, and so does the
        joined text when `max_chars` cuts it. Raises TypeError when `max_chars` is not an
        int, `InvalidInput` when it is negative.
        """
        _int_arg("max_chars", max_chars, 0)
        parts: list[str] = []
        if self.spawn_error:
            parts.append(self.spawn_error)
        for tail, truncated in (
            (self.stderr_tail, self.stderr_truncated),
            (self.stdout_tail, self.stdout_truncated),
        ):
            body = tail.strip()
            if body:
                parts.append(_CUT + body if truncated else body)
        return _keep_tail("\n".join(parts), max_chars)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-safe mapping of every field plus `ok`."""
        return {**to_json(self), "ok": self.ok}


# --------------------------------------------------------------------------- validation


@attrs.frozen
class _Plan:
    """Validated arguments of one spawn."""

    argv: tuple[str, ...]
    cwd: str | None
    env: dict[str, str] | None
    input: bytes | None
    inherit_stdin: bool
    timeout: float | None
    kill_grace: float
    tail_bytes: int
    on_stdout: OutputCallback | None
    on_stderr: OutputCallback | None
    start: ProcessStarter


def _int_arg(name: str, value: object, low: int, high: int | None = None) -> int:
    """`integer_arg`, with a value that is no int at all a TypeError: a wrong type, not
    a value out of range, as every other argument of spawn reports it."""
    if not is_integer(value):
        raise TypeError(f"{name} must be an int, got {type(value).__name__}")
    return integer_arg(name, value, low, high)


def _check_argv(argv: object) -> tuple[str, ...]:
    if isinstance(argv, str | bytes):
        raise TypeError(
            "argv must be a list or tuple of str, not a single string "
            "(it is never re-split): pass [program, arg, ...]"
        )
    if not isinstance(argv, list | tuple):
        raise TypeError(f"argv must be a list or tuple of str, got {type(argv).__name__}")
    if not argv:
        raise InvalidInput("argv must not be empty: it needs at least the program to run")
    for index, item in enumerate(argv):
        if not isinstance(item, str):
            raise TypeError(f"argv[{index}] must be str, got {type(item).__name__}")
        if "\0" in item:
            raise InvalidInput(f"argv[{index}] must not contain a NUL character")
    if not argv[0]:
        raise InvalidInput("argv[0] must be a non-empty program name or path")
    return tuple(argv)


def _check_seconds(name: str, value: object, *, allow_zero: bool) -> float:
    # NaN and infinity are floats, so a bad value (InvalidInput), not a bad type.
    if not (is_integer(value) or isinstance(value, float)):
        raise TypeError(f"{name} must be a number of seconds, got {type(value).__name__}")
    return number_arg(name, value, allow_zero=allow_zero)


def _check_env(env: object) -> dict[str, str] | None:
    if env is None:
        return None
    if not isinstance(env, Mapping):
        raise TypeError(f"env must be a mapping of str to str, got {type(env).__name__}")
    checked: dict[str, str] = {}
    for name, value in env.items():
        if not isinstance(name, str) or not isinstance(value, str):
            raise TypeError(f"env must map str to str, got {name!r}: {type(value).__name__}")
        if not name or "=" in name or "\0" in name or "\0" in value:
            raise InvalidInput(
                f"env name {name!r} must be non-empty without '=' or NUL, and its value without NUL"
            )
        checked[name] = value
    return checked


def _plan(
    argv: object,
    cwd: object,
    env: object,
    input: object,
    inherit_stdin: object,
    timeout: object,
    kill_grace: object,
    tail_bytes: object,
    on_stdout: object,
    on_stderr: object,
    start: object,
) -> _Plan:
    checked_argv = _check_argv(argv)
    if cwd is not None and not isinstance(cwd, str | os.PathLike):
        raise TypeError(f"cwd must be a path or None, got {type(cwd).__name__}")
    checked_cwd = None if cwd is None else os.fsdecode(os.fspath(cwd))
    checked_env = _check_env(env)
    if input is None or isinstance(input, bytes):
        data = input
    elif isinstance(input, str):
        data = input.encode("utf-8")
    elif isinstance(input, bytearray | memoryview):
        data = bytes(input)
    else:
        raise TypeError(f"input must be str, bytes or None, got {type(input).__name__}")
    if not isinstance(inherit_stdin, bool):
        raise TypeError(f"inherit_stdin must be a bool, got {type(inherit_stdin).__name__}")
    if inherit_stdin and data is not None:
        raise InvalidInput(
            "input and inherit_stdin=True exclude each other: the child has one stdin"
        )
    checked_timeout = (
        None if timeout is None else _check_seconds("timeout", timeout, allow_zero=False)
    )
    checked_grace = _check_seconds("kill_grace", kill_grace, allow_zero=True)
    checked_tail = _int_arg("tail_bytes", tail_bytes, 1, MAX_TAIL_BYTES)
    for name, callback in (("on_stdout", on_stdout), ("on_stderr", on_stderr)):
        if callback is not None and not callable(callback):
            raise TypeError(f"{name} must be callable or None, got {type(callback).__name__}")
    if not callable(start):
        raise TypeError(
            f"start must be a callable like subprocess.Popen, got {type(start).__name__}"
        )
    return _Plan(
        argv=checked_argv,
        cwd=checked_cwd,
        env=checked_env,
        input=data,
        inherit_stdin=inherit_stdin,
        timeout=checked_timeout,
        kill_grace=checked_grace,
        tail_bytes=checked_tail,
        on_stdout=cast("OutputCallback | None", on_stdout),
        on_stderr=cast("OutputCallback | None", on_stderr),
        start=cast("ProcessStarter", start),
    )


# ------------------------------------------------------------------------ result building


def _errno_of(exc: OSError) -> int:
    if exc.errno is not None:
        return exc.errno
    for kind, code in _ERRNO_BY_TYPE:
        if isinstance(exc, kind):
            return code
    return errno.EIO


def _describe_spawn_error(plan: _Plan, exc: OSError, code: int) -> tuple[SpawnFailure, str]:
    """What failed at the start, as a value, and the sentence an operator reads."""
    cwd = plan.cwd
    filename = exc.filename if isinstance(exc.filename, str) else None
    # Popen reports a failed chdir with the directory as the filename; a cwd that is gone
    # now was the cause whatever the filename says.
    if (
        cwd is not None
        and code in (errno.ENOENT, errno.ENOTDIR, errno.EACCES)
        and (filename == cwd or not os.path.isdir(cwd))
    ):
        if not os.path.exists(cwd):
            return SpawnFailure.CWD_NOT_FOUND, f"working directory not found: {cwd}"
        if not os.path.isdir(cwd):
            return SpawnFailure.CWD_NOT_DIRECTORY, f"working directory is not a directory: {cwd}"
        return (
            SpawnFailure.CWD_UNUSABLE,
            f"working directory not usable: {cwd} ({os.strerror(code)})",
        )
    path = filename or plan.argv[0]
    if code == errno.ENOENT:
        return _describe_enoent(plan, path)
    if code == errno.EACCES:
        return SpawnFailure.PERMISSION_DENIED, f"permission denied: cannot execute {path}"
    if code == errno.ENOEXEC:
        return (
            SpawnFailure.EXEC_FORMAT,
            f"exec format error: {path} is not a runnable program",
        )
    return SpawnFailure.OTHER, f"could not start {path}: [Errno {code}] {os.strerror(code)}"


def _describe_enoent(plan: _Plan, path: str) -> tuple[SpawnFailure, str]:
    """ENOENT for a program that is there means exec could not find its #! interpreter."""
    found = shutil.which(path, path=os.pathsep.join(os.get_exec_path(plan.env)))
    if found is None:
        return SpawnFailure.PROGRAM_NOT_FOUND, f"executable not found: {path}"
    interpreter = None
    with contextlib.suppress(OSError), open(found, "rb") as script:
        first = script.readline(_SHEBANG_MAX)
        if first.startswith(b"#!"):
            words = first[2:].split()
            interpreter = os.fsdecode(words[0]) if words else None
    if interpreter is None:
        return (
            SpawnFailure.INTERPRETER_NOT_FOUND,
            f"cannot execute {found}: its loader or interpreter was not found (ENOENT)",
        )
    return (
        SpawnFailure.INTERPRETER_NOT_FOUND,
        f"interpreter not found: {interpreter} (the #! line of {found})",
    )


def _secrets_for(plan: _Plan, *texts: str) -> tuple[str, ...]:
    """Values of the child's secret-looking env vars, where any text could hold one.

    They are at least MIN_ENV_SECRET_LEN long, so shorter texts cannot; skipping the
    environment scan then is a measurable share of a short-lived child's spawn.
    """
    if all(len(text) < MIN_ENV_SECRET_LEN for text in texts):
        return ()
    return secret_env_values(os.environ if plan.env is None else plan.env)


def _not_started(plan: _Plan, exc: OSError, started: float) -> SpawnResult:
    code = _errno_of(exc)
    failure, error = _describe_spawn_error(plan, exc, code)
    secrets = _secrets_for(plan, error, *plan.argv)
    return SpawnResult(
        argv=redact_argv(plan.argv, secrets),
        pid=None,
        exit_code=None,
        signal=None,
        spawn_errno=code,
        spawn_error=redact(error, secrets),
        timed_out=False,
        duration_s=time.monotonic() - started,
        stdout_tail="",
        stderr_tail="",
        stdout_bytes=0,
        stderr_bytes=0,
        stdout_truncated=False,
        stderr_truncated=False,
        spawn_failure=failure,
    )


def _context_of(buffer: TailBuffer) -> str:
    """What came just before a cut tail (a credential may run across the cut); else ""."""
    if not buffer.truncated:
        return ""
    return buffer.context_bytes().decode("utf-8", errors="replace")


def _finished(
    plan: _Plan,
    pid: int,
    returncode: int,
    timed_out: bool,
    out: TailBuffer,
    err: TailBuffer,
    started: float,
) -> SpawnResult:
    stdout_tail, stderr_tail = out.text(), err.text()
    out_context, err_context = _context_of(out), _context_of(err)
    secrets = _secrets_for(plan, out_context + stdout_tail, err_context + stderr_tail, *plan.argv)
    return SpawnResult(
        argv=redact_argv(plan.argv, secrets),
        pid=pid,
        exit_code=returncode if returncode >= 0 else None,
        signal=-returncode if returncode < 0 else None,
        spawn_errno=None,
        spawn_error=None,
        timed_out=timed_out,
        duration_s=time.monotonic() - started,
        stdout_tail=redact_tail(stdout_tail, out_context, secrets),
        stderr_tail=redact_tail(stderr_tail, err_context, secrets),
        stdout_bytes=out.total,
        stderr_bytes=err.total,
        stdout_truncated=out.truncated,
        stderr_truncated=err.truncated,
    )


# --------------------------------------------------------------------- process-tree kill


def _snapshot_tree(pid: int) -> list[psutil.Process]:
    """Descendants of `pid` now, taken before signalling: once the child dies its
    children are re-parented and can no longer be found from it."""
    import psutil  # only a kill needs it: most spawns end on their own

    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


def _signal_tree(leader: int, tree: Sequence[psutil.Process], sig: int) -> None:
    """`sig` to the leader's process group, and to each descendant that left the group.

    Members still in the group are not signalled twice: some programs read a second
    SIGTERM as "stop right now".
    """
    if leader > 0:
        with contextlib.suppress(OSError):  # the group may already be gone
            os.killpg(leader, sig)
    if not tree:
        return
    import psutil

    for proc in tree:
        try:
            if os.getpgid(proc.pid) == leader:
                continue
            # psutil checks the process is still the one snapshotted (no pid reuse).
            proc.send_signal(sig)
        except (OSError, psutil.Error):
            pass


def _kill_now(proc: subprocess.Popen[bytes]) -> None:
    """Abnormal exit (cancel, callback error, KeyboardInterrupt): no grace, no leftovers."""
    tree = _snapshot_tree(proc.pid) if proc.returncode is None else []
    _signal_tree(proc.pid, tree, signal.SIGKILL)
    if proc.returncode is None:
        proc.wait()
    for stream in (proc.stdin, proc.stdout, proc.stderr):
        if stream is not None:
            with contextlib.suppress(OSError):
                stream.close()


class _Cancelled(Exception):
    """The awaiting task of `spawn_async` was cancelled; the tree has been killed."""


# ---------------------------------------------------------------------- the real process


class _Supervisor:
    """Runs one real child to its end: pumps the pipes, enforces the timeout, reaps."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        plan: _Plan,
        out: TailBuffer,
        err: TailBuffer,
        cancel_fd: int | None,
    ) -> None:
        self._proc = proc
        self._plan = plan
        self._sel = selectors.DefaultSelector()
        self._pidfd: int | None = None
        self._exited = False
        self._pending_input = memoryview(plan.input) if plan.input is not None else None
        assert proc.stdout is not None and proc.stderr is not None
        self._sinks: dict[int, tuple[TailBuffer, OutputCallback | None]] = {
            proc.stdout.fileno(): (out, plan.on_stdout),
            proc.stderr.fileno(): (err, plan.on_stderr),
        }
        self._cancel_fd = cancel_fd

    def run(self, started: float) -> tuple[int, bool]:
        """Return (returncode, timed_out). Closes every fd it holds, whatever happens;
        killing the tree on an exception is the caller's job (see `_spawn`)."""
        try:
            self._register()
            deadline = None if self._plan.timeout is None else started + self._plan.timeout
            timed_out = not self._pump(deadline)
            if timed_out:
                self._stop_tree()
            self._drain()
            returncode = self._proc.returncode
            assert returncode is not None
            return returncode, timed_out
        finally:
            self._close()

    def _register(self) -> None:
        for fd in self._sinks:
            os.set_blocking(fd, False)
            self._sel.register(fd, selectors.EVENT_READ)
        stdin = self._proc.stdin
        if stdin is not None:
            if self._pending_input:
                os.set_blocking(stdin.fileno(), False)
                self._sel.register(stdin.fileno(), selectors.EVENT_WRITE)
            else:
                self._close_stdin()
        try:
            self._pidfd = os.pidfd_open(self._proc.pid)
        except (AttributeError, OSError):
            self._pidfd = None  # old kernel: fall back to polling
        else:
            self._sel.register(self._pidfd, selectors.EVENT_READ)
        if self._cancel_fd is not None:
            self._sel.register(self._cancel_fd, selectors.EVENT_READ)

    def _child_exited(self) -> bool:
        if not self._exited and self._pidfd is None:
            self._exited = self._proc.poll() is not None
        return self._exited

    def _pump(self, until: float | None) -> bool:
        """Serve the pipes until the child exits (True) or `until` passes (False)."""
        while not self._child_exited():
            wait: float | None = None
            if until is not None:
                wait = until - time.monotonic()
                if wait <= 0:
                    return False
                wait = min(wait, _MAX_WAIT_S)
            if self._pidfd is None:
                wait = _POLL_S if wait is None else min(wait, _POLL_S)
            for key, _ in self._sel.select(wait):
                self._serve(key.fd)
        return True

    def _serve(self, fd: int) -> None:
        if fd == self._pidfd:
            self._sel.unregister(fd)
            self._proc.wait()
            self._exited = True
        elif fd in self._sinks:
            self._read(fd)
        elif fd == self._cancel_fd:
            raise _Cancelled
        else:
            self._write_input()

    def _read(self, fd: int) -> None:
        """Read while full chunks keep coming (the fd is non-blocking), at most
        `_READS_PER_WAKE` times, so a flood costs few selects yet cannot starve the timeout."""
        tail, callback = self._sinks[fd]
        for _ in range(_READS_PER_WAKE):
            try:
                chunk = os.read(fd, _CHUNK)
            except BlockingIOError:
                return
            if not chunk:
                self._sel.unregister(fd)
                del self._sinks[fd]
                return
            tail.feed(chunk)
            if callback is not None:
                callback(chunk)
            if len(chunk) < _CHUNK:
                return  # the pipe is empty for now

    def _write_input(self) -> None:
        stdin = self._proc.stdin
        data = self._pending_input
        if stdin is None or data is None:
            return  # closed earlier in this same batch of events
        try:
            written = os.write(stdin.fileno(), data[:_CHUNK])
        except BlockingIOError:
            return
        except OSError:
            # EPIPE: the child closed its stdin without reading everything. That is its
            # business; the exit status will tell.
            self._close_stdin()
            return
        self._pending_input = data[written:]
        if not self._pending_input:
            self._close_stdin()

    def _close_stdin(self) -> None:
        stdin = self._proc.stdin
        if stdin is None or stdin.closed:
            return
        with contextlib.suppress(KeyError, ValueError):  # registered only with input left
            self._sel.unregister(stdin.fileno())
        with contextlib.suppress(OSError):
            stdin.close()
        self._pending_input = None

    def _stop_tree(self) -> None:
        """The timeout elapsed: SIGTERM the tree, serve the pipes through the grace, SIGKILL."""
        pid = self._proc.pid
        tree = _snapshot_tree(pid)
        self._close_stdin()
        _signal_tree(pid, tree, signal.SIGTERM)
        self._pump(time.monotonic() + self._plan.kill_grace)
        # Catch descendants forked during the grace; once the child is gone its
        # orphans can only be found through the first snapshot.
        if not self._exited:
            known = {p.pid for p in tree}
            tree += [p for p in _snapshot_tree(pid) if p.pid not in known]
        _signal_tree(pid, tree, signal.SIGKILL)
        self._pump(None)

    def _drain(self) -> None:
        """Read what is left in the pipes, for at most `_DRAIN_S`."""
        self._close_stdin()  # nobody is left to read the rest of the input
        until = time.monotonic() + _DRAIN_S
        while self._sinks:
            wait = until - time.monotonic()
            if wait <= 0:
                return
            for key, _ in self._sel.select(wait):
                if key.fd in self._sinks:
                    self._read(key.fd)
                elif key.fd == self._cancel_fd:
                    raise _Cancelled

    def _close(self) -> None:
        self._sel.close()
        if self._pidfd is not None:
            os.close(self._pidfd)
        for stream in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


# ------------------------------------------------------------------------------- spawning


def _stdin_of(plan: _Plan) -> int | None:
    if plan.input is not None:
        return subprocess.PIPE
    return None if plan.inherit_stdin else subprocess.DEVNULL


def _check_popen(proc: object) -> subprocess.Popen[bytes]:
    """What the starter returned, if it is a real `subprocess.Popen`; else TypeError.

    Checked by type, never by probing for attributes: a stand-in without real file
    descriptors (pytest-subprocess's FakePopen) cannot be supervised, and a second code
    path for it would test something other than what runs in production.
    """
    if not isinstance(proc, _POPEN_TYPES):
        kind = type(proc)
        raise TypeError(
            "start must return a started subprocess.Popen with real pipes, got "
            f"{kind.__module__}.{kind.__qualname__}; to fake a vendor CLI in a test use the "
            "fake_vendor fixture and pass start=fake_vendor.start"
        )
    return proc


def _check_pipes(proc: subprocess.Popen[bytes], plan: _Plan) -> None:
    """TypeError for a started process without the pipes spawn asked its starter for."""
    missing_stdin = plan.input is not None and proc.stdin is None
    if proc.stdout is None or proc.stderr is None or missing_stdin:
        raise TypeError(
            "start must honour the stdin/stdout/stderr=PIPE that spawn passes: the process "
            f"it returned (pid {proc.pid}) lacks a pipe, so it was killed"
        )


def _spawn(plan: _Plan, cancel_fd: int | None = None) -> SpawnResult:
    out = TailBuffer(plan.tail_bytes, _REDACT_CONTEXT)
    err = TailBuffer(plan.tail_bytes, _REDACT_CONTEXT)
    started = time.monotonic()
    try:
        proc = plan.start(
            list(plan.argv),
            stdin=_stdin_of(plan),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=plan.cwd,
            env=plan.env,
            start_new_session=True,
            bufsize=0,
        )
    except OSError as exc:
        return _not_started(plan, exc, started)
    proc = _check_popen(proc)
    # From here on any exception (a callback's, KeyboardInterrupt, a signal handler's,
    # a cancel, a starter that ignored the pipes) must not leave the child's tree running:
    # it leads its own session, so nothing else would ever stop it.
    try:
        _check_pipes(proc, plan)
        returncode, timed_out = _Supervisor(proc, plan, out, err, cancel_fd).run(started)
    except BaseException:
        _kill_now(proc)
        raise
    return _finished(plan, proc.pid, returncode, timed_out, out, err, started)


def spawn(
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    input: str | bytes | None = None,
    inherit_stdin: bool = False,
    timeout: float | None = None,
    kill_grace: float = 5.0,
    tail_bytes: int = 65536,
    on_stdout: OutputCallback | None = None,
    on_stderr: OutputCallback | None = None,
    start: ProcessStarter = subprocess.Popen,
) -> SpawnResult:
    """Run `argv` directly (never through a shell) and report how it ended.

    - `env` replaces the environment (as with Popen); None inherits it. The child's stdin
      is `input` (str is UTF-8 encoded), or /dev/null so it never waits on a terminal or
      a pipe nobody closes. `inherit_stdin=True` hands it the caller's own stdin instead
      (a wrapper such as `execkit run`); spawn never reads it, so it cannot wait on it.
    - `timeout` (None or > 0 s): SIGTERM to the child's process group and to descendants
      that left it, `kill_grace` (>= 0 s) more, then SIGKILL; `timed_out` is then True
      whatever the child exited with.
    - Each stream keeps its last `tail_bytes` (1..256 MiB) bytes, decoded as UTF-8 with
      replacement and redacted; byte totals and `*_truncated` are exact.
    - `on_stdout`/`on_stderr` get every raw chunk live, unredacted, in the calling thread.
      If one raises, the process tree is SIGKILLed and the exception propagates.
    - `start` starts the process (see `ProcessStarter`); the default, the real
      `subprocess.Popen`, is bound when execkit is imported, so patching `subprocess.Popen`
      later does not reach spawn: a test injects its fake here (`fake_vendor.start`).
      An OSError it raises is a start failure like any other (`spawn_errno`); a return
      value that is not a `subprocess.Popen` raises TypeError, and so does one without the
      pipes asked for (after that process is killed); anything else it raises propagates.

    Never raises for a process that could not start (see `spawn_errno`). Raises TypeError
    or `InvalidInput` (a ValueError) naming the argument for bad arguments, before
    anything runs.
    """
    plan = _plan(
        argv,
        cwd,
        env,
        input,
        inherit_stdin,
        timeout,
        kill_grace,
        tail_bytes,
        on_stdout,
        on_stderr,
        start,
    )
    return _spawn(plan)


async def spawn_async(
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    input: str | bytes | None = None,
    inherit_stdin: bool = False,
    timeout: float | None = None,
    kill_grace: float = 5.0,
    tail_bytes: int = 65536,
    on_stdout: OutputCallback | None = None,
    on_stderr: OutputCallback | None = None,
    start: ProcessStarter = subprocess.Popen,
) -> SpawnResult:
    """`spawn` for asyncio runners: same arguments (`start` included), same result, same
    errors.

    The process is supervised in a dedicated thread, so the callbacks run in that thread
    (use `loop.call_soon_threadsafe` to touch loop state). Cancelling the awaiting task
    SIGKILLs the whole process tree and reaps the child before `CancelledError` propagates.
    """
    import asyncio  # only asyncio runners pay for importing it

    plan = _plan(
        argv,
        cwd,
        env,
        input,
        inherit_stdin,
        timeout,
        kill_grace,
        tail_bytes,
        on_stdout,
        on_stderr,
        start,
    )
    loop = asyncio.get_running_loop()
    future: asyncio.Future[SpawnResult] = loop.create_future()
    wake_read, wake_write = os.pipe()

    def deliver(result: SpawnResult | None, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            assert result is not None
            future.set_result(result)

    def work() -> None:
        result: SpawnResult | None = None
        error: BaseException | None = None
        try:
            result = _spawn(plan, cancel_fd=wake_read)
        except BaseException as exc:  # handed to the awaiting task, never lost
            error = exc
        finally:
            os.close(wake_read)
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
            loop.call_soon_threadsafe(deliver, result, error)

    try:
        threading.Thread(target=work, name=f"execkit-spawn:{plan.argv[0]}", daemon=True).start()
    except BaseException:  # no thread, so nobody else will close the worker's end
        os.close(wake_read)
        os.close(wake_write)
        raise
    try:
        return await asyncio.shield(future)
    except asyncio.CancelledError:
        with contextlib.suppress(OSError):  # the worker may have finished already
            os.write(wake_write, b"x")
        # Let the worker kill and reap the tree before the cancellation goes on.
        await asyncio.wait({future})
        if not future.cancelled():
            future.exception()  # retrieved: _Cancelled is the expected outcome here
        raise
    finally:
        os.close(wake_write)
