"""The rows a store's own admissions and results left, kept to decide the next one on
without reading them first (issue #33: an admission and a result in one round trip each).

An admission or a run's result that commits reads back, in the batch that commits and
under its task's lock, the task row as it leaves it, the row's version (`xmin`, the id of
the transaction that wrote it), its running run if any (with its version and its lane),
and, for an open task with nothing running that this store worked before, the number its
next run will take (drawn under that lock, so a task's runs stay numbered in their order;
a store that meets a task once, as a CLI command does, draws none, so its run ids have no
gaps). The next admission of
that task, or the result of that run, from this store decides in Python on that copy
(the rule has one source) and sends its writes behind a guard that locks the row and
checks its version: the database admits it only if nobody changed the row since the copy
was taken, and otherwise nothing is written and the transaction is run again on rows
read under the lock (`StaleCopy`). A run number drawn for a copy that is never used
leaves a gap, as a rolled-back admission always did.

A row's version repeats only after 2**32 transactions; a copy is dropped when a guard
finds it stale and the store keeps at most `MAX_COPIES` (the oldest go first).
"""

from __future__ import annotations

import threading
from typing import NamedTuple

from execkit.ledger._core import TaskRecord
from execkit.ledger._model import Run

__all__ = ["MAX_COPIES", "Copies", "TaskCopy"]

MAX_COPIES = 1024


class TaskCopy(NamedTuple):
    """A task row as this store's last transaction on it committed it."""

    record: TaskRecord
    version: int  # the row's xmin
    next_number: int | None  # the next run's number, drawn; None: running or finished
    run: Run | None  # its running run
    run_version: int | None
    run_lane: str | None


UNREAD = object()


class Copies:
    """The copies of one store, by task id (and their running run's id); thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._by_task: dict[str, TaskCopy] = {}
        self._task_of_run: dict[str, str] = {}
        # The spend configuration's stored text as this store's last admission read it
        # (issue #45), `_UNREAD` before any: an admission on a copy answers its read
        # from it, behind a guard that finds it unchanged.
        self.spend: str | object | None = UNREAD

    def __len__(self) -> int:
        return len(self._by_task)

    def of_task(self, task_id: str) -> TaskCopy | None:
        with self._lock:
            return self._by_task.get(task_id)

    def of_run(self, run_id: str) -> TaskCopy | None:
        """The copy whose running run is `run_id`."""
        with self._lock:
            task_id = self._task_of_run.get(run_id)
            return None if task_id is None else self._by_task.get(task_id)

    def put(self, copy: TaskCopy) -> None:
        task_id = copy.record.id
        with self._lock:
            self._forget(task_id)
            if len(self._by_task) >= MAX_COPIES:
                self._forget(next(iter(self._by_task)))
            self._by_task[task_id] = copy
            if copy.run is not None:
                self._task_of_run[copy.run.id] = task_id

    def drop(self, task_id: str) -> None:
        with self._lock:
            self._forget(task_id)

    def _forget(self, task_id: str) -> None:
        old = self._by_task.pop(task_id, None)
        if old is not None and old.run is not None:
            self._task_of_run.pop(old.run.id, None)
