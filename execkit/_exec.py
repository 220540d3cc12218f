"""The exec wrapper: spawn a vendor CLI and keep every fact about how it ended.

`spawn` never raises for a process that could not be started: the errno is kept on the
result (`spawn_errno`), because it is the durable structural signal the classifier needs
(ADR 0046: ENOENT from a direct spawn is not the same as a shell exiting 127).

How it runs a real process: the `start` seam (`subprocess.Popen` unless the caller injects
another `ProcessStarter`, such as the `fake_vendor` fixture's) with the child leading its own
session, stdin from `input` or /dev/null, and one `poll` loop in the calling thread over
stdout, stderr, stdin and a pidfd for the child's exit. There is one supervision path, over
real file descriptors: a starter must hand back a real `subprocess.Popen`. A stream nobody
watches live is read by the kernel straight into its bounded tail (a ring, `_tail.py`);
a watched one in chunks of at most 64 KiB that are handed to the callback and the tail.
Memory stays flat whatever the child prints. Once the child is reaped the pipes are read
for at most `_DRAIN_S` more: a descendant that inherited them cannot keep `spawn` waiting.

No process left behind. Every spawn's tree is contained, with the strongest mechanism this
process has (`tree_mechanism()`; `SpawnResult.tree_mechanism` says what held each spawn):

- `cgroup` (a cgroup v2 this process may create cgroups in): at the first spawn execkit
  looks up its own cgroup (the `0::` line of /proc/self/cgroup, under the cgroup2 mount)
  and makes `execkit-<pid>-<hex>/` below it, with a small pool of per-spawn cgroups `s<N>`
  (made once, reused while empty; all removed at exit, and a dead execkit's left-overs at
  the next one's start). A child still running after `_CGROUP_AFTER_S` (50 ms) is moved
  into one, by a helper thread while the loop goes on, and what it made before that is
  found in /proc and moved in after it: from then on whatever it starts is born in the
  cgroup, however it daemonizes (double fork, setsid), and `cgroup.kill` (Linux 5.14+;
  before, a SIGKILL loop over `cgroup.procs`) ends it all at once. Not at once, because a
  move costs the kernel an RCU grace period unless another move came just before (here
  ~20 us back to back, 7-20 ms otherwise: a lone `spawn(["true"])` would take five to
  seven times as long), and Python cannot start a child straight into a cgroup (subprocess has no
  CLONE_INTO_CGROUP, glibc 2.36 no posix_spawnattr_setcgroup_np, and a `preexec_fn` is
  unsafe with threads and rules out vfork). Until the move, the child's tree is held as
  under `subreaper`, so a short command that leaves a daemon behind is covered too.
- `subreaper` (Linux without a writable cgroup): `prctl(PR_SET_CHILD_SUBREAPER)` on this
  process while a spawn that ends its leftovers runs, so orphans of the tree are
  re-parented to execkit instead of init and can be found in /proc (only the pids made
  since the child, while the pid counter cannot have gone round; none at all when the
  newest pid is still the child's) and killed. A process is a spawn's leftover when it is
  in the child's session or process group, was seen in its tree before, or - while that
  spawn is the only one running - was adopted by execkit after the child started and can
  be no other code's child: not in execkit's own session, and not a child a live
  `subprocess.Popen` owns (nor any new child while some Popen is still starting one).
  Killed leftovers are reaped by pid: `waitpid` on exactly those pids, only while /proc
  shows that very process dead and execkit's, never -1, never a child a Popen owns.
- `session` (neither): the child's session and process group, plus whatever a timeout's
  snapshot of its tree found (a daemon that left the session is out of reach).

When the child exits, whatever it left in its tree is SIGKILLed before `spawn` returns
(`keep_descendants=True` leaves them running, moved out of the spawn's cgroup into
execkit's own). A timeout, a cancel or an exception stops the whole tree either way.

`PR_SET_PDEATHSIG(SIGKILL)`, which has the kernel kill the child should execkit itself be
SIGKILLed, can only be set from inside the child: a `preexec_fn`, which makes Popen fork a
copy of this whole process instead of vfork (2.9 ms instead of 0.27 ms per start for a
30 MB process here, growing with its memory) and may deadlock where another thread holds
a lock at the fork. So only a spawn asking for it gets it (`spawn_cancellable(...,
die_with_parent=True)`, which `execkit run` does), and only with the default starter and
a single-threaded process (/proc/self/task has one entry: no other thread can hold a lock
across the fork, which is what makes a `preexec_fn` unsafe).

`spawn_async` runs that same loop in a dedicated thread per call (not the default executor,
whose small pool would serialise concurrent agents). Cancelling the awaiting task wakes the
loop through a pipe; it SIGKILLs the whole process tree and reaps the child before the
`CancelledError` propagates.
"""

from __future__ import annotations

import atexit
import contextlib
import enum
import errno
import fcntl
import functools
import os
import re
import select
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, NamedTuple, TypeAlias, cast

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
from execkit._tail import KeptText, TailBuffer
from execkit._validate import integer_arg, is_integer, number_arg

__all__ = [
    "BINARY_NOTICE",
    "DEFAULT_HEARTBEAT_S",
    "MAX_TAIL_BYTES",
    "TREE_MECHANISMS",
    "OutputCallback",
    "ProcessStarter",
    "SpawnFailure",
    "SpawnResult",
    "TreeMechanism",
    "spawn",
    "spawn_async",
    "tree_mechanism",
]

DEFAULT_HEARTBEAT_S = 60.0
"""How often `spawn` calls its `heartbeat` by default: well inside the ledger's shortest
default lease (300 s), so two missed beats still leave the run its lease."""

OutputCallback = Callable[[bytes], object]
"""Receives each raw chunk of a stream as it arrives (not redacted, not decoded)."""

ProcessStarter: TypeAlias = Callable[..., "subprocess.Popen[bytes]"]
"""How `spawn` starts a process: a callable with `subprocess.Popen`'s signature.

It is called as `start(argv_list, stdin=..., stdout=PIPE, stderr=PIPE, cwd=..., env=...,
start_new_session=True, bufsize=0)` and must return a started `subprocess.Popen[bytes]`
that honours those arguments (real pipes, its own session), or raise OSError when the
program could not be started (its errno, or its type for an OSError without one, becomes
`spawn_errno`). Anything else it raises propagates out of `spawn` unchanged. (Only the
default starter, the real `subprocess.Popen`, is ever also given a `preexec_fn`: see
PR_SET_PDEATHSIG in the module docstring.)
"""

# The real class, for the type check of what a starter returns. In a tuple, not bound to a
# name of its own: while its fixture is active, pytest-subprocess (1.6) rebinds every
# module-level name bound to `subprocess.Popen` itself to its fake.
_POPEN_TYPES: tuple[type[subprocess.Popen[bytes]]] = (subprocess.Popen,)

_CUT = "…"
BINARY_NOTICE = "[binary output: {} bytes not kept]"
"""Where a tail's binary output was dropped (`TailBuffer.kept`), with its byte count."""
_CHUNK = 64 * 1024
# After the child is reaped: how long pipes held open by a surviving descendant are still
# read before they are closed. Data the child itself wrote is already in the pipe by then.
_DRAIN_S = 0.5
# Where pidfd_open is unavailable the loop polls the child's exit this often.
_POLL_S = 0.05
# The longest single wait in the loop: a huge timeout or grace (1e300 s is finite and
# valid) would overflow the poll clock, so long waits are taken in slices.
_MAX_WAIT_S = 3600.0
# Linux reads at most this much of a #! line.
_SHEBANG_MAX = 256
# Bytes kept from before each cut tail so a credential the cut sliced in two is still
# recognised: longer than any key shape, long enough for most bearer tokens.
_REDACT_CONTEXT = 4096
MAX_TAIL_BYTES = 256 * 1024 * 1024
"""The largest `tail_bytes` spawn accepts (each stream's tail is held in memory)."""

# How long ending a tree may wait for killed processes to go (a process in uninterruptible
# sleep can take a while to act on SIGKILL; spawn returns regardless after this).
_KILL_WAIT_S = 5.0
# Rounds of find-and-kill for leftovers that keep forking while they are being killed.
_SWEEP_ROUNDS = 8
# Idle per-spawn cgroups kept for reuse.
_POOL_MAX = 8
# A child still running this long after its start is moved into a cgroup of its own (see
# `_CgroupTree` for why not at once).
_CGROUP_AFTER_S = 0.05
# The pid range allocated since a child started is trusted for a scan of /proc only while
# the pid counter cannot have gone round (assuming no more than this many forks a second).
_FORKS_PER_S_BOUND = 100_000

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37

_POLLIN = select.POLLIN
_POLL_READ = select.POLLIN | select.POLLHUP | select.POLLERR

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


class TreeMechanism(enum.StrEnum):
    """How a spawn's process tree was contained (module docstring), strongest first."""

    CGROUP = "cgroup"  # a cgroup v2 of its own (from 50 ms on); cgroup.kill ends it all
    SUBREAPER = "subreaper"  # orphans re-parented to execkit (PR_SET_CHILD_SUBREAPER)
    SESSION = "session"  # the child's session and process group, and tree snapshots


TREE_MECHANISMS: tuple[TreeMechanism, ...] = tuple(TreeMechanism)
"""Every mechanism, strongest first."""


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
    directory share ENOENT but name different preconditions). `tree_mechanism` says how
    its process tree was contained (None when it never started).
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
    tree_mechanism: TreeMechanism | None = None

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
    keep_descendants: bool = False
    # PR_SET_PDEATHSIG(SIGKILL) on the child, through a preexec_fn (`_SubreaperTree`).
    die_with_parent: bool = False
    heartbeat: Callable[[], object] | None = None
    heartbeat_s: float = DEFAULT_HEARTBEAT_S


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
    keep_descendants: object = False,
    die_with_parent: bool = False,
    heartbeat: object = None,
    heartbeat_s: object = None,
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
    if not isinstance(keep_descendants, bool):
        raise TypeError(f"keep_descendants must be a bool, got {type(keep_descendants).__name__}")
    if heartbeat is not None and not callable(heartbeat):
        raise TypeError(f"heartbeat must be callable or None, got {type(heartbeat).__name__}")
    every = (
        DEFAULT_HEARTBEAT_S
        if heartbeat_s is None
        else _check_seconds("heartbeat_s", heartbeat_s, allow_zero=False)
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
        keep_descendants=keep_descendants,
        die_with_parent=die_with_parent,
        heartbeat=cast("Callable[[], object] | None", heartbeat),
        heartbeat_s=every,
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


# One remembered scan per source of environment: the environment rarely changes between
# spawns, and a scan reads (and decodes) every name. Each slot holds (the contents the scan
# was made from, its result); a hit is a dict comparison, done in C.
_ENVIRON_SECRETS: list[tuple[dict[bytes, bytes], tuple[str, ...]]] = []
_GIVEN_SECRETS: list[tuple[dict[str, str], tuple[str, ...]]] = []


def _environ_secrets() -> tuple[str, ...]:
    """`secret_env_values(os.environ)`, recomputed only when the environment changed."""
    data = getattr(os.environ, "_data", None)  # CPython's encoded copy: cheap to compare
    if not isinstance(data, dict):
        return secret_env_values(os.environ)
    slot = _ENVIRON_SECRETS[:1]
    with contextlib.suppress(RuntimeError):  # another thread changed it mid-comparison
        if slot and slot[0][0] == data:
            return slot[0][1]
    contents = dict(data)
    decoded = {os.fsdecode(name): os.fsdecode(value) for name, value in contents.items()}
    secrets = secret_env_values(decoded)
    _ENVIRON_SECRETS[:] = [(contents, secrets)]
    return secrets


def _given_secrets(env: dict[str, str]) -> tuple[str, ...]:
    """`secret_env_values(env)` for an `env` argument (a private copy spawn made)."""
    slot = _GIVEN_SECRETS[:1]
    if slot and slot[0][0] == env:
        return slot[0][1]
    secrets = secret_env_values(env)
    _GIVEN_SECRETS[:] = [(env, secrets)]
    return secrets


# A command line is often spawned again as it was (the same check, the same vendor call):
# its redaction is then looked up instead of done. Only short ones are remembered.
_ARGV_CACHE_CHARS = 4096


@functools.lru_cache(maxsize=256)
def _remembered_argv(argv: tuple[str, ...], secrets: tuple[str, ...]) -> tuple[str, ...]:
    return redact_argv(argv, secrets)


def _redacted_argv(argv: tuple[str, ...], secrets: tuple[str, ...]) -> tuple[str, ...]:
    """`redact_argv(argv, secrets)`, remembered for short command lines."""
    if sum(map(len, argv)) + sum(map(len, secrets)) <= _ARGV_CACHE_CHARS:
        return _remembered_argv(argv, secrets)
    return redact_argv(argv, secrets)


def _secrets_for(plan: _Plan, longest: int) -> tuple[str, ...]:
    """Values of the child's secret-looking env vars, where a text `longest` characters
    long could hold one.

    They are at least MIN_ENV_SECRET_LEN long, so shorter texts cannot; skipping the
    environment then is a measurable share of a short-lived child's spawn.
    """
    if longest < MIN_ENV_SECRET_LEN:
        return ()
    return _environ_secrets() if plan.env is None else _given_secrets(plan.env)


def _not_started(plan: _Plan, exc: OSError, started: float) -> SpawnResult:
    code = _errno_of(exc)
    failure, error = _describe_spawn_error(plan, exc, code)
    secrets = _secrets_for(plan, max(len(error), *map(len, plan.argv)))
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


def _stored_tail(kept: KeptText, secrets: tuple[str, ...]) -> str:
    """A stream's tail as a result holds it: redacted, binary output dropped (see
    `TailBuffer.kept`) and counted in a notice where it was."""
    text, context, binary_bytes = kept
    if text or context:  # else nothing to mask: the redactor is not worth a call
        text = redact_tail(text, context, secrets)
    return BINARY_NOTICE.format(binary_bytes) + text if binary_bytes else text


def _finished(
    plan: _Plan,
    pid: int,
    returncode: int,
    timed_out: bool,
    out: TailBuffer,
    err: TailBuffer,
    started: float,
    mechanism: TreeMechanism,
) -> SpawnResult:
    out_kept, err_kept = out.kept(), err.kept()
    longest = max(
        len(out_kept.text) + len(out_kept.context),
        len(err_kept.text) + len(err_kept.context),
        *map(len, plan.argv),
    )
    secrets = _secrets_for(plan, longest)
    return SpawnResult(
        argv=_redacted_argv(plan.argv, secrets),
        pid=pid,
        exit_code=returncode if returncode >= 0 else None,
        signal=-returncode if returncode < 0 else None,
        spawn_errno=None,
        spawn_error=None,
        timed_out=timed_out,
        duration_s=time.monotonic() - started,
        stdout_tail=_stored_tail(out_kept, secrets),
        stderr_tail=_stored_tail(err_kept, secrets),
        stdout_bytes=out.total,
        stderr_bytes=err.total,
        stdout_truncated=out.truncated,
        stderr_truncated=err.truncated,
        tree_mechanism=mechanism,
    )


def _post_exit_seconds(data: bytes, tail_bytes: int | None = None) -> float:
    """The seconds the work `spawn` does after its child exits takes when the child wrote
    `data` and the last `tail_bytes` of it are kept (all by default; fewer cut the tail,
    with context before it): what benchmarks/bench_exec.py and tests/test_exec_tree.py
    measure."""
    size = max(1, len(data) if tail_bytes is None else tail_bytes)
    plan = _plan(["true"], None, None, None, False, None, 5.0, size, None, None, _POPEN_TYPES[0])
    out = TailBuffer(plan.tail_bytes, _REDACT_CONTEXT)
    err = TailBuffer(plan.tail_bytes, _REDACT_CONTEXT)
    out.feed(data)
    begin = time.perf_counter()
    _finished(plan, 1, 0, False, out, err, begin, TreeMechanism.SESSION)
    return time.perf_counter() - begin


# ------------------------------------------------------------------------ process table


class _Proc(NamedTuple):
    """One process as /proc (or psutil) showed it."""

    pid: int
    ppid: int
    pgrp: int
    sid: int
    start: float  # when it started: with the pid, the identity of a process (no pid reuse)
    zombie: bool


def _read_stat(pid: int) -> _Proc | None:
    """`pid` from /proc/PID/stat, or None when it is gone (or there is no /proc)."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        data = os.read(fd, 4096)
    except OSError:
        return None
    finally:
        os.close(fd)
    # The command name (in parentheses) may hold anything, spaces and ")" included.
    fields = data[data.rfind(b")") + 2 :].split()
    try:
        return _Proc(
            pid,
            int(fields[1]),
            int(fields[2]),
            int(fields[3]),
            int(fields[19]),
            fields[0] in (b"Z", b"X"),
        )
    except (IndexError, ValueError):
        return None


def _read_int(path: str) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return int(os.read(fd, 64).split()[0])
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError):
        return None


_LAST_PID_FD: list[int] = []  # /proc/sys/kernel/ns_last_pid, kept open (-1: unreadable)
_LAST_PID_LOCK = threading.Lock()


def _created_since(pid: int) -> bool:
    """Whether any process was created after process `pid` (True where it cannot be told).

    One `pread`: while the newest pid is still `pid`, nothing was made since, so the
    process `pid` has no descendant at all.
    """
    if not _LAST_PID_FD:
        with _LAST_PID_LOCK:
            if not _LAST_PID_FD:
                try:
                    fd = os.open("/proc/sys/kernel/ns_last_pid", os.O_RDONLY | os.O_CLOEXEC)
                except OSError:
                    fd = -1
                _LAST_PID_FD.append(fd)
    fd = _LAST_PID_FD[0]
    if fd < 0:
        return True
    try:
        return int(os.pread(fd, 32, 0)) != pid
    except (OSError, ValueError):
        return True


def _own_children() -> set[int] | None:
    """This process's children (of every thread), or None where the kernel does not list
    them (no CONFIG_PROC_CHILDREN)."""
    if not os.path.exists(f"/proc/self/task/{threading.get_native_id()}/children"):
        return None
    found: set[int] = set()
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return None
    for tid in tids:
        try:
            fd = os.open(f"/proc/self/task/{tid}/children", os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            continue  # that thread just ended; its children went to another one
        except OSError:
            return None
        try:
            found.update(int(pid) for pid in os.read(fd, 1 << 20).split())
        except (OSError, ValueError):
            return None
        finally:
            os.close(fd)
    return found


def _table(since: int | None = None, age_s: float = 0.0) -> dict[int, _Proc]:
    """Every process now, by pid.

    With `since` (a child's pid) and `age_s` (how long ago it started), only the pids
    allocated from `since` on are read, where the pid counter cannot have gone round
    since: any descendant of that child was created after it.
    """
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return _psutil_table()
    if since is not None:
        last = _read_int("/proc/sys/kernel/ns_last_pid")
        pid_max = _read_int("/proc/sys/kernel/pid_max")
        if last is not None and pid_max and age_s * _FORKS_PER_S_BOUND < pid_max / 2:
            if since <= last:
                pids = [pid for pid in pids if since <= pid <= last]
            else:  # the counter wrapped once since the child
                pids = [pid for pid in pids if pid >= since or pid <= last]
    table: dict[int, _Proc] = {}
    for pid in pids:
        entry = _read_stat(pid)
        if entry is not None:
            table[pid] = entry
    return table


def _psutil_table() -> dict[int, _Proc]:
    """`_table` where there is no /proc to read (not Linux)."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a dependency
        return {}
    table: dict[int, _Proc] = {}
    for proc in psutil.process_iter(["ppid", "status", "create_time"]):
        info = proc.info
        try:
            pgrp, sid = os.getpgid(proc.pid), os.getsid(proc.pid)
        except OSError:
            continue
        zombie = info["status"] == psutil.STATUS_ZOMBIE
        table[proc.pid] = _Proc(
            proc.pid, info["ppid"] or 0, pgrp, sid, info["create_time"] or 0.0, zombie
        )
    return table


def _descendants(table: Mapping[int, _Proc], roots: Iterable[int]) -> set[int]:
    """Every process below `roots` in `table` (the roots themselves not included)."""
    children: dict[int, list[int]] = {}
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found: set[int] = set()
    stack = list(roots)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


def _pidfd_of(proc: _Proc) -> int | None:
    """A pidfd for `proc` if it is still that process (same start), else None.

    Raises AttributeError where there are no pidfds (the caller falls back to kill).
    """
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:
        return None  # gone
    now = _read_stat(proc.pid)
    if now is None or now.start != proc.start:
        os.close(fd)  # the pid now names another process
        return None
    return fd


def _send(proc: _Proc, sig: int) -> None:
    """`sig` to `proc`, if it is still that process."""
    try:
        fd = _pidfd_of(proc)
    except AttributeError:
        now = _read_stat(proc.pid)
        if now is None or now.start == proc.start:
            with contextlib.suppress(OSError):
                os.kill(proc.pid, sig)
        return
    if fd is None:
        return
    try:
        signal.pidfd_send_signal(fd, sig)
    except OSError:
        pass
    finally:
        os.close(fd)


def _kill_and_wait(procs: Sequence[_Proc], until: float) -> None:
    """SIGKILL each of `procs` that is still itself, and wait (to `until`) until they die."""
    fds: list[int] = []
    try:
        for proc in procs:
            try:
                fd = _pidfd_of(proc)
            except AttributeError:  # no pidfds: signal now, then watch /proc
                _send(proc, signal.SIGKILL)
                continue
            if fd is not None:
                fds.append(fd)
                with contextlib.suppress(OSError):
                    signal.pidfd_send_signal(fd, signal.SIGKILL)
        if not fds:
            _wait_stat_gone(procs, until)
            return
        poller = select.poll()
        for fd in fds:
            poller.register(fd, _POLLIN)
        pending = len(fds)
        while pending and (wait := until - time.monotonic()) > 0:
            for fd, _ in poller.poll(wait * 1000):
                poller.unregister(fd)
                pending -= 1
    finally:
        for fd in fds:
            os.close(fd)


def _wait_stat_gone(procs: Sequence[_Proc], until: float) -> None:
    while time.monotonic() < until:
        alive = [p for p in procs if (now := _read_stat(p.pid)) is not None and not now.zombie]
        if not alive:
            return
        time.sleep(0.01)


def _killpg(pgid: int, sig: int) -> None:
    if pgid > 0:
        with contextlib.suppress(OSError):  # the group may already be gone
            os.killpg(pgid, sig)


def _reap(procs: Iterable[tuple[int, float]]) -> None:
    """Reap each (pid, start) that is now a zombie child of execkit's (an adopted orphan):
    `waitpid` on exactly that pid, never -1, and only while /proc shows the very process
    (same start) dead, so a pid reused by a child some Popen owns is never touched."""
    for pid, start in procs:
        now = _read_stat(pid)
        if now is not None and now.start == start and now.zombie and now.ppid == os.getpid():
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)


def _popen_owned() -> set[int] | None:
    """Pids a live `subprocess.Popen` (or multiprocessing's) is waiting for: another part
    of this program's children, never to be taken for a spawn's leftovers. None while one
    of them is being started (its child may exist before its pid is known)."""
    import gc

    kinds: list[type] = [_POPEN_TYPES[0]]
    forked = sys.modules.get("multiprocessing.popen_fork")
    if forked is not None:
        kinds.append(forked.Popen)
    owners = tuple(kinds)
    owned: set[int] = set()
    for obj in gc.get_objects():
        if isinstance(obj, owners) and getattr(obj, "returncode", 0) is None:
            pid = getattr(obj, "pid", None)
            if not isinstance(pid, int):
                return None
            owned.add(pid)
    return owned


def _single_threaded() -> bool:
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False


# ------------------------------------------------------------------- containing the tree


class _Tree:
    """A spawn's process tree under the `session` mechanism; the base of the others.

    The calls come in this order: `starter` (before the start), `adopt` (right after it),
    then any of `signal`/`kill` (a timeout, a cancel), `child_exited` (the child is a
    zombie: its pid, session and group cannot be reused until it is reaped, which the
    caller does next), and `release` (always, last).
    """

    def __init__(self) -> None:
        self.mechanism = TreeMechanism.SESSION
        self.pid = 0
        self._born = 0.0
        self._seen: dict[int, float] = {}  # pid -> start of every process seen in the tree
        # When the supervisor should call `settle` (monotonic seconds), if ever.
        self.settle_at: float | None = None

    def starter(self, plan: _Plan) -> tuple[ProcessStarter, dict[str, Any]]:
        """What to start the child with: a starter and arguments to add to its call."""
        return plan.start, {}

    def adopt(self, proc: subprocess.Popen[bytes]) -> _Tree:
        """Take the started child in; returns the tree that now holds it."""
        self.pid = proc.pid
        self._born = time.monotonic()
        return self

    def _claims(self, proc: _Proc, child: _Proc | None) -> bool:
        return (
            proc.sid == self.pid or proc.pgrp == self.pid or self._seen.get(proc.pid) == proc.start
        )

    def snapshot(self) -> list[_Proc]:
        """The tree now, the child left out: its descendants, and the processes this spawn
        claims with theirs. Remembered, so an orphan seen once is still found later."""
        table = _table(self.pid, time.monotonic() - self._born)
        child = table.get(self.pid)
        roots = [p.pid for p in table.values() if p.pid != self.pid and self._claims(p, child)]
        found = set(roots) | _descendants(table, [self.pid, *roots])
        found -= {self.pid, os.getpid()}
        procs = [table[pid] for pid in found]
        for proc in procs:
            self._seen[proc.pid] = proc.start
        return procs

    def signal(self, sig: int) -> None:
        """`sig` to the child's process group and to each process of the tree that left it.

        Members still in the group are not signalled twice: some programs read a second
        SIGTERM as "stop right now".
        """
        # The snapshot first: once the child dies, its children are re-parented and can no
        # longer be found from it.
        tree = self.snapshot()
        _killpg(self.pid, sig)
        for proc in tree:
            if proc.pgrp != self.pid and not proc.zombie:
                _send(proc, sig)

    def kill(self) -> None:
        """SIGKILL the whole tree, the child included."""
        self.signal(signal.SIGKILL)

    def settle(self) -> None:
        """The child is still running at `settle_at`."""
        self.settle_at = None

    def child_exited(self, keep: bool) -> None:
        """The child has exited (not reaped): end what it left, unless `keep`."""
        if keep:
            return
        _killpg(self.pid, signal.SIGKILL)
        if self._seen:  # a timeout's snapshot found descendants that may have left the group
            leftovers = [p for p in self.snapshot() if not p.zombie]
            _kill_and_wait(leftovers, time.monotonic() + _KILL_WAIT_S)

    def release(self) -> None:
        pass


class _Cgroup:
    """One per-spawn cgroup, its `cgroup.procs` and `cgroup.events` kept open."""

    __slots__ = ("_events", "_procs", "path")

    def __init__(self, path: str) -> None:
        os.mkdir(path)
        self.path = path
        self._procs = self._events = -1
        try:
            self._procs = os.open(f"{path}/cgroup.procs", os.O_WRONLY | os.O_CLOEXEC)
            self._events = os.open(f"{path}/cgroup.events", os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self.remove()
            raise

    def add(self, pid: int) -> None:
        os.write(self._procs, b"%d" % pid)

    def populated(self) -> bool:
        try:
            return b"populated 1" in os.pread(self._events, 256, 0)
        except OSError:
            return False

    def members(self) -> list[int]:
        try:
            with open(f"{self.path}/cgroup.procs", "rb") as procs:
                return [int(pid) for pid in procs.read().split()]
        except (OSError, ValueError):
            return []

    def kill(self, has_kill: bool) -> None:
        """SIGKILL everything in it: `cgroup.kill` where the kernel has it (it deals with
        concurrent forks), else one SIGKILL round over `cgroup.procs` (`wait_empty` repeats
        it)."""
        if has_kill:
            try:
                fd = os.open(f"{self.path}/cgroup.kill", os.O_WRONLY | os.O_CLOEXEC)
                try:
                    os.write(fd, b"1")
                finally:
                    os.close(fd)
                return
            except OSError:
                pass
        for pid in self.members():
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)

    def wait_empty(self, until: float, has_kill: bool) -> bool:
        """Whether everything in it is gone by `until` (cgroup.events says when)."""
        poller = select.poll()
        poller.register(self._events, select.POLLPRI)
        while self.populated():
            wait = until - time.monotonic()
            if wait <= 0:
                return False
            poller.poll(min(wait, 0.05) * 1000)
            if not has_kill:
                self.kill(False)  # members forked since the last round
        return True

    def evict(self, procs_file: str) -> None:
        """Move everything in it to the cgroup whose `cgroup.procs` is `procs_file`."""
        for _ in range(_SWEEP_ROUNDS):  # a member may fork while the others move
            members = self.members()
            if not members:
                return
            try:
                fd = os.open(procs_file, os.O_WRONLY | os.O_CLOEXEC)
            except OSError:
                return
            try:
                for pid in members:
                    with contextlib.suppress(OSError):
                        os.write(fd, b"%d" % pid)
            finally:
                os.close(fd)

    def sweep_children(self) -> None:
        """Remove cgroups made below it (by an execkit that ran inside it and was killed)."""
        with contextlib.suppress(OSError):
            for root, dirs, _files in os.walk(self.path, topdown=False):
                for name in dirs:
                    with contextlib.suppress(OSError):
                        os.rmdir(os.path.join(root, name))

    def close(self) -> None:
        for fd in (self._procs, self._events):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        self._procs = self._events = -1

    def remove(self) -> None:
        self.close()
        self.sweep_children()
        with contextlib.suppress(OSError):
            os.rmdir(self.path)


_HOME_NAME = re.compile(r"execkit-(\d+)-[0-9a-f]+\Z")


def _own_cgroup() -> str | None:
    """This process's cgroup v2 directory, or None (no cgroup v2, or not mounted here)."""
    try:
        with open("/proc/self/cgroup", encoding="utf-8", errors="surrogateescape") as file:
            relative = next(
                (line[3:].rstrip("\n") for line in file if line.startswith("0::")), None
            )
        if relative is None:
            return None
        with open("/proc/self/mountinfo", encoding="utf-8", errors="surrogateescape") as file:
            mounts = file.read().splitlines()
    except OSError:
        return None
    for line in mounts:
        left, dash, right = line.partition(" - ")
        fields = left.split()
        if not dash or not right.startswith("cgroup2 ") or len(fields) < 5:
            continue
        root, point = _unescape(fields[3]), _unescape(fields[4])
        if root != "/" and relative != root and not relative.startswith(root + "/"):
            continue
        inside = relative if root == "/" else relative[len(root) :]
        path = os.path.normpath(point + "/" + inside.lstrip("/"))
        if os.path.isfile(f"{path}/cgroup.procs"):
            return path
    return None


def _unescape(field: str) -> str:
    """A mountinfo field with its octal escapes (a space is `\\040`) undone."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True


class _CgroupHome:
    """This process's `execkit-<pid>-<hex>/` cgroup and its pool of per-spawn cgroups."""

    def __init__(self, own: str, parent: str, first: _Cgroup, has_kill: bool) -> None:
        self.own_procs = f"{own}/cgroup.procs"
        self.parent = parent
        self.has_kill = has_kill
        self.broken = False  # a move into one of its cgroups failed: use another mechanism
        self._lock = threading.Lock()
        self._idle = [first]
        self._abandoned: list[str] = []
        self._next = 1
        self._owner = os.getpid()

    @classmethod
    def create(cls) -> _CgroupHome | None:
        own = _own_cgroup()
        if own is None:
            return None
        cls._sweep_stale(own)
        parent = f"{own}/execkit-{os.getpid()}-{os.urandom(4).hex()}"
        try:
            os.mkdir(parent)
        except OSError:
            return None  # not ours to write: a read-only mount, another user's cgroup
        try:
            first = _Cgroup(f"{parent}/s0")
        except OSError:
            with contextlib.suppress(OSError):
                os.rmdir(parent)
            return None
        home = cls(own, parent, first, os.path.exists(f"{first.path}/cgroup.kill"))
        atexit.register(home.cleanup)
        return home

    @staticmethod
    def _sweep_stale(own: str) -> None:
        """Remove the homes of execkit processes that died without cleaning up."""
        with contextlib.suppress(OSError), os.scandir(own) as entries:
            for entry in entries:
                match = _HOME_NAME.match(entry.name)
                if match and not _alive(int(match.group(1))) and entry.is_dir():
                    for root, dirs, _files in os.walk(entry.path, topdown=False):
                        for name in dirs:
                            with contextlib.suppress(OSError):
                                os.rmdir(os.path.join(root, name))
                    with contextlib.suppress(OSError):
                        os.rmdir(entry.path)

    def acquire(self) -> _Cgroup:
        with self._lock:
            if self._idle:
                return self._idle.pop()
            number = self._next
            self._next += 1
        return _Cgroup(f"{self.parent}/s{number}")

    def give_back(self, cgroup: _Cgroup, dirty: bool, empty: bool = False) -> None:
        """Take `cgroup` back into the pool (`empty`: the caller saw it empty after its
        child exited, and nothing is left in it that could have come in since)."""
        if dirty:
            cgroup.sweep_children()
        if not empty and cgroup.populated():  # something would not die: never reuse it
            cgroup.close()
            with self._lock:
                self._abandoned.append(cgroup.path)
            return
        with self._lock:
            if len(self._idle) < _POOL_MAX:
                self._idle.append(cgroup)
                return
        cgroup.remove()

    def cleanup(self) -> None:
        """At exit: remove the pool and the home (what is still populated stays)."""
        if os.getpid() != self._owner:
            return  # a forked child inherited the atexit handler, not the cgroups
        with self._lock:
            idle, self._idle = self._idle, []
            abandoned, self._abandoned = self._abandoned, []
        for cgroup in idle:
            cgroup.remove()
        for path in abandoned:
            with contextlib.suppress(OSError):
                os.rmdir(path)
        with contextlib.suppress(OSError):
            os.rmdir(self.parent)

    def forget(self) -> None:
        """In a forked child: these cgroups are the parent's; close what it inherited."""
        for cgroup in self._idle:
            cgroup.close()
        self._idle = []


def _load_prctl() -> tuple[Callable[..., int], bool] | None:
    """libc's prctl and whether this process is a subreaper already, or None."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        import ctypes

        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    prctl.restype = ctypes.c_int
    prctl.argtypes = (ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong)
    flag = ctypes.c_int(0)
    if prctl(_PR_GET_CHILD_SUBREAPER, ctypes.addressof(flag), 0, 0, 0) != 0:
        return None
    return cast("Callable[..., int]", prctl), bool(flag.value)


class _Reaper:
    """This process as a child subreaper, while spawns that end their leftovers run."""

    def __init__(self, prctl: Callable[..., int], already: bool) -> None:
        self._prctl = prctl
        self._already = already  # someone else made it one: never unset it
        self._lock = threading.Lock()
        self._holders = 0
        # The trees of running subreaper spawns, from before their start to their release
        # (a spawn whose child is being started has no pid yet, and may have a child).
        self._live: set[_SubreaperTree] = set()
        self._kept: dict[int, float] = {}  # adopted leftovers kept alive: pid -> start
        self.me = os.getpid()

    @classmethod
    def create(cls) -> _Reaper | None:
        loaded = _load_prctl()
        return None if loaded is None else cls(*loaded)

    def unhold(self) -> None:
        with self._lock:
            self._unhold()

    def _unhold(self) -> None:
        self._holders -= 1
        if self._holders == 0 and not self._already:
            self._prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)

    def enter(self, tree: _SubreaperTree, hold: bool) -> None:
        """`tree`'s spawn starts (and needs this process to be a subreaper if `hold`)."""
        with self._lock:
            self._live.add(tree)
            if hold:
                if self._holders == 0 and not self._already:
                    self._prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
                self._holders += 1

    def leave(self, tree: _SubreaperTree, held: bool) -> None:
        with self._lock:
            self._live.discard(tree)
            if held:
                self._unhold()

    def alone(self, tree: _SubreaperTree) -> bool:
        """Whether `tree`'s spawn is the only subreaper spawn running (or starting)."""
        with self._lock:
            return self._live == {tree}

    def running(self, pid: int) -> bool:
        """Whether `pid` is the child of a running subreaper spawn."""
        with self._lock:
            return any(tree.pid == pid for tree in self._live)

    def kept(self, pid: int) -> bool:
        with self._lock:
            return pid in self._kept

    def known(self) -> set[int]:
        """The children of running subreaper spawns, and the kept leftovers."""
        with self._lock:
            return {tree.pid for tree in self._live} | set(self._kept)

    def keep(self, procs: Iterable[_Proc]) -> None:
        with self._lock:
            self._kept.update((proc.pid, proc.start) for proc in procs)

    def reap_kept(self) -> None:
        """Reap kept leftovers that have died since (they are execkit's children now)."""
        if not self._kept:
            return
        with self._lock:
            kept = list(self._kept.items())
        for pid, start in kept:
            now = _read_stat(pid)
            if now is not None and now.start == start and not now.zombie:
                continue
            _reap([(pid, start)])
            with self._lock:
                self._kept.pop(pid, None)

    def pdeathsig_preexec(self) -> Callable[[], None]:
        """Run in the forked child before exec: SIGKILL it when execkit dies."""
        prctl = self._prctl
        parent = os.getpid()
        kill = int(signal.SIGKILL)

        def die_with_parent() -> None:
            prctl(_PR_SET_PDEATHSIG, kill, 0, 0, 0)
            if os.getppid() != parent:  # execkit died before the prctl took hold
                os.kill(os.getpid(), kill)

        return die_with_parent


class _SubreaperTree(_Tree):
    def __init__(self, reaper: _Reaper, keep: bool) -> None:
        super().__init__()
        self.mechanism = TreeMechanism.SUBREAPER
        self._reaper = reaper
        self._holds = not keep
        self._released = False
        self._owned: set[int] | bool | None = False  # False: not looked up (per snapshot)
        # Before the start: an orphan made at once comes here too.
        reaper.enter(self, self._holds)

    def starter(self, plan: _Plan) -> tuple[ProcessStarter, dict[str, Any]]:
        # Asked for only (a preexec_fn makes Popen fork instead of vfork: a copy of this
        # whole process per start), only for the real Popen (a starter's contract has no
        # preexec_fn), and only with one thread: then no other thread can hold a lock the
        # forked child would need.
        start = plan.start
        default = start is _POPEN_TYPES[0]
        if not plan.die_with_parent or not default or not _single_threaded():
            return start, {}
        return start, {"preexec_fn": self._reaper.pdeathsig_preexec()}

    def __hash__(self) -> int:
        return id(self)

    def snapshot(self) -> list[_Proc]:
        self._owned = False  # who owns which child changes between snapshots
        return super().snapshot()

    def __eq__(self, other: object) -> bool:
        return self is other

    def _claims(self, proc: _Proc, child: _Proc | None) -> bool:
        if super()._claims(proc, child):
            return True
        reaper = self._reaper
        # Adopted by execkit since the child started, and no other code's child: one that
        # execkit started itself is in execkit's session or leads its own, and the latter
        # is somebody's only while a Popen holds it.
        if (
            proc.ppid != reaper.me
            or child is None
            or proc.start < child.start
            or proc.sid == os.getsid(0)
            or reaper.running(proc.pid)
            or reaper.kept(proc.pid)
            or not reaper.alone(self)
        ):
            return False
        if proc.sid != proc.pid:
            return True  # a session it did not start: certainly re-parented to execkit
        if self._owned is False:
            self._owned = _popen_owned()
        owned = self._owned
        # While some Popen is starting its child, any new child may be that one: claim none.
        return isinstance(owned, set) and proc.pid not in owned

    def child_exited(self, keep: bool) -> None:
        reaper = self._reaper
        reaper.reap_kept()
        if not self._seen:
            if not _created_since(self.pid):
                return  # nothing was created after the child: it left nothing behind
            # All that the child left hangs below execkit's own children now (orphans come
            # here). None but the known ones: nothing was left, no /proc scan needed.
            children = _own_children() if self._holds else None
            if children is not None and children <= reaper.known() | {self.pid}:
                return
        procs = self.snapshot()
        if keep:
            reaper.keep(p for p in procs if p.ppid == reaper.me and not p.zombie)
            return
        _killpg(self.pid, signal.SIGKILL)
        until = time.monotonic() + _KILL_WAIT_S
        for _ in range(_SWEEP_ROUNDS):
            if not procs:
                return
            _kill_and_wait([p for p in procs if not p.zombie], until)
            # Dead, every one of them is execkit's child now (orphans come here): reap them.
            _reap((p.pid, p.start) for p in procs)
            procs = self.snapshot()

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._reaper.leave(self, self._holds)


class _CgroupTree(_SubreaperTree):
    """`cgroup`: contained as by `_SubreaperTree` at first, and by a cgroup of its own once
    the child has run for `_CGROUP_AFTER_S`.

    Moving a process into a cgroup makes the kernel wait for an RCU grace period when no
    move happened just before (measured here: ~20 us back to back, 7-20 ms otherwise). So
    a child that is done within `_CGROUP_AFTER_S` (most short commands) never pays for it,
    and for one that runs longer the move is made by a helper thread while the loop goes
    on serving the pipes. Whatever the child made before the move is found in /proc and
    moved in after it; from then on everything it starts is born in the cgroup, however it
    daemonizes, and `cgroup.kill` ends it all. Every other call waits for the move first.
    """

    def __init__(self, reaper: _Reaper, home: _CgroupHome, keep: bool) -> None:
        super().__init__(reaper, keep)
        self._home = home
        self._cgroup: _Cgroup | None = None
        self._moved: dict[int, float] = {}  # adopted orphans moved in: execkit reaps them
        self._mover: threading.Thread | None = None
        self._dirty = False
        self._empty = False

    def starter(self, plan: _Plan) -> tuple[ProcessStarter, dict[str, Any]]:
        if not plan.die_with_parent:
            return plan.start, {}
        return super().starter(plan)

    def adopt(self, proc: subprocess.Popen[bytes]) -> _Tree:
        super().adopt(proc)
        self.settle_at = self._born + _CGROUP_AFTER_S
        return self

    def settle(self) -> None:
        """Still running: move the child, then what it made so far, into a cgroup."""
        self.settle_at = None
        home = self._home
        if home.broken:
            return
        try:
            cgroup = home.acquire()
        except OSError:
            return  # none to be had now (a limit on descendants): stay as we are
        mover = threading.Thread(
            target=self._move_in, args=(cgroup,), name=f"execkit-cgroup:{self.pid}", daemon=True
        )
        try:
            mover.start()
        except RuntimeError:  # no thread to be had (interpreter shutting down)
            self._move_in(cgroup)
            return
        self._mover = mover

    def _settled(self) -> None:
        """Wait for the move, if one is under way (it takes a grace period at most)."""
        mover, self._mover = self._mover, None
        if mover is not None:
            mover.join()

    def _move_in(self, cgroup: _Cgroup) -> None:
        home = self._home
        try:
            cgroup.add(self.pid)
        except OSError:
            # This process may make cgroups but not move processes into them (the common
            # ancestor is not writable): stop trying, for this spawn and the next ones.
            home.broken = True
            home.give_back(cgroup, False)
            return
        self._cgroup = cgroup
        self.mechanism = TreeMechanism.CGROUP
        me = os.getpid()
        for _ in range(_SWEEP_ROUNDS):  # each one moved forks into the cgroup from now on
            inside = set(cgroup.members())
            outside = [p for p in self.snapshot() if p.pid not in inside]
            _reap((p.pid, p.start) for p in outside if p.zombie)
            outside = [p for p in outside if not p.zombie]
            if not outside:
                break
            for proc in outside:
                now = _read_stat(proc.pid)
                if now is None or now.start != proc.start:
                    continue  # gone, or the pid names another process by now
                with contextlib.suppress(OSError):
                    cgroup.add(proc.pid)
                if proc.ppid == me:
                    self._moved[proc.pid] = proc.start
        if self._holds:
            # Orphans made from now on are the cgroup's, found there whoever adopts them.
            self._holds = False
            self._reaper.unhold()

    def signal(self, sig: int) -> None:
        self._settled()
        cgroup = self._cgroup
        if cgroup is None:
            super().signal(sig)
            return
        _killpg(self.pid, sig)
        for pid in cgroup.members():
            try:
                if pid == self.pid or os.getpgid(pid) == self.pid:
                    continue  # signalled with the group
                os.kill(pid, sig)
            except OSError:
                pass

    def kill(self) -> None:
        self._settled()
        cgroup = self._cgroup
        if cgroup is None:
            super().kill()
            return
        self._dirty = True
        cgroup.kill(self._home.has_kill)
        _killpg(self.pid, signal.SIGKILL)

    def child_exited(self, keep: bool) -> None:
        self._settled()
        cgroup = self._cgroup
        if cgroup is None:
            super().child_exited(keep)
            return
        if keep:
            if cgroup.populated():
                cgroup.evict(self._home.own_procs)
            return
        # The group too: a background job made before the move and missed is in it.
        _killpg(self.pid, signal.SIGKILL)
        if cgroup.populated():
            self._dirty = True
            # Who is in it, to reap those an orphaning made execkit's (another spawn may
            # hold this process a subreaper now).
            members = [p for p in map(_read_stat, cgroup.members()) if p is not None]
            cgroup.kill(self._home.has_kill)
            self._empty = cgroup.wait_empty(time.monotonic() + _KILL_WAIT_S, self._home.has_kill)
            _reap((p.pid, p.start) for p in members)
        else:
            self._empty = True  # and stays so: the child is dead, nobody is left to fork
        _reap(self._moved.items())

    def release(self) -> None:
        self._settled()
        cgroup, self._cgroup = self._cgroup, None
        if cgroup is not None:
            self._home.give_back(cgroup, self._dirty, self._empty)
        super().release()


class _Containment:
    """What this process can contain spawns with; found at the first spawn."""

    def __init__(self) -> None:
        self.home = _CgroupHome.create()
        self._reaper: _Reaper | None = None
        self._reaper_tried = False
        self._lock = threading.Lock()

    def reaper(self) -> _Reaper | None:
        if not self._reaper_tried:
            with self._lock:
                if not self._reaper_tried:
                    self._reaper = _Reaper.create()
                    self._reaper_tried = True
        return self._reaper

    def cgroups(self) -> _CgroupHome | None:
        """The cgroup home, while it works (the `cgroup` mechanism also needs a reaper)."""
        home = self.home
        if home is None or home.broken or self.reaper() is None:
            return None
        return home

    def default(self) -> TreeMechanism:
        if self.cgroups() is not None:
            return TreeMechanism.CGROUP
        if self.reaper() is not None:
            return TreeMechanism.SUBREAPER
        return TreeMechanism.SESSION

    def tree(self, mechanism: TreeMechanism, keep: bool) -> _Tree:
        if mechanism is TreeMechanism.SESSION:
            return _Tree()
        reaper = self.reaper()
        if reaper is None:
            return _Tree()
        home = self.cgroups()
        if mechanism is TreeMechanism.CGROUP and home is not None:
            return _CgroupTree(reaper, home, keep)
        return _SubreaperTree(reaper, keep)


_STATE: list[_Containment] = []
_STATE_LOCK = [threading.Lock()]
_FORCED: list[TreeMechanism] = []


def _containment() -> _Containment:
    if not _STATE:
        with _STATE_LOCK[0]:
            if not _STATE:
                _STATE.append(_Containment())
    return _STATE[0]


def _after_fork_in_child() -> None:
    # A forked child is another process: its spawns need their own cgroups, and it is no
    # subreaper (that is not inherited). Find out afresh when it first spawns.
    if _STATE and _STATE[0].home is not None:
        _STATE[0].home.forget()
    _STATE.clear()
    _STATE_LOCK[0] = threading.Lock()
    global _LAST_PID_LOCK
    _LAST_PID_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


def tree_mechanism() -> TreeMechanism:
    """The mechanism that contains the process trees of spawns made now in this process
    (see `TreeMechanism`; the module docstring says what each one does). The first call
    (or the first spawn) finds it out."""
    return _FORCED[0] if _FORCED else _containment().default()


def _force_mechanism(mechanism: str | None) -> bool:
    """Tests and benchmarks: new spawns use `mechanism` (None: the default again). Returns
    False, changing nothing, where that mechanism is not available."""
    if mechanism is None:
        _FORCED.clear()
        return True
    wanted = TreeMechanism(mechanism)
    state = _containment()
    if wanted is TreeMechanism.CGROUP and state.cgroups() is None:
        return False
    if wanted is TreeMechanism.SUBREAPER and state.reaper() is None:
        return False
    _FORCED[:] = [wanted]
    return True


def _new_tree(keep: bool) -> _Tree:
    state = _containment()
    return state.tree(_FORCED[0] if _FORCED else state.default(), keep)


def _wait_exit(pid: int) -> None:
    """Block until child `pid` has exited, leaving it unreaped (its Popen reaps it)."""
    with contextlib.suppress(ChildProcessError):
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)


def _kill_now(proc: subprocess.Popen[bytes], tree: _Tree) -> None:
    """Abnormal exit (cancel, callback error, KeyboardInterrupt): no grace, no leftovers."""
    try:
        if proc.returncode is None:
            tree.kill()
            with contextlib.suppress(OSError):  # unreaped, so the pid is still the child's
                os.kill(proc.pid, signal.SIGKILL)
            _wait_exit(proc.pid)
            tree.child_exited(keep=False)
            proc.wait()
    finally:
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


class SpawnCancelled(Exception):
    """The spawn was cancelled through its cancel descriptor; the tree has been killed."""


# ---------------------------------------------------------------------- the real process


def _set_nonblocking(fd: int) -> None:
    """O_NONBLOCK on the input pipe Popen made (a write may be larger than the room left):
    one fcntl, not `os.set_blocking`'s two (such a pipe has no other status flag to keep)."""
    fcntl.fcntl(fd, fcntl.F_SETFL, os.O_NONBLOCK)


class _Supervisor:
    """Runs one real child to its end: pumps the pipes, enforces the timeout, reaps."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        plan: _Plan,
        out: TailBuffer,
        err: TailBuffer,
        cancel_fd: int | None,
        tree: _Tree,
    ) -> None:
        self._proc = proc
        self._plan = plan
        self._tree = tree
        # A poll object is a plain list of descriptors: nothing to open or close per spawn.
        self._poll = select.poll()
        self._pidfd: int | None = None
        self._exited = False
        self._stopping = False
        self._pending_input = memoryview(plan.input) if plan.input is not None else None
        self._stdin_fd = -1
        assert proc.stdout is not None and proc.stderr is not None
        self._streams: dict[int, tuple[TailBuffer, OutputCallback | None]] = {
            proc.stdout.fileno(): (out, plan.on_stdout),
            proc.stderr.fileno(): (err, plan.on_stderr),
        }
        self._cancel_fd = -1 if cancel_fd is None else cancel_fd

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
        poll = self._poll
        for fd in self._streams:
            poll.register(fd, _POLLIN)  # blocking: it is read only once poll says it can be
        stdin = self._proc.stdin
        if stdin is not None:
            if self._pending_input:
                self._stdin_fd = stdin.fileno()
                _set_nonblocking(self._stdin_fd)
                poll.register(self._stdin_fd, select.POLLOUT)
            else:
                self._close_stdin()
        try:
            self._pidfd = os.pidfd_open(self._proc.pid)
        except (AttributeError, OSError):
            self._pidfd = None  # old kernel: fall back to polling
        else:
            poll.register(self._pidfd, _POLLIN)
        if self._cancel_fd >= 0:
            poll.register(self._cancel_fd, _POLLIN)

    def _poll_exit(self) -> bool:
        """Without a pidfd: whether the child has exited (then dealt with, see `_on_exit`)."""
        try:
            exited = (
                os.waitid(os.P_PID, self._proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
                is not None
            )
        except ChildProcessError:
            # Reaped already, not by its Popen (a SIGCHLD set to SIG_IGN, a stray
            # waitpid(-1) elsewhere): gone all the same; its Popen reports exit 0 then.
            exited = True
        if not exited:
            return False
        self._on_exit()
        return True

    def _pump(self, until: float | None) -> bool:
        """Serve the pipes until the child exits (True) or `until` passes (False)."""
        poll = self._poll.poll
        serve = self._serve
        tree = self._tree
        heartbeat = self._plan.heartbeat
        beat_at = None if heartbeat is None else time.monotonic() + self._plan.heartbeat_s
        while not self._exited:
            if self._pidfd is None and self._poll_exit():
                break
            wait: float | None = None
            settle_at = tree.settle_at
            if until is not None or settle_at is not None or beat_at is not None:
                now = time.monotonic()
                if settle_at is not None and now >= settle_at:
                    tree.settle()
                    continue
                if beat_at is not None and now >= beat_at:
                    assert heartbeat is not None
                    heartbeat()  # raises through `_spawn`, which ends the tree first
                    beat_at = time.monotonic() + self._plan.heartbeat_s
                    continue
                if until is not None:
                    wait = until - now
                    if wait <= 0:
                        return False
                for due in (settle_at, beat_at):
                    if due is not None:
                        wait = due - now if wait is None else min(wait, due - now)
                wait = min(wait, _MAX_WAIT_S) if wait is not None else None
            if self._pidfd is None:
                wait = _POLL_S if wait is None else min(wait, _POLL_S)
            for fd, _ in poll(None if wait is None else wait * 1000):
                serve(fd)
        return True

    def _serve(self, fd: int) -> None:
        if fd in self._streams:
            self._read(fd)
        elif fd == self._pidfd:
            self._on_exit()
        elif fd == self._cancel_fd:
            raise SpawnCancelled
        elif fd == self._stdin_fd:
            self._write_input()

    def _on_exit(self) -> None:
        """The child exited: end what it left (it is still unreaped, so its pid, session and
        group cannot be reused meanwhile), then let its Popen reap it."""
        if self._exited:
            return
        self._exited = True
        if self._pidfd is not None:
            with contextlib.suppress(KeyError):
                self._poll.unregister(self._pidfd)
        self._tree.child_exited(self._plan.keep_descendants and not self._stopping)
        self._proc.wait()

    def _read(self, fd: int) -> None:
        """One read for each readiness poll reports: the pipe has data (or is at its end),
        so this never blocks, and one read takes all a pipe holds (a 64 KiB pipe, a read
        of up to 64 KiB, or of the whole ring). A flood thus costs a poll and a read per
        pipe's worth, and can never starve the timeout."""
        tail, callback = self._streams[fd]
        if callback is None:
            if not tail.fill(fd):  # straight into the tail's ring
                self._end_of(fd)
            return
        chunk = os.read(fd, _CHUNK)
        if not chunk:
            self._end_of(fd)
            return
        tail.feed(chunk)
        callback(chunk)

    def _end_of(self, fd: int) -> None:
        self._poll.unregister(fd)
        del self._streams[fd]

    def _write_input(self) -> None:
        data = self._pending_input
        if self._stdin_fd < 0 or data is None:
            return  # closed earlier in this same batch of events
        try:
            written = os.write(self._stdin_fd, data[:_CHUNK])
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
        if self._stdin_fd >= 0:
            with contextlib.suppress(KeyError, ValueError):
                self._poll.unregister(self._stdin_fd)
            self._stdin_fd = -1
        self._pending_input = None
        if stdin is not None and not stdin.closed:
            with contextlib.suppress(OSError):
                stdin.close()

    def _stop_tree(self) -> None:
        """The timeout elapsed: SIGTERM the tree, serve the pipes through the grace, SIGKILL."""
        self._stopping = True
        self._close_stdin()
        self._tree.signal(signal.SIGTERM)
        self._pump(time.monotonic() + self._plan.kill_grace)
        if not self._exited:
            # Descendants forked during the grace are caught too: the cgroup holds them,
            # and the other mechanisms look again (orphans are found through what was seen).
            self._tree.kill()
        self._pump(None)

    def _drain(self) -> None:
        """Read what is left in the pipes, for at most `_DRAIN_S`."""
        self._close_stdin()  # nobody is left to read the rest of the input
        until = time.monotonic() + _DRAIN_S
        while self._streams:
            wait = until - time.monotonic()
            if wait <= 0:
                return
            for fd, _ in self._poll.poll(wait * 1000):
                if fd in self._streams:
                    self._read(fd)
                elif fd == self._cancel_fd:
                    raise SpawnCancelled

    def _close(self) -> None:
        if self._pidfd is not None:
            os.close(self._pidfd)
            self._pidfd = None
        for stream in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError):
                    stream.close()


# ------------------------------------------------------------------------------- spawning


# One /dev/null kept open for every child's stdin, instead of an open and a close per
# spawn: (fd, device, inode). Checked before each use, in case other code closed it.
_DEVNULL: list[tuple[int, int, int]] = []


def _devnull() -> int:
    if _DEVNULL:
        fd, device, inode = _DEVNULL[0]
        try:
            found = os.fstat(fd)
        except OSError:
            pass
        else:
            if (found.st_dev, found.st_ino) == (device, inode):
                return fd
    fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    found = os.fstat(fd)
    _DEVNULL[:] = [(fd, found.st_dev, found.st_ino)]
    return fd


def _stdin_of(plan: _Plan) -> int | None:
    if plan.input is not None:
        return subprocess.PIPE
    return None if plan.inherit_stdin else _devnull()


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
    tree = _new_tree(plan.keep_descendants)
    started = time.monotonic()
    try:
        start, extra = tree.starter(plan)
        try:
            proc = start(
                list(plan.argv),
                stdin=_stdin_of(plan),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=plan.cwd,
                env=plan.env,
                start_new_session=True,
                bufsize=0,
                **extra,
            )
        except OSError as exc:
            return _not_started(plan, exc, started)
        proc = _check_popen(proc)
        # From here on any exception (a callback's, KeyboardInterrupt, a signal handler's,
        # a cancel, a starter that ignored the pipes) must not leave the child's tree
        # running: it leads its own session, so nothing else would ever stop it.
        try:
            tree = tree.adopt(proc)
            _check_pipes(proc, plan)
            returncode, timed_out = _Supervisor(proc, plan, out, err, cancel_fd, tree).run(started)
        except BaseException:
            _kill_now(proc, tree)
            raise
    finally:
        tree.release()
    return _finished(plan, proc.pid, returncode, timed_out, out, err, started, tree.mechanism)


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
    keep_descendants: bool = False,
    heartbeat: Callable[[], object] | None = None,
    heartbeat_s: float = DEFAULT_HEARTBEAT_S,
    start: ProcessStarter = subprocess.Popen,
) -> SpawnResult:
    """Run `argv` directly (never through a shell) and report how it ended.

    - `env` replaces the environment (as with Popen); None inherits it. The child's stdin
      is `input` (str is UTF-8 encoded), or /dev/null so it never waits on a terminal or
      a pipe nobody closes. `inherit_stdin=True` hands it the caller's own stdin instead
      (a wrapper such as `execkit run`); spawn never reads it, so it cannot wait on it.
    - `timeout` (None or > 0 s): SIGTERM to the child's process group and to descendants
      that left it, `kill_grace` (>= 0 s) more, then SIGKILL to the whole tree, descendants
      forked during the grace included; `timed_out` is then True whatever the child
      exited with.
    - When the child exits, whatever it left running in its tree (a background job, a
      double-forked daemon) is SIGKILLed before spawn returns; `keep_descendants=True`
      leaves them running instead (a timeout still stops them all). How the tree was
      contained is `tree_mechanism` on the result (see `tree_mechanism()`).
    - Each stream keeps its last `tail_bytes` (1..256 MiB) bytes, decoded as UTF-8 with
      replacement and redacted; byte totals and `*_truncated` are exact. A tail that is
      binary output (more than a quarter of it NUL or not UTF-8) keeps only the text
      after its last such byte, behind `[binary output: N bytes not kept]`.
    - `on_stdout`/`on_stderr` get every raw chunk live, unredacted, in the calling thread.
      If one raises, the process tree is SIGKILLed and the exception propagates.
    - `heartbeat` is called every `heartbeat_s` (> 0 s) while the child lives, first after
      one interval, in the calling thread: how a run's ledger lease is renewed for as long
      as its process runs (`heartbeat=lambda: ledger.heartbeat(run.id)`). If it raises
      (the run was abandoned meanwhile: `Conflict`), the tree is SIGKILLed and the
      exception propagates, since the attempt's result can no longer be recorded.
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
        keep_descendants,
        heartbeat=heartbeat,
        heartbeat_s=heartbeat_s,
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
    keep_descendants: bool = False,
    heartbeat: Callable[[], object] | None = None,
    heartbeat_s: float = DEFAULT_HEARTBEAT_S,
    start: ProcessStarter = subprocess.Popen,
) -> SpawnResult:
    """`spawn` for asyncio runners: same arguments (`start`, `keep_descendants` and
    `heartbeat` included), same result, same errors.

    The process is supervised in a dedicated thread, so the callbacks (`heartbeat` too)
    run in that thread (use `loop.call_soon_threadsafe` to touch loop state). Cancelling
    the awaiting task SIGKILLs the whole process tree and reaps the child before
    `CancelledError` propagates.
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
        keep_descendants,
        heartbeat=heartbeat,
        heartbeat_s=heartbeat_s,
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
            future.exception()  # retrieved: SpawnCancelled is the expected outcome here
        raise
    finally:
        os.close(wake_write)


def spawn_cancellable(
    cancel_fd: int,
    argv: Sequence[str],
    *,
    inherit_stdin: bool = False,
    timeout: float | None = None,
    kill_grace: float = 5.0,
    tail_bytes: int = 65536,
    on_stdout: OutputCallback | None = None,
    on_stderr: OutputCallback | None = None,
    keep_descendants: bool = False,
    die_with_parent: bool = False,
    start: ProcessStarter = subprocess.Popen,
) -> SpawnResult:
    """`spawn` that also watches `cancel_fd` (for `execkit run`, whose signal handlers write
    to a pipe): once it is readable, the whole tree is SIGKILLed and reaped and
    `SpawnCancelled` is raised. The cancel is noticed at a safe point of the loop, never
    in the middle of starting the child or of ending its tree.

    `die_with_parent=True` also has the child SIGKILLed by the kernel if this process dies
    (PR_SET_PDEATHSIG), where that is safe: the default starter and a single-threaded
    process, whose fork (a preexec_fn rules out vfork) is then cheap enough."""
    plan = _plan(
        argv,
        None,
        None,
        None,
        inherit_stdin,
        timeout,
        kill_grace,
        tail_bytes,
        on_stdout,
        on_stderr,
        start,
        keep_descendants,
        die_with_parent,
    )
    return _spawn(plan, cancel_fd)
