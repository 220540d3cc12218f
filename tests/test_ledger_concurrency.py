"""Real processes on one ledger (an SQLite file, a PostgreSQL server): the admission race,
and SIGKILL in mid-admission. Every test runs on both backends."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from ledger_backends import Opener, RawSql

from execkit.ledger import DEFAULT_LEASE_S

_WORKER = r"""
import json, sys, time
from pathlib import Path
from execkit._errors import AdmissionRefused
from execkit.ledger import DEFAULT_LEASE_S, open_ledger

db, task_id, name, answers, sync = sys.argv[1:6]
ledger = open_ledger(db)
Path(sync, f"ready-{name}").touch()
deadline = time.monotonic() + 240
while not Path(sync, "go").exists():
    if time.monotonic() > deadline:
        sys.exit("never told to go")
    time.sleep(0.005)
admitted, refusals, calls = [], {}, 0
while len(admitted) + sum(refusals.values()) < int(answers):
    if time.monotonic() > deadline:
        sys.exit("deadline")
    calls += 1
    try:
        # About the limit, not time: each worker retries at once.
        run = ledger.start_run(
            task_id, request_key=f"{name}-{calls}", actor=name, ignore_backoff=True
        )
    except AdmissionRefused as refused:
        if refused.code == "blocked":
            # Another worker's run is still active: not an answer about the limit.
            time.sleep(0.001)
            continue
        refusals[refused.code] = refusals.get(refused.code, 0) + 1
        continue
    ledger.finish_run(run.id, "failed", reason=f"{name} failed on purpose")
    admitted.append(run.attempt)
print(json.dumps({"admitted": admitted, "refusals": refusals, "calls": calls}))
"""


def _wait_for(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


@pytest.mark.slow
def test_eight_processes_admit_exactly_the_limit(
    tmp_path: Path, opener: Opener, ledger_target: str
) -> None:
    """8 processes x 50 admission answers on one task with limit 25: exactly 25 runs.

    A `blocked` refusal (another process's run is still active) is retried and not counted,
    so every worker gets 50 answers about the limit itself (admitted or attempt_limit).
    """
    with opener() as ledger:
        task = ledger.create_task("contended", max_attempts=25, actor="test")
    workers = [
        subprocess.Popen(
            [sys.executable, "-c", _WORKER, ledger_target, task.id, f"w{i}", "50", str(tmp_path)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(8)
    ]
    try:
        _wait_for(lambda: len(list(tmp_path.glob("ready-*"))) == 8, 180, "workers to start")
        (tmp_path / "go").touch()
        results = []
        for worker in workers:
            out, err = worker.communicate(timeout=300)
            assert worker.returncode == 0, err
            results.append(json.loads(out))
    finally:
        for worker in workers:
            if worker.poll() is None:
                worker.kill()
                worker.wait()

    admitted = sorted(a for r in results for a in r["admitted"])
    assert admitted == list(range(1, 26))
    refusals: dict[str, int] = {}
    for result in results:
        for code, count in result["refusals"].items():
            refusals[code] = refusals.get(code, 0) + count
    assert refusals == {"attempt_limit": 8 * 50 - 25}
    with opener() as ledger:
        runs = ledger.runs(task.id)
        assert [run.attempt for run in runs] == list(range(1, 26))
        assert {run.status for run in runs} == {"failed"}
        assert len({run.request_key for run in runs}) == 25
        shown = ledger.get_task(task.id)
        assert (shown.attempts_started, shown.blocked_on) == (25, "attempt_limit")
        assert ledger.validate() == []


_HOLD_IN_ADMISSION = r"""
import importlib, sys, time
from pathlib import Path
from execkit.ledger import DEFAULT_LEASE_S, open_ledger

db, task_id, marker, module = sys.argv[1:5]
backend = importlib.import_module(module)  # the backend's own seam

def hold() -> None:
    Path(marker).touch()  # the run row is inserted; COMMIT has not happened
    time.sleep(600)

backend._after_admission_insert = hold
open_ledger(db).start_run(task_id, request_key="doomed", actor="crasher")
"""

_SEAMS = {"sqlite": "execkit.ledger._sqlite.tx", "postgres": "execkit.ledger._postgres.tx"}
# Opening a second ledger while the child holds its admission open: SQLite must not wait
# out the writer's lock; PostgreSQL's reads never wait for a writer.
_SECOND = {"sqlite": {"lock_timeout_s": 0.2}, "postgres": {}}


def test_sigkill_inside_the_admission_transaction_leaves_no_run(
    tmp_path: Path, opener: Opener, ledger_target: str, backend: str
) -> None:
    marker = tmp_path / "inserted"
    with opener() as ledger:
        task = ledger.create_task("t", max_attempts=2, actor="test")
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            _HOLD_IN_ADMISSION,
            ledger_target,
            task.id,
            str(marker),
            _SEAMS[backend],
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        _wait_for(lambda: marker.exists() or child.poll() is not None, 120, "the insert")
        assert child.poll() is None, child.stderr.read() if child.stderr else ""
        # While it holds the write lock (the task's row lock), no other process can admit
        # (or see its run).
        with opener(**_SECOND[backend]) as other:
            assert other.runs(task.id) == []
        os.kill(child.pid, signal.SIGKILL)
    finally:
        if child.poll() is None:
            child.kill()
        child.wait(timeout=60)
    assert child.returncode == -signal.SIGKILL

    with opener() as ledger:
        assert ledger.runs(task.id) == []
        assert ledger.validate() == []
        assert [e.action for e in ledger.audit_events()] == ["task.create"]
        # The killed request consumed no attempt and left no key behind.
        run = ledger.start_run(task.id, request_key="doomed", actor="again")
        assert (run.attempt, run.actor) == (1, "again")


_LOOP = r"""
import sys
from execkit.ledger import DEFAULT_LEASE_S, open_ledger

db, task_id = sys.argv[1:3]
ledger = open_ledger(db)
n = 0
while True:
    n += 1
    run = ledger.start_run(
        task_id, request_key=f"loop-{n}", actor="looper", ignore_backoff=True
    )
    print(run.attempt, flush=True)
    ledger.finish_run(run.id, "failed", reason="loop")
"""


@pytest.mark.slow
def test_sigkill_at_random_moments_leaves_only_whole_runs(
    opener: Opener, ledger_target: str, raw_sql: RawSql
) -> None:
    with opener() as ledger:
        task = ledger.create_task("t", max_attempts=10000, actor="test")
    rng = random.Random(6)
    for _round in range(4):
        child = subprocess.Popen(
            [sys.executable, "-c", _LOOP, ledger_target, task.id],
            stdout=subprocess.PIPE,
            text=True,
        )
        try:
            assert child.stdout is not None
            child.stdout.readline()  # it is admitting now
            time.sleep(rng.uniform(0.0, 0.3))
            os.kill(child.pid, signal.SIGKILL)
        finally:
            if child.poll() is None:
                child.kill()
            child.wait(timeout=60)
        with opener() as ledger:
            # The killed looper never renews its lease: once it expires the run is abandoned.
            ledger.abandon_expired_runs(now=time.time() + DEFAULT_LEASE_S + 1)
            runs = ledger.runs(task.id)
            assert [r.attempt for r in runs] == list(range(1, len(runs) + 1))
            starts = [e for e in ledger.audit_events(task.id) if e.action == "run.start"]
            # Each run came with its audit event and its keyed response, or not at all.
            assert [e.run_id for e in starts] == [r.id for r in runs]
            ((keys,),) = raw_sql("SELECT COUNT(*) FROM idempotency WHERE scope = 'run.start'")
            assert keys == len(runs)
            for run in runs:
                assert run.status in ("failed", "abandoned")
                assert run.ended_at is not None
            assert ledger.validate(now=time.time() + DEFAULT_LEASE_S + 1) == []
