"""The dispatcher side by side: wall time against the ideal, its own cost per dispatch,
a pass with nothing due, and its memory with many loud agents.

    python benchmarks/bench_dispatch.py [--issues 200] [--sleep 1] [--concurrency 8]
                                        [--skip-wall] [--skip-memory]

1. Wall time: `--issues` board issues whose agent is `sleep --sleep`, `--concurrency` at
   once, one `tick()` over a SQLite ledger, against the ideal `issues * sleep /
   concurrency` (goal <= 1.3x).
2. The dispatcher's own cost per dispatch: 100 issues whose agent is `true`, one slot,
   against a bare `spawn(["true"])` of the same command, medians (what the dispatcher adds:
   admission, lease, the result's write, the card's move).
3. One pass over a 1,000-issue board with nothing due (every issue backing off), against a
   bare `list_tasks` of the same ledger (goal: well under a second).
4. Peak RSS of a dispatcher process running 64 agents at once that each print 100 MiB of
   log text, against the same dispatcher whose agents print 10 MiB each (goal: flat, the
   ratio 1.0: what an agent prints is bounded by its kept tails, 4 MiB of stdout for the
   vendor's envelope and 4 MiB of stderr, whatever it prints). Each agent waits for the
   others before it exits, so all 64 tails are full at once in both runs. The run with
   agents that print nothing is the base the tails add to.

Each row prints its floor measured in the same run; compare the ratios, not the times.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from execkit import WorkBudget, spawn
from execkit.dispatch import (
    AdapterRunner,
    BoardIssue,
    DispatchConfig,
    Dispatcher,
    InlineExecutor,
    InMemoryBoard,
    RunOutcome,
    Slot,
)
from execkit.ledger import open_ledger

_ROOMY = WorkBudget(max_attempts=1000, max_uncharged_attempts=1000)


def _board(n: int, argv: list[str]) -> InMemoryBoard:
    return InMemoryBoard([BoardIssue(f"I{k}", f"issue {k}", "todo", argv=argv) for k in range(n)])


def wall_time(issues: int, sleep_s: float, concurrency: int) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp, open_ledger(Path(tmp) / "l.db") as ledger:
        board = _board(issues, ["sleep", str(sleep_s)])
        config = DispatchConfig(max_concurrent_agents=concurrency)
        dispatcher = Dispatcher(board, AdapterRunner(), ledger, config)
        began = time.perf_counter()
        events = dispatcher.tick()
        elapsed = time.perf_counter() - began
        assert len(events) == issues and all(e.moved_to == "done" for e in events)
    return elapsed, issues * sleep_s / concurrency


def cost_per_dispatch(count: int = 100) -> tuple[float, float]:
    with tempfile.TemporaryDirectory() as tmp, open_ledger(Path(tmp) / "l.db") as ledger:
        board = _board(count, ["true"])
        dispatcher = Dispatcher(
            board,
            AdapterRunner(),
            ledger,
            DispatchConfig(max_concurrent_agents=1),
            executor=InlineExecutor(),
        )
        times: list[float] = []
        for issue in board.list_candidates():
            single = InMemoryBoard([issue])
            dispatcher.tracker = single
            began = time.perf_counter()
            dispatcher.tick()
            times.append(time.perf_counter() - began)
    bare: list[float] = []
    for _ in range(count):
        began = time.perf_counter()
        spawn(["true"])
        bare.append(time.perf_counter() - began)
    return statistics.median(times), statistics.median(bare)


class _Fails:
    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        return RunOutcome("failed", reason="benchmark")


def idle_pass(issues: int = 1000) -> tuple[float, float]:
    with (
        tempfile.TemporaryDirectory() as tmp,
        open_ledger(Path(tmp) / "l.db", budget=_ROOMY) as ledger,
    ):
        board = _board(issues, ["true"])
        config = DispatchConfig(base_backoff_s=3600, max_retry_backoff_s=3600)
        dispatcher = Dispatcher(board, _Fails(), ledger, config, executor=InlineExecutor())
        dispatcher.tick()  # every issue fails once and backs off for an hour
        began = time.perf_counter()
        assert dispatcher.tick() == []
        passed = time.perf_counter() - began
        began = time.perf_counter()
        ledger.list_tasks()
        floor = time.perf_counter() - began
    return passed, floor


_MEMORY_CHILD = """
import json, resource, sys, tempfile
from pathlib import Path
from execkit.dispatch import AdapterRunner, BoardIssue, DispatchConfig, Dispatcher, InMemoryBoard
from execkit.ledger import open_ledger
agents, argv = int(sys.argv[1]), json.loads(sys.argv[2])
with tempfile.TemporaryDirectory() as tmp, open_ledger(Path(tmp) / "l.db") as ledger:
    board = InMemoryBoard([BoardIssue(f"I{k}", "t", "todo", argv=argv) for k in range(agents)])
    config = DispatchConfig(max_concurrent_agents=agents)
    events = Dispatcher(board, AdapterRunner(), ledger, config).tick()
    assert len(events) == agents, events
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def _loud(mib: int, agents: int, meeting: str) -> list[str]:
    """An agent that prints `mib` MiB of log lines (text: decoded and masked at its end),
    then waits (at most 120 s) until all `agents` have printed theirs: every tail is full
    at once, so the peak does not depend on how the printing happened to overlap."""
    line = "agent: compiling module 42 of 97, 3 warnings"
    wait = (
        f"n=0; while [ $(ls {meeting} | wc -l) -lt {agents} ] && [ $n -lt 2400 ]; "
        "do sleep 0.05; n=$((n+1)); done"
    )
    return ["sh", "-c", f"yes '{line}' | head -c {mib * 1024 * 1024}; touch {meeting}/$$; {wait}"]


def loud_peak_rss_kib(agents: int, mib: int) -> int:
    with tempfile.TemporaryDirectory() as meeting:
        return peak_rss_kib(agents, _loud(mib, agents, meeting))


def peak_rss_kib(agents: int, argv: list[str]) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _MEMORY_CHILD, str(agents), json.dumps(argv)],
        capture_output=True,
        text=True,
        timeout=600,
        check=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)},
    )
    return int(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--issues", type=int, default=200)
    parser.add_argument("--sleep", type=float, default=1.0)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--skip-wall", action="store_true")
    parser.add_argument("--skip-memory", action="store_true")
    args = parser.parse_args()
    print("| measure | execkit | floor | ratio | goal |")
    print("|---|---:|---:|---:|---|")
    if not args.skip_wall:
        elapsed, ideal = wall_time(args.issues, args.sleep, args.concurrency)
        print(
            f"| {args.issues} issues sleeping {args.sleep:g} s, concurrency {args.concurrency} "
            f"| {elapsed:.1f} s | {ideal:.1f} s ideal | {elapsed / ideal:.2f}x | <= 1.3x |"
        )
    per, bare = cost_per_dispatch()
    print(
        f"| one dispatch of `true` (admit, run, record, move) | {per * 1000:.2f} ms "
        f"| {bare * 1000:.2f} ms bare `spawn` | {per / bare:.2f}x | - |"
    )
    passed, floor = idle_pass()
    print(
        f"| a pass over 1,000 issues, nothing due | {passed * 1000:.0f} ms "
        f"| {floor * 1000:.0f} ms `list_tasks` | {passed / floor:.1f}x | well under 1 s |"
    )
    if not args.skip_memory:
        quiet = peak_rss_kib(64, ["true"])
        some = loud_peak_rss_kib(64, 10)
        loud = loud_peak_rss_kib(64, 100)
        print(
            f"| peak RSS, 64 agents at once printing 100 MiB of log text each "
            f"| {loud / 1024:.0f} MiB | {some / 1024:.0f} MiB printing 10 MiB each "
            f"| {loud / some:.2f}x | flat (1.0x) |"
        )
        print(
            f"| the same, over 64 agents printing nothing | {loud / 1024:.0f} MiB "
            f"| {quiet / 1024:.0f} MiB | +{(loud - quiet) / 1024 / 64:.1f} MiB an agent "
            f"| <= 8 MiB an agent (its tails) |"
        )


if __name__ == "__main__":
    main()
