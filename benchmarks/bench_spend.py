"""Benchmark spend caps (issue #45): how far a capped run goes past its cap, and what caps
cost at admission.

    python tests/pgcluster.py --run -- python benchmarks/bench_spend.py [--runs 50]

Three measurements, each against its honest floor in the same run:

1. Overshoot of a task's own cap: `--runs` runs (8 at once), each of a task with a $1.00
   budget (then a 5,000-token one), through `run_attempt` and the real opencode adapter;
   the CLI is a stand-in `opencode` on PATH that prints a `step_finish` event costing
   $0.10 and 500 tokens every 100 ms, forever: only the cap stops it. Printed: the final
   recorded spend per run (median, max) and the overshoot in events, against the
   floor "cap + one event" (the event that crossed it).
2. A fleet against a day's cap, on PostgreSQL (the cluster `tests/pgcluster.py --run`
   started, else one of its own): 20 issues on two boards, two `execkit dispatch` processes
   at `--concurrency 4` each (8 agents at once) and a $10.00 day cap; each agent would
   spend $1.00 ($0.10 every 100 ms, ten steps) if nothing stopped it: $20 asked of $10.
   Printed: what the day holds at the end against $10 plus the events in flight, the runs
   stopped by the window, and the runs admitted after the window was full (must be 0).
3. Admission with caps against admission without: `start_run` (alone, and with its
   `finish_run` and cost) on a SQLite file (`--admissions` each) and on PostgreSQL (half as
   many), the sides' ledgers open side by side and their admissions taken in turn (the
   order rotating), the medians of `--rounds` rounds compared (target <= 1.1x), and the
   same with the run's `spend_room` read a guarded run adds.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))

import pgcluster  # noqa: E402

from adapters.opencode import OpencodeAdapter  # noqa: E402
from execkit import AgentRequest  # noqa: E402
from execkit._attempt import AttemptOptions, run_attempt  # noqa: E402
from execkit._usage import Usage, UsdSource  # noqa: E402
from execkit.ledger import SpendCap, SpendWindow, open_ledger, user_name  # noqa: E402

# The ledger's owner (its OS user) may set caps; runs are admitted as the same actor.
ME = user_name(os.geteuid())
EVENT_USD = 0.10
EVENT_TOKENS = 500

# A stand-in `opencode run --format json`: a step costing EVENT_USD and EVENT_TOKENS every
# INTERVAL seconds; $EXECKIT_BENCH_STEPS steps then a finished answer (0: forever).
FAKE_OPENCODE = f"""#!{sys.executable}
import json, os, sys, time
steps = int(os.environ.get("EXECKIT_BENCH_STEPS", "0"))
interval = float(os.environ.get("EXECKIT_BENCH_INTERVAL", "0.1"))
def say(event):
    sys.stdout.write(json.dumps(event) + "\\n")
    sys.stdout.flush()
say({{"type": "step_start", "sessionID": "ses_bench"}})
n = 0
while steps == 0 or n < steps:
    n += 1
    time.sleep(interval)
    last = steps and n == steps
    if last:
        say({{"type": "text", "part": {{"text": "done"}}}})
    say({{"type": "step_finish", "part": {{"reason": "stop" if last else "tool-calls",
         "cost": {EVENT_USD}, "modelID": "bench", "tokens": {{"input": 0,
         "output": {EVENT_TOKENS}, "reasoning": 0, "cache": {{"read": 0, "write": 0}}}}}}}})
"""


def _fake_path(folder: Path) -> str:
    program = folder / "opencode"
    program.write_text(FAKE_OPENCODE)
    program.chmod(0o755)
    return f"{folder}{os.pathsep}{os.environ.get('PATH', '')}"


# -- 1. a task's own cap ---------------------------------------------------------------


def _task_cap(db: Path, runs: int, *, usd: float | None, tokens: int | None) -> list[float]:
    """Each run's recorded spend (USD, or tokens) with the task's cap `usd` or `tokens`."""
    with open_ledger(db) as ledger:
        ledger.set_spend_cap(actor=ME, floor_usd=0.25, floor_tokens=1000)
        tasks = [ledger.create_task(f"capped {n}", actor=ME).id for n in range(runs)]
        for task in tasks:
            ledger.set_task_budget(
                task, usd=usd, tokens=tokens, expected_usd=None, expected_tokens=None,
                actor=ME,
            )  # fmt: skip
    options = AttemptOptions(actor=ME, lane=None)
    request = AgentRequest(prompt="go", timeout_s=600)

    def one(task: str) -> float:
        with open_ledger(db) as own:
            outcome = run_attempt(own, task, OpencodeAdapter(), request, options)
            run = own.run(outcome.run_id)
            assert outcome.reason is not None and "spend limit" in outcome.reason, outcome
            return float(run.usd or 0.0) if usd is not None else float(run.usage.tokens)

    with ThreadPoolExecutor(8) as pool:
        return list(pool.map(one, tasks))


def _overshoot_rows(runs: int) -> list[str]:
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        os.environ["PATH"] = _fake_path(folder)
        os.environ["EXECKIT_BENCH_STEPS"] = "0"
        for name, usd, tokens, event in (
            ("$1.00 task cap", 1.0, None, EVENT_USD),
            ("5,000-token task cap", None, 5000, EVENT_TOKENS),
        ):
            db = folder / f"{uuid.uuid4().hex}.db"
            spends = _task_cap(db, runs, usd=usd, tokens=tokens)
            cap = usd if usd is not None else float(tokens or 0)
            over = [(spent - cap) / event for spent in spends]
            unit = "$" if usd is not None else ""
            rows.append(
                f"| {name} | {runs} | {unit}{statistics.median(spends):,.2f} "
                f"| {unit}{max(spends):,.2f} | {unit}{cap + event:,.2f} "
                f"| {max(over):.2f} | {sum(1 for o in over if o > 1 + 1e-9)} |"
            )
    return rows


# -- 2. a fleet against a day's cap, on PostgreSQL ---------------------------------------


def _schema(url: str) -> str:
    import psycopg

    name = f"bench_spend_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{name}"')
    return f"{url}{'&' if '?' in url else '?'}options=-csearch_path%3D{name}"


def _fleet(url: str) -> str:
    ledger_url = _schema(url)
    with open_ledger(ledger_url) as ledger:
        ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=10.0), actor=ME, floor_usd=0.5)
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        env = {**os.environ, "PATH": _fake_path(folder), "EXECKIT_BENCH_STEPS": "10"}
        env.pop("EXECKIT_REMOTE", None)
        states = [
            {"name": "todo", "eligible": True},
            {"name": "done", "terminal": True},
            {"name": "blocked", "terminal": True},
        ]
        dispatchers = []
        for board_number in range(2):
            board = folder / f"board{board_number}.json"
            issues = [
                {"id": f"B{board_number}-{n}", "title": f"issue {n}", "state": "todo",
                 "prompt": "go", "adapter": "opencode"}
                for n in range(10)
            ]  # fmt: skip
            board.write_text(json.dumps({"states": states, "issues": issues}))
            argv = [
                sys.executable, "-m", "execkit", "dispatch", "--board", str(board), "--db",
                ledger_url, "--concurrency", "4", "--until-idle", "--interval", "0.2",
                "--timeout", "120", "--json",
            ]  # fmt: skip
            dispatchers.append(
                subprocess.Popen(
                    argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
                )
            )
        # `--until-idle` waits for the window to reopen (tomorrow): once the day is full
        # and no agent runs, or every issue is done, the dispatchers are stopped. Bounded.
        deadline = time.monotonic() + 600
        with open_ledger(ledger_url) as watcher:
            while time.monotonic() < deadline:
                time.sleep(0.5)
                if all(process.poll() is not None for process in dispatchers):
                    break
                (use,) = watcher.spend_windows()
                if use.full and not watcher.running_runs():
                    break
        for process in dispatchers:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in dispatchers:
            try:
                process.communicate(timeout=60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
    with open_ledger(ledger_url) as ledger:
        (window,) = ledger.spend_windows()
        runs = [run for task in ledger.list_tasks() for run in ledger.runs(task.id)]
    stopped = [run for run in runs if run.stopped and "budget" in (run.reason or "")]
    done = [run for run in runs if run.status == "succeeded"]
    total = sum(run.usd or 0.0 for run in runs)
    # The window was full once its held spend left no room for the floor; a run started
    # after the last stop of a window-stopped run would be one admitted past it.
    full_at = min((run.ended_at or 0.0 for run in stopped), default=None)
    late = [run for run in runs if full_at is not None and run.started_at > full_at]
    in_flight_floor = 10.0 + 8 * EVENT_USD
    return (
        f"| {len(runs)} | {len(done)} | {len(stopped)} | ${total:.2f} | ${window.usd:.2f} "
        f"| ${in_flight_floor:.2f} | {len(late)} |"
    )


# -- 3. admission with caps against without ----------------------------------------------


_SIDES = {"no caps": (False, False), "caps": (True, False), "caps + spend_room": (True, True)}


def _admission_round(targets: dict[str, Path | str], count: int) -> dict[str, tuple[float, float]]:
    """One round: a fresh ledger per side (a file, or a schema's URL), all open at once, and
    `count` admissions on each taken in turn, the order rotating at each (`start_run`, with
    the run's `spend_room` read for "caps + spend_room"), then its result. Paired so, a
    neighbour's burst of load falls on every side alike. Each side's seconds admitting,
    and admitting and finishing."""
    paid = Usage(input_tokens=100, usd=0.001, usd_source=UsdSource.REPORTED)
    names = list(targets)
    admitting = dict.fromkeys(names, 0.0)
    finishing = dict.fromkeys(names, 0.0)
    with contextlib.ExitStack() as stack:
        ledgers = {name: stack.enter_context(open_ledger(targets[name])) for name in names}
        tasks: dict[str, list[str]] = {}
        for name, ledger in ledgers.items():
            if _SIDES[name][0]:
                ledger.set_spend_cap(SpendCap(SpendWindow.DAY, usd=1e6), actor=ME)
                ledger.set_spend_cap(
                    SpendCap(SpendWindow.ROLLING_5H, lane="opencode/default", usd=1e6), actor=ME
                )
            tasks[name] = [
                ledger.create_task(f"t{n}", actor=ME, max_attempts=10).id for n in range(count)
            ]
        for n in range(count):
            for name in names[n % len(names) :] + names[: n % len(names)]:
                ledger = ledgers[name]
                before = time.perf_counter()
                run = ledger.start_run(
                    tasks[name][n], request_key=str(n), actor=ME, lane="opencode/default"
                )
                if _SIDES[name][1]:
                    ledger.spend_room(run.id)
                admitted = time.perf_counter()
                ledger.finish_run(run.id, "succeeded", usage=paid)
                admitting[name] += admitted - before
                finishing[name] += time.perf_counter() - admitted
    return {name: (admitting[name], admitting[name] + finishing[name]) for name in names}


def _admission_rows(count: int, rounds: int, url: str | None = None) -> list[str]:
    admit: dict[str, list[float]] = {name: [] for name in _SIDES}
    whole: dict[str, list[float]] = {name: [] for name in _SIDES}
    with tempfile.TemporaryDirectory() as scratch:
        for _round in range(rounds):
            targets: dict[str, Path | str] = {
                name: Path(scratch) / f"{uuid.uuid4().hex}.db" if url is None else _schema(url)
                for name in _SIDES
            }
            for name, (admitted, total) in _admission_round(targets, count).items():
                admit[name].append(admitted)
                whole[name].append(total)
    floor_admit = statistics.median(admit["no caps"])
    floor_whole = statistics.median(whole["no caps"])
    rows = []
    for name in _SIDES:
        a, w = statistics.median(admit[name]), statistics.median(whole[name])
        rows.append(
            f"| {'SQLite' if url is None else 'PostgreSQL'}, {name} | {count} "
            f"| {a / count * 1e6:,.0f} µs | {a / floor_admit:.3f}x "
            f"| {w / count * 1e6:,.0f} µs | {w / floor_whole:.3f}x |"
        )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=50, help="runs per task cap (default 50)")
    parser.add_argument("--admissions", type=int, default=400, help="per round (default 400)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--url", help="a PostgreSQL database for the fleet (default: a cluster)")
    parser.add_argument("--skip-fleet", action="store_true")
    args = parser.parse_args()
    print("$ " + shlex.join(["python", *sys.argv]))
    print()
    print("Overshoot of a task's own cap (a step every 100 ms, 8 runs at once):")
    print()
    print("| cap | runs | median final | max final | floor: cap + one event | max overshoot "
          "(events) | runs past one event |")  # fmt: skip
    print("|---|---|---|---|---|---|---|")
    for row in _overshoot_rows(args.runs):
        print(row)
    with contextlib.ExitStack() as stack:
        url = args.url or stack.enter_context(pgcluster.cluster_url())
        if not args.skip_fleet:
            print()
            print("A fleet on PostgreSQL: 20 issues, two dispatchers x 4 agents, a $10.00 day cap:")
            print()
            print("| runs | done | stopped by the window | spent | the day holds "
                  "| floor: $10 + 8 events in flight | admitted after it was full |")  # fmt: skip
            print("|---|---|---|---|---|---|---|")
            print(_fleet(url))
        print()
        print("Admission and result, with caps against without (a day cap and a lane's):")
        print()
        print("| ledger | runs a round | admission | against no caps | admission + result "
              "| against no caps |")  # fmt: skip
        print("|---|---|---|---|---|---|")
        for row in _admission_rows(args.admissions, args.rounds):
            print(row)
        for row in _admission_rows(args.admissions // 2, args.rounds, url):
            print(row)


if __name__ == "__main__":
    main()
