"""The process table, as the tree mechanisms read it: /proc (psutil where there is none).

A process is named by its pid and its start time together (`Proc`), because a pid may be
reused once its process is reaped: a signal is sent, and a zombie reaped, only after
/proc shows that very process (same start) still there (`send`, `kill_and_wait`, `reap`).
Signals go through a pidfd where the kernel has them, so a pid reused between the check
and the signal cannot be hit.

Reading all of /proc costs a stat per process; a spawn's tree was made after its child,
so `table(since=child)` reads only the pids allocated since, while the pid counter cannot
have gone round. Where the newest pid is still the child's, nothing was created since at
all (`created_since`, one `pread`).
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import sys
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import NamedTuple

from execkit._exec.options import POPEN_TYPES

__all__ = [
    "POLLIN",
    "Proc",
    "created_since",
    "descendants",
    "end_below",
    "environ_value",
    "kill_and_wait",
    "killpg",
    "open_last_pid",
    "own_children",
    "popen_owned",
    "read_stat",
    "reap",
    "send",
    "single_threaded",
    "table",
]

POLLIN = select.POLLIN

# The pid range allocated since a child started is trusted for a scan of /proc only while
# the pid counter cannot have gone round (assuming no more than this many forks a second).
_FORKS_PER_S_BOUND = 100_000


class Proc(NamedTuple):
    """One process as /proc (or psutil) showed it."""

    pid: int
    ppid: int
    pgrp: int
    sid: int
    start: float  # when it started: with the pid, the identity of a process (no pid reuse)
    zombie: bool


def read_stat(pid: int) -> Proc | None:
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
        return Proc(
            pid,
            int(fields[1]),
            int(fields[2]),
            int(fields[3]),
            int(fields[19]),
            fields[0] in (b"Z", b"X"),
        )
    except (IndexError, ValueError):
        return None


def environ_value(pid: int, name: bytes) -> bytes | None:
    """The value of `name` in the environment process `pid` was started with (its
    /proc/PID/environ: what its last exec was given, unless it wrote over it since), or
    None: not set, an empty environment (a zombie's), gone, or not readable (another
    user's process, no /proc)."""
    try:
        fd = os.open(f"/proc/{pid}/environ", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        chunks = []
        while chunk := os.read(fd, 1 << 16):
            chunks.append(chunk)
    except OSError:
        return None
    finally:
        os.close(fd)
    data = b"\0" + b"".join(chunks)
    at = data.find(b"\0" + name + b"=")
    if at < 0:
        return None
    start = at + len(name) + 2
    end = data.find(b"\0", start)
    return data[start:] if end < 0 else data[start:end]


def _read_int(path: str) -> int | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            return int(os.read(fd, 64).split()[0])
        finally:
            os.close(fd)
    except (OSError, ValueError, IndexError):
        return None


def open_last_pid() -> int:
    """/proc/sys/kernel/ns_last_pid opened for `created_since` (-1 where it cannot be)."""
    try:
        return os.open("/proc/sys/kernel/ns_last_pid", os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return -1


def created_since(last_pid_fd: int, pid: int) -> bool:
    """Whether any process was created after process `pid` (True where it cannot be told).

    One `pread` of `last_pid_fd` (`open_last_pid`): while the newest pid is still `pid`,
    nothing was made since, so the process `pid` has no descendant at all.
    """
    if last_pid_fd < 0:
        return True
    try:
        return int(os.pread(last_pid_fd, 32, 0)) != pid
    except (OSError, ValueError):
        return True


def own_children() -> set[int] | None:
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


def table(since: int | None = None, age_s: float = 0.0) -> dict[int, Proc]:
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
    found: dict[int, Proc] = {}
    for pid in pids:
        entry = read_stat(pid)
        if entry is not None:
            found[pid] = entry
    return found


def _psutil_table() -> dict[int, Proc]:
    """`table` where there is no /proc to read (not Linux)."""
    try:
        import psutil
    except ImportError:  # pragma: no cover - psutil is a dependency
        return {}
    found: dict[int, Proc] = {}
    for proc in psutil.process_iter(["ppid", "status", "create_time"]):
        info = proc.info
        try:
            pgrp, sid = os.getpgid(proc.pid), os.getsid(proc.pid)
        except OSError:
            continue
        zombie = info["status"] == psutil.STATUS_ZOMBIE
        found[proc.pid] = Proc(
            proc.pid, info["ppid"] or 0, pgrp, sid, info["create_time"] or 0.0, zombie
        )
    return found


def descendants(procs: Mapping[int, Proc], roots: Iterable[int]) -> set[int]:
    """Every process below `roots` in `procs` (the roots themselves not included)."""
    children: dict[int, list[int]] = {}
    for proc in procs.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found: set[int] = set()
    stack = list(roots)
    while stack:
        for child in children.get(stack.pop(), ()):
            if child not in found:
                found.add(child)
                stack.append(child)
    return found


# -------------------------------------------------------------------------------- signals


def _pidfd_of(proc: Proc) -> int | None:
    """A pidfd for `proc` if it is still that process (same start), else None.

    Raises AttributeError where there are no pidfds (the caller falls back to kill).
    """
    try:
        fd = os.pidfd_open(proc.pid)
    except OSError:
        return None  # gone
    now = read_stat(proc.pid)
    if now is None or now.start != proc.start:
        os.close(fd)  # the pid now names another process
        return None
    return fd


def send(proc: Proc, sig: int) -> None:
    """`sig` to `proc`, if it is still that process."""
    try:
        fd = _pidfd_of(proc)
    except AttributeError:
        now = read_stat(proc.pid)
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


def kill_and_wait(procs: Sequence[Proc], until: float) -> None:
    """SIGKILL each of `procs` that is still itself, and wait (to `until`) until they die."""
    fds: list[int] = []
    try:
        for proc in procs:
            try:
                fd = _pidfd_of(proc)
            except AttributeError:  # no pidfds: signal now, then watch /proc
                send(proc, signal.SIGKILL)
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
            poller.register(fd, POLLIN)
        pending = len(fds)
        while pending and (wait := until - time.monotonic()) > 0:
            for fd, _ in poller.poll(wait * 1000):
                poller.unregister(fd)
                pending -= 1
    finally:
        for fd in fds:
            os.close(fd)


def end_below(root: Proc, until: float, rounds: int) -> None:
    """SIGKILL `root` (if it is still that process) and everything below it, reaping what
    of it is execkit's; up to `rounds` rounds for what forks meanwhile (what a killed
    process had started is found again through what was seen of it). The whole table is
    read each round: for the rare leftover attributed to no spawn in particular."""
    seen = {root.pid: root.start}
    for _ in range(rounds):
        procs = table()
        roots = [pid for pid, start in seen.items() if (p := procs.get(pid)) and p.start == start]
        found = [procs[pid] for pid in set(roots) | descendants(procs, roots)]
        seen.update((p.pid, p.start) for p in found)
        alive = [p for p in found if not p.zombie]
        if alive:
            kill_and_wait(alive, until)
        reap(seen.items())
        if not alive:
            return


def _wait_stat_gone(procs: Sequence[Proc], until: float) -> None:
    while time.monotonic() < until:
        alive = [p for p in procs if (now := read_stat(p.pid)) is not None and not now.zombie]
        if not alive:
            return
        time.sleep(0.01)


def killpg(pgid: int, sig: int) -> None:
    """`sig` to process group `pgid`, if there still is one."""
    if pgid > 0:
        with contextlib.suppress(OSError):  # the group may already be gone
            os.killpg(pgid, sig)


# -------------------------------------------------------------------- this process's own


def reap(procs: Iterable[tuple[int, float]]) -> None:
    """Reap each (pid, start) that is now a zombie child of execkit's (an adopted orphan):
    `waitpid` on exactly that pid, never -1, and only while /proc shows the very process
    (same start) dead, so a pid reused by a child some Popen owns is never touched."""
    for pid, start in procs:
        now = read_stat(pid)
        if now is not None and now.start == start and now.zombie and now.ppid == os.getpid():
            with contextlib.suppress(ChildProcessError, OSError):
                os.waitpid(pid, os.WNOHANG)


def popen_owned() -> set[int] | None:
    """Pids a live `subprocess.Popen` (or multiprocessing's) is waiting for: another part
    of this program's children, never to be taken for a spawn's leftovers. None while one
    of them is being started (its child may exist before its pid is known).

    Found as the objects that refer to those classes or a subclass (an instance refers to
    its class), never by listing every object: `gc.get_objects()` also lists a tuple that
    another thread is still building from a generator, and the reference it holds makes
    that thread's `tuple(...)` fail with SystemError (CPython 3.11: `subprocess.Popen`
    builds one such tuple in each start, so a spawn's check broke another's start)."""
    import gc

    kinds: list[type] = [POPEN_TYPES[0]]
    forked = sys.modules.get("multiprocessing.popen_fork")
    if forked is not None:
        kinds.append(forked.Popen)
    classes: list[type] = []
    while kinds:
        kind = kinds.pop()
        if kind not in classes:
            classes.append(kind)
            kinds.extend(kind.__subclasses__())
    owners = tuple(classes)
    owned: set[int] = set()
    for obj in gc.get_referrers(*owners):
        if isinstance(obj, owners) and getattr(obj, "returncode", 0) is None:
            pid = getattr(obj, "pid", None)
            if not isinstance(pid, int):
                return None
            owned.add(pid)
    return owned


def single_threaded() -> bool:
    """Whether this process has one thread (/proc/self/task has one entry)."""
    try:
        return len(os.listdir("/proc/self/task")) == 1
    except OSError:
        return False
