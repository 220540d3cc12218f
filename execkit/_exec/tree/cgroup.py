"""The `cgroup` mechanism: a cgroup v2 of the spawn's own, where this process may make one.

At the first spawn execkit looks up its own cgroup (the `0::` line of /proc/self/cgroup,
under the cgroup2 mount) and makes `execkit-<pid>-<hex>/` below it (`CgroupHome`), with a
small pool of per-spawn cgroups `s<N>` (made once, reused while empty; all removed at exit,
and a dead execkit's left-overs at the next one's start). A child still running after
`_CGROUP_AFTER_S` (50 ms) is moved into one, by a helper thread while the loop goes on,
and what it made before that is found in /proc and moved in after it: from then on
whatever it starts is born in the cgroup, however it daemonizes (double fork, setsid), and
`cgroup.kill` (Linux 5.14+; before, a SIGKILL loop over `cgroup.procs`) ends it all at
once.

Not at once, because a move costs the kernel an RCU grace period unless another move came
just before (here ~20 us back to back, 7-20 ms otherwise: a lone `spawn(["true"])` would
take five to seven times as long), and Python cannot start a child straight into a cgroup
(subprocess has no CLONE_INTO_CGROUP, glibc 2.36 no posix_spawnattr_setcgroup_np, and a
`preexec_fn` is unsafe with threads and rules out vfork). Until the move, the child's tree
is held as under `subreaper` (`CgroupTree` is a `SubreaperTree` until then, its child's
environment marked the same way), so a short command that leaves a daemon behind is
covered too, and what a child made before the move is told by its mark from what spawns
running beside it made.

With `keep_descendants=True`, what is left in the cgroup when the child exits is moved out
into execkit's own cgroup and left running.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import re
import select
import signal
import subprocess
import threading
import time
from typing import Any

from execkit._exec import proctable
from execkit._exec.options import ProcessStarter, SpawnOptions
from execkit._exec.result import TreeMechanism
from execkit._exec.tree.session import KILL_WAIT_S, SWEEP_ROUNDS, Tree
from execkit._exec.tree.subreaper import Reaper, SubreaperTree

__all__ = ["CgroupHome", "CgroupTree"]

# Idle per-spawn cgroups kept for reuse.
_POOL_MAX = 8
# A child still running this long after its start is moved into a cgroup of its own (see
# `CgroupTree` for why not at once).
_CGROUP_AFTER_S = 0.05


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
        for _ in range(SWEEP_ROUNDS):  # a member may fork while the others move
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


# Compiled (and cached by `re`) at the first sweep, not when the spawner is imported.
_HOME_NAME = r"execkit-(\d+)-[0-9a-f]+\Z"


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


class CgroupHome:
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
    def create(cls) -> CgroupHome | None:
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
                match = re.match(_HOME_NAME, entry.name)
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


class CgroupTree(SubreaperTree):
    """`cgroup`: contained as by `SubreaperTree` at first, and by a cgroup of its own once
    the child has run for `_CGROUP_AFTER_S`.

    Moving a process into a cgroup makes the kernel wait for an RCU grace period when no
    move happened just before (measured here: ~20 us back to back, 7-20 ms otherwise). So
    a child that is done within `_CGROUP_AFTER_S` (most short commands) never pays for it,
    and for one that runs longer the move is made by a helper thread while the loop goes
    on serving the pipes. Whatever the child made before the move is found in /proc and
    moved in after it; from then on everything it starts is born in the cgroup, however it
    daemonizes, and `cgroup.kill` ends it all. Every other call waits for the move first.
    """

    def __init__(self, reaper: Reaper, home: CgroupHome, keep: bool) -> None:
        super().__init__(reaper, keep)
        self._home = home
        self._cgroup: _Cgroup | None = None
        self._moved: dict[int, float] = {}  # adopted orphans moved in: execkit reaps them
        self._mover: threading.Thread | None = None
        self._dirty = False
        self._empty = False

    def starter(self, options: SpawnOptions) -> tuple[ProcessStarter, dict[str, Any]]:
        if not options.die_with_parent:
            return options.start, {}
        return super().starter(options)

    def adopt(self, proc: subprocess.Popen[bytes]) -> Tree:
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
        for _ in range(SWEEP_ROUNDS):  # each one moved forks into the cgroup from now on
            inside = set(cgroup.members())
            outside = [p for p in self.snapshot() if p.pid not in inside]
            proctable.reap((p.pid, p.start) for p in outside if p.zombie)
            outside = [p for p in outside if not p.zombie]
            if not outside:
                break
            for proc in outside:
                now = proctable.read_stat(proc.pid)
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
        proctable.killpg(self.pid, sig)
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
        proctable.killpg(self.pid, signal.SIGKILL)

    def child_exited(self, keep: bool) -> None:
        self._settled()
        cgroup = self._cgroup
        if cgroup is None:
            super().child_exited(keep)
            return
        self._reaper.exiting(self)
        if keep:
            if cgroup.populated():
                members = [p for p in map(proctable.read_stat, cgroup.members()) if p]
                cgroup.evict(self._home.own_procs)
                # Kept as under `subreaper`: reaped once dead, never another spawn's to end.
                reaper = self._reaper
                kept = (p for p in members if p.ppid == reaper.me and not p.zombie)
                reaper.keep(kept, self.mark or None)
            return
        # The group too: a background job made before the move and missed is in it.
        proctable.killpg(self.pid, signal.SIGKILL)
        if cgroup.populated():
            self._dirty = True
            # Who is in it, to reap those an orphaning made execkit's (another spawn may
            # hold this process a subreaper now).
            members = [p for p in map(proctable.read_stat, cgroup.members()) if p is not None]
            cgroup.kill(self._home.has_kill)
            self._empty = cgroup.wait_empty(time.monotonic() + KILL_WAIT_S, self._home.has_kill)
            proctable.reap((p.pid, p.start) for p in members)
        else:
            self._empty = True  # and stays so: the child is dead, nobody is left to fork
        proctable.reap(self._moved.items())

    def release(self) -> None:
        self._settled()
        cgroup, self._cgroup = self._cgroup, None
        if cgroup is not None:
            self._home.give_back(cgroup, self._dirty, self._empty)
        super().release()
