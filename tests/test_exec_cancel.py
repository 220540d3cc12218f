"""`Cancellation`: a spawn (and an agent's loop) stopped from another thread, tree and all."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

import pytest
from _support import wait_gone

from execkit import (
    AgentRequest,
    Cancellation,
    RunRecorder,
    SpawnCancelled,
    get_adapter,
    run_agent,
    spawn,
)

PY = [sys.executable, "-I", "-S"]


def _cancel_when(cancel: Cancellation, path: Path) -> threading.Thread:
    """Cancel from another thread once `path` exists (the child is up), bounded."""

    def watch() -> None:
        for _ in range(6000):
            if path.exists() and path.read_text():
                cancel.cancel()
                return
            cancel.wait(0.01)
        cancel.cancel()

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    return thread


def test_a_cancel_from_another_thread_kills_the_whole_tree(tmp_path: Path) -> None:
    pids = tmp_path / "pids"
    # The child starts a grandchild that ignores SIGTERM, writes both pids, then sleeps.
    script = (
        "import os, signal, subprocess, sys, time\n"
        "kid = subprocess.Popen([sys.executable, '-c', "
        "'import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)'])\n"
        f"open({str(pids)!r}, 'w').write(f'{{os.getpid()}} {{kid.pid}}')\n"
        "time.sleep(600)\n"
    )
    with Cancellation() as cancel:
        watcher = _cancel_when(cancel, pids)
        with pytest.raises(SpawnCancelled):
            spawn([*PY, "-c", script], timeout=120, cancel=cancel)
        watcher.join(60)
        assert cancel.cancelled
    child, grandchild = map(int, pids.read_text().split())
    assert wait_gone(child) and wait_gone(grandchild)


def test_cancelled_before_the_start_starts_nothing() -> None:
    started: list[list[str]] = []

    def start(argv: list[str], **kwargs: object) -> subprocess.Popen[bytes]:
        started.append(argv)
        return subprocess.Popen(argv, **kwargs)  # type: ignore[call-overload, no-any-return]

    with Cancellation() as cancel:
        cancel.cancel()
        cancel.cancel()  # idempotent
        with pytest.raises(SpawnCancelled):
            spawn(["true"], start=start, cancel=cancel)
    assert started == []


def test_an_uncancelled_spawn_runs_as_usual() -> None:
    with Cancellation() as cancel:
        result = spawn(["sh", "-c", "echo hi"], cancel=cancel)
        assert result.ok and result.stdout_tail == "hi\n" and not cancel.cancelled


def test_wait_returns_at_once_on_a_cancel() -> None:
    with Cancellation() as cancel:
        assert cancel.wait(0) is False
        cancel.cancel()
        assert cancel.wait(3600) is True  # an hour asked for, returns at once
    assert cancel.cancelled  # still readable after close
    assert "cancelled=True" in repr(cancel)


def test_run_agent_stops_without_recording_a_charged_failure(tmp_path: Path) -> None:
    marker = tmp_path / "up"
    recorder = RunRecorder()
    script = f"open({str(marker)!r}, 'w').write('x'); import time; time.sleep(600)"
    request = AgentRequest(prompt="", extra_args=(*PY, "-c", script))

    with Cancellation() as cancel:
        _cancel_when(cancel, marker)
        with pytest.raises(SpawnCancelled):
            run_agent(
                get_adapter("generic"),
                request,
                max_attempts=3,
                cancel=cancel,
                recorder=recorder,
            )
    # Nothing recorded: the caller, which stopped it, decides what the run says.
    assert recorder.agents == ()
