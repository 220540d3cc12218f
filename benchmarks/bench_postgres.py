"""Admissions per second on one PostgreSQL ledger, next to two floors, beside SQLite.

An admission is `start_run` + `finish_run`: two write transactions, each with the task's
row locked, the policy evaluated and the run, summary, audit and key written. The first
floor is a bare `BEGIN; INSERT; COMMIT` on the same server, from the same number of
processes, two per admission. The second (issue #33) is the same writes as two stored
functions, one round trip each, made here in a ledger schema of their own
(`_FLOOR_FUNCTIONS`): an admission with no decision, no reads and no client work, which
execkit's should reach at least half of. Each process admits on its own 50 tasks
(histories stay short, as in real use), after two admissions on a task of its own before
its clock starts, as the floors connect before theirs (`_warm_up`: a process's first
admission loads the redactor's rules, a start-up cost; each measured task's first
admission is measured). The SQLite rows are `bench_ledger.py`'s
measurement (one file, WAL), taken in the same run, so both backends are read against
their own floor. The package is compiled first (this machine sets PYTHONDONTWRITEBYTECODE:
otherwise each worker would compile it). Beside each rate, the CPU an admission costs the
clients and, for a cluster on this machine, the server (its postmaster's and backends'
CPU time over the whole measurement, each worker's connection and warm-up included): on
shared CPUs the rate is their sum.

    python benchmarks/bench_postgres.py [--admissions N] [--url postgresql://...]
    python benchmarks/bench_postgres.py --statements [--admissions N]
    python benchmarks/bench_postgres.py --lock-wait [--lock-timeout S] [--url ...]

Without --url (or a cluster named by TEST_PG_CLUSTER, as `python tests/pgcluster.py
--run -- ...` sets) it starts a throwaway cluster of its own (tests/pgcluster.py: fsync
off, like the test cluster) and stops it at the end. Prints a markdown table.
`--statements` prints instead the server's execution time of each statement an admission
sends, beside the functions' (pg_stat_statements, on a cluster of its own). `--lock-wait`
prints instead how long callers refused as busy waited, against the one `lock_timeout_s`
they configured (issue #50: the pool's wait and every lock's are one wait): admissions on
a task whose row another session holds, more callers than the pool has connections; and
an admission whose request key another session holds first, then the row.
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import bench_ledger

from execkit.ledger import Ledger, open_ledger

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


def _timed_from(start_at: float, work: Callable[[], object]) -> tuple[float, float]:
    """`work()` run once the common start time `start_at` has come (every process of a
    measurement begins together): its wall and CPU seconds."""
    while time.time() < start_at:
        time.sleep(0.001)
    began, cpu = time.perf_counter(), time.process_time()
    work()
    return time.perf_counter() - began, time.process_time() - cpu


def _admit(
    url: str, task_ids: list[str], count: int, tag: str, start_at: float
) -> tuple[float, float]:
    ledger = open_ledger(url)
    round_number = int(tag.partition("p")[0][1:] or 0)
    _warm_up(ledger, tag)

    def admissions() -> None:
        for n in range(count):
            # The clock an hour apart per admission, as bench_ledger.py (and on from one
            # round to the next): a failed run backs its task off, and this measures
            # admissions, not waiting.
            at = 1_000_000.0 + (round_number * count + n) * 3600.0
            task_id = task_ids[n % len(task_ids)]
            run = ledger.start_run(task_id, request_key=f"{tag}-{n}", actor="bench", now=at)
            ledger.finish_run(run.id, "failed", reason="benchmark", now=at + 1.0)

    try:
        return _timed_from(start_at, admissions)
    finally:
        ledger.close()


# Admissions each worker makes before its clock starts, on a task of its own.
_WARM_UP = 2


def _warm_up(ledger: Ledger, tag: str) -> None:
    """A process's first admissions, before its clock starts, as the floors connect before
    theirs: the first one loads what a process loads once (the redactor's rules, about
    50 ms; psycopg's adapters; the connection's prepared statements), a start-up cost,
    not a rate. On a task of its own: each measured task's first admission, which reads
    its rows in two round trips, is still measured."""
    task = ledger.create_task(f"warm-up {tag}", max_attempts=_WARM_UP, actor="bench")
    for n in range(_WARM_UP):
        at = 500_000.0 + n * 3600.0
        run = ledger.start_run(task.id, request_key=f"{tag}-warm-{n}", actor="bench", now=at)
        ledger.finish_run(run.id, "failed", reason="benchmark", now=at + 1.0)


def _prepare_floor(url: str) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(
            "CREATE TABLE t (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
            "tag text NOT NULL, at double precision NOT NULL)"
        )


def _floor(
    url: str, _unused: list[str], count: int, tag: str, start_at: float
) -> tuple[float, float]:
    import psycopg

    conn = psycopg.connect(url, autocommit=True)

    def transactions() -> None:
        for _ in range(count):
            conn.execute("BEGIN")
            conn.execute("INSERT INTO t (tag, at) VALUES (%s, %s)", (tag, time.time()))
            conn.execute("COMMIT")

    try:
        return _timed_from(start_at, transactions)
    finally:
        conn.close()


# The writes of `start_run` (run, summary, audit, key) and of `finish_run` (run, summary,
# audit), one function each: bench-only, never part of a ledger's schema.
_FLOOR_FUNCTIONS = (
    """CREATE FUNCTION bench_start(p_task text, p_key text, p_at double precision)
    RETURNS text LANGUAGE plpgsql AS $$
    DECLARE n bigint := nextval('run_numbers'); a integer;
    BEGIN
        UPDATE tasks SET attempts_used = attempts_used + 1, running = attempts_used + 1,
            last_number = attempts_used + 1, last_status = 'running', last_class = NULL,
            last_reason = NULL, last_started_at = p_at, last_ended_at = NULL
            WHERE id = p_task RETURNING running INTO a;
        INSERT INTO runs (seq, id, task_id, attempt, limit_at_admission, status, request_key,
            actor, owner_host, owner_pid, started_at, lease_expires_at, lease_s)
            SELECT n, 'r-' || n, p_task, a, t.max_attempts, 'running', p_key, 'bench',
                'host', 1, p_at, p_at + 1800, 1800 FROM tasks t WHERE t.id = p_task;
        INSERT INTO audit (at, actor, action, task_id, run_id, detail) VALUES (p_at, 'bench',
            'run.start', p_task, 'r-' || n, jsonb_build_object('attempt', a, 'forced', false,
            'state_before', 'ready', 'request_key', p_key, 'lease_s', 1800));
        INSERT INTO idempotency (scope, key, fingerprint, response, created_at) VALUES
            ('run.start', p_key, 'f', jsonb_build_object('run_id', 'r-' || n), p_at);
        RETURN 'r-' || n;
    END $$""",
    """CREATE FUNCTION bench_finish(p_run text, p_at double precision)
    RETURNS void LANGUAGE plpgsql AS $$
    DECLARE t text;
    BEGIN
        UPDATE runs SET status = 'failed', reason = 'benchmark', ended_at = p_at
            WHERE id = p_run AND status = 'running' RETURNING task_id INTO t;
        UPDATE tasks SET running = NULL, charged_attempts = charged_attempts + 1,
            last_status = 'failed', last_reason = 'benchmark', last_ended_at = p_at
            WHERE id = t;
        INSERT INTO audit (at, actor, action, task_id, run_id, detail) VALUES (p_at, 'bench',
            'run.finish', t, p_run, jsonb_build_object('status', 'failed'));
    END $$""",
)


def _prepare_functions(url: str, workers: int) -> list[list[str]]:
    import psycopg

    tasks = _prepare_ledger(url, workers)
    with psycopg.connect(url, autocommit=True) as conn:
        for statement in _FLOOR_FUNCTIONS:
            conn.execute(statement)
    return tasks


def _functions(
    url: str, task_ids: list[str], count: int, tag: str, start_at: float
) -> tuple[float, float]:
    import psycopg

    conn = psycopg.connect(url, autocommit=True)
    for n in range(_WARM_UP):  # as `_warm_up`: before the clock
        warm = conn.execute(
            "SELECT bench_start(%s, %s, %s)", (task_ids[0], f"{tag}-warm-{n}", 500_000.0)
        ).fetchone()
        assert warm is not None
        conn.execute("SELECT bench_finish(%s, %s)", (warm[0], 500_001.0))

    def calls() -> None:
        for n in range(count):
            at = 1_000_000.0 + n * 3600.0
            row = conn.execute(
                "SELECT bench_start(%s, %s, %s)", (task_ids[n % len(task_ids)], f"{tag}-{n}", at)
            ).fetchone()
            assert row is not None
            conn.execute("SELECT bench_finish(%s, %s)", (row[0], at + 1.0))

    try:
        return _timed_from(start_at, calls)
    finally:
        conn.close()


def _cluster_cpu(data: Path | None) -> float | None:
    """CPU seconds the cluster whose data folder is `data` has spent so far: its
    postmaster's, its backends' that have ended (the postmaster reaps them) and its live
    ones'. None for a cluster this machine does not run (`--url`)."""
    if data is None:
        return None
    import psutil

    for process in psutil.process_iter(["cmdline"]):
        if str(data) not in (process.info["cmdline"] or ()):
            continue
        try:
            own = process.cpu_times()
            total = own.user + own.system + own.children_user + own.children_system
            for child in process.children():
                with contextlib.suppress(psutil.Error):
                    times = child.cpu_times()
                    total += times.user + times.system
        except psutil.Error:
            continue
        return total
    return None


def _rate(
    kind: str,
    url: str,
    per_worker: list[list[str]],
    count: int,
    processes: int,
    round_number: int = 0,
    data: Path | None = None,
) -> tuple[float, float, float | None]:
    """Operations per second over all processes (wall time of the slowest one), the
    client processes' CPU time per operation in ms (what a faster machine would not hide:
    the load of a shared one moves the rates much more than it moves this), and the
    server's (the cluster whose data folder is `data`; None without one)."""
    server_before = _cluster_cpu(data)
    target = {"ledger": _admit, "functions": _functions}.get(kind, _floor)
    ctx = multiprocessing.get_context("spawn")
    start_at = time.time() + 2.0 + processes * 0.2  # let every process connect first
    with ctx.Pool(processes) as pool:
        results = [
            pool.apply_async(target, (url, per_worker[p], count, f"r{round_number}p{p}", start_at))
            for p in range(processes)
        ]
        measured = [r.get(timeout=900) for r in results]
    server_after = _cluster_cpu(data)
    elapsed = max(wall for wall, _ in measured)
    cpu = sum(cpu for _, cpu in measured)
    server = None
    if server_before is not None and server_after is not None:
        server = (server_after - server_before) / (processes * count) * 1000.0
    return processes * count / elapsed, cpu / (processes * count) * 1000.0, server


def _cpu_cell(ledger: list[float | None], functions: list[float | None]) -> str:
    """The medians of a CPU column's rounds, the functions' beside the ledger's: "n/a" for
    a server this machine does not run."""
    known = [c for c in ledger if c is not None], [c for c in functions if c is not None]
    if not known[0] or not known[1]:
        return "n/a"
    return f"{statistics.median(known[0]):.2f} ({statistics.median(known[1]):.2f})"


def _sqlite_rates(count: int, processes: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory(prefix="bench-sqlite-") as tmp:
        ledger_db = Path(tmp) / "ledger.db"
        floor_db = Path(tmp) / "floor.db"
        tasks = bench_ledger._prepare_ledger(ledger_db, processes)
        bench_ledger._prepare_floor(floor_db)
        floor = bench_ledger._rate("floor", floor_db, tasks, count * 2, processes)
        admitted = bench_ledger._rate("ledger", ledger_db, tasks, count, processes)
    return admitted, floor


def _statements(admissions: int) -> None:
    """`--statements`: where the server's time goes, statement by statement. A cluster of
    its own with pg_stat_statements loaded (inner statements of functions counted too);
    one process makes `admissions` admissions on 50 tasks, then as many pairs of the
    floor's function calls, each side's two warm-up admissions counted with them (divided
    by `admissions` all the same); prints each statement's execution and planning time per
    admission (the time a statement spends outside both, receiving its parameters and
    sending its answer, is not counted)."""
    import psycopg

    cluster = pgcluster.Cluster.start()
    try:
        with (cluster.data / "postgresql.conf").open("a") as conf:
            conf.write(
                "shared_preload_libraries = 'pg_stat_statements'\n"
                "pg_stat_statements.track = all\n"
                "pg_stat_statements.track_planning = on\n"
            )
        cluster.restart("fast")
        url = cluster.url()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION pg_stat_statements")
        ledger_url, functions_url = _schema(url, "ledger"), _schema(url, "functions")
        tasks = _prepare_ledger(ledger_url, 1)[0]
        function_tasks = _prepare_functions(functions_url, 1)[0]
        measured = {}
        for kind, target, schema_url, ids in (
            ("execkit", _admit, ledger_url, tasks),
            ("functions", _functions, functions_url, function_tasks),
        ):
            with psycopg.connect(url, autocommit=True) as conn:
                conn.execute("SELECT pg_stat_statements_reset()")
            target(schema_url, ids, admissions, "r0p0", time.time())
            with psycopg.connect(url, autocommit=True) as conn:
                measured[kind] = conn.execute(
                    "SELECT calls, total_exec_time, total_plan_time, toplevel, "
                    "regexp_replace(query, '\\s+', ' ', 'g') FROM pg_stat_statements "
                    "WHERE calls >= %s ORDER BY total_exec_time DESC",
                    (max(1, admissions // 100),),  # each task's first admission's too
                ).fetchall()
    finally:
        cluster.stop()
    print(f"    python benchmarks/bench_postgres.py --statements --admissions {admissions}")
    print()
    print("| side | calls per admission | exec µs per admission | plan µs | statement |")
    print("|---|---:|---:|---:|---|")
    for kind, rows in measured.items():
        for calls, exec_ms, plan_ms, toplevel, query in rows:
            shown = query if len(query) <= 90 else query[:87] + "..."
            inner = "" if toplevel else " (in a function)"
            print(
                f"| {kind}{inner} | {calls / admissions:.2f} "
                f"| {exec_ms * 1000 / admissions:.1f} | {plan_ms * 1000 / admissions:.1f} "
                f"| `{shown.replace('|', '/')}` |"
            )
        total = sum(row[1] for row in rows if row[3]) * 1000 / admissions
        print(f"| {kind}, all sent | | {total:.1f} | | |")


def _waited(call: Callable[[], object]) -> float:
    """How long `call` took to be refused as busy (it must be)."""
    from execkit._errors import StorageError

    began = time.perf_counter()
    try:
        call()
    except StorageError as exc:
        assert "ledger busy" in exc.message, exc.message
        return time.perf_counter() - began
    raise AssertionError("the call was not refused")


def _lock_wait(url: str, timeout_s: float) -> None:
    """`--lock-wait`: each scenario's callers' waits, as multiples of `timeout_s`."""
    import threading

    import psycopg

    from execkit.ledger import AuditAction, PostgresLedger

    rows: list[tuple[str, int, list[float]]] = []
    ledger_url = _schema(url, "bench_lock_wait")
    with PostgresLedger(ledger_url) as ledger:
        # A process's first admissions load what they need (the redactor's rules: a second
        # on a busy machine), which is not waiting.
        _warm_up(ledger, "lock-wait")
    # 1. A task's row held by another session; 8 callers, a pool of 2 connections: the
    #    callers past the pool's two wait for a connection, then for the row.
    callers, pool = 8, 2
    with PostgresLedger(ledger_url, lock_timeout_s=timeout_s, pool_size=pool) as ledger:
        task = ledger.create_task("held", max_attempts=100, actor="bench").id
        waits: list[float] = []
        with psycopg.connect(ledger_url) as holder:
            holder.execute("SELECT 1 FROM tasks WHERE id = %s FOR UPDATE", (task,))
            threads = [
                threading.Thread(
                    target=lambda n=n: waits.append(
                        _waited(lambda: ledger.start_run(task, request_key=f"k{n}", actor="bench"))
                    )
                )
                for n in range(callers)
            ]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join()
        rows.append((f"row held, {callers} callers, pool of {pool}", callers, waits))
    # 2. The request key held by another session for 60% of the timeout (its own
    #    admission, say, itself waiting), and the task's row held throughout.
    with PostgresLedger(ledger_url, lock_timeout_s=timeout_s) as ledger:
        task = ledger.create_task("keyed", max_attempts=100, actor="bench").id
        key = f"{AuditAction.RUN_START}\x1fk"
        with psycopg.connect(ledger_url) as row_holder, psycopg.connect(ledger_url) as key_holder:
            row_holder.execute("SELECT 1 FROM tasks WHERE id = %s FOR UPDATE", (task,))
            key_holder.execute("SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))", (key,))
            release = threading.Timer(0.6 * timeout_s, key_holder.commit)
            release.start()
            waited = _waited(lambda: ledger.start_run(task, request_key="k", actor="bench"))
            release.join()
        rows.append(("key held 0.6x, then the row", 1, [waited]))
    print(f"    {' '.join(['python', *sys.argv])}")
    print(f"    lock_timeout_s = {timeout_s:g}; {os.cpu_count()} CPUs")
    print()
    print("| scenario | callers | median wait | longest wait | longest / lock_timeout_s |")
    print("|---|---:|---:|---:|---:|")
    for name, count, waits in rows:
        longest = max(waits)
        print(
            f"| {name} | {count} | {statistics.median(waits):.2f} s | {longest:.2f} s "
            f"| {longest / timeout_s:.2f}x |"
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--admissions", type=int, default=300, help="per process")
    parser.add_argument("--url", help="a database to create schemas in (default: a new cluster)")
    parser.add_argument(
        "--rounds",
        type=int,
        default=3,
        help="rounds of (functions floor, ledger), alternating; the medians are shown",
    )
    parser.add_argument(
        "--statements",
        action="store_true",
        help="instead: each statement's server time per admission (pg_stat_statements)",
    )
    parser.add_argument(
        "--lock-wait",
        action="store_true",
        help="instead: how long callers refused as busy waited, against their lock timeout",
    )
    parser.add_argument("--lock-timeout", type=float, default=2.0, help="for --lock-wait (s)")
    args = parser.parse_args()
    if args.statements:
        _statements(args.admissions)
        return
    if args.lock_wait:
        own: pgcluster.Cluster | None = None
        lock_url = args.url
        if lock_url is None and os.environ.get(pgcluster.ENV_VAR):
            lock_url = pgcluster.Cluster.from_env(os.environ[pgcluster.ENV_VAR]).url()
        if lock_url is None:
            own = pgcluster.Cluster.start()
            lock_url = own.url()
        try:
            _lock_wait(lock_url, args.lock_timeout)
        finally:
            if own is not None:
                own.stop()
        return
    # Workers are spawned: compiled once here, they read the bytecode, not the sources.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False
    compileall.compile_dir(str(Path(__file__).resolve().parent.parent / "execkit"), quiet=1)

    cluster: pgcluster.Cluster | None = None
    url = args.url
    data: Path | None = None  # the cluster's data folder, for its CPU time
    if url is None and os.environ.get(pgcluster.ENV_VAR):
        shared = pgcluster.Cluster.from_env(os.environ[pgcluster.ENV_VAR])
        url, data = shared.url(), shared.data
    if url is None:
        cluster = pgcluster.Cluster.start()
        url, data = cluster.url(), cluster.data
    rows = []
    ratios: list[float] = []
    try:
        for processes in _PROCESSES:
            ledger_url = _schema(url, "bench_ledger")
            floor_url = _schema(url, "bench_floor")
            tasks = _prepare_ledger(ledger_url, processes)
            _prepare_floor(floor_url)
            functions_url = _schema(url, "bench_functions")
            function_tasks = _prepare_functions(functions_url, processes)
            floor, _, _ = _rate("floor", floor_url, tasks, args.admissions * 2, processes)
            # Alternating rounds, the ratio taken in each: a load that drifts on a shared
            # machine moves both sides of a round alike.
            paired = []
            for round_number in range(args.rounds):
                paired.append(
                    (
                        _rate(
                            "functions",
                            functions_url,
                            function_tasks,
                            args.admissions,
                            processes,
                            round_number,
                            data,
                        ),
                        _rate(
                            "ledger",
                            ledger_url,
                            tasks,
                            args.admissions,
                            processes,
                            round_number,
                            data,
                        ),
                    )
                )
            functions = statistics.median(f[0] for f, _ in paired)
            admitted = statistics.median(a[0] for _, a in paired)
            ratios.append(statistics.median(a[0] / f[0] for f, a in paired))
            cpu = (
                _cpu_cell([a[1] for _, a in paired], [f[1] for f, _ in paired]),
                _cpu_cell([a[2] for _, a in paired], [f[2] for f, _ in paired]),
            )
            lite, lite_floor = _sqlite_rates(args.admissions, processes)
            rows.append((processes, admitted, floor, functions, cpu, lite, lite_floor))
    finally:
        if cluster is not None:
            cluster.stop()

    print(f"    {' '.join(['python', *sys.argv])}")
    print(
        f"    {args.admissions} admissions per process; {os.cpu_count()} CPUs; PostgreSQL "
        f"against the functions: median of {args.rounds} alternating rounds (rates and ratio)"
    )
    print()
    print(
        "| processes | PostgreSQL admissions/s | same writes as 2 functions/s | ratio (goal "
        ">= 0.5x) | client CPU ms per admission (functions) "
        "| server CPU ms per admission (functions) | PG floor txn/s "
        "| PG floor txns per admission | SQLite admissions/s "
        "| SQLite floor txn/s | SQLite floor txns per admission |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (processes, admitted, floor, functions, cpu, lite, lite_floor), ratio in zip(
        rows, ratios, strict=True
    ):
        print(
            f"| {processes} | {admitted:,.0f} | {functions:,.0f} | {ratio:.2f}x "
            f"| {cpu[0]} | {cpu[1]} | {floor:,.0f} | {floor / admitted:.1f}x "
            f"| {lite:,.0f} | {lite_floor:,.0f} | {lite_floor / lite:.1f}x |"
        )
    print()
    print(
        "An admission is two write transactions (start_run, finish_run); a ratio of 2.0x "
        "to the bare transactions would mean the ledger adds nothing over those it needs."
    )


if __name__ == "__main__":
    main()
