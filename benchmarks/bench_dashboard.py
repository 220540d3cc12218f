"""The dashboard on a large ledger: the snapshot's cost and the page's first paint.

A SQLite ledger of N board tasks (default 1,000) in every state a board has: a third backing
off after an upstream failure, a fifth blocked on work (3 charged failures), some blocked on
environment, running, done and never dispatched. `execkit serve` runs it in a thread on
127.0.0.1. Measured:

- the snapshot (`GET /dashboard/api/snapshot`, bearer token, over loopback): cold (the
  first, which reads every task's runs) and warm (after the shared snapshot's ttl: one task
  list, the runs of unchanged tasks from the cache), the median of `--repeat`;
- in a headless Chromium (Playwright; the one tests/chromium.py finds), signed in: the page's
  first contentful paint (the browser's own `paint` entry) and the time from navigation
  start until the board's cards are drawn (data fetched, parsed and rendered), each the
  median of `--repeat` fresh page loads.

The issue's goal: first paint under a second on this machine.

    python benchmarks/bench_dashboard.py [--tasks N] [--repeat R]

Prints a markdown table and the command that produced it.
"""

from __future__ import annotations

import argparse
import json
import os
import pwd
import statistics
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from execkit._classify import FailureClass
from execkit.ledger import Ledger, open_ledger
from execkit.server import LedgerApp, ServerThread, TokenFile, add_token

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from chromium import find_chromium  # tests/chromium.py, through the line above

ME = pwd.getpwuid(os.geteuid()).pw_name
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def _fail(ledger: Ledger, task_id: str, n: int, klass: FailureClass, reason: str) -> None:
    for i in range(n):
        run = ledger.start_run(
            task_id, request_key=f"{task_id}-{i}", actor="dispatcher", ignore_backoff=True
        )
        ledger.finish_run(run.id, "failed", failure_class=klass, reason=reason)


def build(ledger: Ledger, tasks: int) -> None:
    for i in range(tasks):
        task = ledger.create_task(f"board:BENCH-{i}", actor="dispatcher")
        kind = i % 15
        if kind < 5:
            _fail(ledger, task.id, 1, FailureClass.UPSTREAM, "HTTP 503: overloaded")
        elif kind < 8:
            _fail(ledger, task.id, 3, FailureClass.WORK, "tests failed: 3 of 41")
        elif kind == 8:
            _fail(ledger, task.id, 1, FailureClass.ENVIRONMENT, "codex: not found on PATH")
        elif kind == 9:
            ledger.start_run(task.id, request_key=f"{task.id}-run", actor="dispatcher")
        elif kind < 13:
            done = ledger.start_run(task.id, request_key=f"{task.id}-done", actor="dispatcher")
            ledger.finish_run(done.id, "succeeded")


def _get(url: str, token: str) -> tuple[float, int]:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    started = time.perf_counter()
    with urllib.request.urlopen(request, timeout=120) as answer:
        body = answer.read()
    return time.perf_counter() - started, len(body)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=7)
    args = parser.parse_args()
    from playwright.sync_api import sync_playwright

    with tempfile.TemporaryDirectory() as folder:
        where = Path(folder)
        ledger = open_ledger(where / "ledger.db")
        built = time.perf_counter()
        build(ledger, args.tasks)
        print(f"built {args.tasks} tasks in {time.perf_counter() - built:.1f} s", file=sys.stderr)
        token = add_token(where / "tokens.json", ME, ["agent.operate"])
        app = LedgerApp(ledger, TokenFile(where / "tokens.json"))
        rows: list[tuple[str, str]] = []
        with ServerThread(app) as running:
            snapshot_url = f"{running.url}/dashboard/api/snapshot"
            cold, size = _get(snapshot_url, token)
            warm = []
            for _ in range(args.repeat):
                time.sleep(app.front.view.ttl_s)  # past the shared snapshot's ttl
                warm.append(_get(snapshot_url, token)[0])
            rows.append(("snapshot, cold (every task's runs read)", f"{cold * 1000:.0f} ms"))
            rows.append(("snapshot, warm (median)", f"{statistics.median(warm) * 1000:.0f} ms"))
            rows.append(("snapshot size", f"{size / 1024:.0f} KiB"))
            with sync_playwright() as playwright:
                chrome = find_chromium()
                if chrome is None:
                    raise SystemExit("no Chromium: `python tests/chromium.py ensure` installs one")
                browser = playwright.chromium.launch(
                    executable_path=str(chrome), args=CHROMIUM_ARGS
                )
                context = browser.new_context(viewport={"width": 1400, "height": 900})
                page = context.new_page()
                page.goto(f"{running.url}/dashboard")
                page.fill("#token", token)
                page.click("#sign-in-form button[type=submit]")
                page.wait_for_selector("#board .card", timeout=60_000)
                page.close()
                paints, boards = [], []
                for _ in range(args.repeat):
                    time.sleep(app.front.view.ttl_s)
                    page = context.new_page()
                    page.goto(f"{running.url}/dashboard")
                    page.wait_for_selector("#board .card", timeout=60_000)
                    drawn = page.evaluate("performance.now()")
                    fcp = page.evaluate(
                        "performance.getEntriesByName('first-contentful-paint')[0]?.startTime"
                    )
                    paints.append(float(fcp))
                    boards.append(float(drawn))
                    page.close()
                browser.close()
            rows.append(("first contentful paint (median)", f"{statistics.median(paints):.0f} ms"))
            rows.append(
                ("board drawn from navigation (median)", f"{statistics.median(boards):.0f} ms")
            )
        app.close()
        ledger.close()
    print(f"Dashboard on a {args.tasks:,}-task SQLite ledger, {args.repeat} repeats\n")
    print("| measure | figure |\n|---|---|")
    for name, figure in rows:
        print(f"| {name} | {figure} |")
    print(f"\n`python benchmarks/bench_dashboard.py {' '.join(sys.argv[1:])}`".rstrip())
    print(json.dumps(dict(rows)), file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
