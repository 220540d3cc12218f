"""The worker threads that run the server's ledger calls, off the event loop.

Why not `loop.run_in_executor` with a `ThreadPoolExecutor`: a request's hop there (a
concurrent future, `submit` looking for an idle thread, the future chained back to the
loop) was a fifth of the event loop's time on a GET. Here one hop is a `SimpleQueue.put`
and a `call_soon_threadsafe`: the call and what to do with its outcome go on the queue, a
worker runs it and hands the outcome to the loop in one callback (`submit`: no future,
no task; `run` wraps it in a future for a coroutine to await).

At most `size` threads, started when a call finds none idle; each lives until `close`.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import Callable
from typing import Any, TypeVar

__all__ = ["WorkerThreads"]

T = TypeVar("T")

# What is done on the loop with a call's outcome: its value, or the exception it raised.
Done = Callable[[Any, BaseException | None], None]
_Item = tuple[asyncio.AbstractEventLoop, Done, Callable[..., Any], tuple[Any, ...]]


def _settler(future: asyncio.Future[Any]) -> Done:
    def settle(value: Any, error: BaseException | None) -> None:
        if future.cancelled():  # the request's deadline passed: nobody waits for the answer
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(value)

    return settle


class WorkerThreads:
    """At most `size` (1..1024) threads running calls for an event loop (thread-safe)."""

    def __init__(self, size: int, *, name: str = "execkit-serve") -> None:
        if isinstance(size, bool) or not isinstance(size, int) or not 1 <= size <= 1024:
            raise ValueError(f"workers must be a whole number in 1..1024, got {size!r}")
        self._size = size
        self._name = name
        self._queue: queue.SimpleQueue[_Item | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self._idle = 0  # threads waiting for a call
        self._queued = 0  # calls not yet taken by a thread
        self._closed = False

    def run(self, function: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        """`function(*args)` in a worker thread, as a future of the running loop."""
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self.submit(loop, _settler(future), function, *args)
        return future

    def submit(
        self, loop: asyncio.AbstractEventLoop, done: Done, function: Callable[..., Any], *args: Any
    ) -> None:
        """`function(*args)` in a worker thread, then `done(value, None)` (or `done(None,
        exception)`) on `loop` (not called when the loop has closed). RuntimeError once
        closed."""
        with self._lock:
            if self._closed:
                raise RuntimeError("the worker threads are closed")
            self._queued += 1
            if self._queued > self._idle and len(self._threads) < self._size:
                thread = threading.Thread(
                    target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            self._queue.put((loop, done, function, args))

    def _work(self) -> None:
        while True:
            with self._lock:
                self._idle += 1
            item = self._queue.get()
            with self._lock:
                self._idle -= 1
                if item is not None:
                    self._queued -= 1
            if item is None:
                return
            loop, done, function, args = item
            try:
                value, error = function(*args), None
            except BaseException as exc:  # handed to the awaiting request
                value, error = None, exc
            del item, function, args
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits
                loop.call_soon_threadsafe(done, value, error)

    def close(self) -> None:
        """Stop every thread once the calls queued before have run; wait for them."""
        with self._lock:
            self._closed = True
            threads = list(self._threads)
        for _ in threads:
            self._queue.put(None)
        for thread in threads:
            thread.join()
