"""The `session` mechanism, and the base every mechanism builds on: `Tree`.

The child leads its own session and process group (`start_new_session=True`), so a signal
to the group reaches whatever stayed in it. A descendant that left the group (setsid, a
double-forked daemon) is found only by walking the process table from the child while it
is still alive: a timeout's snapshot remembers what it saw, and an orphan seen once is
found again through that memory. A daemon that left the session before any snapshot is
out of this mechanism's reach; the two stronger ones (`subreaper`, `cgroup`) exist for it.

The life of a tree, as the supervisor drives it: `starter` and `environment` (before the
start), `adopt` (right after it), then any of `signal`/`kill` (a timeout, a cancel), `settle` (when
`settle_at` comes, if set), `child_exited` (the child is a zombie: its pid, session and
group cannot be reused until it is reaped, which the caller does next), and `release`
(always, last).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Mapping
from typing import Any

from execkit._exec import proctable
from execkit._exec.options import ProcessStarter, SpawnOptions
from execkit._exec.proctable import Proc
from execkit._exec.result import TreeMechanism

__all__ = ["KILL_WAIT_S", "SWEEP_ROUNDS", "Tree"]

KILL_WAIT_S = 5.0
"""How long ending a tree may wait for killed processes to go (a process in uninterruptible
sleep can take a while to act on SIGKILL; spawn returns regardless after this)."""

SWEEP_ROUNDS = 8
"""Rounds of find-and-kill (or find-and-move) for leftovers that keep forking meanwhile."""


class Tree:
    """A spawn's process tree under the `session` mechanism; the base of the others.

    The calls come in the order the module docstring gives.
    """

    def __init__(self) -> None:
        self.mechanism = TreeMechanism.SESSION
        self.pid = 0
        self._born = 0.0
        self._seen: dict[int, float] = {}  # pid -> start of every process seen in the tree
        # When the supervisor should call `settle` (monotonic seconds), if ever.
        self.settle_at: float | None = None

    def starter(self, options: SpawnOptions) -> tuple[ProcessStarter, dict[str, Any]]:
        """What to start the child with: a starter and arguments to add to its call."""
        return options.start, {}

    def environment(self, options: SpawnOptions) -> Mapping[Any, Any] | None:
        """The environment to start the child with (None: execkit's own, inherited)."""
        return options.env

    def adopt(self, proc: subprocess.Popen[bytes]) -> Tree:
        """Take the started child in; returns the tree that now holds it."""
        self.pid = proc.pid
        self._born = time.monotonic()
        return self

    def _claims(self, proc: Proc, child: Proc | None) -> bool:
        return (
            proc.sid == self.pid or proc.pgrp == self.pid or self._seen.get(proc.pid) == proc.start
        )

    def snapshot(self) -> list[Proc]:
        """The tree now, the child left out: its descendants, and the processes this spawn
        claims with theirs. Remembered, so an orphan seen once is still found later."""
        procs = proctable.table(self.pid, time.monotonic() - self._born)
        child = procs.get(self.pid)
        roots = [p.pid for p in procs.values() if p.pid != self.pid and self._claims(p, child)]
        found = set(roots) | proctable.descendants(procs, [self.pid, *roots])
        found -= {self.pid, os.getpid()}
        tree = [procs[pid] for pid in found]
        for proc in tree:
            self._seen[proc.pid] = proc.start
        return tree

    def signal(self, sig: int) -> None:
        """`sig` to the child's process group and to each process of the tree that left it.

        Members still in the group are not signalled twice: some programs read a second
        SIGTERM as "stop right now".
        """
        # The snapshot first: once the child dies, its children are re-parented and can no
        # longer be found from it.
        tree = self.snapshot()
        proctable.killpg(self.pid, sig)
        for proc in tree:
            if proc.pgrp != self.pid and not proc.zombie:
                proctable.send(proc, sig)

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
        proctable.killpg(self.pid, signal.SIGKILL)
        if self._seen:  # a timeout's snapshot found descendants that may have left the group
            leftovers = [p for p in self.snapshot() if not p.zombie]
            proctable.kill_and_wait(leftovers, time.monotonic() + KILL_WAIT_S)

    def release(self) -> None:
        """The spawn is over, however it ended: give back what it held."""
