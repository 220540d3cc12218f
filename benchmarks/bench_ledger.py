"""Admissions per second on one SQLite ledger file, next to the floor; admission vs history.

An admission here is `start_run` + `finish_run` (two write transactions, each
`BEGIN IMMEDIATE ... COMMIT` with the history read and the policy evaluated inside). The
floor is a bare `BEGIN IMMEDIATE; INSERT; COMMIT` on a file opened the same way (WAL, same
busy timeout, same synchronous setting), measured in the same run. Both are measured in one
process and in 4 processes sharing the file.

A second table times one admission (`start_run` alone) on a task that already holds
`--history` runs (3,000 by default) against one on a fresh task, interleaved in the same
run: the per-task summary row is what keeps the two equal (target <= 1.5x).

    python benchmarks/bench_ledger.py [--admissions N] [--processes P] [--history H]

Prints markdown tables; ratios compare each row with the floor measured alongside it.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sqlite3
import statistics
import tempfile
import time
from pathlib import Path

from execkit import FailureClass
from execkit.ledger import open_ledger

_TASKS_PER_WORKER = 50  # keeps each task's history short, as in real use


def _prepare_ledger(db: Path, workers: int) -> list[list[str]]:
    with open_ledger(db) as ledger:
        return [
            [
                ledger.create_task(f"bench {w}.{i}", max_attempts=10000, actor="bench").id
                for i in range(_TASKS_PER_WORKER)
            ]
            for w in range(workers)
        ]


def _admit(db: str, task_ids: list[str], count: int, tag: str, start_at: float) -> float:
    ledger = open_ledger(db)
    while time.time() < start_at:
        time.sleep(0.001)
    began = time.perf_counter()
    for n in range(count):
        task_id = task_ids[n % len(task_ids)]
        # An explicit clock an hour apart per admission: a failed run backs its task off,
        # and the benchmark measures admissions, not waiting.
        at = 1_000_000.0 + n * 3600.0
        run = ledger.start_run(task_id, request_key=f"{tag}-{n}", actor="bench", now=at)
        ledger.finish_run(run.id, "failed", reason="benchmark", now=at + 1.0)
    elapsed = time.perf_counter() - began
    ledger.close()
    return elapsed


def _prepare_floor(db: Path) -> None:
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("PRAGMA journal_mode = WAL")
    conn.execute("CREATE TABLE t (id INTEGER PRIMARY KEY, tag TEXT NOT NULL, at REAL NOT NULL)")
    conn.close()


def _floor(db: str, _unused: list[str], count: int, tag: str, start_at: float) -> float:
    conn = sqlite3.connect(db, isolation_level=None, timeout=30.0)
    conn.execute("PRAGMA busy_timeout = 30000")
    conn.execute("PRAGMA foreign_keys = ON")
    while time.time() < start_at:
        time.sleep(0.001)
    began = time.perf_counter()
    for _ in range(count):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t (tag, at) VALUES (?, ?)", (tag, time.time()))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - began
    conn.close()
    return elapsed


def _rate(kind: str, db: Path, per_worker: list[list[str]], count: int, processes: int) -> float:
    """Operations per second over all processes (wall time of the slowest one)."""
    target = _admit if kind == "ledger" else _floor
    if processes == 1:
        return count / target(str(db), per_worker[0], count, "p0", 0.0)
    ctx = multiprocessing.get_context("spawn")
    start_at = time.time() + 2.0  # let every process open its connection first
    with ctx.Pool(processes) as pool:
        results = [
            pool.apply_async(target, (str(db), per_worker[p], count, f"p{p}", start_at))
            for p in range(processes)
        ]
        elapsed = max(r.get(timeout=600) for r in results)
    return processes * count / elapsed


def _history_rows(db: Path, history: int, rounds: int) -> tuple[float, float]:
    """Median seconds of one `start_run` on a task with `history` prior runs and on a
    fresh task, the two timed alternately so noise hits both alike."""
    clock = 1_000_000.0  # an explicit clock: no backoff between the failures is waited out

    def later() -> float:
        nonlocal clock
        clock += 3600.0
        return clock

    with open_ledger(db) as ledger:
        old = ledger.create_task("long history", max_attempts=10000, actor="bench").id
        for n in range(history):
            run = ledger.start_run(old, request_key=f"h{n}", actor="bench", now=later())
            ledger.finish_run(
                run.id, "failed", failure_class=FailureClass.WORK, reason="x", now=later()
            )
        fresh = [
            ledger.create_task(f"fresh {n}", max_attempts=10000, actor="bench").id
            for n in range(rounds)
        ]
        on_old: list[float] = []
        on_fresh: list[float] = []
        for n in range(rounds):
            for task_id, times in ((old, on_old), (fresh[n], on_fresh)):
                at = later()
                began = time.perf_counter()
                run = ledger.start_run(
                    task_id, request_key=f"m{n}-{task_id}", actor="bench", now=at
                )
                times.append(time.perf_counter() - began)
                ledger.finish_run(
                    run.id, "failed", failure_class=FailureClass.WORK, reason="x", now=later()
                )
        return statistics.median(on_old), statistics.median(on_fresh)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--admissions", type=int, default=600, help="per process")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--history", type=int, default=3000, help="prior runs of the task")
    parser.add_argument("--rounds", type=int, default=300, help="admissions timed per row")
    args = parser.parse_args()

    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-ledger-") as tmp:
        for processes in (1, args.processes):
            ledger_db = Path(tmp) / f"ledger-{processes}.db"
            floor_db = Path(tmp) / f"floor-{processes}.db"
            tasks = _prepare_ledger(ledger_db, processes)
            _prepare_floor(floor_db)
            floor = _rate("floor", floor_db, tasks, args.admissions * 2, processes)
            admitted = _rate("ledger", ledger_db, tasks, args.admissions, processes)
            rows.append((processes, admitted, floor))
        with_history, fresh = _history_rows(Path(tmp) / "history.db", args.history, args.rounds)

    print(
        "| processes | admissions/s (start+finish) | floor: bare INSERT txn/s | "
        "floor txns per admission time |"
    )
    print("|---:|---:|---:|---:|")
    for processes, admitted, floor in rows:
        print(f"| {processes} | {admitted:,.0f} | {floor:,.0f} | {floor / admitted:.1f}x |")
    print()
    print(
        "An admission is two write transactions (start_run, finish_run); a ratio of 2.0x "
        "would mean the ledger adds nothing over the bare transactions it needs."
    )
    print()
    print(f"| one admission (start_run), median of {args.rounds} | ms | vs fresh task |")
    print("|---|---:|---:|")
    print(f"| on a fresh task (floor) | {fresh * 1000:.2f} | 1.00x |")
    print(
        f"| on a task with {args.history:,} prior runs | {with_history * 1000:.2f} | "
        f"{with_history / fresh:.2f}x |"
    )


if __name__ == "__main__":
    main()
