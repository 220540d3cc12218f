"""Plain helpers shared by several test modules (fixtures would go in a conftest.py).

Imported as `_support`: tests/ is not a package, and pytest puts it on sys.path when it
imports a test module from it (the default `prepend` import mode).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import psutil

from execkit._exec import Cancellation, SpawnFailure, SpawnResult
from execkit.dispatch import BoardIssue, RunOutcome, Slot

REPO = Path(__file__).resolve().parent.parent

# A board whose issues start in `todo` and end in `done` or `blocked`.
BOARD_STATES = [
    {"name": "todo", "eligible": True},
    {"name": "done", "terminal": True},
    {"name": "blocked", "terminal": True},
]


def gone(pid: int) -> bool:
    """Dead or a zombie nobody reaped yet (in a container pid 1 may never reap)."""
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def wait_gone(pid: int, within: float = 15.0) -> bool:
    """Whether `pid` is gone within `within` seconds (polled, so bounded under load)."""
    deadline = time.monotonic() + within
    while time.monotonic() < deadline and not gone(pid):
        time.sleep(0.02)
    return gone(pid)


def spawn_result(
    argv: tuple[str, ...] = ("codex", "exec", "fix the test"),
    *,
    exit_code: int | None = 0,
    stdout: str = "",
    stderr: str = "",
    spawn_errno: int | None = None,
    spawn_error: str | None = None,
    spawn_failure: SpawnFailure | None = None,
    timed_out: bool = False,
    signal: int | None = None,
) -> SpawnResult:
    """A `SpawnResult` as `spawn` would report it, without running anything.

    With `spawn_errno` the process never started (no pid, no exit code); with `signal`
    it has no exit code either.
    """
    never_started = spawn_errno is not None
    return SpawnResult(
        argv=argv,
        pid=None if never_started else 4242,
        exit_code=None if never_started or signal is not None else exit_code,
        signal=signal,
        spawn_errno=spawn_errno,
        spawn_error=spawn_error,
        timed_out=timed_out,
        duration_s=0.25,
        stdout_tail=stdout,
        stderr_tail=stderr,
        stdout_bytes=len(stdout.encode()),
        stderr_bytes=len(stderr.encode()),
        stdout_truncated=False,
        stderr_truncated=False,
        spawn_failure=spawn_failure,
    )


def write_board(
    path: Path,
    issues: Sequence[Mapping[str, object]],
    *,
    states: Sequence[object] | None = None,
    **extra: object,
) -> Path:
    """Write a JSON board file (`BOARD_STATES` unless `states` is given); returns `path`."""
    doc = {
        "states": BOARD_STATES if states is None else list(states),
        "issues": [dict(issue) for issue in issues],
        **extra,
    }
    path.write_text(json.dumps(doc))
    return path


def run_execkit(*args: str) -> subprocess.CompletedProcess[str]:
    """`python -m execkit ARGS` in a real process that imports this checkout (bounded)."""
    return subprocess.run(
        [sys.executable, "-m", "execkit", *args],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )


def table_columns(text: str) -> list[dict[str, str]]:
    """The rows of an aligned text table (`execkit status`) as {header: cell}.

    Columns are cut at the header's word positions (a header may hold a space, as in
    `LAST CLASS`, when its words are one space apart); the last column runs to the end
    of the line. The table ends at the first blank line after the header.
    """
    lines = text.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith("ISSUE "))
    header = lines[start]
    bounds = [0] + [
        n for n in range(2, len(header)) if header[n - 2 : n] == "  " and header[n] != " "
    ]
    names = [header[a:b].strip() for a, b in zip(bounds, [*bounds[1:], None], strict=True)]
    rows = []
    for line in lines[start + 1 :]:
        if not line.strip():
            break
        cells = [line[a:b].strip() for a, b in zip(bounds, [*bounds[1:], None], strict=True)]
        rows.append(dict(zip(names, cells, strict=True)))
    return rows


def a_slot(attempt: int = 1, adapter: str = "generic") -> Slot:
    """A dispatcher's `Slot` for calling a runner by hand: no lease to renew, never
    cancelled (its descriptors close with the process)."""
    return Slot(
        run_id=f"r-{attempt}",
        attempt=attempt,
        adapter=adapter,
        heartbeat=lambda: None,
        heartbeat_s=60.0,
        cancel=Cancellation(),
    )


class BeatingRunner:
    """A dispatcher `Runner` that works a while without spawning: it renews its lease
    `beats` times (`every_s` apart, through the slot, as `run_agent` does), then answers
    `outcomes[issue id]` (else success). `beats_done` counts the renewals per issue."""

    def __init__(
        self,
        outcomes: Mapping[str, RunOutcome] | None = None,
        beats: int = 3,
        every_s: float = 0.05,
    ) -> None:
        self.outcomes = dict(outcomes or {})
        self.beats = beats
        self.every_s = every_s
        self.beats_done: dict[str, int] = {}

    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        for _ in range(self.beats):
            slot.cancel.wait(self.every_s)
            slot.heartbeat()
            self.beats_done[issue.id] = self.beats_done.get(issue.id, 0) + 1
        return self.outcomes.get(issue.id, RunOutcome("succeeded"))


def protocol_trace(conn: Any, call: Callable[[], object]) -> list[tuple[str, str]]:
    """(F or B, message kind) of every PostgreSQL protocol message on psycopg connection
    `conn` while `call` runs, in order, from libpq's own trace (`PQtrace`): what went to
    the server (F) and came back (B), no timing."""
    import tempfile

    from psycopg import pq

    with tempfile.TemporaryFile(mode="w+") as trace:
        conn.pgconn.trace(trace.fileno())
        conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
        try:
            call()
        finally:
            conn.pgconn.untrace()
        trace.seek(0)
        lines = [line.split("\t") for line in trace.read().splitlines()]
    # A traced line is "F|B <tab> length <tab> kind ...".
    return [(fields[0], fields[2].split(" ")[0]) for fields in lines if len(fields) > 2]


def spy_on_reads(monkeypatch: Any, store: Any, spy: Callable[[Any], Any]) -> None:
    """Every read transaction of `store` (`store.read()`) hands its block `spy(tx)` instead
    of the transaction: a test wraps the `Tx` reads it counts (the rest pass through)."""
    real_read = store.read

    class Reading:
        def __init__(self) -> None:
            self._inner = real_read()

        def __enter__(self) -> Any:
            return spy(self._inner.__enter__())

        def __exit__(self, *exc: Any) -> Any:
            return self._inner.__exit__(*exc)

    monkeypatch.setattr(store, "read", Reading)


# ------------------------------------------------------------ descendants left behind


def daemonizing_agent(marker: str, pidfile: Path, then: str, *, clear_env: bool = False) -> str:
    """A bash script for `bash -c`: the issue-44 agent. It leaves a daemon behind, as
    `( setsid bash -c "exec -a NAME sleep 600" & )` does (its own session, re-parented at
    once), named `marker` in its argv[0] so it can be found, its pid written to `pidfile`
    before it becomes the sleeper; then it runs `then` (a bash command list). With
    `clear_env` the daemon starts from an empty environment (`env -i`)."""
    inner = 'printf "%s\\n" $$ > "$0"; exec -a "$1" /usr/bin/sleep 600'
    prefix = "env -i " if clear_env else ""
    quoted = " ".join(f"'{part}'" for part in (inner, str(pidfile), marker))
    return f"( setsid {prefix}/usr/bin/bash -c {quoted} & ); {then}"


def marked_alive(marker: str) -> list[int]:
    """Pids of the live processes (zombies aside) whose argv[0] starts with `marker`."""
    found = []
    for proc in psutil.process_iter(["cmdline", "status"]):
        cmdline = proc.info["cmdline"] or []
        alive = proc.info["status"] != psutil.STATUS_ZOMBIE
        if cmdline and cmdline[0].startswith(marker) and alive:
            found.append(proc.pid)
    return found


def marked_left(marker: str, within: float = 15.0) -> list[int]:
    """The processes named `marker` still alive once those being killed have had
    `within` seconds to go (polled: a bound, never a timing assertion)."""
    deadline = time.monotonic() + within
    while (left := marked_alive(marker)) and time.monotonic() < deadline:
        time.sleep(0.05)
    return left


def kill_marked(marker: str) -> None:
    """Clean-up: SIGKILL every process named `marker` (a failing test leaves none)."""
    for pid in marked_alive(marker):
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()


def written_pids(paths: Sequence[Path]) -> list[int]:
    """The pids in those of `paths` that hold a whole line (written by `daemonizing_agent`)."""
    pids = []
    for path in paths:
        text = path.read_text() if path.exists() else ""
        if text.endswith("\n"):
            pids.append(int(text))
    return pids
