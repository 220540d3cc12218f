"""Admissions per second on one PostgreSQL ledger, next to the floor, beside SQLite.

An admission is `start_run` + `finish_run`: two write transactions, each with the task's
row locked, the policy evaluated and the run, summary, audit and key written. The floor is
a bare `BEGIN; INSERT; COMMIT` on the same server, from the same number of processes, two
per admission. Each process admits on its own 50 tasks (histories stay short, as in real
use). The SQLite rows are `bench_ledger.py`'s measurement (one file, WAL), taken in the same
run, so both backends are read against their own floor.

    python benchmarks/bench_postgres.py [--admissions N] [--url postgresql://...]

Without --url (or a cluster named by TEST_PG_CLUSTER, as `python tests/pgcluster.py
--run -- ...` sets) it starts a throwaway cluster of its own (tests/pgcluster.py: fsync
off, like the test cluster) and stops it at the end. Prints a markdown table.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

import bench_ledger

from execkit.ledger import open_ledger

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import pgcluster

_TASKS_PER_WORKER = 50
_PROCESSES = (1, 4, 16)


def _schema(url: str, prefix: str) -> str:
    """A fresh schema in the database `url` names, as a URL whose search_path is it."""
    import psycopg

    name = f"{prefix}_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    joiner = "&" if "?" in url else "?"
    return f"{url}{joiner}options=-csearch_path%3D{name}"


def _prepare_ledger(url: str, workers: int) -> list[list[str]]:
    with open_ledger(url) as ledger:
        return [
            [
                ledger.create_task(f"bench {w}.{i}", max_attempts=10000, actor="bench").id
                for i in range(_TASKS_PER_WORKER)
            ]
            for w in range(workers)
        ]


def _admit(url: str, task_ids: list[str], count: int, tag: str, start_at: float) -> float:
    ledger = open_ledger(url)
    while time.time() < start_at:
        time.sleep(0.001)
    began = time.perf_counter()
    for n in range(count):
        # The clock an hour apart per admission, as bench_ledger.py: a failed run backs its
        # task off, and this measures admissions, not waiting.
        at = 1_000_000.0 + n * 3600.0
        task_id = task_ids[n % len(task_ids)]
        run = ledger.start_run(task_id, request_key=f"{tag}-{n}", actor="bench", now=at)
        ledger.finish_run(run.id, "failed", reason="benchmark", now=at + 1.0)
    elapsed = time.perf_counter() - began
    ledger.close()
    return elapsed


def _prepare_floor(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE t (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
            "tag text NOT NULL, at double precision NOT NULL)"
        )


def _floor(url: str, _unused: list[str], count: int, tag: str, start_at: float) -> float:
    import psycopg

    conn = psycopg.connect(url, autocommit=True)
    while time.time() < start_at:
        time.sleep(0.001)
    began = time.perf_counter()
    for _ in range(count):
        conn.execute("BEGIN")
        conn.execute("INSERT INTO t (tag, at) VALUES (%s, %s)", (tag, time.time()))
        conn.execute("COMMIT")
    elapsed = time.perf_counter() - began
    conn.close()
    return elapsed


def _rate(kind: str, url: str, per_worker: list[list[str]], count: int, processes: int) -> float:
    """Operations per second over all processes (wall time of the slowest one)."""
    target = _admit if kind == "ledger" else _floor
    ctx = multiprocessing.get_context("spawn")
    start_at = time.time() + 2.0 + processes * 0.2  # let every process connect first
    with ctx.Pool(processes) as pool:
        results = [
            pool.apply_async(target, (url, per_worker[p], count, f"p{p}", start_at))
            for p in range(processes)
        ]
        elapsed = max(r.get(timeout=900) for r in results)
    return processes * count / elapsed


def _sqlite_rates(count: int, processes: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="bench-sqlite-") as tmp:
        ledger_db = Path(tmp) / "ledger.db"
        floor_db = Path(tmp) / "floor.db"
        tasks = bench_ledger._prepare_ledger(ledger_db, processes)
        bench_ledger._prepare_floor(floor_db)
        floor = bench_ledger._rate("floor", floor_db, tasks, count * 2, processes)
        admitted = bench_ledger._rate("ledger", ledger_db, tasks, count, processes)
    return admitted, floor


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--admissions", type=int, default=300, help="per process")
    parser.add_argument("--url", help="a database to create schemas in (default: a new cluster)")
    args = parser.parse_args()

    cluster: pgcluster.Cluster | None = None
    url = args.url
    if url is None and os.environ.get(pgcluster.ENV_VAR):
        url = pgcluster.Cluster.from_env(os.environ[pgcluster.ENV_VAR]).url()
    if url is None:
        cluster = pgcluster.Cluster.start()
        url = cluster.url()
    rows = []
    try:
        for processes in _PROCESSES:
            ledger_url = _schema(url, "bench_ledger")
            floor_url = _schema(url, "bench_floor")
            tasks = _prepare_ledger(ledger_url, processes)
            _prepare_floor(floor_url)
            floor = _rate("floor", floor_url, tasks, args.admissions * 2, processes)
            admitted = _rate("ledger", ledger_url, tasks, args.admissions, processes)
            lite, lite_floor = _sqlite_rates(args.admissions, processes)
            rows.append((processes, admitted, floor, lite, lite_floor))
    finally:
        if cluster is not None:
            cluster.stop()

    print(f"    {' '.join(['python', *sys.argv])}")
    print(f"    {args.admissions} admissions per process; {os.cpu_count()} CPUs")
    print()
    print(
        "| processes | PostgreSQL admissions/s | PG floor txn/s | PG floor txns per admission "
        "| SQLite admissions/s | SQLite floor txn/s | SQLite floor txns per admission |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for processes, admitted, floor, lite, lite_floor in rows:
        print(
            f"| {processes} | {admitted:,.0f} | {floor:,.0f} | {floor / admitted:.1f}x "
            f"| {lite:,.0f} | {lite_floor:,.0f} | {lite_floor / lite:.1f}x |"
        )
    print()
    print(
        "An admission is two write transactions (start_run, finish_run); a ratio of 2.0x "
        "would mean the ledger adds nothing over the bare transactions it needs."
    )


if __name__ == "__main__":
    main()
