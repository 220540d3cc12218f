"""Admissions per second through `execkit serve`, next to direct library calls on the same
ledger (the floor), with 1, 4 and 16 clients, on SQLite and (when one is at hand)
PostgreSQL.

An admission is `start_run` + `finish_run` (two write transactions), as in
bench_ledger.py. Each client admits on tasks of its own (50 of them, in turn), so the
figures measure the path, not a contended task. The floor is the same calls on the ledger
object itself, from as many threads sharing it (as the server's worker threads share its
one ledger: on PostgreSQL each transaction takes a connection of the ledger's pool).
Through the server, the clients are threads of this process, each with its own
`RemoteLedger` (one keep-alive connection), and the server is a separate `python -m
execkit serve` process on 127.0.0.1 (a free port).

    python benchmarks/bench_remote.py [--admissions N] [--clients 1,4,16] [--rounds N]
                                      [--pg URL | --no-pg]

PostgreSQL is measured with `--pg URL`, else in the cluster `tests/pgcluster.py --run`
names in the environment, else in a throwaway cluster of its own (tests/pgcluster.py) when
server binaries are installed; `--no-pg` skips it. Prints a markdown table and the
command that produced it.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import pwd
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil

from execkit._classify import FailureClass
from execkit.ledger import Ledger, open_ledger
from execkit.remote import RemoteLedger
from execkit.server import add_token

REPO = Path(__file__).resolve().parent.parent
ME = pwd.getpwuid(os.geteuid()).pw_name
_TASKS_PER_CLIENT = 50


def _tasks(ledger: Ledger, clients: int, tag: str) -> list[list[str]]:
    return [
        [
            ledger.create_task(
                f"bench {tag} {c}.{i}", max_attempts=10000, max_uncharged_attempts=1000, actor=ME
            ).id
            for i in range(_TASKS_PER_CLIENT)
        ]
        for c in range(clients)
    ]


def _admit(ledger: Ledger, task_ids: list[str], count: int, tag: str) -> None:
    for n in range(count):
        run = ledger.start_run(
            task_ids[n % len(task_ids)],
            request_key=f"{tag}-{n}",
            actor=ME,
            ignore_backoff=True,  # a failed run backs its task off: measure admissions only
        )
        ledger.finish_run(run.id, "failed", failure_class=FailureClass.UPSTREAM, reason="bench")


def _cpu_s(server: psutil.Process | None) -> float:
    """CPU seconds used so far by this process (every thread) and the server's, if any."""
    used = time.process_time()
    if server is not None:
        times = server.cpu_times()
        used += times.user + times.system
    return used


def _rate(
    per_client: list[list[str]],
    count: int,
    ledger_for: Callable[[int], Ledger],
    tag: str,
    server: psutil.Process | None = None,
) -> tuple[float, float]:
    """Admissions per second over all clients (threads), started together, and the CPU
    seconds per admission of this process and `server` (the database's own not counted:
    it does the same work either way)."""
    clients = len(per_client)
    ledgers = [ledger_for(c) for c in range(clients)]
    barrier = threading.Barrier(clients + 1)
    errors: list[BaseException] = []

    def client(c: int) -> None:
        barrier.wait()
        try:
            _admit(ledgers[c], per_client[c], count, f"{tag}-{c}")
        except BaseException as exc:  # reported below
            errors.append(exc)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for thread in threads:
        thread.start()
    barrier.wait()
    began, cpu = time.perf_counter(), _cpu_s(server)
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - began
    cpu = _cpu_s(server) - cpu
    if errors:
        raise errors[0]
    return clients * count / elapsed, cpu / (clients * count)


@contextlib.contextmanager
def _server(target: str, where: Path) -> Iterator[tuple[str, str, psutil.Process]]:
    tokens = where / "tokens.json"
    token = add_token(tokens, ME)
    log = (where / "serve.log").open("w")
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "execkit",
            "serve",
            "--db",
            target,
            "--tokens",
            str(tokens),
            "--listen",
            "127.0.0.1:0",
            "--json",
        ],
        stdout=subprocess.PIPE,
        stderr=log,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line:
            raise SystemExit(f"execkit serve did not start: {(where / 'serve.log').read_text()}")
        yield json.loads(line)["url"], token, psutil.Process(process.pid)
    finally:
        process.send_signal(2)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
        log.close()


# backend, clients, floor/s, served/s, ratio, CPU ms per admission direct, through the server
Row = tuple[str, int, float, float, float, float, float]


def _measure(
    name: str, target: str, where: Path, count: int, counts: tuple[int, ...], rounds: int
) -> list[Row]:
    """Per client count: `rounds` rounds, each the floor then the server (one server for
    all rounds); the median of each rate and of the rounds' ratios (on a shared machine the
    floor itself moves between rounds, and a ratio within a round moves less), and the
    median CPU per admission of each (less moved by other load than either rate)."""
    rows = []
    with contextlib.closing(open_ledger(target)) as direct:
        for clients in counts:
            per_client = _tasks(direct, clients, f"direct{clients}")
            remote_tasks = _tasks(direct, clients, f"remote{clients}")
            floors, served, ratios, cpu_direct, cpu_served = [], [], [], [], []
            with _server(target, where / f"{name}-{clients}") as (url, token, server):
                clients_of = [RemoteLedger(url, token, timeout_s=120) for _ in range(clients)]
                for round_no in range(rounds):
                    floor, cpu = _rate(
                        per_client, count, lambda _c: direct, f"d{clients}.{round_no}"
                    )
                    rate, cpu_through = _rate(
                        remote_tasks,
                        count,
                        clients_of.__getitem__,
                        f"r{clients}.{round_no}",
                        server,
                    )
                    floors.append(floor)
                    served.append(rate)
                    ratios.append(rate / floor)
                    cpu_direct.append(cpu)
                    cpu_served.append(cpu_through)
                for client in clients_of:
                    client.close()
            median = statistics.median
            rows.append(
                (
                    name,
                    clients,
                    median(floors),
                    median(served),
                    median(ratios),
                    median(cpu_direct) * 1000,
                    median(cpu_served) * 1000,
                )
            )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--admissions", type=int, default=200, help="per client")
    parser.add_argument(
        "--clients", default="1,4,16", help="client counts, comma-separated (each 1..256)"
    )
    parser.add_argument(
        "--rounds", type=int, default=3, help="alternating rounds per client count (1..50)"
    )
    parser.add_argument("--pg", metavar="URL", help="a postgresql:// URL to measure too")
    parser.add_argument("--no-pg", action="store_true", help="SQLite only")
    args = parser.parse_args()
    try:
        counts = tuple(int(part) for part in args.clients.split(","))
    except ValueError:
        parser.error("--clients: whole numbers separated by commas, e.g. 1,4,16")
    if not counts or any(not 1 <= count <= 256 for count in counts):
        parser.error("--clients: each count must be in 1..256")
    if not 1 <= args.rounds <= 50:
        parser.error("--rounds: must be in 1..50")
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-remote-") as tmp:
        where = Path(tmp)
        for clients in counts:
            (where / f"sqlite-{clients}").mkdir()
        rows += _measure(
            "sqlite", str(where / "ledger.db"), where, args.admissions, counts, args.rounds
        )
        pg_rows = _postgres(args, where, counts)
        rows += pg_rows

    print(f"$ python benchmarks/bench_remote.py {' '.join(sys.argv[1:])}".rstrip())
    print()
    print(
        "| backend | clients | direct admissions/s (floor) | through the server admissions/s "
        "| server / direct | CPU ms per admission, direct / through the server |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for name, clients, floor, served, ratio, cpu, cpu_through in rows:
        print(
            f"| {name} | {clients} | {floor:,.0f} | {served:,.0f} | {ratio:.2f}x "
            f"| {cpu:.2f} / {cpu_through:.2f} |"
        )
    print()
    print(
        f"{args.admissions} admissions (start_run + finish_run) per client and round; "
        f"medians of {args.rounds} rounds (floor, then server; the ratio is the median of "
        "the rounds' ratios); the server is a separate process on 127.0.0.1, the clients "
        "threads of this one; CPU is this process's and the server's, not the database's."
    )


def _postgres(args: argparse.Namespace, where: Path, counts: tuple[int, ...]) -> list[Row]:
    if args.no_pg:
        return []
    for clients in counts:
        (where / f"postgres-{clients}").mkdir()
    if args.pg:
        return _measure("postgres", args.pg, where, args.admissions, counts, args.rounds)
    helper = REPO / "tests" / "pgcluster.py"
    if not helper.exists():
        return []
    sys.path.insert(0, str(helper.parent))
    import pgcluster

    named = os.environ.get(pgcluster.ENV_VAR)
    if named:  # run under `tests/pgcluster.py --run`: its cluster, not a second one
        url = pgcluster.Cluster.from_env(named).url()
        return _measure("postgres", url, where, args.admissions, counts, args.rounds)
    if pgcluster.find_bindir() is None:
        print("(no PostgreSQL server binaries: PostgreSQL not measured)", file=sys.stderr)
        return []
    cluster = pgcluster.Cluster.start()
    try:
        return _measure("postgres", cluster.url(), where, args.admissions, counts, args.rounds)
    finally:
        cluster.stop()


if __name__ == "__main__":
    main()
