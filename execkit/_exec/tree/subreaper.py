"""The `subreaper` mechanism (Linux without a writable cgroup), and PR_SET_PDEATHSIG.

`prctl(PR_SET_CHILD_SUBREAPER)` on this process while a spawn that ends its leftovers runs
(`Reaper`, one per process, counts who needs it), so orphans of the tree are re-parented
to execkit instead of init and can be found in /proc (only the pids made since the child,
while the pid counter cannot have gone round; none at all when the newest pid is still the
child's) and killed. A process is a spawn's leftover when it is in the child's session or
process group, was seen in its tree before, or was adopted by execkit after the child
started and is that spawn's by its mark.

The mark: subreaping is process-wide, so when several spawns run at once (the dispatcher's
slots, threads calling `spawn`) every one's orphans come to the same process, and where an
orphan came from is gone with its parent. So a spawn that may run beside others (started
while this process runs another thread, or another spawn) starts its child with
`EXECKIT_SPAWN` in its environment (`MARK_VAR`, a mark unique to the spawn, after any
inherited from an outer execkit), which every descendant inherits however it daemonizes,
and an adopted orphan is the spawn's whose mark its /proc/PID/environ carries (the way
Jenkins' ProcessTreeKiller finds a build's daemons). A spawn alone in a single-threaded
process (`execkit run`) needs none: what comes back while it runs is its own. An orphan
without a mark (it dropped it: `env -i`, an environment written over; or its spawn had
none) is a leftover of one of the spawns that were running when it was made: the only
such spawn still running claims it (so a lone spawn ends it as its own), and while there
are several it waits, noted in the reaper, until the last of them ends, which ends it
(keeps it, only when every one of them keeps its descendants: which of them made it
cannot be told, and ending is the promise).
Never taken: a process in execkit's own session, a running spawn's child, a kept leftover,
another spawn's marked process, and an unmarked child a live `subprocess.Popen` owns (nor
any new unmarked child while some Popen is still starting one). Killed leftovers are
reaped by pid: `waitpid` on exactly those pids, only while /proc shows that very process
dead and execkit's, never -1, never a child a Popen owns.

`PR_SET_PDEATHSIG(SIGKILL)`, which has the kernel kill the child should execkit itself be
SIGKILLed, can only be set from inside the child: a `preexec_fn`, which makes Popen fork a
copy of this whole process instead of vfork (2.9 ms instead of 0.27 ms per start for a
30 MB process here, growing with its memory) and may deadlock where another thread holds
a lock at the fork. So only a spawn asking for it gets it (`spawn_cancellable(...,
die_with_parent=True)`, which `execkit run` does), and only with the default starter and
a single-threaded process (/proc/self/task has one entry: no other thread can hold a lock
across the fork, which is what makes a `preexec_fn` unsafe).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any, cast

from execkit._exec import proctable
from execkit._exec.options import POPEN_TYPES, ProcessStarter, SpawnOptions
from execkit._exec.proctable import Proc
from execkit._exec.result import TreeMechanism
from execkit._exec.tree.session import KILL_WAIT_S, SWEEP_ROUNDS, Tree

__all__ = ["MARK_VAR", "Reaper", "SubreaperTree"]

MARK_VAR = "EXECKIT_SPAWN"
"""The environment variable that marks a spawn's tree (module docstring): the marks of the
spawns it runs under, outermost first, separated by spaces."""
_MARK_VAR_BYTES = MARK_VAR.encode()

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


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


class Reaper:
    """This process as a child subreaper, while spawns that end their leftovers run.

    One per process (`execkit._exec.tree`); a forked child makes its own (`forget`).
    """

    def __init__(self, prctl: Callable[..., int], already: bool) -> None:
        self._prctl = prctl
        self._already = already  # someone else made it one: never unset it
        self._lock = threading.Lock()
        self._holders = 0
        # The trees of running subreaper spawns, from before their start to their release
        # (a spawn whose child is being started has no pid yet, and may have a child).
        self._live: set[SubreaperTree] = set()
        self._kept: dict[int, float] = {}  # adopted leftovers kept alive: pid -> start
        self._kept_marks: set[str] = set()  # the marks of spawns that kept their leftovers
        # Unmarked orphans waiting for the last spawn that may have made them to end:
        # (pid, start) -> (those spawns, whether one of them keeps its leftovers).
        self._pending: dict[tuple[int, float], tuple[set[SubreaperTree], bool]] = {}
        self._last_pid_fd: int | None = None  # ns_last_pid, opened at first use, kept open
        self.me = os.getpid()
        # Marks are this prefix and a count: unique to this process (the pid may be an
        # earlier execkit's, whose marks an inherited environment may still carry).
        self._prefix = f"{self.me}-{os.urandom(4).hex()}."
        self._marks = 0

    @classmethod
    def create(cls) -> Reaper | None:
        loaded = _load_prctl()
        return None if loaded is None else cls(*loaded)

    def forget(self) -> None:
        """In a forked child: this reaper is the parent's; close what it inherited."""
        fd, self._last_pid_fd = self._last_pid_fd, None
        if fd is not None and fd >= 0:
            os.close(fd)

    def created_since(self, pid: int) -> bool:
        """`proctable.created_since`, over one ns_last_pid kept open for the process."""
        fd = self._last_pid_fd
        if fd is None:
            with self._lock:
                if self._last_pid_fd is None:
                    self._last_pid_fd = proctable.open_last_pid()
                fd = self._last_pid_fd
        return proctable.created_since(fd, pid)

    def unhold(self) -> None:
        with self._lock:
            self._unhold()

    def _unhold(self) -> None:
        self._holders -= 1
        if self._holders == 0 and not self._already:
            self._prctl(_PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0)

    def marks_of(self, pid: int) -> list[str]:
        """This process's marks in the environment of process `pid` (none: it has none,
        it dropped them, or its environment cannot be read)."""
        value = proctable.environ_value(pid, _MARK_VAR_BYTES)
        if not value:
            return []
        marks = value.decode("ascii", "replace").split()
        return [mark for mark in marks if mark.startswith(self._prefix)]

    def held_elsewhere(self, marks: list[str]) -> bool:
        """Whether `marks` name a running spawn's tree or one that kept its leftovers:
        then the process is theirs. (A mark of a spawn that is over names a leftover it
        missed: anyone ends it.)"""
        with self._lock:
            live = {tree.mark for tree in self._live}
            return any(mark in live or mark in self._kept_marks for mark in marks)

    def _may_have_made(self, tree: SubreaperTree, proc: Proc) -> bool:
        """Whether `tree`'s spawn may have made `proc` (lock held): its child did not
        start after it, or when the child started cannot be told."""
        if tree.pid == 0:
            return True  # being started: its child may exist already
        start = tree.child_start
        if start is None and not tree.exited:
            # Unreaped while its tree has not seen it exit: the pid is still that child's.
            now = proctable.read_stat(tree.pid)
            start = tree.child_start = None if now is None else now.start
        return start is None or start <= proc.start

    def sole_maker(self, tree: SubreaperTree, proc: Proc) -> bool:
        """Whether `tree`'s is the only running spawn that may have made the unmarked
        orphan `proc`; if not, `proc` waits for the last of those spawns to end."""
        with self._lock:
            makers = {t for t in self._live if t is tree or self._may_have_made(t, proc)}
            if makers == {tree}:
                return True
            keep = all(t.keep for t in makers)
            self._pending.setdefault((proc.pid, proc.start), (makers, keep))
            return False

    def exiting(self, tree: SubreaperTree) -> None:
        """`tree`'s child has exited (it is reaped next: its pid no longer names it). Kept
        leftovers that have died since are reaped (they are execkit's children now)."""
        with self._lock:
            tree.exited = True
            if not self._kept:
                return
            kept = list(self._kept.items())
        for pid, start in kept:
            now = proctable.read_stat(pid)
            if now is not None and now.start == start and not now.zombie:
                continue
            proctable.reap([(pid, start)])
            with self._lock:
                self._kept.pop(pid, None)

    def enter(self, tree: SubreaperTree, hold: bool) -> None:
        """`tree`'s spawn starts (and needs this process to be a subreaper if `hold`): it
        gets its mark, where another spawn may run beside it."""
        with self._lock:
            # With one thread and no other spawn, none can start beside it (a spawn blocks
            # its thread): the orphans are its own, unmarked, and Popen keeps its fast path
            # (an environment handed to it is encoded variable by variable, 6% of the
            # parent's work for a short child).
            if self._live or threading.active_count() > 1:
                self._marks += 1
                tree.mark = f"{self._prefix}{self._marks}"
            self._live.add(tree)
            if hold:
                if self._holders == 0 and not self._already:
                    self._prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
                self._holders += 1

    def leave(self, tree: SubreaperTree, held: bool) -> None:
        """`tree`'s spawn is over: the unmarked orphans it was the last possible maker of
        are ended (kept, when every one of their possible makers keeps its leftovers),
        while this process is still a subreaper, so what they had started comes here too."""
        with self._lock:
            self._live.discard(tree)
            due: list[tuple[tuple[int, float], bool]] = []
            for key, (makers, keep) in list(self._pending.items()):
                makers.discard(tree)
                if not makers:
                    del self._pending[key]
                    due.append((key, keep))
            if not due:
                if held:
                    self._unhold()
                return
        for key, keep in due:
            self._end_pending(*key, keep)
        if held:
            self.unhold()

    def _end_pending(self, pid: int, start: float, keep: bool) -> None:
        now = proctable.read_stat(pid)
        if now is None or now.start != start or now.ppid != self.me:
            return  # gone (claimed meanwhile), or the pid names another process by now
        if keep and not now.zombie:
            self.keep([now], None)
            return
        proctable.end_below(now, time.monotonic() + KILL_WAIT_S, SWEEP_ROUNDS)

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

    def keep(self, procs: Iterable[Proc], mark: str | None) -> None:
        with self._lock:
            self._kept.update((proc.pid, proc.start) for proc in procs)
            if mark is not None:
                self._kept_marks.add(mark)

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


class SubreaperTree(Tree):
    """A spawn's tree under the `subreaper` mechanism (module docstring)."""

    def __init__(self, reaper: Reaper, keep: bool) -> None:
        super().__init__()
        self.mechanism = TreeMechanism.SUBREAPER
        self._reaper = reaper
        self.keep = keep
        self._holds = not keep
        self._released = False
        self._owned: set[int] | bool | None = False  # False: not looked up (per snapshot)
        self.mark = ""  # given by `enter` where spawns may run at once; "": none
        self.child_start: float | None = None  # the child's start, once read
        self.exited = False  # the child has exited (set under the reaper's lock)
        # Before the start: an orphan made at once comes here too.
        reaper.enter(self, self._holds)

    def environment(self, options: SpawnOptions) -> Mapping[Any, Any] | None:
        env: Mapping[str, str] | None = options.env
        if not self.mark:
            return env
        if env is None:
            # Popen is handed the bytes os.environ keeps: a copy of os.environ itself
            # decodes every name and value, a hundred times the cost (450 us against
            # 4.6 us on a busy host, a few percent of a short spawn). A starter a caller
            # injects is handed str, as Popen's callers write environments.
            data = getattr(os.environ, "_data", None)  # CPython's own, encoded
            if isinstance(data, dict) and options.start is POPEN_TYPES[0]:
                outer_b = data.get(_MARK_VAR_BYTES)
                mark_b = self.mark.encode()
                return {**data, _MARK_VAR_BYTES: outer_b + b" " + mark_b if outer_b else mark_b}
            env = os.environ
        outer = env.get(MARK_VAR)
        return {**env, MARK_VAR: f"{outer} {self.mark}" if outer else self.mark}

    def starter(self, options: SpawnOptions) -> tuple[ProcessStarter, dict[str, Any]]:
        # Asked for only (a preexec_fn makes Popen fork instead of vfork: a copy of this
        # whole process per start), only for the real Popen (a starter's contract has no
        # preexec_fn), and only with one thread: then no other thread can hold a lock the
        # forked child would need.
        start = options.start
        default = start is POPEN_TYPES[0]
        if not options.die_with_parent or not default or not proctable.single_threaded():
            return start, {}
        return start, {"preexec_fn": self._reaper.pdeathsig_preexec()}

    def snapshot(self) -> list[Proc]:
        self._owned = False  # who owns which child changes between snapshots
        return super().snapshot()

    def _claims(self, proc: Proc, child: Proc | None) -> bool:
        if super()._claims(proc, child):
            return True
        reaper = self._reaper
        if child is not None:
            self.child_start = child.start
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
        ):
            return False
        marks = reaper.marks_of(proc.pid)
        if marks:
            # Made under one of this process's spawns, so no other code's child: this
            # one's; or another running one's, or kept (theirs); or a leftover of one that
            # is over and missed it (anyone's to end).
            return self.mark in marks or not reaper.held_elsewhere(marks)
        # Unmarked: it dropped the mark (`env -i`), or its environment cannot be read.
        if proc.sid == proc.pid:
            if self._owned is False:
                self._owned = proctable.popen_owned()
            owned = self._owned
            # While some Popen is starting its child, any new child may be that one.
            if not isinstance(owned, set) or proc.pid in owned:
                return False
        return reaper.sole_maker(self, proc)

    def child_exited(self, keep: bool) -> None:
        reaper = self._reaper
        reaper.exiting(self)
        if not self._seen:
            if not reaper.created_since(self.pid):
                return  # nothing was created after the child: it left nothing behind
            # All that the child left hangs below execkit's own children now (orphans come
            # here). None but the known ones: nothing was left, no /proc scan needed.
            children = proctable.own_children() if self._holds else None
            if children is not None and children <= reaper.known() | {self.pid}:
                return
        procs = self.snapshot()
        if keep:
            kept = (p for p in procs if p.ppid == reaper.me and not p.zombie)
            reaper.keep(kept, self.mark or None)
            return
        proctable.killpg(self.pid, signal.SIGKILL)
        until = time.monotonic() + KILL_WAIT_S
        for _ in range(SWEEP_ROUNDS):
            if not procs:
                return
            proctable.kill_and_wait([p for p in procs if not p.zombie], until)
            # Dead, every one of them is execkit's child now (orphans come here): reap them.
            proctable.reap((p.pid, p.start) for p in procs)
            procs = self.snapshot()

    def release(self) -> None:
        if not self._released:
            self._released = True
            self._reaper.leave(self, self._holds)
