"""No process left behind: how a spawn's process tree is contained, chosen once here.

Every spawn's tree is contained with the strongest mechanism this process has
(`tree_mechanism()`; `SpawnResult.tree_mechanism` says what held each spawn), one file
each:

- `cgroup` (`cgroup.py`): a cgroup v2 of its own, from 50 ms after the start on; whatever
  the child starts is born in it however it daemonizes, and `cgroup.kill` ends it all;
- `subreaper` (`subreaper.py`): this process a child subreaper while the spawn runs, so
  the tree's orphans are re-parented to execkit, found in /proc and killed; where spawns
  may run at once, the child's environment carries the spawn's mark (`EXECKIT_SPAWN`),
  which tells whose an orphan is (a subreaper is process-wide);
- `session` (`session.py`): the child's session and process group, plus whatever a
  timeout's snapshot of its tree found (a daemon that left the session is out of reach).

When the child exits, whatever it left in its tree is SIGKILLed before `spawn` returns
(`keep_descendants=True` leaves them running, moved out of the spawn's cgroup into
execkit's own). A timeout, a cancel or an exception stops the whole tree either way.

What this process can use is found out once, at the first spawn (or the first
`tree_mechanism()` call), and kept in one object, `_CONTAINMENT`, behind its own lock:
the cgroup home, the reaper and the mechanism tests or benchmarks forced. A forked child
is another process: its spawns need their own cgroups, and it is no subreaper (that is not
inherited), so it finds out afresh.
"""

from __future__ import annotations

import os
import threading

from execkit._exec.result import TreeMechanism
from execkit._exec.tree.cgroup import CgroupHome, CgroupTree
from execkit._exec.tree.session import Tree
from execkit._exec.tree.subreaper import Reaper, SubreaperTree

__all__ = ["Tree", "force_mechanism", "new_tree", "tree_mechanism"]


class _Containment:
    """What this process contains spawns with, found at the first spawn: the cgroup home
    (None where no cgroup v2 is writable) and the reaper (None without prctl); and the
    mechanism forced for new spawns, if any."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._found = False
        self._home: CgroupHome | None = None
        self._reaper: Reaper | None = None
        self.forced: TreeMechanism | None = None

    def _find(self) -> None:
        if self._found:
            return
        with self._lock:
            if not self._found:
                self._home = CgroupHome.create()
                self._reaper = Reaper.create()
                self._found = True  # last: a thread that sees it sees both

    def reaper(self) -> Reaper | None:
        self._find()
        return self._reaper

    def cgroups(self) -> CgroupHome | None:
        """The cgroup home, while it works (the `cgroup` mechanism also needs a reaper)."""
        self._find()
        home = self._home
        if home is None or home.broken or self._reaper is None:
            return None
        return home

    def default(self) -> TreeMechanism:
        if self.cgroups() is not None:
            return TreeMechanism.CGROUP
        if self.reaper() is not None:
            return TreeMechanism.SUBREAPER
        return TreeMechanism.SESSION

    def tree(self, mechanism: TreeMechanism | None, keep: bool) -> Tree:
        """A new spawn's tree under `mechanism` (None: the default, the strongest there is)."""
        self._find()
        if mechanism is TreeMechanism.SESSION:
            return Tree()
        reaper = self._reaper
        if reaper is None:
            return Tree()
        home = self._home
        if home is not None and not home.broken and mechanism is not TreeMechanism.SUBREAPER:
            return CgroupTree(reaper, home, keep)
        return SubreaperTree(reaper, keep)

    def after_fork_in_child(self) -> None:
        # The parent's cgroups and reaper are not this process's: close what was inherited
        # and find out afresh at the next spawn. The lock may have been held by a thread
        # that does not exist here. A forced mechanism stays forced.
        if self._home is not None:
            self._home.forget()
        if self._reaper is not None:
            self._reaper.forget()
        self._lock = threading.Lock()
        self._home = self._reaper = None
        self._found = False


_CONTAINMENT = _Containment()
os.register_at_fork(after_in_child=_CONTAINMENT.after_fork_in_child)


def tree_mechanism() -> TreeMechanism:
    """The mechanism that contains the process trees of spawns made now in this process
    (see `TreeMechanism`; the `execkit._exec.tree` docstring says what each one does). The
    first call (or the first spawn) finds it out."""
    return _CONTAINMENT.forced or _CONTAINMENT.default()


def force_mechanism(mechanism: str | None) -> bool:
    """Tests and benchmarks: new spawns use `mechanism` (None: the default again). Returns
    False, changing nothing, where that mechanism is not available."""
    if mechanism is None:
        _CONTAINMENT.forced = None
        return True
    wanted = TreeMechanism(mechanism)
    if wanted is TreeMechanism.CGROUP and _CONTAINMENT.cgroups() is None:
        return False
    if wanted is TreeMechanism.SUBREAPER and _CONTAINMENT.reaper() is None:
        return False
    _CONTAINMENT.forced = wanted
    return True


def new_tree(keep: bool) -> Tree:
    """The tree a new spawn's child is held in (`keep`: its `keep_descendants`)."""
    return _CONTAINMENT.tree(_CONTAINMENT.forced, keep)
