"""Benchmark vendor lanes (issue #28): lanes on against lanes off, in one run.

Run: python benchmarks/bench_lanes.py   (a few seconds; prints a markdown table)

50 tasks on one lane, concurrency 8, on a virtual clock:

1. usage limit: the fake vendor answers a usage limit with a reset 60 s (virtual) away, read
   from its structure, then succeeds. Counted: vendor calls made before the reset, charged
   attempts, vendor calls in all. Run twice with lanes on: slots run inline (one answer
   lands before the next admission), and in threads (8 admitted at once, so up to 8 calls
   are already in flight when the first answer lands).
2. expired credential: the vendor refuses the credentials (structured) until an operator
   runs `execkit lane resume` at t+120 s (virtual). Counted: vendor calls until the resume.
3. admission cost: `start_run` on an open lane (one with its stored row, as every lane a
   dispatcher has used) against `start_run` without one, the same number of admissions on
   fresh tasks, in paired rounds of alternating order; the median of the pairs' ratios
   (wall clock: figures live here, never in tests).
"""

from __future__ import annotations

import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from execkit._classify import FailureClass  # noqa: E402
from execkit.dispatch import (  # noqa: E402
    BoardIssue,
    DispatchConfig,
    Dispatcher,
    InlineExecutor,
    InMemoryBoard,
    RunOutcome,
    Slot,
)
from execkit.ledger import open_ledger, user_name  # noqa: E402

TASKS = 50
CONCURRENCY = 8
RESET_S = 60.0
T0 = 1_800_000_000.0


class Clock:
    def __init__(self) -> None:
        self.now = T0
        self.lock = threading.Lock()

    def __call__(self) -> float:
        return self.now


class LimitedVendor:
    """The fake vendor: refuses until `opens_at` (a usage limit with its reset, or refused
    credentials), then succeeds. Counts every call and when it came."""

    def __init__(self, clock: Clock, opens_at: float, *, credentials: bool = False) -> None:
        self.clock = clock
        self.opens_at = opens_at
        self.credentials = credentials
        self.calls: list[float] = []
        self.lock = threading.Lock()

    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        now = self.clock()
        with self.lock:
            self.calls.append(now)
        if now >= self.opens_at:
            return RunOutcome("succeeded")
        if self.credentials:
            return RunOutcome(
                "failed",
                FailureClass.ENVIRONMENT,
                "credentials",
                precondition="claude refused the credentials; run `claude`, then /login",
                lane_cause="credentials",
            )
        return RunOutcome(
            "failed",
            FailureClass.UPSTREAM,
            "usage limit",
            not_before=self.opens_at,
            lane_cause="reset",
        )


def _board() -> InMemoryBoard:
    return InMemoryBoard(
        [BoardIssue(f"I-{n}", f"issue {n}", "todo", prompt="do it") for n in range(TASKS)]
    )


def scenario(
    *, lanes: bool, credentials: bool = False, inline: bool = True, db: Path
) -> dict[str, Any]:
    """One run of a scenario (see the module docstring); the counts."""
    clock = Clock()
    opens_at = T0 + (120.0 if credentials else RESET_S)
    vendor = LimitedVendor(clock, opens_at, credentials=credentials)
    config = DispatchConfig(max_concurrent_agents=CONCURRENCY)
    with open_ledger(db) as ledger:
        dispatcher = Dispatcher(
            _board(),
            vendor,
            ledger,
            config,
            clock,
            lanes=lanes,
            executor=InlineExecutor() if inline else None,
        )
        resumed = False
        for _ in range(200):
            dispatcher.tick()
            if credentials and not resumed and clock.now >= opens_at:
                # The operator logs in again, then resumes the lane (lanes off: every task
                # is blocked on its own and its card moved; moving 50 cards back is left out).
                for lane in ledger.list_lanes(now=clock.now):
                    if lane.state == "stopped":
                        ledger.resume_lane(lane.lane, actor=user_name_now(), now=clock.now)
                resumed = True
            tasks = ledger.list_tasks(now=clock.now)
            settled = all(t.status == "done" or t.state == "blocked" for t in tasks)
            if tasks and settled and (not credentials or resumed):
                break
            due = dispatcher.next_due()
            clock.now = max(clock.now + 1.0, due if due is not None else clock.now + 10.0)
            if credentials and not resumed:
                clock.now = min(clock.now, opens_at)
        tasks = ledger.list_tasks(now=clock.now)
    return {
        "calls_before_open": sum(1 for at in vendor.calls if at < opens_at),
        "calls": len(vendor.calls),
        # A success charges (it did the work): what must be 0 is charged failures.
        "charged_failures": sum(task.charged_attempts for task in tasks)
        - sum(1 for task in tasks if task.status == "done"),
        "done": sum(1 for task in tasks if task.status == "done"),
    }


def user_name_now() -> str:
    import os

    return user_name(os.geteuid())


def admission_cost(db: Path, rounds: int = 16, per_round: int = 100) -> tuple[float, float, float]:
    """Seconds per admission without a lane and on an open lane that has its row (a lane
    seen before, as every lane a dispatcher has used: its state is read at admission),
    each the median of its rounds; and the median of the per-pair ratios. Rounds come in
    pairs, one of each, in alternating order, so load that drifts over the run (other
    processes on the machine) weighs on both sides of a pair alike."""
    without: list[float] = []
    with_lane: list[float] = []
    lane = "claude/default"
    with open_ledger(db) as ledger:
        seed = ledger.create_task("seed", actor="b").id
        ledger.finish_run(
            ledger.start_run(seed, request_key="s", actor="b", lane=lane).id, "succeeded"
        )
        for n in range(rounds):
            pair: tuple[tuple[str | None, list[float]], ...] = ((None, without), (lane, with_lane))
            for name, into in pair if n % 2 == 0 else pair[::-1]:
                ids = [ledger.create_task("t", actor="b").id for _ in range(per_round)]
                start = time.perf_counter()
                for k, task_id in enumerate(ids):
                    ledger.start_run(task_id, request_key=f"{task_id}-{k}", actor="b", lane=name)
                into.append((time.perf_counter() - start) / per_round)
    ratios = [on / off for off, on in zip(without, with_lane, strict=True)]
    return statistics.median(without), statistics.median(with_lane), statistics.median(ratios)


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        root = Path(folder)
        rows: list[tuple[str, dict[str, Any]]] = []
        cases: tuple[tuple[str, dict[str, bool]], ...] = (
            ("usage limit, lanes off", {"lanes": False}),
            ("usage limit, lanes on (inline slots)", {"lanes": True}),
            ("usage limit, lanes on (8 threads)", {"lanes": True, "inline": False}),
            ("expired credential, lanes off", {"lanes": False, "credentials": True}),
            ("expired credential, lanes on", {"lanes": True, "credentials": True}),
        )
        for name, kwargs in cases:
            counts = scenario(db=root / f"{len(rows)}.db", **kwargs)
            rows.append((name, counts))
        off, on, ratio = admission_cost(root / "admission.db")
    print(
        f"| scenario ({TASKS} tasks, one lane, concurrency {CONCURRENCY}) | vendor calls "
        "before the reset / resume | charged failures | calls in all | done |"
    )
    print("|---|---:|---:|---:|---:|")
    for name, c in rows:
        print(
            f"| {name} | {c['calls_before_open']} | {c['charged_failures']} | {c['calls']} | "
            f"{c['done']} |"
        )
    print()
    print(
        f"admission: {off * 1e6:.0f} us without a lane, {on * 1e6:.0f} us on an open lane "
        f"({ratio:.2f}x, the median of paired rounds)"
    )


if __name__ == "__main__":
    main()
