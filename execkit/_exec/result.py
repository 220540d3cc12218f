"""How a spawn ended, as a value: `SpawnResult`, and how it is built and worded.

`spawn` never raises for a process that could not be started: the errno is kept on the
result (`spawn_errno`), because it is the durable structural signal the classifier needs
(ADR 0046: ENOENT from a direct spawn is not the same as a shell exiting 127), and
`spawn_failure` says as a value what it meant for this start (`_describe_spawn_error`: a
missing program, a missing `#!` interpreter and a missing working directory share ENOENT
but name different preconditions). `spawn_error` is the sentence an operator reads.

Everything a result keeps is masked (`execkit._redact`): argv, the error and both tails,
with the values of the child's secret-looking environment variables as extra secrets
(`_SecretScans` remembers the last scan of each environment). A tail is redacted with up
to `REDACT_CONTEXT` bytes from before its cut, so a credential the cut sliced in two is
still recognised; a tail that is binary output keeps only the text after it, behind
`BINARY_NOTICE` (`TailBuffer.kept`).
"""

from __future__ import annotations

import contextlib
import enum
import errno
import functools
import os
import time
from collections.abc import Callable
from typing import Any

import attrs

from execkit._exec.options import SpawnOptions, int_arg
from execkit._exec.tail import KeptText, TailBuffer
from execkit._json import to_json
from execkit._redact import (
    MIN_ENV_SECRET_LEN,
    redact,
    redact_argv,
    redact_tail,
    secret_env_values,
)

__all__ = [
    "BINARY_NOTICE",
    "REDACT_CONTEXT",
    "TREE_MECHANISMS",
    "SpawnFailure",
    "SpawnResult",
    "TreeMechanism",
    "finished",
    "new_tail",
    "not_started",
]

BINARY_NOTICE = "[binary output: {} bytes not kept]"
"""Where a tail's binary output was dropped (`TailBuffer.kept`), with its byte count."""

REDACT_CONTEXT = 4096
"""Bytes kept from before each cut tail so a credential the cut sliced in two is still
recognised: longer than any key shape, long enough for most bearer tokens."""

_CUT = "…"
# Linux reads at most this much of a #! line.
_SHEBANG_MAX = 256

# A starter (a test's fake, a wrapper) may raise an OSError without an errno; the exception
# type still says which.
_ERRNO_BY_TYPE: tuple[tuple[type[OSError], int], ...] = (
    (FileNotFoundError, errno.ENOENT),
    (NotADirectoryError, errno.ENOTDIR),
    (IsADirectoryError, errno.EISDIR),
    (PermissionError, errno.EACCES),
)


class TreeMechanism(enum.StrEnum):
    """How a spawn's process tree was contained (`execkit._exec.tree`), strongest first."""

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


def _keep_tail(text: str, max_chars: int) -> str:
    if len(text) <= max_chars:
        return text
    if max_chars <= 1:
        return _CUT[:max_chars]
    return _CUT + text[-(max_chars - 1) :]


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
    its process tree was contained (None when it never started). `stalled_after_s` is the
    stall timeout that stopped it (no byte on stdout or stderr for that long), else None.
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
    stopped_by: str | None = None
    stalled_after_s: float | None = None

    @property
    def ok(self) -> bool:
        """True when the process started, was neither timed out, stalled nor stopped by the
        line hook, and exited 0."""
        return (
            self.spawn_errno is None
            and not self.timed_out
            and self.stopped_by is None
            and self.stalled_after_s is None
            and self.signal is None
            and self.exit_code == 0
        )

    def failure_text(self, max_chars: int = 500) -> str:
        """The spawn error, then stderr, then stdout, keeping the LAST `max_chars`.

        A stream whose tail was already cut at capture starts with `…`, and so does the
        joined text when `max_chars` cuts it. Raises TypeError when `max_chars` is not an
        int, `InvalidInput` when it is negative.
        """
        int_arg("max_chars", max_chars, 0)
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


# ------------------------------------------------------------------- what failed to start


def _errno_of(exc: OSError) -> int:
    if exc.errno is not None:
        return exc.errno
    for kind, code in _ERRNO_BY_TYPE:
        if isinstance(exc, kind):
            return code
    return errno.EIO


def _describe_spawn_error(
    options: SpawnOptions, exc: OSError, code: int
) -> tuple[SpawnFailure, str]:
    """What failed at the start, as a value, and the sentence an operator reads."""
    cwd = options.cwd
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
    path = filename or options.argv[0]
    if code == errno.ENOENT:
        return _describe_enoent(options, path)
    if code == errno.EACCES:
        return SpawnFailure.PERMISSION_DENIED, f"permission denied: cannot execute {path}"
    if code == errno.ENOEXEC:
        return (
            SpawnFailure.EXEC_FORMAT,
            f"exec format error: {path} is not a runnable program",
        )
    return SpawnFailure.OTHER, f"could not start {path}: [Errno {code}] {os.strerror(code)}"


def _describe_enoent(options: SpawnOptions, path: str) -> tuple[SpawnFailure, str]:
    """ENOENT for a program that is there means exec could not find its #! interpreter."""
    import shutil  # only a failed start looks the program up (a spawn that runs never does)

    found = shutil.which(path, path=os.pathsep.join(os.get_exec_path(options.env)))
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


# ---------------------------------------------------------------- the secrets to mask


class _SecretScans:
    """`secret_env_values` of the environments spawns run with, the last scan of each
    source remembered: the environment rarely changes between spawns, and a scan reads
    (and decodes) every name. Each slot holds (the contents the scan was made from, its
    result), replaced whole, so a thread reads either the old pair or the new one; a hit
    is a dict comparison, done in C."""

    def __init__(self) -> None:
        self._environ: tuple[dict[bytes, bytes], tuple[str, ...]] | None = None
        self._given: tuple[dict[str, str], tuple[str, ...]] | None = None

    def of_environ(self) -> tuple[str, ...]:
        """`secret_env_values(os.environ)`, recomputed only when the environment changed."""
        data = getattr(os.environ, "_data", None)  # CPython's encoded copy: cheap to compare
        if not isinstance(data, dict):
            return secret_env_values(os.environ)
        slot = self._environ
        with contextlib.suppress(RuntimeError):  # another thread changed it mid-comparison
            if slot is not None and slot[0] == data:
                return slot[1]
        contents = dict(data)
        decoded = {os.fsdecode(name): os.fsdecode(value) for name, value in contents.items()}
        secrets = secret_env_values(decoded)
        self._environ = (contents, secrets)
        return secrets

    def of_given(self, env: dict[str, str]) -> tuple[str, ...]:
        """`secret_env_values(env)` for an `env` argument (a private copy spawn made)."""
        slot = self._given
        if slot is not None and slot[0] == env:
            return slot[1]
        secrets = secret_env_values(env)
        self._given = (env, secrets)
        return secrets


_SCANS = _SecretScans()

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


def _secrets_for(options: SpawnOptions, longest: int) -> tuple[str, ...]:
    """Values of the child's secret-looking env vars, where a text `longest` characters
    long could hold one.

    They are at least MIN_ENV_SECRET_LEN long, so shorter texts cannot; skipping the
    environment then is a measurable share of a short-lived child's spawn.
    """
    if longest < MIN_ENV_SECRET_LEN:
        return ()
    return _SCANS.of_environ() if options.env is None else _SCANS.of_given(options.env)


# ------------------------------------------------------------------- building the result


def new_tail(options: SpawnOptions) -> TailBuffer:
    """A stream's tail buffer: `tail_bytes`, with `REDACT_CONTEXT` bytes before the cut."""
    return TailBuffer(options.tail_bytes, REDACT_CONTEXT)


def not_started(options: SpawnOptions, exc: OSError, started: float) -> SpawnResult:
    """The result of a start that raised `exc` (`started`: monotonic seconds)."""
    code = _errno_of(exc)
    failure, error = _describe_spawn_error(options, exc, code)
    secrets = _secrets_for(options, max(len(error), *map(len, options.argv)))
    return SpawnResult(
        argv=redact_argv(options.argv, secrets),
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


def finished(
    options: SpawnOptions,
    pid: int,
    returncode: int,
    timed_out: bool,
    out: TailBuffer,
    err: TailBuffer,
    started: float,
    mechanism: TreeMechanism,
    stopped_by: str | None = None,
    stalled: bool = False,
) -> SpawnResult:
    """The result of a child that was reaped with `returncode` (negative: a signal);
    `stopped_by`: the line hook's reason, when it stopped the tree; `stalled`: the stall
    timeout stopped it."""
    out_kept, err_kept = out.kept(), err.kept()
    longest = max(
        len(out_kept.text) + len(out_kept.context),
        len(err_kept.text) + len(err_kept.context),
        *map(len, options.argv),
    )
    secrets = _secrets_for(options, longest)
    return SpawnResult(
        argv=_redacted_argv(options.argv, secrets),
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
        stopped_by=None if stopped_by is None else redact(stopped_by, secrets),
        stalled_after_s=options.stall_timeout if stalled else None,
    )


def _post_exit(data: bytes, tail_bytes: int | None = None) -> Callable[[], SpawnResult]:
    """The work `spawn` does after its child exits, ready to run: the child wrote `data`
    and the last `tail_bytes` of it are kept (all by default; fewer cut the tail, with
    context before it). Calling it builds the result, as `finished` does for a spawn."""
    options = SpawnOptions(
        argv=["true"], tail_bytes=max(1, len(data) if tail_bytes is None else tail_bytes)
    )
    out, err = new_tail(options), new_tail(options)
    out.feed(data)
    return lambda: finished(options, 1, 0, False, out, err, 0.0, TreeMechanism.SESSION)


def _post_exit_seconds(data: bytes, tail_bytes: int | None = None) -> float:
    """The seconds `_post_exit(data, tail_bytes)` takes to run: what
    benchmarks/bench_exec.py measures (tests/test_exec_tree.py counts its calls instead)."""
    work = _post_exit(data, tail_bytes)
    begin = time.perf_counter()
    work()
    return time.perf_counter() - begin
