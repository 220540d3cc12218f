"""Benchmark notifications (issue #49): delivery from the outbox, and what endpoints cost
an admission.

Run: python benchmarks/bench_notify.py   (a few seconds; prints a markdown table)

1. delivery: 500 events in the SQLite ledger's outbox, sent by one `NotifySender` to a
   loopback receiver that answers 200 (signed JSON, one connection a send): events per
   second, from the first claim to the last settle.
2. admission cost: `start_run` + `finish_run` on fresh tasks with two endpoints configured
   and a sender running beside them (as `execkit dispatch` runs one), against no endpoint
   and the same sender; paired rounds in alternating order, the median of the pairs'
   ratios (wall clock: figures live here, never in tests). The issue's bound: <= 1.05x.
"""

from __future__ import annotations

import functools
import getpass
import statistics
import sys
import tempfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from execkit._notify import NotifySender, sending  # noqa: E402
from execkit.ledger import open_ledger  # noqa: E402

EVENTS = 500
ROUNDS = 7
ADMISSIONS = 200
OWNER = getpass.getuser()


class _Ok(BaseHTTPRequestHandler):
    def log_message(self, *_args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


def _receiver() -> tuple[ThreadingHTTPServer, str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Ok)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/hook"


def delivery(folder: Path, url: str) -> float:
    with open_ledger(folder / "deliver.db") as ledger:
        endpoint = ledger.add_notify_endpoint(url, events=["*"], secret="s3cret", actor=OWNER)
        for _ in range(EVENTS):
            ledger.notify_test(endpoint.id, actor=OWNER)
        sender = NotifySender(ledger, "bench")
        started = time.perf_counter()
        sent = 0
        while sent < EVENTS:
            sent += sender.drain()
        return EVENTS / (time.perf_counter() - started)


def _admissions(target: Path) -> float:
    with open_ledger(target) as ledger:
        tasks = [ledger.create_task(f"t{n}", actor="d").id for n in range(ADMISSIONS)]
        started = time.perf_counter()
        for task in tasks:
            run = ledger.start_run(task, request_key=f"k-{task}", actor="d")
            ledger.finish_run(run.id, "succeeded")
        return time.perf_counter() - started


def admission_ratio(folder: Path, url: str) -> float:
    ratios = []
    for n in range(ROUNDS):
        with_db, without_db = folder / f"with{n}.db", folder / f"without{n}.db"
        with open_ledger(with_db) as ledger:
            for path in ("/a", "/b"):
                ledger.add_notify_endpoint(url + path, events=["*"], actor=OWNER)
        open_ledger(without_db).close()
        timed: dict[Path, float] = {}
        order = (with_db, without_db) if n % 2 == 0 else (without_db, with_db)
        for target in order:
            opener = functools.partial(open_ledger, target)
            with sending(opener, "bench", interval_s=0.2):
                timed[target] = _admissions(target)
        ratios.append(timed[with_db] / timed[without_db])
    return statistics.median(ratios)


def main() -> None:
    server, url = _receiver()
    try:
        with tempfile.TemporaryDirectory() as scratch:
            folder = Path(scratch)
            rate = delivery(folder, url)
            ratio = admission_ratio(folder, url)
    finally:
        server.shutdown()
        server.server_close()
    print("| measure | value |")
    print("|---|---|")
    print(f"| events delivered per second (SQLite, signed JSON, loopback) | {rate:.0f} |")
    print(f"| admission cost, two endpoints / none (median of {ROUNDS}) | {ratio:.3f}x |")


if __name__ == "__main__":
    main()
