"""execkit.spawn_async: same contract as spawn, real concurrency, cancellation kills the tree."""

from __future__ import annotations

import asyncio
import errno
import signal
import sys
import threading
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest
from _support import gone, wait_gone

from execkit import InvalidInput
from execkit._exec import SpawnResult, spawn, spawn_async

T = TypeVar("T")

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "exec"
PY = [sys.executable, "-I", "-S"]


def run(coro: Coroutine[Any, Any, T]) -> T:
    async def bounded() -> T:
        return await asyncio.wait_for(coro, 120)

    return asyncio.run(bounded())


def test_same_result_as_spawn() -> None:
    argv = ["sh", "-c", "echo out; echo err >&2; exit 5"]
    async_result = run(spawn_async(argv))
    sync_result = spawn(argv)
    fields = ("exit_code", "signal", "spawn_errno", "stdout_tail", "stderr_tail", "stdout_bytes")
    assert [getattr(async_result, f) for f in fields] == [getattr(sync_result, f) for f in fields]


def test_spawn_failure_is_a_result_not_an_exception() -> None:
    result = run(spawn_async(["execkit-no-such-binary-xyz"]))
    assert result.spawn_errno == errno.ENOENT


def test_bad_arguments_raise_in_the_awaiting_task() -> None:
    with pytest.raises(InvalidInput, match="timeout"):
        run(spawn_async(["true"], timeout=-1))
    with pytest.raises(TypeError, match="argv"):
        run(spawn_async("true"))  # a str is a Sequence[str]: only runtime catches it


def test_timeout_works_the_same() -> None:
    result = run(spawn_async(["sleep", "60"], timeout=0.3, kill_grace=5))
    assert result.timed_out and result.signal == signal.SIGTERM


def test_spawns_run_concurrently(tmp_path: Path) -> None:
    # Each child waits for the file the other one's callback creates: run one after the
    # other (a shared small pool, a lock), this deadlocks into the 60 s fixture bound.
    a_flag, b_flag = tmp_path / "a", tmp_path / "b"

    def touch_when_ready(flag: Path) -> Callable[[bytes], None]:
        def on_stdout(chunk: bytes) -> None:
            if b"ready" in chunk:
                flag.touch()

        return on_stdout

    async def both() -> list[SpawnResult]:
        waits = [
            spawn_async(
                [*PY, str(FIXTURES / "wait_for_file.py"), str(b_flag)],
                on_stdout=touch_when_ready(a_flag),
                timeout=90,
            ),
            spawn_async(
                [*PY, str(FIXTURES / "wait_for_file.py"), str(a_flag)],
                on_stdout=touch_when_ready(b_flag),
                timeout=90,
            ),
        ]
        return list(await asyncio.gather(*waits))

    for result in run(both()):
        assert result.ok, result.failure_text()
        assert result.stdout_tail == "ready\nseen\n"


def test_many_concurrent_spawns_are_not_serialised_by_a_small_pool() -> None:
    # Each callback holds its supervising thread until every child has been heard from.
    # With fewer threads than spawns (the default executor has at most 32) the barrier
    # breaks, the callbacks raise and the spawns fail.
    count = 40
    barrier = threading.Barrier(count, timeout=60)

    def meet(_chunk: bytes) -> None:
        barrier.wait()

    async def many() -> list[SpawnResult]:
        return list(
            await asyncio.gather(
                *(spawn_async(["echo", "up"], on_stdout=meet) for _ in range(count))
            )
        )

    results = run(many())
    assert all(r.ok and r.stdout_tail == "up\n" for r in results)


def test_cancelling_the_task_kills_the_whole_tree(tmp_path: Path) -> None:
    pidfile = tmp_path / "pids"

    async def start_then_cancel() -> None:
        task = asyncio.ensure_future(
            spawn_async([*PY, str(FIXTURES / "tree.py"), str(pidfile)], kill_grace=30)
        )
        deadline = time.monotonic() + 60
        while not pidfile.exists():
            assert time.monotonic() < deadline, "fixture never came up"
            assert not task.done(), task
            await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    pids: list[int] = []
    try:
        run(start_then_cancel())
        pids = [int(p) for p in pidfile.read_text().split()]
        child, in_group, escaped = pids
        # Killed and reaped before the cancellation propagated: no 30 s grace waited out.
        assert gone(child)
        assert wait_gone(in_group) and wait_gone(escaped)
    finally:
        for pid in pids:
            if not gone(pid):
                psutil.Process(pid).kill()
