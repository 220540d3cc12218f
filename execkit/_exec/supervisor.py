"""The poll loop: run one real child to its end (`Supervisor`), or stop it at once.

One `poll` loop in the calling thread over stdout, stderr, stdin and a pidfd for the
child's exit (where the kernel has no pidfds, the exit is polled every `_POLL_S`). There
is one supervision path, over real file descriptors: a starter must hand back a real
`subprocess.Popen`. A stream nobody watches live is read by the kernel straight into its
bounded tail (a ring, `tail.py`); a watched one (a chunk callback, or the line hook) in
chunks of at most 64 KiB that are handed to the callback, the line splitter (`lines.py`)
and the tail. Memory stays flat whatever the child prints.

The loop also keeps four appointments: the stall timeout (no byte read from stdout or
stderr for `stall_timeout` seconds stops the tree as a timeout does, and `stalled` says
so), the timeout (SIGTERM to the tree, the pipes served
through `kill_grace`, then SIGKILL; a `StopTree` from the line hook ends the tree the
same way, at once), the tree's `settle_at` (the cgroup move) and the
`heartbeat` (a ledger lease renewed every `heartbeat_s`, first after one interval, never
after the child is reaped). When the child exits, the tree ends what it left (the child is
still unreaped, so its pid, session and group cannot be reused meanwhile), then the
child's Popen reaps it. Once the child is reaped the pipes are read for at most
`_DRAIN_S` more: a descendant that inherited them cannot keep `spawn` waiting.

A cancel descriptor (`spawn_async`'s wake-up pipe, `execkit run`'s signal pipe) is
watched too: once readable, `SpawnCancelled` is raised at a safe point of the loop, and
the caller stops the tree with `kill_now`.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
import signal
import subprocess
import time

from execkit._exec.lines import LineSplitter, StopTree
from execkit._exec.options import OutputCallback, SpawnOptions
from execkit._exec.proctable import POLLIN
from execkit._exec.tail import TailBuffer
from execkit._exec.tree import Tree

__all__ = ["SpawnCancelled", "Supervisor", "kill_now"]

_CHUNK = 64 * 1024
# After the child is reaped: how long pipes held open by a surviving descendant are still
# read before they are closed. Data the child itself wrote is already in the pipe by then.
_DRAIN_S = 0.5
# Where pidfd_open is unavailable the loop polls the child's exit this often.
_POLL_S = 0.05
# The longest single wait in the loop: a huge timeout or grace (1e300 s is finite and
# valid) would overflow the poll clock, so long waits are taken in slices.
_MAX_WAIT_S = 3600.0


class SpawnCancelled(Exception):
    """The spawn was cancelled through its cancel descriptor; the tree has been killed."""


class _Stalled(Exception):
    """No byte on stdout or stderr for the stall timeout (raised out of the poll loop only
    while the child runs, so the loop ends where a timeout would end it)."""


class _LineStop(Exception):
    """The line hook asked for the tree to be stopped (raised out of the poll loop only
    while the child runs, so the loop ends where a timeout would end it)."""


def _set_nonblocking(fd: int) -> None:
    """O_NONBLOCK on the input pipe Popen made (a write may be larger than the room left):
    one fcntl, not `os.set_blocking`'s two (such a pipe has no other status flag to keep)."""
    fcntl.fcntl(fd, fcntl.F_SETFL, os.O_NONBLOCK)


class Supervisor:
    """Runs one real child to its end: pumps the pipes, enforces the timeout, reaps."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        options: SpawnOptions,
        out: TailBuffer,
        err: TailBuffer,
        cancel_fd: int | None,
        tree: Tree,
    ) -> None:
        self._proc = proc
        self._options = options
        self._tree = tree
        # A poll object is a plain list of descriptors: nothing to open or close per spawn.
        self._poll = select.poll()
        self._pidfd: int | None = None
        self._exited = False
        self._stopping = False
        self._pending_input = memoryview(options.input) if options.input is not None else None
        self._stdin_fd = -1
        assert proc.stdout is not None and proc.stderr is not None
        hook = options.on_line
        self._streams: dict[int, tuple[TailBuffer, OutputCallback | None, LineSplitter | None]] = {
            proc.stdout.fileno(): (
                out,
                options.on_stdout,
                None if hook is None else LineSplitter("stdout", hook),
            ),
            proc.stderr.fileno(): (
                err,
                options.on_stderr,
                None if hook is None else LineSplitter("stderr", hook),
            ),
        }
        self._cancel_fd = -1 if cancel_fd is None else cancel_fd
        # The line hook's StopTree, once it has stopped the tree for it.
        self.stopped_by: StopTree | None = None
        # The stall watchdog: when a byte was last read from either stream.
        self._last_output = time.monotonic()
        self.stalled = False

    def run(self, started: float) -> tuple[int, bool]:
        """Return (returncode, timed_out); `stopped_by` says whether the line hook stopped
        the tree. Closes every fd it holds, whatever happens; killing the tree on an
        exception is the caller's job (`kill_now`)."""
        try:
            self._register()
            deadline = None if self._options.timeout is None else started + self._options.timeout
            self._last_output = started
            try:
                timed_out = not self._pump(deadline)
            except _LineStop as stop:
                timed_out = False
                self.stopped_by = stop.args[0]
            except _Stalled:
                timed_out = False
                self.stalled = True
            if timed_out or self.stopped_by is not None or self.stalled:
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
            poll.register(fd, POLLIN)  # blocking: it is read only once poll says it can be
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
            poll.register(self._pidfd, POLLIN)
        if self._cancel_fd >= 0:
            poll.register(self._cancel_fd, POLLIN)

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
        heartbeat = self._options.heartbeat
        beat_at = None if heartbeat is None else time.monotonic() + self._options.heartbeat_s
        # The stall watchdog only while the child runs on its own (not while it is being
        # stopped: the grace is the timeout's, whatever the child prints meanwhile).
        stall = None if self._stopping else self._options.stall_timeout
        while not self._exited:
            if self._pidfd is None and self._poll_exit():
                break
            wait: float | None = None
            settle_at = tree.settle_at
            stall_at = None if stall is None else self._last_output + stall
            if not (until is None and settle_at is None and beat_at is None and stall_at is None):
                now = time.monotonic()
                if stall_at is not None and now >= stall_at:
                    raise _Stalled
                if settle_at is not None and now >= settle_at:
                    tree.settle()
                    continue
                if beat_at is not None and now >= beat_at:
                    assert heartbeat is not None
                    heartbeat()  # raises to the caller, which ends the tree first
                    beat_at = time.monotonic() + self._options.heartbeat_s
                    continue
                if until is not None:
                    wait = until - now
                    if wait <= 0:
                        return False
                for due in (settle_at, beat_at, stall_at):
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
        self._tree.child_exited(self._options.keep_descendants and not self._stopping)
        self._proc.wait()

    def _read(self, fd: int) -> None:
        """One read for each readiness poll reports: the pipe has data (or is at its end),
        so this never blocks, and one read takes all a pipe holds (a 64 KiB pipe, a read
        of up to 64 KiB, or of the whole ring). A flood thus costs a poll and a read per
        pipe's worth, and can never starve the timeout."""
        tail, callback, lines = self._streams[fd]
        if callback is None and lines is None:
            if not tail.fill(fd):  # straight into the tail's ring
                self._end_of(fd)
            else:
                self._last_output = time.monotonic()
            return
        chunk = os.read(fd, _CHUNK)
        if not chunk:
            self._end_of(fd)
            return
        self._last_output = time.monotonic()
        tail.feed(chunk)
        if callback is not None:
            callback(chunk)
        if lines is not None:
            self._asked(lines.feed(chunk))

    def _asked(self, stop: StopTree | None) -> None:
        """The line hook asked to stop the tree: end the poll loop there, unless the child
        already exited by itself or the tree is being stopped anyway."""
        if stop is not None and not self._exited and not self._stopping:
            raise _LineStop(stop)

    def _end_of(self, fd: int) -> None:
        self._poll.unregister(fd)
        _, _, lines = self._streams.pop(fd)
        if lines is not None:
            self._asked(lines.end())

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
        self._pump(time.monotonic() + self._options.kill_grace)
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


# ------------------------------------------------------------------------ stopping at once


def _wait_exit(pid: int) -> None:
    """Block until child `pid` has exited, leaving it unreaped (its Popen reaps it)."""
    with contextlib.suppress(ChildProcessError):
        os.waitid(os.P_PID, pid, os.WEXITED | os.WNOWAIT)


def kill_now(proc: subprocess.Popen[bytes], tree: Tree) -> None:
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
