"""Slots: where the dispatcher's agents run side by side (`SlotExecutor`).

A slot is one agent's whole dispatch: its runner, its process tree, its lease renewals and
the write of its result, in a thread of its own, so a 20-minute agent never holds up
another issue. The dispatcher itself stays in one thread: it admits runs, moves cards and
reports events there, in the order it chooses.

`ThreadPerSlot` is the default: a thread per slot, ended with its slot (no pool to size or
to shut down; the dispatcher bounds how many run at once). `InlineExecutor` runs a slot
at once in the caller's thread: the seam a test (or the demo, on its virtual clock) injects
so that a pass is deterministic.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Protocol, TypeVar

__all__ = ["InlineExecutor", "SlotExecutor", "ThreadPerSlot"]

T = TypeVar("T")


class SlotExecutor(Protocol):
    """Runs a slot's work and hands back its `Future` (a `concurrent.futures.Executor`
    fits). The work never raises: the dispatcher turns every failure into an outcome."""

    def submit(self, work: Callable[[], T], /) -> Future[T]: ...


class InlineExecutor:
    """Runs each slot at once, in the caller's thread: one agent at a time, in order."""

    def submit(self, work: Callable[[], T], /) -> Future[T]:
        future: Future[T] = Future()
        try:
            future.set_result(work())
        except BaseException as exc:  # handed over like an executor would
            future.set_exception(exc)
        return future


class ThreadPerSlot:
    """A daemon thread per slot, named after it, ended when the slot ends."""

    def __init__(self, name: str = "execkit-slot") -> None:
        self._name = name
        self._count = 0
        self._lock = threading.Lock()

    def submit(self, work: Callable[[], T], /) -> Future[T]:
        future: Future[T] = Future()
        future.set_running_or_notify_cancel()

        def run() -> None:
            try:
                future.set_result(work())
            except BaseException as exc:
                future.set_exception(exc)

        with self._lock:
            self._count += 1
            name = f"{self._name}-{self._count}"
        threading.Thread(target=run, name=name, daemon=True).start()
        return future
