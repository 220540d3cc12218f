"""Benchmark the bulk reads at scale: whole commands against reading the same rows.

    python benchmarks/bench_bulk.py [--tasks N] [--rounds N] [--tree DIR ...]

Builds one SQLite ledger of `--tasks` tasks (default 100,000), each with one finished run
and a dispatcher's title (`board:<id>`), half of them failed upstream and half succeeded:
two tasks made through the ledger, then copied row for row in SQL (making 100,000 through
the API would take minutes and measure admission). Then, in interleaved rounds (the order
rotates each round), each command below runs as a whole process, once per checkout given
(`--tree`, default this one; give an older checkout too for a before/after pair), beside
its floor: a `python -c` that opens the same file with `sqlite3` and reads the same rows
(the task rows joined as the ledger joins them; for `db check` the run rows too).

1. `execkit task list` (target <= 3x its floor)
2. `execkit task list --json` (<= 3x)
3. `execkit status` (<= 3x)
4. `execkit db check` (<= 3x the task and run rows)

Each child runs with its bytecode cached under a temporary PYTHONPYCACHEPREFIX (written by
a warm-up run), whatever PYTHONDONTWRITEBYTECODE says. Its median wall time and median CPU
time (user and system, which a loaded machine moves less) are printed beside the floor's,
with its peak memory (ru_maxrss of the child). Prints the commands, then a markdown table.
"""

from __future__ import annotations

import argparse
import os
import resource
import shlex
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

_TASK_ROWS = (
    "SELECT t.id, t.title, t.status, t.created_by, t.created_at, l.max_attempts, "
    "e.max_uncharged_attempts, e.retry_requested_by, e.gave_up_at_attempt, s.* "
    "FROM tasks t LEFT JOIN task_attempt_limits l ON l.task_id = t.id "
    "LEFT JOIN task_extras e ON e.task_id = t.id "
    "LEFT JOIN task_summaries s ON s.task_id = t.id ORDER BY t.seq"
)
_RUN_ROWS = (
    "SELECT r.*, x.lease_expires_at, x.not_before FROM runs r "
    "LEFT JOIN run_extras x ON x.run_id = r.id ORDER BY r.seq"
)
_MAKE = """
import sys
from execkit.ledger import open_ledger
with open_ledger(sys.argv[1]) as ledger:
    for n, status in ((1, "failed"), (2, "succeeded")):
        task = ledger.create_task(f"board:template-{n}", actor="bench", now=1000.0)
        run = ledger.start_run(task.id, actor="bench", request_key=f"k{n}", now=1001.0)
        cls = "upstream" if status == "failed" else None
        ledger.finish_run(run.id, status, failure_class=cls, reason=None, now=1002.0)
"""


# The times each copy moves by a millisecond a copy (a run's start and end, and the summary
# columns that repeat them): no two runs of a real ledger start at the same time, and the
# backoff's jitter is a hash of the start, so a copy must not repeat what a cache could hit.
_MOVED = {"started_at", "ended_at", "last_started_at", "last_ended_at"}


def _copy_rows(path: Path, tasks: int) -> None:
    """Each of the two template tasks, with every row keyed by it or by its run (summary,
    limits, run, run extras, owners, lanes: whatever tables the schema has), copied
    `tasks // 2` times under new ids, its times moved (`_MOVED`). The columns are read
    from the schema, so a table or column a later version adds is copied too."""
    half = tasks // 2
    conn = sqlite3.connect(path)
    keyed = {"tasks": "id", "runs": "id"}
    for (table,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'"):
        columns = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
        if table not in keyed and columns[0] in ("task_id", "run_id"):
            keyed[table] = columns[0]
    statements = []
    for table, key in keyed.items():
        columns = [row[1] for row in conn.execute(f"PRAGMA table_info({table})")]
        columns = [c for c in columns if c != "seq"]  # a new rowid for each copy
        suffixed = {key, "task_id", "title"} if table in ("tasks", "runs") else {key}
        values = [
            f"x.{c} || '-' || n.i"
            if c in suffixed
            else f"x.{c} + n.i / 1000.0"
            if c in _MOVED
            else f"x.{c}"
            for c in columns
        ]
        statements.append(
            f"INSERT INTO {table} ({', '.join(columns)}) "
            f"SELECT {', '.join(values)} FROM n, {table} x;"
        )
    conn.executescript(
        f"""
        BEGIN;
        CREATE TEMP TABLE n (i INTEGER PRIMARY KEY);
        WITH RECURSIVE s(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM s WHERE i < {half})
          INSERT INTO n SELECT i FROM s;
        {chr(10).join(statements)}
        COMMIT;
        """
    )
    conn.close()


def _floor(sql: list[str], db: Path) -> list[str]:
    loops = "".join(f"\nfor row in conn.execute({q!r}): pass" for q in sql)
    return [sys.executable, "-c", f"import sqlite3\nconn = sqlite3.connect({str(db)!r}){loops}"]


def _cpu_of_children() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _run(argv: list[str], env: dict[str, str], cwd: str) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user and system) of one run of `argv`: on a machine
    shared with other work, the CPU seconds move less than the wall time."""
    cpu = _cpu_of_children()
    start = time.perf_counter()
    done = subprocess.run(argv, env=env, cwd=cwd, stdout=subprocess.DEVNULL, check=False)
    elapsed = time.perf_counter() - start
    if done.returncode != 0:
        raise SystemExit(f"{shlex.join(argv)} exited {done.returncode}")
    return elapsed, _cpu_of_children() - cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--tree", type=Path, action="append", help="a checkout to measure")
    opts = parser.parse_args()
    trees = [tree.resolve() for tree in (opts.tree or [ROOT])]
    with tempfile.TemporaryDirectory(prefix="execkit-bench-bulk-") as scratch:
        db = Path(scratch) / "big.db"
        base = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        base.pop("EXECKIT_DB", None)
        env = {**base, "PYTHONPATH": str(trees[0])}
        subprocess.run([sys.executable, "-c", _MAKE, str(db)], env=env, check=True)
        _copy_rows(db, opts.tasks)
        commands: dict[str, tuple[list[str], dict[str, str]]] = {}
        floors = {
            "task list": _floor([_TASK_ROWS], db),
            "db check": _floor([_TASK_ROWS, _RUN_ROWS], db),
        }
        for name, argv in floors.items():
            commands[f"floor: read the rows of `{name}`"] = (argv, base)
        for number, tree in enumerate(trees):
            tree_env = {
                **base,
                "PYTHONPATH": str(tree),
                "PYTHONPYCACHEPREFIX": str(Path(scratch) / f"pycache-{number}"),
            }
            label = "" if len(trees) == 1 else f" [{tree}]"
            for args in (
                ["task", "list"],
                ["task", "list", "--json"],
                ["status"],
                ["db", "check"],
            ):
                argv = [sys.executable, "-m", "execkit", *args, "--db", str(db)]
                commands[f"`execkit {' '.join(args)}`{label}"] = (argv, tree_env)
        print(f"{opts.tasks} tasks and runs in {db}")
        for argv, command_env in commands.values():
            print(f"  $ {shlex.join(argv)}")
            _run(argv, command_env, scratch)  # warm-up: the bytecode cache, the page cache
        times: dict[str, list[float]] = {name: [] for name in commands}
        cpus: dict[str, list[float]] = {name: [] for name in commands}
        peaks: dict[str, float] = {}
        names = list(commands)
        for round_no in range(opts.rounds):
            shift = round_no % len(names)
            for name in names[shift:] + names[:shift]:
                argv, command_env = commands[name]
                wall, cpu = _run(argv, command_env, scratch)
                times[name].append(wall)
                cpus[name].append(cpu)
        for name in names:  # peak memory alone, one child at a time
            argv, command_env = commands[name]
            peaks[name] = _peak(argv, command_env, scratch)
    medians = {name: statistics.median(samples) for name, samples in times.items()}
    cpu_medians = {name: statistics.median(samples) for name, samples in cpus.items()}
    floor_names = {
        name: "floor: read the rows of `db check`"
        if "db check" in name
        else "floor: read the rows of `task list`"
        for name in names
    }
    print(f"\n{opts.rounds} interleaved rounds, median wall and CPU time per process\n")
    print("| command | median s | x floor | median CPU s | CPU x floor | peak MiB |")
    print("|---|---:|---:|---:|---:|---:|")
    for name in names:
        floor = floor_names[name]
        print(
            f"| {name} | {medians[name]:.2f} | {medians[name] / medians[floor]:.2f}x | "
            f"{cpu_medians[name]:.2f} | {cpu_medians[name] / cpu_medians[floor]:.2f}x | "
            f"{peaks[name]:.0f} |"
        )


def _peak(argv: list[str], env: dict[str, str], cwd: str) -> float:
    """The peak resident MiB of one run of `argv`, measured in a fresh child of its own
    (`ru_maxrss` of a process's children is their maximum, so each is read alone)."""
    probe = (
        "import resource, subprocess, sys\n"
        "subprocess.run(sys.argv[1:], stdout=subprocess.DEVNULL, check=True)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe, *argv],
        env=env,
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    return int(done.stdout.strip()) / 1024


if __name__ == "__main__":
    main()
