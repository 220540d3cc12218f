"""Benchmark the Linear board (issue #48) against the loopback fake Linear of the tests.

Run: python benchmarks/bench_linear.py   (seconds; prints a markdown table)

Requests are counted by the fake (every request it answered), never timed:

1. an idle poll of a 2,000-issue team (1,000 labelled `execkit`): requests for the first
   read (the team, then pages of 50) and per poll after it (goal: 1);
2. one issue from eligible to done with its status comment, through the dispatcher (an
   inline slot, a runner that succeeds): requests from the first poll that lists it to the
   last write.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from linear_fake import KEY, FakeLinear  # noqa: E402

from execkit._proof import RunStatus  # noqa: E402
from execkit.dispatch import (  # noqa: E402
    BoardIssue,
    DispatchConfig,
    Dispatcher,
    InlineExecutor,
    RunOutcome,
    Slot,
)
from execkit.dispatch._linear import LinearBoard, LinearConfig  # noqa: E402
from execkit.ledger import open_ledger  # noqa: E402


class _Done:
    def run(self, issue: BoardIssue, slot: Slot) -> RunOutcome:
        return RunOutcome(RunStatus.SUCCEEDED)


def idle_poll(tmp: Path) -> tuple[int, int]:
    fake = FakeLinear()
    try:
        for n in range(2000):
            fake.add_issue(f"issue {n}", labels=("execkit",) if n % 2 else ("bug",))
        with open_ledger(tmp / "idle.db") as ledger:
            board = LinearBoard(LinearConfig(team="ENG", api_url=fake.url), ledger, KEY)
            board.list_candidates()
            first = fake.requests
            before = fake.requests
            for _ in range(10):
                board.list_candidates()
            return first, (fake.requests - before) // 10
    finally:
        fake.close()


def eligible_to_done(tmp: Path) -> int:
    fake = FakeLinear()
    try:
        fake.add_issue("Fix the parser")
        with open_ledger(tmp / "done.db") as ledger:
            board = LinearBoard(LinearConfig(team="ENG", api_url=fake.url), ledger, KEY)
            config = DispatchConfig(done_state="completed", failed_state="canceled")
            dispatcher = Dispatcher(board, _Done(), ledger, config, executor=InlineExecutor())
            before = fake.requests
            dispatcher.tick()
            board.catch_up()
            return fake.requests - before
    finally:
        fake.close()


def main() -> int:
    with tempfile.TemporaryDirectory() as tmp:
        first, per_poll = idle_poll(Path(tmp))
        done = eligible_to_done(Path(tmp))
    print("| measure | requests |")
    print("|---|---|")
    print(f"| first read of a 2,000-issue team (the team, then pages of 50) | {first} |")
    print(f"| an idle poll of that team, once read | {per_poll} |")
    print(f"| one issue from eligible to done, with its status comment | {done} |")
    return 0 if per_poll == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
