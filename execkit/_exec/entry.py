"""The three entry points: `spawn`, `spawn_async` and `spawn_cancellable`.

Each keeps its public keyword signature, builds one `SpawnOptions` (where bad arguments
are refused, before anything runs) and hands it to `_spawn`, the one path every real
process takes: the tree to hold it (`tree.new_tree`), the start through the `start` seam
(`subprocess.Popen` unless the caller injects another `ProcessStarter`, such as the
`fake_vendor` fixture's) with the child leading its own session and its stdin from
`input`, the caller's own stdin or /dev/null, the poll loop (`Supervisor`), then the
result (`result.finished`). From the start on, any exception stops the whole tree before
it propagates.

`spawn_async` runs that same path in a dedicated thread per call (not the default
executor, whose small pool would serialise concurrent agents). Cancelling the awaiting
task wakes the loop through a pipe; it SIGKILLs the whole process tree and reaps the child
before the `CancelledError` propagates.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import threading
import time
from collections.abc import Callable, Mapping, Sequence

from execkit._exec.cancel import Cancellation
from execkit._exec.lines import LineHook
from execkit._exec.options import (
    DEFAULT_HEARTBEAT_S,
    DEFAULT_KILL_GRACE_S,
    DEFAULT_TAIL_BYTES,
    POPEN_TYPES,
    OutputCallback,
    ProcessStarter,
    SpawnOptions,
)
from execkit._exec.result import SpawnResult, finished, new_tail, not_started
from execkit._exec.supervisor import SpawnCancelled, Supervisor, kill_now
from execkit._exec.tree import new_tree

__all__ = ["spawn", "spawn_async", "spawn_cancellable"]


class _DevNull:
    """One /dev/null kept open for every child's stdin, instead of an open and a close per
    spawn; checked (device and inode) before each use, in case other code closed it."""

    def __init__(self) -> None:
        self._held: tuple[int, int, int] | None = None  # (fd, device, inode)

    def fd(self) -> int:
        held = self._held
        if held is not None:
            fd, device, inode = held
            try:
                found = os.fstat(fd)
            except OSError:
                pass
            else:
                if (found.st_dev, found.st_ino) == (device, inode):
                    return fd
        fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        found = os.fstat(fd)
        self._held = (fd, found.st_dev, found.st_ino)
        return fd


_DEVNULL = _DevNull()


def _stdin_of(options: SpawnOptions) -> int | None:
    if options.input is not None:
        return subprocess.PIPE
    return None if options.inherit_stdin else _DEVNULL.fd()


def _check_popen(proc: object) -> subprocess.Popen[bytes]:
    """What the starter returned, if it is a real `subprocess.Popen`; else TypeError.

    Checked by type, never by probing for attributes: a stand-in without real file
    descriptors (pytest-subprocess's FakePopen) cannot be supervised, and a second code
    path for it would test something other than what runs in production.
    """
    if not isinstance(proc, POPEN_TYPES):
        kind = type(proc)
        raise TypeError(
            "start must return a started subprocess.Popen with real pipes, got "
            f"{kind.__module__}.{kind.__qualname__}; to fake a vendor CLI in a test use the "
            "fake_vendor fixture and pass start=fake_vendor.start"
        )
    return proc


def _check_pipes(proc: subprocess.Popen[bytes], options: SpawnOptions) -> None:
    """TypeError for a started process without the pipes spawn asked its starter for."""
    missing_stdin = options.input is not None and proc.stdin is None
    if proc.stdout is None or proc.stderr is None or missing_stdin:
        raise TypeError(
            "start must honour the stdin/stdout/stderr=PIPE that spawn passes: the process "
            f"it returned (pid {proc.pid}) lacks a pipe, so it was killed"
        )


def _spawn(options: SpawnOptions, cancel_fd: int | None = None) -> SpawnResult:
    out, err = new_tail(options), new_tail(options)
    tree = new_tree(options.keep_descendants)
    started = time.monotonic()
    try:
        start, extra = tree.starter(options)
        try:
            proc = start(
                list(options.argv),
                stdin=_stdin_of(options),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=options.cwd,
                env=tree.environment(options),
                start_new_session=True,
                bufsize=0,
                **extra,
            )
        except OSError as exc:
            return not_started(options, exc, started)
        proc = _check_popen(proc)
        # From here on any exception (a callback's, KeyboardInterrupt, a signal handler's,
        # a cancel, a starter that ignored the pipes) must not leave the child's tree
        # running: it leads its own session, so nothing else would ever stop it.
        try:
            tree = tree.adopt(proc)
            _check_pipes(proc, options)
            supervisor = Supervisor(proc, options, out, err, cancel_fd, tree)
            returncode, timed_out = supervisor.run(started)
        except BaseException:
            kill_now(proc, tree)
            raise
    finally:
        tree.release()
    stop = supervisor.stopped_by
    return finished(
        options,
        proc.pid,
        returncode,
        timed_out,
        out,
        err,
        started,
        tree.mechanism,
        None if stop is None else stop.why,
        supervisor.stalled,
    )


def spawn(
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    input: str | bytes | None = None,
    inherit_stdin: bool = False,
    timeout: float | None = None,
    kill_grace: float = DEFAULT_KILL_GRACE_S,
    tail_bytes: int = DEFAULT_TAIL_BYTES,
    on_stdout: OutputCallback | None = None,
    on_stderr: OutputCallback | None = None,
    on_line: LineHook | None = None,
    keep_descendants: bool = False,
    heartbeat: Callable[[], object] | None = None,
    heartbeat_s: float = DEFAULT_HEARTBEAT_S,
    start: ProcessStarter = subprocess.Popen,
    cancel: Cancellation | None = None,
    stall_timeout: float | None = None,
) -> SpawnResult:
    """Run `argv` directly (never through a shell) and report how it ended.

    - `env` replaces the environment (as with Popen); None inherits it. Under the `cgroup`
      and `subreaper` mechanisms, started while this process runs another thread or
      spawn, the child's also holds `EXECKIT_SPAWN`, the mark that tells its leftovers
      from those of spawns running beside it. The child's stdin
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
    - `on_line` gets each complete line of either stream live (`Line`: the stream, the
      text decoded but unredacted, cut at `LINE_BYTES`), in the calling thread; returning
      a `StopTree` ends the spawn as a timeout would (SIGTERM, `kill_grace`, SIGKILL) and
      the result's `stopped_by` keeps its `why` (see `execkit._exec.lines`). If it raises,
      the tree is SIGKILLed and the exception propagates.
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

    - `stall_timeout` (None or > 0 s): no byte on stdout or stderr for that long (from the
      start, or from the last byte read) stops the tree as a timeout does (SIGTERM,
      `kill_grace`, SIGKILL); the result's `stalled_after_s` is then the stall timeout.
      A child that prints now and then is never stopped by it, however long it runs.
    - `cancel` (a `Cancellation`) ends the spawn from another thread: once it is cancelled
      the whole tree is SIGKILLed and reaped and `SpawnCancelled` is raised (at once, with
      nothing started, when it was cancelled before the start).

    Never raises for a process that could not start (see `spawn_errno`). Raises TypeError
    or `InvalidInput` (a ValueError) naming the argument for bad arguments, before
    anything runs.
    """
    options = SpawnOptions(
        argv=argv,
        cwd=cwd,
        env=env,
        input=input,
        inherit_stdin=inherit_stdin,
        timeout=timeout,
        kill_grace=kill_grace,
        tail_bytes=tail_bytes,
        on_stdout=on_stdout,
        on_stderr=on_stderr,
        on_line=on_line,
        start=start,
        keep_descendants=keep_descendants,
        heartbeat=heartbeat,
        heartbeat_s=heartbeat_s,
        stall_timeout=stall_timeout,
    )
    if cancel is None:
        return _spawn(options)
    if cancel.cancelled:
        raise SpawnCancelled("cancelled before it started")
    return _spawn(options, cancel.fileno())


async def spawn_async(
    argv: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    input: str | bytes | None = None,
    inherit_stdin: bool = False,
    timeout: float | None = None,
    kill_grace: float = DEFAULT_KILL_GRACE_S,
    tail_bytes: int = DEFAULT_TAIL_BYTES,
    on_stdout: OutputCallback | None = None,
    on_stderr: OutputCallback | None = None,
    on_line: LineHook | None = None,
    keep_descendants: bool = False,
    heartbeat: Callable[[], object] | None = None,
    heartbeat_s: float = DEFAULT_HEARTBEAT_S,
    start: ProcessStarter = subprocess.Popen,
    stall_timeout: float | None = None,
) -> SpawnResult:
    """`spawn` for asyncio runners: same arguments (`start`, `keep_descendants`,
    `on_line` and `heartbeat` included), same result, same errors.

    The process is supervised in a dedicated thread, so the callbacks (`on_line` and
    `heartbeat` too) run in that thread (use `loop.call_soon_threadsafe` to touch loop
    state). Cancelling the awaiting task SIGKILLs the whole process tree and reaps the
    child before `CancelledError` propagates.
    """
    import asyncio  # only asyncio runners pay for importing it

    options = SpawnOptions(
        argv=argv,
        cwd=cwd,
        env=env,
        input=input,
        inherit_stdin=inherit_stdin,
        timeout=timeout,
        kill_grace=kill_grace,
        tail_bytes=tail_bytes,
        on_stdout=on_stdout,
        on_stderr=on_stderr,
        on_line=on_line,
        start=start,
        keep_descendants=keep_descendants,
        heartbeat=heartbeat,
        heartbeat_s=heartbeat_s,
        stall_timeout=stall_timeout,
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
            result = _spawn(options, cancel_fd=wake_read)
        except BaseException as exc:  # handed to the awaiting task, never lost
            error = exc
        finally:
            os.close(wake_read)
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody is waiting any more
            loop.call_soon_threadsafe(deliver, result, error)

    try:
        threading.Thread(target=work, name=f"execkit-spawn:{options.argv[0]}", daemon=True).start()
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
    kill_grace: float = DEFAULT_KILL_GRACE_S,
    tail_bytes: int = DEFAULT_TAIL_BYTES,
    on_stdout: OutputCallback | None = None,
    on_stderr: OutputCallback | None = None,
    keep_descendants: bool = False,
    die_with_parent: bool = False,
    start: ProcessStarter = subprocess.Popen,
    stall_timeout: float | None = None,
) -> SpawnResult:
    """`spawn` that also watches `cancel_fd` (for `execkit run`, whose signal handlers write
    to a pipe): once it is readable, the whole tree is SIGKILLed and reaped and
    `SpawnCancelled` is raised. The cancel is noticed at a safe point of the loop, never
    in the middle of starting the child or of ending its tree.

    `die_with_parent=True` also has the child SIGKILLed by the kernel if this process dies
    (PR_SET_PDEATHSIG), where that is safe: the default starter and a single-threaded
    process, whose fork (a preexec_fn rules out vfork) is then cheap enough."""
    options = SpawnOptions(
        argv=argv,
        inherit_stdin=inherit_stdin,
        timeout=timeout,
        kill_grace=kill_grace,
        tail_bytes=tail_bytes,
        on_stdout=on_stdout,
        on_stderr=on_stderr,
        start=start,
        keep_descendants=keep_descendants,
        die_with_parent=die_with_parent,
        stall_timeout=stall_timeout,
    )
    return _spawn(options, cancel_fd)
